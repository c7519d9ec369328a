"""The draft budget a placed workload's engine is handed (`core.budget.engine_budget`): when there is
none at all, which limits it is judged with, and when an engine armed at K = 0 reports its armed cost.

Written for the survivors of `hack/mutants.py sovereignspec/core/budget.py` (docs/mutants.md): the
operator's decision tests reach `engine_budget` only through whole decisions, where None and a budget
without a table read the same and a learned margin never appears."""

from __future__ import annotations

import dataclasses
import math

import pytest

from sovereignspec.core.budget import EngineBudget, engine_budget, spec_request
from sovereignspec.core.cluster import PlacerSettings, WorkloadRequest
from sovereignspec.core.decision import DecisionRecord
from sovereignspec.core.handoff import Table, handoff
from sovereignspec.profiles import load_profiles

PROFILES = load_profiles()
GPU, MODEL = "H100-SXM", "llama-3.1-8b"
SETTINGS = PlacerSettings()


def request(**kw: object) -> WorkloadRequest:
    base: dict[str, object] = {
        "name": "w",
        "tenant": "t",
        "model": MODEL,
        "drafter": "eagle3",
        "alpha": 0.8,
        "seqs": 256,
        "context": 1024,
    }
    return WorkloadRequest(**{**base, **kw})  # type: ignore[arg-type]


def record(gamma: int, **kw: object) -> DecisionRecord:
    base: dict[str, object] = {
        "workload": "w",
        "tenant": "t",
        "outcome": "admitted",
        "mode": "speculative" if gamma else "plain",
        "gamma": gamma,
        "reason": "",
        "gpu_type": GPU,
        "headroom": 0.9,
        "headroom_measured": 0.9,
    }
    return DecisionRecord(**{**base, **kw})  # type: ignore[arg-type]


def ks(table: Table | None) -> list[int]:
    """K at batches 1..512 (0 past the table: no table, no speculation)."""
    out = []
    for b in range(1, 513):
        out.append(next((k for lo, hi, k in table or [] if lo <= b <= hi), 0))
    return out


@pytest.mark.parametrize(
    ("why", "w", "r"),
    [
        ("no drafter", request(drafter=None), record(0)),
        ("no headroom reading", request(), record(0, headroom=None)),
        ("no GPU type", request(), record(0, gpu_type=None)),
        ("γ_max 0 declared", request(gamma_max=0), record(0)),
        ("speculation forced off", request(force_plain="bad annotation"), record(0)),
    ],
)
def test_a_workload_missing_what_a_table_needs_gets_no_budget_at_all(
    why: str, w: WorkloadRequest, r: DecisionRecord
) -> None:
    assert engine_budget(PROFILES, SETTINGS, w, r) is None, why


def test_a_workload_allowed_one_draft_token_still_gets_its_per_batch_table() -> None:
    budget = engine_budget(PROFILES, SETTINGS, request(gamma_max=1, seqs=64), record(1))
    assert budget is not None and budget.table is not None
    assert max(ks(budget.table)) == 1


def test_a_speculating_decision_hands_its_table_and_no_armed_cost() -> None:
    """γ* > 0 at the declared batch: the table goes to the engine and the decision's own speed-up
    stands (an armed cost is only for an engine at K = 0 there)."""
    w, r = request(seqs=16), record(3)
    budget = engine_budget(PROFILES, SETTINGS, w, r)
    assert budget is not None and budget.table is not None
    assert budget.armed is None
    assert ks(budget.table)[0] > 0


def test_a_table_at_k_zero_for_the_declared_batch_reports_the_armed_engines_cost() -> None:
    """Plain at the declared batch but speculating at lighter ones: the engine runs armed, a draft
    pass slower than plain, and the decision reports that."""
    budget = engine_budget(PROFILES, SETTINGS, request(seqs=256, context=144, alpha=0.7), record(0))
    assert budget is not None and budget.table is not None
    assert ks(budget.table)[0] > 0 and ks(budget.table)[255] == 0
    assert budget.armed is not None
    speedup, step = budget.armed
    assert 0.0 < speedup < 1.0 and step > 0.0


def test_a_learned_margin_on_the_gpu_type_makes_the_table_more_cautious_never_less() -> None:
    """The extra margin an observed prediction error adds on a GPU type (core.learning) is added to
    the policy's: the table never speculates more, and a wide one speculates less somewhere."""
    w, r = request(seqs=128, alpha=0.7), record(1, headroom=0.6, headroom_measured=0.6)
    plain = engine_budget(PROFILES, SETTINGS, w, r)
    widened = engine_budget(dataclasses.replace(PROFILES, extra_margin={(GPU, MODEL): 0.3}), SETTINGS, w, r)
    assert plain is not None and widened is not None
    before, after = ks(plain.table), ks(widened.table)
    assert all(a <= b for a, b in zip(after, before, strict=True))
    assert after != before


def test_the_table_is_judged_with_the_placements_limits() -> None:
    """The same limits the placement used: the declared γ_max caps every K, and the margin is the
    policy's plus the GPU type's learned one."""
    w, r = request(seqs=16, gamma_max=3), record(3)
    profiles = dataclasses.replace(PROFILES, extra_margin={(GPU, MODEL): 0.05})
    budget = engine_budget(profiles, SETTINGS, w, r)
    assert budget is not None and max(ks(budget.table)) <= 3
    gpu = PROFILES.gpu_for(GPU, MODEL)
    expected = handoff(
        gpu, PROFILES.models[MODEL], PROFILES.drafters["eagle3"], 0.8, 1024.0, 3,
        SETTINGS.margin + 0.05, 0.9, math.inf, (16.0, 3), 0.9,
    )  # fmt: skip
    assert budget.table == expected


def test_an_engine_budget_is_immutable() -> None:
    budget = EngineBudget(None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        budget.table = [[1, 1, 1]]  # type: ignore[misc]


def test_spec_request_says_why_speculation_is_off_and_keeps_the_first_reason() -> None:
    assert spec_request(PROFILES, SETTINGS, request())[1] is None
    assert spec_request(PROFILES, SETTINGS, request(drafter=None))[1] == "no drafter declared"
    assert spec_request(PROFILES, SETTINGS, request(force_plain="bad", drafter=None))[1] == "bad"
    req, why = spec_request(PROFILES, SETTINGS, request(gamma_max=0))
    assert why == "speculation disabled (γ_max = 0)" and req.gamma_max == 0
    req, why = spec_request(PROFILES, PlacerSettings(gamma_max=4), request(gamma_max=6))
    assert why is None and req.gamma_max == 4
