"""Step time of one batched decode step on one GPU, and what a headroom reading means in load.

The model is additive where measurements say the work does not overlap, and smooth where it does:

    T(n, s, L) = t_fixed + smax_p( s·L·kv/B ,  n·a·L/P )                 attention kernels
                         + smax_p( W/B + κ·n·f/P ,  n·f/P )              GEMM kernels

with n query tokens in the step (one per plain sequence, γ+1 per speculating one), s sequences whose
KV cache is read, context L, per-rank weight bytes W, per-token KV bytes kv, GEMM FLOPs per query
token f = 2·params, attention FLOPs per query token and context token a = 4·layers·hidden, effective
compute P and bandwidth B, and a fixed per-step cost (launches, sampling, scheduling,
tensor-parallel all-reduces).

- Attention and the GEMMs are different kernels that run one after the other, so their times add;
  each is its own roofline. Attention reads every sequence's KV cache once however many query
  tokens it has, so at long context verification costs little more than a plain step (MagicDec's
  tables: T_V/T_AR falls towards 1.06 at 64K–100K).
- Below the compute ridge the weights stream while GEMMs run, but a fraction κ (`serial_fraction`)
  of each query token's compute does not hide behind that stream (sampling, norms, small kernels):
  every query token costs time from batch 1, as the SpecDecode-Bench fit's H100 runs show.
- smax_p(a, b) = (a^p + b^p)^(1/p) is a smooth maximum (p = `overlap`): the approach to the
  compute-bound regime is gradual, and p → ∞ with κ = 0 gives back the hard roofline.

P, B, t_fixed, κ and p are fitted to measured step times (`sovereignspec calibrate`).

Headroom h is spare compute, the complement of compute utilisation u = C/M with C = n·f/P and
M = (W + s·L·kv)/B: h = 1 − min(1, u). h = 0 means the step is at or past its compute ridge. Because
both C and M grow with the batch, long contexts can keep a GPU memory-bound at any batch that fits
(MagicDec's observation); there a reading below the reachable minimum maps to the KV-capacity limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sovereignspec.core.specs import GpuSpec, ModelSpec

Array = NDArray[np.float64]

# Fraction of GPU memory that weights may take when choosing a tensor-parallel degree; the rest is
# KV cache, activations and the CUDA context.
WEIGHT_MEMORY_FRACTION = 0.85
# Fraction of GPU memory usable by weights plus KV cache when bounding the load.
USABLE_MEMORY_FRACTION = 0.92
TP_DEGREES = (1, 2, 4, 8, 16)


def fits_at(gpu: GpuSpec, model: ModelSpec, tp: int) -> bool:
    """Whether `model`'s weights, split over `tp` GPUs, leave room for its KV cache."""
    return model.params * model.bytes_per_param / tp <= WEIGHT_MEMORY_FRACTION * gpu.mem_bytes


def tensor_parallel_for(gpu: GpuSpec, model: ModelSpec) -> int:
    """The model's usual TP degree, raised to the next power of two if its weights don't fit."""
    for tp in TP_DEGREES:
        if tp >= model.tensor_parallel and fits_at(gpu, model, tp):
            return tp
    raise ValueError(f"model {model.name} does not fit on {gpu.name} at any TP degree in {TP_DEGREES}")


def pipeline_stage(model: ModelSpec, stages: int, tp: int | None = None) -> ModelSpec:
    """The largest of `stages` pipeline stages of `model`, each on `tp` GPUs (tensor parallel).

    A step passes every stage in turn (an engine gives a stage ⌈layers/stages⌉ layers or one fewer),
    so the group's step is the sum of its stages' and the largest one bounds it: a stage holds its
    layers' share of the parameters and of the KV cache (embeddings counted as layers: an estimate),
    and hands its activations on once per step (`GpuSpec.pipeline_hop_s`, in `roofline_for`)."""
    if stages <= 1:
        return model
    layers = math.ceil(model.layers / stages)
    return replace(
        model,
        params=model.params * layers / model.layers,
        layers=layers,
        tensor_parallel=tp or model.tensor_parallel,
        pipeline_stages=stages,
    )


@dataclass(frozen=True)
class Roofline:
    """Per-GPU coefficients of the step-time model for one target model.

    Every field is a float or an array over GPUs, so one instance can describe a whole cluster and
    `step_time` broadcasts over GPUs, draft lengths and batch sizes at once.
    """

    weight_bytes: Array  # W: bytes of weights each rank streams per step
    kv_bytes_per_token: Array  # bytes of KV cache one context token occupies on each rank
    weight_flops_per_token: Array  # 2·params / tp
    attention_flops_per_token_per_ctx: Array  # 4·layers·hidden / tp
    flops: Array  # effective FLOP/s
    bandwidth: Array  # effective bytes/s
    fixed_s: Array  # fixed cost per step
    capacity_bytes: Array  # memory usable by weights and KV on each rank
    serial_fraction: Array  # κ: share of per-token compute that does not overlap the weight stream
    overlap: Array  # p of the smooth maximum (inf: a hard max)

    def flops_per_token(self, context: ArrayLike) -> Array:
        return np.asarray(
            self.weight_flops_per_token + self.attention_flops_per_token_per_ctx * np.asarray(context)
        )

    def seconds_per_token(self, context: ArrayLike) -> Array:
        """Compute time of one query token at `context` (the slope of the compute roof)."""
        return np.asarray(seconds_per_token(self, np.asarray(context)), dtype=np.float64)

    def memory_time(self, n_seqs: ArrayLike, context: ArrayLike) -> Array:
        kv = np.asarray(n_seqs) * np.asarray(context) * self.kv_bytes_per_token
        return np.asarray((self.weight_bytes + kv) / self.bandwidth, dtype=np.float64)

    def compute_time(self, n_tokens: ArrayLike, context: ArrayLike) -> Array:
        return np.asarray(np.asarray(n_tokens) * self.seconds_per_token(context), dtype=np.float64)

    def kv_time(self, n_seqs: ArrayLike, context: ArrayLike) -> Array:
        return np.asarray(
            np.asarray(n_seqs) * np.asarray(context) * self.kv_bytes_per_token / self.bandwidth,
            dtype=np.float64,
        )

    def weight_time(self) -> Array:
        return np.asarray(self.weight_bytes / self.bandwidth, dtype=np.float64)

    def step_time(self, n_tokens: ArrayLike, n_seqs: ArrayLike, context: ArrayLike) -> Array:
        """T(n, s, L): seconds for one step with n query tokens over s sequences of context L."""
        return np.asarray(
            step_formula(self, np.asarray(n_tokens), np.asarray(n_seqs), np.asarray(context), smooth_max),
            dtype=np.float64,
        )

    def step_rates(self, context: ArrayLike) -> tuple[Array, Array, Array, Array]:
        """`step_rates` at `context`, for several `step_at` calls at one context."""
        return step_rates(self, np.asarray(context, dtype=np.float64))

    def step_at(
        self, rates: tuple[Array, Array, Array, Array], n_tokens: ArrayLike, n_seqs: ArrayLike
    ) -> Array:
        """`step_time` at the context `rates` were computed for."""
        return np.asarray(step_at(self, rates, n_tokens, n_seqs, smooth_max), dtype=np.float64)

    def step_terms(self, n_tokens: float, n_seqs: float, context: float) -> dict[str, float]:
        """`step_time` term by term, in seconds, for the explainer: the terms add up to the step."""
        gemm = n_tokens * float(self.weight_flops_per_token / self.flops)
        attention = n_tokens * float(self.attention_flops_per_token_per_ctx) * context / float(self.flops)
        kv = float(self.kv_time(n_seqs, context))
        weights = float(self.weight_time())
        serial = float(self.serial_fraction) * gemm
        attention_kernels = float(smooth_max(kv, attention, self.overlap))
        gemm_kernels = float(smooth_max(weights + serial, gemm, self.overlap))
        return {
            "fixed": float(self.fixed_s),
            "kv_reads": kv,
            "attention_excess": attention_kernels - kv,  # where attention's compute shows past its reads
            "weights": weights,
            "per_token_serial": serial,
            "gemm_excess": gemm_kernels - weights - serial,  # the approach to the compute roof
        }

    def headroom(self, n_tokens: ArrayLike, n_seqs: ArrayLike, context: ArrayLike) -> Array:
        """Spare compute of a step with n_tokens query tokens over n_seqs sequences: 1 − min(1, C/M)."""
        return np.asarray(
            headroom_formula(self, np.asarray(n_tokens), np.asarray(n_seqs), np.asarray(context), ARRAY_OPS),
            dtype=np.float64,
        )

    def max_seqs(self, context: ArrayLike) -> Array:
        """Sequences whose KV cache fits next to the weights."""
        return np.asarray(max_seqs_formula(self, np.asarray(context), ARRAY_OPS), dtype=np.float64)

    def seqs_for_headroom(self, headroom: ArrayLike, context: ArrayLike) -> Array:
        """The plain-decode load (sequences) at which the GPU reads `headroom` (`seqs_formula`)."""
        h = np.asarray(headroom, dtype=np.float64)
        ctx = np.asarray(context, dtype=np.float64)
        return np.asarray(seqs_formula(self, h, ctx, ARRAY_OPS), dtype=np.float64)

    def ridge_seqs(self, context: ArrayLike) -> Array:
        """The plain-decode load (sequences) at which compute time reaches memory time, whether or
        not the KV cache could hold it; inf where none does (each sequence's KV reads cost more
        than its token's compute: memory-bound at any batch)."""
        ctx = np.asarray(context, dtype=np.float64)
        denom = self.seconds_per_token(ctx) - ctx * self.kv_bytes_per_token / self.bandwidth
        with np.errstate(divide="ignore", invalid="ignore"):  # where denom ≤ 0 the quotient is discarded
            s = np.where(denom > 0.0, self.weight_time() / denom, np.inf)
        return np.asarray(s, dtype=np.float64)

    def map(self, fn: Callable[[Array], Array]) -> Roofline:
        """The same coefficients with `fn` applied to every field (indexing, reshaping)."""
        return Roofline(**{name: fn(np.asarray(getattr(self, name), dtype=np.float64)) for name in _FIELDS})

    def take(self, index: NDArray[np.int64]) -> Roofline:
        return self.map(lambda a: a[index])

    def matrix(self) -> Array:
        """The fields stacked as rows of one (fields, G) array; `from_matrix(m[:, idx])` is a fast take."""
        return np.stack([np.asarray(getattr(self, name), dtype=np.float64) for name in _FIELDS])

    @staticmethod
    def from_matrix(m: Array) -> Roofline:
        return Roofline(*m)


_FIELDS = tuple(Roofline.__dataclass_fields__)


class StepCoefficients(Protocol):
    """What `step_formula` reads: `Roofline`'s fields, as arrays or as floats (`scalar.Coeffs`)."""

    @property
    def weight_bytes(self) -> Any: ...
    @property
    def kv_bytes_per_token(self) -> Any: ...
    @property
    def weight_flops_per_token(self) -> Any: ...
    @property
    def attention_flops_per_token_per_ctx(self) -> Any: ...
    @property
    def flops(self) -> Any: ...
    @property
    def bandwidth(self) -> Any: ...
    @property
    def fixed_s(self) -> Any: ...
    @property
    def capacity_bytes(self) -> Any: ...
    @property
    def serial_fraction(self) -> Any: ...
    @property
    def overlap(self) -> Any: ...


def step_rates(r: StepCoefficients, context: Any) -> tuple[Any, Any, Any, Any]:
    """T(n, s, L)'s per-GPU quotients at context L: GEMM and attention seconds per query token,
    the weights' streaming seconds, KV-read seconds per sequence. Computed once for every step a
    decision prices at that context (the verification steps, the plain step, the batch-1 step)."""
    return (
        r.weight_flops_per_token / r.flops,
        r.attention_flops_per_token_per_ctx * context / r.flops,
        r.weight_bytes / r.bandwidth,
        context * r.kv_bytes_per_token / r.bandwidth,
    )


def step_at(
    r: StepCoefficients, rates: tuple[Any, Any, Any, Any], n_tokens: Any, n_seqs: Any, smax: Any
) -> Any:
    """T(n, s, L) of the module docstring from `step_rates(r, L)`: the step's one home, for arrays
    (`Roofline.step_time`, `smooth_max`) and floats (`scalar.Coeffs`, its float twin), which so
    round alike. Each term is one pass over the (draft lengths × GPUs) arrays; the sums are in
    place (for floats `+=` simply rebinds)."""
    gemm_rate, attention_rate, weights, kv_rate = rates
    gemm = n_tokens * gemm_rate
    streamed = r.serial_fraction * gemm
    streamed += weights
    step = smax(n_seqs * kv_rate, n_tokens * attention_rate, r.overlap)
    step += smax(streamed, gemm, r.overlap)
    step += r.fixed_s
    return step


def step_formula(r: StepCoefficients, n_tokens: Any, n_seqs: Any, context: Any, smax: Any) -> Any:
    """T(n, s, L) with n query tokens over s sequences of context L (`step_at` at `step_rates`)."""
    return step_at(r, step_rates(r, context), n_tokens, n_seqs, smax)


@dataclass(frozen=True)
class Ops:
    """What the one-home formulas below need that floats and numpy arrays spell differently: the
    array path takes numpy's elementwise forms, the float path (`scalar.Coeffs`) Python's own,
    which cost a fraction of a numpy call on one number. Both compute the same doubles."""

    minimum: Callable[[Any, Any], Any]
    maximum: Callable[[Any, Any], Any]
    quotient_where_positive: Callable[[Any, Any], Any]  # a / b where b > 0, else inf


def _array_quotient(a: Any, b: Any) -> Any:
    with np.errstate(divide="ignore", invalid="ignore"):  # where b ≤ 0 the quotient is discarded
        return np.where(b > 0.0, a / b, np.inf)


def _float_quotient(a: float, b: float) -> float:
    return a / b if b > 0.0 else math.inf


ARRAY_OPS = Ops(np.minimum, np.maximum, _array_quotient)
FLOAT_OPS = Ops(min, max, _float_quotient)


def seconds_per_token(r: StepCoefficients, context: Any) -> Any:
    """(f + a·L)/P: the compute time of one query token at context L (the compute roof's slope)."""
    return (r.weight_flops_per_token + r.attention_flops_per_token_per_ctx * context) / r.flops


def headroom_formula(r: StepCoefficients, n_tokens: Any, n_seqs: Any, context: Any, ops: Ops) -> Any:
    """h = 1 − min(1, C/M) of the module docstring, C = n·(f + a·L)/P, M = (W + s·L·kv)/B: the
    headroom's one home, for arrays (`Roofline.headroom`) and floats (`scalar.Coeffs.headroom`)."""
    compute = n_tokens * seconds_per_token(r, context)
    memory = (r.weight_bytes + n_seqs * context * r.kv_bytes_per_token) / r.bandwidth
    return 1.0 - ops.minimum(1.0, compute / memory)


def max_seqs_formula(r: StepCoefficients, context: Any, ops: Ops) -> Any:
    """Sequences whose KV cache at context L fits next to the weights."""
    free = ops.maximum(r.capacity_bytes - r.weight_bytes, 0.0)
    return free / (ops.maximum(context, 1.0) * r.kv_bytes_per_token)


def seqs_formula(r: StepCoefficients, headroom: Any, context: Any, ops: Ops) -> Any:
    """The plain-decode load (sequences) at which a GPU reads `headroom`: `headroom_formula`'s
    inverse, and its one home for arrays and floats.

    Solves s·(f + a·L)/P = u·(W + s·L·kv)/B for u = 1 − h. Where u cannot be reached before the KV
    cache is full (long contexts), or the solution exceeds capacity, the load is the capacity."""
    u = 1.0 - ops.minimum(ops.maximum(headroom, 0.0), 1.0)
    denom = seconds_per_token(r, context) - u * (context * r.kv_bytes_per_token / r.bandwidth)
    solved = ops.quotient_where_positive(u * (r.weight_bytes / r.bandwidth), denom)
    return ops.minimum(solved, max_seqs_formula(r, context, ops))


def compute_bound(r: StepCoefficients, n_tokens: Any, n_seqs: Any, context: Any) -> Any:
    """Whether a step's compute time reaches its memory time (headroom 0: at or past the ridge),
    for arrays or floats alike."""
    compute = n_tokens * (r.weight_flops_per_token + r.attention_flops_per_token_per_ctx * context) / r.flops
    memory = (r.weight_bytes + n_seqs * context * r.kv_bytes_per_token) / r.bandwidth
    return compute >= memory


def smooth_max(a: ArrayLike, b: ArrayLike, p: ArrayLike) -> Array:
    """(a^p + b^p)^(1/p) for a, b ≥ 0, computed as hi·(1 + (lo/hi)^p)^(1/p); max(a, b) at p = inf.

    No special cases: at p = inf, (1 + r^inf)^(1/inf) is x^0 = 1 for every r in [0, 1], and where
    both are 0 the smaller never shows, so the result is hi, 0. The hot path's cost is its passes
    over the arrays and its two powers: the powers (`smooth_top`) are taken only where the smaller
    term still shows in the sum (`negligible_ratio`, which then makes hi > 0); everywhere else the
    formula's double is `hi` itself, which is what is returned there, so the result is the same,
    bit for bit."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    hi = np.asarray(np.maximum(x, y))  # an array even for two scalars: written in place below
    lo = np.minimum(x, y)
    pp = np.asarray(p, dtype=np.float64)
    # One bound for all: the smallest exponent's is the lowest (it rises with p), so under it every
    # element's power is negligible whatever its own p.
    shows = np.flatnonzero(lo > negligible_ratio(float(pp.min())) * hi) if hi.size else _NONE
    if shows.size:
        q = _exponents_at(pp, hi.shape, shows)
        np.put(hi, shows, smooth_top(np.take(hi, shows), np.take(lo, shows), q))
    return hi[()] if hi.ndim == 0 else hi  # a scalar in, a scalar out, as numpy's own ufuncs


def smooth_top(hi: Any, lo: Any, p: Any) -> Any:
    """hi·(1 + (lo/hi)^p)^(1/p), the smooth maximum of hi ≥ lo where lo shows beside hi (above
    `negligible_ratio`, so hi > 0): its one home, for the arrays `smooth_max` gathers and for the
    float twin (`scalar._smax`), which so round alike. After the quotient every operation is in
    place on an array (for a float it simply rebinds): one pass each, no temporaries."""
    r = lo / hi
    r **= p
    r += 1.0
    r **= 1.0 / p
    r *= hi
    return r


def _exponents_at(pp: Array, shape: tuple[int, ...], flat: NDArray[np.intp]) -> Array:
    """The exponent broadcast to `shape`, at flat positions `flat`: a scalar as it is, one per GPU
    (the last axis, as the verification steps have it) by column, anything else by unravelling."""
    if pp.ndim == 0 or pp.min() == pp.max():
        return np.asarray(pp.reshape(-1)[0], dtype=np.float64)
    if pp.ndim == 1 and shape[-1:] == pp.shape:
        return np.asarray(pp[flat % pp.shape[0]], dtype=np.float64)
    return np.asarray(np.broadcast_to(pp, shape)[np.unravel_index(flat, shape)], dtype=np.float64)


def negligible_ratio(p: Any) -> Any:
    """lo/hi at or below which hi·(1 + (lo/hi)^p)^(1/p) rounds to hi in doubles, for floats or arrays.

    (lo/hi)^p ≤ 2^-53 (half an ulp of 1) makes 1 + (lo/hi)^p round to 1, and 1^(1/p)·hi is hi.
    The bound sits a millionth below 2^(-53/p) so that pow's own error (an ulp or so) cannot
    carry a ratio under it over 2^-53: with p ≈ 64 it is lo/hi ≈ 0.56, where most steps of a
    decision are well inside one roof. At p = inf it is just under 1, where the smooth maximum
    is the hard one anyway."""
    return 2.0 ** (-53.0 / p) * (1.0 - 1e-6)


_NONE = np.zeros(0, dtype=np.intp)


def _f(x: float) -> Array:
    return np.asarray(x, dtype=np.float64)


def roofline_for(gpu: GpuSpec, model: ModelSpec, tp: int | None = None) -> Roofline:
    """Coefficients for `model` on `gpu` at its tensor-parallel degree (chosen to fit if not given)."""
    tp = tp or tensor_parallel_for(gpu, model)
    allreduces = 2.0 * model.layers if tp > 1 else 0.0  # one after attention, one after the MLP
    # A stage of several receives its input from the one before (the first, the sampled tokens).
    hop = gpu.pipeline_hop_s if model.pipeline_stages > 1 else 0.0
    return Roofline(
        weight_bytes=_f(model.params * model.bytes_per_param / tp),
        kv_bytes_per_token=_f(model.kv_bytes_per_token / tp),
        weight_flops_per_token=_f(2.0 * model.params / tp),
        attention_flops_per_token_per_ctx=_f(4.0 * model.layers * model.hidden / tp),
        flops=_f(gpu.effective_flops),
        bandwidth=_f(gpu.effective_bandwidth),
        fixed_s=_f(gpu.step_overhead_s + allreduces * gpu.allreduce_s + hop),
        capacity_bytes=_f(USABLE_MEMORY_FRACTION * gpu.mem_bytes),
        serial_fraction=_f(gpu.serial_fraction),
        overlap=_f(gpu.overlap),
    )


def stack_rooflines(rooflines: list[Roofline]) -> Roofline:
    """One Roofline whose fields are arrays over the given GPUs, for vectorised placement."""
    return Roofline(
        **{name: np.array([getattr(r, name) for r in rooflines], dtype=np.float64) for name in _FIELDS}
    )


def headroom_from_tensor_activity(tensor_active: ArrayLike, compute_efficiency: ArrayLike) -> Array:
    """Headroom from DCGM's tensor-pipe activity ratio (0–1).

    Decode kernels reach `compute_efficiency` of peak at best, so a pipe busy that fraction of the
    time is saturated: h = 1 − min(1, activity / efficiency).
    """
    activity = np.maximum(np.asarray(tensor_active, dtype=np.float64), 0.0)  # above 1 reads saturated
    return np.asarray(1.0 - np.minimum(1.0, activity / np.asarray(compute_efficiency)), dtype=np.float64)
