"""The decision reads no API object itself: a Workload's, a LearnedProfile's, a Node's metadata,
spec and status cross the border first (`operator/border/workloads.py`'s readers, the views in
`operator/border/objects.py`), so that a field's shape and its errors are handled in one place."""

from __future__ import annotations

import ast
from pathlib import Path

DECISION = Path(__file__).resolve().parents[2] / "sovereignspec" / "operator" / "decision"
SECTIONS = frozenset({"metadata", "spec", "status"})


def raw_reads(source: str) -> list[str]:
    """`x["metadata"]`, `x.get("spec")` and the like in `source`, as "line: text"."""
    found = []
    for node in ast.walk(ast.parse(source)):
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            key = node.args[0].value
        if key in SECTIONS:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def test_the_finder_sees_each_way_of_reading_an_object_raw() -> None:
    planted = (
        'a = wl["metadata"]["name"]\nb = (wl.get("spec") or {})\nc = r.get("status", {})\nd = x.get("name")\n'
    )
    assert [line.split(":")[0] for line in raw_reads(planted)] == ["1", "2", "3"]


def test_no_module_of_the_decision_reads_an_api_objects_metadata_spec_or_status() -> None:
    modules = sorted(DECISION.glob("*.py"))
    assert len(modules) >= 7  # the rooms moved: find them again rather than pass on nothing
    found = {p.name: raw_reads(p.read_text(encoding="utf-8")) for p in modules}
    assert {name: reads for name, reads in found.items() if reads} == {}
