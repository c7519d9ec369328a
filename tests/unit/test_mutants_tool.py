"""`make mutants` counts honestly: a timeout or an error is not a kill, and the operators it
applies change what they say they change."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "hack" / "mutants.py"


@pytest.fixture(scope="module")
def tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("mutants_tool", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mutants_tool"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("rc", "output", "expected"),
    [
        (0, "5 passed", "survived"),
        (1, "1 failed, 4 passed", "killed"),
        (1, "+++++++++++++++++++++++++++++++++++ Timeout ++++++++++++++++++++++++++++++++++++", "timeout"),
        (-1, "", "timeout"),
        (2, "ERROR collecting tests/unit/test_x.py: ImportError", "error"),
        (3, "INTERNALERROR", "error"),
        (4, "usage", "error"),
        (5, "no tests ran", "error"),
    ],
)
def test_each_test_run_is_counted_as_what_it_was(tool, rc: int, output: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    assert tool.outcome(rc, output) == expected


SOURCE = """
def f(a, b, flag=True):
    if a < b and flag:
        return a
    return None
"""


def test_booleans_returns_and_operand_order_are_mutated(tool) -> None:  # type: ignore[no-untyped-def]
    found = {m.what: m for m in tool.mutants("x.py", SOURCE)}
    assert {"True → False", "return x → return None", "a ? b → b ? a", "< → <="} <= set(found)
    assert "return None → return None" not in " ".join(found)  # `return None` is left alone
    flipped = ast.unparse(ast.parse(tool.mutated_source(found["a ? b → b ? a"], SOURCE)))
    assert "b < a and flag" in flipped
    assert "flag=False" in tool.mutated_source(found["True → False"], SOURCE)
    returned = tool.mutated_source(found["return x → return None"], SOURCE)
    assert "return a" not in returned and returned.count("return None") == 2
    # The operator swap on the same comparison still swaps the operator, not the operands.
    assert "a <= b" in tool.mutated_source(found["< → <="], SOURCE)


def test_the_report_scores_kills_against_survivors_only(tool) -> None:  # type: ignore[no-untyped-def]
    todo = [tool.Mutant("m.py", i, "x", i) for i in range(6)]
    states = dict(zip(todo, ["killed", "killed", "killed", "survived", "timeout", "error"], strict=True))
    text = tool.report(["m.py"], todo, states)
    assert "m.py: 3 / 1 / 1 / 1 of 6; score 75.0 %" in text
    assert "all: 3 / 1 / 1 / 1 of 6; score 75.0 %" in text
