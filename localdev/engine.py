"""A real vLLM on this machine (its CPU build, cached by hack/engine-env.sh): where its interpreter is
and the environment it runs in. Shared by `make engine-e2e`, `make pod-e2e` and `make bench-engine`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

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


def engine_env(engine_python: Path, cache: Path, **settings: str) -> dict[str, str]:
    """This process's environment less any vLLM or hub setting, the engine's bin first on PATH,
    its compile cache at `cache`, SETTINGS and then `settings` over them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_"))}
    env.update(
        PATH=f"{engine_python.parent}:{env.get('PATH', '/usr/bin:/bin')}",
        VLLM_CACHE_ROOT=str(cache),
        **SETTINGS,
    )
    env.update(settings)
    return env


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End an engine process: SIGTERM (vLLM then shuts its engine core down), SIGKILL after a minute."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
