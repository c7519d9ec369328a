"""The chart's rendered objects are accepted by the real API server (server-side dry run, with the
CRDs of Kueue and SovereignSpec installed), and its values set the policy the controller reads."""

from __future__ import annotations

import subprocess

import yaml

from localdev import controlplane
from localdev.operator import install
from sovereignspec.operator.border.policy import parse_policy
from tests.unit.test_chart import _helm_path, render


def _kubectl() -> str:
    return str(controlplane.require_binary("kubectl"))


def test_the_rendered_chart_is_accepted_by_the_api_server(api, namespace):
    helm = _helm_path()
    assert helm is not None, "make binaries builds helm"
    install(api)
    docs = [d for d in render(helm) if d["kind"] != "CustomResourceDefinition"]
    for d in docs:
        if d["metadata"].get("namespace"):
            d["metadata"]["namespace"] = namespace
        for s in d.get("subjects", []):
            s["namespace"] = namespace
    manifest = yaml.safe_dump_all(docs)
    result = subprocess.run(
        [_kubectl(), "--kubeconfig", str(controlplane.kubeconfig()), "apply", "--dry-run=server", "-f", "-"],
        input=manifest, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("(server dry run)") == len(docs)
    policy = next(d for d in docs if d["kind"] == "SpeculationPolicy")
    assert parse_policy(policy["metadata"]["name"], policy["spec"]).gamma_max == 8
