"""The regime analysis of the source, on the shipped profiles: the issue's acceptance checks."""

import itertools
from collections import defaultdict

import pytest

from sovereignspec.analysis.regimes import POLICIES, RegimeSettings, analyse
from sovereignspec.core.roofline import roofline_for


@pytest.fixture(scope="module")
def rows(profiles):
    return analyse(profiles, RegimeSettings())


@pytest.fixture(scope="module")
def groups(rows):
    out = defaultdict(dict)
    for r in rows:
        out[(r.gpu, r.model, r.drafter, r.mix, r.alpha, r.headroom)][r.policy] = r
    return out


def test_the_sweep_covers_idle_to_saturated_for_alphas_0_6_and_0_8_with_every_policy(rows):
    assert {r.headroom for r in rows} >= {0.0, 1.0}
    assert {0.6, 0.8} <= {r.alpha for r in rows}
    assert {r.policy for r in rows} == set(POLICIES)
    assert {r.mix for r in rows} == {"homogeneous", "mixed"}


def test_idle_h100_at_alpha_0_8_gives_sovereignspec_at_least_2x(rows):
    points = [
        r for r in rows if (r.gpu, r.headroom, r.alpha, r.policy) == ("H100-SXM", 1.0, 0.8, "sovereignspec")
    ]
    assert points and all(r.speedup >= 2.0 for r in points), [(r.model, r.drafter, r.speedup) for r in points]


def test_always_k_speedup_never_rises_as_headroom_falls(rows):
    series = defaultdict(list)
    for r in rows:
        if r.policy.startswith("always-"):
            series[(r.gpu, r.model, r.drafter, r.mix, r.alpha, r.policy)].append(r)
    for key, points in series.items():
        points.sort(key=lambda r: -r.headroom)
        for a, b in itertools.pairwise(points):
            assert b.speedup <= a.speedup * (1 + 1e-9), (key, a.headroom, a.speedup, b.headroom, b.speedup)


def _kv_capped(profiles, gpu, model, context=256):
    """The KV cache fills before the compute ridge: 'saturated' is then memory, not compute."""
    roof = roofline_for(profiles.gpus[gpu], profiles.models[model])
    return float(roof.seqs_for_headroom(0.0, context)) >= float(roof.max_seqs(context)) * (1 - 1e-9)


def _h100_saturated(groups, profiles, alpha, policy, kv_capped=False):
    return [
        cells[policy].speedup
        for (gpu, model, _, mix, a, h), cells in groups.items()
        if (gpu, mix, a, h) == ("H100-SXM", "homogeneous", alpha, 0.0)
        and _kv_capped(profiles, gpu, model) == kv_capped
    ]


def test_saturated_h100_homogeneous_pays_the_decode_tax(groups, profiles):
    assert max(_h100_saturated(groups, profiles, 0.6, "always-4")) < 1.0
    assert max(_h100_saturated(groups, profiles, 0.6, "always-8")) < 0.8  # a tax over 20 %
    assert min(_h100_saturated(groups, profiles, 0.6, "always-4")) < 0.8  # for EAGLE-3 on the 8B


def test_where_the_kv_cache_fills_before_the_ridge_speculation_still_pays_at_saturation(groups, profiles):
    # MagicDec's regime: a model with a large KV cache per token (LLaMA-2-7B-32K, full attention) is
    # memory-bound at every load that fits, so verification stays cheap.
    capped = _h100_saturated(groups, profiles, 0.8, "sovereignspec", kv_capped=True)
    assert capped and min(capped) > 1.2


def test_sovereignspec_tracks_the_best_safe_baseline_and_the_oracle_and_never_loses(groups):
    for key, cells in groups.items():
        ours = cells["sovereignspec"].aggregate_speedup
        safe = [cells["never"]] + [
            cells[p] for p in ("always-2", "always-4", "always-8") if cells[p].slo_violations == 0
        ]
        # Within 2 %: on an idle GPU the reading cannot overstate headroom (it is capped at 1), so
        # judging it one uncertainty worse can cost a notch of γ there.
        assert ours >= 0.98 * max(c.aggregate_speedup for c in safe), key
        assert ours >= 0.97 * cells["oracle"].aggregate_speedup, key
        assert ours >= 0.99, key


def test_sovereignspec_violates_no_slo_and_dropping_the_externality_check_does(rows):
    assert sum(r.slo_violations for r in rows if r.policy == "sovereignspec") == 0
    assert sum(r.slo_violations for r in rows if r.policy == "oracle") == 0
    assert sum(r.slo_violations for r in rows if r.policy == "sovereignspec-no-externality") > 0


def test_adapting_gamma_to_headroom_recovers_a_relative_gain_over_fixed_speculation(groups):
    # The source: adapting the draft budget to headroom alone recovers ~20 % over a fixed budget.
    # Averaged over the fixed budgets 2, 4 and 8 from 0.7 headroom down to saturation (the measured
    # model gives about 4 %, 9 % and 42 % against each: the gain sits where a fixed budget is long).
    means = []
    for fixed in ("always-2", "always-4", "always-8"):
        gains = [
            cells["sovereignspec"].speedup / cells[fixed].speedup
            for (gpu, _, _, mix, _, h), cells in groups.items()
            if mix == "homogeneous" and h <= 0.7
        ]
        means.append(sum(gains) / len(gains))
        assert means[-1] > 1.0, fixed
    assert sum(means) / len(means) >= 1.15
