"""One tree's placement figures, as JSON on stdout: `python -P benchmarks/placement.py [--gpus N]
[--pending M]` with PYTHONPATH naming the tree to measure (this one, or an older commit's unpacked
by `make bench`).

It imports only what every tree since the benchmark's first version has (`Placer`, `tick_order`,
`load_profiles`, `benchmarks.cluster`, the scalar reference), so the same measurement runs on both
sides of a comparison. Each tree decides with its own model and its own profiles, and with the
allocator setting its processes start with (`sovereignspec.heap`, where the tree has it; not
with `--default-allocator`)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.cluster import mixed_cluster, one_off_workloads, pending_workloads
from sovereignspec.core import placement as placement_module
from sovereignspec.core.placement import Placer, tick_order
from sovereignspec.profiles import load_profiles

try:
    from benchmarks.reference import reference_tick
except ImportError:  # a tree from before the reference moved out of tests/
    from tests.reference import reference_tick  # type: ignore[no-redef]

N_GPUS = 2_000  # the sizes when neither flag is given
N_PENDING = 10_000
SINGLE_RUNS = 300
REF_SINGLE = 20
REF_TICK = 100
# The tick as the operator runs it, each decision with its record (`explain=True`: the nodes it
# excluded, and why): over the first 2,000 pending, which fill the smaller cluster's nodes.
EXPLAINED_TICK = 2_000


def measure(n_gpus: int = N_GPUS, n_pending: int = N_PENDING) -> dict[str, Any]:
    profiles = load_profiles()
    view = mixed_cluster(n_gpus)
    singles = one_off_workloads(SINGLE_RUNS)
    placer = Placer(profiles, view)
    placer.place(singles[0], commit=False)  # warm imports and per-model coefficients
    fast, fast_cpu, explained = [], [], []
    for w in singles:
        placer._scores.clear()  # from scratch every time: no cached γ tables
        t, cpu = time.perf_counter(), time.thread_time()
        placer.place(w, commit=False, explain=False)
        fast.append(time.perf_counter() - t)
        fast_cpu.append(time.thread_time() - cpu)  # without the time other processes took the core
        placer._scores.clear()
        t = time.perf_counter()
        placer.place(w, commit=False, explain=True)
        explained.append(time.perf_counter() - t)
    ref = []
    for w in singles[:REF_SINGLE]:
        t = time.perf_counter()
        reference_tick(profiles, view, [w])
        ref.append(time.perf_counter() - t)

    pending = pending_workloads(n_pending)
    t = time.perf_counter()
    decisions = Placer(profiles, view).tick(pending, explain=False)
    tick_s = time.perf_counter() - t
    t = time.perf_counter()
    Placer(profiles, view).tick(pending[:EXPLAINED_TICK], explain=True)
    tick_explained_s = time.perf_counter() - t
    first = sorted(pending, key=tick_order)[:REF_TICK]
    t = time.perf_counter()
    ref_decisions = reference_tick(profiles, view, first)
    ref_tick_s = (time.perf_counter() - t) / REF_TICK * n_pending
    same = all(
        (d.workload, d.outcome, d.node, d.gpu_index, d.gamma)
        == (r.workload, r.outcome, r.node, r.gpu_index, r.gamma)
        for d, r in zip(decisions, ref_decisions, strict=False)
    )
    return {
        "tree": str(Path(placement_module.__file__).parents[2]),
        "gpus": len(view.gpus),
        "nodes": len(view.nodes),
        "pending": n_pending,
        "single": fast,
        "single_cpu": fast_cpu,
        "single_explained": explained,
        "reference_single": ref,
        "tick_s": tick_s,
        "reference_tick_s": ref_tick_s,
        "tick_explained_s": tick_explained_s,
        "explained_pending": min(n_pending, EXPLAINED_TICK),
        "same_as_reference": same,
        "outcomes": {o: sum(d.outcome == o for d in decisions) for o in ("placed", "retry", "rejected")},
        "speculative": sum(d.gamma > 0 for d in decisions),
    }


def heap_pad(default_allocator: bool) -> bool:
    """The allocator setting the tree's own processes start with (`sovereignspec.cli.main`)."""
    if default_allocator or importlib.util.find_spec("sovereignspec.heap") is None:
        return False
    from sovereignspec.heap import keep_heap_pad

    return keep_heap_pad()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=N_GPUS)
    parser.add_argument("--pending", type=int, default=N_PENDING)
    parser.add_argument("--default-allocator", action="store_true", help="leave glibc's malloc as it is")
    args = parser.parse_args()
    padded = heap_pad(args.default_allocator)
    json.dump({**measure(args.gpus, args.pending), "heap_pad": padded}, sys.stdout)
