"""Decisions that age: a running workload's γ judged again at its GPU's reading now."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sovereignspec.core.cluster import PlacerSettings, WorkloadRequest
from sovereignspec.core.roofline import tensor_parallel_for
from sovereignspec.core.running import reevaluate
from sovereignspec.core.scalar import Coeffs, best_gamma, speedup_at, tau
from sovereignspec.profiles import load_profiles

PROFILES = load_profiles()


def chat(alpha: float = 0.8, seqs: int = 8) -> WorkloadRequest:
    return WorkloadRequest(name="ns/chat", tenant="t", model="llama-3.1-8b", drafter="eagle3", alpha=alpha,
                           seqs=seqs, context=1024)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    gpu=st.sampled_from(sorted(PROFILES.gpus)),
    alpha=st.floats(0.05, 0.95),
    seqs=st.integers(1, 64),
    headroom=st.floats(0.0, 1.0),
)
def test_the_speedup_in_force_of_the_optimisers_own_choice_is_the_one_it_chose_by(
    gpu: str, alpha: float, seqs: int, headroom: float
) -> None:
    model = PROFILES.models["llama-3.1-8b"]
    g = PROFILES.gpus[gpu]
    c = Coeffs.of(g, model, tensor_parallel_for(g, model))
    d = PROFILES.drafters["eagle3"]
    taus = [tau(alpha, k) for k in range(9)]
    args = (seqs, 1024.0, d.cost_for(model.name), d.spec_overhead)
    choice = best_gamma(c, taus, *args, 0.02, headroom, float("inf"), True)
    own, aggregate = speedup_at(c, taus, choice.gamma, *args, headroom)
    assert own == pytest.approx(taus[choice.gamma] * choice.plain / choice.step, rel=1e-12)
    if choice.gamma > 0:
        assert own >= 1.02 - 1e-9  # the self-benefit it was chosen for
        assert aggregate >= 1.0 - 1e-9  # and it beat plain decode (aggregate 1) on the objective
    assert speedup_at(c, taus, 0, *args, headroom) == (1.0, 1.0)


def test_speculation_that_paid_on_an_idle_gpu_is_a_net_loss_once_the_gpu_saturates() -> None:
    policy = PlacerSettings()
    idle = reevaluate(PROFILES, policy, chat(), "H100-SXM", 6, 1.0)
    busy = reevaluate(PROFILES, policy, chat(), "H100-SXM", 6, 0.0)
    assert idle is not None and busy is not None
    assert idle.gamma_now >= 1 and idle.aggregate_in_force > 1.0
    # Its own tokens still come faster (verification is memory-bound), but the GPU's do not.
    assert busy.gamma_now == 0 and busy.aggregate_in_force < 1.0 < busy.speedup_in_force


def test_a_gpu_type_without_a_profile_is_not_judged() -> None:
    assert reevaluate(PROFILES, PlacerSettings(), chat(), "B300-unknown", 4, 1.0) is None


def test_a_learned_margin_on_the_gpu_type_makes_the_judgement_of_a_running_workload_more_cautious() -> None:
    """The extra margin an observed prediction error adds on a GPU type (core.learning) is added to
    the policy's when a running workload is judged again, as when it was placed: never less cautious."""
    policy = PlacerSettings()
    plain = reevaluate(PROFILES, policy, chat(), "H100-SXM", 6, 1.0)
    wide = dataclasses.replace(PROFILES, extra_margin={("H100-SXM", "llama-3.1-8b"): 0.3})
    widened = reevaluate(wide, policy, chat(), "H100-SXM", 6, 1.0)
    huge = reevaluate(dataclasses.replace(PROFILES, extra_margin={("H100-SXM", "llama-3.1-8b"): 50.0}),
                      policy, chat(), "H100-SXM", 6, 1.0)  # fmt: skip
    assert plain is not None and widened is not None and huge is not None
    assert plain.gamma_now >= 1 and widened.gamma_now <= plain.gamma_now
    assert huge.gamma_now == 0  # no speed-up clears a 50× margin
    # What it runs at is priced the same whatever the margin: the margin judges, it does not price.
    assert huge.speedup_in_force == plain.speedup_in_force
