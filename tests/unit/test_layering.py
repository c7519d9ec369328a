"""The layers are import-linter's contracts (pyproject.toml, run by `make lint`); these tests run
them as CI does and show that they catch what they are there to catch, on a copy of the tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT), "--config", str(tree / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for package in ("sovereignspec", "localdev"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_every_layer_contract(tree: Path) -> None:
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "BROKEN" not in result.stdout and "KEPT" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("core/speedup.py", "import time", "The pure core"),  # the clock
        ("core/optimiser.py", "from .. import profiles", "Layers"),  # relative, up a layer
        ("core/placement.py", "import pathlib", "The pure core"),  # I/O
        ("sim/loop.py", "from sovereignspec.operator.runtime import metrics", "The simulator's model"),
        (
            "operator/roles/dispatcher.py",
            "from sovereignspec.operator.roles import controller",
            "worker and dispatcher",
        ),
        ("telemetry/snapshot.py", "import sovereignspec.operator.decision.view", "Layers"),
        ("cli.py", "import localdev.demo", "localdev is not shipped"),
        (
            "operator/decision/plan.py",
            "import time",
            "The operator's decision and its border",
        ),  # the clock is passed in
        (
            "operator/decision/view.py",
            "from sovereignspec.operator.runtime import writer",
            "The operator's decision and its border",
        ),
        ("operator/border/workloads.py", "import os", "The operator's decision and its border"),
        (
            "operator/border/nodes.py",
            "from sovereignspec.operator.runtime import informer",
            "The operator's decision and its border",
        ),
        # The rooms: nothing imports up, and the decision and the runtime not each other.
        (
            "operator/border/workloads.py",
            "from sovereignspec.operator.decision import plan",
            "The operator's rooms",
        ),
        (
            "operator/decision/view.py",
            "from sovereignspec.operator.roles import audit",
            "The operator's rooms",
        ),
        (
            "operator/runtime/writer.py",
            "from sovereignspec.operator.decision import view",
            "The operator's rooms",
        ),
        (
            "operator/decision/ledger.py",
            "from sovereignspec.operator.runtime import metrics",
            "The operator's rooms",
        ),
        (
            "operator/border/world.py",
            "from sovereignspec.operator.decision import ledger",
            "Inside the decision",
        ),
        (
            "operator/decision/ledger.py",
            "from sovereignspec.operator.decision.view import View",
            "Inside the decision",
        ),
    ],
)
def test_a_wrong_import_breaks_its_contract(tree: Path, module: str, line: str, contract: str) -> None:
    path = tree / "sovereignspec" / module
    text = path.read_text()
    # After the module docstring and `from __future__`, where an import would really go.
    head, sep, rest = text.partition("from __future__ import annotations\n")
    path.write_text(head + sep + line + "  # noqa\n" + rest if sep else line + "\n" + text)
    result = _lint(tree)
    assert result.returncode != 0
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout


def test_a_forbidden_import_reached_through_another_core_module_breaks_the_contract(tree: Path) -> None:
    # The core importing a pure-looking module of ours that imports yaml: forbidden through it.
    (tree / "sovereignspec" / "core" / "helper.py").write_text("import yaml  # noqa\n")
    path = tree / "sovereignspec" / "core" / "roofline.py"
    path.write_text(
        path.read_text().replace(
            "from __future__ import annotations\n",
            "from __future__ import annotations\nfrom . import helper  # noqa\n",
            1,
        )
    )
    result = _lint(tree)
    assert result.returncode != 0 and "yaml" in result.stdout
