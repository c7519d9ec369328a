"""Fitting a GPU's step-time coefficients to measured step times.

A measurement is one engine step: `batch` sequences of mean `context` tokens, `query_tokens` query
tokens per sequence (1 for plain decode, γ+1 when verifying γ drafts) and the step's wall time;
optionally the drafting time of that step. The fit finds the GPU's bandwidth and compute
efficiencies, its fixed per-step cost, the serial fraction κ and the overlap exponent p of
`roofline` (see its docstring for the formula) that minimise the squared relative error.

The model is linear in the fixed cost, so that is solved exactly for every candidate of the other
four; those are found by a coarse grid, then refined by Nelder–Mead. Deterministic, numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from sovereignspec.core.roofline import roofline_for, smooth_max
from sovereignspec.core.specs import GpuSpec, ModelSpec
from sovereignspec.core.speedup import speculation_terms

Array = NDArray[np.float64]

_OVERLAP_GRID = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0, 64.0)
MAX_OVERLAP = 64.0


@dataclass(frozen=True)
class Measurement:
    batch: float
    context: float
    query_tokens: float  # per sequence
    step_s: float
    draft_s: float | None = None
    model: str | None = None  # the target model measured, when not the calibration's default


@dataclass(frozen=True)
class Fit:
    """Fitted coefficients (in the profile's terms) and how well they reproduce the data."""

    bandwidth_efficiency: float
    compute_efficiency: float
    step_overhead_s: float  # fixed cost less the tensor-parallel all-reduces
    fixed_s: float  # the whole fixed cost per step at the measured TP degree
    serial_fraction: float
    overlap: float
    rms_error: float  # relative
    max_error: float  # relative
    predicted_s: tuple[float, ...]
    drafter_relative_cost: float | None  # per drafted token, against the batch-1 step, when draft_s given

    def apply(self, gpu: GpuSpec) -> GpuSpec:
        return replace(
            gpu,
            bandwidth_efficiency=self.bandwidth_efficiency,
            compute_efficiency=self.compute_efficiency,
            step_overhead_s=self.step_overhead_s,
            serial_fraction=self.serial_fraction,
            overlap=self.overlap,
        )


class _Terms:
    """The per-row quantities that do not depend on the fitted coefficients."""

    def __init__(
        self, gpu: GpuSpec, models: Sequence[ModelSpec], tp: int, rows: Sequence[Measurement]
    ) -> None:
        roofs = [roofline_for(gpu, m, tp) for m in models]
        s = np.array([r.batch for r in rows], dtype=np.float64)
        ctx = np.array([r.context for r in rows], dtype=np.float64)
        n = s * np.array([r.query_tokens for r in rows], dtype=np.float64)

        def per_row(field: str) -> Array:
            return np.array([float(getattr(r, field)) for r in roofs], dtype=np.float64)

        self.measured = np.array([r.step_s for r in rows], dtype=np.float64)
        # At 100 % of the datasheet: seconds of weight streaming, of KV reads and of compute.
        self.weights = per_row("weight_bytes") / gpu.mem_bandwidth
        self.kv = s * ctx * per_row("kv_bytes_per_token") / gpu.mem_bandwidth
        self.gemm = n * per_row("weight_flops_per_token") / gpu.peak_flops
        self.attention = n * (per_row("attention_flops_per_token_per_ctx") * ctx) / gpu.peak_flops
        self.allreduce_s = float(roofs[0].fixed_s) - gpu.step_overhead_s

    def variable(self, be: Array, ce: Array, kappa: Array, p: Array) -> Array:
        """Everything but the fixed cost, for K candidates (each argument (K, 1)) → (K, rows)."""
        gemm = self.gemm / ce
        streamed = self.weights / be + kappa * gemm
        return np.asarray(
            smooth_max(self.kv / be, self.attention / ce, p) + smooth_max(streamed, gemm, p),
            dtype=np.float64,
        )

    def solve(self, variable: Array) -> tuple[Array, Array]:
        """(fixed cost ≥ 0, sum of squared relative errors) per candidate."""
        w = 1.0 / self.measured**2
        fixed = np.maximum(((self.measured - variable) * w).sum(axis=-1) / w.sum(), 0.0)
        err = ((fixed[..., None] + variable - self.measured) / self.measured) ** 2
        return fixed, err.sum(axis=-1)


def _unpack(x: Array) -> tuple[float, float, float, float]:
    """Unbounded optimiser coordinates → (bandwidth eff., compute eff., κ, p) within their bounds."""
    sig = 1.0 / (1.0 + np.exp(-x))
    return (
        float(0.05 + 0.95 * sig[0]),
        float(0.01 + 0.99 * sig[1]),
        float(sig[2]),
        float(1.0 + (MAX_OVERLAP - 1.0) * sig[3]),
    )


def _pack(be: float, ce: float, kappa: float, p: float) -> Array:
    def logit(v: float) -> float:
        v = min(max(v, 1e-6), 1 - 1e-6)
        return math.log(v / (1 - v))

    return np.array(
        [
            logit((be - 0.05) / 0.95),
            logit((ce - 0.01) / 0.99),
            logit(kappa),
            logit((p - 1.0) / (MAX_OVERLAP - 1.0)),
        ]
    )


def nelder_mead(f: Callable[[Array], float], x0: Array, step: float = 0.5, iters: int = 400) -> Array:
    """Minimise `f` from `x0` (the textbook method: reflect, expand, contract, shrink)."""
    dim = len(x0)
    simplex = [x0] + [x0 + step * np.eye(dim)[i] for i in range(dim)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) <= 1e-14 * (1.0 + abs(values[0])):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        worst = simplex[-1]
        reflected = centroid + (centroid - worst)
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - worst)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (worst - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best + 0.5 * (x - best) for x in simplex]
                values = [f(x) for x in simplex]
    return np.asarray(simplex[int(np.argmin(values))], dtype=np.float64)


def fit(
    gpu: GpuSpec,
    model: ModelSpec,
    tp: int,
    rows: Sequence[Measurement],
    others: dict[str, ModelSpec] | None = None,
) -> Fit:
    """Fit `gpu`'s coefficients to `rows` measured with `model` (or the row's own model, looked
    up in `others`) at tensor parallelism `tp`."""
    if len(rows) < 5:
        raise ValueError(f"calibration needs at least 5 measurements, got {len(rows)}")
    bad = [r for r in rows if min(r.batch, r.context, r.query_tokens, r.step_s) <= 0]
    if bad:
        raise ValueError(f"batch, context, query tokens and step time must be > 0; got {bad[0]}")
    known = {model.name: model, **(others or {})}
    unknown = sorted({r.model for r in rows if r.model and r.model not in known})
    if unknown:
        raise ValueError(f"unknown model(s) in the measurements: {unknown}; accepted: {sorted(known)}")
    models = [known[r.model] if r.model else model for r in rows]
    terms = _Terms(gpu, models, tp, rows)

    # Coarse grid over the four nonlinear coefficients, the fixed cost solved for each candidate.
    be_axis = np.linspace(0.3, 1.0, 29)
    ce_axis = np.geomspace(0.05, 1.0, 31)
    kappa_axis = np.linspace(0.0, 1.0, 11)
    best: tuple[float, tuple[float, float, float, float]] = (math.inf, (0.8, 0.7, 0.0, 4.0))
    grid = [a.reshape(-1, 1) for a in np.meshgrid(be_axis, ce_axis, kappa_axis, indexing="ij")]
    for overlap in _OVERLAP_GRID:
        _, sse = terms.solve(terms.variable(grid[0], grid[1], grid[2], np.full_like(grid[0], overlap)))
        i = int(np.argmin(sse))
        if sse[i] < best[0]:
            best = (
                float(sse[i]),
                (float(grid[0][i, 0]), float(grid[1][i, 0]), float(grid[2][i, 0]), overlap),
            )

    def objective(x: Array) -> float:
        be, ce, kappa, p = _unpack(x)
        v = terms.variable(*(np.array([[c]]) for c in (be, ce, kappa, p)))
        return float(terms.solve(v)[1][0])

    x = nelder_mead(objective, _pack(*best[1]))
    x = nelder_mead(objective, x, step=0.1)  # a restart shakes off a collapsed simplex
    be, ce, kappa, p = _unpack(x)
    v = terms.variable(*(np.array([[c]]) for c in (be, ce, kappa, p)))
    fixed_arr, _ = terms.solve(v)
    fixed = float(fixed_arr[0])
    predicted = fixed + v[0]
    rel = np.abs(predicted - terms.measured) / terms.measured

    draft_cost = None
    drafted = [(r, p_s) for r, p_s in zip(rows, predicted, strict=True) if r.draft_s is not None]
    if drafted:
        # Relative cost c of one drafted token: draft time = γ·c·T(1, 1, L), least squares (a draft
        # pass is priced against the batch-1 step at the row's context: core/speedup.py).
        drafted_models = [known[r.model] if r.model else model for r, _ in drafted]
        single = [replace(r, batch=1.0, query_tokens=1.0) for r, _ in drafted]
        plain = _Terms(gpu, drafted_models, tp, single)
        t_single = fixed + plain.variable(*(np.array([[c]]) for c in (be, ce, kappa, p)))[0]
        gammas = np.array([r.query_tokens - 1.0 for r, _ in drafted])
        x_col, _ = speculation_terms(gammas, 1.0, 0.0, t_single, 0.0)  # the drafting term at c = 1
        y = np.array([r.draft_s for r, _ in drafted], dtype=np.float64)
        if float(x_col @ x_col) > 0:
            draft_cost = float(x_col @ y / (x_col @ x_col))

    return Fit(
        bandwidth_efficiency=be,
        compute_efficiency=ce,
        step_overhead_s=max(fixed - terms.allreduce_s, 0.0),
        fixed_s=fixed,
        serial_fraction=kappa,
        overlap=p,
        rms_error=float(np.sqrt(np.mean(rel**2))),
        max_error=float(rel.max()),
        predicted_s=tuple(float(x) for x in predicted),
        drafter_relative_cost=draft_cost,
    )
