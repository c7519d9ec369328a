"""`deploy/examples/` applied exactly as the README says, with the pinned kubectl, client-side and
server-side: the ClusterQueue keeps its quota and our check, `kubectl wait --for condition=Active`
returns, and the example serving Job is admitted with SovereignSpec's decision."""

from __future__ import annotations

import json

from kubernetes import client

from localdev import controlplane
from localdev import kueue as k
from localdev.gpunodes import EXAMPLES, server_side_apply
from localdev.operator import OperatorProcess, install
from tests.cluster.conftest import wait_until


def _cluster_queue() -> dict:
    out = controlplane.kubectl("get", "clusterqueue", "gpu-serving", "-o", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_examples_apply_as_is_and_their_job_is_admitted_with_a_decision(api, gpu_nodes):
    install(api)  # the CRD and RBAC, as the chart would
    for how in (["--server-side"], []):
        # Each way from nothing, as a user would (one user, one way): the queue is removed first.
        removed = controlplane.kubectl(
            "delete", "clusterqueue", "gpu-serving", "--ignore-not-found", "--timeout=30s"
        )
        assert removed.returncode == 0, removed.stderr
        # Without the chart (installed by pod-e2e), the check and policy come from without-chart/.
        files = ["-f", str(EXAMPLES), "-f", str(EXAMPLES / "without-chart")]
        applied = controlplane.kubectl("apply", *how, *files)
        assert applied.returncode == 0, applied.stderr
        spec = _cluster_queue()["spec"]
        assert spec["resourceGroups"][0]["flavors"][0]["name"] == "nvidia-gpu", spec
        assert {"name": "sovereignspec"} in spec["admissionChecksStrategy"]["admissionChecks"]
        assert spec["namespaceSelector"] == {}
    # Point the policy at loopback (nothing listens there): no lookup of the example's cluster DNS
    # name leaves this machine.
    pointed = {
        "apiVersion": "sovereignspec.io/v1alpha1",
        "kind": "SpeculationPolicy",
        "metadata": {"name": "default"},
        "spec": {"telemetry": {"prometheusURL": "http://127.0.0.1:9"}},
    }
    server_side_apply(api, pointed, "sovereignspec-e2e")
    operator = OperatorProcess("sovereignspec.io/speculation").start()
    try:
        waited = controlplane.kubectl(
            "wait", "--for", "condition=Active", "admissioncheck/sovereignspec", "--timeout", "60s"
        )
        assert waited.returncode == 0, waited.stderr
        batch = client.BatchV1Api(api)

        def admitted() -> client.V1Job | None:
            job = batch.read_namespaced_job("acme-chat", "llm-serving")
            return job if job.spec.suspend is False else None

        job = wait_until(admitted, timeout=90, what="the example Job to be admitted")
        notes = job.spec.template.metadata.annotations
        assert notes["sovereignspec.io/mode"] in ("speculative", "plain")
        assert job.spec.template.spec.node_selector["kubernetes.io/hostname"].startswith("gpu-")
        wl = next(
            w
            for w in k.workloads(api, "llm-serving")
            if any(r["name"] == "acme-chat" for r in w["metadata"]["ownerReferences"])
        )
        entry = k.check_state(wl, "sovereignspec")
        assert entry is not None and entry["state"] == "Ready"
        # The example policy's Prometheus is not reachable here: plain, with the reason.
        assert entry["message"].startswith("plain") and "unreachable" in entry["message"], entry["message"]
        # The serving shapes, applied as the examples' README says: each replica of the Deployment
        # decided on an eu node, the LeaderWorkerSet's group of three 4-GPU pods (no node has 12
        # GPUs free) spread over eu nodes, pinned by the jurisdiction.
        shapes = controlplane.kubectl("apply", "-f", str(EXAMPLES / "serving-shapes"))
        assert shapes.returncode == 0, shapes.stderr
        core = client.CoreV1Api(api)
        eu = {"gpu-a100-eu-1", "gpu-a100-eu-2", "gpu-h100-eu-1"}

        def decided_pods(selector: str, count: int) -> list[client.V1Pod] | None:
            pods = core.list_namespaced_pod("llm-serving", label_selector=selector).items
            done = [p for p in pods if (p.metadata.annotations or {}).get("sovereignspec.io/mode")]
            return done if len(done) == count and len(pods) == count else None

        for pod in wait_until(lambda: decided_pods("app=acme-chat-replicas", 2), 90, what="both replicas"):
            assert pod.spec.node_selector["kubernetes.io/hostname"] in eu, pod.spec.node_selector
        group = wait_until(
            lambda: decided_pods("leaderworkerset.sigs.k8s.io/name=acme-llama-70b", 3), 120, what="the group"
        )
        for pod in group:
            notes = pod.metadata.annotations
            # Our jurisdiction label beside the flavor's nodeLabels (Kueue adds those), no hostname.
            assert pod.spec.node_selector["node-restriction.kubernetes.io/jurisdiction"] == "eu"
            assert "kubernetes.io/hostname" not in pod.spec.node_selector
            hosts = [x.split("/")[0] for x in notes["sovereignspec.io/nodes"].split(",")]
            assert len(hosts) == 3 and len(set(hosts)) >= 2 and set(hosts) <= eu, hosts
    finally:
        operator.stop()
