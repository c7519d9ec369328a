"""SovereignSpec as a Kueue AdmissionCheck controller, end to end: a real kube-apiserver and etcd,
Kueue admitting real Jobs, the operator as its own process and user, telemetry through a real
Prometheus. Each test gets its own GPU nodes, flavors and queues (see operator_env.make_pool)."""

from __future__ import annotations

import json
import time

from kubernetes import client

from localdev import kueue as k
from localdev.gpunodes import server_side_apply
from tests.cluster.conftest import wait_until
from tests.cluster.operator_env import (
    add_namespace,
    admitted_job,
    decided,
    event,
    events,
    in_namespace,
    make_pool,
    our_entry,
    outcome,
    submit,
    wait_for_series,
    workload_of,
)

CHAT = {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance_rate": 0.8, "latency_class": "latency"}


def _notes(job: client.V1Job) -> dict[str, str]:
    return dict(job.spec.template.metadata.annotations or {})


def test_an_idle_gpu_and_a_high_acceptance_latency_workload_is_admitted_speculative(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.95] * 4)])
    submit(pool, "chat", **CHAT)
    job = admitted_job(pool, "chat")
    notes = _notes(job)
    node = next(iter(pool.nodes))
    assert notes["sovereignspec.io/mode"] == "speculative"
    gamma = int(notes["sovereignspec.io/draft-budget"])
    assert gamma >= 1
    vllm = json.loads(notes["sovereignspec.io/vllm-speculative-config"])
    table = vllm["num_speculative_tokens_per_batch_size"]
    top = max(k for _, _, k in table)
    # γ* at the declared batch (the policy's default max-num-seqs, 8); lighter batches may go further.
    assert table[0][0] == 1 and top >= gamma
    assert all(k <= gamma for _, hi, k in table if hi >= 8)
    assert vllm["method"] == "eagle3" and vllm["num_speculative_tokens"] == top and "EAGLE3" in vllm["model"]
    assert f"--speculative-num-steps {top}" in notes["sovereignspec.io/sglang-args"]
    adaptive = json.loads(notes["sovereignspec.io/sglang-adaptive-config"])
    assert max(max(v["candidate_steps"]) for v in adaptive.values()) == top
    assert job.spec.template.spec.node_selector["kubernetes.io/hostname"] == node
    assert "S_real=" in event(pool, "SpeculativeDecode").message


def test_saturated_gpus_admit_plain_at_once(env, namespace):
    pool = make_pool(
        env, namespace, [("H100-SXM", "eu", 2, [0.0, 0.0]), ("A100-80G-SXM", "eu", 2, [0.0, 0.0])]
    )
    submit(pool, "busy", **CHAT)
    wl = decided(pool, "busy")
    entry = our_entry(pool, wl)
    assert entry["state"] == "Ready" and "plain γ=0" in entry["message"]
    notes = _notes(admitted_job(pool, "busy"))
    assert notes["sovereignspec.io/mode"] == "plain" and notes["sovereignspec.io/draft-budget"] == "0"
    assert "sovereignspec.io/vllm-speculative-config" not in notes
    assert not [e for e in events(pool) if e.reason == "Retry"]


def test_a_jurisdiction_is_never_crossed_whatever_the_headroom_elsewhere(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [1.0] * 4), ("H100-SXM", "kr", 4, [0.0] * 4)])
    kr_node = next(n for n, (_, j, _) in pool.nodes.items() if j == "kr")
    for i in range(3):
        submit(pool, f"kr-{i}", jurisdiction="kr", **CHAT)
        job = admitted_job(pool, f"kr-{i}")
        assert job.spec.template.spec.node_selector["kubernetes.io/hostname"] == kr_node


def test_no_node_of_the_flavor_in_the_jurisdiction_is_rejected_with_that_reason(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [1.0] * 4)])
    submit(pool, "kr-only", jurisdiction="kr", **CHAT)
    state, message = outcome(pool, "kr-only")
    assert state == "Rejected" and "jurisdiction kr" in message
    assert event(pool, "Rejected").type == "Warning"
    # Kueue deactivates it after our Rejected lands: a moment later, not in the same instant.
    wait_until(lambda: workload_of(pool, "kr-only")["spec"].get("active") is False, 30, what="deactivated")


def test_an_exclusive_tenant_never_shares_a_node_in_either_direction(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.9] * 4), ("H100-SXM", "eu", 4, [0.5] * 4)])
    # Tenants are what administrators say: one namespace each, labelled with its tenant.
    bank, shop, vault = (
        in_namespace(pool, add_namespace(pool, t, {"sovereignspec.io/tenant": t}))
        for t in ("bank", "shop", "vault")
    )
    submit(bank, "bank", exclusive_node="true", **CHAT)
    bank_node = admitted_job(bank, "bank").spec.template.spec.node_selector["kubernetes.io/hostname"]
    submit(shop, "shop", **CHAT)
    shop_node = admitted_job(shop, "shop").spec.template.spec.node_selector["kubernetes.io/hostname"]
    assert shop_node != bank_node  # nobody joins an exclusive tenant
    submit(vault, "vault", exclusive_node="true", **CHAT)
    state, message = outcome(vault, "vault")
    assert state == "Retry" and "retry in" in message  # every node runs another tenant: not now, not never
    assert workload_of(vault, "vault")["spec"].get("active", True) is True


def test_a_neighbour_near_its_slo_keeps_the_newcomer_plain_and_is_named(env, namespace):
    # GPU 0 is the only one with headroom; GPU 1 is compute-saturated (short contexts reach the
    # ridge), where an EAGLE-3 at α 0.7 does not pay (at 0.9 it would: drafting is cheap there).
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [0.9, 0.0])])
    short = {"context_length": 256, "model": "llama-3.1-8b", "latency_class": "latency"}
    submit(pool, "tight", drafter="ngram", acceptance_rate=0.5, tpot_slo_ms=40, **short)
    first = admitted_job(pool, "tight")
    assert first.spec.template.metadata.annotations["sovereignspec.io/gpu-index"] == "0"
    env.telemetry.set_tpot(namespace, "tight", 0.039)  # 97.5 % of its SLO
    wait_for_series(
        env.prometheus, f'vllm:request_time_per_output_token_seconds_bucket{{namespace="{namespace}"}}'
    )
    time.sleep(3)  # a rate needs two scrapes
    submit(pool, "newcomer", drafter="eagle3", acceptance_rate=0.7, max_num_seqs=64, **short)
    wl = decided(pool, "newcomer")
    entry = our_entry(pool, wl)
    neighbour = workload_of(pool, "tight")["metadata"]["name"]
    notes = {u["name"]: u["annotations"] for u in entry["podSetUpdates"]}
    assert all(n["sovereignspec.io/mode"] == "plain" for n in notes.values()), entry["message"]
    named = event(pool, "NeighbourSLO", wl["metadata"]["name"]).message
    assert neighbour in named and "/gpu0" in named


def test_prometheus_down_means_plain_within_a_reevaluation_period_and_recovery_uses_it_again(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.95] * 4)])
    env.prometheus.stop()
    try:
        stopped = time.monotonic()
        time.sleep(1.1)  # decisions may use a snapshot up to 1 s old (the telemetry cache)
        submit(pool, "blind", **CHAT)
        entry = our_entry(pool, decided(pool, "blind"))
        assert time.monotonic() - stopped < 2 + 5  # within one re-evaluation period (+ Kueue's own latency)
        assert entry["state"] == "Ready" and entry["message"].startswith("plain")
        assert "unreachable" in entry["message"]
    finally:
        env.prometheus.start()
    wait_for_series(env.prometheus, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
    submit(pool, "seeing", **CHAT)
    assert our_entry(pool, decided(pool, "seeing"))["message"].startswith("speculative")


def test_stale_gpu_series_mean_plain_with_the_reason(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [0.95, 0.95])])
    node = next(iter(pool.nodes))
    for gpu in (0, 1):
        env.telemetry.tensor.remove(str(gpu), node, "synthetic")  # the exporter stops reporting them
    wait_until(
        lambda: not env.prometheus.query(f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{Hostname="{node}"}}'),
        timeout=30,
        what="the series to go stale",
    )
    time.sleep(1.1)  # the operator may reuse a snapshot for up to 1 s
    submit(pool, "stale", **CHAT)
    entry = our_entry(pool, decided(pool, "stale"))
    assert entry["state"] == "Ready" and "plain" in entry["message"] and "telemetry" in entry["message"]


def test_another_controllers_check_keeps_its_entry_through_our_writes(env, namespace):
    other = f"other-{namespace[-6:]}"
    k.apply(env.api, k.admission_check(other, "other.example.com/gate"))
    k.set_check_active(env.api, other, "other-controller")
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [0.9, 0.9])], extra_checks=[other])
    submit(pool, "shared", **CHAT)

    def listed():
        wl = workload_of(pool, "shared")
        return wl if wl and k.check_state(wl, other) else None

    wl = wait_until(listed, what="the workload")
    body = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": wl["metadata"]["name"], "namespace": namespace},
        "status": {"admissionChecks": [{"name": other, "state": "Pending", "message": "other: waiting",
                                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    }  # fmt: skip
    server_side_apply(env.api, body, "other-controller", "status")
    wl = decided(pool, "shared")
    theirs = k.check_state(wl, other)
    assert (theirs["state"], theirs["message"]) == ("Pending", "other: waiting")
    body["status"]["admissionChecks"][0].update(state="Ready", message="other: done")
    server_side_apply(env.api, body, "other-controller", "status")
    job = admitted_job(pool, "shared")
    assert _notes(job)["sovereignspec.io/mode"] in ("speculative", "plain")
    wl = workload_of(pool, "shared")
    assert k.check_state(wl, other)["message"] == "other: done"
    assert our_entry(pool, wl)["state"] == "Ready"


def test_a_bad_performance_annotation_means_plain_ready_and_a_warning_naming_the_field(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.95] * 4)])
    submit(pool, "vague", **{**CHAT, "acceptance_rate": "high"})
    submit(pool, "hasty", **CHAT, tpot_slo_ms=-5)
    for name, field, accepted in (
        ("vague", "acceptance-rate", "a decimal number in [0, 1]"),
        ("hasty", "tpot-slo-ms", "a positive decimal number of milliseconds"),
    ):
        wl = decided(pool, name)
        entry = our_entry(pool, wl)
        assert entry["state"] == "Ready" and entry["message"].startswith("plain")
        warning = event(pool, "BadAnnotation", wl["metadata"]["name"])
        assert warning.type == "Warning"
        assert f"sovereignspec.io/{field}" in warning.message and accepted in warning.message
        admitted_job(pool, name)


def test_a_bad_sovereignty_annotation_fails_closed_naming_the_field(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.95] * 4)])
    submit(pool, "where", jurisdiction="Europe!", **CHAT)
    submit(pool, "alone", exclusive_node="maybe", **CHAT)
    for name, field in (("where", "jurisdiction"), ("alone", "exclusive-node")):
        state, message = outcome(pool, name)
        assert state == "Rejected" and f"sovereignspec.io/{field}" in message


def test_an_admission_check_with_a_missing_or_invalid_policy_is_inactive_with_a_reason(env, unique):
    missing, invalid = unique("ac-missing"), unique("ac-invalid")
    bad_policy = unique("bad-policy")
    server_side_apply(
        env.api,
        {"apiVersion": "sovereignspec.io/v1alpha1", "kind": "SpeculationPolicy",
         "metadata": {"name": bad_policy}, "spec": {"profiles": {"gpuProducts": {"NVIDIA-B300": "B300"}}}},
        "sovereignspec-e2e",
    )  # fmt: skip
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy"}
    k.apply(env.api, k.admission_check(missing, env.controller, {**params, "name": "does-not-exist"}))
    k.apply(env.api, k.admission_check(invalid, env.controller, {**params, "name": bad_policy}))
    custom = client.CustomObjectsApi(env.api)

    def active(name):
        ac = custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "admissionchecks", name)
        return next((c for c in ac.get("status", {}).get("conditions", []) if c["type"] == "Active"), None)

    cond = wait_until(lambda: active(missing), what="Active on the check with a missing policy")
    assert (
        cond["status"] == "False" and cond["reason"] == "BadParametersRef" and "not found" in cond["message"]
    )
    cond = wait_until(lambda: active(invalid), what="Active on the check with an invalid policy")
    assert cond["status"] == "False" and cond["reason"] == "InvalidParameters" and "B300" in cond["message"]


def test_an_inactive_checks_long_message_is_written_once_not_again_every_tick(operator, env, unique):
    """The condition keeps 1,024 characters of a longer message; read back, the cut message must not
    look changed (it was written again, with a Warning Event, on every tick)."""
    check, name = unique("ac-long"), unique("long-policy")
    model = "m" * 1500  # an unknown model profile: the message names it whole
    server_side_apply(env.api, {"apiVersion": "sovereignspec.io/v1alpha1", "kind": "SpeculationPolicy",
                                "metadata": {"name": name}, "spec": {"defaults": {"model": model}}},
                      "sovereignspec-e2e")  # fmt: skip
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": name}
    k.apply(env.api, k.admission_check(check, env.controller, params))
    custom = client.CustomObjectsApi(env.api)

    def read() -> dict:
        return custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "admissionchecks", check)

    wait_until(lambda: k.condition(read(), "Active"), timeout=30, what="Active on the check")
    before = read()
    assert k.condition(before, "Active")["reason"] == "InvalidParameters"

    def ticks() -> float:
        lines = operator.metrics().splitlines()
        line = next(x for x in lines if x.startswith("sovereignspec_tick_seconds_count"))
        return float(line.rsplit(" ", 1)[1])

    start = ticks()
    wait_until(lambda: ticks() >= start + 3, timeout=60, what="three more ticks")
    assert read()["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    events = (
        client.CoreV1Api(env.api)
        .list_namespaced_event("default", field_selector=f"involvedObject.name={check}")
        .items
    )
    assert len(events) == 1 and events[0].reason == "InvalidParameters"


def test_the_operator_serves_liveness_and_its_own_metrics(operator, env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 1, [0.95])])
    submit(pool, "metered", **CHAT)
    admitted_job(pool, "metered")
    text = operator.metrics()
    assert 'sovereignspec_decisions_total{mode="speculative",outcome="placed"}' in text
    assert "sovereignspec_gpu_headroom" in text and "sovereignspec_tick_seconds_count" in text


def test_a_sigkilled_operator_loses_nothing_in_a_burst_of_fifty(env, namespace, unique):
    from dataclasses import replace as dc_replace

    from localdev.operator import OperatorProcess, policy

    controller, check, name = "sovereignspec.io/burst", unique("sovereignspec-burst"), unique("burst")
    server_side_apply(env.api, policy(name, env.prometheus.url), "sovereignspec-e2e")
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": name}
    k.apply(env.api, k.admission_check(check, controller, params))
    burst = dc_replace(env, check=check, controller=controller)
    pool = make_pool(
        # One flavor (Kueue fills the first flavor with quota first), four nodes, 64 GPUs for 50 jobs.
        burst, namespace, [("H100-SXM", "eu", 16, [0.9] * 16), ("H100-SXM", "eu", 16, [0.3] * 16),
                           ("H100-SXM", "eu", 16, [0.7] * 16), ("H100-SXM", "eu", 16, [0.0] * 16)],
    )  # fmt: skip
    first = OperatorProcess(controller).start()
    try:
        for i in range(50):
            submit(pool, f"job-{i:02d}", tpot_slo_ms=80, **CHAT)

        def ready_count() -> int:
            return sum(
                1
                for wl in k.workloads(env.api, namespace)
                if (k.check_state(wl, check) or {}).get("state") == "Ready"
            )

        wait_until(lambda: ready_count() >= 10, timeout=120, what="ten decisions before the kill")
        first.kill()
        killed_at = ready_count()
    finally:
        first.kill()
    second = OperatorProcess(controller).start()
    try:
        jobs = [admitted_job(pool, f"job-{i:02d}", timeout=180) for i in range(50)]
    finally:
        second.stop()
    assert killed_at < 50, "the kill came too late to test anything"
    per_node: dict[str, int] = {}
    for job in jobs:
        wl = workload_of(pool, job.metadata.name)
        conditions = {c["type"]: c for c in wl["status"]["conditions"]}
        assert conditions["Admitted"]["status"] == "True"
        assert conditions.get("Evicted", {}).get("status") != "True"  # admitted once, never bounced
        assert "Finished" not in conditions
        entry = k.check_state(wl, check)
        assert entry["state"] == "Ready"
        node = entry["podSetUpdates"][0]["nodeSelector"]["kubernetes.io/hostname"]
        assert job.spec.template.spec.node_selector["kubernetes.io/hostname"] == node  # what reached the pod
        per_node[node] = per_node.get(node, 0) + 1
    assert set(per_node) <= set(pool.nodes)
    assert all(count <= pool.nodes[node][2] for node, count in per_node.items()), per_node


def test_acceptance_observed_in_vllm_metrics_is_blended_with_the_declared_prior(env, namespace):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.95] * 4)])
    # Another namespace's engine claims this namespace's tenant: its series must not count.
    env.telemetry.set_acceptance(namespace, "elsewhere", "llama-3.1-8b", 0.99)
    env.telemetry.set_acceptance("whoever", namespace, "llama-3.1-8b", 0.3)
    wait_for_series(env.prometheus, f'vllm:spec_decode_num_drafts_total{{namespace="{namespace}"}}')
    time.sleep(3)  # increase() needs two scrapes
    submit(pool, "learner", **CHAT)  # declares 0.8
    message = our_entry(pool, decided(pool, "learner"))["message"]
    assert "declared 0.80 blended with 0.30 observed" in message
    blended = float(message.split("α ")[1].split(" ")[0])
    assert 0.3 < blended < 0.8


def test_a_speculative_workload_whose_gpu_saturates_is_told_it_became_a_net_loss_and_not_evicted(
    env, operator, namespace
):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 1, [1.0])])
    submit(pool, "aging", **CHAT)
    notes = _notes(admitted_job(pool, "aging"))
    assert notes["sovereignspec.io/mode"] == "speculative"
    wl = workload_of(pool, "aging")
    assert wl is not None
    name = wl["metadata"]["name"]
    node = next(iter(pool.nodes))
    pool.headroom(node, [0.0])  # the GPU fills up under it
    warning = event(pool, "SpeculationNetLoss", name, timeout=60)
    assert warning.type == "Warning" and "not evicted" in warning.message, warning.message

    def exported() -> dict[str, float] | None:
        found = {}
        for line in operator.metrics().splitlines():
            if f'namespace="{namespace}"' in line and f'workload="{name}"' in line:
                metric, value = line.rsplit(" ", 1)
                found[metric.split("{")[0]] = float(value)
        return found if "sovereignspec_aggregate_speedup_in_force" in found else None

    found = wait_until(exported, timeout=30, what="the aging gauges of the workload")
    assert found["sovereignspec_running_gamma"] == float(notes["sovereignspec.io/draft-budget"])
    assert found["sovereignspec_gamma_now"] == 0.0 and found["sovereignspec_aggregate_speedup_in_force"] < 1.0
    time.sleep(3)  # a few more ticks: told once, and still admitted as decided
    assert len([e for e in events(pool, name) if e.reason == "SpeculationNetLoss"]) == 1
    assert our_entry(pool, workload_of(pool, "aging"))["state"] == "Ready"


def test_a_running_decision_is_scored_against_its_engines_tpot_and_a_profile_far_off_is_named(
    env, operator, namespace
):
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 1, [0.95])])
    submit(pool, "scored", **CHAT)
    notes = _notes(admitted_job(pool, "scored"))
    predicted = float(notes["sovereignspec.io/predicted-tpot-ms"]) / 1e3
    wl = workload_of(pool, "scored")
    assert wl is not None
    env.telemetry.set_tpot(namespace, "scored", 2 * predicted)  # its engine runs twice as slow
    warning = event(pool, "PredictionOffProfile", wl["metadata"]["name"], timeout=60)
    # What the operator reads is the engine histogram's p90 through Prometheus (bucketed): the
    # error it names is that reading over the prediction written with the decision.
    p90 = (
        "histogram_quantile(0.9, sum by (le, namespace, job_name) "
        f'(rate(vllm:request_time_per_output_token_seconds_bucket{{namespace="{namespace}"}}[2m])))'
    )
    (row,) = env.prometheus.query(p90)
    measured = float(row["value"][1])
    assert measured >= 2 * predicted * 0.99  # the reading is at least what the engine reports
    assert warning.type == "Warning" and "stands" in warning.message, warning.message
    assert f"({measured / predicted - 1:+.0%}, beyond the policy's 25%)" in warning.message, warning.message

    def scored() -> float | None:
        for line in operator.metrics().splitlines():
            if line.startswith("sovereignspec_prediction_scored_workloads{") and '"H100-SXM"' in line:
                return float(line.rsplit(" ", 1)[1])
        return None

    assert wait_until(scored, timeout=30, what="the profile's scored workloads") >= 1
    assert our_entry(pool, workload_of(pool, "scored"))["state"] == "Ready"  # the decision stands


def test_a_policy_deleted_and_made_again_at_once_never_turns_its_check_inactive(env, unique):
    """What `helm upgrade` does to the chart's policy (a hook object: deleted, then created) must not
    flap the AdmissionCheck inactive; a policy that stays gone does, after the grace period."""
    import threading

    from localdev.operator import policy
    from sovereignspec.operator.roles.checks import POLICY_GRACE_SECONDS

    name, check = unique("grace-policy"), unique("grace-check")
    custom = client.CustomObjectsApi(env.api)
    server_side_apply(env.api, policy(name, env.prometheus.url), "sovereignspec-e2e")
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": name}
    k.apply(env.api, k.admission_check(check, env.controller, params))

    def active() -> str | None:
        ac = custom.get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "admissionchecks", check)
        found = k.condition(ac, "Active")
        return found["status"] if found else None

    wait_until(lambda: active() == "True", timeout=30, what="the check to become Active")
    seen: list[str | None] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.02):
            seen.append(active())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for _ in range(3):
            custom.delete_cluster_custom_object("sovereignspec.io", "v1alpha1", "speculationpolicies", name)
            time.sleep(0.3)  # a tick (debounced 50 ms) runs in between
            server_side_apply(env.api, policy(name, env.prometheus.url), "sovereignspec-e2e")
            time.sleep(0.5)
    finally:
        stop.set()
        watcher.join()
    assert seen and set(seen) == {"True"}, seen
    custom.delete_cluster_custom_object("sovereignspec.io", "v1alpha1", "speculationpolicies", name)
    gone = time.monotonic()
    wait_until(
        lambda: active() == "False", timeout=POLICY_GRACE_SECONDS + 30, what="the check to go inactive"
    )
    assert time.monotonic() - gone >= POLICY_GRACE_SECONDS - 1
