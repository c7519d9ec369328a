"""The dispatcher's choice of MultiKueue worker clusters: sovereignty first, then the model."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sovereignspec.core.cluster import PlacerSettings, WorkloadRequest
from sovereignspec.core.dispatch import (
    Dispatch,
    Dispatcher,
    Worker,
    WorkerGpu,
    admissible_nomination,
    check_worker,
    dispatch_order,
)
from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.border.worker_clusters import connected, describe_worker
from sovereignspec.profiles import load_profiles

PROFILES = load_profiles()
LABEL = PlacerSettings().jurisdiction_label


def gpus(headroom: float | None, n: int = 4, nodes: int = 1) -> tuple[WorkerGpu, ...]:
    return tuple(WorkerGpu(f"node-{k}", i, headroom) for k in range(nodes) for i in range(n))


def dispatch_all(
    profiles: ProfileSet, workers: list[Worker], requests: list[WorkloadRequest], nominate: int = 1
) -> list[Dispatch]:
    """Every request as one tick, in the order the operator's dispatcher takes them
    (`dispatch_order`: latency-sensitive first), returned in the requests' order."""
    d = Dispatcher(profiles, workers)
    order = sorted(range(len(requests)), key=lambda i: (dispatch_order(requests[i]), i))
    out = {i: d.dispatch(requests[i], nominate) for i in order}
    return [out[i] for i in range(len(requests))]


def worker(name: str, jurisdiction: str | None, headroom: float | None = 1.0, **kw: object) -> Worker:
    return Worker(name, jurisdiction, gpu_type="H100-SXM", gpus=gpus(headroom), **kw)  # type: ignore[arg-type]


def request(name: str = "ns/job", **kw: object) -> WorkloadRequest:
    base = WorkloadRequest(name, "team-a", "llama-3.1-8b", "eagle3", 0.8, seqs=8)
    return replace(base, **kw)  # type: ignore[arg-type]


# (case, workers, request fields, outcome, nominated)
CASES = [
    ("a kr workload goes only to the kr worker even when eu is idle and kr saturated",
     [worker("eu", "eu", 1.0), worker("kr", "kr", 0.0)], {"jurisdiction": "kr"}, "nominate", ("kr",)),
    ("a namespace allowed only eu never reaches kr",
     [worker("eu", "eu", 0.0), worker("kr", "kr", 1.0)], {"allowed_jurisdictions": frozenset({"eu"})},
     "nominate", ("eu",)),
    ("a worker with no jurisdiction label takes no jurisdiction-bound work",
     [worker("anywhere", None)], {"jurisdiction": "kr"}, "reject", ()),
    ("a worker dedicated to another tenant is never chosen",
     [Worker("theirs", "kr", dedicated_tenant="team-b", gpu_type="H100-SXM", gpus=gpus(1.0))],
     {}, "reject", ()),
    ("a tenant's own dedicated worker takes its work",
     [Worker("ours", "kr", dedicated_tenant="team-a", gpu_type="H100-SXM", gpus=gpus(1.0))], {}, "nominate",
     ("ours",)),
    ("the only admissible worker disconnected: wait, never another jurisdiction",
     [worker("eu", "eu"), worker("kr", "kr", connected=False, not_connected_reason="ClientConnectionFailed")],
     {"jurisdiction": "kr"}, "wait", ()),
    ("a worker without telemetry is still chosen when it is the only admissible one",
     [worker("eu", "eu"), Worker("kr", "kr", gpu_type="H100-SXM", telemetry_error="connection refused")],
     {"jurisdiction": "kr"}, "nominate", ("kr",)),
    ("a worker whose labels cannot be read is excluded, and the workload waits for the fix",
     [Worker("kr", None, problem="label sovereignspec.io/jurisdiction='KR!' is not a jurisdiction code")],
     {"jurisdiction": "kr"}, "wait", ()),
    ("no worker configured yet: wait",
     [], {}, "wait", ()),
    ("a worker whose GPU type has no profile is excluded until an administrator fixes it: wait",
     [Worker("kr", "kr", gpu_type="Z9000", gpus=gpus(1.0))], {"jurisdiction": "kr"}, "wait", ()),
    ("a model that fits no GPU of the only admissible worker can never run: reject",
     [worker("kr", "kr")], {"jurisdiction": "kr", "model": "llama-3.3-70b", "gpus": 64}, "reject", ()),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "workers", "fields", "outcome", "nominated"), CASES, ids=[c[0] for c in CASES]
)
def test_dispatch_table(
    case: str, workers: list[Worker], fields: dict[str, object], outcome: str, nominated: tuple[str, ...]
) -> None:
    d = Dispatcher(PROFILES, workers).dispatch(request(**fields))
    assert (d.outcome, d.nominated) == (outcome, nominated), d.summary()
    assert d.summary()  # every outcome says why


def test_latency_sensitive_high_alpha_work_goes_to_the_worker_with_headroom() -> None:
    workers = [worker("busy", None, 0.02), worker("idle", None, 1.0)]
    d = Dispatcher(PROFILES, workers).dispatch(request(alpha=0.9, latency_class="latency"))
    assert d.nominated == ("idle",)
    assert d.ranking[0].tpot_ms is not None and d.ranking[1].tpot_ms is not None
    assert d.ranking[0].tpot_ms < d.ranking[1].tpot_ms
    assert "speculative" in d.ranking[0].note  # idle headroom: it speculates there


def test_a_worker_without_telemetry_is_ranked_after_every_worker_with_it() -> None:
    workers = [
        Worker("blind", None, gpu_type="H100-SXM", telemetry_error="timeout"),
        worker("seen", None, 0.1),
    ]
    d = Dispatcher(PROFILES, workers).dispatch(request())
    assert [r.worker for r in d.ranking] == ["seen", "blind"]
    assert "no telemetry" in d.ranking[1].note


def test_nominating_more_than_one_takes_the_best_first() -> None:
    workers = [worker("a", None, 0.1), worker("b", None, 1.0), worker("c", None, 0.5)]
    d = Dispatcher(PROFILES, workers).dispatch(request(), nominate=2)
    assert d.nominated == ("b", "c")


def test_a_tick_spreads_work_as_it_fills_the_best_worker() -> None:
    """What a tick nominates loads that worker's GPUs for the rest of the tick."""
    workers = [worker("a", None, 1.0), worker("b", None, 1.0)]
    out = dispatch_all(PROFILES, workers, [request(f"ns/j{i}", seqs=64) for i in range(8)])
    chosen = [d.nominated[0] for d in out]
    assert set(chosen) == {"a", "b"}, chosen


def test_latency_work_is_dispatched_before_throughput_work_in_a_tick() -> None:
    """The latency-sensitive request gets the one idle GPU although it came second."""
    workers = [Worker("idle", None, gpu_type="H100-SXM", gpus=gpus(1.0, n=1)), worker("busy", None, 0.05)]
    reqs = [request("ns/batch", latency_class="throughput", seqs=128), request("ns/chat", alpha=0.9)]
    out = dispatch_all(PROFILES, workers, reqs)
    assert out[1].nominated == ("idle",)


def test_a_nomination_across_a_boundary_is_not_stood_behind() -> None:
    workers = {"eu": worker("eu", "eu"), "kr": worker("kr", "kr", connected=False)}
    req = request(jurisdiction="kr")
    assert admissible_nomination(req, ["kr"], workers, LABEL) is None  # disconnected is no boundary
    assert "jurisdiction" in (admissible_nomination(req, ["eu"], workers, LABEL) or "")
    assert "not a MultiKueueCluster" in (admissible_nomination(req, ["jp"], workers, LABEL) or "")


JURISDICTIONS = st.sampled_from([None, "eu", "kr", "jp"])


@st.composite
def fleets(draw: st.DrawFn) -> list[Worker]:
    n = draw(st.integers(0, 5))
    out = []
    for i in range(n):
        out.append(
            Worker(
                f"w{i}",
                draw(JURISDICTIONS),
                dedicated_tenant=draw(st.sampled_from([None, None, "team-a", "team-b"])),
                connected=draw(st.booleans()),
                gpu_type="H100-SXM",
                gpus=gpus(draw(st.sampled_from([None, 0.0, 0.3, 1.0])), n=2),
                telemetry_error=draw(st.sampled_from([None, None, "down"])),
            )
        )
    return out


@settings(max_examples=150, deadline=None)
@given(
    workers=fleets(),
    jurisdiction=JURISDICTIONS,
    allowed=st.sampled_from([None, frozenset({"eu"}), frozenset({"kr", "jp"})]),
    tenant=st.sampled_from(["team-a", "team-b", "team-c"]),
)
def test_nothing_is_ever_nominated_across_a_boundary(
    workers: list[Worker], jurisdiction: str | None, allowed: frozenset[str] | None, tenant: str
) -> None:
    req = request(jurisdiction=jurisdiction, allowed_jurisdictions=allowed, tenant=tenant)
    d = Dispatcher(PROFILES, workers).dispatch(req, nominate=3)
    by_name = {w.name: w for w in workers}
    for name in d.nominated:
        w = by_name[name]
        assert check_worker(req, w, LABEL) is None
        assert jurisdiction is None or w.jurisdiction == jurisdiction
        assert allowed is None or w.jurisdiction in allowed
        assert w.dedicated_tenant in (None, tenant)
        assert w.connected
    if d.outcome == "reject":  # only when no worker could ever take it
        assert all(check_worker(req, replace(w, connected=True), LABEL) is not None for w in workers)


def test_a_worker_description_with_a_bad_label_names_the_field_and_what_is_accepted() -> None:
    obj = {"metadata": {"name": "kr-1", "labels": {"sovereignspec.io/jurisdiction": "Korea!"}}}
    _, problem = describe_worker(obj)
    assert problem is not None
    assert (
        "sovereignspec.io/jurisdiction" in problem and "Korea!" in problem and "jurisdiction code" in problem
    )
    good = {
        "metadata": {
            "name": "kr-1",
            "labels": {"sovereignspec.io/jurisdiction": "kr"},
            "annotations": {"sovereignspec.io/prometheus-url": "http://127.0.0.1:9090"},
        }
    }
    desc, problem = describe_worker(good)
    assert problem is None and desc.jurisdiction == "kr" and desc.prometheus_url == "http://127.0.0.1:9090"


def test_a_worker_is_connected_only_when_multikueue_says_active() -> None:
    assert connected({"status": {"conditions": [{"type": "Active", "status": "True"}]}})[0]
    up, why = connected({"status": {"conditions": [{"type": "Active", "status": "False", "reason": "X"}]}})
    assert not up and "X" in why
    assert not connected({})[0]


def test_work_already_dispatched_to_a_worker_counts_against_it() -> None:
    """Telemetry shows a workload only once its engine runs: the dispatcher's own ledger of what
    it sent (and Kueue admitted) there fills a worker before the readings do."""
    full = replace(worker("a", None, 1.0), committed_gpus=4)
    d = Dispatcher(PROFILES, [full, worker("b", None, 1.0)]).dispatch(request())
    assert d.nominated == ("b",)
    assert "busy now" in d.ranking[1].note
    half = replace(worker("a", None, 1.0), committed_gpus=2)
    d = Dispatcher(PROFILES, [half, worker("b", None, 1.0)]).dispatch(request())
    assert d.nominated == ("b",)  # equal readings: the worker with more GPUs not yet given away
    alone = Dispatcher(PROFILES, [full]).dispatch(request())
    assert alone.nominated == ("a",)  # busy is no boundary: the only admissible worker still gets it
