"""The operator's online calibration, in the simulator: a policy that starts from profiles 30 % off
learns each GPU type from plain traffic, as the operator does from its engines' metrics.

The readings come from the world (`Simulator.step_readings`: each busy GPU's batch, mean context
and decode step at every telemetry sample of a run under `never`), never from the policy's model.
`core.learning` fits them, identifies what they pin and chooses: the learned profile where it is
identified and beats the one it started from on held-out readings, else that profile with its
observed error widening the self-benefit margin. The run that follows is the policy deciding with
what it learned, on the same arrivals as every other policy.
"""

from __future__ import annotations

from dataclasses import replace

from sovereignspec.core.learning import MAX_POINTS, InForce, Point, choose, learn, with_learning
from sovereignspec.core.roofline import tensor_parallel_for
from sovereignspec.core.specs import GpuSpec, ProfileSet
from sovereignspec.sim.scenario import Scenario

# A profile "30 % off": its fitted coefficients 30 % optimistic (the dangerous direction: it sees
# spare compute that is not there).
OFF = 0.3


def off_profiles(profiles: ProfileSet, off: float = OFF) -> ProfileSet:
    """Every coefficient a profile fits, `off` in the optimistic direction: bandwidth and compute
    efficiency raised by 1/(1 - off) (at most 1) and the fixed step cost cut by (1 - off), with no
    interval around the compute efficiency (nothing it knows to be unsure of). Where the
    bandwidth efficiency is near 1 already (the shipped H100's), the error is in the compute
    ceiling and the fixed cost: the ridge the published data leave unidentified."""

    def optimistic(g: GpuSpec) -> GpuSpec:
        up = 1.0 / (1.0 - off)
        return replace(
            g,
            bandwidth_efficiency=min(g.bandwidth_efficiency * up, 1.0),
            compute_efficiency=min(g.compute_efficiency * up, 1.0),
            step_overhead_s=g.step_overhead_s * (1.0 - off),
            compute_efficiency_low=None,
            compute_efficiency_high=None,
        )

    return replace(profiles, gpus={name: optimistic(g) for name, g in profiles.gpus.items()})


def pilot_readings(scenario: Scenario, profiles: ProfileSet, world: str) -> dict[str, list[Point]]:
    """The scenario served plain (`never`) in `world`: every GPU type's step readings, at most
    `MAX_POINTS` each, spread evenly over the run."""
    from sovereignspec.sim import policies
    from sovereignspec.sim.loop import Simulator

    sim = Simulator(scenario, profiles, policies.make("never"), world=world)
    sim.step_readings = []
    sim.run()
    by_type: dict[str, list[Point]] = {}
    for gpu_type, t, batch, context, step in sim.step_readings:
        by_type.setdefault(gpu_type, []).append(Point(batch, context, step, t))
    thinned = {}
    for gpu_type, points in by_type.items():
        every = max(len(points) // MAX_POINTS + (len(points) % MAX_POINTS > 0), 1)
        thinned[gpu_type] = points[::every]
    return thinned


def learned_profiles(
    scenario: Scenario, world_profiles: ProfileSet, start: ProfileSet, world: str
) -> tuple[ProfileSet, dict[tuple[str, str], InForce]]:
    """`start` as the policy prices after learning from a plain pilot of `scenario` in `world`
    (built from `world_profiles`, as every policy's run is)."""
    model_name = scenario.tenants[0].model
    model = start.models[model_name]
    in_force = {}
    for gpu_type, points in sorted(pilot_readings(scenario, world_profiles, world).items()):
        gpu = start.gpus[gpu_type]
        learned = learn(gpu, model, tensor_parallel_for(gpu, model), points)
        in_force[(gpu_type, model_name)] = choose(gpu, learned)
    return with_learning(start, in_force), in_force
