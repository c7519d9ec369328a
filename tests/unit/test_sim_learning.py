"""The operator's online calibration in the simulator: a policy that starts from profiles 30 % off
learns each GPU type from a plain pilot run in the same world, and decides with what it learned.

The world keeps its own physics (`sim/truth.py`): the readings are its step times, never the
profile's. Issue 45 asks for 98 % of the oracle's goodput after learning in every shipped scenario;
it holds in five of six. In `heterogeneous` plain traffic never reaches the compute ceiling the
profile is wrong about (batches 1-53), so nothing there identifies it: the widened margins win back
most of what the wrong profile loses, not all (docs/simulator.md)."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from sovereignspec.core.roofline import roofline_for
from sovereignspec.profiles import load_profiles
from sovereignspec.sim.learning import off_profiles, pilot_readings
from sovereignspec.sim.run import run_all
from sovereignspec.sim.scenario import load
from sovereignspec.sim.summary import RunResult
from sovereignspec.sim.worlds import world_for

PROFILES = load_profiles()
MODEL = PROFILES.models["llama-3.1-8b"]
SCENARIOS = ("idle", "mixed", "saturated", "sovereign-split", "heterogeneous", "shared-engine")


def test_a_profile_30_percent_off_prices_compute_bound_steps_30_percent_faster_and_none_slower() -> None:
    shipped, off = PROFILES.gpus["H100-SXM"], off_profiles(PROFILES).gpus["H100-SXM"]

    def ratio(batch: int, query: int) -> float:
        def t(g: object) -> float:
            return float(roofline_for(g, MODEL, 1).step_time(batch * query, batch, 1024))  # type: ignore[arg-type]

        return t(off) / t(shipped)

    assert ratio(512, 5) < 1.0 - 0.2  # compute-bound: most of the error
    assert all(ratio(b, q) <= 1.0 for b in (1, 8, 64, 256) for q in (1, 3, 5))
    assert off.compute_range == (off.compute_efficiency, off.compute_efficiency)


def test_the_pilots_readings_are_the_worlds_step_times_not_the_profiles() -> None:
    scenario = load("saturated").model_copy(update={"duration_s": 60})
    (points,) = pilot_readings(scenario, PROFILES, "measured").values()
    world = world_for("measured", PROFILES.gpus["H100-SXM"], MODEL)
    profile = roofline_for(off_profiles(PROFILES).gpus["H100-SXM"], MODEL, 1)  # what the policy starts from
    to_world = np.array([p.step_s / world.step(p.batch, p.batch, p.context) for p in points])
    to_profile = np.array([p.step_s / float(profile.step_time(p.batch, p.batch, p.context)) for p in points])
    assert len(points) >= 12
    # Each reading is the world's step with its few per cent of noise, not what the policy's
    # profile says (a fifth faster at these batches).
    assert np.median(np.abs(to_world - 1)) < 0.04 and np.median(to_profile) > 1.15


@cache
def results(name: str) -> dict[str, RunResult]:
    return run_all(load(name), PROFILES, ["oracle", "sovereignspec-off30", "sovereignspec-learned"])


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s != "heterogeneous"])
def test_after_learning_from_a_profile_30_percent_off_goodput_reaches_98_percent_of_the_oracles(
    scenario,
) -> None:
    runs = results(scenario)
    assert runs["sovereignspec-learned"].goodput_tokens_per_s >= 0.98 * runs["oracle"].goodput_tokens_per_s


def test_a_profile_30_percent_off_costs_goodput_where_learning_wins_it_back() -> None:
    """The loop is not idle: where the wrong profile loses a fifth of the oracle's goodput or more,
    learning recovers it (the saturated cluster: the off profile sees spare compute that is not
    there and speculates into the ridge)."""
    runs = results("saturated")
    oracle = runs["oracle"].goodput_tokens_per_s
    assert runs["sovereignspec-off30"].goodput_tokens_per_s < 0.8 * oracle
    assert runs["sovereignspec-learned"].goodput_tokens_per_s >= 0.98 * oracle


def test_where_plain_traffic_cannot_see_the_error_learning_wins_back_most_of_the_loss_not_all() -> None:
    runs = results("heterogeneous")
    oracle = runs["oracle"].goodput_tokens_per_s
    off, learned = (
        runs["sovereignspec-off30"].goodput_tokens_per_s,
        runs["sovereignspec-learned"].goodput_tokens_per_s,
    )
    assert off < 0.6 * oracle  # the wrong profile speculates its neighbours past their SLOs
    assert learned >= 0.93 * oracle and learned - off >= 0.85 * (oracle - off)
