"""The arithmetic of `make bench-engine` (benchmarks/engine_bench.py): what it derives from an
engine's counters and timings. The engine itself is measured by the bench, never asserted here."""

from __future__ import annotations

import pytest

from benchmarks.engine_bench import Level, jain
from sovereignspec.core.speedup import tau


def test_jain_is_one_when_both_are_slowed_alike_and_a_half_when_one_takes_everything() -> None:
    assert jain([1.3, 1.3]) == pytest.approx(1.0)
    assert jain([1.0, 0.0]) == pytest.approx(0.5)
    assert 0.5 < jain([1.0, 2.0]) < 1.0


def test_a_level_reads_tau_and_alpha_from_the_spec_counters() -> None:
    # 10 drafting steps of 3 drafts each, every draft accepted: τ = 4, α = 1.
    exact = Level(1, drafts=10, drafted=30, accepted=30)
    assert exact.tau == pytest.approx(4.0)
    assert exact.alpha == pytest.approx(1.0, abs=1e-6)
    # Accepted per drafted token (τ(α, 3) − 1) / 3 at α = 0.7 gives back α = 0.7.
    accepted = 10 * (float(tau(0.7, 3)) - 1.0)
    partial = Level(1, drafts=10, drafted=30, accepted=accepted)
    assert partial.alpha == pytest.approx(0.7, abs=1e-6)
    assert partial.tau == pytest.approx(float(tau(0.7, 3)))
    assert Level(1).alpha is None and Level(1).tau is None  # nothing drafted: nothing to read


def test_the_speed_up_of_a_repeat_is_plain_over_speculative_time_per_token() -> None:
    level = Level(4, plain=[0.030, 0.040], spec=[0.015, 0.050])
    assert level.ratios == pytest.approx([2.0, 0.8])
