"""Deciding from watch-fed caches, against the real control plane: a cache that is behind costs a
conflict and a retry from the next version, never a decision on stale state; watches broken by an
API server restart are resumed and the operator catches up without a restart of its own."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from kubernetes import client

from localdev import controlplane
from localdev import kueue as k
from localdev.gpunodes import apply_node, server_side_apply
from localdev.operator import install, policy
from sovereignspec.operator.roles.controller import Controller
from sovereignspec.operator.roles.role import Settings
from sovereignspec.profiles import load_profiles
from tests.cluster.conftest import wait_until
from tests.cluster.operator_env import decided, make_pool, submit, workload_of


def _one_node_queue(api: client.ApiClient, namespace: str, unique: Any, controller_name: str) -> str:
    """A node, a flavor, our policy and check (for `controller_name`), a ClusterQueue and a
    LocalQueue `q` in `namespace`; returns the check's name."""
    token = unique("wc")
    labels = {
        "kubernetes.io/hostname": token,
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "sovereignspec.io/test-pool": token,
    }
    cap = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": token, "labels": labels}}
    apply_node(api, {**node, "status": {"capacity": cap, "allocatable": cap}})
    k.apply(api, k.resource_flavor(token, {"sovereignspec.io/test-pool": token}))
    server_side_apply(api, policy(token, None), "sovereignspec-e2e")
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": token}
    k.apply(api, k.admission_check(token, controller_name, params))
    k.apply(api, k.cluster_queue(token, {token: 8}, [token]))
    k.apply(api, k.local_queue("q", namespace, token))
    return token


def _entry(wl: dict[str, Any] | None, check: str) -> dict[str, Any]:
    return (k.check_state(wl, check) if wl else None) or {}


def test_a_workload_changed_after_the_cache_read_is_decided_again_from_its_new_version(
    api, namespace, unique
):
    """The controller in this process, as the operator's own user: its Workloads cache is held
    back while someone else changes the Workload; the decision on the cached copy conflicts, is not
    retried on that same copy, and is made from the new version once the watch brings it; the
    other writer's change survives."""
    name = unique("sovereignspec.io/cache-test")
    install(api)
    check = _one_node_queue(api, namespace, unique, name)
    controller = Controller(
        controlplane.api_client("operator"), load_profiles(None), Settings(controller_name=name)
    )
    controller.cache.start()
    try:
        wait_until(controller.cache.synced, timeout=30, what="the caches to list and watch")
        wait_until(lambda: controller.tick() and _active(api, check), timeout=30, what="our check Active")
        submit_job = k.job("j", namespace, "q", annotations={"sovereignspec.io/model": "llama-3.1-8b"})
        server_side_apply(api, submit_job, "sovereignspec-e2e")

        def cached_pending() -> dict[str, Any] | None:
            for wl in controller.cache.workloads.items():
                meta = wl["metadata"]
                if (
                    meta.get("namespace") == namespace
                    and _entry(wl, check).get("state") == "Pending"
                    and k.condition(wl, "QuotaReserved")
                ):
                    return wl
            return None

        stale = wait_until(cached_pending, timeout=60, what="the reserved Workload in the cache")
        # Hold the cache back, then change the Workload under it (another controller's label): the
        # watch stops at that event without applying it.
        controller.cache.workloads.stop()
        meta = stale["metadata"]
        key = f"{namespace}/{meta['name']}"
        patch = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": meta["name"],
                "namespace": namespace,
                "labels": {"example.com/other": "kept"},
            },
        }
        changed = json.loads(server_side_apply(api, patch, "another-controller"))
        assert controller.cache.workloads.stop(wait=10)
        cached = controller.cache.workloads.get(key)
        assert cached is not None and _entry(cached, check).get("state") == "Pending"
        assert int(cached["metadata"]["resourceVersion"]) < int(changed["metadata"]["resourceVersion"])

        first = controller.tick()
        assert first.conflicts == 1 and first.decided == 0
        again = controller.tick()  # the same stale copy: nothing is written
        assert again.conflicts == 0 and again.decided == 0
        assert _entry(workload_of_ns(api, namespace), check).get("state") == "Pending"

        controller.cache.workloads.start()  # resumes from where it stopped: the change arrives
        wait_until(
            lambda: (
                "example.com/other"
                in (controller.cache.workloads.get(key) or {})["metadata"].get("labels", {})
            ),
            timeout=30,
            what="the watch to bring the new version",
        )
        assert controller.cache.workloads.lists == 1  # resumed, not listed again
        third = controller.tick()
        assert third.decided == 1 and third.conflicts == 0
        wl = workload_of_ns(api, namespace)
        assert _entry(wl, check).get("state") == "Ready"
        assert wl["metadata"]["labels"]["example.com/other"] == "kept"
    finally:
        controller.cache.stop()


def workload_of_ns(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    (wl,) = k.workloads(api, namespace)
    return wl


def _active(api: client.ApiClient, check: str) -> bool:
    ac = client.CustomObjectsApi(api).get_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "admissionchecks", check
    )
    return any(
        c["type"] == "Active" and c["status"] == "True" for c in ac.get("status", {}).get("conditions", [])
    )


def _metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def test_an_api_server_restart_mid_burst_breaks_every_watch_and_the_operator_catches_up(
    env, operator, namespace
):
    """30 one-GPU Jobs on 4 nodes x 8 GPUs; the API server is stopped and started again after the
    first 10. The same operator process (no restart) decides all 30, no node over its 8 GPUs."""
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 8, [0.9] * 8) for _ in range(4)])
    pid = operator.proc.pid
    errors_before = _metric(operator.metrics(), "sovereignspec_watch_errors_total")
    jobs = [f"burst-{i:02d}" for i in range(30)]
    for i, job in enumerate(jobs):
        if i == 10:
            controlplane.restart_apiserver()
        _retrying(lambda job=job: submit(pool, job, model="llama-3.1-8b"))
    for job in jobs:  # reads too outlive the restart ("storage is (re)initializing": 429)
        _retrying(lambda job=job: decided(pool, job, timeout=180), timeout=240)
    assert operator.proc.pid == pid and operator.proc.poll() is None
    text = operator.metrics()
    assert _metric(text, "sovereignspec_watch_errors_total") > errors_before
    per_node: dict[str, int] = {}
    for job in jobs:
        wl = workload_of(pool, job)
        entry = _entry(wl, env.check)
        assert entry.get("state") == "Ready", (job, entry)
        (update,) = entry["podSetUpdates"]
        node = update["nodeSelector"]["kubernetes.io/hostname"]
        per_node[node] = per_node.get(node, 0) + 1
    # No node given more GPUs than it has: the ledger survived the restart.
    assert max(per_node.values()) <= 8 and sum(per_node.values()) == 30, per_node


def _retrying(call: Any, timeout: float = 120.0) -> Any:
    """A client call that outlives a restart of the API server (connection refused meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_a_stopped_informers_catch_up_ends_with_an_error_instead_of_waiting_for_a_watch(api, namespace):
    """A leader stopping (SIGTERM) while its first catch-up waits: the informer, stopped, will never
    move on, so the catch-up ends at once saying so, and the process is not held until its timeout."""
    from sovereignspec.operator.runtime.informer import Informer

    cms = Informer(api, f"/api/v1/namespaces/{namespace}/configmaps", "configmaps")
    cms.stop()  # never listed: its resourceVersion stays behind the API server's
    with pytest.raises(RuntimeError, match="cache of configmaps stopped before it reached resourceVersion"):
        cms.catch_up(wait=0.1, timeout=5)


def test_a_new_leaders_cache_catches_up_with_what_was_written_before_it_led(api, namespace):
    """The Informer's `catch_up` (a new leader, before its first decision): its watch of one
    namespace's ConfigMaps is idle, and it still ends holding at least the API server's state when
    it was called, including a ConfigMap written a moment before."""
    from sovereignspec.operator.runtime.informer import Informer

    cms = Informer(api, f"/api/v1/namespaces/{namespace}/configmaps", "configmaps")
    core = client.CoreV1Api(api)
    try:
        cms.start()
        wait_until(cms.synced.is_set, timeout=30, what="the ConfigMaps' cache to be listed")
        mine = core.create_namespaced_config_map(namespace, {"metadata": {"name": "last-of-the-old-leader"}})
        # Written elsewhere then: etcd's revision moves on, and our watch has nothing to say.
        elsewhere = core.create_namespaced_config_map("default", {"metadata": {"generateName": "cu-"}})
        cms.catch_up(wait=0.2)
        assert cms.get(f"{namespace}/last-of-the-old-leader") is not None
        held = int(cms._rv or 0)
        assert held >= int(elsewhere.metadata.resource_version) > int(mine.metadata.resource_version)
    finally:
        cms.stop()
        core.delete_namespaced_config_map(elsewhere.metadata.name, "default")
