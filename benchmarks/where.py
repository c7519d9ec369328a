"""Where a placement decision's time goes: `python -m benchmarks.where [--sizes 2000x10000 ...]`.

On `make bench`'s clusters and workloads (benchmarks/cluster.py, seeded) and its allocator setting
(`sovereignspec.heap`): the thread's CPU time spent in each stage of `Placer.place`, as a share of
one decision from scratch (300 workloads, no cached γ tables) and of one tick, per cluster size.
Each stage is timed by a wrapper around it, so the shares are what the profile of issue 47 item 1
asks for, not figures to compare with `make bench` (the wrappers cost a little). Stages nest: the
γ tables are part of a decision's evaluation, the float path of the updates since the last one.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from benchmarks.__main__ import SIZES  # make bench's sizes
from benchmarks.cluster import mixed_cluster, one_off_workloads, pending_workloads
from benchmarks.placement import SINGLE_RUNS as SINGLES  # make bench's single decisions
from sovereignspec.core import choosing, reasons
from sovereignspec.core.placement import Placer
from sovereignspec.heap import keep_heap_pad
from sovereignspec.profiles import load_profiles


class Stages:
    """CPU seconds and calls per stage, filled by the wrappers `timed` puts in place."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def timed(self, owner: Any, name: str, label: Callable[..., str]) -> None:
        inner = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stage = label(*args, **kwargs)
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[stage] += time.thread_time() - start
                self.calls[stage] += 1

        setattr(owner, name, wrapper)

    def lines(self, total: float) -> list[str]:
        return [
            f"  {stage:<44} {100.0 * s / total:5.1f} %  ({self.calls[stage]:,} calls)"
            for stage, s in sorted(self.seconds.items(), key=lambda item: -item[1])
        ]


def instrument(stages: Stages) -> None:
    def table(_: Any, __: Any, ___: Any, ____: Any, cautious: bool = False) -> str:
        return "γ table, the cautious recheck near the ridge" if cautious else "γ table (every γ, every GPU)"

    stages.timed(Placer, "_evaluate", lambda *_a, **_k: "evaluation: γ tables, γ* per GPU, recheck")
    stages.timed(Placer, "_table", table)
    stages.timed(Placer, "_evaluate_scalar", lambda *_a, **_k: "float path (GPUs changed since)")
    stages.timed(Placer, "candidates", lambda *_a, **_k: "candidates (sovereignty, pool, fit, room)")
    stages.timed(choosing, "choose", lambda *_a, **_k: "choosing the GPU")
    stages.timed(reasons, "record", lambda *_a, **_k: "the decision's record")
    stages.timed(Placer, "_commit", lambda *_a, **_k: "commit (the view updated)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=[f"{g}x{p}" for g, p in SIZES])
    args = parser.parse_args()
    keep_heap_pad()  # the allocator setting the operator's processes and `make bench` run with
    profiles = load_profiles()
    stages = Stages()
    instrument(stages)
    for size in args.sizes:
        n_gpus, n_pending = (int(x) for x in size.split("x"))
        view = mixed_cluster(n_gpus)
        singles = one_off_workloads(SINGLES)
        placer = Placer(profiles, view)
        placer.place(singles[0], commit=False)  # warm imports and per-model coefficients
        stages.reset()
        start = time.thread_time()
        for w in singles:
            placer._scores.clear()  # from scratch, as `make bench` measures it
            placer.place(w, commit=False, explain=False)
        total = time.thread_time() - start
        each = 1e3 * total / SINGLES
        print(f"{n_gpus:,} GPUs, one decision from scratch: {each:.2f} ms CPU (mean of {SINGLES})")
        print("\n".join(stages.lines(total)))
        pending = pending_workloads(n_pending)
        stages.reset()
        start = time.thread_time()
        Placer(profiles, view).tick(pending, explain=False)
        total = time.thread_time() - start
        print(f"{n_gpus:,} GPUs, a tick of {n_pending:,} pending: {total:.2f} s CPU")
        print("\n".join(stages.lines(total)))


if __name__ == "__main__":
    main()
