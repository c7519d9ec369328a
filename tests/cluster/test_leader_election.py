"""Leader election against the real API server, each candidate authenticated only by a
ServiceAccount token with the chart's own Lease rules (files/role-rules-leader-election.yaml).

A silent leader (its API server unreachable) stops writing before a standby may take over, and the
standby takes over once the lease has run out on its own clock; a leader that hands the Lease over is
replaced within a retry period; two operator processes on one check, the leader SIGKILLed in the
middle of a burst, decide every workload exactly once. The process as the kubelet stops it: SIGTERM
ends it at once with exit 0 (a leader handing over on its way out); a Lease taken from it ends it
non-zero, to be restarted as a standby.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from localdev import controlplane
from localdev import kueue as k
from localdev.cutting_proxy import CuttingProxy
from localdev.gpunodes import server_side_apply
from localdev.operator import OperatorProcess, policy, service_account_kubeconfig
from sovereignspec.operator.roles.role import DECISION_REASONS
from sovereignspec.operator.runtime.leader import LeaderElector, LeaseRecord
from sovereignspec.operator.runtime.writer import NotLeaderError
from tests.cluster.auditing import audit, mine
from tests.cluster.conftest import wait_until
from tests.cluster.operator_env import decided, events, make_pool, our_entry, submit, workload_of

RULES = "charts/sovereignspec/files/role-rules-leader-election.yaml"
LEASE = "sovereignspec-test"
CHAT = {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance_rate": 0.8, "latency_class": "latency"}


def allow_leases(api: client.ApiClient, namespace: str, account: str, lease: str = LEASE) -> None:
    """The chart's Role for its Lease (its one source, the lease's name put in), bound to `account`."""
    text = re.sub(r"\{\{[^}]*\}\}", lease, (controlplane.REPO / RULES).read_text())
    group = "rbac.authorization.k8s.io"
    role = {
        "apiVersion": f"{group}/v1",
        "kind": "Role",
        "metadata": {"name": "leader-election", "namespace": namespace},
        "rules": yaml.safe_load(text),
    }
    binding = {"apiVersion": f"{group}/v1", "kind": "RoleBinding",
               "metadata": {"name": "leader-election", "namespace": namespace},
               "roleRef": {"apiGroup": group, "kind": "Role", "name": "leader-election"},
               "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}  # fmt: skip
    server_side_apply(api, role, "sovereignspec-e2e")
    server_side_apply(api, binding, "sovereignspec-e2e")


@pytest.fixture
def link() -> Iterator[CuttingProxy]:
    """Candidate a's way to the API server: a relay that a test can cut (every request reset)."""
    proxy = CuttingProxy(controlplane.ports()["APISERVER_PORT"], controlplane.state_dir() / "pki").start()
    yield proxy
    proxy.close()


def candidates(
    api: client.ApiClient, namespace: str, link: CuttingProxy, *timings: float
) -> tuple[LeaderElector, LeaderElector]:
    """Two candidates on one ServiceAccount's token: a through `link`, b straight."""
    kubeconfig = service_account_kubeconfig(api, namespace, "elector", cluster_role=None)
    allow_leases(api, namespace, "elector")
    doc = yaml.safe_load(kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = link.url
    linked = kubeconfig.with_name("linked.kubeconfig")
    linked.write_text(yaml.safe_dump(doc))
    a = LeaderElector(config.new_client_from_config(str(linked)), namespace, LEASE, "a", *timings)
    b = LeaderElector(config.new_client_from_config(str(kubeconfig)), namespace, LEASE, "b", *timings)
    return a, b


def holder(api: client.ApiClient, namespace: str) -> LeaseRecord | None:
    """The Lease's record; None while there is no Lease yet (an operator just started, on a busy
    machine, may not have made it when the test first looks)."""
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(LEASE, namespace)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise
    return LeaseRecord.of(client.ApiClient().sanitize_for_serialization(lease))


def test_a_silent_leader_stops_writing_before_a_standby_takes_over_after_the_lease_runs_out(
    api, namespace, link
):
    duration, deadline, retry = 3.0, 2.0, 0.4
    a, b = candidates(api, namespace, link, duration, deadline, retry)
    lost_at: list[float] = []
    a.on_stopped_leading = lambda: lost_at.append(time.monotonic())
    a.start()
    wait_until(a.leading, timeout=10, what="a to lead")
    b.start()
    time.sleep(1.0)
    assert a.leading() and not b.leading()  # a renews: b waits
    # a can no longer reach the API server (a partition): its renewals fail from now on.
    link.cut = lambda _method, _path: True
    cut = time.monotonic()
    both = 0
    while not b.leading() and time.monotonic() < cut + 30:
        both += a.leading() and b.leading()
        time.sleep(0.01)
    took_over = time.monotonic() - cut
    assert b.leading(), "b never took over"
    assert both == 0 and lost_at and lost_at[0] < cut + took_over  # never two leaders at once
    with pytest.raises(NotLeaderError), a.fence():
        pass  # the deposed leader's writes are refused before they are sent
    # b waited out the lease from when it last saw a renew (within a retry period of the cut).
    assert duration - retry * 1.2 <= took_over <= duration + 3 * retry + 2.0, took_over
    record = holder(api, namespace)
    assert record is not None and record.holder == "b" and record.transitions == 1
    b.release()


def test_a_standby_sees_each_renewal_through_its_watch_under_the_charts_rules_not_at_its_next_read(
    api, namespace, link
):
    # A retry period long enough that b reads the Lease once at its start and not again within the
    # waits below (10 s + 12 s): what b learns of a's renewal in between can only come by its watch.
    duration, deadline, retry = 100.0, 60.0, 30.0
    a, b = candidates(api, namespace, link, duration, deadline, retry)
    a.start()
    try:
        wait_until(a.leading, timeout=10, what="a to lead")
        b.start()
        _sees_renewals(a, b)
    finally:
        a.release()
        b.release()


def _sees_renewals(a: LeaderElector, b: LeaderElector) -> None:
    assert b._watch is not None
    watch = b._watch
    wait_until(lambda: b._observed is not None and watch.synced.is_set(), timeout=10, what="b's first read")
    assert not watch.absent and not watch.denied, watch.last_error  # the Role lets it list and watch
    before = b._observed
    assert a.try_acquire_or_renew()  # a renews now, between b's rounds

    def renewal_seen() -> bool:
        return b._observed is not None and b._observed.holder == "a" and b._observed != before

    wait_until(renewal_seen, timeout=12, what="b to see a's renewal by its watch")
    assert not b.leading()


def leads(api: client.ApiClient, namespace: str, operator: OperatorProcess) -> bool:
    """The Lease names this operator process (its identity holds its pid)."""
    record = holder(api, namespace)
    return record is not None and operator.proc is not None and f"/{operator.proc.pid}_" in record.holder


def test_a_leader_that_hands_over_is_replaced_within_a_retry_period_after_its_writes_end(
    api, namespace, link
):
    a, b = candidates(api, namespace, link, 20.0, 15.0, 0.4)
    a.start()
    wait_until(a.leading, timeout=10, what="a to lead")
    b.start()
    in_flight = threading.Event()
    write_ended: list[float] = []

    def a_write() -> None:
        with a.fence():
            in_flight.set()
            time.sleep(0.5)
            write_ended.append(time.monotonic())

    writer = threading.Thread(target=a_write)
    writer.start()
    in_flight.wait(5)
    assert a.release() is True
    released = time.monotonic()
    writer.join()
    assert write_ended and write_ended[0] <= released  # the hand-over waited for the write in flight
    wait_until(b.leading, timeout=5, what="b to lead after the hand-over")
    assert time.monotonic() - released < 20.0 / 4  # a retry period or so, not the lease duration
    with pytest.raises(NotLeaderError), a.fence():
        pass
    record = holder(api, namespace)
    assert record is not None and record.holder == "b"
    b.release()


def test_a_leader_with_a_write_still_in_flight_lets_the_lease_run_out_rather_than_hand_it_over(
    api, namespace, link
):
    # A write that outlives release's wait could land after a successor took over at once: the
    # Lease stays a's and runs out (was: handed over anyway once the wait ran out).
    a, _ = candidates(api, namespace, link, 20.0, 15.0, 0.4)
    a.start()
    wait_until(a.leading, timeout=10, what="a to lead")
    writing, done = threading.Event(), threading.Event()

    def stuck_write() -> None:
        with a.fence():
            writing.set()
            done.wait(10)

    writer = threading.Thread(target=stuck_write)
    writer.start()
    writing.wait(5)
    try:
        assert a.release(wait=0.5) is False
        record = holder(api, namespace)
        assert record is not None and record.holder == "a", record
        with pytest.raises(NotLeaderError), a.fence():
            pass  # and it writes no more
    finally:
        done.set()
        writer.join()


def elected(env: Any, namespace: str, unique: Any, what: str) -> tuple[Any, Any, list[str]]:
    """A check and policy of the test's own (`what`), the operators' ServiceAccount kubeconfig with
    the chart's Lease rules, and leader-election flags with a 4 s lease (3 s renew deadline)."""
    name = unique(f"{what}-policy")
    server_side_apply(env.api, policy(name, env.prometheus.url), "sovereignspec-e2e")
    check, controller = unique(f"{what}-check"), f"sovereignspec.io/{what}"
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": name}
    k.apply(env.api, k.admission_check(check, controller, params))
    own = replace(env, check=check, controller=controller)
    kubeconfig = service_account_kubeconfig(env.api, namespace, "sovereignspec")
    allow_leases(env.api, namespace, "sovereignspec")
    flags = ["--leader-elect", "--leader-election-namespace", namespace, "--leader-election-id", LEASE,
             "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5"]  # fmt: skip
    return own, kubeconfig, flags


def _recorded_through_the_failover(pool: Any, jobs: Iterable[str]) -> None:
    """The sovereignty record after a failover: one chain, no gap and no fork (`audit verify` names
    none), every placed workload's decision in it (audit.required: written before the decision),
    written by both replicas."""
    verified = audit("verify")
    assert mine(verified.stdout, pool.namespace) == [], verified.stdout
    records = [json.loads(x) for x in audit("export", "--namespace", pool.namespace).stdout.splitlines()]
    decisions = [r for r in records if r["kind"] == "decision"]
    placed = set()
    for job in jobs:
        wl = workload_of(pool, job)
        if wl is not None and (k.check_state(wl, pool.env.check) or {}).get("state") == "Ready":
            placed.add(wl["metadata"]["uid"])
    assert placed and placed <= {r["workload"]["uid"] for r in decisions if r["state"] == "Ready"}
    deciders = {r["replica"] for r in decisions}
    assert len(deciders) == 2, deciders
    # Each replica's hand-over is in the record before its first decision: who led from when on,
    # at which of the Lease's transitions.
    whole = [json.loads(x) for x in audit("export").stdout.splitlines()]
    for replica in deciders:
        took = [r for r in whole if r["kind"] == "leader" and r["replica"] == replica]
        first = min(r["seq"] for r in decisions if r["replica"] == replica)
        assert took and took[0]["seq"] < first and "(term " in took[0]["term"], (replica, took)


def test_two_operators_decide_each_workload_of_a_burst_exactly_once_when_the_leader_is_killed(
    env: Any, namespace: str, unique: Any
) -> None:
    own, kubeconfig, flags = elected(env, namespace, unique, "elect")
    operators = [
        OperatorProcess(own.controller, extra=flags, kubeconfig=kubeconfig).start() for _ in range(2)
    ]
    try:
        pool = make_pool(
            own, namespace, [("H100-SXM", "eu", 8, [0.95] * 8), ("H100-SXM", "eu", 8, [0.95] * 8)]
        )

        def leader() -> OperatorProcess | None:
            return next((o for o in operators if leads(env.api, namespace, o)), None)

        first = wait_until(leader, timeout=30, what="one operator to lead")
        client.CoreV1Api(env.api).patch_namespace(
            namespace, {"metadata": {"labels": {"sovereignspec.io/jurisdiction": "eu"}}}
        )  # the pods below bound inside its jurisdictions
        # Two GPU pods bound by hand, recorded by the first leader; one ends while no replica leads.
        for name in ("stays", "ends"):
            client.CoreV1Api(env.api).create_namespaced_pod(namespace, gpu_pod(name, next(iter(pool.nodes))))
        # (The session's own operator records every GPU pod too: only these replicas' records count.)
        by_first = f"/{first.proc.pid}_"  # type: ignore[union-attr]
        wait_until(
            lambda: len(pod_records(namespace, "binding", by_first)) == 2, timeout=60, what="both bindings"
        )
        jobs = [f"burst-{i:02d}" for i in range(14)]
        for job in jobs[:4]:
            submit(pool, job, **CHAT)
        wait_until(lambda: decided(pool, jobs[0]), timeout=60, what="the first decision")
        first.kill()  # SIGKILL: no hand-over, the standby waits out the lease
        killed = time.monotonic()
        client.CoreV1Api(env.api).delete_namespaced_pod("ends", namespace, grace_period_seconds=0)
        for job in jobs[4:]:
            submit(pool, job, **CHAT)
        finals = {j: decided(pool, j, timeout=90) for j in jobs}
        resumed = time.monotonic() - killed
        second = wait_until(leader, timeout=5, what="the standby to hold the Lease")
        assert second is not first
        # Every workload decided once, by one or the other: one decision Event each.
        names = {j: wl["metadata"]["name"] for j, wl in finals.items()}

        def told() -> dict[str, int]:
            per_workload = Counter(
                e.involved_object.name for e in events(pool) if e.reason in DECISION_REASONS
                for _ in range(e.count or 1)
            )  # fmt: skip
            return {n: per_workload[n] for n in names.values()}

        # An Event the killed leader had no time to post is re-posted by the new one after its
        # first tick's decisions (`Role.repost_events`): it may come a moment after them.
        wait_until(lambda: min(told().values()) >= 1, timeout=30, what="one decision Event per workload")
        assert told() == dict.fromkeys(names.values(), 1)
        # No GPU given twice: 14 one-GPU workloads on 16 GPUs, each (node, index) once.
        spots = Counter()
        for wl in finals.values():
            entry = our_entry(pool, wl)
            assert entry["state"] == "Ready", entry
            for update in entry["podSetUpdates"]:
                node = update["nodeSelector"]["kubernetes.io/hostname"]
                spots[(node, update["annotations"]["sovereignspec.io/gpu-index"])] += 1
        assert set(spots.values()) == {1}, spots
        assert resumed < 4 + 3 * 0.5 + 30, resumed  # the lease, a retry or so, the rest of the burst
        assert "leads now" in second.logs()
        _recorded_through_the_failover(pool, jobs)
        # The new leader goes on from the bindings the record holds open: the pod still running is
        # not recorded bound again, and the one that ended while none led is recorded ended. (The
        # session's own operator records the same pods into the same chain, and may record that end
        # first: then the record holds it already, and the new leader does not repeat it.)
        by_second = f"/{second.proc.pid}_"  # type: ignore[union-attr]
        ends = lambda: [r for r in pod_records(namespace, "ended", "") if r["pod"]["name"] == "ends"]  # noqa: E731
        wait_until(ends, timeout=30, what="the end of the pod that ended while none led")
        assert len([r for r in ends() if by_second in r["replica"]]) <= 1, ends()
        assert pod_records(namespace, "binding", by_second) == []  # "stays" not recorded bound again
        first_bound = sorted(r["pod"]["name"] for r in pod_records(namespace, "binding", by_first))
        assert first_bound == ["ends", "stays"], first_bound
    finally:
        for o in operators:
            o.stop()


def gpu_pod(name: str, node: str) -> dict[str, Any]:
    """A one-GPU pod bound by hand (no queue name, no scheduler, no kubelet here: it stays Pending)."""
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip


def pod_records(namespace: str, kind: str, replica: str) -> list[dict[str, Any]]:
    """This namespace's `binding` or `ended` records of pods by a replica (a part of its identity)."""
    out = audit("export", "--namespace", namespace).stdout.splitlines()
    return [r for r in map(json.loads, out) if r["kind"] == kind and replica in r["replica"]]


@pytest.mark.parametrize("elect", [False, True], ids=["alone", "leading"])
def test_sigterm_stops_the_operator_with_exit_0_long_before_a_pods_grace_period_ends(
    env: Any, namespace: str, elect: bool
) -> None:
    """What the kubelet does to a Pod it deletes: SIGTERM, then SIGKILL after the grace period (30 s
    by default). The operator exits 0 on its own, a leader after handing its Lease over: a rolling
    update, a drain or a Recreate rollout never waits out the grace period for it. (kopf waited for
    a thread-bound stop flag in a thread nothing woke, so the process never ended by itself.)"""
    controller = "sovereignspec.io/sigterm"
    kubeconfig = service_account_kubeconfig(env.api, namespace, "sovereignspec")
    flags: list[str] = []
    if elect:
        allow_leases(env.api, namespace, "sovereignspec")
        flags = ["--leader-elect", "--leader-election-namespace", namespace, "--leader-election-id", LEASE]
    operator = OperatorProcess(controller, extra=flags, kubeconfig=kubeconfig).start()
    assert operator.proc is not None
    try:
        if elect:
            wait_until(lambda: leads(env.api, namespace, operator), timeout=30, what="the operator to lead")
        operator.proc.terminate()
        try:
            code = operator.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 10 s after SIGTERM:\n{operator.logs()[-3000:]}")
        assert code == 0, operator.logs()[-3000:]
        if elect:
            record = holder(env.api, namespace)
            assert record is not None and record.holder == "", record  # handed over on the way out
    finally:
        operator.kill()


def test_a_leader_whose_lease_is_taken_stops_with_a_non_zero_exit_to_rejoin_as_a_standby(
    env: Any, namespace: str
) -> None:
    """Another holder written into the Lease (what a standby does once it thinks the lease ran
    out): the operator stops deciding and its process ends, non-zero, so that the kubelet restarts it
    as a fresh standby; it does not hang on its way out either."""
    kubeconfig = service_account_kubeconfig(env.api, namespace, "sovereignspec")
    allow_leases(env.api, namespace, "sovereignspec")
    flags = ["--leader-elect", "--leader-election-namespace", namespace, "--leader-election-id", LEASE,
             "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5"]  # fmt: skip
    operator = OperatorProcess("sovereignspec.io/taken", extra=flags, kubeconfig=kubeconfig).start()
    assert operator.proc is not None
    try:
        wait_until(lambda: leads(env.api, namespace, operator), timeout=30, what="the operator to lead")
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        taken = {"spec": {"holderIdentity": "someone-else", "acquireTime": now, "renewTime": now}}
        client.CoordinationV1Api(env.api).patch_namespaced_lease(LEASE, namespace, taken)
        try:
            code = operator.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 20 s after its Lease was taken:\n{operator.logs()[-3000:]}")
        assert code == 1, operator.logs()[-3000:]
        assert "now held by someone-else" in operator.logs()
        assert "exiting: leadership lost" in operator.logs()
    finally:
        operator.kill()


def through(kubeconfig: Any, proxy: CuttingProxy, name: str) -> Any:
    """The same credentials, with the API server reached through `proxy`."""
    doc = yaml.safe_load(kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = proxy.url
    out = kubeconfig.with_name(name)
    out.write_text(yaml.safe_dump(doc))
    return out


def entry_of(pool: Any, job: str) -> dict[str, Any]:
    """Our check's entry on the Job's Workload; empty while there is none."""
    wl = workload_of(pool, job)
    return (k.check_state(wl, pool.env.check) or {}) if wl is not None else {}


def status_write(method: str, path: str) -> bool:
    return method == "PATCH" and "/workloads/" in path and path.endswith("/status")


def test_a_deposed_leaders_write_that_lands_after_the_takeover_never_over_commits(
    env: Any, namespace: str, unique: Any
) -> None:
    """The write of a leader paused between its Lease check and its send (SIGSTOP, a long GC, a
    frozen VM) reaches the API server after another replica took over. Here each operator reaches
    the API server through a relay that holds chosen requests: a's decision for "slow" is held while
    a loses its Lease (its renewals cut) and b takes over; b's own write about "slow" is held until
    a's has landed. One GPU: a gave it to "slow"; b, deciding "fast" first (latency class), would
    give it to "fast" from a ledger without a's decision. Before: both Ready on the one GPU. Now: a
    named "slow" in the Lease before sending its decision, and b seals what the Lease it took names
    before deciding, so a's late write either fails or is read first. It seals nothing else: "fast",
    which a never announced (its Lease writes cut), is not a's to send."""
    own, kubeconfig, flags = elected(env, namespace, unique, "fence")
    pki = controlplane.state_dir() / "pki"
    links = [CuttingProxy(controlplane.ports()["APISERVER_PORT"], pki).start() for _ in range(2)]
    a_link, b_link = links
    a = OperatorProcess(
        own.controller, extra=flags, kubeconfig=through(kubeconfig, a_link, "a.kubeconfig")
    ).start()
    b: OperatorProcess | None = None
    try:
        wait_until(lambda: leads(env.api, namespace, a), timeout=30, what="a to lead")
        b = OperatorProcess(
            own.controller, extra=flags, kubeconfig=through(kubeconfig, b_link, "b.kubeconfig")
        )
        b.start()
        pool = make_pool(own, namespace, [("H100-SXM", "eu", 1, [0.95])])
        a_link.hold = status_write
        submit(pool, "slow", **{**CHAT, "latency_class": "throughput"})
        wait_until(lambda: a_link.held_count() >= 1, timeout=60, what="a's decision held on its way")
        slow = workload_of(pool, "slow")
        assert slow is not None and our_entry(pool, slow).get("state") == "Pending"
        slow_path = f"/workloads/{slow['metadata']['name']}/status"
        b_link.hold = lambda method, path: status_write(method, path) and path.endswith(slow_path)
        a_link.cut = lambda _method, path: "/leases/" in path  # a can no longer renew: it stops
        submit(pool, "fast", **CHAT)
        wait_until(lambda: leads(env.api, namespace, b), timeout=30, what="b to take over")
        wait_until(lambda: b_link.held_count() >= 1, timeout=30, what="b's seal of slow held")
        assert a_link.held_count() == 1, "a sent more than its one decision held"
        a_link.release()  # a's decision, long after a lost its Lease
        wait_until(lambda: a_link.sent_late, timeout=30, what="a's late write answered")
        b_link.release()
        wait_until(lambda: b_link.sent_late, timeout=30, what="b's held write answered")
        print(f"a's late write: {a_link.sent_late}; b's held write: {b_link.sent_late}")

        def settled() -> dict[str, dict[str, Any]] | None:
            entries = {job: entry_of(pool, job) for job in ("slow", "fast")}
            states = {job: e.get("state") for job, e in entries.items()}
            return entries if "Ready" in states.values() and "Pending" not in states.values() else None

        entries = wait_until(settled, timeout=60, what="both decided")
        time.sleep(2.0)  # anything still on its way lands
        entries = {job: entry_of(pool, job) for job in ("slow", "fast")}
        ready = [job for job, e in entries.items() if e.get("state") == "Ready"]
        assert len(ready) == 1, {job: (e.get("state"), e.get("message")) for job, e in entries.items()}
        if a_link.sent_late[0][2] < 300:  # a's write landed: b read it before it decided
            assert ready == ["slow"], entries
        # Sealed: the one workload a's Lease named, not every pending one (counted 0 where a's write
        # landed first: the seal conflicted, and the catch-up read "slow" decided).
        logs = b.logs()
        sealing = re.search(r"leading: (\d+) pending workload\(s\) sealed for .* \(of (\d+) named\)", logs)
        assert sealing is not None, logs[-3000:]
        assert sealing.group(2) == "1" and sealing.group(1) in ("0", "1"), sealing.group(0)
    finally:
        for o in (a, b):
            if o is not None:
                o.kill()
        for link in links:
            link.close()


def test_a_leader_paused_mid_burst_and_resumed_after_the_takeover_over_commits_nothing(
    env: Any, namespace: str, unique: Any
) -> None:
    """SIGSTOP the leader in the middle of a burst of 12 one-GPU workloads on 8 GPUs; the standby
    takes over once the lease has run out, seals and decides; SIGCONT the old leader, whose writes
    checked before the pause go out now. It finds its Lease gone and exits 1. No GPU is given
    twice, every GPU ends given, and no workload gets two decision Events."""
    own, kubeconfig, flags = elected(env, namespace, unique, "pause")
    operators = [
        OperatorProcess(own.controller, extra=flags, kubeconfig=kubeconfig).start() for _ in range(2)
    ]
    try:
        pool = make_pool(own, namespace, [("H100-SXM", "eu", 4, [0.95] * 4)] * 2)

        def leader() -> OperatorProcess | None:
            return next((o for o in operators if leads(env.api, namespace, o)), None)

        first = wait_until(leader, timeout=30, what="one operator to lead")
        assert first.proc is not None
        jobs = [f"burst-{i:02d}" for i in range(12)]
        for job in jobs[:6]:
            submit(pool, job, **CHAT)
        wait_until(lambda: decided(pool, jobs[0]), timeout=60, what="the first decision")
        first.proc.send_signal(signal.SIGSTOP)  # paused wherever it is: mid-tick, mid-write
        try:
            for job in jobs[6:]:
                submit(pool, job, **CHAT)
            second = wait_until(
                lambda: next((o for o in operators if o is not first and leads(env.api, namespace, o)), None),
                timeout=30,
                what="the standby to take over",
            )
            wait_until(lambda: "sealed for" in second.logs(), timeout=30, what="the standby's seal")
            time.sleep(1.0)
        finally:
            first.proc.send_signal(signal.SIGCONT)
        assert first.proc.wait(timeout=30) == 1, first.logs()[-3000:]  # its Lease is gone: exit 1

        def all_gpus_given() -> dict[tuple[str, str], int] | None:
            spots: Counter[tuple[str, str]] = Counter()
            for job in jobs:
                entry = entry_of(pool, job)
                if entry.get("state") != "Ready":
                    continue
                for update in entry["podSetUpdates"]:
                    host = update["nodeSelector"]["kubernetes.io/hostname"]
                    spots[(host, update["annotations"]["sovereignspec.io/gpu-index"])] += 1
            return spots if sum(spots.values()) >= 8 else None

        spots = wait_until(all_gpus_given, timeout=90, what="every GPU given")
        time.sleep(2.0)  # anything still on its way lands
        spots = all_gpus_given() or {}
        assert set(spots.values()) == {1} and len(spots) == 8, spots
        # Decided once: one decision Event each. The new leader re-posts the Event of a decision
        # whose Event it cannot find (lost to a crash between the write and the Event); the paused
        # leader's own Event may still follow it: a re-post is not a decision.
        decisions = [e for e in events(pool) if e.reason in ("SpeculativeDecode", "PlainDecode")]
        per_workload = Counter(
            e.involved_object.name for e in decisions if not (e.message or "").startswith("(re-posted")
            for _ in range(e.count or 1)
        )  # fmt: skip
        assert max(per_workload.values()) == 1, per_workload
        _recorded_through_the_failover(pool, jobs)
    finally:
        for o in operators:
            if o.proc is not None and o.proc.poll() is None:
                o.proc.send_signal(signal.SIGCONT)
            o.kill()
