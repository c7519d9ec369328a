"""The sovereignty record on the real control plane (issue 46): the operator, as its own
least-privilege user, records every decision and every GPU pod's binding in AuditSegment objects;
`sovereignspec audit verify / where / export`, run as an administrator would, read them back; a
binding outside its namespace's jurisdictions and a record edited in the cluster are named."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from kubernetes import client

from localdev import controlplane
from tests.cluster.operator_env import decided, make_pool, our_entry, submit
from tests.waiting import wait_until

CHAT = {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance_rate": 0.8, "latency_class": "latency"}
GROUP, VERSION, PLURAL = "sovereignspec.io", "v1alpha1", "auditsegments"


def audit(*args: str) -> subprocess.CompletedProcess[str]:
    """`sovereignspec audit` as an administrator runs it, with the harness's admin kubeconfig."""
    kubeconfig = str(controlplane.kubeconfig("admin"))
    return subprocess.run(
        [sys.executable, "-m", "sovereignspec.cli", "audit", "--kubeconfig", kubeconfig, *args],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip


def mine(out: str, namespace: str) -> list[str]:
    """`audit verify`'s failures that concern this test: its namespace's, and any break of the chain
    (other tests' workloads share the cluster's one record)."""
    breaks = ("digest", "does not follow", "is missing", "sequence number")
    return [line for line in out.splitlines() if namespace in line or any(b in line for b in breaks)]


def test_decisions_and_bindings_are_recorded_and_the_audit_commands_read_them_back(env, namespace) -> None:
    core = client.CoreV1Api(env.api)
    core.patch_namespace(namespace, {"metadata": {"labels": {"sovereignspec.io/jurisdiction": "eu"}}})
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.95] * 4), ("H100-SXM", "kr", 4, [0.95] * 4)])
    eu_node, kr_node = list(pool.nodes)
    jobs = ["chat-a", "chat-b", "chat-c"]
    for job in jobs:
        submit(pool, job, **CHAT)
    uids = {}
    for job in jobs:
        wl = decided(pool, job)
        assert our_entry(pool, wl)["state"] == "Ready"
        uids[job] = wl["metadata"]["uid"]

    def recorded() -> str | None:
        done = audit("export", "--namespace", namespace, "--format", "jsonl")
        records = [json.loads(x) for x in done.stdout.splitlines()]
        seen = {r["workload"]["uid"] for r in records if r["kind"] == "decision"}
        return done.stdout if set(uids.values()) <= seen else None

    records = [
        json.loads(x)
        for x in wait_until(recorded, timeout=60, what="the decisions in the record").splitlines()
    ]
    for r in records:
        assert r["tenant"] == namespace and r["jurisdictions"] == ["eu"] and r["nodeJurisdiction"] == "eu", (
            json.dumps(r)
        )
        assert r["node"] == eu_node and r["gpus"][0].startswith(f"{eu_node}/gpu") and r["replica"], r
    verified = audit("verify")
    assert mine(verified.stdout, namespace) == [], verified.stdout + verified.stderr
    where = audit("where", f"{namespace}/chat-b")
    assert where.returncode == 0 and f"on {eu_node} (eu)" in where.stdout, where.stdout
    csv_out = audit("export", "--namespace", namespace, "--format", "csv").stdout.splitlines()
    assert csv_out[0].startswith("seq,at,kind,namespace,workload,owner") and len(csv_out) == 1 + len(records)

    # A GPU pod bound by hand to the kr node (no queue name, no scheduler): its binding is recorded
    # and `verify` names it.
    pod = {
        "metadata": {"name": "rogue", "namespace": namespace},
        "spec": {"nodeName": kr_node, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip
    core.create_namespaced_pod(namespace, pod)

    def named() -> str | None:
        out = audit("verify")
        lines = [line for line in mine(out.stdout, namespace) if "rogue" in line]
        return lines[0] if out.returncode == 1 and lines else None

    line = wait_until(named, timeout=60, what="the rogue binding named by audit verify")
    assert f"pod {namespace}/rogue bound to node {kr_node} in kr, outside eu" in line, line
    where = audit("where", f"{namespace}/rogue")
    assert where.returncode == 1  # a pod of no owner is found by its workload only: none here

    # An administrator edits a record in place: `verify` names the record and its segment.
    objects = client.CustomObjectsApi(env.api)
    segments = objects.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    target = next(
        s for s in segments
        if any((r.get("workload") or {}).get("uid") == uids["chat-a"] for r in s["spec"]["records"])
    )  # fmt: skip
    original: list[dict[str, Any]] = target["spec"]["records"]
    edited = json.loads(json.dumps(original))
    index = next(i for i, r in enumerate(edited) if (r.get("workload") or {}).get("uid") == uids["chat-a"])
    edited[index]["node"] = kr_node
    name = target["metadata"]["name"]
    objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {"spec": {"records": edited}})
    try:
        out = audit("verify")
        seq = edited[index]["seq"]
        assert out.returncode == 1, out.stdout
        expected = (
            f"record {seq} of segment {name}: its digest is not its content's: edited after it was written"
        )
        assert expected in out.stdout, out.stdout
    finally:  # the cluster's one record, as it was, for whatever runs next
        objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {"spec": {"records": original}})
        core.delete_namespaced_pod("rogue", namespace)
    assert "edited after it was written" not in audit("verify").stdout
