"""What runs, watched after the tick's writes: aging tells a net loss once, and a failure there is
said and leaves the tick's decisions alone."""

from __future__ import annotations

import pytest
from kubernetes import client

from sovereignspec.core.cluster import ClusterView
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.world import World
from sovereignspec.operator.decision.ledger import Aging
from sovereignspec.operator.decision.view import View
from sovereignspec.operator.roles.controller import Controller
from sovereignspec.operator.roles.role import TickReport
from sovereignspec.operator.roles.watches import Watches
from sovereignspec.operator.runtime import metrics
from sovereignspec.profiles import load_profiles
from tests.unit.test_scoring import Events, running


def _aging(name: str, aggregate: float) -> Aging:
    return Aging(running(name, 0.02), 0.1, 0, 0.95, aggregate)


def test_a_speculation_turned_net_loss_is_told_once_and_again_only_after_it_recovers() -> None:
    events = Events()
    watches = Watches(lambda: events)

    def tick(*aging: Aging) -> None:
        watches.aging(View(ClusterView([], []), [], [], None, aging=list(aging)))

    tick(_aging("loses", 0.9), _aging("gains", 1.2))
    tick(_aging("loses", 0.8), _aging("gains", 1.2))
    assert [(n, r) for n, r, _ in events.posted] == [("loses", "SpeculationNetLoss")]
    assert "×0.90" in events.posted[0][2] and "not evicted" in events.posted[0][2]
    assert metrics.NET_LOSS._value.get() == 1
    tick(_aging("loses", 1.0))  # recovered (1.0 is no loss)
    tick(_aging("loses", 0.9))
    assert [n for n, _, _ in events.posted] == ["loses", "loses"]


def test_a_failure_watching_what_runs_is_reported_and_the_rest_of_the_tick_goes_on(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    controller = Controller(client.ApiClient(client.Configuration()), load_profiles())

    def broken(view: View) -> None:
        raise RuntimeError("aging broke")

    monkeypatch.setattr(controller.watches, "aging", broken)
    before = metrics.TICK_FAILURES.labels(part="watch")._value.get()
    report = TickReport()
    view = View(ClusterView([], []), [], [], None)
    world = World([], [], {})
    controller._what_runs(view, {}, PolicySpec(), {}, world, 0.0, report)
    assert report.failures == ["what runs: RuntimeError: aging broke"]
    assert metrics.TICK_FAILURES.labels(part="watch")._value.get() == pytest.approx(before + 1)
