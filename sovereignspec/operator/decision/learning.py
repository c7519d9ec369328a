"""Online calibration's shell: which running engines are measurements, what the LearnedProfiles
say, and what to write back. The fitting is core.learning's; no I/O here (the controller reads the
cache and Prometheus and writes what `Learner.step` returns).

A running workload is a measurement of its GPU type's step time when it was decided plain (its
check entry's mode annotation: a light-batch speculative one runs γ = 0 at its declared batch but
drafts below it), runs its whole model on its GPUs (no pipeline stages), and its engine reports
both its running batch and its time per output event through Prometheus (`PrometheusReader.steps`,
read once per refit interval).

Administrators steer each (GPU type, model) with its LearnedProfile's spec (`use`, `frozen`); a
spec that does not parse is refused with a message and steers nothing, and a LearnedProfile that
was seen and then deleted starts its learning over.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sovereignspec.core.learning import (
    InForce,
    Learned,
    Point,
    choose,
    learn,
    windowed,
    with_learning,
)
from sovereignspec.core.roofline import tensor_parallel_for
from sovereignspec.core.specs import ProfileSet
from sovereignspec.errors import describe
from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border.objects import LearnedObject
from sovereignspec.operator.border.policy import GROUP, VERSION
from sovereignspec.operator.decision.ledger import Committed

KIND = "LearnedProfile"
PLURAL = "learnedprofiles"
PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
# Readings older than this leave the fit: an engine upgrade or a driver change moves a GPU's
# step time, and an hour of traffic is enough points at one reading per engine per refit.
WINDOW_SECONDS = 3600.0
# A profile is refitted at most this often (a fit and its identification take about a second).
REFIT_SECONDS = 60.0

Key = tuple[str, str]  # (GPU type, model)


class LearnedSpec(BaseModel):
    """A LearnedProfile's spec: the administrator's part."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    gpu_type: str = Field(alias="gpuType", min_length=1, description="a GPU profile name")
    model: str = Field(min_length=1, description="a target model profile name")
    use: Literal["auto", "shipped", "learned"] = Field("auto", description="auto, shipped or learned")
    frozen: bool = Field(False, description="true or false")


def resource_name(key: Key) -> str:
    """The LearnedProfile's name for (GPU type, model): a DNS subdomain, e.g. h100-sxm.llama-3.1-8b."""

    def part(s: str) -> str:
        return re.sub(r"[^a-z0-9.-]+", "-", s.lower()).strip("-.") or "x"

    return f"{part(key[0])}.{part(key[1])}"[:253]


def plain_mode(c: Committed) -> bool:
    """Whether `c` was decided plain decode (its entry's mode annotation says so)."""
    for update in (c.entry or {}).get("podSetUpdates") or []:
        notes = update.get("annotations") if isinstance(update, dict) else None
        if isinstance(notes, dict) and ann.OUT_MODE in notes:
            return notes[ann.OUT_MODE] == "plain"
    return False


def readings(
    committed: Iterable[Committed],
    gpu_types: Mapping[tuple[str, int], str],
    steps: Mapping[tuple[str, str], tuple[float, float]],
    now: float,
) -> dict[Key, list[Point]]:
    """Each plain, whole-model running workload whose engine reported a step, once, by profile."""
    out: dict[Key, list[Point]] = {}
    seen: set[str] = set()
    for c in committed:
        if c.key in seen or c.request.stages != 1 or not plain_mode(c):
            continue
        reading = steps.get((c.namespace, c.job))
        gpu_type = gpu_types.get((c.node, c.gpu_index))
        if reading is None or gpu_type is None:
            continue
        seen.add(c.key)
        batch, step_s = reading
        point = Point(batch, float(c.request.context), step_s, now, f"{c.namespace}/{c.job}")
        out.setdefault((gpu_type, c.request.model), []).append(point)
    return out


@dataclass
class Write:
    """A LearnedProfile to create (`create`: not in the cache yet) and its status to apply."""

    key: Key
    name: str
    create: bool
    status: dict[str, Any]


@dataclass
class Learner:
    base: ProfileSet
    window_s: float = WINDOW_SECONDS
    refit_s: float = REFIT_SECONDS
    points: dict[Key, tuple[Point, ...]] = field(default_factory=dict)
    learned: dict[Key, Learned] = field(default_factory=dict)
    in_force: dict[Key, InForce] = field(default_factory=dict)
    fitted_at: dict[Key, float] = field(default_factory=dict)
    seen: set[Key] = field(default_factory=set)  # in the cache at least once
    refused: dict[str, str] = field(default_factory=dict)  # resource name -> why (told once)
    uses: dict[Key, str] = field(default_factory=dict)  # the spec's `use` at the last write
    # Every decision scored (operator/decision/scoring.py): per profile, the median of measured / predicted
    # TPOT - 1 over running decisions and how many, written into the status at each refit.
    scores: dict[Key, tuple[float, int]] = field(default_factory=dict)
    # Where fits run: None, in `step` itself (tests); the operator gives one worker thread, so
    # that a fit and its identification (about a second each) never hold a tick up.
    executor: Executor | None = None
    running: dict[Key, Future[Learned]] = field(default_factory=dict)

    def profiles(self) -> ProfileSet:
        """The profiles decisions price with now."""
        return with_learning(self.base, self.in_force)

    def step(
        self, resources: Iterable[Mapping[str, Any]], new: Mapping[Key, list[Point]], now: float
    ) -> tuple[list[Write], list[str]]:
        """Take `new` readings, follow the LearnedProfiles' specs, refit what is due. Returns the
        writes, and messages for what was refused (each once while it lasts)."""
        objects = [LearnedObject.of(r) for r in resources]
        specs, messages = self._specs(objects)
        for key in [k for k in self.seen if k not in specs and k not in self._refused_keys(objects)]:
            # Seen and now deleted: an administrator's reset. Start over from nothing.
            self.seen.discard(key)
            self.points.pop(key, None)
            self.learned.pop(key, None)
            self.in_force.pop(key, None)
            self.fitted_at.pop(key, None)
            self.uses.pop(key, None)
        done = self._collect()
        writes: list[Write] = []
        for key in sorted(set(new) | set(specs) | set(self.points)):
            if key[0] not in self.base.gpus or key[1] not in self.base.models:
                continue
            spec, status = specs.get(key, (None, {}))
            if spec is not None:
                self.seen.add(key)
                if key not in self.points and status.get("points"):  # after a restart: its points
                    restored, bad = _restored(status.get("points"), now, self.window_s)
                    self.points[key] = restored
                    if bad:
                        messages.append(f"{KIND} {resource_name(key)}: {bad} of its status points refused")
            use = spec.use if spec is not None else "auto"
            frozen = spec is not None and spec.frozen
            # Readings are kept whenever they come (the controller reads them once per refit
            # interval: each is a two-minute mean, one per tick would repeat it); the fit is redone
            # at most once per interval. Frozen: neither.
            due = now - self.fitted_at.get(key, -math.inf) >= self.refit_s
            if not frozen and (due or key in new):
                old = self.points.get(key, ())
                self.points[key], refused = windowed(old, new.get(key, ()), now, self.window_s)
                if refused:
                    messages.append(f"{KIND} {resource_name(key)}: {refused} readings refused")
            fitted = False
            if due:
                if not (frozen and key in self.learned):
                    fitted = self._fit(key)
                self.fitted_at[key] = now
            if not (fitted or key in done or self.uses.get(key) != use):
                continue
            self.uses[key] = use
            self.in_force[key] = choose(self.base.gpus[key[0]], self.learned.get(key), use)
            writes.append(Write(key, resource_name(key), spec is None, self._status(key, now)))
        return writes, messages

    def _fit(self, key: Key) -> bool:
        """Refit `key` on its points now (no executor: True) or in the background (False: its
        result is taken by a later step, if none is in flight already)."""
        points = self.points.get(key, ())
        if self.executor is None:
            self.learned[key] = self._learn(key, points)
            return True
        if key not in self.running:
            self.running[key] = self.executor.submit(self._learn, key, points)
        return False

    def _collect(self) -> set[Key]:
        """The background fits that finished: their results taken, unless the key was reset since."""
        done = set()
        for key, future in list(self.running.items()):
            if not future.done():
                continue
            del self.running[key]
            if key in self.points:
                self.learned[key] = future.result()
                done.add(key)
        return done

    def _learn(self, key: Key, points: tuple[Point, ...]) -> Learned:
        gpu, model = self.base.gpus[key[0]], self.base.models[key[1]]
        try:
            return learn(gpu, model, tensor_parallel_for(gpu, model), points)
        except (ValueError, ArithmeticError) as exc:  # a fit that fails says so; nothing is priced by it
            return Learned.unfitted(len(points), f"fit failed: {exc}")

    def _specs(
        self, resources: Iterable[LearnedObject]
    ) -> tuple[dict[Key, tuple[LearnedSpec, Mapping[str, Any]]], list[str]]:
        specs: dict[Key, tuple[LearnedSpec, Mapping[str, Any]]] = {}
        messages = []
        now_refused = {}
        for r in resources:
            name = r.name
            try:
                spec = LearnedSpec.model_validate(r.spec)
            except ValidationError as exc:
                why = describe(exc, LearnedSpec, where=f"{KIND} {name}")
                now_refused[name] = why
                if self.refused.get(name) != why:
                    messages.append(f"{why}; it steers nothing until fixed")
                continue
            key = (spec.gpu_type, spec.model)
            if resource_name(key) != name:
                why = f"{KIND} {name}: spec names {key}, whose resource is {resource_name(key)}; ignored"
                now_refused[name] = why
                if self.refused.get(name) != why:
                    messages.append(why)
                continue
            specs[key] = (spec, r.status)
        self.refused = now_refused
        return specs, messages

    def _refused_keys(self, resources: Iterable[LearnedObject]) -> set[Key]:
        """Keys whose resource is there but refused: not a deletion."""
        names = {r.name for r in resources}
        return {k for k in self.seen if resource_name(k) in names}

    def _status(self, key: Key, now: float) -> dict[str, Any]:
        learned, in_force = self.learned.get(key), self.in_force[key]
        points = self.points.get(key, ())
        status: dict[str, Any] = {
            "pointCount": len(points),
            "points": [[p.batch, p.context, round(p.step_s * 1e3, 6), round(p.at, 3)] for p in points],
            "windowSeconds": self.window_s,
            "identified": bool(learned and learned.identified),
            "why": in_force.why,
            "inForce": "learned" if in_force.learned else "shipped",
            "extraMargin": round(in_force.extra_margin, 4),
            "updatedAt": _rfc3339(now),
        }
        if key in self.scores:
            median, workloads = self.scores[key]
            status["predictionError"] = {"median": round(median, 4), "workloads": workloads}
        if learned is not None and learned.fitted is not None:
            f = learned.fitted
            status["fit"] = {
                "bandwidthEfficiency": round(f.bandwidth_efficiency, 5),
                "computeEfficiency": round(f.compute_efficiency, 5),
                "serialFraction": round(f.serial_fraction, 5),
                "overlap": round(f.overlap, 4),
                "stepOverheadMs": round(f.step_overhead_s * 1e3, 5),
                "rmsErrorPct": round(f.rms_error * 100, 2),
            }
            status["intervals"] = {k: list(v) for k, v in learned.intervals.items()}
            status["heldOutErrorPct"] = _pct(learned.held_out_rms)
            status["shippedErrorPct"] = _pct(learned.shipped_rms)
        return status


def _restored(raw: object, now: float, window_s: float) -> tuple[tuple[Point, ...], int]:
    """Points from a status (after a restart); each that is not [batch, context, step ms, at] of
    numbers, or not a valid reading, is refused and counted."""
    rows = raw if isinstance(raw, list) else []
    good: list[Point] = []
    bad = 0 if isinstance(raw, list) else 1
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4 and all(isinstance(x, int | float) for x in row)):
            bad += 1
            continue
        good.append(Point(float(row[0]), float(row[1]), float(row[2]) * 1e-3, float(row[3]), "status"))
    kept, refused = windowed((), good, now, window_s)
    return kept, bad + refused


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x * 100:.1f}%"


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
