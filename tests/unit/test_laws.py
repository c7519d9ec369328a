"""The model's laws, checked with hypothesis over the shipped profiles and wide parameter ranges."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sovereignspec.core.optimiser import SpecRequest, choose, gamma_table
from sovereignspec.core.roofline import roofline_for
from sovereignspec.core.speedup import homogeneous_speedup, tau
from sovereignspec.profiles import load_profiles

PROFILES = load_profiles()
COMBOS = [
    (g, m, d)
    for g in sorted(PROFILES.gpus)
    for m in sorted(PROFILES.models)
    for d in sorted(PROFILES.drafters)
    if PROFILES.drafters[d].supports(m)
]
alphas = st.floats(0.0, 1.0, allow_nan=False)
gammas = st.integers(0, 32)
headrooms = st.floats(0.0, 1.0, allow_nan=False)
contexts = st.sampled_from([64, 256, 512, 1024, 4096, 16384])


@given(alphas, gammas)
def test_tau_is_at_least_one_and_at_most_gamma_plus_one(alpha, gamma):
    t = float(tau(alpha, gamma))
    assert 1.0 - 1e-12 <= t <= gamma + 1 + 1e-9


@given(alphas, alphas, st.integers(1, 32))
def test_tau_increases_with_alpha(a1, a2, gamma):
    assume(a1 < a2)
    assert float(tau(a1, gamma)) < float(tau(a2, gamma)) + 1e-12
    if a2 - a1 > 1e-6:
        assert float(tau(a1, gamma)) < float(tau(a2, gamma))


@given(st.floats(1e-3, 1.0), st.integers(0, 31))
def test_tau_increases_with_gamma(alpha, gamma):
    assert float(tau(alpha, gamma)) <= float(tau(alpha, gamma + 1))
    if alpha ** (gamma + 1) > 1e-12:  # below that the next term is under float resolution
        assert float(tau(alpha, gamma)) < float(tau(alpha, gamma + 1))


def _setup(combo):
    gpu, model, drafter = combo
    d = PROFILES.drafters[drafter]
    return roofline_for(PROFILES.gpus[gpu], PROFILES.models[model]), d.cost_for(model), d.spec_overhead


@settings(max_examples=300)
@given(
    st.sampled_from(COMBOS), alphas, st.integers(0, 32), headrooms, headrooms, contexts, st.integers(1, 64)
)
def test_s_real_never_rises_as_headroom_falls(combo, alpha, gamma, h1, h2, context, batch):
    roof, c, o = _setup(combo)
    high, low = max(h1, h2), min(h1, h2)
    load_high = roof.seqs_for_headroom(high, context) + batch
    load_low = roof.seqs_for_headroom(low, context) + batch
    s_high = homogeneous_speedup(roof, load_high, alpha, gamma, c, o, context)
    s_low = homogeneous_speedup(roof, load_low, alpha, gamma, c, o, context)
    assert float(s_low) <= float(s_high) * (1 + 1e-9)


def _compute_heavy(roof, context):
    return float(roof.seconds_per_token(context)) > context * float(roof.kv_bytes_per_token) / float(
        roof.bandwidth
    )


def test_at_long_context_co_batched_load_can_leave_more_room_for_drafts():
    roof, c, o = _setup(("H100-SXM", "llama-3.1-8b", "ngram"))
    assert not _compute_heavy(roof, 1024)
    assert _gamma_star(roof, c, o, 0.75, 40, 1024, 0.75) > _gamma_star(roof, c, o, 0.75, 40, 1024, 1.0)


def _gamma_star(roof, c, o, alpha, batch, context, h, gamma_max=8, margin=0.02, uncertainty=0.05):
    judged = np.atleast_1d(roof.seqs_for_headroom(max(h - uncertainty, 0.0), context))
    req = SpecRequest(alpha, float(batch), float(context), c, o, gamma_max, margin)
    return int(choose(gamma_table(roof, req, judged, np.full(1, np.inf))).gamma[0])


@settings(max_examples=500)
@given(st.sampled_from(COMBOS), alphas, headrooms, headrooms, contexts, st.integers(1, 64))
def test_gamma_star_never_rises_as_headroom_falls(combo, alpha, h1, h2, context, batch):
    roof, c, o = _setup(combo)
    high, low = max(h1, h2), min(h1, h2)
    # The law holds where a co-batched sequence costs more compute than memory time, so that load
    # eats the room drafts hide in. Past that context (MagicDec's regime) co-batched sequences bring
    # more KV reads than FLOPs and *add* room for drafts; see the next test.
    assume(_compute_heavy(roof, context))
    assert _gamma_star(roof, c, o, alpha, batch, context, low) <= _gamma_star(
        roof, c, o, alpha, batch, context, high
    )


@settings(max_examples=300)
@given(st.sampled_from(COMBOS), st.floats(0.0, 0.95), contexts, st.integers(1, 64))
def test_at_zero_headroom_some_draft_length_is_a_net_loss(combo, alpha, context, batch):
    roof, c, o = _setup(combo)
    load = roof.seqs_for_headroom(0.0, context) + batch
    assume(float(roof.headroom(load, load, context)) == 0.0)  # truly compute-saturated, not KV-capped
    speedups = homogeneous_speedup(roof, load, alpha, np.arange(1, 33), c, o, context)
    assert (speedups < 1.0).any()


@given(st.sampled_from(COMBOS), alphas, headrooms, contexts, st.integers(1, 64))
def test_gamma_star_is_deterministic(combo, alpha, h, context, batch):
    roof, c, o = _setup(combo)
    assert _gamma_star(roof, c, o, alpha, batch, context, h) == _gamma_star(
        roof, c, o, alpha, batch, context, h
    )


def test_idle_gpu_with_good_acceptance_speculates_and_saturated_one_does_not():
    roof, c, o = _setup(("H100-SXM", "llama-3.1-8b", "eagle3"))
    assert _gamma_star(roof, c, o, 0.8, 8, 256, 1.0) >= 4
    assert _gamma_star(roof, c, o, 0.8, 8, 256, 0.0) == 0


@given(st.floats(0.01, 0.99), st.integers(1, 16))
def test_alpha_is_recovered_from_an_engines_draft_acceptance_rate(alpha, gamma):
    from sovereignspec.core.speedup import alpha_from_draft_acceptance

    rate = (float(tau(alpha, gamma)) - 1.0) / gamma
    assert alpha_from_draft_acceptance(rate, gamma) == pytest.approx(alpha, abs=1e-6)
