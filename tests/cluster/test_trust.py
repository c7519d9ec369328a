"""The trust boundaries, tried the way a hostile or careless user would, on the real control plane:
tenancy that cannot be claimed, a ledger that cannot be forged, failures that stay alone,
telemetry that cannot be true, a strict annotation grammar, pods that get one consistent
configuration, work that can never fit, hostnames that are not node names, room for exclusive
tenants, and nodes that move jurisdiction under running work.

Each test here failed on main at 47a905b (before these boundaries existed)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

from localdev import kueue as k
from localdev.gpunodes import server_side_apply
from localdev.operator import policy
from tests.cluster.conftest import wait_until
from tests.cluster.operator_env import (
    JURISDICTION,
    Pool,
    add_namespace,
    admitted_job,
    decided,
    event,
    in_namespace,
    job_body,
    make_pool,
    our_entry,
    outcome,
    second_check,
    submit,
    submit_body,
    wait_for_series,
    workload_of,
)

CHAT = {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance_rate": 0.8, "latency_class": "latency"}
HOST = "kubernetes.io/hostname"


def _node_of(pool: Pool, job: str) -> str:
    return admitted_job(pool, job).spec.template.spec.node_selector[HOST]


def _notes(pool: Pool, job: str) -> dict[str, str]:
    return dict(admitted_job(pool, job).spec.template.metadata.annotations or {})


# 1. Tenant identity comes from the namespace --------------------------------------------------


def test_a_workload_cannot_claim_another_namespaces_tenant(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.9] * 4), ("H100-SXM", "eu", 4, [0.5] * 4)])
    bank_ns = add_namespace(pool, "bank", {"sovereignspec.io/tenant": "bank"})
    bank = in_namespace(pool, bank_ns)
    submit(bank, "ledger", exclusive_node="true", **CHAT)
    _node_of(bank, "ledger")
    evil = in_namespace(pool, add_namespace(pool, "evil"))
    submit(evil, "impostor", tenant="bank", **CHAT)
    state, message = outcome(evil, "impostor")
    assert state == "Rejected", message
    assert "sovereignspec.io/tenant" in message and "'bank'" in message
    # Restating the namespace's own tenant is fine.
    submit(bank, "restated", tenant="bank", **CHAT)
    assert _node_of(bank, "restated") == _node_of(bank, "ledger")


def test_a_namespace_jurisdiction_binds_its_workloads_and_annotations_only_narrow_it(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [1.0, 1.0]), ("H100-SXM", "kr", 2, [0.1, 0.1])])
    kr_node = next(n for n, (_, j, _) in pool.nodes.items() if j == "kr")
    korea = in_namespace(pool, add_namespace(pool, "kr", {"sovereignspec.io/jurisdiction": "kr"}))
    submit(korea, "silent", **CHAT)  # says nothing: the namespace says kr
    assert _node_of(korea, "silent") == kr_node
    submit(korea, "widen", jurisdiction="eu", **CHAT)
    state, message = outcome(korea, "widen")
    assert state == "Rejected" and "namespace allows: kr" in message, message


# 2. and 3. One ledger, from facts users cannot forge, across every policy -----------------------


def test_a_template_that_sets_our_output_keys_still_counts_in_the_ledger(env, namespace):
    # Idle GPUs: the decision would be speculative, which the template's mode=plain contradicts.
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [1.0] * 4)])
    for i in range(4):
        body = job_body(pool, f"steer-{i}", gpus=2, **CHAT)
        body["spec"]["template"]["metadata"]["annotations"]["sovereignspec.io/mode"] = "plain"
        submit_body(pool, body)
    states = [outcome(pool, f"steer-{i}")[0] for i in range(4)]
    assert states.count("Ready") == 2 and states.count("Retry") == 2, states  # 4 GPUs, 2 each
    warning = event(pool, "ReservedAnnotation")
    assert warning.type == "Warning" and "sovereignspec.io/mode" in warning.message


def test_a_template_setting_a_mode_no_decision_writes_is_rejected_even_when_no_gpu_is_free(env, namespace):
    # The pool's only GPUs are taken: a normal workload waits (Retry); `mode: turbo` could never be
    # admitted wherever it lands, so it is Rejected now, naming the key, not left to wait.
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [1.0] * 2)])
    submit(pool, "holder", gpus=2, **CHAT)
    assert our_entry(pool, decided(pool, "holder"))["state"] == "Ready"
    body = job_body(pool, "turbo", **CHAT)
    body["spec"]["template"]["metadata"]["annotations"]["sovereignspec.io/mode"] = "turbo"
    submit_body(pool, body)
    submit(pool, "waiter", **CHAT)
    state, message = outcome(pool, "turbo")
    assert state == "Rejected" and "sovereignspec.io/mode='turbo'" in message, message
    assert outcome(pool, "waiter")[0] == "Retry"


def test_two_policies_share_one_ledger_of_capacity_and_tenancy(env, namespace, unique):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [0.9, 0.9])])
    other = second_check(env, unique)
    cq = unique("cq")
    flavor = f"t{pool.token}-h100-sxm"
    k.apply(env.api, k.cluster_queue(cq, {flavor: 64}, [other.check]))
    k.apply(env.api, k.local_queue("other", namespace, cq))
    submit(pool, "first", gpus=2, **CHAT)
    _node_of(pool, "first")
    second = Pool(other, namespace, pool.token, pool.nodes, "other", pool.hosts)
    submit(second, "second", gpus=1, **CHAT)
    state, message = outcome(second, "second")
    assert state == "Retry", message  # the node's 2 GPUs are taken, whichever check took them


# 4. One bad object or source fails alone ---------------------------------------------------------


def test_a_workload_asking_for_1k_gpus_is_rejected_alone_and_does_not_stall_the_others(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.9] * 4)])
    flavor = f"t{pool.token}-h100-sxm"
    k.apply(env.api, k.cluster_queue(f"t{pool.token}", {flavor: 2000}, [env.check]))  # quota for it
    submit_body(pool, job_body(pool, "thousand", gpus="1k", **CHAT))  # a valid quantity: 1000
    submit(pool, "plain-one", **CHAT)
    assert our_entry(pool, decided(pool, "plain-one"))["state"] == "Ready"
    state, message = outcome(pool, "thousand")
    assert state == "Rejected" and "needs 1000 GPUs on one node" in message, message


class _LyingPrometheus:
    """An HTTP server that answers the Prometheus API's shape, with rows that have no value."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps(
                    {
                        "status": "success",
                        "data": {"resultType": "vector", "result": [{"metric": {"gpu": "0"}}]},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_telemetry_source_answering_nonsense_fails_only_its_own_policy(env, namespace, unique):
    liar = _LyingPrometheus()
    try:
        name = unique("liar")
        server_side_apply(env.api, policy(name, liar.url), "sovereignspec-e2e")
        check = unique("liar-check")
        params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": name}
        k.apply(env.api, k.admission_check(check, env.controller, params))
        lied_to = make_pool(replace(env, check=check), namespace, [("H100-SXM", "eu", 2, [0.95, 0.95])])
        healthy = make_pool(env, namespace, [("H100-SXM", "eu", 2, [0.95, 0.95])], queue="healthy")
        submit(lied_to, "misled", **CHAT)
        submit(healthy, "unaffected", **CHAT)
        assert our_entry(healthy, decided(healthy, "unaffected"))["message"].startswith("speculative")
        entry = our_entry(lied_to, decided(lied_to, "misled"))
        assert entry["state"] == "Ready" and entry["message"].startswith("plain"), entry["message"]
    finally:
        liar.close()


# 5. Telemetry that cannot be true is missing, not idle --------------------------------------------


def test_impossible_gpu_activity_is_treated_as_missing_not_as_idle(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 1, [0.9]), ("H100-SXM", "eu", 1, [0.9])])
    negative, duplicated = list(pool.nodes)
    env.telemetry.tensor.labels("0", pool.hosts[negative], "synthetic").set(-0.3)
    env.telemetry.tensor.labels("0", pool.hosts[duplicated], "second-exporter").set(0.0)
    wait_for_series(
        env.prometheus,
        f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{modelName="second-exporter",Hostname="{pool.hosts[duplicated]}"}}',
    )
    wait_until(
        lambda: env.prometheus.query(
            f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{Hostname="{pool.hosts[negative]}"}} < 0'
        ),
        timeout=30,
        what="the negative reading in Prometheus",
    )
    time.sleep(1.2)
    for i in range(2):
        submit(pool, f"blind-{i}", **CHAT)
    for i in range(2):
        entry = our_entry(pool, decided(pool, f"blind-{i}"))
        assert entry["state"] == "Ready" and entry["message"].startswith("plain"), entry["message"]
    env.telemetry.tensor.remove("0", pool.hosts[duplicated], "second-exporter")


def test_acceptance_counters_that_contradict_each_other_are_not_evidence(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [0.5, 0.5])])
    model = "llama-3.1-8b"
    counters = env.telemetry
    stop = threading.Event()

    def lie() -> None:  # more tokens accepted than drafted
        while not stop.wait(0.25):
            counters.drafts.labels(namespace, namespace, model).inc(250)
            counters.drafted.labels(namespace, namespace, model).inc(1000)
            counters.accepted.labels(namespace, namespace, model).inc(5000)

    feeder = threading.Thread(target=lie, daemon=True)
    feeder.start()
    try:
        wait_for_series(env.prometheus, f'vllm:spec_decode_num_drafts_total{{namespace="{namespace}"}}')
        time.sleep(3)
        submit(pool, "sceptic", **{**CHAT, "acceptance_rate": 0.05, "drafter": "ngram"})
        message = our_entry(pool, decided(pool, "sceptic"))["message"]
        assert "observed" not in message and message.startswith("plain"), message
    finally:
        stop.set()


# 6. A strict annotation grammar; sovereignty fails closed ----------------------------------------


def test_loose_or_misplaced_annotations_are_malformed_and_sovereignty_fails_closed(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.95] * 4), ("H100-SXM", "kr", 4, [0.1] * 4)])
    sovereign = {
        "newline-j": {"sovereignspec.io/jurisdiction": "kr\n"},
        "newline-t": {"sovereignspec.io/tenant": f"{namespace}\n"},
        "shouting": {"sovereignspec.io/exclusive-node": "TRUE"},
        "capital": {"sovereignspec.io/Jurisdiction": "kr"},
        "typo": {"sovereignspec.io/jurisdicton": "kr"},
    }
    performance = {
        "infinite": {"sovereignspec.io/tpot-slo-ms": "inf"},
        "overflow": {"sovereignspec.io/tpot-slo-ms": "1e309"},
        "huge": {"sovereignspec.io/max-num-seqs": "1e300"},
        "underscore": {"sovereignspec.io/context-length": "1_0"},
        "fullwidth": {"sovereignspec.io/max-num-seqs": "８"},
    }
    for name, notes in {**sovereign, **performance}.items():
        body = job_body(pool, name, **CHAT)
        body["spec"]["template"]["metadata"]["annotations"].update(notes)
        submit_body(pool, body)
    on_job = job_body(pool, "on-job", **CHAT)
    on_job["metadata"]["annotations"] = {"sovereignspec.io/jurisdiction": "kr"}
    submit_body(pool, on_job)
    for name in [*sovereign, "on-job"]:
        state, message = outcome(pool, name)
        assert state == "Rejected", (name, message)
    assert "spec.template.metadata.annotations" in outcome(pool, "on-job")[1]
    for name in performance:
        entry = our_entry(pool, decided(pool, name))
        assert entry["state"] == "Ready" and entry["message"].startswith("plain"), (name, entry["message"])
        assert event(pool, "BadAnnotation", workload_of(pool, name)["metadata"]["name"]).type == "Warning"


# 7. What reaches the pod agrees with itself --------------------------------------------------------


def test_the_pod_never_gets_a_mode_and_an_engine_config_that_contradict_each_other(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.95] * 4)])
    body = job_body(pool, "says-plain", **CHAT)
    body["spec"]["template"]["metadata"]["annotations"]["sovereignspec.io/mode"] = "plain"
    submit_body(pool, body)
    body = job_body(pool, "says-two", **CHAT)
    body["spec"]["template"]["metadata"]["annotations"]["sovereignspec.io/draft-budget"] = "2"
    submit_body(pool, body)
    notes = _notes(pool, "says-plain")
    assert notes["sovereignspec.io/mode"] == "plain" and notes["sovereignspec.io/draft-budget"] == "0"
    assert "sovereignspec.io/vllm-speculative-config" not in notes
    state, message = outcome(pool, "says-two")
    assert state == "Rejected" and "sovereignspec.io/draft-budget='2'" in message, message


# 8. and 9. Work that can never fit; hostnames that are not node names -------------------------------


def test_work_that_can_never_fit_is_rejected_with_the_reason(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [0.9, 0.9]), ("H100-SXM", "eu", 2, [0.9, 0.9])])
    submit(pool, "too-wide", gpus=4, **CHAT)
    # Three pods of 2 GPUs: no node holds them together, and spread the two nodes hold two.
    body = job_body(pool, "three-pods", gpus=2, **CHAT)
    body["spec"]["parallelism"] = body["spec"]["completions"] = 3
    submit_body(pool, body)
    state, message = outcome(pool, "too-wide")
    assert state == "Rejected", message
    assert "needs 4 GPUs on one node" in message and "has 2" in message, message
    state, message = outcome(pool, "three-pods")
    assert state == "Rejected", message
    assert "its 3 pods of 2 GPUs never fit: the nodes it may use hold 2" in message, message


def test_the_node_selector_names_the_hostname_label_not_the_node_name(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [0.9, 0.9])], fqdn=True)
    (node,) = pool.nodes
    submit(pool, "fqdn", gpus=2, **CHAT)
    assert _node_of(pool, "fqdn") == pool.hosts[node] != node
    submit(pool, "after", gpus=1, **CHAT)  # the ledger maps the hostname back to the node: it is full
    assert outcome(pool, "after")[0] == "Retry"


# 10. Room for exclusive tenants -----------------------------------------------------------------------


def test_shared_work_leaves_a_whole_node_for_an_exclusive_tenant(env, namespace, unique):
    reserving = second_check(env, unique, placement={"keepWholeNodesFree": 1})
    # Each node has one idle and one busy GPU: speed alone spreads one shared replica per node.
    pool = make_pool(reserving, namespace, [("H100-SXM", "eu", 2, [0.9, 0.1]) for _ in range(4)])
    for i in range(4):
        submit(pool, f"shared-{i}", tenant=namespace, **CHAT)
        _node_of(pool, f"shared-{i}")
    bank = in_namespace(pool, add_namespace(pool, "bank", {"sovereignspec.io/tenant": "bank"}))
    submit(bank, "vault", exclusive_node="true", **CHAT)
    state, message = outcome(bank, "vault")
    assert state == "Ready", message
    vault_node = _node_of(bank, "vault")
    assert all(_node_of(pool, f"shared-{i}") != vault_node for i in range(4))


def _shared_then_two_exclusive_tenants(pool: Pool) -> tuple[set[str], dict[str, set[str]]]:
    """A shared tenant's six 1-GPU replicas, then two exclusive tenants' two each: where they went."""
    for i in range(6):
        submit(pool, f"shared-{i}", **CHAT)
        _node_of(pool, f"shared-{i}")
    held: dict[str, set[str]] = {}
    for tenant in ("bank", "vault"):
        mine = in_namespace(pool, add_namespace(pool, tenant, {"sovereignspec.io/tenant": tenant}))
        for i in range(2):
            submit(mine, f"{tenant}-{i}", exclusive_node="true", **CHAT)
            state, message = outcome(mine, f"{tenant}-{i}")
            assert state == "Ready", message
            held.setdefault(tenant, set()).add(_node_of(mine, f"{tenant}-{i}"))
    return {_node_of(pool, f"shared-{i}") for i in range(6)}, held


def test_under_the_defaults_shared_work_packs_and_two_exclusive_tenants_each_get_a_node(env, namespace):
    # Four idle 8-GPU nodes: the shared replicas pack onto one, leaving whole nodes.
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 8, [0.9] * 8) for _ in range(4)])
    shared, held = _shared_then_two_exclusive_tenants(pool)
    assert len(shared) == 1
    assert all(len(nodes) == 1 for nodes in held.values())  # each tenant's two on one node
    assert not (held["bank"] | held["vault"]) & shared and held["bank"] != held["vault"]


def test_an_exclusive_tenants_second_workload_joins_its_first_and_leaves_the_other_kept_node(
    env, namespace, unique
):
    # Each node has one GPU a little faster than the rest (7 % in TPOT). Two of four nodes are kept
    # for exclusive tenants; the first tenant's second workload would rather take the other kept
    # node's faster GPU (and leave the second tenant nothing), but packs onto its own node.
    kept = second_check(env, unique, placement={"keepWholeNodesFree": 2})
    pool = make_pool(kept, namespace, [("H100-SXM", "eu", 8, [0.95] + [0.9] * 7) for _ in range(4)])
    shared, held = _shared_then_two_exclusive_tenants(pool)
    assert len(shared) <= 2
    assert all(len(nodes) == 1 for nodes in held.values())
    assert not (held["bank"] | held["vault"]) & shared and held["bank"] != held["vault"]


# 11. Sovereignty drift --------------------------------------------------------------------------------


def test_a_node_moved_to_another_jurisdiction_under_running_work_is_reported(env, namespace, operator):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [0.9, 0.9])])
    (node,) = pool.nodes
    submit(pool, "settled", jurisdiction="eu", **CHAT)
    _node_of(pool, "settled")
    client.CoreV1Api(env.api).patch_node(node, {"metadata": {"labels": {JURISDICTION: "us"}}})
    name = workload_of(pool, "settled")["metadata"]["name"]
    warning = event(pool, "SovereigntyDrift", name, timeout=60)
    assert warning.type == "Warning" and "jurisdiction" in warning.message and node in warning.message
    assert "sovereignty drift" in our_entry(pool, workload_of(pool, "settled"))["message"]
    assert "sovereignspec_sovereignty_drift_workloads" in operator.metrics()


def test_a_gpu_pod_that_bypassed_the_queue_onto_a_node_outside_its_namespaces_jurisdiction_is_reported(
    env, namespace, operator
):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [0.9, 0.9])])
    (node,) = pool.nodes
    korea = add_namespace(pool, "kr", {"sovereignspec.io/jurisdiction": "kr"})
    # No queue name (Kueue never sees it) and bound by whoever made it: no decision of ours.
    body = {
        "metadata": {"name": "bypass", "namespace": korea},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "engine", "image": "example.invalid/engine",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}}
            ],
        },
    }  # fmt: skip
    client.CoreV1Api(env.api).create_namespaced_pod(korea, body)
    warning = event(in_namespace(pool, korea), "SovereigntyViolation", "bypass", timeout=60)
    assert warning.type == "Warning" and warning.involved_object.kind == "Pod"
    assert f"{node}, in eu" in warning.message and "only in kr" in warning.message, warning.message

    def counted() -> float | None:
        for line in operator.metrics().splitlines():
            if line.startswith("sovereignspec_sovereignty_violating_pods "):
                return float(line.split()[1]) or None
        return None

    assert wait_until(counted, timeout=30, what="the violating pods gauge") >= 1
    assert "sovereignspec_sovereignty_violations_total" in operator.metrics()
    client.CoreV1Api(env.api).delete_namespaced_pod("bypass", korea, grace_period_seconds=0)


# 12. Smaller: reasons that name the real cause -----------------------------------------------------


def test_a_job_pinned_outside_its_flavor_is_rejected_for_that_not_for_sovereignty(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [0.9, 0.9])])
    body = job_body(pool, "pinned", **CHAT)
    body["spec"]["template"]["spec"]["nodeSelector"] = {HOST: "no-such-host"}
    submit_body(pool, body)
    state, message = outcome(pool, "pinned")
    assert state == "Rejected" and "nodeSelector" in message and "sovereignty" not in message, message


def test_a_decision_whose_event_was_lost_to_a_crash_gets_it_posted_after_the_restart(env, namespace, unique):
    from localdev.operator import OperatorProcess

    controller = "sovereignspec.io/restart"
    name = unique("restart")
    server_side_apply(env.api, policy(name, env.prometheus.url), "sovereignspec-e2e")
    check = unique("restart-check")
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": name}
    k.apply(env.api, k.admission_check(check, controller, params))
    k.set_check_active(env.api, check, "sovereignspec-controller")
    pool = make_pool(
        replace(env, check=check, controller=controller), namespace, [("H100-SXM", "eu", 1, [0.9])]
    )
    (node,) = pool.nodes
    submit(pool, "survivor", **CHAT)

    def reserved() -> dict[str, Any] | None:
        wl = workload_of(pool, "survivor")
        return wl if wl and k.check_state(wl, check) and k.condition(wl, "QuotaReserved") else None

    wl = wait_until(reserved, what="quota for the workload")
    # What a controller killed between its status write and its Event leaves behind.
    body = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": wl["metadata"]["name"], "namespace": namespace},
        "status": {"admissionChecks": [{
            "name": check, "state": "Ready", "message": "plain γ=0 on the node (decided before the crash)",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "podSetUpdates": [{"name": "main", "nodeSelector": {HOST: pool.hosts[node]},
                               "annotations": {"sovereignspec.io/mode": "plain"}}],
        }]},
    }  # fmt: skip
    server_side_apply(env.api, body, "sovereignspec-controller", "status")
    restarted = OperatorProcess(controller).start()
    try:
        posted = event(pool, "PlainDecode", wl["metadata"]["name"], timeout=60)
        assert "re-posted after a restart" in posted.message and "decided before the crash" in posted.message
    finally:
        restarted.stop()


def test_with_evict_on_drift_a_workload_whose_node_left_its_jurisdiction_is_evicted(env, namespace, unique):
    evicting = second_check(env, unique, sovereignty={"evictOnDrift": True})
    pool = make_pool(evicting, namespace, [("H100-SXM", "eu", 2, [0.9, 0.9])])
    (node,) = pool.nodes
    submit(pool, "moved", jurisdiction="eu", **CHAT)
    _node_of(pool, "moved")
    client.CoreV1Api(env.api).patch_node(node, {"metadata": {"labels": {JURISDICTION: "us"}}})

    def evicted() -> bool:
        wl = workload_of(pool, "moved")
        return bool(wl) and (k.condition(wl, "Evicted") or {}).get("status") == "True"

    wait_until(evicted, timeout=60, what="Kueue to evict the drifted workload")
    assert event(pool, "SovereigntyDrift", workload_of(pool, "moved")["metadata"]["name"]).type == "Warning"

    # Placed again from scratch: no eu node is left, so Rejected (and Kueue, deactivating it, resets
    # the entry to Pending, "Previously: Rejected"). Right after the drift eviction the entry reads
    # "Previously: Retry" with no Retry Event of ours: wait past that to the new decision.
    def decided_again() -> str | None:
        entry = k.check_state(workload_of(pool, "moved") or {}, pool.env.check) or {}
        if entry.get("state") == "Rejected":
            return str(entry["message"])
        if str(entry.get("message", "")).endswith("Previously: Rejected"):
            return event(pool, "Rejected", workload_of(pool, "moved")["metadata"]["name"]).message
        return None

    message = wait_until(decided_again, timeout=60, what="the evicted workload to be decided again")
    assert "jurisdiction eu" in message, message
