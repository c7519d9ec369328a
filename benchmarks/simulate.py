"""`python -m benchmarks.simulate` (or `make bench-sim`): simulator speed.

One simulated hour of a 64-GPU cluster at the mixed scenario's load (the mixed scenario's eight
H100s, tenants and replicas scaled eightfold), under `sovereignspec` and under `never`, each timed
in this run. Prints wall time, events processed and events per second.
"""

from __future__ import annotations

import sys
import time

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


def main() -> int:
    profiles = load_profiles()
    scenario = cluster_of_64(load("mixed"))
    gpus = sum(g.nodes * g.gpus_per_node for g in scenario.cluster)
    print(f"{scenario.name}: {gpus} GPUs, {scenario.duration_s:.0f} simulated seconds", flush=True)
    print(
        f"{'policy':<16} {'wall s':>8} {'events':>10} {'events/s':>10} {'requests':>9} {'goodput tok/s':>13}"
    )
    for policy in ("sovereignspec", "never"):
        started = time.perf_counter()
        sim, result = run_policy(scenario, profiles, policy)
        wall = time.perf_counter() - started
        print(
            f"{policy:<16} {wall:>8.1f} {sim.processed:>10,} {sim.processed / wall:>10,.0f} "
            f"{len(sim.requests):>9,} {result.goodput_tokens_per_s:>13,.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
