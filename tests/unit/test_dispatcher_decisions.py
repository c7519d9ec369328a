"""The dispatcher role's decisions from its caches, without a cluster: which Workloads it decides,
what it writes, and that it never replaces a nomination someone else wrote."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client

from sovereignspec.operator.border.policy import parse_policy
from sovereignspec.operator.roles.dispatcher import DispatchController
from sovereignspec.profiles import load_profiles

CHECK, MK = "sovereignspec-dispatch", "multikueue"


def worker(name: str, jurisdiction: str, active: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "MultiKueueCluster",
        "metadata": {
            "name": name,
            "resourceVersion": "1",
            "labels": {"sovereignspec.io/jurisdiction": jurisdiction},
        },
        "status": {
            "conditions": [{"type": "Active", "status": "True" if active else "False", "reason": "R"}]
        },
    }


def workload(name: str, namespace: str, **status: Any) -> dict[str, Any]:
    base = {
        "conditions": [{"type": "QuotaReserved", "status": "True"}],
        "admissionChecks": [
            {"name": CHECK, "state": "Pending", "message": ""},
            {"name": MK, "state": "Pending", "message": ""},
        ],
    }
    base.update(status)
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "7", "uid": name},
        "spec": {
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "metadata": {"annotations": {"sovereignspec.io/drafter": "eagle3"}},
                        "spec": {
                            "containers": [{"name": "s", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]
                        },
                    },
                }
            ]
        },
        "status": base,
    }


@pytest.fixture
def controller() -> DispatchController:
    c = DispatchController(client.ApiClient(client.Configuration()), load_profiles())
    cache = c.cache
    cache.checks.put({"metadata": {"name": MK, "resourceVersion": "1"},
                      "spec": {"controllerName": "kueue.x-k8s.io/multikueue",
                               "parameters": {"name": "sovereign"}}})  # fmt: skip
    cache.configs.put({"metadata": {"name": "sovereign", "resourceVersion": "1"},  # type: ignore[attr-defined]
                       "spec": {"clusters": ["worker-eu", "worker-kr"]}})  # fmt: skip
    cache.clusters.put(worker("worker-eu", "eu"))  # type: ignore[attr-defined]
    cache.clusters.put(worker("worker-kr", "kr"))  # type: ignore[attr-defined]
    return c


NAMESPACES = {
    "team-kr": {"sovereignspec.io/jurisdiction": "kr"},
    "team-eu": {"sovereignspec.io/jurisdiction": "eu"},
}


def decide(c: DispatchController, *wls: dict[str, Any]) -> dict[str, Any]:
    for wl in wls:
        c.cache.workloads.put(wl)
    spec = parse_policy("p", {"telemetry": {"source": "none"}})
    out, later = c._decide(spec, {CHECK}, c._workers(spec), c._configs_by_check(), NAMESPACES)
    assert later == 0  # no limit: every pending workload decided
    return {d.wl["metadata"]["name"]: d for d in out}


def test_a_workload_is_nominated_to_its_jurisdiction_in_one_write_with_the_ready_entry(controller):
    d = decide(controller, workload("a", "team-kr"))["a"]
    assert (d.state, d.nominated, d.outcome) == ("Ready", ("worker-kr",), "nominate")
    assert "worker-eu: jurisdiction" in d.message  # why the other was left out


def test_a_nomination_someone_else_wrote_is_kept_when_admissible_and_never_rewritten(controller):
    d = decide(controller, workload("a", "team-kr", nominatedClusterNames=["worker-kr"]))["a"]
    assert (d.state, d.nominated, d.outcome) == ("Ready", None, "kept")  # None: the field is left alone


def test_a_nomination_across_a_boundary_keeps_the_gate_closed(controller):
    d = decide(controller, workload("a", "team-kr", nominatedClusterNames=["worker-eu"]))["a"]
    assert (d.state, d.nominated, d.outcome) == ("Pending", None, "hold")
    assert d.event is not None and d.event[0] == "NominationRefused" and d.event[2]


def test_a_nomination_rewritten_across_a_boundary_after_ready_reopens_nothing_and_retries(controller):
    # Our Ready went out with worker-kr; another writer has since set worker-eu.
    ready = [
        {"name": CHECK, "state": "Ready", "message": "nominated worker-kr"},
        {"name": MK, "state": "Pending"},
    ]
    d = decide(
        controller, workload("a", "team-kr", admissionChecks=ready, nominatedClusterNames=["worker-eu"])
    )["a"]
    assert (d.state, d.nominated, d.outcome) == ("Retry", None, "reclose")
    assert "rewritten to worker-eu" in d.message and "jurisdiction" in d.message
    assert d.event is not None and d.event[0] == "NominationRewritten" and d.event[2]
    # Rewritten to another admissible worker (or still ours): the gate stays as it is.
    kept = decide(
        controller, workload("b", "team-kr", admissionChecks=ready, nominatedClusterNames=["worker-kr"])
    )
    assert "b" not in kept


@pytest.mark.parametrize(
    "status",
    [
        {"clusterName": "worker-kr"},  # admitted through a worker: Kueue's now
        {"conditions": []},  # no quota reserved yet
        {"admissionChecks": [{"name": CHECK, "state": "Ready", "message": "nominated worker-kr"}]},
    ],
    ids=["has-a-cluster", "no-quota", "already-decided"],
)
def test_workloads_it_must_not_touch_are_left_alone(controller, status):
    assert decide(controller, workload("a", "team-kr", **status)) == {}


def test_only_a_disconnected_admissible_worker_means_wait_not_another_jurisdiction(controller):
    down = worker("worker-kr", "kr", active=False)
    down["metadata"]["resourceVersion"] = "2"
    controller.cache.clusters.put(down)  # type: ignore[attr-defined]
    d = decide(controller, workload("a", "team-kr"))["a"]
    assert (d.state, d.nominated, d.outcome) == ("Pending", None, "wait")
    assert "not-connected" in d.message


def test_a_malformed_worker_label_excludes_that_worker_with_the_field_named(controller):
    bad = worker("worker-kr", "KR!")
    bad["metadata"]["resourceVersion"] = "3"
    controller.cache.clusters.put(bad)  # type: ignore[attr-defined]
    d = decide(controller, workload("a", "team-kr"))["a"]
    assert d.outcome == "wait" and "sovereignspec.io/jurisdiction" in d.message and "KR!" in d.message


def test_a_queue_without_a_multikueue_check_waits_with_the_reason(controller):
    wl = workload("a", "team-kr", admissionChecks=[{"name": CHECK, "state": "Pending", "message": ""}])
    d = decide(controller, wl)["a"]
    assert d.outcome == "wait" and "MultiKueue" in d.message


def test_a_nomination_is_recorded_beside_its_announcement_and_sent_after_both(controller, monkeypatch):
    """audit.required: the dispatcher's records persist while the first segment's nominations are
    named in the Lease (`Role.send_recorded`), as the worker role's do; a new leader's first
    dispatch waits for the slower of the two, not for both in turn."""
    import threading

    from sovereignspec.operator.roles import dispatcher
    from sovereignspec.operator.roles.role import TickReport

    log: list[tuple[str, object]] = []
    named = threading.Event()

    def announce(keys: list[str]) -> None:
        log.append(("announce", list(keys)))
        named.set()

    def ahead(_audit, decisions, *_rest):
        # Waits for the announcement: were the two in turn (the record first), it would never come.
        assert named.wait(10), "the nominations were not named beside their record"
        log.append(("recorded", [d.wl["metadata"]["name"] for d in decisions]))
        return [replace(d, recorded=True) for d in decisions]

    monkeypatch.setattr(controller.writer, "announce", announce)
    monkeypatch.setattr(dispatcher, "ahead", ahead)
    monkeypatch.setattr(controller, "_write_one", lambda d: log.append(("write", d.outcome)) or d.outcome)
    monkeypatch.setattr(controller, "_record", lambda *_a: None)
    controller.cache.workloads.put(workload("a", "team-kr"))
    spec = parse_policy("p", {"telemetry": {"source": "none"}})
    report = TickReport()
    waiting = controller._dispatch(spec, {CHECK}, controller._configs_by_check(), NAMESPACES, report, 500)
    assert log == [("announce", ["team-kr/a"]), ("recorded", ["a"]), ("write", "nominate")]
    assert (waiting, report.decided, dict(report.outcomes)) == (0, 1, {"nominate": 1})


def test_a_tick_dispatches_at_most_its_limit_in_dispatch_order_and_the_next_counts_those_dispatched(
    controller, monkeypatch
):
    """A new leader's first tick (`first_batch`), then --tick-limit: the first workloads in dispatch
    order are decided, the tick asks for the next at once, and that one counts what was nominated
    (each write is in the cache as it lands) and decides the rest."""

    written: list[str] = []

    def write(d):  # as the API server answers: the nomination and our Ready entry, in the cache
        wl = {**d.wl, "status": {**d.wl["status"], "nominatedClusterNames": list(d.nominated or ())}}
        wl["status"]["admissionChecks"] = [
            {**e, "state": d.state} if e["name"] == CHECK else e for e in d.wl["status"]["admissionChecks"]
        ]
        controller.cache.workloads.put(wl)
        written.append(d.wl["metadata"]["name"])
        return d.outcome

    from sovereignspec.operator.roles import dispatcher

    monkeypatch.setattr(controller, "_write_one", write)
    monkeypatch.setattr(controller, "_record", lambda *_a: None)
    monkeypatch.setattr(dispatcher, "ahead", lambda _log, ds, *_rest: [replace(d, recorded=True) for d in ds])
    monkeypatch.setattr(controller.writer, "announce", lambda keys: None)
    monkeypatch.setattr(controller.cache, "synced", lambda: True)
    monkeypatch.setattr(controller, "reconcile_checks", lambda: ({CHECK: ("p", _POLICY)}, {}))
    monkeypatch.setattr(controller.cache, "namespaces", _Namespaces())
    for name in ("c", "a", "b"):
        controller.cache.workloads.put(workload(name, "team-kr"))
    # Nominated and Ready before this leader (first in dispatch order): judged again every tick,
    # never counted against the cut, else it would fill it tick after tick.
    ready = workload("0-nominated", "team-kr", nominatedClusterNames=["worker-kr"])
    ready["status"]["admissionChecks"][0]["state"] = "Ready"
    controller.cache.workloads.put(ready)
    controller.first_batch = 1
    first = controller.tick()
    assert (written, first.more, first.decided) == (["a"], True, 1)
    second = controller.tick()  # --tick-limit (500): the rest; "a" is Ready and nominated, left alone
    assert (written, second.more, second.decided) == (["a", "b", "c"], False, 2)


_POLICY = parse_policy("p", {"telemetry": {"source": "none"}})


class _Namespaces:
    def items(self) -> list[dict[str, Any]]:
        return [{"metadata": {"name": n, "labels": labels}} for n, labels in NAMESPACES.items()]


def test_a_workers_committed_gpus_are_those_admitted_there_or_nominated_to_it_alone(controller):
    reserved = {"type": "QuotaReserved", "status": "True"}
    done = {"type": "Finished", "status": "True"}
    for wl in (
        workload("admitted", "team-eu", clusterName="worker-eu"),
        workload("waiting", "team-eu", nominatedClusterNames=["worker-eu"]),
        workload("either", "team-eu", nominatedClusterNames=["worker-eu", "worker-kr"]),  # not yet one's
        workload("finished", "team-kr", clusterName="worker-kr", conditions=[reserved, done]),
        workload("no-quota", "team-kr", clusterName="worker-kr", conditions=[]),
        workload("kr", "team-kr", clusterName="worker-kr"),
    ):
        controller.cache.workloads.put(wl)
    assert controller._committed() == {"worker-eu": 2, "worker-kr": 1}


def test_a_long_wait_already_said_is_not_written_again(controller, monkeypatch):
    """A check entry keeps 1,024 characters of a longer message; read back, the cut message must
    not look changed (a hold was written again, with its Warning Event, every tick)."""
    from sovereignspec.operator.border.workloads import MESSAGE_LIMIT

    writes: list[str] = []

    def check_state(wl: dict[str, Any], check: str, state: str, message: str, *_: Any, **__: Any) -> dict:
        writes.append(message)
        return wl

    monkeypatch.setattr(controller.writer, "check_state", check_state)
    monkeypatch.setattr(controller.writer, "event", lambda *a, **k: writes.append("event"))
    why = "worker-x: jurisdiction " * 100  # a pool of many workers, each named with why it is out
    assert len(why) > MESSAGE_LIMIT
    said = {"name": CHECK, "state": "Pending", "message": f"held back: {why}"[:MESSAGE_LIMIT]}
    wl = workload("a", "team-kr", admissionChecks=[said, {"name": MK, "state": "Pending"}])
    d = controller._hold(wl, said, why)
    assert controller._write_one(d) == "unchanged" and writes == []
    other = {**said, "message": said["message"][:-1] + "?"}
    assert controller._write_one(replace(d, entry=other)) != "unchanged" and len(writes) == 2  # status, Event
