"""Tables and JSON for simulation results."""

from __future__ import annotations

import math
from typing import Any

from sovereignspec.sim.scenario import Scenario
from sovereignspec.sim.summary import RunResult


def _f(x: float, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


ModelError = dict[str, tuple[float, float, float]]  # GPU type -> (RMS, largest, mean) relative


def table(
    scenario: Scenario,
    results: dict[str, RunResult],
    world: str = "measured",
    errors: ModelError | None = None,
) -> str:
    lines = [
        f"Scenario {scenario.name} (seed {scenario.seed}, {scenario.duration_s:g} s of arrivals, "
        f"{sum(g.nodes * g.gpus_per_node for g in scenario.cluster)} GPUs): {scenario.description.strip()}",
        "",
        f"{'policy':<30} {'speed-up':>8} {'goodput tok/s':>13} {'vs oracle':>9} {'SLO miss':>8} "
        f"{'by others':>9} {'J/token':>8} {'Jain':>5} {'events':>7}",
    ]
    oracle = results.get("oracle")
    for name, r in results.items():
        rel = (
            r.goodput_tokens_per_s / oracle.goodput_tokens_per_s
            if oracle and oracle.goodput_tokens_per_s
            else math.nan
        )
        lines.append(
            f"{name:<30} {_f(r.speedup):>8} {r.goodput_tokens_per_s:>13.0f} {_f(rel, 3):>9} "
            f"{r.slo_violation_rate:>8.1%} {r.violations_from_others:>9d} {_f(r.energy_j_per_token, 3):>8} "
            f"{r.jain_fairness:>5.2f} {r.events:>7d}"
        )
        if r.unplaced:
            lines.append(f"{'':<30} unplaced: {r.unplaced}")
    lines += ["", _world_line(world, errors or {})]
    lines += ["", "Per tenant (speed-up vs never; TPOT and TTFT in ms; SLO miss rate):"]
    lines.append(f"{'policy':<30} {'tenant':<16} {'speed-up':>8} {'TPOT p50':>8} {'p99':>7} {'TTFT p50':>8} "
                 f"{'p99':>8} {'miss':>6} {'goodput':>8}")  # fmt: skip
    for name, r in results.items():
        for t in r.tenants:
            lines.append(
                f"{name:<30} {t.tenant:<16} {_f(t.speedup):>8} {_f(t.tpot_p50_ms):>8} {_f(t.tpot_p99_ms):>7} "
                f"{_f(t.ttft_p50_ms, 0):>8} {_f(t.ttft_p99_ms, 0):>8} {t.slo_violation_rate:>6.1%} "
                f"{t.goodput_tokens_per_s:>8.0f}"
            )
    return "\n".join(lines)


def _world_line(world: str, errors: ModelError) -> str:
    if world == "profile":
        return (
            "World: the profiles' own model (--world profile): every policy is judged under the "
            "model it decides by."
        )
    shown = "; ".join(
        f"{gpu} RMS {100 * rms:.0f} %, worst {100 * worst:+.0f} %, mean {100 * mean:+.0f} %"
        for gpu, (rms, worst, mean) in sorted(errors.items())
    )
    return (
        "World: measured step times (sim/truth.py), not the profiles the policies decide with. "
        f"Profile step time against it (plain and γ=4 steps, batch 1-256, context 256-4096): {shown}."
    )


def to_json(
    scenario: Scenario,
    results: dict[str, RunResult],
    world: str = "measured",
    errors: ModelError | None = None,
) -> dict[str, Any]:
    return {
        "world": world,
        "model_error": {
            gpu: {"rms": round(r, 4), "worst": round(w, 4), "mean": round(m, 4)}
            for gpu, (r, w, m) in sorted((errors or {}).items())
        },
        "scenario": scenario.model_dump(),
        "policies": {name: r.to_dict() for name, r in results.items()},
    }
