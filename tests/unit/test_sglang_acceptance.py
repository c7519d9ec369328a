"""α from SGLang's gauges, per the meaning its `sglang:spec_accept_rate` has in the version that
exports it. SGLang's PR #23530 (merged 2026-04-23) made the rate accepted drafts over proposed drafts,
(τ-1)/γ; before it, τ/(γ+1). A reader with the old meaning biases α low on today's SGLang (0.8 read as
0.76 at γ 4, 0.5 as 0.37 at γ 1): these cases fail with it. The queries are answered from a table
(no Prometheus): what is tested is the arithmetic, not the transport."""

from __future__ import annotations

from typing import Any

import pytest

from sovereignspec.core.scalar import tau
from sovereignspec.telemetry.prometheus import PrometheusReader

KEY = {"namespace": "team-a", "model_name": "llama-3.1-8b"}


class Gauges(PrometheusReader):
    def __init__(self, length: float, rate: float, **kw: Any) -> None:
        super().__init__("http://unused.invalid", **kw)
        self.gauges = {"sglang:spec_accept_length": length, "sglang:spec_accept_rate": rate}

    def query(self, promql: str, at: float | None = None) -> list[tuple[dict[str, str], float, float]]:
        for name, value in self.gauges.items():
            if f"({name}[" in promql:
                return [(dict(KEY), value, 0.0)]
        return []


def read(length: float, rate: float, **kw: Any) -> float | None:
    got = Gauges(length, rate, **kw).acceptance().get(("team-a", "llama-3.1-8b"))
    return None if got is None else got[0]


CASES = [(alpha, gamma) for alpha in (0.3, 0.5, 0.8, 0.95) for gamma in (1, 3, 4, 7)]


@pytest.mark.parametrize(("alpha", "gamma"), CASES)
def test_todays_sglang_rate_of_accepted_drafts_gives_the_true_alpha(alpha: float, gamma: int) -> None:
    t = tau(alpha, gamma)
    assert read(t, (t - 1) / gamma) == pytest.approx(alpha, abs=1e-6)


@pytest.mark.parametrize(("alpha", "gamma"), CASES)
def test_sglang_before_the_change_is_read_with_its_own_meaning_when_configured(
    alpha: float, gamma: int
) -> None:
    t = tau(alpha, gamma)
    assert read(
        t, t / (gamma + 1), engine_options={"sglang": {"accept_rate": "tokens-with-bonus"}}
    ) == pytest.approx(alpha, abs=1e-6)


@pytest.mark.parametrize(("alpha", "gamma", "biased"), [(0.8, 4, 0.76), (0.5, 1, 0.37)])
def test_the_old_meaning_on_todays_gauges_is_the_bias_the_issue_names(
    alpha: float, gamma: int, biased: float
) -> None:
    t = tau(alpha, gamma)
    assert read(
        t, (t - 1) / gamma, engine_options={"sglang": {"accept_rate": "tokens-with-bonus"}}
    ) == pytest.approx(biased, abs=0.01)


def test_no_draft_accepted_is_alpha_zero_not_a_division_by_zero() -> None:
    assert read(1.0, 0.0) == 0.0


@pytest.mark.parametrize(("length", "rate"), [(0.5, 0.5), (2.0, 1.5), (float("nan"), 0.5), (3.0, 0.0)])
def test_impossible_gauges_are_not_evidence(length: float, rate: float) -> None:
    assert read(length, rate) is None
