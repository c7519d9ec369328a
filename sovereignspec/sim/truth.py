"""The simulated GPUs' physics: step times from measured data, not from the profiles policies use.

A policy decides with the profile's model (`core.roofline`, fitted coefficients); the simulator runs
the world on this one, built from measurements with a different shape, so that a policy is judged
against a world it does not define, and the report can show the model's error. The oracle knows
this world; `sovereignspec` does not.

One decode step with n query tokens over s sequences of mean context L:

    T = linear(n) + max(KV reads(s·L), attention compute(n·L)) + c_token·n + t_fixed

- linear(n): the measured time of the linear layers and their glue by query tokens (vidur's
  kernel profiles, `profiles/measurements/vidur_linear_layers.csv`), interpolated; scaled by
  parameters from the profiled model to the simulated one, and, for a GPU not profiled, moved
  along both axes by its datasheet bandwidth (the flat, weight-streaming part) and compute (where
  it bends), keeping the measured shape of the bend.
- KV reads at the KV-read rate of the SpecDecode-Bench vLLM fit on H100 (39.3 ns per Llama-3.1-8B
  KV token, 3.34 TB/s), scaled by datasheet bandwidth; attention compute at the linear layers'
  measured large-batch FLOP rate. Attention reads each sequence's KV once whatever its query
  tokens (MagicDec's tables).
- c_token and t_fixed: what the vLLM fit's step leaves after the linear layers (sampling, LM head,
  scheduling; host work, the same on every GPU), by least squares over the runs the fit was made
  from, so that the world follows the fit where it was measured (within 7 % at batch 1-64, plain
  and verifying k = 1, 3, 5 drafts) and the table's bend beyond. (The table's slope over plain
  batch 1-64 alone left 16 µs per query token to host work and counted the linear layers' growth
  twice: 26 % over the fit at batch 64 verifying 5 drafts.)
- noise: each run of identical steps (one batch, between two batch changes) runs a pseudo-random
  few per cent off that (`jitter`), drawn afresh at every change, so that no one can plan on it.
  The step's shape (the table's measured bend, its interpolation) is the systematic part, which
  an oracle may know; a deviation fixed per (query tokens, sequences) configuration, as this world
  had until 2026-12-02, is not physics (the table already holds the kernels' measured behaviour by
  token count) and handed the oracle ±3 % coin flips between neighbouring batches to harvest.

Drafting, also from the vLLM fit: EAGLE drafts cost the fit's draft time (its fixed part read as
three draft passes, the middle of the k = 1, 3, 5 it was fitted over: the bench's FIXED_1, _3 and
_5; plus its per-KV-token part); n-gram lookup 0.59 % of the verification step; a draft model γ
steps of its own model on these tables. No separate speculation tax: the fit has none beyond drafting.

The telemetry a GPU shows is its tensor-pipe activity, the time its query tokens' FLOPs take at
the datasheet peak over the step time; the operator turns that into headroom with its profile
(`headroom_from_tensor_activity`), as it does with DCGM.
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from sovereignspec.core.specs import DrafterSpec, GpuSpec, ModelSpec

# SpecDecode-Bench simulator/predictor.py, class Llama8BH100 @260263c (arXiv 2601.11580): fitted to
# measured vLLM v0.10.1 runs of Llama-3.1-8B (+EAGLE-3) on one H100 80GB, seconds.
FIT_C_KV = 3.92645679e-08  # per KV token
FIT_C_QUERY = 2.10103129e-05  # per query token
FIT_C_FIXED = 5.88590713e-03
FIT_OVERHEAD = 1.20683946e-03  # per step, plain and speculative
FIT_DRAFT_KV = 2.37768493e-09
FIT_DRAFT_PER_TOKEN = 8.41429603e-07
FIT_DRAFT_FIXED = 2.13526175e-03
FIT_DRAFT_PASSES = 3  # the fixed draft time read as this many EAGLE passes
FIT_NGRAM_SHARE = 0.005875
FIT_KV_BYTES = 131072.0  # Llama-3.1-8B bf16 KV bytes per token
FIT_H100_BANDWIDTH = 3.35e12  # datasheet, for scaling the fit's rates to other GPUs
FIT_BATCHES = (1, 8, 16, 32, 64)  # the runs the fit was made from
FIT_QUERY_TOKENS = (1, 2, 4, 6)  # per sequence: plain, and verifying k = 1, 3, 5 drafts

NOISE = 0.03  # the spread of a run of steps' deviation from the expected step (relative)
_TABULATED = 8192  # query tokens per step tabulated for the linear layers

# The vidur table each simulated GPU and model is built from: (sku, model) and the datasheet
# (bandwidth B/s, dense bf16 FLOP/s) of the profiled SKU.
_SKU_DATASHEET = {"a100": (2.039e12, 312e12), "h100": (3.35e12, 989e12), "a40": (696e9, 149.7e12)}
_REFERENCE_SKU = {
    "A100-80G-SXM": "a100",
    "H100-SXM": "h100",
    "H200": "h100",
    "L40S": "a40",
    "RTX-4090": "a40",
}
_TABLE_PARAMS = {"Llama-2-7b-hf": 6.74e9, "Meta-Llama-3-8B": 8.03e9}
_TABLE_FOR = {"a100": "Meta-Llama-3-8B", "h100": "Llama-2-7b-hf", "a40": "Llama-2-7b-hf"}


def _measurements_dir() -> Path:
    from sovereignspec.profiles import default_profile_dir

    return default_profile_dir() / "measurements"


@cache
def _linear_tables() -> dict[tuple[str, str, int], tuple[tuple[float, ...], tuple[float, ...]]]:
    """(sku, model, tp) → (query tokens, seconds) of the vidur linear-layer table."""
    path = _measurements_dir() / "vidur_linear_layers.csv"
    with path.open() as f:
        rows = list(csv.reader(line for line in f if not line.startswith("#")))
    header, body = rows[0], rows[1:]
    ns = tuple(float(h[1:]) for h in header[3:])
    return {(r[0], r[1], int(r[2])): (ns, tuple(float(x) * 1e-3 for x in r[3:])) for r in body}


def _interp(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise linear in x; flat below the first point, the last slope past the last."""
    if x <= xs[0]:
        return ys[0]
    i = bisect.bisect_right(xs, x)
    if i >= len(xs):
        i = len(xs) - 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class Linear:
    """The linear layers of one model on one GPU: seconds by query tokens, from a vidur table."""

    ns: tuple[float, ...]  # query-token points, in the profiled SKU's terms
    seconds: tuple[float, ...]
    time_scale: float  # seconds on this GPU per second on the profiled one (the streaming part)
    token_scale: float  # query tokens on the profiled SKU per query token here (where it bends)

    def __call__(self, n: float) -> float:
        return self.time_scale * _interp(self.ns, self.seconds, n * self.token_scale)

    def large_batch_flops(self, flops_per_token: float) -> float:
        """The FLOP rate the table shows between its two largest batches, on this GPU."""
        n1, n2 = self.ns[-2] / self.token_scale, self.ns[-1] / self.token_scale
        return flops_per_token * (n2 - n1) / (self(n2) - self(n1))


def linear_for(gpu: GpuSpec, params: float) -> Linear:
    sku = _REFERENCE_SKU.get(gpu.name)
    if sku is None:
        # Not in the table: the closest by bandwidth of those profiled.
        sku = min(_SKU_DATASHEET, key=lambda k: abs(math.log(_SKU_DATASHEET[k][0] / gpu.mem_bandwidth)))
    table = _TABLE_FOR[sku]
    ns, seconds = _linear_tables()[(sku, table, 1)]
    bandwidth, flops = _SKU_DATASHEET[sku]
    # Shape kept: the flat part scales with bandwidth, the bend sits where the compute ridge
    # W·P/(B·f) moves with compute over bandwidth; model size scales the whole (time ∝ parameters).
    size = params / _TABLE_PARAMS[table]
    return Linear(
        ns,
        seconds,
        size * bandwidth / gpu.mem_bandwidth,
        (flops / bandwidth) / (gpu.peak_flops / gpu.mem_bandwidth),
    )


@cache
def _host_costs() -> tuple[float, float]:
    """(c_token, t_fixed): what the vLLM fit's step leaves after the linear layers, by least squares
    (relative) over the runs it was fitted to: batch 1, 8, 16, 32 and 64, plain and verifying k = 1,
    3, 5 drafts (H100, Llama-3.1-8B from the Llama-2-7B table scaled by parameters). The fit's
    straight line and the table's bend then agree over the fit's own range."""
    lin = Linear(*_linear_tables()[("h100", "Llama-2-7b-hf", 1)], 8.03e9 / 6.74e9, 1.0)
    ns = [float(b * q) for b in FIT_BATCHES for q in FIT_QUERY_TOKENS]
    # Weighted least squares of (fit - linear) = c_token·n + t_fixed, weights 1/fit (relative error).
    sw = sn = snn = sy = sny = 0.0
    for n in ns:
        fit = FIT_C_QUERY * n + FIT_C_FIXED + FIT_OVERHEAD
        w = 1.0 / fit**2
        y = fit - lin(n)
        sw, sn, snn, sy, sny = sw + w, sn + w * n, snn + w * n * n, sy + w * y, sny + w * n * y
    c_token = (sw * sny - sn * sy) / (sw * snn - sn * sn)
    t_fixed = (sy - c_token * sn) / sw
    return c_token, t_fixed


@dataclass(frozen=True)
class Drafting:
    kind: str  # eagle, ngram, draft-model, or other (priced as a draft model of relative size)
    pass_s: float = 0.0  # eagle: one draft pass
    kv_s_per_token: float = 0.0  # eagle: draft attention over the KV cache, per KV token
    per_token_s: float = 0.0  # eagle: per drafted token
    share: float = 0.0  # ngram: fraction of the verification step
    model: MeasuredGpu | None = None  # draft model: its own steps

    def seconds(self, gamma: int, seqs: float, ctx: float, verify_s: float, armed: bool = False) -> float:
        """Drafting `gamma` tokens; `armed` (an engine in speculative mode at K = 0 of its table):
        the first draft pass runs all the same (vLLM 0.32 keeps the drafter's KV cache in sync)."""
        if gamma <= 0 and not armed:
            return 0.0
        passes = max(gamma, 1)
        if self.kind == "ngram":
            return self.share * verify_s
        if self.model is not None:
            return passes * self.model.step(seqs, seqs, ctx)
        return passes * (self.pass_s + self.per_token_s * seqs) + self.kv_s_per_token * seqs * ctx


@dataclass(frozen=True)
class MeasuredGpu:
    """One GPU type running one model in the simulated world."""

    name: str
    linear: Linear
    kv_bytes_per_token: float
    kv_bandwidth: float
    attention_flops_per_token_per_ctx: float
    attention_flops: float
    c_token: float
    t_fixed: float
    weight_flops_per_token: float
    peak_flops: float
    salt: int  # per GPU type: its own noise stream
    # The simulator's hot path asks for integer query tokens again and again: the linear layers
    # tabulated per token count.
    _linear_at: list[float] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._linear_at.extend(self.linear(float(n)) for n in range(_TABULATED))

    def step(self, n_tokens: float, n_seqs: float, ctx: float) -> float:
        """The expected step: what the GPU does on average in this configuration."""
        if n_seqs <= 0:
            return 0.0
        kv = n_seqs * ctx * self.kv_bytes_per_token / self.kv_bandwidth
        attention = n_tokens * self.attention_flops_per_token_per_ctx * ctx / self.attention_flops
        n = int(n_tokens)
        linear = self._linear_at[n] if n == n_tokens and n < _TABULATED else self.linear(n_tokens)
        return linear + (kv if kv > attention else attention) + self.c_token * n_tokens + self.t_fixed

    def jitter(self, draw: int) -> float:
        """The factor a run of steps takes off the expected step: draw number `draw` of this GPU
        type's noise, mean 1, spread `NOISE`. A function of the draw, not of the configuration, so
        that runs are reproducible and nobody, the oracle included, can choose a configuration for
        its luck."""
        return _noise(self.salt, draw)

    def prefill(self, tokens: float, n_new: int) -> float:
        """A prefill step of `tokens` prompt tokens over `n_new` new sequences (compute-bound)."""
        ctx = tokens / n_new
        attention = tokens * self.attention_flops_per_token_per_ctx * ctx / 2 / self.attention_flops
        n = int(tokens)
        linear = self._linear_at[n] if n == tokens and n < _TABULATED else self.linear(tokens)
        return linear + attention + self.t_fixed

    def tensor_activity(self, n_tokens: float, ctx: float, step_s: float) -> float:
        """What DCGM's tensor-pipe activity reads: the query tokens' FLOPs at peak, over the step."""
        if step_s <= 0:
            return 0.0
        flops = n_tokens * (self.weight_flops_per_token + self.attention_flops_per_token_per_ctx * ctx)
        return min(1.0, flops / self.peak_flops / step_s)


def _noise(salt: int, draw: int) -> float:
    """exp(N(0, NOISE²))-like factor, a pure function of (salt, draw) (splitmix64 hash)."""
    x = (salt * 0x9E3779B97F4A7C15 + draw * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    u = ((x >> 11) + 0.5) / float(1 << 53)  # uniform in (0, 1)
    # A triangular approximation of a normal (sum of two uniforms), scaled to the spread.
    v = (((x & 0x7FF) + 0.5) / 2048.0 + u - 1.0) * math.sqrt(6.0)
    return 1.0 + NOISE * v


def measured_gpu(gpu: GpuSpec, model: ModelSpec) -> MeasuredGpu:
    """The simulated world's `gpu` running `model` at TP 1."""
    c_token, t_fixed = _host_costs()
    linear = linear_for(gpu, model.params)
    weight_flops = 2.0 * model.params
    kv_bandwidth = FIT_KV_BYTES / FIT_C_KV * gpu.mem_bandwidth / FIT_H100_BANDWIDTH
    return MeasuredGpu(
        name=gpu.name,
        linear=linear,
        kv_bytes_per_token=model.kv_bytes_per_token,
        kv_bandwidth=kv_bandwidth,
        attention_flops_per_token_per_ctx=4.0 * model.layers * model.hidden,
        attention_flops=linear.large_batch_flops(weight_flops),
        c_token=c_token,
        t_fixed=t_fixed,
        weight_flops_per_token=weight_flops,
        peak_flops=gpu.peak_flops,
        salt=sum(ord(ch) * 131**i for i, ch in enumerate(gpu.name)) & 0xFFFFFFFF,
    )


def drafting_for(drafter: DrafterSpec, gpu: GpuSpec, draft_model: ModelSpec | None = None) -> Drafting:
    scale = FIT_H100_BANDWIDTH / gpu.mem_bandwidth  # drafting streams small weights: bandwidth-bound
    if drafter.kind == "ngram":
        return Drafting("ngram", share=FIT_NGRAM_SHARE)
    if drafter.kind in ("eagle", "medusa", "mtp"):
        return Drafting(
            "eagle",
            pass_s=FIT_DRAFT_FIXED / FIT_DRAFT_PASSES * scale,
            kv_s_per_token=FIT_DRAFT_KV * scale,
            per_token_s=FIT_DRAFT_PER_TOKEN * scale,
        )
    if draft_model is None:
        raise ValueError(f"drafter {drafter.name}: a draft model's world needs its model card")
    return Drafting("draft-model", model=measured_gpu(gpu, draft_model))
