"""Fitting a GPU's step-time coefficients to measured step times.

A measurement is one engine step: `batch` sequences of mean `context` tokens, `query_tokens` query
tokens per sequence (1 for plain decode, γ+1 when verifying γ drafts) and the step's wall time;
optionally the drafting time of that step. The fit finds the GPU's bandwidth and compute
efficiencies, its fixed per-step cost, the serial fraction κ and the overlap exponent p of
`roofline` (see its docstring for the formula) that minimise the squared relative error.

A measurement may also be of the linear layers alone (`part="linear"`: vidur's kernel profiles by
query tokens, no attention, LM head, sampling or host work), which reach thousands of query tokens
per step and so the compute-bound region that decode steps at batch 1-64 never see: they pin the
compute efficiency, and with it the ridge. Their fixed cost is the glue kernels' (norms, rotary,
activation, adds), a cost per layer of its own.

The model is linear in the fixed costs, so those are solved exactly for every candidate of the
other four; those are found by a coarse grid, then refined by Nelder–Mead. `identify` then profiles
each of the four (the fit redone with it held at each point of a grid) for its 95 % interval, and
the ridge's. Deterministic, numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from sovereignspec.core.roofline import roofline_for, smooth_max
from sovereignspec.core.simplex import nelder_mead
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
    part: str = "step"  # "step": the whole step; "linear": the linear layers and their glue only
    params: float | None = None  # linear rows: the linear layers' parameters (no embedding, LM head)
    layers: int | None = None  # linear rows: the layers those parameters are in
    tp: int | None = None  # tensor parallelism measured, when not the calibration's

    def __post_init__(self) -> None:
        if self.part not in PARTS:
            raise ValueError(f"part {self.part!r}: accepted: {', '.join(PARTS)}")
        if self.part == "linear" and (not self.params or not self.layers or self.params <= 0):
            raise ValueError(f"a linear-layers row needs params > 0 and layers > 0; got {self}")


PARTS = ("step", "linear")


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
    glue_per_layer_s: float = 0.0  # linear rows' fixed cost per layer (0 without linear rows)
    part_rms_error: tuple[tuple[str, float], ...] = ()  # per part present: relative RMS error
    sse: float = 0.0  # the objective at the optimum: sum of squared relative errors

    @property
    def coefficients(self) -> tuple[float, float, float, float]:
        return (self.bandwidth_efficiency, self.compute_efficiency, self.serial_fraction, self.overlap)

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
        roofs = [roofline_for(gpu, m, r.tp or tp) for m, r in zip(models, rows, strict=True)]
        linear = np.array([r.part == "linear" for r in rows], dtype=np.bool_)
        s = np.array([r.batch for r in rows], dtype=np.float64)
        ctx = np.array([r.context for r in rows], dtype=np.float64)
        n = s * np.array([r.query_tokens for r in rows], dtype=np.float64)

        def per_row(field: str) -> Array:
            return np.array([float(getattr(r, field)) for r in roofs], dtype=np.float64)

        # A linear-layers row: its own parameters on its own TP degree, no attention, no KV.
        layer_params = np.array([(r.params or 0.0) / (r.tp or tp) for r in rows], dtype=np.float64)
        bytes_per_param = np.array([m.bytes_per_param for m in models], dtype=np.float64)
        weight_bytes = np.where(linear, layer_params * bytes_per_param, per_row("weight_bytes"))
        gemm_flops = np.where(linear, 2.0 * layer_params, per_row("weight_flops_per_token"))

        self.measured = np.array([r.step_s for r in rows], dtype=np.float64)
        # At 100 % of the datasheet: seconds of weight streaming, of KV reads and of compute.
        self.weights = weight_bytes / gpu.mem_bandwidth
        self.kv = np.where(linear, 0.0, s * ctx * per_row("kv_bytes_per_token") / gpu.mem_bandwidth)
        self.gemm = n * gemm_flops / gpu.peak_flops
        self.attention = np.where(
            linear, 0.0, n * (per_row("attention_flops_per_token_per_ctx") * ctx) / gpu.peak_flops
        )
        # The fixed costs' regressors: a whole step's fixed cost, once per step; the linear rows'
        # glue kernels, once per layer.
        self.regressors = np.stack(
            [np.where(linear, 0.0, 1.0), np.where(linear, [float(r.layers or 0) for r in rows], 0.0)]
        )
        self.allreduce_s = float(roofline_for(gpu, models[0], tp).fixed_s) - gpu.step_overhead_s

    def variable(self, be: Array, ce: Array, kappa: Array, p: Array) -> Array:
        """Everything but the fixed costs, for K candidates (each argument (K, 1)) → (K, rows)."""
        gemm = self.gemm / ce
        streamed = self.weights / be + kappa * gemm
        return np.asarray(
            smooth_max(self.kv / be, self.attention / ce, p) + smooth_max(streamed, gemm, p),
            dtype=np.float64,
        )

    def solve(self, variable: Array) -> tuple[Array, Array]:
        """(fixed costs ≥ 0: per step and per glue layer, (K, 2); sum of squared relative errors, (K,)).

        Each row has one regressor, so each fixed cost is the weighted least squares of its rows."""
        w = 1.0 / self.measured**2
        x = self.regressors
        denom = np.maximum((w * x * x).sum(axis=-1), 1e-300)
        fixed = np.maximum(np.einsum("gr,kr->kg", w * x, self.measured - variable) / denom, 0.0)
        err = ((fixed @ x + variable - self.measured) / self.measured) ** 2
        return fixed, err.sum(axis=-1)

    def predict(self, coefficients: tuple[float, float, float, float], fixed: Array) -> Array:
        v = self.variable(*(np.array([[c]]) for c in coefficients))[0]
        return np.asarray(fixed @ self.regressors + v, dtype=np.float64)


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


def _models_for(
    model: ModelSpec, rows: Sequence[Measurement], others: dict[str, ModelSpec] | None, tp: int
) -> list[ModelSpec]:
    if len(rows) < 5:
        raise ValueError(f"calibration needs at least 5 measurements, got {len(rows)}")
    bad = [r for r in rows if min(r.batch, r.context, r.query_tokens, r.step_s) <= 0]
    if bad:
        raise ValueError(f"batch, context, query tokens and step time must be > 0; got {bad[0]}")
    # One fixed cost per step holds the all-reduces of one TP degree: whole steps share it.
    off = [r for r in rows if r.part == "step" and r.tp not in (None, tp)]
    if off:
        raise ValueError(f"whole-step rows must be at the calibration's TP {tp}; got {off[0]}")
    if not any(r.part == "step" for r in rows):
        raise ValueError("calibration needs whole-step rows (part step); got only linear-layer rows")
    return _row_models(model, rows, others, "the measurements")


def _row_models(
    model: ModelSpec, rows: Sequence[Measurement], others: dict[str, ModelSpec] | None, where: str
) -> list[ModelSpec]:
    """Each row's model: its own (looked up in `others`) or the calibration's."""
    known = {model.name: model, **(others or {})}
    unknown = sorted({r.model for r in rows if r.model and r.model not in known})
    if unknown:
        raise ValueError(f"unknown model(s) in {where}: {unknown}; accepted: {sorted(known)}")
    return [known[r.model] if r.model else model for r in rows]


def _optimum(terms: _Terms, start: Array, objective: Callable[[Array], float]) -> Array:
    x = nelder_mead(objective, start)
    return nelder_mead(objective, x, step=0.1)  # a restart shakes off a collapsed simplex


def fit(
    gpu: GpuSpec,
    model: ModelSpec,
    tp: int,
    rows: Sequence[Measurement],
    others: dict[str, ModelSpec] | None = None,
) -> Fit:
    """Fit `gpu`'s coefficients to `rows` measured with `model` (or the row's own model, looked
    up in `others`) at tensor parallelism `tp`."""
    models = _models_for(model, rows, others, tp)
    terms = _Terms(gpu, models, tp, rows)

    best = _grid_start(terms)

    def objective(x: Array) -> float:
        v = terms.variable(*(np.array([[c]]) for c in _unpack(x)))
        return float(terms.solve(v)[1][0])

    coefficients = _unpack(_optimum(terms, _pack(*best), objective))
    be, ce, kappa, p = coefficients
    v = terms.variable(*(np.array([[c]]) for c in coefficients))
    fixed_arr, sse_arr = terms.solve(v)
    fixed, glue = (float(f) for f in fixed_arr[0])
    predicted = fixed_arr[0] @ terms.regressors + v[0]
    rel = np.abs(predicted - terms.measured) / terms.measured
    parts = np.array([r.part for r in rows])
    part_rms = tuple(
        (part, float(np.sqrt(np.mean(rel[parts == part] ** 2)))) for part in PARTS if (parts == part).any()
    )

    draft_cost = _draft_cost(gpu, tp, rows, models, fixed, coefficients)

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
        glue_per_layer_s=glue,
        part_rms_error=part_rms,
        sse=float(sse_arr[0]),
    )


def _grid_start(terms: _Terms) -> tuple[float, float, float, float]:
    """The best point of a coarse grid over the four nonlinear coefficients (the fixed costs solved
    for each candidate): where the simplex starts."""
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
    return best[1]


def _draft_cost(
    gpu: GpuSpec,
    tp: int,
    rows: Sequence[Measurement],
    models: Sequence[ModelSpec],
    fixed: float,
    coefficients: tuple[float, float, float, float],
) -> float | None:
    """Relative cost c of one drafted token from the rows that timed their drafts: draft time =
    γ·c·T(1, 1, L), least squares (a draft pass is priced against the batch-1 step at the row's
    context: core/speedup.py); None without such rows."""
    drafted = [(r, m) for r, m in zip(rows, models, strict=True) if r.draft_s is not None]
    if not drafted:
        return None
    single = [replace(r, batch=1.0, query_tokens=1.0) for r, _ in drafted]
    plain = _Terms(gpu, [m for _, m in drafted], tp, single)
    t_single = fixed + plain.variable(*(np.array([[c]]) for c in coefficients))[0]
    gammas = np.array([r.query_tokens - 1.0 for r, _ in drafted])
    x_col, _ = speculation_terms(gammas, 1.0, 0.0, t_single, 0.0)  # the drafting term at c = 1
    y = np.array([r.draft_s for r, _ in drafted], dtype=np.float64)
    return float(x_col @ y / (x_col @ x_col)) if float(x_col @ x_col) > 0 else None


def errors_on(
    result: Fit,
    gpu: GpuSpec,
    model: ModelSpec,
    tp: int,
    rows: Sequence[Measurement],
    others: dict[str, ModelSpec] | None = None,
) -> tuple[float, float]:
    """(RMS, largest) relative error of the fitted coefficients on `rows` (data not fitted): each
    row priced with the fit's fixed cost per step or glue cost per layer, nothing refitted."""
    models = _row_models(model, rows, others, "the held-out data")
    terms = _Terms(gpu, models, tp, rows)
    predicted = terms.predict(result.coefficients, np.array([result.fixed_s, result.glue_per_layer_s]))
    rel = np.abs(predicted - terms.measured) / terms.measured
    return float(np.sqrt(np.mean(rel**2))), float(rel.max())


def errors_of_spec(
    gpu: GpuSpec, model: ModelSpec, tp: int, rows: Sequence[Measurement]
) -> tuple[float, float]:
    """(RMS, largest) relative error of `gpu`'s own coefficients and fixed cost on `rows`: the
    profile as it stands, against data, nothing fitted."""
    models = _row_models(model, rows, None, "the data")
    terms = _Terms(gpu, models, tp, rows)
    fixed = float(roofline_for(gpu, model, tp).fixed_s)
    coefficients = (gpu.bandwidth_efficiency, gpu.compute_efficiency, gpu.serial_fraction, gpu.overlap)
    predicted = terms.predict(coefficients, np.array([fixed, 0.0]))
    rel = np.abs(predicted - terms.measured) / terms.measured
    return float(np.sqrt(np.mean(rel**2))), float(rel.max())


# The fitted coefficients and their bounds (what `identification` profiles).
COEFFICIENTS = ("bandwidth_efficiency", "compute_efficiency", "serial_fraction", "overlap")
_BOUNDS = ((0.05, 1.0), (0.01, 1.0), (0.0, 1.0), (1.0, MAX_OVERLAP))
BOUNDS = dict(zip(COEFFICIENTS, _BOUNDS, strict=True))  # each coefficient's (low, high) in the fit
