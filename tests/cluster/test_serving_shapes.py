"""Serving shapes beyond the single Job, on the real control plane: Pods that Kueue's pod integration
admits one by one, which is how it admits each replica of a Deployment or a StatefulSet (their
controllers stamp the Pods out of the template, with the queue label the owner's webhook put there).
No kube-controller-manager runs here, so the Pods are made as those controllers make them.

Kueue copies a Pod's spec into its Workload and none of its metadata: our keys are read from the
Pod itself. Once our check is Ready, Kueue removes the Pod's scheduling gate and writes our
podSetUpdates into the Pod (nodeSelector, annotations), which is what the scheduler and the engine
then see."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from localdev import kueue as k
from localdev.gpunodes import server_side_apply
from tests.cluster.conftest import wait_until
from tests.cluster.operator_env import (
    JURISDICTION,
    Pool,
    admitted_job,
    annotations,
    job_body,
    make_pool,
    outcome,
    submit,
    submit_body,
)

CHAT = {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance_rate": 0.8, "latency_class": "latency"}
HOST = "kubernetes.io/hostname"
GATE = "kueue.x-k8s.io/admission"


def replica(pool: Pool, name: str, gpus: int = 1, **notes: Any) -> dict[str, Any]:
    """A serving replica as a Deployment's ReplicaSet creates it under Kueue's integration."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": pool.namespace,
            "labels": {"kueue.x-k8s.io/queue-name": pool.queue, "app": "chat"},
            "annotations": annotations(**notes),
        },
        "spec": {
            "containers": [
                {
                    "name": "server",
                    "image": "vllm/vllm-openai:latest",
                    "resources": {
                        "requests": {"cpu": "1", "nvidia.com/gpu": str(gpus)},
                        "limits": {"nvidia.com/gpu": str(gpus)},
                    },
                }
            ]
        },
    }


def pods_workload(pool: Pool, pod: str) -> dict[str, Any] | None:
    for wl in k.workloads(pool.env.api, pool.namespace):
        refs = wl["metadata"].get("ownerReferences") or []
        if any(r.get("kind") == "Pod" and r.get("name") == pod for r in refs):
            return wl
    return None


def ungated(pool: Pool, name: str, timeout: float = 60.0) -> client.V1Pod:
    core = client.CoreV1Api(pool.env.api)

    def read() -> client.V1Pod | None:
        pod = core.read_namespaced_pod(name, pool.namespace)
        gates = [g.name for g in pod.spec.scheduling_gates or []]
        return pod if GATE not in gates and (pod.spec.node_selector or {}).get(HOST) else None

    return wait_until(read, timeout=timeout, what=f"pod {name} admitted and ungated")


def test_each_replica_of_a_server_is_decided_from_its_own_pod_and_pinned_inside_the_jurisdiction(
    env, namespace
):
    # Two eu nodes of 2 GPUs and a kr node; the namespace says nothing, the pods say eu. Three
    # replicas of one GPU each: each its own Workload, each decided speculative on an eu GPU,
    # never two on one GPU, and the decision in the Pod where the engine reads it.
    pool = make_pool(
        env,
        namespace,
        [
            ("H100-SXM", "eu", 2, [1.0, 1.0]),
            ("H100-SXM", "eu", 2, [1.0, 1.0]),
            ("H100-SXM", "kr", 2, [1.0, 1.0]),
        ],
    )
    eu = {pool.hosts[n] for n, (_, j, _) in pool.nodes.items() if j == "eu"}
    names = [f"chat-7d9f-{i}" for i in range(3)]
    for name in names:
        server_side_apply(env.api, replica(pool, name, jurisdiction="eu", **CHAT), "sovereignspec-e2e")
    placed = set()
    for name in names:
        pod = ungated(pool, name)
        host = pod.spec.node_selector[HOST]
        notes = pod.metadata.annotations or {}
        assert host in eu, (name, host)
        assert (
            notes["sovereignspec.io/mode"] == "speculative"
            and int(notes["sovereignspec.io/draft-budget"]) >= 1
        )
        placed.add((host, notes["sovereignspec.io/gpu-index"]))
        wl = pods_workload(pool, name)
        assert wl is not None
        entry = k.check_state(wl, env.check)
        assert entry is not None and entry["state"] == "Ready", entry
        assert "declared" in entry["message"], entry["message"]  # α from the Pod's own keys
    assert len(placed) == 3  # one GPU each, none given twice


def test_a_replica_whose_pod_breaks_the_grammar_is_rejected_naming_the_key(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [1.0, 1.0])])
    server_side_apply(env.api, replica(pool, "bad-0", jurisdiction="eu,kr;", **CHAT), "sovereignspec-e2e")

    def rejected() -> dict[str, Any] | None:
        wl = pods_workload(pool, "bad-0")
        entry = k.check_state(wl, env.check) if wl else None
        text = (entry or {}).get("message", "")
        return (
            entry if entry and ("Rejected" in (entry["state"], text.rsplit("Previously: ", 1)[-1])) else None
        )

    entry = wait_until(rejected, timeout=60, what="bad-0 rejected")
    events = client.CoreV1Api(env.api).list_namespaced_event(namespace).items
    said = " ".join(e.message or "" for e in events if e.reason == "Rejected") + entry.get("message", "")
    assert "annotation sovereignspec.io/jurisdiction: got 'eu,kr;'; accepted: an ISO 3166-1" in said, said
    pod = client.CoreV1Api(env.api).read_namespaced_pod("bad-0", namespace)
    assert GATE in [g.name for g in pod.spec.scheduling_gates or []]  # never admitted


def test_a_job_of_four_pods_of_eight_gpus_is_spread_over_four_nodes_pinned_by_its_jurisdiction(
    env, namespace
):
    # Four 8-GPU eu nodes and a kr one: no node holds 32 GPUs, each holds one pod. The pods are
    # pinned by the jurisdiction's label (every eu node is one the workload may use) and counted
    # on the four nodes they were planned on.
    pool = make_pool(
        env, namespace, [("H100-SXM", "eu", 8, [1.0] * 8)] * 4 + [("H100-SXM", "kr", 8, [1.0] * 8)]
    )
    body = job_body(pool, "wide", gpus=8, jurisdiction="eu", **CHAT)
    body["spec"]["parallelism"] = body["spec"]["completions"] = 4
    submit_body(pool, body)
    job = admitted_job(pool, "wide")
    assert job.spec.template.spec.node_selector[JURISDICTION] == "eu"
    assert HOST not in job.spec.template.spec.node_selector
    notes = job.spec.template.metadata.annotations
    planned = sorted(h for h, _ in (x.split("/") for x in notes["sovereignspec.io/nodes"].split(",")))
    eu = sorted(pool.hosts[n] for n, (_, j, _) in pool.nodes.items() if j == "eu")
    assert planned == eu
    # Nothing of eu is left: a one-GPU newcomer in eu waits.
    submit(pool, "after", jurisdiction="eu", **CHAT)
    state, message = outcome(pool, "after")
    assert state == "Retry", message
