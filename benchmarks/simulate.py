"""`python -m benchmarks.simulate` (or `make bench-sim`): simulator speed.

One simulated hour of a 64-GPU cluster at the mixed scenario's load (the mixed scenario's eight
H100s, tenants and replicas scaled eightfold), under `sovereignspec` and under `never`, each timed
in this run. Prints wall time, events processed and events per second. `make bench-sim` compiles
the simulator first (`make sim-native`) and runs the compiled one; then `sovereignspec` once more,
interpreted (a child process with SOVEREIGNSPEC_SIM_NATIVE=0), for the ratio. `--no-interpreted`
skips that run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from sovereignspec import sim as simulator
from sovereignspec.profiles import load_profiles
from sovereignspec.sim.run import run_policy
from sovereignspec.sim.scenario import Scenario, load

SCALE = 8
HOUR = 3600.0


def cluster_of_64(base: Scenario) -> Scenario:
    cluster = [g.model_copy(update={"nodes": g.nodes * SCALE}) for g in base.cluster]
    tenants = [
        t.model_copy(
            update={
                "replicas": t.replicas * SCALE,
                "arrival": t.arrival.model_copy(update={"rate_per_s": t.arrival.rate_per_s * SCALE}),
            }
        )
        for t in base.tenants
    ]
    return base.model_copy(
        update={"cluster": cluster, "tenants": tenants, "duration_s": HOUR, "name": "mixed-64"}
    )


def timed(policy: str) -> dict[str, float]:
    profiles = load_profiles()
    scenario = cluster_of_64(load("mixed"))
    started = time.perf_counter()
    sim, result = run_policy(scenario, profiles, policy)
    wall = time.perf_counter() - started
    return {
        "wall": wall,
        "events": sim.processed,
        "requests": len(sim.requests),
        "goodput": result.goodput_tokens_per_s,
    }


def _row(kind: str, policy: str, r: dict[str, float]) -> str:
    return (
        f"{kind:<12} {policy:<14} {r['wall']:>8.1f} {r['events']:>10,.0f} {r['events'] / r['wall']:>10,.0f} "
        f"{r['requests']:>9,.0f} {r['goodput']:>13,.0f}"
    )


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:  # one policy, as a JSON line, for the parent's table
        print(json.dumps(timed(argv[1])))
        return 0
    scenario = cluster_of_64(load("mixed"))
    gpus = sum(g.nodes * g.gpus_per_node for g in scenario.cluster)
    print(f"{scenario.name}: {gpus} GPUs, {scenario.duration_s:.0f} simulated seconds", flush=True)
    kind = "compiled" if simulator.NATIVE else "interpreted"
    where = f"compiled by mypyc, from {simulator.NATIVE}" if simulator.NATIVE else None
    print(f"simulator: {where or 'interpreted (no current compiled build: make sim-native)'}")
    print(
        f"{'simulator':<12} {'policy':<14} {'wall s':>8} {'events':>10} {'events/s':>10} "
        f"{'requests':>9} {'goodput tok/s':>13}"
    )
    results = {}
    for policy in ("sovereignspec", "never"):
        results[policy] = timed(policy)
        print(_row(kind, policy, results[policy]), flush=True)
    if simulator.NATIVE and "--no-interpreted" not in argv:
        env = {**os.environ, simulator.NATIVE_ENV: "0"}
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks.simulate", "--child", "sovereignspec"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        interpreted = json.loads(child.stdout.strip().splitlines()[-1])
        print(_row("interpreted", "sovereignspec", interpreted))
        same = interpreted["goodput"] == results["sovereignspec"]["goodput"] and (
            interpreted["events"] == results["sovereignspec"]["events"]
        )
        print(
            f"compiled / interpreted wall time, sovereignspec: "
            f"{results['sovereignspec']['wall'] / interpreted['wall']:.2f}; "
            f"same events and goodput: {'yes' if same else 'NO'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
