"""Per-tenant and overall results of a run, and the comparison of policies on the same arrivals."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np

from sovereignspec.sim.loop import Simulator


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


@dataclass
class Outcomes:
    """Every request of a run as columns (request id order), for whole-run arithmetic."""

    tenant: np.ndarray
    output: np.ndarray
    finish: np.ndarray
    done: np.ndarray  # finished within the run
    tpot_ms: np.ndarray  # nan where not done
    ttft_ms: np.ndarray
    violated: np.ndarray  # missed its TPOT or TTFT objective, or never finished
    speculated: np.ndarray


def outcomes(sim: Simulator) -> Outcomes:
    reqs = sim.requests
    n = len(reqs)

    def column(name: str, dtype: type) -> np.ndarray:
        return np.fromiter(map(attrgetter(name), reqs), dtype, n)

    tenant, output = column("tenant", np.int64), column("output", np.int64)
    arrival, first, finish = (
        column("arrival", np.float64),
        column("t_first", np.float64),
        column("t_finish", np.float64),
    )
    done = ~np.isnan(finish)
    tpot_ms = (finish - first) / (output - 1) * 1e3
    ttft_ms = (first - arrival) * 1e3
    tpot_slo = np.array([t.tpot_slo_ms for t in sim.scenario.tenants], np.float64)
    ttft_slo = np.array([t.ttft_slo_ms for t in sim.scenario.tenants], np.float64)
    violated = ~done | (tpot_ms > tpot_slo[tenant]) | (ttft_ms > ttft_slo[tenant])
    speculated = column("speculated", np.bool_)
    return Outcomes(tenant, output, finish, done, tpot_ms, ttft_ms, violated, speculated)


def summarise(sim: Simulator) -> RunResult:
    duration = sim.scenario.duration_s
    tenants = []
    offered, served_good = [], []
    total_tokens = 0
    good_tokens = 0
    violations = 0
    o = outcomes(sim)
    for ti, t in enumerate(sim.scenario.tenants):
        mine = o.tenant == ti
        done = mine & o.done
        tp = o.tpot_ms[done]
        ttft = o.ttft_ms[done]
        n = int(np.count_nonzero(mine))
        bad = int(np.count_nonzero(mine & o.violated))
        good = int(o.output[done & ~o.violated].sum())
        tokens = int(o.output[done].sum())
        tenants.append(
            TenantResult(
                tenant=t.name,
                requests=n,
                served=int(np.count_nonzero(done)),
                tokens=tokens,
                tpot_mean_ms=float(tp.mean()) if tp.size else math.nan,
                tpot_p50_ms=_pct(tp, 50),
                tpot_p99_ms=_pct(tp, 99),
                ttft_p50_ms=_pct(ttft, 50),
                ttft_p99_ms=_pct(ttft, 99),
                slo_violation_rate=bad / n if n else 0.0,
                goodput_tokens_per_s=good / duration,
            )
        )
        offered.append(int(o.output[mine].sum()))
        served_good.append(good)
        total_tokens += tokens
        good_tokens += good
        violations += bad
    energy = sum(g.busy_energy for g in sim.gpus)
    # Idle GPUs draw their idle power for the rest of the run.
    span = float(o.finish[o.done].max()) if o.done.any() else duration
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
    base_missed = outcomes(base_sim).violated
    base_tpot = {t.tenant: t.tpot_mean_ms for t in base.tenants}
    for sim, result in runs.values():
        weights, ratios = [], []
        for t in result.tenants:
            if t.tpot_mean_ms and math.isfinite(t.tpot_mean_ms) and math.isfinite(base_tpot[t.tenant]):
                t.speedup = base_tpot[t.tenant] / t.tpot_mean_ms
                weights.append(t.tokens)
                ratios.append(t.speedup)
        result.speedup = float(np.average(ratios, weights=weights)) if weights and sum(weights) else math.nan
        # Missed here, met under plain decode, and not itself speculating: others' speculation did it.
        o = outcomes(sim)
        caused = o.violated & ~base_missed & ~o.speculated
        result.violations_from_others = int(np.count_nonzero(caused))
        by_tenant = np.bincount(o.tenant[caused], minlength=len(result.tenants))
        for t, count in zip(result.tenants, by_tenant.tolist(), strict=True):
            t.violations_from_others = count
