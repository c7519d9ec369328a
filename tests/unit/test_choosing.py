"""Which admissible GPU a workload gets (`core.choosing.choose`), over hand-made per-GPU figures: the
order of its keys, packing's tolerance, and that the choice depends on ratios of times, never on the
unit they are in.

`choose` reads a handful of the Placer's arrays; a plain namespace holds them here, so each case
states exactly the figures it turns on (the Placer's own tests reach it only through the model,
where these cases are hard to pin). Written for the survivors of `hack/mutants.py
sovereignspec/core/choosing.py` (docs/mutants.md)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sovereignspec.core.choosing import choose
from sovereignspec.core.cluster import PlacerSettings, WorkloadRequest
from sovereignspec.core.optimiser import SpecRequest


def placer(headroom: list[float], home: list[bool], pack: bool = False, tolerance: float = 0.0) -> object:
    """One GPU per node; `home`: the nodes that already run work."""
    n = len(headroom)
    return SimpleNamespace(
        policy=PlacerSettings(pack=pack, pack_tolerance=tolerance),
        headroom=np.array(headroom),
        occupied=np.array(home),
        gpu_node=np.arange(n),
        slo_ratio=np.full(n, np.inf),
    )


def figures(tpot: list[float], bg_seqs: list[float], before: list[float], step: list[float]) -> dict:
    """Per GPU: the workload's TPOT there, its neighbours' sequences and their step before and after
    it joins (seconds); a plain step no longer than after."""
    return {
        "tpot": np.array(tpot),
        "bg_seqs": np.array(bg_seqs),
        "before": np.array(before),
        "step": np.array(step),
        "step_plain": np.array(step),
    }


def workload(latency_class: str) -> WorkloadRequest:
    return WorkloadRequest("w", "t", "llama-3.1-8b", "eagle3", 0.8, seqs=8, latency_class=latency_class)  # type: ignore[arg-type]


def request() -> SpecRequest:
    return SpecRequest(0.8, 8.0, 1024.0, 0.05, 0.0, 8, 0.02)


def chosen(p: object, w: WorkloadRequest, s: dict) -> int:
    return choose(p, w, request(), s, np.ones(len(s["tpot"]), np.bool_))[0]  # type: ignore[arg-type]


@pytest.mark.parametrize("unit", [1.0, 1e3, 1e6, 1e9, 1 / 3600], ids=["s", "ms", "us", "ns", "h"])
def test_the_choice_depends_on_ratios_of_times_not_on_their_unit(unit: float) -> None:
    """The same GPUs timed in seconds, milliseconds, microseconds, nanoseconds or hours: the same
    choice. A TPOT 0.4 % quicker wins over more headroom for latency work, and the larger gain wins
    for throughput work whatever its size in tokens per unit of time."""
    p = placer([0.2, 0.9], [False, False])
    ms = 1e-3 * unit
    quick = figures([10 * ms, 10.04 * ms], [0.0, 0.0], [10 * ms, 10 * ms], [10 * ms, 10 * ms])
    assert chosen(p, workload("latency"), quick) == 0
    # Throughput: GPU 1 is quicker for the workload but its 40 neighbours lose more than it gains.
    s = figures([12 * ms, 10 * ms], [0.0, 40.0], [10 * ms, 10 * ms], [10 * ms, 15 * ms])
    assert chosen(p, workload("throughput"), s) == 0


def test_packing_with_a_tolerance_prefers_home_only_within_it() -> None:
    """With `pack` and a 10 % tolerance, latency work goes where work already runs when its TPOT
    there is within 10 % of the best; at 50 % slower it goes to the quicker, empty node."""
    within = figures([1.05e-3, 1.0e-3], [4.0, 0.0], [1e-2, 8e-3], [1e-2, 1e-2])
    beyond = figures([1.5e-3, 1.0e-3], [4.0, 0.0], [1e-2, 8e-3], [1e-2, 1e-2])
    p = placer([0.5, 0.5], [True, False], pack=True, tolerance=0.1)
    assert chosen(p, workload("latency"), within) == 0
    assert chosen(p, workload("latency"), beyond) == 1


def test_packing_without_a_tolerance_lets_throughput_work_follow_its_gain() -> None:
    """Tolerance 0: home only breaks ties. Throughput work whose gain is larger on an empty node
    (its neighbours at home would lose more than the quicker TPOT there wins) goes to that node."""
    s = figures([1.0e-2, 1.1e-2], [40.0, 0.0], [1.0e-2, 8e-3], [1.5e-2, 1.1e-2])
    p = placer([0.5, 0.5], [True, False], pack=True, tolerance=0.0)
    assert chosen(p, workload("throughput"), s) == 1
    # With room in the tolerance, home wins: packing is what the tolerance buys.
    assert chosen(placer([0.5, 0.5], [True, False], pack=True, tolerance=0.2), workload("throughput"), s) == 0
