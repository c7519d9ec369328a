"""Run a scenario under every policy (or some) and compare them on the same arrivals."""

from __future__ import annotations

from collections.abc import Sequence

from sovereignspec.core.specs import ProfileSet
from sovereignspec.sim import policies
from sovereignspec.sim.loop import Simulator
from sovereignspec.sim.scenario import Scenario
from sovereignspec.sim.summary import RunResult, compare, summarise


def run_policy(
    scenario: Scenario, profiles: ProfileSet, policy: str, check: bool = False, world: str = "measured"
) -> tuple[Simulator, RunResult]:
    sim = Simulator(scenario, profiles, policies.make(policy), check=check, world=world).run()
    return sim, summarise(sim)


def run_all(
    scenario: Scenario,
    profiles: ProfileSet,
    names: Sequence[str] | None = None,
    check: bool = False,
    world: str = "measured",
) -> dict[str, RunResult]:
    chosen = list(names or policies.POLICIES)
    if "never" not in chosen:
        chosen.insert(0, "never")  # the reference for speed-ups
    runs = {name: run_policy(scenario, profiles, name, check, world) for name in chosen}
    compare(runs)
    return {name: result for name, (_, result) in runs.items()}
