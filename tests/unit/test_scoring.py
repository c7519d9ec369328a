"""Every decision scored: the TPOT predicted when it was decided against what its engine reports."""

from __future__ import annotations

import math
from typing import Any

import pytest
from kubernetes import client

from sovereignspec.core.cluster import ClusterView, GpuState, WorkloadRequest
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.decision.ledger import Committed
from sovereignspec.operator.decision.scoring import ProfileScore, score
from sovereignspec.operator.decision.view import View
from sovereignspec.operator.roles.controller import Controller
from sovereignspec.operator.runtime import metrics
from sovereignspec.profiles import load_profiles

TYPES = {("h1", 0): "H100-SXM", ("h1", 1): "H100-SXM", ("h2", 0): "A100-SXM-80GB"}


def running(
    name: str, predicted: float | None, node: str = "h1", gpu: int = 0, model: str = "llama-3.1-8b", **kw: Any
) -> Committed:
    request = WorkloadRequest(f"ns/{name}", "ns", model, "eagle", 0.8)
    workload = {"metadata": {"name": name, "namespace": "ns", "uid": name}}
    return Committed(
        f"ns/{name}", "ns", name, node, gpu, 4, 1, request, 0.0, predicted, "c", workload, **kw
    )  # fmt: skip


def test_each_workloads_error_is_measured_over_predicted_minus_one_and_profiles_are_scored_apart() -> None:
    ledger = [
        running("a", 0.020),
        running("b", 0.020, gpu=1),
        running("c", 0.020, gpu=1),
        running("d", 0.050, node="h2"),
        running("e", 0.010, model="qwen-2.5-7b"),
    ]
    measured = {
        ("ns", "a"): 0.030,
        ("ns", "b"): 0.018,
        ("ns", "c"): 0.021,
        ("ns", "d"): 0.040,
        ("ns", "e"): 0.01,
    }
    scored, profiles = score(ledger, measured, TYPES)
    assert [round(s.error, 6) for s in scored] == [0.5, -0.1, 0.05, -0.2, 0.0]
    assert profiles == [
        ProfileScore("A100-SXM-80GB", "llama-3.1-8b", 1, pytest.approx(-0.2), pytest.approx(-0.2)),
        ProfileScore("H100-SXM", "llama-3.1-8b", 3, pytest.approx(0.05), pytest.approx(0.5)),
        ProfileScore("H100-SXM", "qwen-2.5-7b", 1, 0.0, 0.0),
    ]


def test_the_worst_error_keeps_its_sign() -> None:
    ledger = [running("a", 0.020), running("b", 0.020, gpu=1)]
    _, (profile,) = score(ledger, {("ns", "a"): 0.022, ("ns", "b"): 0.008}, TYPES)
    assert profile.worst_error == pytest.approx(-0.6)


@pytest.mark.parametrize(
    ("why", "predicted", "measured", "node"),
    [
        ("no prediction (decided before predictions were written)", None, 0.02, "h1"),
        ("a prediction of zero", 0.0, 0.02, "h1"),
        ("a negative prediction", -0.02, 0.02, "h1"),
        ("a prediction that is not a number", math.nan, 0.02, "h1"),
        ("no reading from its engine", 0.02, None, "h1"),
        ("a reading of zero", 0.02, 0.0, "h1"),
        ("a reading that is not a number", 0.02, math.nan, "h1"),
        ("a node no longer in the cluster", 0.02, 0.02, "gone"),
    ],
)
def test_a_workload_is_scored_only_with_a_prediction_a_reading_and_a_known_gpu(
    why: str, predicted: float | None, measured: float | None, node: str
) -> None:
    readings = {} if measured is None else {("ns", "a"): measured}
    scored, profiles = score([running("a", predicted, node=node)], readings, TYPES)
    assert scored == [] and profiles == [], why


def test_a_spread_workload_is_scored_once_by_its_first_pod() -> None:
    ledger = [running("g", 0.02, node="h1", part=0), running("g", 0.02, node="h2", part=1)]
    scored, profiles = score(ledger, {("ns", "g"): 0.03}, TYPES)
    assert len(scored) == 1 and scored[0].gpu_type == "H100-SXM" and profiles[0].workloads == 1


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def event(self, obj: dict[str, Any], kind: str, reason: str, message: str, warning: bool = False) -> None:
        assert warning
        self.posted.append((obj["metadata"]["name"], reason, message))


def _gauge(metric: Any, **labels: str) -> float | None:
    for family in metric.collect():
        for sample in family.samples:
            if sample.labels == labels:
                return float(sample.value)
    return None


def _view(*ledger: Committed) -> View:
    gpus = [GpuState(node, index, gpu_type, 1.0) for (node, index), gpu_type in TYPES.items()]
    return View(ClusterView([], gpus), list(ledger), [], None)


def test_the_controller_exports_each_profiles_error_and_tells_a_workload_beyond_its_bound_once() -> None:
    controller = Controller(client.ApiClient(client.Configuration()), load_profiles())
    events = Events()
    controller.writer = events  # type: ignore[assignment]
    policy = PolicySpec.model_validate({"telemetry": {"predictionErrorBound": 0.25}})
    view = _view(running("slow", 0.020), running("fine", 0.020, gpu=1), running("fast", 0.02, node="h2"))
    measured = {("ns", "slow"): 0.030, ("ns", "fine"): 0.021, ("ns", "fast"): 0.010}
    for _ in range(3):  # every tick scores; the Event is posted once
        controller._score(view, measured, {"c": policy}, PolicySpec())
    assert _gauge(metrics.PREDICTION_ERROR, gpu_type="H100-SXM", model="llama-3.1-8b") == pytest.approx(0.275)
    assert _gauge(metrics.PREDICTION_SCORED, gpu_type="H100-SXM", model="llama-3.1-8b") == 2
    assert _gauge(metrics.PREDICTION_ERROR, gpu_type="A100-SXM-80GB", model="llama-3.1-8b") == pytest.approx(
        -0.5
    )
    (slow, fast) = events.posted  # an engine faster than predicted is mispriced too (it was held back)
    assert slow[0] == "slow" and slow[1] == "PredictionOffProfile" and fast[0] == "fast"
    assert "30.0 ms" in slow[2] and "20.0 ms" in slow[2] and "+50%" in slow[2] and "stands" in slow[2]
    assert "-50%" in fast[2]
    # Back within the bound, then off again: told again.
    back = {("ns", "slow"): 0.021, ("ns", "fine"): 0.021, ("ns", "fast"): 0.010}
    controller._score(view, back, {"c": policy}, PolicySpec())
    controller._score(view, measured, {"c": policy}, PolicySpec())
    assert [n for n, _, _ in events.posted] == ["slow", "fast", "slow"]


def test_the_bound_is_the_policy_of_the_workloads_own_check() -> None:
    controller = Controller(client.ApiClient(client.Configuration()), load_profiles())
    events = Events()
    controller.writer = events  # type: ignore[assignment]
    loose = PolicySpec.model_validate({"telemetry": {"predictionErrorBound": 0.6}})
    view = _view(running("slow", 0.020))
    controller._score(view, {("ns", "slow"): 0.030}, {"c": loose}, PolicySpec())
    assert events.posted == []  # +50 % is within its own policy's 60 %
    controller._score(view, {("ns", "slow"): 0.030}, {}, PolicySpec())  # its check has no policy now
    assert len(events.posted) == 1  # the default's 25 %


def test_a_workload_no_longer_scored_is_cleared_from_the_gauges() -> None:
    controller = Controller(client.ApiClient(client.Configuration()), load_profiles())
    controller.writer = Events()  # type: ignore[assignment]
    controller._score(_view(running("x", 0.02, node="h2")), {("ns", "x"): 0.02}, {}, PolicySpec())
    assert _gauge(metrics.PREDICTION_SCORED, gpu_type="A100-SXM-80GB", model="llama-3.1-8b") == 1
    controller._score(_view(), {}, {}, PolicySpec())
    assert _gauge(metrics.PREDICTION_SCORED, gpu_type="A100-SXM-80GB", model="llama-3.1-8b") is None
