"""`sovereignspec launch` against a stand-in engine that prints its argv and PID and exits with a
chosen code: what it appends, what it refuses, and that the engine replaces it (exec)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import go_quoted

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
PER_BATCH_KEY = "num_speculative_tokens_per_batch_size"


@pytest.fixture
def downward_api_file(go_quote: Path):  # type: ignore[no-untyped-def]
    """Writes `notes` as the kubelet writes a downwardAPI annotations file."""

    def write(path: Path, notes: dict[str, str]) -> Path:
        path.write_bytes(go_quoted(go_quote, notes))
        return path

    return write


@pytest.fixture
def launch(downward_api_file):  # type: ignore[no-untyped-def]
    def run(
        tmp_path: Path,
        notes: dict[str, str] | None,
        *args: str,
        exit_code: int = 0,
        engine: str = "vllm",
        extra: list[str] | None = None,
    ):  # type: ignore[no-untyped-def]
        written = downward_api_file(tmp_path / "annotations", notes) if notes is not None else None
        return _launch(
            tmp_path,
            written or tmp_path / "none",
            *args,
            exit_code=exit_code,
            engine=engine,
            extra=extra or [],
        )

    return run


def _launch(  # type: ignore[no-untyped-def]
    tmp_path: Path,
    annotations: Path,
    *args: str,
    exit_code: int = 0,
    engine: str = "vllm",
    extra: tuple[str, ...] = (),
):
    engine_py = tmp_path / "engine.py"
    engine_py.write_text(ENGINE)
    cmd = [sys.executable, "-m", "sovereignspec.cli", "launch", "--engine", engine,
           "--annotations", str(annotations), "--config-dir", str(tmp_path), *args,
           "--", sys.executable, str(engine_py), *BASE, *extra]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={"ENGINE_EXIT": str(exit_code)}
    )
    out, err = proc.communicate(timeout=60)
    line = next((x for x in out.splitlines() if x.startswith("ENGINE ")), None)
    ran = json.loads(line[len("ENGINE ") :]) if line else None
    return proc, ran, err


def test_a_speculative_vllm_decision_appends_its_speculative_config_and_the_engine_replaces_the_launcher(
    launch,
    tmp_path: Path,
) -> None:
    proc, ran, err = launch(tmp_path, SPECULATIVE, exit_code=7)
    assert proc.returncode == 7  # the engine's exit code, unchanged
    assert ran is not None and ran["pid"] == proc.pid  # exec: the same process, so signals reach the engine
    assert ran["argv"][:4] == BASE and ran["argv"][4] == "--speculative-config"
    assert json.loads(ran["argv"][5]) == VLLM and len(ran["argv"]) == 6
    assert err.count("\n") == 1 and "speculative γ=4" in err and "3 batch ranges" in err


def test_vllm_before_0_24_gets_the_config_without_the_per_batch_table(launch, tmp_path: Path) -> None:
    _, ran, _ = launch(tmp_path, SPECULATIVE, "--vllm-legacy")
    assert ran is not None
    config = json.loads(ran["argv"][5])
    assert "num_speculative_tokens_per_batch_size" not in config and config["num_speculative_tokens"] == 4


def test_a_speculative_sglang_decision_appends_its_flags_and_writes_the_adaptive_config(
    launch,
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
def test_plain_decode_or_no_decision_adds_nothing(
    launch, tmp_path: Path, engine: str, notes: dict[str, str]
) -> None:
    proc, ran, err = launch(tmp_path, notes, exit_code=3, engine=engine)
    assert proc.returncode == 3 and ran is not None and ran["argv"] == BASE
    assert "running the command as given" in err


@pytest.mark.parametrize(
    ("engine", "flag"),
    [
        ("vllm", "--speculative-config={}"),
        ("vllm", "--speculative_config"),
        ("vllm", "--spec-tokens"),  # vLLM 0.32's top-level alias
        ("vllm", "--spec_method=ngram"),
        ("vllm", "-sc"),
        ("vllm", "--speculative-config.num_speculative_tokens"),  # one key of the JSON option
        ("vllm", "--spec-tok"),  # argparse takes an unambiguous prefix
        ("vllm", "--speculative"),
        ("sglang", "--speculative-num-steps"),
        ("sglang", "--speculative-algo"),
        ("sglang", "--spec"),
    ],
)
def test_a_command_that_sets_its_own_speculative_argument_is_refused_with_the_flag_named(
    downward_api_file, tmp_path: Path, engine: str, flag: str
) -> None:
    engine_py = tmp_path / "engine.py"
    engine_py.write_text(ENGINE)
    annotations = downward_api_file(tmp_path / "annotations", SPECULATIVE)
    cmd = [sys.executable, "-m", "sovereignspec.cli", "launch", "--engine", engine, "--annotations",
           str(annotations), "--", sys.executable, str(engine_py), "serve", "m", flag, "3"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "ENGINE" not in proc.stdout
    assert f"already sets {flag.split('=', maxsplit=1)[0]}" in proc.stderr and "override" in proc.stderr


@pytest.mark.parametrize(
    ("engine", "words"),
    [
        ("vllm", ["--spec-tokens", "3"]),
        ("vllm", ["-sc", '{"method": "ngram"}']),
        ("vllm", ['--speculative_config={"method":"ngram"}']),
        ("vllm", ["--speculative-config.method", "ngram"]),
        ("vllm", ["--spec-tok", "3"]),
        ("sglang", ["--speculative-algorithm", "EAGLE"]),
        ("sglang", ["--spec", "EAGLE"]),
    ],
)
def test_a_plain_decision_refuses_a_command_that_would_speculate_naming_the_flag(
    launch, tmp_path: Path, engine: str, words: list[str]
) -> None:
    # The plain decision is the one that protects the GPU's neighbours: the command may not undo it.
    proc, ran, err = launch(tmp_path, PLAIN, engine=engine, extra=words)
    assert proc.returncode == 2 and ran is None, err
    flag = words[0].split("=", 1)[0]
    assert "plain decode decided" in err and f"sets {flag}" in err and "speculate against" in err, err


def test_a_plain_decision_refuses_a_config_file_that_speculates_naming_the_key(
    launch, tmp_path: Path
) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("speculative_config:\n  method: ngram\n")
    proc, ran, err = launch(tmp_path, PLAIN, extra=["--config", str(config)])
    assert proc.returncode == 2 and ran is None
    assert f"speculative_config (in --config {config})" in err and "plain decode" in err


def test_a_pod_without_a_decision_still_runs_the_command_as_given(launch, tmp_path: Path) -> None:
    # No SovereignSpec decision at all (not admitted through our check): nothing to keep.
    proc, ran, err = launch(tmp_path, {"other.io/key": "x"}, extra=["--spec-tokens", "3"])
    assert proc.returncode == 0 and ran is not None and ran["argv"][-2:] == ["--spec-tokens", "3"], err


def test_a_missing_annotations_file_is_a_clear_error_not_a_plain_start(launch, tmp_path: Path) -> None:
    proc, ran, err = launch(tmp_path, None)
    assert proc.returncode == 2 and ran is None
    assert "downwardAPI volume" in err and str(tmp_path / "none") in err


def test_the_launcher_installs_as_one_standard_library_file_that_runs_on_its_own(
    downward_api_file, tmp_path: Path
) -> None:
    target = tmp_path / "launch.py"
    subprocess.run(
        [sys.executable, "-m", "sovereignspec.cli", "launch", "--install", str(target)], check=True
    )
    source = target.read_text()
    imports = {
        line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))
    }
    assert imports <= set(sys.stdlib_module_names) | {"__future__"}  # the standard library only
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
    out, line, _ = plan(notes, "vllm", command, tmp_path, {"vllm_legacy": True})
    assert out == command and "plain decode" in line and "0.24" in line
    out, line, _ = plan(notes, "vllm", command, tmp_path)
    assert out[-2] == "--speculative-config" and "only at lighter batches" in line


def test_sglang_runs_plain_when_its_fixed_gamma_is_zero(tmp_path) -> None:
    from sovereignspec.launch import plan

    notes = {"sovereignspec.io/mode": "speculative", "sovereignspec.io/draft-budget": "0",
             "sovereignspec.io/sglang-args": ""}  # fmt: skip
    out, line, _ = plan(notes, "sglang", ["python3", "-m", "sglang.launch_server"], tmp_path)
    assert out == ["python3", "-m", "sglang.launch_server"] and "plain decode" in line


# Every C0 and C1 control character, DEL, line and paragraph separators, a private-use plane
# character, a lone replacement character, printable non-ASCII and the quoting characters.
HOSTILE = "".join(chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)])
HOSTILE += '\u2028\u2029\U000f0000\ufffd é ✓ 🙂 \u0301 "quoted" \\back\\ key=value'


def test_go_quoted_values_read_back_exactly_as_the_kubelet_wrote_them(go_quote: Path) -> None:
    from sovereignspec.launch import unquote_go

    notes = {f"k{c:04x}": f"<{chr(c)}>" for c in range(0x300) if not 0xD800 <= c <= 0xDFFF}
    notes |= {"hostile": HOSTILE, "astral": "\U0001f600\U000f0000\U0010fffd", "empty": ""}
    text = go_quoted(go_quote, notes).decode()
    assert "\\a" in text and "\\x01" in text and "\\u0085" in text and "\\U000f0000" in text
    read = {}
    for line in text.split("\n"):
        key, _, value = line.partition("=")
        read[key] = unquote_go(value)
    assert read == notes


def test_a_neighbours_annotation_with_every_control_character_never_stops_the_engine(
    launch, tmp_path: Path
) -> None:
    notes = {**SPECULATIVE, "team.example.com/notes": HOSTILE, "z.example.com/x": "\x00"}
    proc, ran, err = launch(tmp_path, notes)
    assert proc.returncode == 0 and ran is not None, err
    assert json.loads(ran["argv"][5]) == VLLM


def test_an_unreadable_line_that_is_not_ours_is_skipped_and_one_of_ours_is_named(tmp_path: Path) -> None:
    from sovereignspec.launch import LaunchError, read_annotations

    path = tmp_path / "annotations"
    path.write_text(
        'other.io/a="ok"\nother.io/b=not quoted\nother.io/c="bad \\q escape"\nsovereignspec.io/mode="plain"'
    )
    assert read_annotations(path) == {"other.io/a": "ok", "sovereignspec.io/mode": "plain"}
    path.write_text('sovereignspec.io/mode="plain\nsovereignspec.io/draft-budget="0"')
    with pytest.raises(LaunchError, match=r"line 1: annotation sovereignspec\.io/mode is not"):
        read_annotations(path)


EAGER = json.dumps({"method": "eagle3", "num_speculative_tokens": 4, "enforce_eager": 1})
SHORT_ROWS = json.dumps({"method": "eagle3", "num_speculative_tokens": 4, PER_BATCH_KEY: [[1, 2]]})


@pytest.mark.parametrize(
    ("engine", "key", "value", "needle"),
    [
        ("vllm", "mode", "turbo", "mode annotation: got 'turbo'; accepted: speculative, plain"),
        ("vllm", "vllm-speculative-config", "[1, 2]", "accepted: a JSON object"),
        ("vllm", "vllm-speculative-config", "{not json", "not JSON"),
        ("vllm", "vllm-speculative-config", EAGER, "unknown key(s) ['enforce_eager']"),
        ("vllm", "vllm-speculative-config", '{"method": "eagle3", "num_speculative_tokens": "4"}',
         "num_speculative_tokens '4'; accepted: an integer >= 1"),
        ("vllm", "vllm-speculative-config", SHORT_ROWS, "num_speculative_tokens_per_batch_size [[1, 2]]"),
        ("sglang", "sglang-args", "--speculative-algorithm EAGLE3 --trust-remote-code x",
         "'--trust-remote-code' is not a speculative flag SovereignSpec writes"),
        ("sglang", "sglang-args", "--speculative-algorithm", "--speculative-algorithm has no value"),
        ("sglang", "sglang-args", "--speculative-algorithm 'EAGLE3", "No closing quotation"),
        ("sglang", "sglang-adaptive-config", "[0]", "accepted: a JSON object of batch ranges"),
    ],
)  # fmt: skip
def test_a_malformed_value_of_ours_is_one_clear_line_and_no_engine(
    launch, tmp_path: Path, engine: str, key: str, value: str, needle: str
) -> None:
    proc, ran, err = launch(tmp_path, {**SPECULATIVE, f"sovereignspec.io/{key}": value}, engine=engine)
    assert proc.returncode == 2 and ran is None
    assert needle in err and "Traceback" not in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("engine", "text", "named"),
    [
        ("vllm", "port: 8000\nspeculative_config:\n  method: ngram\n", "speculative_config"),
        ("vllm", "spec-tokens: 3\n", "spec-tokens"),
        ("vllm", '{"max-num-seqs": 8, "speculative-config": {"method": "ngram"}}', "speculative-config"),
        ("sglang", "speculative-algorithm: EAGLE\n", "speculative-algorithm"),
    ],
)
def test_a_config_file_that_sets_speculation_is_refused_naming_the_key_and_file(
    launch, tmp_path: Path, engine: str, text: str, named: str
) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(text)
    proc, ran, err = launch(tmp_path, SPECULATIVE, engine=engine, extra=["--config", str(config)])
    assert proc.returncode == 2 and ran is None
    assert f"{named} (in --config {config})" in err and "override" in err


def test_a_config_file_without_speculation_runs_and_an_unreadable_one_is_named(
    launch, tmp_path: Path
) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("max-num-seqs: 8\n# speculative_config: {} is a comment\nextra:\n  spec-tokens: 1\n")
    proc, ran, _ = launch(tmp_path, SPECULATIVE, extra=[f"--config={config}"])
    assert proc.returncode == 0 and ran is not None
    proc, ran, err = launch(tmp_path, SPECULATIVE, extra=["--config", str(tmp_path / "missing.yaml")])
    assert proc.returncode == 2 and ran is None and "missing.yaml" in err


@pytest.mark.parametrize("flag", [["--data-parallel-size", "2"], ["-dp", "4"], ["--data_parallel_size=2"]])
def test_vllm_with_data_parallelism_gets_the_fixed_gamma_because_it_would_drop_the_table(
    launch, tmp_path: Path, flag: list[str]
) -> None:
    proc, ran, err = launch(tmp_path, SPECULATIVE, extra=flag)
    assert proc.returncode == 0 and ran is not None
    config = json.loads(ran["argv"][ran["argv"].index("--speculative-config") + 1])
    assert PER_BATCH_KEY not in config and config["num_speculative_tokens"] == 4  # the decided γ
    assert "drops the per-batch table with data parallelism" in err
    light = {**SPECULATIVE, "sovereignspec.io/draft-budget": "0"}  # speculates only at light batches
    proc, ran, err = launch(tmp_path, light, extra=flag)
    assert ran is not None and ran["argv"] == BASE + flag and "plain decode" in err


def test_one_data_parallel_rank_keeps_the_table(launch, tmp_path: Path) -> None:
    _, ran, _ = launch(tmp_path, SPECULATIVE, extra=["--data-parallel-size", "1"])
    assert ran is not None
    config = json.loads(ran["argv"][ran["argv"].index("--speculative-config") + 1])
    assert config[PER_BATCH_KEY] == VLLM[PER_BATCH_KEY]


def test_sglang_with_dp_attention_gets_the_fixed_gamma_because_it_runs_no_adaptive_table(
    launch, tmp_path: Path
) -> None:
    two = {**SPECULATIVE, "sovereignspec.io/draft-budget": "2"}
    proc, ran, err = launch(
        tmp_path, two, engine="sglang", extra=["--enable-dp-attention", "--enable-metrics"]
    )
    assert proc.returncode == 0 and ran is not None
    extra = ran["argv"][len(BASE) + 2 :]
    assert extra[extra.index("--speculative-num-steps") + 1] == "2"
    assert extra[extra.index("--speculative-num-draft-tokens") + 1] == "3"
    assert "--speculative-adaptive" not in extra and "runs no adaptive table" in err
    light = {**SPECULATIVE, "sovereignspec.io/draft-budget": "0"}
    proc, ran, err = launch(tmp_path, light, engine="sglang", extra=["--enable-dp-attention"])
    assert ran is not None and ran["argv"] == [*BASE, "--enable-dp-attention"] and "plain decode" in err


@pytest.mark.parametrize(("extra", "warned"), [([], True), (["--enable-metrics"], False)])
def test_sglang_without_its_metrics_flag_is_told_what_is_lost(
    launch, tmp_path: Path, extra: list[str], warned: bool
) -> None:
    proc, ran, err = launch(tmp_path, SPECULATIVE, engine="sglang", extra=extra)
    assert proc.returncode == 0 and ran is not None
    assert ("without --enable-metrics" in err) is warned
