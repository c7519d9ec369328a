import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sovereignspec.cli import main

REPO = Path(__file__).resolve().parents[2]


def run(*args, timeout=300):
    """`sovereignspec ARGS` as a user runs it, from the repository root: (exit code, stdout, stderr)."""
    proc = subprocess.run(
        [sys.executable, "-m", "sovereignspec", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--alpha", "1.5"], "--alpha: got '1.5'; accepted: a number in [0.0, 1.0]"),
        (["--alpha", "high"], "--alpha: got 'high'"),
        (["--gamma", "33"], "--gamma: got '33'; accepted: an integer in 0..32"),
        (["--gpu", "B200"], "unknown GPU 'B200'; accepted: A100-80G-SXM"),
        (["--model", "gpt-9"], "unknown model 'gpt-9'; accepted: llama-2-7b-32k, llama-3.1-8b"),
        (["--drafter", "magic"], "unknown drafter 'magic'; accepted: eagle3"),
    ],
)
def test_predict_rejects_bad_input_with_exit_2_naming_the_argument_and_no_traceback(args, needle):
    base = {
        "--gpu": "H100-SXM",
        "--model": "llama-3.1-8b",
        "--drafter": "eagle3",
        "--batch": "8",
        "--context": "1024",
        "--alpha": "0.8",
        "--gamma": "4",
    }
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    code, _, err = run("predict", *[x for kv in base.items() for x in kv])
    assert code == 2 and needle in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--gamma-max", "40"], "--gamma-max: got '40'"),
        (["--slo-slack", "-0.1"], "--slo-slack: got '-0.1'; accepted: a number >= 0.0"),
        (["--alphas", "0.5,2"], "--alphas: got '2'"),
    ],
)
def test_regimes_rejects_bad_input_with_exit_2(args, needle):
    code, _, err = run("regimes", *args)
    assert code == 2 and needle in err and "Traceback" not in err


def test_predict_json_carries_every_term_and_the_speedup(capsys):
    assert (
        main(
            [
                "predict",
                "--gpu",
                "h100-sxm",
                "--model",
                "llama-3.1-8b",
                "--drafter",
                "eagle3",
                "--batch",
                "8",
                "--context",
                "1024",
                "--alpha",
                "0.8",
                "--gamma",
                "4",
                "--format",
                "json",
            ]
        )
        == 0
    )
    terms = json.loads(capsys.readouterr().out)
    assert terms["speedup"] > 2.0 and terms["tau"] == pytest.approx((1 - 0.8**5) / 0.2)
    for key in ("step_plain_ms", "step_spec_ms", "draft_ms", "spec_overhead_ms", "headroom", "gamma_star"):
        assert key in terms


def test_regimes_json_rows_have_the_documented_keys(capsys):
    assert (
        main(
            [
                "regimes",
                "--gpu",
                "H100-SXM",
                "--model",
                "llama-3.1-8b",
                "--drafter",
                "eagle3",
                "--alphas",
                "0.8",
                "--headrooms",
                "1,0",
                "--format",
                "json",
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    keys = {
        "gpu",
        "model",
        "drafter",
        "mix",
        "alpha",
        "headroom",
        "policy",
        "gamma",
        "speedup",
        "aggregate_speedup",
        "slo_violations",
    }
    assert doc["rows"] and all(keys <= row.keys() for row in doc["rows"])
    assert doc["settings"]["headroom_error"] == 0.05


def test_regimes_table_states_the_mix_and_plots_a_png(tmp_path, capsys):
    png = tmp_path / "regimes.png"
    assert (
        main(
            [
                "regimes",
                "--gpu",
                "H100-SXM",
                "--model",
                "llama-3.1-8b",
                "--drafter",
                "eagle3",
                "--alphas",
                "0.6,0.8",
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "homogeneous" in out and "mixed" in out and "chat-ngram" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_operator_knows_who_it_is_under_a_uid_without_a_passwd_entry():
    """The chart runs the image as UID 65532, which has no passwd entry there: kopf's own identity
    (getpass.getuser) raises, ours must not. Tried as that UID, with the system's Python."""
    import os
    import pwd
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    from sovereignspec.operator.runtime import identity

    python = shutil.which("python3", path="/usr/bin:/bin")
    if os.getuid() != 0 or python is None:
        pytest.skip("needs root and a system python3 to run as a UID without a passwd entry")
    with contextlib.suppress(KeyError):
        pwd.getpwuid(65532)
        pytest.skip("UID 65532 has a passwd entry on this machine")
    where = Path(tempfile.mkdtemp(prefix="sovereignspec-uid-"))
    try:
        where.chmod(0o755)
        shutil.copy(identity.__file__, where / "identity.py")
        (where / "identity.py").chmod(0o644)
        code = (
            "import getpass\n"
            "from identity import operator_identity\n"
            "try:\n    getpass.getuser(); print('getuser: ok')\n"
            "except (KeyError, OSError) as exc:\n    print('getuser:', type(exc).__name__)\n"
            "print('identity:', operator_identity())\n"
        )
        env = {"PATH": "/usr/bin:/bin", "POD_NAME": "sovereignspec-abc"}
        out = subprocess.run(
            [python, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=where,
            user=65532, group=65532, check=False,
        )  # fmt: skip
    finally:
        shutil.rmtree(where)
    assert out.returncode == 0, out.stderr
    assert "getuser: KeyError" in out.stdout  # what kopf would have hit
    assert "identity: sovereignspec@sovereignspec-abc/" in out.stdout
