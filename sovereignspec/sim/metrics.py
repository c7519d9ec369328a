"""Per-tenant and overall results of a run, and the comparison of policies on the same arrivals."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from sovereignspec.sim.engine import Request, Simulator


@dataclass
class TenantResult:
    tenant: str
    requests: int
    served: int
    tokens: int
    tpot_mean_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    slo_violation_rate: float
    goodput_tokens_per_s: float
    speedup: float = math.nan  # mean TPOT under `never` / under this policy
    violations_from_others: int = 0  # SLO misses caused by other tenants' speculation


@dataclass
class RunResult:
    scenario: str
    policy: str
    seed: int
    tenants: list[TenantResult]
    goodput_tokens_per_s: float
    tokens_per_s: float
    slo_violation_rate: float
    energy_j_per_token: float
    jain_fairness: float
    speedup: float = math.nan
    violations_from_others: int = 0
    events: int = 0
    unplaced: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = _finite(asdict(self))
        return data


def _finite(x: Any) -> Any:
    if isinstance(x, float):
        return None if not math.isfinite(x) else round(x, 6)
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_finite(v) for v in x]
    return x


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if values.size else math.nan


def tpot(r: Request) -> float:
    return (r.t_finish - r.t_first) / (r.output - 1)


def violated(sim: Simulator, r: Request) -> bool:
    t = sim.scenario.tenants[r.tenant]
    if math.isnan(r.t_finish):
        return True
    return tpot(r) * 1e3 > t.tpot_slo_ms or (r.t_first - r.arrival) * 1e3 > t.ttft_slo_ms


def summarise(sim: Simulator) -> RunResult:
    duration = sim.scenario.duration_s
    tenants = []
    offered, served_good = [], []
    total_tokens = 0
    good_tokens = 0
    violations = 0
    for ti, t in enumerate(sim.scenario.tenants):
        reqs = [r for r in sim.requests if r.tenant == ti]
        done = [r for r in reqs if not math.isnan(r.t_finish)]
        tp = np.array([tpot(r) for r in done]) * 1e3
        ttft = np.array([r.t_first - r.arrival for r in done]) * 1e3
        bad = sum(violated(sim, r) for r in reqs)
        good = sum(r.output for r in done if not violated(sim, r))
        tokens = sum(r.output for r in done)
        tenants.append(
            TenantResult(
                tenant=t.name,
                requests=len(reqs),
                served=len(done),
                tokens=tokens,
                tpot_mean_ms=float(tp.mean()) if tp.size else math.nan,
                tpot_p50_ms=_pct(tp, 50),
                tpot_p99_ms=_pct(tp, 99),
                ttft_p50_ms=_pct(ttft, 50),
                ttft_p99_ms=_pct(ttft, 99),
                slo_violation_rate=bad / len(reqs) if reqs else 0.0,
                goodput_tokens_per_s=good / duration,
            )
        )
        offered.append(sum(r.output for r in reqs))
        served_good.append(good)
        total_tokens += tokens
        good_tokens += good
        violations += bad
    energy = sum(g.busy_energy for g in sim.gpus)
    # Idle GPUs draw their idle power for the rest of the run.
    span = max((r.t_finish for r in sim.requests if not math.isnan(r.t_finish)), default=duration)
    for g in sim.gpus:
        energy += sim.profiles.gpus[g.gpu_type].idle_watts * max(span - g.busy_time, 0.0)
    shares = [s / o for s, o in zip(served_good, offered, strict=True) if o > 0]
    jain = (sum(shares) ** 2) / (len(shares) * sum(x * x for x in shares)) if shares and any(shares) else 0.0
    return RunResult(
        scenario=sim.scenario.name,
        policy=sim.policy.name,
        seed=sim.scenario.seed,
        tenants=tenants,
        goodput_tokens_per_s=good_tokens / duration,
        tokens_per_s=total_tokens / duration,
        slo_violation_rate=violations / len(sim.requests) if sim.requests else 0.0,
        energy_j_per_token=energy / total_tokens if total_tokens else math.nan,
        jain_fairness=jain,
        events=sim.processed,
        unplaced={sim.scenario.tenants[t].name: why for t, why in sim.unplaced.items()},
    )


def compare(runs: dict[str, tuple[Simulator, RunResult]]) -> None:
    """Fill speed-ups against `never` and the SLO misses that others' speculation caused."""
    if "never" not in runs:
        return
    base_sim, base = runs["never"]
    base_missed = {r.id for r in base_sim.requests if violated(base_sim, r)}
    base_tpot = {t.tenant: t.tpot_mean_ms for t in base.tenants}
    for sim, result in runs.values():
        weights, ratios = [], []
        for t in result.tenants:
            if t.tpot_mean_ms and math.isfinite(t.tpot_mean_ms) and math.isfinite(base_tpot[t.tenant]):
                t.speedup = base_tpot[t.tenant] / t.tpot_mean_ms
                weights.append(t.tokens)
                ratios.append(t.speedup)
        result.speedup = float(np.average(ratios, weights=weights)) if weights and sum(weights) else math.nan
        caused = [
            r for r in sim.requests if violated(sim, r) and r.id not in base_missed and not r.speculated
        ]
        result.violations_from_others = len(caused)
        for t, tenant in zip(result.tenants, sim.scenario.tenants, strict=True):
            t.violations_from_others = sum(
                1 for r in caused if sim.scenario.tenants[r.tenant].name == tenant.name
            )
