"""What a real vLLM needs, shared by `make engine-e2e` (a process on loopback) and `make pod-e2e` (the
same environment mounted read-only into a serving Pod): the cached CPU build, the tiny checkpoints,
the engine's environment variables and profiles that offer the served model to a drafter."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.engine_client import SERVED

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

# The engine's own settings for a shared 2-core machine without the model hub.
SETTINGS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB: plenty for these models
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # shared cores, nothing to pin
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}


def install() -> Path:
    """The engine's interpreter; built by hack/engine-env.sh on first use (minutes), cached."""
    proc = subprocess.run(
        [str(REPO / "hack" / "engine-env.sh")], capture_output=True, text=True, timeout=1800, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"hack/engine-env.sh failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


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


def engine_env(engine_python: Path, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_"))}
    env.update(
        PATH=f"{engine_python.parent}:{env.get('PATH', '/usr/bin:/bin')}",
        VLLM_CACHE_ROOT=str(cache),
        **SETTINGS,
    )
    return env


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
