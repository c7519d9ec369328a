"""The requests a scenario sends: per tenant, arrival instants, prompt and output lengths and each
request's acceptance rate, from streams seeded by the scenario (every policy serves the same ones)."""

from __future__ import annotations

import math
from itertools import repeat
from operator import attrgetter

import numpy as np

from sovereignspec.sim.scenario import Arrival, Scenario
from sovereignspec.sim.state import Request


def generate(scenario: Scenario) -> tuple[list[Request], list[Request]]:
    """Every tenant's requests (by id) and the same in arrival order (ties by id)."""
    requests: list[Request] = []
    for ti, t in enumerate(scenario.tenants):
        rng = np.random.default_rng([scenario.seed, ti])
        times = arrival_times(rng, t.arrival, t.start_s, scenario.duration_s)
        n = len(times)
        prompts = _lengths(rng, t.prompt_tokens.mean, t.prompt_tokens.sd, n).tolist()
        outputs = np.maximum(_lengths(rng, t.output_tokens.mean, t.output_tokens.sd, n), 2).tolist()
        alphas = (
            np.clip(rng.normal(t.alpha.mean, t.alpha.sd, n), 0.0, 0.999)
            if t.alpha.sd
            else np.full(n, t.alpha.mean)
        ).tolist()
        first = len(requests)
        requests.extend(map(Request, range(first, first + n), repeat(ti, n), times, prompts, outputs, alphas))
    order = np.argsort(np.fromiter(map(attrgetter("arrival"), requests), np.float64), kind="stable")
    return requests, [requests[i] for i in order.tolist()]


def arrival_times(rng: np.random.Generator, a: Arrival, start: float, end: float) -> list[float]:
    """Arrival instants in [start, end): exponential gaps at the (for bursts, time-varying) rate.

    The gaps are drawn in blocks, then the stream is left exactly where drawing one gap per step
    leaves it (one draw per arrival, plus the one that crossed `end`), because the lengths and α
    drawn next from the same stream depend on it."""
    saved = rng.bit_generator.state
    block = int(a.rate_per_s * max(end - start, 0.0) * 1.1) + 64
    used = 0
    if a.kind == "poisson":  # a constant rate: the running sum, vectorised (cumsum adds in order)
        parts, clock = [], start
        while True:
            clocks = np.cumsum(
                np.concatenate(([clock], rng.standard_exponential(block) * (1.0 / a.rate_per_s)))
            )
            cut = int(np.searchsorted(clocks[1:], end))  # the first draw to reach `end`
            if cut < block:
                parts.append(clocks[1 : cut + 1])
                used += cut + 1
                break
            parts.append(clocks[1:])
            used += block
            clock = float(clocks[-1])
        times: list[float] = np.concatenate(parts).tolist()
    else:
        gaps: list[float] = []
        times = []
        clock = start
        cycle = a.on_s + a.off_s
        # Same mean rate for bursts: factor× during a burst, the rest of the cycle at what remains.
        high = min(a.burst_factor * a.rate_per_s, a.rate_per_s * cycle / a.on_s)
        low = max(a.rate_per_s * cycle - high * a.on_s, 0.0) / a.off_s
        while True:
            rate = high if (clock % cycle) < a.on_s else low
            if rate <= 0:
                clock = (clock // cycle + 1) * cycle
                continue
            if used == len(gaps):
                gaps.extend(rng.standard_exponential(block).tolist())
            clock += (1.0 / rate) * gaps[used]  # what rng.exponential(1 / rate) returns for this draw
            used += 1
            if clock >= end:
                break
            times.append(clock)
    rng.bit_generator.state = saved
    rng.standard_exponential(used)
    return times


def _lengths(rng: np.random.Generator, mean: float, sd: float, n: int) -> np.ndarray:
    if sd <= 0:
        return np.full(n, max(1, round(mean)), dtype=np.int64)
    sigma2 = math.log(1.0 + (sd / mean) ** 2)
    mu = math.log(mean) - sigma2 / 2
    return np.maximum(np.round(rng.lognormal(mu, math.sqrt(sigma2), n)), 1).astype(np.int64)
