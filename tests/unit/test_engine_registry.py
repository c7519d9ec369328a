"""Every registered engine, and the skeleton docs/architecture.md offers for a new one, holds to
the structure `sovereignspec.engines.base.Engine` promises: what it writes, which metrics it names,
how it answers when nothing speculates."""

from __future__ import annotations

import re
import types
from pathlib import Path
from typing import Any

import pytest

from sovereignspec import engines
from sovereignspec.engines.base import Engine, Metrics
from sovereignspec.profiles import load_profiles

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def skeleton() -> Any:
    """The `ENGINE` of the skeleton in docs/architecture.md ("Adding an engine"), run as a module."""
    text = DOC.read_text()
    section = text[text.index("## Adding an engine") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "docs/architecture.md: no skeleton under 'Adding an engine'"
    module = types.ModuleType("skeleton_engine")
    exec(compile(code.group(1), str(DOC), "exec"), module.__dict__)
    return module.ENGINE


class Reader:
    """A Prometheus with no series at all."""

    window = "5m"

    def __init__(self) -> None:
        self.queries: list[str] = []

    def query(self, promql: str, at: float | None = None) -> list[tuple[dict[str, str], float, float]]:
        self.queries.append(promql)
        return []

    def reject(self, reason: str, rows: int = 1) -> None:
        raise AssertionError(f"nothing to reject: {reason}")


def structure(engine: Engine) -> None:
    assert isinstance(engine.name, str) and re.fullmatch(r"[a-z][a-z0-9-]*", engine.name)
    assert engine.outputs and all(re.fullmatch(r"[a-z0-9][a-z0-9-]*", key) for key in engine.outputs)
    assert isinstance(engine.takes_table, bool)
    m = engine.metrics
    assert isinstance(m, Metrics) and m.prefix.endswith(":")
    assert len(m.tpot) == 3 and any(m.tpot), "at least one TPOT histogram"
    named = [*(n for rank in m.tpot for n in rank), *m.running, *m.kv_usage]
    assert all(n.startswith(m.prefix) for n in named), named
    table = [[1, 4, 3], [5, 512, 1]]
    for gamma, top, t in ((3, 3, None), (1, 3, table), (0, 3, table)):
        written = engine.configure("method", "org/draft", gamma, top, t)
        assert set(written) <= set(engine.outputs), written
        assert all(isinstance(v, str) for v in written.values())
        found = engine.handed_table(written)
        assert found is None or isinstance(found, list)
    assert engine.handed_table({}) is None, "nothing handed: no table"
    reader = Reader()
    assert engine.acceptance(reader, "namespace, model_name", 0.0, {}) == {}
    assert engine.step_tokens({}, {}, 100) is None, "no counters: no speculation seen"


@pytest.mark.parametrize("engine", engines.ENGINES, ids=lambda e: e.name)
def test_every_registered_engine_holds_to_the_protocols_structure(engine: Engine) -> None:
    structure(engine)


def test_the_skeleton_in_the_docs_holds_to_the_same_structure() -> None:
    structure(skeleton())


def test_engines_are_registered_once_each_and_write_distinct_annotations() -> None:
    names = [e.name for e in engines.ENGINES]
    assert len(names) == len(set(names))
    keys = [k for e in engines.ENGINES for k in e.outputs]
    assert len(keys) == len(set(keys)) and frozenset(keys) == engines.OUTPUTS
    prefixes = [e.metrics.prefix for e in engines.ENGINES]
    assert len(prefixes) == len(set(prefixes))


def test_every_drafter_names_its_method_only_for_registered_engines() -> None:
    known = {e.name for e in engines.ENGINES}
    for drafter in load_profiles().drafters.values():
        assert set(drafter.engines.methods) <= known, (drafter.name, drafter.engines.methods)
        assert drafter.engines.methods, drafter.name


def test_a_plain_decision_hands_no_engine_anything() -> None:
    d = load_profiles().drafters["eagle3"]
    assert not engines.engine_config(d, "llama-3.1-8b", 0).speculative
    assert engines.engine_config(d, "llama-3.1-8b", 0).notes == {}
    config = engines.engine_config(d, "llama-3.1-8b", 2)
    assert config.speculative and set(config.notes) <= engines.OUTPUTS
