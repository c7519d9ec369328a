"""`python -m benchmarks` (or `make bench`): placement speed against the scalar reference.

Measured in one run, on one cluster of 2,000 mixed GPUs:

1. one workload placed over all 2,000 GPUs, from scratch (no cached γ tables): median and p99,
   decision only and decision plus the full decision record, beside the scalar reference;
2. one scheduling tick deciding 10,000 pending workloads (200 tenants' workload shapes) over the
   same GPUs, beside the scalar reference. The reference recomputes every GPU for every workload,
   so its cost per workload is constant; it runs the first REF_TICK workloads of the tick (checked
   decision for decision against the fast tick) and its total is scaled from that.
"""

from __future__ import annotations

import statistics
import sys
import time

from benchmarks.cluster import mixed_cluster, one_off_workloads, pending_workloads
from sovereignspec.core.placement import Placer, tick_order
from sovereignspec.profiles import load_profiles
from tests.reference import reference_tick

N_GPUS = 2_000
N_PENDING = 10_000
SINGLE_RUNS = 300
REF_SINGLE = 20
REF_TICK = 100


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    profiles = load_profiles()
    view = mixed_cluster(N_GPUS)
    print(f"cluster: {len(view.gpus)} GPUs on {len(view.nodes)} nodes; python {sys.version.split()[0]}")

    singles = one_off_workloads(SINGLE_RUNS)
    placer = Placer(profiles, view)
    placer.place(singles[0], commit=False)  # warm imports and per-model coefficients
    fast, fast_explained = [], []
    for w in singles:
        placer._scores.clear()  # from scratch every time
        t = time.perf_counter()
        placer.place(w, commit=False, explain=False)
        fast.append(time.perf_counter() - t)
        placer._scores.clear()
        t = time.perf_counter()
        placer.place(w, commit=False, explain=True)
        fast_explained.append(time.perf_counter() - t)
    ref = []
    for w in singles[:REF_SINGLE]:
        t = time.perf_counter()
        reference_tick(profiles, view, [w])
        ref.append(time.perf_counter() - t)
    med, p99 = statistics.median(fast), pct(fast, 0.99)
    print("\none workload over 2,000 GPUs (no cache)")
    print(f"  vectorised, decision            median {med * 1e3:7.3f} ms   p99 {p99 * 1e3:7.3f} ms")
    print(
        f"  vectorised, decision + record   median {statistics.median(fast_explained) * 1e3:7.3f} ms"
        f"   p99 {pct(fast_explained, 0.99) * 1e3:7.3f} ms"
    )
    print(f"  scalar reference ({REF_SINGLE} runs)     median {statistics.median(ref) * 1e3:7.1f} ms")
    print(f"  speed-up (medians)              {statistics.median(ref) / med:7.1f}x")

    pending = pending_workloads(N_PENDING)
    t = time.perf_counter()
    decisions = Placer(profiles, view).tick(pending, explain=False)
    tick_s = time.perf_counter() - t
    first = sorted(pending, key=tick_order)[:REF_TICK]
    t = time.perf_counter()
    ref_decisions = reference_tick(profiles, view, first)
    ref_s = (time.perf_counter() - t) / REF_TICK * N_PENDING
    same = all(
        (d.workload, d.outcome, d.node, d.gpu_index, d.gamma)
        == (r.workload, r.outcome, r.node, r.gpu_index, r.gamma)
        for d, r in zip(decisions, ref_decisions, strict=False)
    )
    outcomes = {o: sum(d.outcome == o for d in decisions) for o in ("placed", "retry", "rejected")}
    spec = sum(d.gamma > 0 for d in decisions)
    print(f"\none tick: {N_PENDING:,} pending workloads over 2,000 GPUs")
    print(
        f"  vectorised                      {tick_s:7.3f} s"
        f"   ({tick_s / N_PENDING * 1e6:.1f} µs per workload)"
    )
    print(f"  scalar reference (scaled from the first {REF_TICK})  {ref_s:7.1f} s")
    print(f"  speed-up                        {ref_s / tick_s:7.1f}x")
    print(f"  first {REF_TICK} decisions identical to the reference: {same}")
    print(f"  outcomes: {outcomes}; speculative: {spec}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
