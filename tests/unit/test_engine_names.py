"""Engines are plug-ins: outside their own modules (sovereignspec/engines/) and the profiles that
name each drafter's method per engine, no code names one. Comments and docstrings may (they cite
where a number or a behaviour comes from); identifiers and string literals may not, except where
declared below with the reason."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "sovereignspec"
ENGINE_NAMES = re.compile(r"vllm|sglang", re.I)
OWN = ("engines/", "profiles.py")
DECLARED = {
    # The simulator's baseline that imitates vLLM's static per-batch table, named after it.
    "sim/policies.py",
    # Figure labels that cite the measured fit the figure compares against.
    "analysis/plots.py",
}


def named(source: str) -> list[tuple[int, str]]:
    """(line, text) of every identifier and non-docstring string literal naming an engine."""
    tree = ast.parse(source)
    docstrings = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.alias)):
            text = node.name
        elif isinstance(node, ast.ImportFrom):
            text = node.module
        if text and ENGINE_NAMES.search(text):
            found.append((getattr(node, "lineno", 0), text[:80]))
    return found


def test_no_code_outside_the_engine_modules_names_an_engine() -> None:
    offending = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(OWN) or rel in DECLARED:
            continue
        found = named(path.read_text(encoding="utf-8"))
        if found:
            offending[rel] = found
    assert not offending, f"engine names outside sovereignspec/engines/: {offending}"


def test_the_check_finds_a_name_in_code_but_not_in_comments_or_docstrings() -> None:
    source = (
        '"""Reads vLLM."""\n# SGLang says so\nx = "vllm-config"\ndef f():\n    """sglang"""\n    sglang = 1\n'
    )
    assert named(source) == [(3, "vllm-config"), (6, "sglang")]


def test_every_declared_exception_still_names_an_engine() -> None:
    for rel in DECLARED:
        assert named((PACKAGE / rel).read_text(encoding="utf-8")), f"{rel} no longer needs declaring"
