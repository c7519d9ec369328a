"""The pure core imports no shell: no kopf, no Kubernetes client, no HTTP, no clock, no I/O framework.

A test rather than a linter contract so that it also covers the standard library (time, datetime,
socket, http, urllib) and our own shell modules.
"""

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "sovereignspec" / "core"
FORBIDDEN = {
    "kopf",
    "kubernetes",
    "aiohttp",
    "requests",
    "httpx",
    "urllib",
    "urllib3",
    "http",
    "socket",
    "time",
    "datetime",
    "asyncio",
    "prometheus_client",
    "pynvml",
    "yaml",
    "pydantic",
    "matplotlib",
}
ALLOWED_OWN = "sovereignspec.core"


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_module_imports_nothing_from_the_shell(path: Path) -> None:
    bad = []
    for name in _imports(path):
        top = name.split(".")[0]
        if top in FORBIDDEN:
            bad.append(name)
        if top == "sovereignspec" and not (name == ALLOWED_OWN or name.startswith(ALLOWED_OWN + ".")):
            bad.append(name)
    assert not bad, f"{path.name} imports {bad}; the core must stay pure"


def test_the_layering_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "bad.py"
    sample.write_text("import time\nfrom kubernetes import client\nfrom sovereignspec.operator import x\n")
    assert _imports(sample) == ["time", "kubernetes", "sovereignspec.operator"]


SIM = CORE.parent / "sim"
SIM_MODEL = ("engine.py", "policies.py", "metrics.py", "run.py")  # scenario.py is the YAML border
SIM_OWN = ("sovereignspec.core", "sovereignspec.sim", "sovereignspec.engines")


@pytest.mark.parametrize("name", SIM_MODEL)
def test_the_simulators_model_imports_no_shell_no_clock_and_no_plotting(name: str) -> None:
    bad = []
    for imported in _imports(SIM / name):
        top = imported.split(".")[0]
        if top in FORBIDDEN:
            bad.append(imported)
        if top == "sovereignspec" and not any(imported == o or imported.startswith(o + ".") for o in SIM_OWN):
            bad.append(imported)
    assert not bad, f"sim/{name} imports {bad}; simulated time is the only clock there"
