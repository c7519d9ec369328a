"""Learning a GPU's step-time coefficients from the engines that run on it (online calibration).

An engine in plain decode reports, through Prometheus, how many sequences it runs and how long a
step takes: each such reading is a measurement of the GPU's step time at (batch, context, 1 query
token), on that GPU type and target model. `learn` fits the profile's free coefficients to those
points (`calibration.fit`), holds a quarter of them out to compare the fit with the shipped profile
on data neither saw, and asks `identification.identify` what the data pin.

What a decision may use, per (GPU type, model) (`choose`):

- the learned coefficients, only where they are identified (the compute ridge, or both the
  bandwidth and compute efficiencies, pinned to within `identification.RIDGE_IDENTIFIED_RATIO`) and beat
  the shipped profile on the held-out points. Plain traffic below the ridge says little about the
  compute ceiling speculation runs into: there it stays unidentified, which is the honest answer;
- elsewhere the shipped profile, its observed error widening the self-benefit margin (never
  narrowing it: `extra_margin` ≥ 0, at most `MAX_EXTRA_MARGIN`).

An administrator may pin either (`use`: "shipped" or "learned") or freeze what was learned; a pin to
"learned" where nothing was fitted falls back to the shipped profile and says so.

Pure: plain data in, plain data out (no clock: the caller passes the time).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from sovereignspec.core.calibration import Fit, Measurement, errors_of_spec, errors_on, fit
from sovereignspec.core.identification import RIDGE_IDENTIFIED_RATIO, identify
from sovereignspec.core.specs import GpuSpec, ModelSpec, ProfileSet

# Fewer points than this fit nothing: five coefficients and a held-out quarter need some data.
MIN_POINTS = 12
# A window keeps at most this many points (the newest), so a fit stays a fraction of a second.
MAX_POINTS = 240
# Every HOLD_OUT-th point (in batch order) is held out of the fit to judge it.
HOLD_OUT = 4
# Readings from one narrow band of batches pin a profile there and nowhere else: the largest batch
# read must be at least this many times the smallest for what was learned to price decisions.
MIN_BATCH_SPAN = 16.0
# The observed error widens the margin by at most this much: past it the profile is not
# mispricing a GPU, it is pricing another one, and plain decode is what the margin then gives.
MAX_EXTRA_MARGIN = 0.5

Use = Literal["auto", "shipped", "learned"]
USES: tuple[Use, ...] = ("auto", "shipped", "learned")


@dataclass(frozen=True)
class Point:
    """One engine's plain-decode step: `batch` sequences of `context` tokens took `step_s`, read
    at `at` (unix seconds) from `source` (namespace/owner)."""

    batch: float
    context: float
    step_s: float
    at: float
    source: str = ""

    def valid(self) -> bool:
        values = (self.batch, self.context, self.step_s, self.at)
        return all(math.isfinite(v) for v in values) and self.batch >= 1.0 and min(values[1:3]) > 0.0


def windowed(
    points: Sequence[Point], new: Iterable[Point], now: float, window_s: float, limit: int = MAX_POINTS
) -> tuple[tuple[Point, ...], int]:
    """The points of the last `window_s` seconds, `new` added, at most `limit` (the newest), and how
    many of `new` were refused (not finite, a batch below one, a step or context not positive, or
    read in the future)."""
    refused = 0
    kept = [p for p in points if now - window_s <= p.at <= now]
    for p in new:
        if not p.valid() or p.at > now:
            refused += 1
            continue
        kept.append(p)
    kept.sort(key=lambda p: p.at)
    return tuple(kept[-limit:]), refused


@dataclass(frozen=True)
class Learned:
    """What the points of one (GPU type, model) say, and whether they say enough."""

    points: int
    fitted: Fit | None  # None: too few points to fit
    held_out_rms: float | None  # the fit's RMS relative error on the held-out points
    shipped_rms: float | None  # the shipped profile's, on the same held-out points
    shipped_rms_all: float | None  # the shipped profile's on every point (what widens the margin)
    identified: bool
    intervals: dict[str, tuple[float | None, float | None]]  # per coefficient: 95 % interval
    why: str  # one line: what the data pin, or why not

    @classmethod
    def unfitted(cls, points: int, why: str) -> Learned:
        """Nothing fitted (too few points, or a fit that failed): nothing to price with."""
        return cls(points, None, None, None, None, False, {}, why)

    @property
    def beats_shipped(self) -> bool:
        return (
            self.held_out_rms is not None
            and self.shipped_rms is not None
            and self.held_out_rms < self.shipped_rms
        )


def learn(shipped: GpuSpec, model: ModelSpec, tp: int, points: Sequence[Point]) -> Learned:
    """Fit the coefficients of `shipped` to `points` of `model` at tensor parallelism `tp`."""
    rows = [Measurement(p.batch, p.context, 1.0, p.step_s) for p in sorted(points, key=_order)]
    if len(rows) < MIN_POINTS:
        return Learned.unfitted(len(rows), f"{len(rows)} points, {MIN_POINTS} needed to fit")
    held = rows[HOLD_OUT - 1 :: HOLD_OUT]
    fitted_rows = [r for i, r in enumerate(rows) if i % HOLD_OUT != HOLD_OUT - 1]
    result = fit(shipped, model, tp, fitted_rows)
    held_rms, _ = errors_on(result, shipped, model, tp, held)
    shipped_rms, _ = errors_of_spec(shipped, model, tp, held)
    shipped_all, _ = errors_of_spec(shipped, model, tp, rows)
    ident = identify(result, shipped, model, tp, fitted_rows)
    intervals = {name: (i.low, i.high) for name, i in ident.coefficients.items()}
    pinned = [n for n in ("bandwidth_efficiency", "compute_efficiency")
              if ident.coefficients[n].pinned(RIDGE_IDENTIFIED_RATIO)]  # fmt: skip
    batches = [p.batch for p in points]
    narrow = max(batches) < MIN_BATCH_SPAN * min(batches)
    identified = (ident.ridge_identified or len(pinned) == 2) and not narrow
    if narrow:
        # Pinned where the readings are, and extrapolated everywhere else: a table prices every
        # batch from 1 to the declared one, which readings from one narrow band do not measure.
        why = f"not identified: batches {_span(batches)} span less than {MIN_BATCH_SPAN:g}x"
    elif ident.ridge_identified:
        why = "the compute ridge is pinned"
    elif identified:
        why = "bandwidth and compute efficiency pinned"
    else:
        open_ = [n for n in ("bandwidth_efficiency", "compute_efficiency") if n not in pinned]
        why = f"not identified: {', '.join(open_)} left open by batches {_span(batches)}"
    return Learned(len(rows), result, held_rms, shipped_rms, shipped_all, identified, intervals, why)


def _order(p: Point) -> tuple[float, float, float]:
    return (p.batch, p.context, p.at)


def _span(batches: Iterable[float]) -> str:
    b = sorted(batches)
    return f"{b[0]:g}-{b[-1]:g}" if b else "none"


@dataclass(frozen=True)
class InForce:
    """What decisions on one (GPU type, model) use: the GPU's spec, the margin added to the
    policy's self-benefit margin, and why (for a check message)."""

    gpu: GpuSpec
    learned: bool
    extra_margin: float
    why: str


def choose(shipped: GpuSpec, learned: Learned | None, use: Use = "auto") -> InForce:
    """The profile a decision prices with (see the module's docstring)."""
    if use == "shipped" or learned is None:
        why = "shipped profile, pinned by its LearnedProfile" if use == "shipped" else "shipped profile"
        return InForce(shipped, False, 0.0, why)
    fitted = learned.fitted
    if fitted is None:
        return InForce(shipped, False, 0.0, f"shipped profile (learned: {learned.why})")
    if use == "learned" or (learned.identified and learned.beats_shipped):
        how = "pinned by its LearnedProfile" if use == "learned" else learned.why
        errors = _pct(learned.held_out_rms), _pct(learned.shipped_rms)
        why = f"learned profile ({how}; held-out error {errors[0]} against the shipped {errors[1]})"
        return InForce(_with_interval(fitted.apply(shipped), learned), True, 0.0, why)
    extra = min(max(learned.shipped_rms_all or 0.0, 0.0), MAX_EXTRA_MARGIN)
    reason = learned.why if not learned.identified else (
        f"fits no better than the shipped profile on held-out points "
        f"({_pct(learned.held_out_rms)} against {_pct(learned.shipped_rms)})"
    )  # fmt: skip
    why = f"shipped profile, margin widened by {extra:.2f} by its observed error (learned: {reason})"
    return InForce(shipped, False, extra, why)


def _with_interval(gpu: GpuSpec, learned: Learned) -> GpuSpec:
    """`gpu` with the learned compute efficiency's 95 % interval, as a shipped profile carries its
    calibration's (`profiles.GpuProfile.compute_efficiency_range`): decisions near the ridge take
    its low end. An open side is the estimate itself (nothing the data show to be cautious about)."""
    ce = gpu.compute_efficiency
    low, high = learned.intervals.get("compute_efficiency", (None, None))
    return replace(
        gpu,
        compute_efficiency_low=ce if low is None else min(low, ce),
        compute_efficiency_high=ce if high is None else max(high, ce),
    )


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def with_learning(profiles: ProfileSet, in_force: Mapping[tuple[str, str], InForce]) -> ProfileSet:
    """`profiles` as decisions price with them, per (GPU type, model): the learned GPU where in
    force, the margin the shipped profile's observed error adds where not."""
    learned = {key: f.gpu for key, f in in_force.items() if f.learned}
    extra = {key: f.extra_margin for key, f in in_force.items() if f.extra_margin > 0.0}
    # A check message says how a profile priced only where the engines changed something.
    pricing = {key: f.why for key, f in in_force.items() if f.learned or f.extra_margin > 0.0}
    return replace(profiles, learned=learned, extra_margin=extra, pricing=pricing)
