"""What one serving engine's module holds (`Engine`), and what it is handed to read its metrics.

An engine module is everything SovereignSpec knows about one engine: the configuration a decision
hands it (in which annotations, under which keys), whether it reads a per-batch table, and its
metric names and what they mean (time per output token, requests running, KV usage, how its
speculative counters give α and the tokens a step verifies and yields). Nothing outside
`sovereignspec.engines` names an engine; see docs/architecture.md ("Adding an engine").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from sovereignspec.core.handoff import Table

Key = tuple[str, str]  # (namespace, model_name): whose acceptance a series is
Row = tuple[dict[str, str], float, float]  # one instant-vector sample: labels, value, timestamp


class MetricsReader(Protocol):
    """The Prometheus an engine's series are read from (`telemetry.prometheus.PrometheusReader`)."""

    window: str  # the range acceptance is averaged over, e.g. "5m"

    def query(self, promql: str, at: float | None = None) -> list[Row]: ...

    def reject(self, reason: str, rows: int = 1) -> None:
        """Count `rows` treated as missing, by `reason` (the rejected-samples metric)."""


@dataclass(frozen=True)
class Metrics:
    """An engine's metric names, as its /metrics exports them."""

    prefix: str  # every series of the engine starts with it: its metric namespace and the colon
    # Histograms of time per output token, in order of preference: per request, the names older
    # versions exported, per output event (overstates per-token latency under speculation).
    tpot: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]
    running: tuple[str, ...] = ()  # gauges of requests in the batch
    kv_usage: tuple[str, ...] = ()  # gauges of the KV cache's use, 0-1
    # Counters of draft tokens proposed: rising only while the engine speculates (a plain decision
    # kept, none rises). An engine without one is not watched for ignored decisions.
    drafted: tuple[str, ...] = ()
    # Counters of drafts proposed (one per sequence per step that drafted): drafted / drafts is the
    # mean draft length, held against the most a speculative decision handed the engine.
    drafts: tuple[str, ...] = ()


@dataclass(frozen=True)
class EngineConfig:
    """What a decision hands every engine: annotation key (after the prefix) -> value. Empty for
    plain decode: nothing at all that could make an engine speculate."""

    notes: dict[str, str] = field(default_factory=dict)

    @property
    def speculative(self) -> bool:
        return bool(self.notes)

    def get(self, key: str) -> str:
        return self.notes.get(key, "")


@dataclass(frozen=True)
class Option:
    """A setting the SpeculationPolicy holds for one engine, under `telemetry.acceptance.<field>`:
    how a cluster's version of the engine means its metrics. The engine reads it as `key`."""

    field: str  # the policy's (and the CRD's) field name, camelCase
    key: str  # what the engine's `acceptance` finds it under in its options
    accepted: tuple[str, ...]  # the values it takes, the first the default
    meaning: str  # what each value means, for the error that names a bad one

    @property
    def default(self) -> str:
        return self.accepted[0]


class Engine(Protocol):
    """One serving engine. Register its module's `ENGINE` in `sovereignspec.engines.ENGINES`."""

    name: str  # as drafter profiles name it: the keys of `profiles.EngineProfile.by_engine`
    outputs: tuple[str, ...]  # the annotations (after the prefix) `configure` may write
    takes_table: bool  # whether it reads the per-batch budget (`core.handoff.Table`)
    batch_limit: str  # its flag capping the running requests (said when a profile point cannot fill)
    metrics: Metrics
    options: tuple[Option, ...]  # its settings in the SpeculationPolicy (`Option`), often none

    def configure(self, method: str, draft: str, gamma: int, top: int, table: Table | None) -> dict[str, str]:
        """Its annotations for a speculative decision: `method` (its name for the drafter), the
        `draft` checkpoint ("" for none), γ at the declared batch, the largest K `top` > 0, and
        the per-batch table (None or one range: none)."""
        ...

    def handed_table(self, notes: Mapping[str, str]) -> Table | None:
        """The per-batch table in annotations it wrote (None where it takes none, or wrote none)."""
        ...

    def acceptance(
        self, reader: MetricsReader, by: str, at: float, options: Mapping[str, str]
    ) -> dict[Key, tuple[float, float]]:
        """(namespace, model) -> (per-token α, draft tokens behind it; -1: the prior's weight), from
        its speculative metrics over `reader.window`, every query evaluated `at` one time and
        grouped `by` the labels given. `options`: the policy's settings for this engine."""
        ...

    def step_tokens(
        self, before: Mapping[str, float], after: Mapping[str, float], tokens: int
    ) -> tuple[float, float] | None:
        """(query tokens per sequence per step, tokens per step) over a profiling point in which its
        sequences produced `tokens`, from /metrics summed over labels (`name` -> value) before and
        after; None when its metrics show no speculation."""
        ...
