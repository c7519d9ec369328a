"""The draft budget γ*: the best γ in 0..γ_max that pays for the workload and hurts no neighbour.

A workload arrives on a GPU whose headroom reading maps to a background load of N plain sequences.
The scheduler judges it at the load one telemetry uncertainty worse than reported (headroom − u),
so that a lagging or flattering reading cannot talk it into a longer draft or a violated SLO.
Each γ is then held to:

- self-benefit: the workload's own S_real(γ) ≥ 1 + margin (the margin covers model error);
- externality: every co-located tenant j stays within its TPOT SLO after the step grows,
  tpot_j · T_step(γ) / T_before ≤ slo_j. Only the tightest neighbour matters, so a GPU carries one
  number, q = min_j slo_j / tpot_j (∞ with no neighbours), and the check is T_step(γ)/T_before ≤ q.

Among feasible γ (γ = 0 is always feasible: plain decode never rejects), γ* maximises the GPU's
aggregate token rate, (N + b·τ)/(N + b) · T_plain/T_step(γ). For a workload alone on its GPU that is
exactly its own S_real; with neighbours it stops a small tenant from buying a little speed with a
lot of everyone's step time, which is the Pareto reading of the externality in the source. Past the
compute ridge no γ raises the aggregate, so γ* falls to 0 as headroom falls. Ties go to the smaller γ.

Everything here is vectorised over draft lengths (axis 0) and GPUs (axis 1): GPUs last, so that
numpy's inner loops run over the long axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from sovereignspec.core.roofline import Roofline
from sovereignspec.core.speedup import speculative_step, tau, verify_tokens

Array = NDArray[np.float64]

# Objective values closer than this (relative) are ties; resolved toward the smaller γ.
TIE_QUANTUM = 1e-9


def quantize(x: NDArray[np.float64]) -> NDArray[np.float64]:
    """Round to the tie quantum (half to even, as IEEE and Python's `round` do, so the scalar
    reference rounds alike)."""
    return np.rint(x / TIE_QUANTUM)


@dataclass(frozen=True)
class SpecRequest:
    """What the optimiser needs to know about the workload being decided."""

    alpha: float  # acceptance rate as the scheduler believes it (declared prior or learned)
    seqs: float  # concurrent sequences the workload runs
    context: float  # typical context length in tokens
    draft_cost: float  # c: a drafted token's cost relative to the batch-1 step
    spec_overhead: float  # o: the speculation machinery's per-step cost, relative to the plain step
    gamma_max: int  # 0 disables speculation (no drafter, or policy)
    margin: float  # self-benefit margin: S_real must reach 1 + margin
    # In speculative mode whatever γ (a row of a per-batch table): γ = 0 pays a draft pass and the
    # machinery (`speedup.speculation_terms`), and a longer draft is judged against that, not plain.
    armed: bool = False


@dataclass(frozen=True)
class GammaTable:
    """Every term for every (γ, GPU): what `choose` picks from, kept for the decision record."""

    gammas: NDArray[np.int64]  # (Γ,)
    taus: Array  # (Γ,) τ(α, γ)
    step: Array  # (Γ, G) T_step
    step_before: Array  # (G,) the step before the workload arrives
    speedup: Array  # (Γ, G) own S_real
    aggregate: Array  # (Γ, G) the GPU's aggregate speed-up: the objective
    self_ok: NDArray[np.bool_]  # (Γ, G) self-benefit holds and speculation is allowed at all
    externality_ok: NDArray[np.bool_]  # (Γ, G)

    @property
    def feasible(self) -> NDArray[np.bool_]:
        return np.asarray((self.gammas == 0)[:, None] | (self.self_ok & self.externality_ok), dtype=np.bool_)


@dataclass(frozen=True)
class GammaChoice:
    """γ* per GPU with its terms (all arrays over GPUs)."""

    gamma: NDArray[np.int64]
    speedup: Array
    aggregate: Array
    step: Array
    tpot: Array  # predicted seconds per output token at γ*


@dataclass(frozen=True)
class Blocker:
    """For one GPU: the γ the objective alone would pick, and which condition ruled it out."""

    gamma: int
    by_self_benefit: bool
    by_externality: bool


def _terms(
    roof: Roofline, req: SpecRequest, bg_seqs: Array, gammas: Array, taus: Array
) -> tuple[Array, Array, Array, Array, Array]:
    """(T_step, T_plain, T_before, S_real, aggregate) for every γ (rows) and GPU (columns).

    With n background sequences and b of the workload's:

        T_step(γ) = T(n + (γ+1)·b, n + b, L) + γ·c·T(1, 1, L) + o·T_plain,   T_plain = T(n + b, n + b, L)
        aggregate = (n/(n+b) + b/(n+b)·τ) · T_plain / T_step
    """
    n = bg_seqs
    b = req.seqs
    ctx = req.context
    g = gammas[:, None]
    rates = roof.step_rates(ctx)
    verify = roof.step_at(rates, verify_tokens(n, g, b), n + b)
    plain = verify[0]  # γ = 0 verifies one token per sequence: the plain step, T(n + b, n + b, L)
    before = roof.step_at(rates, n, n)
    single = roof.step_at(rates, 1.0, 1.0)  # a draft pass: speedup.py's docstring
    step = speculative_step(verify, single, plain, g, req.draft_cost, req.spec_overhead, req.armed)
    ratio = plain / step
    t = taus[:, None]
    speedup = t * ratio
    aggregate = (b / (n + b)) * t
    aggregate += n / (n + b)
    aggregate *= ratio
    return step, plain, before, speedup, aggregate


@lru_cache(maxsize=4096)
def gamma_axis(alpha: float, gamma_max: int) -> tuple[NDArray[np.int64], Array, Array]:
    """γ = 0..γ_max as integers and floats, and τ(α, γ); cached, a tick asks for few α."""
    gammas = np.arange(gamma_max + 1, dtype=np.int64)
    g = gammas.astype(np.float64)
    for a in (gammas, g):
        a.flags.writeable = False
    taus = tau(alpha, g)
    taus.flags.writeable = False
    return gammas, g, taus


def gamma_table(
    roof: Roofline,
    req: SpecRequest,
    bg_seqs: Array,
    slo_ratio: Array,
    allow_spec: NDArray[np.bool_] | None = None,
) -> GammaTable:
    """Evaluate every γ on every GPU at background loads `bg_seqs` (already the pessimistic ones).

    The per-GPU arrays have shape (G,); `roof`'s fields too, or are scalars (one GPU type for all:
    they broadcast). `allow_spec` (per GPU) forces plain decode where it is False, e.g. where
    telemetry is stale.
    """
    gammas, gammas_f, taus = gamma_axis(req.alpha, req.gamma_max)
    step, _, before, speedup, aggregate = _terms(roof, req, bg_seqs, gammas_f, taus)
    # Armed, the alternative to drafting at this batch is the armed γ = 0 (below 1), not plain.
    self_ok = speedup >= (1.0 + req.margin) * speedup[0] if req.armed else speedup >= 1.0 + req.margin
    if allow_spec is not None:
        self_ok &= allow_spec
    externality_ok = step <= slo_ratio * before
    return GammaTable(gammas, taus, step, before, speedup, aggregate, self_ok, externality_ok)


def choose(table: GammaTable) -> GammaChoice:
    """γ* per GPU: the feasible γ with the best objective; ties to the smaller γ."""
    masked = np.where(table.feasible, quantize(table.aggregate), -np.inf)
    best = np.argmax(masked, axis=0)  # argmax returns the first maximum: the smallest γ
    cols = np.arange(best.shape[0])
    step = table.step[best, cols]
    return GammaChoice(
        gamma=table.gammas[best],
        speedup=table.speedup[best, cols],
        aggregate=table.aggregate[best, cols],
        step=step,
        tpot=step / table.taus[best],
    )


def blocker(table: GammaTable, column: int = 0) -> Blocker:
    """Why one GPU's γ* is not the objective's own favourite (for the decision record)."""
    free = int(np.argmax(quantize(table.aggregate[:, column])))
    return Blocker(
        gamma=int(table.gammas[free]),
        by_self_benefit=free > 0 and not bool(table.self_ok[free, column]),
        by_externality=free > 0 and not bool(table.externality_ok[free, column]),
    )
