"""Online calibration: the model learns each GPU type from the plain engines that run on it.

The world's physics here is a GpuSpec the shipped profile is not (its coefficients moved); the
readings are its step times with 2 % seeded noise. The learner must find it where the readings pin
it, and keep the shipped profile (its margin widened by the observed error) where they do not."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from sovereignspec.core import learning
from sovereignspec.core.budget import spec_request
from sovereignspec.core.cluster import ClusterView, GpuState, NodeState, PlacerSettings, WorkloadRequest
from sovereignspec.core.learning import MAX_EXTRA_MARGIN, Point, choose, learn, windowed, with_learning
from sovereignspec.core.placement import Placer
from sovereignspec.core.roofline import roofline_for, tensor_parallel_for
from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.decision.learning import Learner, readings, resource_name
from sovereignspec.operator.decision.ledger import Committed
from sovereignspec.profiles import load_profiles
from sovereignspec.telemetry.prometheus import PrometheusReader

PROFILES = load_profiles()
GPU, MODEL = PROFILES.gpus["H100-SXM"], PROFILES.models["llama-3.1-8b"]
TP = tensor_parallel_for(GPU, MODEL)
KEY = ("H100-SXM", "llama-3.1-8b")
WIDE = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768)
# A GPU slower than its profile in both bandwidth and compute: its ridge at ~45 sequences, which
# plain traffic up to batch 768 crosses (the shipped H100's is never reached).
COMPUTE_BOUND = replace(GPU, bandwidth_efficiency=GPU.bandwidth_efficiency * 0.7, compute_efficiency=0.08,
                        step_overhead_s=GPU.step_overhead_s * 1.5)  # fmt: skip
SLOW_MEMORY = replace(GPU, bandwidth_efficiency=GPU.bandwidth_efficiency * 0.7)


def world(true: Any, batches: tuple[int, ...], seed: int = 1, at: float = 0.0) -> list[Point]:
    roof = roofline_for(true, MODEL, TP)
    rng = np.random.default_rng(seed)
    return [
        Point(b, c, float(roof.step_time(b, b, c)) * (1 + 0.02 * rng.standard_normal()), at + i)
        for i, b in enumerate(batches)
        for c in (1024, 4096)
    ]


@pytest.fixture(scope="module")
def compute_bound() -> learning.Learned:
    return learn(GPU, MODEL, TP, world(COMPUTE_BOUND, WIDE))


@pytest.fixture(scope="module")
def low_batches() -> learning.Learned:
    return learn(GPU, MODEL, TP, world(SLOW_MEMORY, (1, 2, 3, 4, 6, 8, 12, 16)))


def test_readings_past_the_ridge_identify_the_gpu_and_the_learned_profile_prices_it(compute_bound) -> None:
    assert compute_bound.identified, compute_bound.why
    assert compute_bound.held_out_rms < 0.05 and compute_bound.shipped_rms > 0.3
    f = choose(GPU, compute_bound)
    assert f.learned and f.extra_margin == 0.0
    assert f.gpu.compute_efficiency == pytest.approx(0.08, rel=0.1)
    assert f.gpu.bandwidth_efficiency == pytest.approx(COMPUTE_BOUND.bandwidth_efficiency, rel=0.1)
    assert "learned profile" in f.why and "held-out error" in f.why


def test_readings_below_the_ridge_leave_compute_open_the_shipped_profile_stays_its_margin_widened(
    low_batches,
) -> None:
    assert not low_batches.identified and "compute_efficiency" in low_batches.why
    f = choose(GPU, low_batches)
    assert not f.learned and f.gpu is GPU
    # The shipped profile is ~30 % off on these readings: the margin grows by about that much.
    assert f.extra_margin == pytest.approx(low_batches.shipped_rms_all)
    assert 0.2 < f.extra_margin <= MAX_EXTRA_MARGIN
    assert "margin widened" in f.why


def test_an_identified_fit_no_better_than_the_shipped_profile_is_not_used() -> None:
    learned = learn(COMPUTE_BOUND, MODEL, TP, world(COMPUTE_BOUND, WIDE))  # the profile is right
    assert learned.identified and not learned.beats_shipped
    f = choose(COMPUTE_BOUND, learned)
    assert not f.learned and f.extra_margin < 0.05 and "no better" in f.why


@pytest.mark.parametrize(("use", "learned_in_force"), [("auto", True), ("shipped", False), ("learned", True)])
def test_an_administrators_pin_decides_which_profile_prices(compute_bound, use, learned_in_force) -> None:
    assert choose(GPU, compute_bound, use).learned is learned_in_force


def test_a_pin_to_learned_with_nothing_fitted_prices_with_the_shipped_profile(low_batches) -> None:
    few = learn(GPU, MODEL, TP, world(SLOW_MEMORY, (1, 2)))
    assert few.fitted is None and "needed to fit" in few.why
    f = choose(GPU, few, "learned")
    assert not f.learned and f.gpu is GPU and f.extra_margin == 0.0


@pytest.mark.parametrize(
    "bad",
    [
        Point(math.nan, 1024, 0.01, 5.0),
        Point(0.5, 1024, 0.01, 5.0),
        Point(4, 1024, -0.01, 5.0),
        Point(4, 0, 0.01, 5.0),
        Point(4, 1024, math.inf, 5.0),
        Point(4, 1024, 0.01, 50.0),  # read in the future
    ],
)
def test_a_reading_that_is_no_step_is_refused_and_counted(bad) -> None:
    kept, refused = windowed((), [bad, Point(4, 1024, 0.01, 5.0)], now=10.0, window_s=100.0)
    assert refused == 1 and [p.batch for p in kept] == [4]


def test_the_window_drops_old_readings_and_keeps_the_newest_up_to_its_limit() -> None:
    old = [Point(1, 1024, 0.01, t) for t in (0.0, 50.0, 90.0)]
    kept, _ = windowed(old, [Point(2, 1024, 0.01, 95.0), Point(3, 1024, 0.01, 99.0)], 100.0, 20.0, limit=2)
    assert [p.at for p in kept] == [95.0, 99.0]


def test_decisions_price_a_model_with_its_learned_gpu_and_widen_the_margin_of_that_gpu_type_only() -> None:
    learned_gpu = replace(GPU, compute_efficiency=0.1)
    in_force = {
        KEY: learning.InForce(learned_gpu, True, 0.0, "learned"),
        ("A100-80G-SXM", "llama-3.1-8b"): learning.InForce(PROFILES.gpus["A100-80G-SXM"], False, 0.2, "x"),
        ("H100-SXM", "llama-3.3-70b"): learning.InForce(GPU, False, 0.1, "y"),
    }
    profiles = with_learning(PROFILES, in_force)
    assert profiles.gpu_for(*KEY) is learned_gpu
    assert profiles.gpu_for("H100-SXM", "llama-2-7b-32k") is GPU  # another model: the shipped GPU
    assert profiles.margin_for("A100-80G-SXM", "llama-3.1-8b") == 0.2
    assert profiles.margin_for(*KEY) == 0.0 and profiles.margin_for("H100-SXM", "llama-3.3-70b") == 0.1
    # The request itself carries the policy's margin; each GPU type's is added where it is judged.
    w = WorkloadRequest("ns/a", "ns", "llama-3.1-8b", "eagle3", 0.8)
    assert spec_request(profiles, PlacerSettings(margin=0.05), w)[0].margin == pytest.approx(0.05)


def two_gpu_types() -> ClusterView:
    nodes = [NodeState("h", {"j": "eu"}, 1), NodeState("a", {"j": "eu"}, 1)]
    return ClusterView(nodes, [GpuState("h", 0, "H100-SXM", 1.0), GpuState("a", 0, "A100-80G-SXM", 1.0)])


@pytest.mark.parametrize(("extra_on", "speculates_on"), [(None, {"h", "a"}), ("A100-80G-SXM", {"h"}),
                                                       ("H100-SXM", {"a"})])  # fmt: skip
def test_an_observed_error_widens_the_margin_on_its_gpu_type_and_nowhere_else(
    extra_on, speculates_on
) -> None:
    """A workload whose speculation pays ~1.4x on an idle GPU: plain on the GPU type whose profile
    is observed 50 % off, speculative on the other, both judged in one signature's table."""
    extra = {} if extra_on is None else {(extra_on, "llama-3.1-8b"): MAX_EXTRA_MARGIN}
    profiles = replace(PROFILES, extra_margin=extra)
    w = WorkloadRequest("ns/a", "ns", "llama-3.1-8b", "eagle3", 0.45)
    placer = Placer(profiles, two_gpu_types(), PlacerSettings(jurisdiction_label="j"))
    gammas = {}
    for node in ("h", "a"):
        p = placer.place(replace(w, name=f"ns/{node}", node_pool=frozenset({node})))
        gammas[p.node] = p.gamma
    assert {n for n, g in gammas.items() if g > 0} == speculates_on, gammas


# -- the operator's shell ---------------------------------------------------------------------


def running(name: str, mode: str = "plain", stages: int = 1, gpu: int = 0) -> Committed:
    request = WorkloadRequest(f"ns/{name}", "ns", "llama-3.1-8b", "eagle3", 0.8, context=2048, stages=stages)
    entry = {"podSetUpdates": [{"name": "main", "annotations": {ann.OUT_MODE: mode}}]}
    return Committed(f"ns/{name}", "ns", name, "h1", gpu, 0, 1, request, 0.0, None, "c", {}, entry)


def test_only_plain_whole_model_engines_with_a_reported_step_are_readings() -> None:
    ledger = [running("a"), running("a"), running("spec", "speculative"), running("staged", stages=2),
              running("silent"), running("nowhere", gpu=7)]  # fmt: skip
    steps = {("ns", n): (8.0, 0.012) for n in ("a", "spec", "staged", "nowhere")}
    got = readings(ledger, {("h1", 0): "H100-SXM"}, steps, now=100.0)
    assert got == {KEY: [Point(8.0, 2048.0, 0.012, 100.0, "ns/a")]}


def resource(spec: dict[str, Any], status: dict[str, Any] | None = None, name: str = "") -> dict[str, Any]:
    return {"metadata": {"name": name or resource_name(KEY)}, "spec": spec, "status": status or {}}


SPEC = {"gpuType": "H100-SXM", "model": "llama-3.1-8b"}


def test_the_learner_creates_its_resource_refits_once_per_interval_and_follows_a_pin() -> None:
    learner = Learner(PROFILES, refit_s=60.0)
    points = world(COMPUTE_BOUND, WIDE, at=0.0)
    writes, messages = learner.step([], {KEY: points}, now=100.0)
    assert [(w.name, w.create) for w in writes] == [("h100-sxm.llama-3.1-8b", True)] and not messages
    assert writes[0].status["identified"] and writes[0].status["inForce"] == "learned"
    assert learner.profiles().gpu_for(*KEY).compute_efficiency == pytest.approx(0.08, rel=0.1)
    mine = resource(SPEC, writes[0].status)
    assert learner.step([mine], {}, now=110.0) == ([], [])  # not due, nothing changed
    writes, _ = learner.step([resource({**SPEC, "use": "shipped"}, writes[0].status)], {}, now=120.0)
    assert not writes[0].create and writes[0].status["inForce"] == "shipped"
    assert learner.profiles().gpu_for(*KEY) is GPU


def test_a_deleted_resource_starts_the_learning_over_and_a_restart_restores_its_points() -> None:
    learner = Learner(PROFILES)
    (write,), _ = learner.step([], {KEY: world(COMPUTE_BOUND, WIDE)}, now=100.0)
    learner.step([resource(SPEC, write.status)], {}, now=101.0)  # seen in the cache
    learner.step([], {}, now=102.0)  # and deleted
    assert KEY not in learner.points and learner.profiles().gpu_for(*KEY) is GPU
    restarted = Learner(PROFILES)
    (again,), messages = restarted.step([resource(SPEC, write.status)], {}, now=200.0)
    assert again.status["pointCount"] == write.status["pointCount"] and not messages
    assert again.status["inForce"] == "learned"


def test_a_resource_edited_into_nonsense_steers_nothing_and_is_named() -> None:
    learner = Learner(PROFILES)
    bad = resource({**SPEC, "use": "sometimes"})
    writes, messages = learner.step([bad], {KEY: world(COMPUTE_BOUND, WIDE)}, now=100.0)
    assert len(messages) == 1 and "use" in messages[0] and "sometimes" in messages[0]
    assert writes[0].status["inForce"] == "learned"  # auto, as if it had no spec
    assert learner.step([bad], {}, now=101.0)[1] == []  # told once while it lasts
    points = [[4, 1024, 12.0, 150.0], ["x", 1, 2, 3], [4, 1024, -1.0, 150.0], "nonsense"]
    fresh = Learner(PROFILES)
    (write,), messages = fresh.step([resource(SPEC, {"points": points})], {}, now=200.0)
    assert write.status["pointCount"] == 1 and messages == [
        f"LearnedProfile {resource_name(KEY)}: 3 of its status points refused"
    ]


def test_a_resource_whose_name_is_not_its_spec_is_ignored() -> None:
    learner = Learner(PROFILES)
    _, messages = learner.step([resource(SPEC, name="other")], {}, now=100.0)
    assert messages and "other" in messages[0]


def test_a_fit_in_the_background_is_taken_by_a_later_step_and_never_holds_one_up() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        learner = Learner(PROFILES, executor=pool)
        (first,), _ = learner.step([], {KEY: world(COMPUTE_BOUND, WIDE)}, now=100.0)
        # Written at once (the resource and its points), priced by the shipped profile meanwhile.
        assert first.create and first.status["inForce"] == "shipped" and first.status["pointCount"] == 24
        learner.running[KEY].result(timeout=60)
        (taken,), _ = learner.step([resource(SPEC, first.status)], {}, now=101.0)
        assert taken.status["inForce"] == "learned" and not learner.running
        assert learner.profiles().gpu_for(*KEY).compute_efficiency == pytest.approx(0.08, rel=0.1)


def test_a_fit_finished_after_its_resource_was_deleted_is_dropped() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        learner = Learner(PROFILES, executor=pool)
        (first,), _ = learner.step([], {KEY: world(COMPUTE_BOUND, WIDE)}, now=100.0)
        learner.step([resource(SPEC, first.status)], {}, now=100.5)  # seen in the cache
        future = learner.running.get(KEY)
        learner.step([], {}, now=101.0)  # deleted: start over
        if future is not None:
            future.result(timeout=60)
        assert learner.step([], {}, now=102.0) == ([], []) and KEY not in learner.learned


def test_the_scored_prediction_error_of_a_profile_is_written_into_its_status() -> None:
    learner = Learner(PROFILES)
    learner.scores = {KEY: (0.31, 3)}
    (write,), _ = learner.step([], {KEY: world(SLOW_MEMORY, (1, 2))}, now=100.0)
    assert write.status["predictionError"] == {"median": 0.31, "workloads": 3}


# -- what the reader makes of the engines' series (stand-in query; the real Prometheus path is
# tests/cluster/test_learning.py and tests/engine/test_real_vllm.py) ---------------------------


class Series(PrometheusReader):
    """Rows per kind of query: the step's rate ratio, and the busy batch's average."""

    def __init__(
        self, steps: list[tuple[dict[str, str], float]], running: list[tuple[dict[str, str], float]]
    ):
        super().__init__("http://unused.invalid")
        self.step_rows, self.running_rows = steps, running

    def query(self, promql: str, at: float | None = None) -> list[tuple[dict[str, str], float, float]]:
        if "inter_token_latency_seconds_sum" in promql and "by (namespace, job_name)" in promql:
            return [(labels, v, 0.0) for labels, v in self.step_rows]
        if promql.startswith("avg_over_time((vllm:num_requests_running > 0)["):
            return [(labels, v, 0.0) for labels, v in self.running_rows]
        return []


JOB = {"namespace": "ns", "job_name": "a"}


@pytest.mark.parametrize(
    ("steps", "running", "expected"),
    [
        ([(JOB, 0.012)], [(JOB, 8.0)], {("ns", "a"): (8.0, 0.012)}),
        ([(JOB, math.nan)], [(JOB, 8.0)], {}),  # a step that is no number
        ([(JOB, -0.01)], [(JOB, 8.0)], {}),  # nor a negative one
        ([(JOB, 0.012)], [(JOB, math.inf)], {}),  # a batch that is no number
        ([(JOB, 0.012)], [(JOB, 0.4)], {}),  # never a whole request running
        ([(JOB, 0.012)], [(JOB, 8.0), ({**JOB, "pod": "b"}, 9.0)], {}),  # two engines, one workload
        ([({"namespace": "ns", "job_name": ""}, 0.012)], [(JOB, 8.0)], {}),  # no owner
    ],
)
def test_the_reader_takes_a_step_only_from_one_engine_that_reports_a_sane_batch_and_step(
    steps, running, expected
):
    reader = Series(steps, running)
    assert reader.steps() == expected
    if len(running) > 1:
        assert reader.rejected == {"several engines for one workload": 2}


def test_readings_that_come_between_refits_are_kept_for_the_next_one() -> None:
    learner = Learner(PROFILES, refit_s=60.0)
    first = world(SLOW_MEMORY, (1, 2, 4), at=0.0)
    (write,), _ = learner.step([], {KEY: first}, now=10.0)
    assert write.status["pointCount"] == 6
    assert learner.step(
        [resource(SPEC, write.status)], {KEY: world(SLOW_MEMORY, (8, 16), at=20.0)}, now=30.0
    ) == (
        [],
        [],
    )  # not due: kept, not refitted
    (again,), _ = learner.step([resource(SPEC, write.status)], {}, now=75.0)
    assert again.status["pointCount"] == 10


def test_a_learned_profile_prices_nothing_until_its_learnedprofile_is_written() -> None:
    """An administrator can pin or freeze only what is on record: a write refused (RBAC, the API
    server down) leaves the shipped profile in force, and the next tick writes and uses it."""
    from kubernetes import client

    from sovereignspec.core.cluster import ClusterView, GpuState
    from sovereignspec.operator.border.policy import PolicySpec
    from sovereignspec.operator.decision.view import View
    from sovereignspec.operator.roles.controller import Controller

    class Writer:
        def __init__(self) -> None:
            self.refuse, self.written = True, []

        def learned_profile(self, name: str, *_args: Any) -> None:
            if self.refuse:
                raise client.ApiException(status=403, reason="forbidden")
            self.written.append(name)

    controller = Controller(client.ApiClient(client.Configuration()), PROFILES)
    controller.learner.executor = None  # fit in the tick: no thread to wait for
    controller.telemetry.steps = lambda _spec: {}  # type: ignore[method-assign]
    writer = Writer()
    controller.writer = writer  # type: ignore[assignment]
    controller.learner.points[KEY] = tuple(world(COMPUTE_BOUND, WIDE))
    view = View(ClusterView([], [GpuState("h1", 0, "H100-SXM", 1.0)]), [], [], None)
    controller._learn(view, PolicySpec(), now=100.0)
    assert controller.learner.profiles().gpu_for(*KEY) is GPU and not writer.written
    writer.refuse = False
    controller._learn(view, PolicySpec(), now=101.0)
    assert writer.written == [resource_name(KEY)]
    assert controller.learner.profiles().gpu_for(*KEY).compute_efficiency == pytest.approx(0.08, rel=0.1)
