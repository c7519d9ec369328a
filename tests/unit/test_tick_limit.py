"""A tick places at most `--tick-limit` workloads (`view.first_placements`): the first in the core's
tick order, so that a backlog placed over several ticks gets what one tick over all of it gives."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.decision.plan import plan
from sovereignspec.operator.decision.view import View, build, first_placements
from sovereignspec.profiles import load_profiles
from tests.unit.builders import CHECK, NOW, STAMP, chat, node, policy, snapshot, world

NODES = ("h1", "h2", "h3")
IDLE = {(n, i): 0.0 for n in NODES for i in range(4)}


@functools.cache
def profiles() -> ProfileSet:
    return load_profiles()


def _backlog() -> list[dict[str, Any]]:
    """14 one-GPU workloads for 12 GPUs, listed against the tick order (throughput work and the
    least likely to gain first): cut in the order listed, the wrong two would wait."""
    out = []
    for i in range(14):
        latency = "latency" if i >= 7 else "throughput"
        out.append(
            chat(f"w{i:02d}").annotate(acceptance_rate=f"{0.5 + 0.03 * i:.2f}", latency_class=latency).obj()
        )
    return out


def _view(workloads: list[dict[str, Any]]) -> View:
    spec = policy()
    nodes = [node(n) for n in NODES]
    return build(world(workloads, nodes, spec), {CHECK}, spec, profiles(), snapshot(IDLE), NOW)


def _apply(workloads: list[dict[str, Any]], writes: list[Any]) -> None:
    """Each write's entry on its workload, as the API server (and so the next tick's ledger) holds it."""
    by_name = {wl["metadata"]["name"]: wl for wl in workloads}
    for w in writes:
        entry = by_name[w.workload["metadata"]["name"]]["status"]["admissionChecks"][0]
        entry.update(state=w.state, message=w.message)
        if w.pod_set_updates is not None:
            entry["podSetUpdates"] = w.pod_set_updates


def _outcomes(workloads: list[dict[str, Any]]) -> dict[str, tuple[str, Any]]:
    return {
        wl["metadata"]["name"]: (wl["status"]["admissionChecks"][0]["state"],
                                 wl["status"]["admissionChecks"][0].get("podSetUpdates"))
        for wl in workloads
    }  # fmt: skip


@pytest.mark.parametrize("limit", [1, 3, 5, 13])
def test_a_backlog_placed_a_few_per_tick_gets_what_one_tick_over_all_of_it_gives(limit: int) -> None:
    at_once = _backlog()
    _apply(at_once, plan("default", policy(), _view(at_once), profiles(), STAMP))
    expected = _outcomes(at_once)
    assert sorted(s for s, _ in expected.values()).count("Ready") == 12, expected

    batched, ticks = _backlog(), 0
    while True:
        view, later = first_placements(_view(batched), limit)
        assert len(view.pending) == min(limit, len(view.pending) + later)
        _apply(batched, plan("default", policy(), view, profiles(), STAMP))
        ticks += 1
        if not later:
            break
    assert ticks == -(-14 // limit)
    assert _outcomes(batched) == expected


def test_workloads_not_to_be_placed_are_all_kept_and_only_placeable_ones_count_against_the_limit() -> None:
    unreadable = chat("broken").annotate(acceptance_rate="lots").obj()
    unreadable["spec"]["podSets"][0]["count"] = "two"  # the Workload itself cannot be read
    view = _view([*_backlog(), unreadable])
    assert any(p.request is None for p in view.pending)
    cut, later = first_placements(view, 4)
    kept = {p.key for p in cut.pending}
    assert later == 10
    assert {p.key for p in view.pending if p.request is None} <= kept
    placeable = [p for p in cut.pending if p.request is not None]
    # The four latency-class workloads most likely to gain: w13, w12, w11, w10.
    assert sorted(p.workload["metadata"]["name"] for p in placeable) == ["w10", "w11", "w12", "w13"]


def test_a_backlog_within_the_limit_is_left_as_it_is() -> None:
    view = _view(_backlog())
    assert first_placements(view, 14) == (view, 0)


def test_a_ticks_laps_add_up_per_step_and_name_only_the_steps_that_took_time(monkeypatch) -> None:
    from sovereignspec.operator.roles import role

    clock = iter([10.0, 10.5, 12.0, 12.001, 13.0])
    monkeypatch.setattr(role.time, "monotonic", lambda: next(clock))
    lap = role.Laps()
    lap("view")  # 0.5
    lap("writes")  # 1.5
    lap("record")  # 0.001: too little to name
    lap("view")  # again: 0.999 more
    assert lap.spent["view"] == pytest.approx(1.499)
    assert lap.text() == "view 1.50, writes 1.50"
