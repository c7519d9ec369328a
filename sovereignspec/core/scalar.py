"""The cost model and the γ choice for one GPU, in plain Python floats.

Two users: the scalar reference (`reference`), which recomputes every GPU for every workload, and
the placer's incremental updates, where one GPU changed and a numpy call per term would cost more
than the arithmetic. Every expression is written in the same order as its vectorised twin in
`roofline` and `optimiser`, so both round alike and decide alike; the tests hold them to that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sovereignspec.core.roofline import USABLE_MEMORY_FRACTION
from sovereignspec.core.specs import GpuSpec, ModelSpec

TIE_QUANTUM = 1e-9


@dataclass(frozen=True)
class Coeffs:
    """One GPU's roofline coefficients for one model; the fields of `Roofline`, in its order."""

    w: float
    kv: float
    wf: float
    af: float
    p: float
    b: float
    fixed: float
    cap: float
    sf: float  # κ, the serial fraction
    ov: float  # p, the smooth maximum's exponent

    @staticmethod
    def of(gpu: GpuSpec, model: ModelSpec, tp: int) -> Coeffs:
        return Coeffs(
            w=model.params * model.bytes_per_param / tp,
            kv=model.kv_bytes_per_token / tp,
            wf=2.0 * model.params / tp,
            af=4.0 * model.layers * model.hidden / tp,
            p=gpu.effective_flops,
            b=gpu.effective_bandwidth,
            fixed=gpu.step_overhead_s + (2.0 * model.layers if tp > 1 else 0.0) * gpu.allreduce_s,
            cap=USABLE_MEMORY_FRACTION * gpu.mem_bytes,
            sf=gpu.serial_fraction,
            ov=gpu.overlap,
        )

    def spt(self, ctx: float) -> float:
        return (self.wf + self.af * ctx) / self.p

    def memory(self, n_seqs: float, ctx: float) -> float:
        return (self.w + n_seqs * ctx * self.kv) / self.b

    def step(self, n_tokens: float, n_seqs: float, ctx: float) -> float:
        """T(n, s, L), as `Roofline.step_time`: attention's roofline plus the GEMMs'."""
        gemm = n_tokens * self.wf / self.p
        attention = n_tokens * (self.af * ctx) / self.p
        streamed = self.w / self.b + self.sf * gemm
        return (
            self.fixed
            + _smax(n_seqs * ctx * self.kv / self.b, attention, self.ov)
            + _smax(streamed, gemm, self.ov)
        )

    def headroom(self, n_tokens: float, n_seqs: float, ctx: float) -> float:
        return 1.0 - min(1.0, (n_tokens * self.spt(ctx)) / self.memory(n_seqs, ctx))

    def seqs_for_headroom(self, h: float, ctx: float) -> float:
        u = 1.0 - min(max(h, 0.0), 1.0)
        denom = self.spt(ctx) - u * (ctx * self.kv / self.b)
        cap = max(self.cap - self.w, 0.0) / (max(ctx, 1.0) * self.kv)
        s = u * (self.w / self.b) / denom if denom > 0.0 else math.inf
        return min(s, cap)


def _smax(a: float, b: float, p: float) -> float:
    hi, lo = (a, b) if a >= b else (b, a)
    if p == math.inf or hi <= 0.0:
        return hi
    return float(hi * (1.0 + (lo / hi) ** p) ** (1.0 / p))


def tau(alpha: float, gamma: float) -> float:
    if abs(1.0 - alpha) < 1e-12:
        return gamma + 1.0
    return float((1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha))


def quantize(x: float) -> float:
    return math.floor(x / TIE_QUANTUM + 0.5)


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
    plain = c.step(n + b, n + b, ctx)
    before = c.step(n, n, ctx)
    single = c.step(1.0, 1.0, ctx)
    # γ = 0 first: always feasible; its step is the plain step and the ratio exactly 1.
    best = (quantize(((b / (n + b)) * taus[0] + n / (n + b)) * (plain / plain)), 0, plain)
    for gamma in range(1, len(taus) if allow_spec else 1):
        step = c.step(n + (gamma + 1.0) * b, n + b, ctx)
        step += gamma * (draft_cost * single)
        step += spec_overhead * plain
        t = taus[gamma]
        ratio = plain / step
        aggregate = ((b / (n + b)) * t + n / (n + b)) * ratio
        if t * ratio >= 1.0 + margin and step <= slo_ratio * before:
            score = quantize(aggregate)
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
    step = c.step(n + (gamma + 1.0) * b, n + b, ctx)
    step += gamma * (draft_cost * c.step(1.0, 1.0, ctx))
    step += spec_overhead * plain
    ratio = plain / step
    return taus[gamma] * ratio, ((b / (n + b)) * taus[gamma] + n / (n + b)) * ratio
