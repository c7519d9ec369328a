"""`python -m benchmarks` (or `make bench`): placement speed against the scalar reference and
against an older tree, measured side by side in one run.

On two clusters of mixed GPUs (benchmarks/cluster.py, seeded): 2,000 GPUs (250 nodes) with a tick
of 10,000 pending workloads, and 10,000 GPUs (1,250 nodes) with a tick of 20,000 (`--sizes`):

1. one workload placed over all the GPUs, from scratch (no cached γ tables): median and p99,
   decision only and decision plus the full decision record, beside the scalar reference;
2. one scheduling tick deciding the pending workloads (200 tenants' workload shapes) over the
   same GPUs, beside the scalar reference. The reference recomputes every GPU for every workload,
   so its cost per workload is constant; it runs the first 100 workloads of the tick (checked
   decision for decision against the fast tick) and its total is scaled from that;
3. the tick as the operator runs it, each decision with its record (the nodes it excluded and
   why), over the first 2,000 pending workloads: where nodes fill up, naming the excluded ones
   is most of a decision's cost.

Each tree is measured by benchmarks/placement.py in a fresh interpreter, the trees alternating
round by round so that a machine's drift falls on both: the older tree (`--base`, default BASE:
the code issue 31 measured; unpacked from git into build/bench-base/; `--base none`: left out),
this tree as its processes run (with `sovereignspec.heap`'s allocator setting), and this tree on
the default allocator, which shows what the code and what the setting each bring. Times are
wall-clock, and for single decisions also the thread's CPU time (what is left when other processes
take the core: on a shared machine the wall-clock p99 is theirs); compare the columns of one run,
not runs.

    make bench
    make bench ARGS="--base 2ed12d4 --rounds 3"
    make bench ARGS="--sizes 2000x10000"      # the smaller cluster alone
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PROBE = REPO / "benchmarks" / "placement.py"
BASE = "ac55e90"  # main when issue 31 was filed: 2.17 ms median, 3.13 ms p99, 14x the reference
SIZES = ((2_000, 10_000), (10_000, 20_000))  # (GPUs, pending workloads in the tick)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def unpack(rev: str) -> Path:
    """The tree at `rev`, unpacked once into build/bench-base/<commit>."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    dest = REPO / "build" / "bench-base" / commit
    if not (dest / ".unpacked").exists():
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", commit], capture_output=True, check=True
        ).stdout
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(dest, filter="data")
        (dest / ".unpacked").touch()
    return dest


def probe(tree: Path, *flags: str) -> dict[str, Any]:
    # -P: nothing before PYTHONPATH on sys.path, so the tree's own package is the one imported.
    done = subprocess.run(
        [sys.executable, "-P", str(PROBE), *flags],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"measuring {tree} failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout))


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    single = [s for r in runs for s in r["single"]]
    cpu = [s for r in runs for s in r.get("single_cpu", r["single"])]
    explained = [s for r in runs for s in r["single_explained"]]
    ref = [s for r in runs for s in r["reference_single"]]
    return {
        "median": statistics.median(single),
        "p99": pct(single, 0.99),
        "cpu_median": statistics.median(cpu),
        "cpu_p99": pct(cpu, 0.99),
        "explained_median": statistics.median(explained),
        "explained_p99": pct(explained, 0.99),
        "reference": statistics.median(ref),
        "speedup": statistics.median(ref) / statistics.median(single),
        "tick": statistics.median(r["tick_s"] for r in runs),
        "reference_tick": statistics.median(r["reference_tick_s"] for r in runs),
        "tick_explained": statistics.median(r["tick_explained_s"] for r in runs),
        "explained_pending": runs[-1]["explained_pending"],
        "same": all(r["same_as_reference"] for r in runs),
        "outcomes": runs[-1]["outcomes"],
        "speculative": runs[-1]["speculative"],
        "shape": f"{runs[-1]['gpus']} GPUs on {runs[-1]['nodes']} nodes",
        "pooled": len(single),
    }


def size(text: str) -> tuple[int, int]:
    gpus, _, pending = text.partition("x")
    try:
        return int(gpus), int(pending)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected GPUSxPENDING, e.g. 10000x20000") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BASE, help="the older tree's commit (default %(default)s), or none")
    parser.add_argument("--rounds", type=int, default=2, help="measurements per tree, alternating")
    parser.add_argument(
        "--sizes", type=lambda t: [size(x) for x in t.split(",")], default=list(SIZES),
        help="clusters as GPUSxPENDING, comma-separated (default 2000x10000,10000x20000)",
    )  # fmt: skip
    args = parser.parse_args()
    trees: dict[str, tuple[Path, tuple[str, ...]]] = {
        "this tree": (REPO, ()),
        "default malloc": (REPO, ("--default-allocator",)),
    }
    if args.base != "none":
        trees = {f"{args.base} (base)": (unpack(args.base), ()), **trees}
    runs: dict[tuple[int, int], dict[str, list[dict[str, Any]]]] = {
        shape: {name: [] for name in trees} for shape in args.sizes
    }
    for _ in range(args.rounds):
        for (gpus, pending), per_tree in runs.items():
            for name, (tree, flags) in trees.items():
                per_tree[name].append(probe(tree, *flags, "--gpus", str(gpus), "--pending", str(pending)))
    print(f"python {sys.version.split()[0]}; {args.rounds} rounds per column, alternating")
    same = [
        report(shape, {name: pooled(r) for name, r in per_tree.items()}, args.base)
        for shape, per_tree in runs.items()
    ]
    return 0 if all(same) else 1


def report(shape: tuple[int, int], figures: dict[str, dict[str, Any]], base_name: str) -> bool:
    """One cluster's table; whether this tree's first decisions were the reference's."""
    gpus, pending = shape
    names = list(figures)
    here = figures["this tree"]
    base = figures[names[0]] if base_name != "none" else None
    print(f"\ncluster: {here['shape']}; {here['pooled']} single placements pooled per column")
    header = "".join(f"{n:>18}" for n in names) + ("   this / base" if base else "")

    def row(label: str, key: str, scale: float, unit: str, fmt: str = "9.3f") -> None:
        cells = "".join(f"{figures[n][key] * scale:{fmt}} {unit:<8}" for n in names)
        ratio = f"  {here[key] / base[key]:9.2f}x" if base and base[key] else ""
        print(f"  {label:38}{cells}{ratio}")

    print(f"{f'one workload over {gpus:,} GPUs (no cache)':40}{header}")
    row("decision, median", "median", 1e3, "ms")
    row("decision, p99", "p99", 1e3, "ms")
    row("decision, CPU time, median", "cpu_median", 1e3, "ms")
    row("decision, CPU time, p99", "cpu_p99", 1e3, "ms")
    row("decision + record, median", "explained_median", 1e3, "ms")
    row("decision + record, p99", "explained_p99", 1e3, "ms")
    row("scalar reference, median", "reference", 1e3, "ms", "9.1f")
    row("speed-up over the reference (medians)", "speedup", 1, "x", "9.1f")
    print(f"{f'one tick: {pending:,} pending workloads':40}{header}")
    row("vectorised", "tick", 1, "s")
    row("scalar reference (scaled from 100)", "reference_tick", 1, "s", "9.1f")
    first = f"one tick with records: first {here['explained_pending']:,}"
    print(f"{first:40}{header}")
    row("vectorised, as the operator runs it", "tick_explained", 1, "s")
    for n in names:
        f = figures[n]
        print(
            f"  {n}: {f['reference_tick'] / f['tick']:.1f}x the reference; first 100 decisions "
            f"identical to it: {f['same']}; outcomes {f['outcomes']}, speculative {f['speculative']}"
        )
    return bool(here["same"])


if __name__ == "__main__":
    sys.exit(main())
