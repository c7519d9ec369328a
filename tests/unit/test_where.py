"""`python -m benchmarks.where`: where a decision's time goes, stage by stage (issue 47 item 1's
profile). Run in its own interpreter: it wraps the Placer's methods to time them."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_stage_profile_gives_each_stage_a_share_of_a_decision_and_of_a_tick() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.where", "--sizes", "160x300"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "160 GPUs, one decision from scratch:" in out and "160 GPUs, a tick of 300 pending:" in out
    shares = {m[1].strip(): float(m[2]) for m in re.finditer(r"^  (.+?)\s+([0-9.]+) %", out, re.M)}
    assert "γ table (every γ, every GPU)" in shares and "choosing the GPU" in shares, out
    assert all(0.0 < s <= 100.0 for s in shares.values()), shares
    # The γ tables are part of the evaluation they are timed inside, never more than it.
    evaluation = [float(m[1]) for m in re.finditer(r"evaluation: .*?([0-9.]+) %", out)]
    tables = [float(m[1]) for m in re.finditer(r"γ table \(every γ, every GPU\)\s+([0-9.]+) %", out)]
    assert len(evaluation) == len(tables) == 2
    assert all(t <= e for t, e in zip(tables, evaluation, strict=True)), out
