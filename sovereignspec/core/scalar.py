"""The cost model and the γ choice for one GPU, in plain Python floats.

Its users: the placer's incremental updates, where one GPU changed and a numpy call per term would
cost more than the arithmetic, its re-evaluation of running workloads, and the simulator's profile
world. The step, the smooth maximum's formula, the headroom and its inversion, and speculation's
price come from their one home (`roofline.step_formula`, `smooth_top`, `headroom_formula`,
`seqs_formula`, `speedup.speculative_step`); the rest is written in the same order as its vectorised twin in
`optimiser`, so both round alike and decide alike. The scalar reference in benchmarks/reference.py is
an independent implementation that both are held to.
"""

from __future__ import annotations

from dataclasses import dataclass

from sovereignspec.core.optimiser import TIE_QUANTUM  # one tie grid for both paths
from sovereignspec.core.roofline import (
    FLOAT_OPS,
    headroom_formula,
    negligible_ratio,
    roofline_for,
    seqs_formula,
    smooth_top,
    step_at,
    step_formula,
    step_rates,
)
from sovereignspec.core.specs import GpuSpec, ModelSpec
from sovereignspec.core.speedup import NEAR_ONE, speculative_step, tau_geometric, verify_tokens


@dataclass(frozen=True)
class Coeffs:
    """One GPU's roofline coefficients for one model: the fields of `Roofline`, in its order, as floats."""

    weight_bytes: float
    kv_bytes_per_token: float
    weight_flops_per_token: float
    attention_flops_per_token_per_ctx: float
    flops: float
    bandwidth: float
    fixed_s: float
    capacity_bytes: float
    serial_fraction: float  # κ
    overlap: float  # p, the smooth maximum's exponent

    @staticmethod
    def of(gpu: GpuSpec, model: ModelSpec, tp: int) -> Coeffs:
        return Coeffs(*roofline_for(gpu, model, tp).matrix().tolist())

    def step(self, n_tokens: float, n_seqs: float, ctx: float) -> float:
        """T(n, s, L), as `Roofline.step_time`: the same formula (`roofline.step_formula`)."""
        return float(step_formula(self, n_tokens, n_seqs, ctx, _smax))

    def rates(self, ctx: float) -> tuple[float, float, float, float]:
        """`roofline.step_rates` at `ctx`, for several `roofline.step_at` calls at one context."""
        return step_rates(self, ctx)

    def headroom(self, n_tokens: float, n_seqs: float, ctx: float) -> float:
        """`Roofline.headroom`: the same formula (`roofline.headroom_formula`)."""
        return float(headroom_formula(self, n_tokens, n_seqs, ctx, FLOAT_OPS))

    def seqs_for_headroom(self, h: float, ctx: float) -> float:
        """`Roofline.seqs_for_headroom`: the same formula (`roofline.seqs_formula`)."""
        return float(seqs_formula(self, h, ctx, FLOAT_OPS))


def _smax(a: float, b: float, p: float) -> float:
    """`roofline.smooth_max` for floats: hi itself where lo is negligible beside it (the same bound),
    else the same formula (`roofline.smooth_top`)."""
    hi, lo = (a, b) if a >= b else (b, a)
    if lo <= negligible_ratio(p) * hi:  # p = inf and hi = 0 included
        return hi
    return float(smooth_top(hi, lo, p))


def tau(alpha: float, gamma: float) -> float:
    """`speedup.tau` for one α and γ, as plain floats (the same formula and limit)."""
    if abs(1.0 - alpha) < NEAR_ONE:
        return gamma + 1.0
    return float(tau_geometric(alpha, gamma))


def quantize(x: float) -> float:
    return round(x / TIE_QUANTUM)


@dataclass(frozen=True)
class Choice:
    gamma: int
    step: float
    plain: float
    before: float
    load: float  # background sequences at the judged reading


def best_gamma(
    c: Coeffs,
    taus: list[float],
    seqs: float,
    ctx: float,
    draft_cost: float,
    spec_overhead: float,
    margin: float,
    judged_headroom: float,
    slo_ratio: float,
    allow_spec: bool,
) -> Choice:
    """γ* on one GPU: the optimiser's rule, γ by γ. `taus[γ]` = τ(α, γ) for γ = 0..γ_max."""
    b = seqs
    n = c.seqs_for_headroom(judged_headroom, ctx)
    rates = c.rates(ctx)
    # `roofline.step_at` called directly, with no method around it: the γ loop below is the
    # placer's hot path, where each call level per step counts.
    plain = step_at(c, rates, n + b, n + b, _smax)
    before = step_at(c, rates, n, n, _smax)
    single = step_at(c, rates, 1.0, 1.0, _smax)
    own, others = b / (n + b), n / (n + b)  # the aggregate's weights, as the optimiser rounds them
    # γ = 0 first: always feasible; its step is the plain step and the ratio exactly 1.
    best = (quantize((own * taus[0] + others) * (plain / plain)), 0, plain)
    for gamma in range(1, len(taus) if allow_spec else 1):
        verify = step_at(c, rates, verify_tokens(n, gamma, b), n + b, _smax)
        step = speculative_step(verify, single, plain, gamma, draft_cost, spec_overhead)
        t = taus[gamma]
        ratio = plain / step
        if t * ratio >= 1.0 + margin and step <= slo_ratio * before:
            score = quantize((own * t + others) * ratio)
            if score > best[0]:
                best = (score, gamma, step)
    return Choice(best[1], best[2], plain, before, n)


def speedup_at(
    c: Coeffs,
    taus: list[float],
    gamma: int,
    seqs: float,
    ctx: float,
    draft_cost: float,
    spec_overhead: float,
    judged_headroom: float,
) -> tuple[float, float]:
    """Running γ on one GPU at a reading: (own S_real, the GPU's aggregate speed-up), with the
    step arithmetic of best_gamma (γ = 0 is exactly (1, 1)). The aggregate is the token rate of
    everyone on the GPU against all-plain: below 1, the neighbours lose more than it gains."""
    if gamma <= 0:
        return 1.0, 1.0
    b = seqs
    n = c.seqs_for_headroom(judged_headroom, ctx)
    plain = c.step(n + b, n + b, ctx)
    verify = c.step(verify_tokens(n, gamma, b), n + b, ctx)
    step = speculative_step(verify, c.step(1.0, 1.0, ctx), plain, gamma, draft_cost, spec_overhead)
    ratio = plain / step
    return taus[gamma] * ratio, ((b / (n + b)) * taus[gamma] + n / (n + b)) * ratio
