"""The serving engines a decision is handed to, one module each behind `base.Engine`.

`engine_config` turns a decision (γ at the declared batch and the per-batch table,
`core.handoff.handoff`) into every registered engine's annotations; the operator writes them all
and `sovereignspec launch` in the pod hands its engine its own. The telemetry reader and the
profiler read each engine's metrics through its module. Adding an engine is one module, its
contract test and one line in `ENGINES` (docs/architecture.md, "Adding an engine"). Field and flag
names are held to the engines' source by tests/unit/test_engine_contract.py.
"""

from __future__ import annotations

from collections.abc import Mapping

from sovereignspec.core.handoff import Table
from sovereignspec.core.specs import DrafterSpec
from sovereignspec.engines import sglang, vllm
from sovereignspec.engines.base import Engine, EngineConfig, Key, Metrics, MetricsReader, Option

__all__ = ["ENGINES", "Engine", "EngineConfig", "Key", "Metrics", "MetricsReader", "Option", "engine_config"]

# The registry: one line per engine, in the order their readings are preferred.
ENGINES: tuple[Engine, ...] = (vllm.ENGINE, sglang.ENGINE)

# Every annotation (after the prefix) an engine's configuration may be handed in.
OUTPUTS = frozenset(key for engine in ENGINES for key in engine.outputs)


def engine_config(
    drafter: DrafterSpec, model: str, gamma: int, table: Table | None = None, checkpoint: str | None = None
) -> EngineConfig:
    """Every engine's configuration for a decision of `gamma` draft tokens at the declared batch.

    `table` is the per-batch budget (`core.handoff.handoff`); its largest K may exceed `gamma` when
    light batches pay and the declared one does not (γ = 0 there). Engines that read a table get
    it; the fixed-γ forms run `gamma`. `checkpoint`, where given, is the draft checkpoint instead
    of the profile's for `model`. No γ > 0 anywhere is plain decode: nothing at all."""
    # Never below the decision at the declared batch, whatever a cautious table says there.
    top = max(max((k for _, _, k in table), default=gamma), gamma) if table else gamma
    if top <= 0:
        return EngineConfig()
    names = drafter.engines
    # `checkpoint` (the policy's, or the workload's within the policy's allowlist) replaces the
    # profile's; an ngram drafter has none to replace.
    draft = (checkpoint if drafter.kind != "ngram" else None) or names.draft_models.get(model, "")
    notes: dict[str, str] = {}
    for engine in ENGINES:
        method = names.methods.get(engine.name, "")
        if method:
            notes.update(engine.configure(method, draft, gamma, top, table))
    return EngineConfig(notes)


def handed_table(notes: Mapping[str, str]) -> Table:
    """The per-batch table the first engine that takes one was handed in `notes` ([] for none)."""
    for engine in ENGINES:
        table = engine.handed_table(notes)
        if table is not None:
            return table
    return []


def policy_options() -> tuple[tuple[str, Option], ...]:
    """(engine name, setting) for every setting an engine holds in the SpeculationPolicy."""
    return tuple((engine.name, option) for engine in ENGINES for option in engine.options)


def tpot_metrics() -> tuple[str, ...]:
    """Every engine's TPOT histograms, most direct first: per request, older names, per event."""
    return tuple(name for rank in range(3) for engine in ENGINES for name in engine.metrics.tpot[rank])


def gauges(kind: str) -> tuple[str, ...]:
    """Every engine's series of one kind ("running", "kv_usage" gauges; "drafted", "drafts"
    counters), in registry order."""
    return tuple(name for engine in ENGINES for name in getattr(engine.metrics, kind))


def acceptance(
    reader: MetricsReader, by: str, at: float, options: Mapping[str, Mapping[str, str]]
) -> dict[Key, tuple[float, float]]:
    """(namespace, model) -> (α, weight) from every engine's metrics; the first engine's reading
    holds where two report the same key. `options`: per engine name, the policy's settings."""
    out: dict[Key, tuple[float, float]] = {}
    for engine in ENGINES:
        for key, value in engine.acceptance(reader, by, at, options.get(engine.name, {})).items():
            out.setdefault(key, value)
    return out


def step_tokens(before: Mapping[str, float], after: Mapping[str, float], tokens: int) -> tuple[float, float]:
    """(query tokens per sequence per step, tokens per step) from the first engine whose metrics
    show speculation over a profiling point; (1, 1) for an engine that does not speculate."""
    for engine in ENGINES:
        found = engine.step_tokens(before, after, tokens)
        if found is not None:
            return found
    return 1.0, 1.0


def kind_of(metric_names: str) -> str:
    """Which engine exports these metric names (space-separated), or "unknown"."""
    return next((e.name for e in ENGINES if e.metrics.prefix in metric_names), "unknown")
