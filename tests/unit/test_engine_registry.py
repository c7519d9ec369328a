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
from sovereignspec.engines.base import Engine, Metrics, Option
from sovereignspec.engines.launchers import LAUNCHERS
from sovereignspec.launchkit import Launcher, LaunchError
from sovereignspec.profiles import load_profiles

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def skeleton(which: int = 0, name: str = "ENGINE") -> Any:
    """`name` of the `which`th skeleton in docs/architecture.md ("Adding an engine": the engine
    module, then its launcher), run as a module."""
    text = DOC.read_text()
    section = text[text.index("## Adding an engine") : text.index("## Adding a workload kind")]
    code = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(code) > which, "docs/architecture.md: a skeleton missing under 'Adding an engine'"
    module = types.ModuleType(f"skeleton_{which}")
    exec(compile(code[which], str(DOC), "exec"), module.__dict__)
    return getattr(module, name)


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
    assert engine.batch_limit.startswith("--")
    for option in engine.options:  # the policy's field for it, camelCase as the CRD's fields are
        assert isinstance(option, Option) and re.fullmatch(r"[a-z][A-Za-z0-9]*", option.field), option
        assert option.accepted and option.key and option.meaning, option
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
    # Each engine's policy settings become fields beside acceptance's own: no two may share a name.
    from sovereignspec.operator.border.policy import _AcceptanceFields

    fields = [o.field for _, o in engines.policy_options()]
    own = {f.alias or name for name, f in _AcceptanceFields.model_fields.items()}
    assert len(fields) == len(set(fields)) and not own & set(fields), fields


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


def launcher_structure(launcher: Launcher) -> None:
    """What `launch` asks of every launcher: a name, its own flags, no speculation found in a
    command without any, and a plain γ = 0 decision that adds nothing or says why."""
    assert isinstance(launcher.name, str) and re.fullmatch(r"[a-z][a-z0-9-]*", launcher.name)
    assert all(flag.startswith("--") and said for flag, said in launcher.options)
    assert not launcher.sets_speculation("--port") and not launcher.sets_speculation("--model")
    assert launcher.sets_speculation("--spec") or launcher.sets_speculation("--speculative-")
    assert not launcher.detects("python3 serve.py")
    try:
        spec = launcher.plan({}, ["serve", "m"], "0", Path("/nonexistent"), {})
    except LaunchError as exc:  # a speculative decision missing its configuration is refused
        assert "annotation" in str(exc)
    else:
        assert isinstance(spec, str) and spec, "no configuration and γ = 0: plain, with the reason"


@pytest.mark.parametrize("launcher", LAUNCHERS, ids=lambda e: e.name)
def test_every_registered_launcher_holds_to_the_protocols_structure(launcher: Launcher) -> None:
    launcher_structure(launcher)


def test_the_launcher_skeleton_in_the_docs_holds_to_the_same_structure() -> None:
    launcher_structure(skeleton(1, "LAUNCHER"))


def test_every_engine_has_one_launcher_and_every_launcher_an_engine() -> None:
    assert sorted(e.name for e in engines.ENGINES) == sorted(launcher.name for launcher in LAUNCHERS)


@pytest.mark.parametrize(
    "engine, option",
    [(e, o) for e in engines.ENGINES for o in e.options],
    ids=lambda x: getattr(x, "field", getattr(x, "name", "")),
)
def test_each_engines_policy_setting_is_a_field_of_the_policy_that_reaches_the_engine(
    engine: Engine, option: Option
) -> None:
    from sovereignspec.operator.border.policy import Acceptance, parse_policy

    assert Acceptance().engine_options()[engine.name][option.key] == option.default
    for value in option.accepted:
        chosen = Acceptance.model_validate({option.field: value}).engine_options()
        assert chosen[engine.name][option.key] == value
    with pytest.raises(ValueError) as bad:
        parse_policy("p", {"telemetry": {"acceptance": {option.field: "not-a-meaning"}}})
    said = str(bad.value)
    assert f"telemetry.acceptance.{option.field}" in said and "not-a-meaning" in said
    assert all(repr(value) in said for value in option.accepted), said
