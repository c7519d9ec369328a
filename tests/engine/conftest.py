"""A real vLLM (its CPU build, hack/engine-env.sh) on loopback, started the way a serving Pod starts it:
`sovereignspec launch` reads a downward-API annotations file (written in the kubelet's own `%q`
format) that the operator's own decision produced, and execs `vllm serve`. Every test here is marked
`engine` and runs in `make engine-e2e`; see docs/engine-e2e.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from localdev.ports import free_port
from tests.conftest import go_quoted

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
START_TIMEOUT = 420.0  # 45-115 s on 2 idle cores (real-engine.md); a loaded CI machine takes longer
SERVED = "llama-3.1-8b"  # the profile's model name: what the operator decides for and Prometheus keys


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The engine's interpreter; built by the repository's script on first use (minutes), cached."""
    proc = subprocess.run(
        [str(REPO / "hack" / "engine-env.sh")], capture_output=True, text=True, timeout=1800, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"hack/engine-env.sh failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def tiny(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Seeded random-weight checkpoints (tests/engine/tiny_models.py): target, identical, perturbed,
    eagle3."""
    out = tmp_path_factory.mktemp("tiny-models")
    subprocess.run(
        [str(engine_python), str(HERE / "tiny_models.py"), str(out)],
        check=True,
        timeout=600,
        capture_output=True,
    )
    return out


def _get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


@dataclass
class Served:
    """One `vllm serve` process started through `sovereignspec launch`."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    started_s: float = 0.0
    argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """Every sample, summed over label sets except `position` (kept as name{position="N"})."""
        out: dict[str, float] = {}
        for line in _get(self.url + "/metrics").splitlines():
            m = SAMPLE.match(line)
            if not m:
                continue
            position = re.search(r'position="(\d+)"', m.group("labels") or "")
            key = m.group("name") + (f'{{position="{position.group(1)}"}}' if position else "")
            out[key] = out.get(key, 0.0) + float(m.group("value"))
        return out

    def complete(self, concurrency: int, tokens: int = 64, prompt_tokens: int = 16) -> dict[str, Any]:
        """`concurrency` greedy completions at once (ignore_eos: every one runs `tokens` steps, so
        the batch stays at `concurrency` until they all end together); the spec counters' change."""
        before = self.metrics()

        def one(i: int) -> int:
            # Word-level tokenizer: w<k> is token k + 3, all inside the vocabulary.
            prompt = " ".join(f"w{(i * 31 + j * 7) % 500}" for j in range(prompt_tokens))
            body = {
                "model": SERVED,
                "prompt": prompt,
                "max_tokens": tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            req = urllib.request.Request(
                self.url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=300) as response:
                return int(json.loads(response.read())["usage"]["completion_tokens"])

        with ThreadPoolExecutor(concurrency) as pool:
            produced = sum(pool.map(one, range(concurrency)))
        after = self.metrics()
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        drafts = delta.get("vllm:spec_decode_num_drafts_total", 0.0)
        drafted = delta.get("vllm:spec_decode_num_draft_tokens_total", 0.0)
        return {
            "tokens": produced,
            "drafts": drafts,
            "mean_draft_length": drafted / drafts if drafts else 0.0,
            "alpha_position0": delta.get(
                'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}', 0.0
            )
            / drafts
            if drafts
            else None,
            "accepted_per_drafted": delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) / drafted
            if drafted
            else None,
        }

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def engine_env(engine_python: Path, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "HF_"))}
    env.update(
        PATH=f"{engine_python.parent}:{env.get('PATH', '/usr/bin:/bin')}",
        VLLM_CPU_KVCACHE_SPACE="1",  # GiB: plenty for these models
        VLLM_CPU_OMP_THREADS_BIND="nobind",  # shared cores, nothing to pin
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_CACHE_ROOT=str(cache),
    )
    return env


@pytest.fixture(scope="session")
def vllm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """vLLM's compile cache, shared by the session's servers (later starts are faster)."""
    return tmp_path_factory.mktemp("vllm-cache")


@pytest.fixture
def serve(engine_python: Path, tiny: Path, go_quote: Path, vllm_cache: Path, tmp_path: Path) -> Iterator[Any]:
    """serve(notes, *extra) -> Served: the target behind `sovereignspec launch`, given `notes` as the
    pod's annotations; waits for /health and fails with the engine's log if it dies first."""
    started: list[Served] = []

    def start(notes: dict[str, str], *extra: str, max_num_seqs: int = 64) -> Served:
        annotations = tmp_path / f"annotations-{len(started)}"
        annotations.write_bytes(go_quoted(go_quote, notes))
        port = free_port()
        log = tmp_path / f"vllm-{len(started)}.log"
        launcher = [sys.executable, "-m", "sovereignspec.cli", "launch", "--annotations", str(annotations),
                    "--config-dir", str(tmp_path), "--"]  # fmt: skip
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
                env=engine_env(engine_python, vllm_cache),
            )
        served = Served(proc, port, log, argv=launcher + command)
        started.append(served)
        deadline = t0 + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(
                    f"the engine exited with {proc.returncode} before serving:\n{served.text()[-6000:]}"
                )
            try:
                _get(served.url + "/health", timeout=2)
                served.started_s = time.monotonic() - t0
                return served
            except (urllib.error.URLError, OSError):
                time.sleep(1.0)
        pytest.fail(f"the engine did not serve within {START_TIMEOUT:.0f}s:\n{served.text()[-6000:]}")

    yield start
    for served in started:
        served.close()


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
