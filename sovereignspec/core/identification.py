"""What a calibration's data identify: a 95 % profile-likelihood interval for each fitted
coefficient, and the compute ridge over the same region (pure, numpy only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from sovereignspec.core.calibration import (
    _BOUNDS,
    COEFFICIENTS,
    Array,
    Fit,
    Measurement,
    _models_for,
    _optimum,
    _pack,
    _Terms,
    _unpack,
)
from sovereignspec.core.roofline import roofline_for
from sovereignspec.core.specs import GpuSpec, ModelSpec

# A measured step time is taken to be known to 2 % (run-to-run spread of a step at one batch; the
# simulated world's is 3 %) however closely a fit reproduces it: a fit to a formula's own grid
# (0.0 % error) must not make every other coefficient look pinned.
MEASUREMENT_NOISE = 0.02
CHI2_95_1DOF = 3.841  # the 95 % quantile of χ² with one degree of freedom
# The ridge is identified when the data pin it to within this ratio (high / low) at each context.
RIDGE_IDENTIFIED_RATIO = 1.5
_PROFILE_POINTS = 9  # per side, estimate to bound
_BISECTIONS = 4


@dataclass(frozen=True)
class Interval:
    """A 95 % profile-likelihood interval; a side is None where the data allow the bound itself."""

    estimate: float
    low: float | None
    high: float | None

    @property
    def identified(self) -> bool:
        return self.low is not None and self.high is not None

    def pinned(self, ratio: float) -> bool:
        """Both sides known, and either both infinite or within `ratio` of each other."""
        if self.low is None or self.high is None:
            return False
        if math.isinf(self.low) and math.isinf(self.high):
            return True
        return not math.isinf(self.high) and self.high <= ratio * self.low


@dataclass(frozen=True)
class Identification:
    """Per coefficient, the interval the data allow; the ridge (`Roofline.ridge_seqs`: plain
    sequences where compute time reaches memory time, inf where none does) per model and context
    over the same region; whether every ridge is pinned (`RIDGE_IDENTIFIED_RATIO`; a ridge past
    the KV capacity counts as the capacity, which no load passes)."""

    coefficients: dict[str, Interval]
    ridge_seqs: dict[tuple[str, int], Interval]
    threshold_sse: float
    ridge_identified: bool


def identify(
    result: Fit,
    gpu: GpuSpec,
    model: ModelSpec,
    tp: int,
    rows: Sequence[Measurement],
    others: dict[str, ModelSpec] | None = None,
    contexts: Sequence[int] = (1024, 4096),
    ridge_models: Sequence[ModelSpec] = (),
) -> Identification:
    """Profile likelihood: each coefficient held at each point of a grid over its bounds while the
    others are refitted. Its interval is where the objective stays within χ²(1)·σ² of the optimum,
    σ² the larger of the fit's residual variance and `MEASUREMENT_NOISE`². The ridge's interval is
    the range of ridges over every profiled point inside that region."""
    models = _models_for(model, rows, others, tp)
    terms = _Terms(gpu, models, tp, rows)
    dof = max(len(rows) - len(COEFFICIENTS) - 2, 1)
    sigma2 = max(result.sse / dof, MEASUREMENT_NOISE**2)
    threshold = result.sse + CHI2_95_1DOF * sigma2
    # Each model at the TP degree it is served with on this GPU (the calibration's model first).
    targets = [model, *(m for m in ridge_models if m.name != model.name)]
    points = [(m, int(c)) for m in targets for c in contexts]

    # Past what the KV cache holds no load reaches the ridge: there it is pinned at the capacity.
    capacity = [float(roofline_for(gpu, m).max_seqs(c)) for m, c in points]

    def ridges(coefficients: Sequence[float]) -> list[float]:
        tuned = replace(gpu, bandwidth_efficiency=coefficients[0], compute_efficiency=coefficients[1])
        return [float(roofline_for(tuned, m).ridge_seqs(c)) for m, c in points]

    inside: list[list[float]] = [ridges(result.coefficients)]

    def keep(x: Array) -> None:
        inside.append(ridges(_unpack(x)))

    intervals: dict[str, Interval] = {}
    best = _pack(*result.coefficients)
    for j, name in enumerate(COEFFICIENTS):
        lo_bound, hi_bound = _BOUNDS[j]
        estimate = result.coefficients[j]
        free = [k for k in range(len(COEFFICIENTS)) if k != j]

        profiled = _profiler(terms, result.coefficients, j)
        sides = [
            _profile_edge(profiled, estimate, bound, best[free], free, threshold, keep)
            for bound in (lo_bound, hi_bound)
        ]
        intervals[name] = Interval(estimate, sides[0], sides[1])

    ridge_intervals = _ridge_intervals(points, inside, intervals["compute_efficiency"])
    pinned = all(
        Interval(
            r.estimate,
            None if r.low is None else min(r.low, cap),
            None if r.high is None else min(r.high, cap),
        ).pinned(RIDGE_IDENTIFIED_RATIO)
        for r, cap in zip(ridge_intervals.values(), capacity, strict=True)
    )
    return Identification(intervals, ridge_intervals, threshold, pinned)


def _profiler(
    terms: _Terms, coefficients: tuple[float, float, float, float], j: int
) -> Callable[[float, Array], tuple[float, Array]]:
    """The profile of coefficient `j`: held at a value, the others refitted from `start` (in the
    fit's packed space, `j` left out); the objective there and the full packed point."""

    def profiled(value: float, start: Array) -> tuple[float, Array]:
        held = _pack(*(value if k == j else coefficients[k] for k in range(4)))[j]

        def objective(y: Array) -> float:
            x = np.insert(y, j, held)
            v = terms.variable(*(np.array([[c]]) for c in _unpack(x)))
            return float(terms.solve(v)[1][0])

        y = _optimum(terms, start, objective)
        return objective(y), np.insert(y, j, held)

    return profiled


def _profile_edge(
    profiled: Callable[[float, Array], tuple[float, Array]],
    estimate: float,
    bound: float,
    start: Array,
    free: list[int],
    threshold: float,
    keep: Callable[[Array], object],
) -> float | None:
    """One side of a coefficient's interval: walk from the estimate to the bound; the first point
    outside the region brackets the edge, which bisection then narrows. No point outside: that
    side is open (None). Every point found inside is handed to `keep`."""
    last_inside = estimate
    for value in np.linspace(estimate, bound, _PROFILE_POINTS)[1:]:
        sse, x = profiled(float(value), start)
        if sse > threshold:
            outside = float(value)
            for _ in range(_BISECTIONS):
                middle = 0.5 * (last_inside + outside)
                sse, x = profiled(middle, start)
                if sse > threshold:
                    outside = middle
                else:
                    last_inside, start = middle, x[free]
                    keep(x)
            return 0.5 * (last_inside + outside)
        start = x[free]
        last_inside = float(value)
        keep(x)
    return None


def _ridge_intervals(
    points: Sequence[tuple[ModelSpec, int]], inside: Sequence[Sequence[float]], ce: Interval
) -> dict[tuple[str, int], Interval]:
    """The ridge over every profiled point inside the region (the first is the estimate's); a side
    of the compute efficiency left open at its bound leaves the ridge's side open with it."""
    return {
        (m.name, c): Interval(
            inside[0][i],
            min(r[i] for r in inside) if ce.low is not None else None,
            max(r[i] for r in inside) if ce.high is not None else None,
        )
        for i, (m, c) in enumerate(points)
    }
