"""What a real vLLM needs, shared by `make engine-e2e` (a process on loopback) and `make pod-e2e` (the
same environment mounted read-only into a serving Pod): the cached CPU build and the engine's
environment (localdev/engine.py), the tiny checkpoints and profiles that offer the served model to a
drafter."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from localdev.engine import SETTINGS, engine_env, install
from tests.engine_client import SERVED

__all__ = ["SETTINGS", "build_tiny", "engine_env", "install", "local_profiles"]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def build_tiny(engine_python: Path, out: Path) -> Path:
    """Seeded random-weight checkpoints (tiny_models.py) under `out`: target, identical, perturbed,
    eagle3."""
    subprocess.run(
        [str(engine_python), str(HERE / "tiny_models.py"), str(out)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return out


def local_profiles(out: Path, drafters: tuple[str, ...] = ()) -> Path:
    """The shipped profiles with the served model added to the named drafters' targets (the draft
    model is offered for the 70B target only). Checkpoints are the policy's (`drafts.checkpoints`)."""
    shutil.copytree(REPO / "profiles", out, dirs_exist_ok=True)
    for name in drafters:
        path = out / "drafters" / f"{name}.yaml"
        doc = yaml.safe_load(path.read_text())
        doc["targets"] = sorted({*doc.get("targets", []), SERVED})
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out
