"""A real vLLM (its CPU build, hack/engine-env.sh) on loopback, started the way a serving Pod starts it:
`sovereignspec launch` reads a downward-API annotations file (written in the kubelet's own `%q`
format) that the operator's own decision produced, and execs `vllm serve`. Every test here is marked
`engine` and runs in `make engine-e2e`; see docs/engine-e2e.md."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from localdev.engine import stop
from localdev.ports import free_port
from tests.conftest import go_quoted
from tests.engine import env as engine_setup
from tests.engine_client import SERVED, EngineClient, get

HERE = Path(__file__).resolve().parent
START_TIMEOUT = 420.0  # 45-115 s on 2 idle cores (real-engine.md); a loaded CI machine takes longer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The engine's interpreter; built by the repository's script on first use (minutes), cached."""
    try:
        return engine_setup.install()
    except RuntimeError as e:
        pytest.fail(str(e))


@pytest.fixture(scope="session")
def tiny(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Seeded random-weight checkpoints (tests/engine/tiny_models.py): target, identical, perturbed,
    eagle3."""
    return engine_setup.build_tiny(engine_python, tmp_path_factory.mktemp("tiny-models"))


@dataclass
class Served(EngineClient):
    """One `vllm serve` process started through `sovereignspec launch`."""

    proc: subprocess.Popen[bytes]
    log: Path
    started_s: float = 0.0
    argv: list[str] = field(default_factory=list)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def close(self) -> None:
        stop(self.proc)


@pytest.fixture(scope="session")
def vllm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vLLM's compile cache, shared by the session's servers (later starts are faster)."""
    return tmp_path_factory.mktemp("vllm-cache")


@pytest.fixture
def serve(engine_python: Path, tiny: Path, go_quote: Path, vllm_cache: Path, tmp_path: Path) -> Iterator[Any]:
    """serve(notes, *extra) -> Served: the target behind `sovereignspec launch`, given `notes` as the
    pod's annotations; waits for /health and fails with the engine's log if it dies first. With
    `by_hand`, `vllm serve` is started as an image's own entrypoint would, without the launcher."""
    started: list[Served] = []

    def start(notes: dict[str, str], *extra: str, max_num_seqs: int = 64, by_hand: bool = False) -> Served:
        annotations = tmp_path / f"annotations-{len(started)}"
        annotations.write_bytes(go_quoted(go_quote, notes))
        port = free_port()
        log = tmp_path / f"vllm-{len(started)}.log"
        launcher = [sys.executable, "-m", "sovereignspec.cli", "launch", "--annotations", str(annotations),
                    "--config-dir", str(tmp_path), "--"]  # fmt: skip
        if by_hand:
            launcher = []
        command = [str(engine_python.parent / "vllm"), "serve", str(tiny / "target"),
                   "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
                   "--max-model-len", "1024", "--max-num-seqs", str(max_num_seqs), "--seed", "0",
                   *extra]  # fmt: skip
        t0 = time.monotonic()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                launcher + command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=engine_setup.engine_env(engine_python, vllm_cache),
            )
        served = Served(port, proc, log, argv=launcher + command)
        started.append(served)
        deadline = t0 + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(
                    f"the engine exited with {proc.returncode} before serving:\n{served.text()[-6000:]}"
                )
            try:
                get(served.url + "/health", timeout=2)
                served.started_s = time.monotonic() - t0
                return served
            except (urllib.error.URLError, OSError):
                time.sleep(1.0)
        pytest.fail(f"the engine did not serve within {START_TIMEOUT:.0f}s:\n{served.text()[-6000:]}")

    yield start
    for served in started:
        served.close()
