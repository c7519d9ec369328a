"""`sovereignspec launch` against a stand-in engine that prints its argv and PID and exits with a
chosen code: what it appends, what it refuses, and that the engine replaces it (exec)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ENGINE = """\
import json, os, sys
print("ENGINE " + json.dumps({"argv": sys.argv[1:], "pid": os.getpid()}), flush=True)
sys.exit(int(os.environ.get("ENGINE_EXIT", "0")))
"""
VLLM = {
    "method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 4,
    "num_speculative_tokens_per_batch_size": [[1, 16, 4], [17, 64, 2], [65, 512, 0]],
}  # fmt: skip
SGLANG = (
    "--speculative-algorithm EAGLE3 --speculative-draft-model-path yuhuili/EAGLE3-LLaMA3.1-Instruct-8B "
    "--speculative-num-steps 4 --speculative-eagle-topk 1 --speculative-num-draft-tokens 5"
)
ADAPTIVE = {
    "1": {"candidate_steps": [1, 2, 4]},
    "17": {"candidate_steps": [1, 2]},
    "65": {"candidate_steps": [0]},
}
SPECULATIVE = {
    "sovereignspec.io/mode": "speculative", "sovereignspec.io/draft-budget": "4",
    "sovereignspec.io/gpu-type": "H100-SXM", "sovereignspec.io/decided-at": "2026-12-01T10:00:00Z",
    "sovereignspec.io/vllm-speculative-config": json.dumps(VLLM),
    "sovereignspec.io/sglang-args": SGLANG, "sovereignspec.io/sglang-adaptive-config": json.dumps(ADAPTIVE),
    "kubectl.kubernetes.io/restartedAt": 'with "quotes" and = signs',
}  # fmt: skip
BASE = ["serve", "meta-llama/Llama-3.1-8B-Instruct", "--port", "8000"]
PLAIN = {"sovereignspec.io/mode": "plain", "sovereignspec.io/draft-budget": "0"}


def downward_api_file(path: Path, notes: dict[str, str]) -> Path:
    """The kubelet's format: key="value" per line, the value a Go-quoted string."""
    path.write_text("".join(f"{k}={json.dumps(v)}\n" for k, v in sorted(notes.items())))
    return path


def launch(
    tmp_path: Path, notes: dict[str, str] | None, *args: str, exit_code: int = 0, engine: str = "vllm"
):
    engine_py = tmp_path / "engine.py"
    engine_py.write_text(ENGINE)
    annotations = (
        downward_api_file(tmp_path / "annotations", notes) if notes is not None else tmp_path / "none"
    )
    cmd = [sys.executable, "-m", "sovereignspec.cli", "launch", "--engine", engine,
           "--annotations", str(annotations), "--config-dir", str(tmp_path), *args,
           "--", sys.executable, str(engine_py), *BASE]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"ENGINE_EXIT": str(exit_code)}
    )
    out, err = proc.communicate(timeout=60)
    line = next((x for x in out.splitlines() if x.startswith("ENGINE ")), None)
    ran = json.loads(line[len("ENGINE ") :]) if line else None
    return proc, ran, err


def test_a_speculative_vllm_decision_appends_its_speculative_config_and_the_engine_replaces_the_launcher(
    tmp_path: Path,
) -> None:
    proc, ran, err = launch(tmp_path, SPECULATIVE, exit_code=7)
    assert proc.returncode == 7  # the engine's exit code, unchanged
    assert ran is not None and ran["pid"] == proc.pid  # exec: the same process, so signals reach the engine
    assert ran["argv"][:4] == BASE and ran["argv"][4] == "--speculative-config"
    assert json.loads(ran["argv"][5]) == VLLM and len(ran["argv"]) == 6
    assert err.count("\n") == 1 and "speculative γ=4" in err and "3 batch ranges" in err


def test_vllm_before_0_24_gets_the_config_without_the_per_batch_table(tmp_path: Path) -> None:
    _, ran, _ = launch(tmp_path, SPECULATIVE, "--vllm-legacy")
    assert ran is not None
    config = json.loads(ran["argv"][5])
    assert "num_speculative_tokens_per_batch_size" not in config and config["num_speculative_tokens"] == 4


def test_a_speculative_sglang_decision_appends_its_flags_and_writes_the_adaptive_config(
    tmp_path: Path,
) -> None:
    proc, ran, err = launch(tmp_path, SPECULATIVE, engine="sglang")
    assert proc.returncode == 0 and ran is not None
    extra = ran["argv"][len(BASE) :]
    assert extra[: len(SGLANG.split())] == SGLANG.split()
    assert extra[-3:-1] == ["--speculative-adaptive", "--speculative-adaptive-config"]
    assert json.loads(Path(extra[-1]).read_text()) == ADAPTIVE
    assert "adaptive over 3 batch ranges" in err


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("notes", [PLAIN, {"other.io/key": "x"}], ids=["plain", "no-decision"])
def test_plain_decode_or_no_decision_adds_nothing(tmp_path: Path, engine: str, notes: dict[str, str]) -> None:
    proc, ran, err = launch(tmp_path, notes, exit_code=3, engine=engine)
    assert proc.returncode == 3 and ran is not None and ran["argv"] == BASE
    assert "running the command as given" in err


@pytest.mark.parametrize(
    ("engine", "flag"),
    [
        ("vllm", "--speculative-config={}"),
        ("vllm", "--speculative_config"),
        ("sglang", "--speculative-num-steps"),
    ],
)
def test_a_command_that_sets_its_own_speculative_argument_is_refused_with_the_flag_named(
    tmp_path: Path, engine: str, flag: str
) -> None:
    engine_py = tmp_path / "engine.py"
    engine_py.write_text(ENGINE)
    annotations = downward_api_file(tmp_path / "annotations", SPECULATIVE)
    cmd = [sys.executable, "-m", "sovereignspec.cli", "launch", "--engine", engine, "--annotations",
           str(annotations), "--", sys.executable, str(engine_py), "serve", "m", flag, "3"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "ENGINE" not in proc.stdout
    assert f"already sets {flag.split('=', maxsplit=1)[0]}" in proc.stderr and "override" in proc.stderr


def test_a_missing_annotations_file_is_a_clear_error_not_a_plain_start(tmp_path: Path) -> None:
    proc, ran, err = launch(tmp_path, None)
    assert proc.returncode == 2 and ran is None
    assert "downwardAPI volume" in err and str(tmp_path / "none") in err


def test_the_launcher_installs_as_one_standard_library_file_that_runs_on_its_own(tmp_path: Path) -> None:
    target = tmp_path / "launch.py"
    subprocess.run(
        [sys.executable, "-m", "sovereignspec.cli", "launch", "--install", str(target)], check=True
    )
    source = target.read_text()
    imports = {
        line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))
    }
    assert imports <= {"__future__", "argparse", "json", "os", "shlex", "sys", "tempfile", "pathlib"}
    engine_py = tmp_path / "engine.py"
    engine_py.write_text(ENGINE)
    annotations = downward_api_file(tmp_path / "annotations", SPECULATIVE)
    # -I: isolated, so the installed file cannot import this package from the checkout
    proc = subprocess.run(
        [sys.executable, "-I", str(target), "--engine", "vllm", "--annotations", str(annotations),
         "--", sys.executable, str(engine_py), "serve", "m"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "--speculative-config" in proc.stdout


def test_legacy_vllm_runs_plain_when_only_light_batches_would_speculate(tmp_path) -> None:
    from sovereignspec.launch import plan

    notes = {
        "sovereignspec.io/mode": "speculative",
        "sovereignspec.io/draft-budget": "0",
        "sovereignspec.io/vllm-speculative-config": json.dumps(
            {"method": "eagle3", "num_speculative_tokens": 4,
             "num_speculative_tokens_per_batch_size": [[1, 16, 4], [17, 512, 0]]}
        ),
    }  # fmt: skip
    command = ["vllm", "serve", "m"]
    out, line, _ = plan(notes, "vllm", command, tmp_path, vllm_legacy=True)
    assert out == command and "plain decode" in line and "0.24" in line
    out, line, _ = plan(notes, "vllm", command, tmp_path)
    assert out[-2] == "--speculative-config" and "only at lighter batches" in line


def test_sglang_runs_plain_when_its_fixed_gamma_is_zero(tmp_path) -> None:
    from sovereignspec.launch import plan

    notes = {"sovereignspec.io/mode": "speculative", "sovereignspec.io/draft-budget": "0",
             "sovereignspec.io/sglang-args": ""}  # fmt: skip
    out, line, _ = plan(notes, "sglang", ["python3", "-m", "sglang.launch_server"], tmp_path)
    assert out == ["python3", "-m", "sglang.launch_server"] and "plain decode" in line
