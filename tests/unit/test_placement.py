"""Placement decisions, table-driven, and the vectorised placer against the scalar reference."""

import dataclasses
import math
import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.reference import reference_tick
from sovereignspec.core.cluster import (
    ClusterView,
    GpuState,
    NodeState,
    Placement,
    PlacerSettings,
    WorkloadRequest,
)
from sovereignspec.core.placement import Placer
from sovereignspec.core.running import Reevaluation
from sovereignspec.core.sovereignty import DEFAULT_JURISDICTION_LABEL as JUR


def cluster(*specs):
    """specs: (node, gpu type, headrooms per GPU, jurisdiction, tenants, exclusive tenants, slo ratios)."""
    nodes, gpus = [], []
    for spec in specs:
        name, gpu_type, headrooms, jurisdiction = spec[:4]
        tenants = frozenset(spec[4]) if len(spec) > 4 else frozenset()
        exclusive = frozenset(spec[5]) if len(spec) > 5 else frozenset()
        ratios = spec[6] if len(spec) > 6 else [math.inf] * len(headrooms)
        labels = {JUR: jurisdiction} if jurisdiction else {}
        nodes.append(
            NodeState(name, labels, free_gpus=len(headrooms), tenants=tenants, exclusive_tenants=exclusive)
        )
        gpus += [
            GpuState(name, i, gpu_type, h, q) for i, (h, q) in enumerate(zip(headrooms, ratios, strict=True))
        ]
    return ClusterView(nodes, gpus)


def wl(name="w", tenant="t", alpha=0.8, drafter="eagle3", cls="latency", **kw):
    return WorkloadRequest(
        name, tenant, kw.pop("model", "llama-3.1-8b"), drafter, alpha, latency_class=cls, **kw
    )


def test_latency_work_with_high_acceptance_goes_to_headroom_and_speculates(profiles):
    view = cluster(("busy", "H100-SXM", [0.05], "eu"), ("idle", "H100-SXM", [0.95], "eu"))
    p = Placer(profiles, view).place(wl())
    assert (p.node, p.mode) == ("idle", "speculative") and p.gamma >= 1
    assert p.record.speedup > 1.5 and "γ*=" in p.record.reason


def test_throughput_work_goes_where_it_adds_the_most_tokens_not_beside_a_speculator(profiles):
    view = cluster(("a", "H100-SXM", [0.95], "eu"), ("b", "H100-SXM", [0.9], "eu"))
    placer = Placer(profiles, view)
    chat = placer.place(wl("chat"))
    assert chat.node == "a" and chat.gamma > 0
    bulk = placer.place(wl("bulk", cls="throughput", alpha=0.4, drafter=None))
    # On a, the speculating chat would lose more tokens than b's smaller headroom costs the bulk.
    assert (bulk.node, bulk.mode, bulk.gamma) == ("b", "plain", 0)


def test_all_gpus_saturated_means_plain_decode_not_delay(profiles):
    view = cluster(("a", "H100-SXM", [0.0, 0.0], "eu"), ("b", "A100-80G-SXM", [0.0], "eu"))
    p = Placer(profiles, view).place(wl())
    assert p.outcome == "placed" and p.gamma == 0
    # Nothing raises the GPU's token rate there: not a self-benefit refusal, not a neighbour's.
    assert p.record.reason == "no γ raises the GPU's token rate at this headroom (saturated): plain decode"
    assert p.record.unconstrained_gamma == 0


def test_a_tight_neighbour_on_the_only_idle_gpu_keeps_the_newcomer_plain_and_is_named(profiles):
    # A neighbour with three times its TPOT to spare leaves room, even judged 20 % tighter.
    loose = Placer(profiles, cluster(("only", "H100-SXM", [0.9], "eu", ["old"], [], [3.0]))).place(
        wl(seqs=64)
    )
    assert loose.gamma > 0
    view = cluster(("only", "H100-SXM", [0.9], "eu", ["old"], [], [1.0005]))
    placer = Placer(profiles, view)
    placer.binding[0] = "old-tenant/chat"
    p = placer.place(wl(seqs=64))  # big enough a share that speculating would pay the GPU
    assert p.gamma == 0 and "old-tenant/chat" in p.record.reason
    assert p.record.binding_neighbour == "old-tenant/chat"


def test_stale_telemetry_means_plain_with_the_reason(profiles):
    view = cluster(("n", "H100-SXM", [None], "eu"))
    p = Placer(profiles, view).place(wl())
    assert p.gamma == 0 and "telemetry" in p.record.reason and p.record.headroom is None


def test_jurisdiction_is_never_crossed_whatever_the_headroom(profiles):
    view = cluster(("kr-busy", "RTX-4090", [0.0], "kr"), ("eu-idle", "H100-SXM", [1.0], "eu"))
    p = Placer(profiles, view).place(wl(jurisdiction="kr"))
    assert p.node == "kr-busy"
    assert "eu-idle" in p.record.excluded and "jurisdiction" in p.record.excluded["eu-idle"]


def test_no_node_in_the_required_jurisdiction_is_rejected_not_retried(profiles):
    view = cluster(("eu", "H100-SXM", [1.0], "eu"))
    p = Placer(profiles, view).place(wl(jurisdiction="kr"))
    assert p.outcome == "rejected" and "kr" in p.record.reason


def test_an_exclusive_tenant_never_shares_in_both_directions(profiles):
    view = cluster(("shared", "H100-SXM", [1.0, 1.0], "eu", ["other"]), ("empty", "H100-SXM", [0.1], "eu"))
    placer = Placer(profiles, view)
    first = placer.place(wl("secret", "bank", exclusive=True))
    assert first.node == "empty"
    second = placer.place(wl("next", "shop", alpha=0.9))
    assert second.node == "shared"
    full = Placer(profiles, cluster(("held", "H100-SXM", [1.0], "eu", ["bank"], ["bank"])))
    blocked = full.place(wl("x", "shop"))
    assert blocked.outcome == "retry" and "exclusive" in blocked.record.excluded["held"]


def test_a_placement_tells_later_records_who_now_holds_the_node(profiles):
    # The per-node tenancy behind the records' reasons follows each commit: a new tenant on the
    # node, and a tenant already there taking it exclusively.
    placer = Placer(profiles, cluster(("n", "H100-SXM", [1.0, 1.0, 1.0], "eu")))
    assert placer.place(wl("a", "shop")).node == "n"
    blocked = placer.place(wl("b", "bank", exclusive=True))
    assert blocked.record.excluded == {"n": "shared-node: exclusive tenant; node runs shop"}
    placer = Placer(profiles, cluster(("n", "H100-SXM", [1.0, 1.0, 1.0], "eu", ["bank"])))
    assert placer.place(wl("a", "bank", exclusive=True)).node == "n"
    blocked = placer.place(wl("b", "shop"))
    assert blocked.record.excluded == {"n": "exclusive-tenant-present: node is held exclusively by bank"}


def test_no_free_gpu_now_is_retry(profiles):
    view = ClusterView([NodeState("n", {JUR: "eu"}, free_gpus=0)], [GpuState("n", 0, "H100-SXM", 1.0)])
    assert Placer(profiles, view).place(wl()).outcome == "retry"


def test_a_70b_model_takes_its_tensor_parallel_gpus_from_the_node(profiles):
    view = cluster(("n", "A100-80G-SXM", [1.0] * 4, "eu"))
    placer = Placer(profiles, view)
    assert placer.place(wl("a", model="llama-3.3-70b")).outcome == "placed"
    assert placer.place(wl("b", model="llama-3.3-70b")).outcome == "retry"


def test_bad_performance_input_forces_plain_but_still_places(profiles):
    p = Placer(profiles, cluster(("n", "H100-SXM", [1.0], "eu"))).place(wl(force_plain="annotation x: bad"))
    assert p.outcome == "placed" and p.gamma == 0 and "annotation x" in p.record.reason


def test_a_tick_decides_latency_work_first_and_never_overcommits(profiles):
    view = cluster(("n", "H100-SXM", [1.0, 0.2], "eu"))
    tick = Placer(profiles, view).tick([wl("bulk", cls="throughput"), wl("chat", alpha=0.9), wl("late")])
    assert [p.workload for p in tick] == ["chat", "late", "bulk"]
    assert tick[0].gpu_index == 0 and tick[-1].outcome == "retry"


def test_decisions_do_not_depend_on_input_order(profiles):
    view = _random_cluster(random.Random(3), 30)
    pending = _random_workloads(random.Random(4), 60)
    a = Placer(profiles, view).tick(pending)
    b = Placer(profiles, ClusterView(view.nodes[::-1], view.gpus[::-1])).tick(pending[::-1])
    assert [(p.workload, p.node, p.gpu_index, p.gamma) for p in a] == [
        (p.workload, p.node, p.gpu_index, p.gamma) for p in b
    ]


def _random_cluster(rng, n_nodes):
    nodes, gpus = [], []
    for i in range(n_nodes):
        name = f"n{i:03d}"
        tenants = {f"t{rng.randint(0, 9)}"} if rng.random() < 0.3 else set()
        exclusive = set(tenants) if tenants and rng.random() < 0.3 else set()
        nodes.append(
            NodeState(
                name,
                {JUR: rng.choice(["eu", "kr", "us"])},
                rng.choice([2, 4, 8]),
                frozenset(tenants),
                frozenset(exclusive),
            )
        )
        gpu_type = rng.choice(["A100-80G-SXM", "H100-SXM", "H200", "L40S", "RTX-4090"])
        for k in range(8):
            headroom = None if rng.random() < 0.05 else round(rng.random(), 3)
            ratio = rng.choice([math.inf, 1.05, 1.2, 2.0])
            gpus.append(GpuState(name, k, gpu_type, headroom, ratio))
    return ClusterView(nodes, gpus)


def _random_workloads(rng, n, nodes=()):
    pools = [None, frozenset(rng.sample(list(nodes), k=max(1, len(nodes) // 2)))] if nodes else [None]
    return [
        WorkloadRequest(
            f"w{i:04d}",
            f"t{rng.randint(0, 9)}",
            rng.choice(["llama-3.1-8b", "llama-3.3-70b"]),
            rng.choice([None, "eagle3", "ngram", "llama-3.2-1b-draft"]),
            round(rng.uniform(0.2, 0.95), 2),
            seqs=rng.choice([1, 8, 32]),
            context=rng.choice([256, 2048]),
            latency_class=rng.choice(["latency", "throughput"]),
            tpot_slo_s=rng.choice([None, 0.02, 0.08]),
            jurisdiction=rng.choice([None, "eu", "kr", "mars"]),
            exclusive=rng.random() < 0.1,
            node_pool=rng.choice(pools),
            gpus=rng.choice([None, None, 1, 2]),
        )
        for i in range(n)
    ]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([True, False]))
def test_the_vectorised_placer_decides_exactly_as_the_scalar_reference(profiles, seed, externality):
    rng = random.Random(seed)
    view = _random_cluster(rng, rng.randint(1, 25))
    pending = _random_workloads(rng, rng.randint(1, 60), [n.name for n in view.nodes])
    policy = PlacerSettings(externality=externality)
    fast = Placer(profiles, view, policy).tick(pending)
    slow = reference_tick(profiles, view, pending, policy)
    assert [(p.workload, p.outcome, p.node, p.gpu_index, p.gamma) for p in fast] == [
        (r.workload, r.outcome, r.node, r.gpu_index, r.gamma) for r in slow
    ]


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_no_placement_in_a_tick_ever_breaks_sovereignty(profiles, seed):
    rng = random.Random(seed)
    view = _random_cluster(rng, rng.randint(1, 25))
    pending = {w.name: w for w in _random_workloads(rng, 80)}
    labels = {n.name: n.labels for n in view.nodes}
    tenants = {n.name: set(n.tenants) for n in view.nodes}
    holders = {n.name: set(n.exclusive_tenants) for n in view.nodes}
    for p in Placer(profiles, view).tick(pending.values()):
        if p.outcome != "placed":
            continue
        w = pending[p.workload]
        if w.jurisdiction:
            assert labels[p.node].get(JUR) == w.jurisdiction
        assert holders[p.node] <= {w.tenant}
        if w.exclusive:
            assert tenants[p.node] <= {w.tenant}
        tenants[p.node].add(w.tenant)
        if w.exclusive:
            holders[p.node].add(w.tenant)


@pytest.mark.parametrize("explain", [True, False])
def test_records_carry_where_and_how_with_or_without_the_breakdown(profiles, explain):
    p = Placer(profiles, cluster(("n", "H100-SXM", [1.0], "eu"))).place(wl(), explain=explain)
    assert p.record.node == "n" and p.record.gamma == p.gamma and p.record.tpot_ms > 0
    assert (p.record.speedup is not None) is explain
    assert p.record.to_dict()["neighbour_slo_ratio"] is None or explain
    if not explain:  # a bulk record says the mode as its reason, from γ = 1 up
        one = Placer(
            profiles, cluster(("n", "H100-SXM", [1.0], "eu")), PlacerSettings(headroom_uncertainty=0.0)
        )
        p1 = one.place(wl(alpha=0.3, seqs=8, context=1024), explain=False)
        assert p1.gamma == 1 and p1.record.reason == "speculative"
        saturated = Placer(profiles, cluster(("n", "H100-SXM", [0.0], "eu")))
        assert saturated.place(wl(), explain=False).record.reason == "plain"
    else:
        assert p.record.headroom_pessimistic == pytest.approx(1.0 - PlacerSettings().headroom_uncertainty)


def test_a_node_pool_limits_placement_and_an_empty_pool_in_jurisdiction_is_rejected(profiles):
    view = cluster(
        ("eu-a", "H100-SXM", [1.0], "eu"),
        ("eu-b", "H100-SXM", [1.0], "eu"),
        ("kr-a", "H100-SXM", [1.0], "kr"),
    )
    placer = Placer(profiles, view)
    x = placer.place(wl("x", node_pool=frozenset({"eu-b"})))
    assert x.node == "eu-b"
    assert x.record.excluded["eu-a"] == "node-pool: not selected by the workload's flavor or nodeSelector"
    rejected = placer.place(wl("y", jurisdiction="kr", node_pool=frozenset({"eu-a", "eu-b"})))
    assert rejected.outcome == "rejected" and "jurisdiction kr" in rejected.record.reason


def test_accounting_an_earlier_placement_matches_placing_it(profiles):
    view = cluster(("n", "H100-SXM", [0.8, 0.8], "eu"))
    w = wl("a", tpot_slo_s=0.05)
    placed = Placer(profiles, view)
    p = placed.place(w)
    accounted = Placer(profiles, view)
    assert accounted.account(w, p.node, p.gpu_index, p.gamma)
    for attr in ("headroom", "slo_ratio", "free"):
        assert (getattr(placed, attr) == getattr(accounted, attr)).all(), attr
    assert not accounted.account(w, "nowhere", 0, 0)
    # Placed at γ 6 under an older policy, accounted now that the workload may draft at most 2:
    # what runs is γ 6, and its step is the γ 6 step.
    lowered = Placer(profiles, view)
    assert lowered.account(replace(w, gamma_max=2), "n", 1, 6)
    ran = Placer(profiles, view)
    assert ran.account(w, "n", 1, 6)
    assert (lowered.headroom == ran.headroom).all() and (lowered.slo_ratio == ran.slo_ratio).all()


def test_accounting_a_speculating_placement_registers_its_own_slo_at_its_speculative_tpot(profiles):
    # γ > 0, so the TPOT is the step over τ: accounted as placed, the workload becomes the GPU's
    # binding neighbour at the same ratio of its SLO to that TPOT.
    view = cluster(("n", "H100-SXM", [1.0, 1.0], "eu"))
    w = wl("a", alpha=0.8, tpot_slo_s=0.05)
    placed = Placer(profiles, view)
    p = placed.place(w)
    assert p.gamma > 0
    accounted = Placer(profiles, view)
    assert accounted.account(w, p.node, p.gpu_index, p.gamma)
    g = accounted._position[(p.node, p.gpu_index)]
    assert accounted.binding[g] == placed.binding[g] == "a"
    assert accounted.slo_ratio[g] == pytest.approx(placed.slo_ratio[g], rel=1e-12)
    own = 0.05 / (p.record.tpot_ms / 1e3) / (1.0 + placed.policy.slo_margin)
    assert placed.slo_ratio[g] == pytest.approx(own, rel=1e-12)


# The self-benefit margin, decision by decision: an idle H100, EAGLE-3 on Llama-3.1-8B, 8 sequences
# at 1K context. Own S_real at the best γ: 1.04 (α 0.25, γ 1), 1.08 (α 0.3, γ 1), 1.18 (α 0.4, γ 2).
@pytest.mark.parametrize(
    ("alpha", "margin", "mode", "gamma"),
    [
        (0.25, 0.0, "speculative", 1),
        (0.25, 0.02, "speculative", 1),
        (0.25, 0.1, "plain", 0),  # 1.04 < 1.10
        (0.3, 0.05, "speculative", 1),
        (0.3, 0.1, "plain", 0),  # 1.08 < 1.10
        (0.4, 0.1, "speculative", 2),
        (0.4, 0.2, "plain", 0),  # 1.18 < 1.20
        (0.2, 0.0, "plain", 0),  # nothing beats plain decode at all
    ],
)
@pytest.mark.parametrize("gpus", [1, 16])  # one GPU: the placer's float path; 16: its vectorised one
def test_speculation_must_beat_plain_decode_by_the_self_benefit_margin(
    profiles, alpha, margin, mode, gamma, gpus
):
    view = cluster(("idle", "H100-SXM", [1.0] * gpus, "eu"))
    settings_ = PlacerSettings(margin=margin, headroom_uncertainty=0.0)
    p = Placer(profiles, view, settings_).place(wl(alpha=alpha, seqs=8, context=1024))
    assert (p.mode, p.gamma) == (mode, gamma), p.record.reason
    if mode == "speculative":
        assert p.record.reason == (
            f"γ*={gamma} maximises the GPU's token rate with S_real ≥ {1 + margin:.2f} "
            "and every neighbour within its TPOT SLO"
        )
    # The record's terms agree with each other: the step before it, the step with it and their
    # ratio; TPOT is the step over τ; its own speed-up is τ times the plain step over the step.
    r = p.record
    assert r.step_before_ms * r.neighbour_step_ratio == pytest.approx(r.step_ms, rel=1e-12)
    assert r.tpot_ms == pytest.approx(r.step_ms / r.tau, rel=1e-12)
    assert r.speedup == pytest.approx(r.tau * r.step_plain_ms / r.step_ms, rel=1e-12)
    assert r.headroom_measured == r.headroom == 1.0  # no ledger here: the reading itself
    if mode == "plain" and alpha > 0.2:
        assert p.record.reason == f"no γ reaches S_real ≥ {1 + margin:.2f} at this headroom: plain decode"
        assert p.record.unconstrained_gamma > 0  # the objective wanted it; the margin refused it


@pytest.mark.parametrize("batch", [1, 8, 64, 256])
@pytest.mark.parametrize("context", [256, 4096])
def test_a_draft_pass_costs_c_of_the_gpus_batch_1_plain_step_whatever_the_batch(profiles, batch, context):
    # What drafting adds to the decision's step, γ = 1 with the drafter's price against γ = 1 with a
    # free drafter and no tax, is c of the plain step the same decision makes for one sequence.
    from dataclasses import replace

    import numpy as np

    from sovereignspec.core.optimiser import gamma_table
    from sovereignspec.core.placement import spec_request
    from sovereignspec.core.roofline import roofline_for

    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    idle, free = np.zeros(1), np.full(1, np.inf)

    def table(seqs, **price):
        req, _ = spec_request(profiles, PlacerSettings(), wl(seqs=seqs, context=context))
        return gamma_table(roof, replace(req, **price), idle, free)

    c = spec_request(profiles, PlacerSettings(), wl())[0].draft_cost
    priced, free_drafter = table(batch, spec_overhead=0.0), table(batch, draft_cost=0.0, spec_overhead=0.0)
    drafting = priced.step[1, 0] - free_drafter.step[1, 0]
    batch_1_plain = table(1).step[0, 0]
    assert drafting == pytest.approx(c * batch_1_plain, rel=1e-12)


def test_a_record_names_32_excluded_nodes_and_counts_the_rest(profiles):
    view = cluster(
        *[(f"kr{i:02d}", "H100-SXM", [1.0], "kr") for i in range(40)], ("eu", "H100-SXM", [1.0], "eu")
    )
    p = Placer(profiles, view).place(wl(jurisdiction="eu"))
    assert p.node == "eu"
    named = [k for k in p.record.excluded if k != "..."]
    assert len(named) == 32 and p.record.excluded["..."] == "8 more nodes excluded"


def test_a_workload_may_lower_the_policys_draft_limit_but_not_raise_it(profiles):
    view = cluster(("idle", "H100-SXM", [1.0], "eu"))
    high = Placer(profiles, view, PlacerSettings(gamma_max=3)).place(wl(alpha=0.95, seqs=8, gamma_max=16))
    assert high.gamma == 3
    low = Placer(profiles, view, PlacerSettings(gamma_max=8)).place(wl(alpha=0.95, seqs=8, gamma_max=2))
    assert low.gamma == 2


@pytest.mark.parametrize(("gamma_max", "mode"), [(0, "plain"), (1, "speculative")])
def test_a_draft_limit_of_zero_switches_speculation_off_and_says_so(profiles, gamma_max, mode):
    view = cluster(("idle", "H100-SXM", [1.0], "eu"))
    p = Placer(profiles, view).place(wl(alpha=0.9, seqs=8, gamma_max=gamma_max))
    assert p.mode == mode and p.gamma == gamma_max
    if gamma_max == 0:
        assert p.record.reason == "speculation disabled (γ_max = 0)"


@pytest.mark.parametrize("gamma_max", [1, 8])
@pytest.mark.parametrize("headroom", [1.0, 0.6, 0.3, 0.12, 0.05, 0.0])
def test_a_running_workload_is_judged_again_as_a_placement_at_that_reading_would_be(
    profiles, headroom, gamma_max
):
    from sovereignspec.core.running import reevaluate

    w = wl(alpha=0.7, seqs=32, context=1024, gamma_max=gamma_max)
    placed = Placer(profiles, cluster(("n", "H100-SXM", [headroom], "eu"))).place(w)
    again = reevaluate(profiles, PlacerSettings(), w, "H100-SXM", placed.gamma, headroom)
    assert again is not None and again.gamma_now == placed.gamma
    assert again.speedup_in_force == pytest.approx(placed.record.speedup, rel=1e-9)
    # Running a longer draft than the workload may now ask for: judged at the γ it runs.
    longer = reevaluate(profiles, PlacerSettings(), replace(w, gamma_max=8), "H100-SXM", 6, headroom)
    capped = reevaluate(profiles, PlacerSettings(), replace(w, gamma_max=2), "H100-SXM", 6, headroom)
    assert capped is not None and longer is not None
    assert capped.speedup_in_force == longer.speedup_in_force and capped.gamma_now <= 2


def test_the_last_empty_node_kept_free_is_refused_to_shared_work_and_given_to_exclusive_work(profiles):
    view = cluster(("busy", "H100-SXM", [0.5], "eu", ["other"]), ("empty", "H100-SXM", [1.0], "eu"))
    settings_ = PlacerSettings(keep_whole_nodes_free=1)
    shared = Placer(profiles, view, settings_).place(wl("s", tenant="a"))
    assert shared.node == "busy"  # not the last empty node
    exclusive = Placer(profiles, view, settings_).place(wl("x", tenant="b", exclusive=True))
    assert exclusive.node == "empty"
    # With two empty nodes, one may go to shared work.
    two = cluster(("e1", "H100-SXM", [1.0], "eu"), ("e2", "H100-SXM", [1.0], "eu"))
    assert Placer(profiles, two, settings_).place(wl("s", tenant="a")).outcome == "placed"


def test_where_a_neighbour_holds_speculation_back_the_record_names_the_gpu_and_the_neighbour(profiles):
    view = cluster(("only", "H100-SXM", [0.9], "eu", ["old"], [], [1.0005]))
    placer = Placer(profiles, view)
    placer.binding[0] = "old-tenant/chat"
    p = placer.place(wl(seqs=64))
    assert p.gamma == 0
    assert list(p.record.held_back) == ["only/gpu0"]
    assert "would push neighbour old-tenant/chat past its TPOT SLO" in p.record.held_back["only/gpu0"]


def test_an_unknown_drafter_means_plain_decode_naming_it(profiles):
    p = Placer(profiles, cluster(("idle", "H100-SXM", [1.0], "eu"))).place(wl(drafter="magic", seqs=8))
    assert p.mode == "plain" and p.record.reason == "unknown drafter 'magic'"


def test_a_workload_too_big_for_any_node_is_rejected_naming_the_largest(profiles):
    nodes = [NodeState("four", {JUR: "eu"}, 4, capacity=4), NodeState("two", {JUR: "eu"}, 2, capacity=2)]
    gpus = [GpuState("four", i, "H100-SXM", 1.0) for i in range(4)] + [
        GpuState("two", i, "H100-SXM", 1.0) for i in range(2)
    ]
    p = Placer(profiles, ClusterView(nodes, gpus)).place(wl(gpus=8))
    assert p.outcome == "rejected"
    assert p.record.reason == "it needs 8 GPUs on one node; the largest node it may use has 4"


def test_shared_work_facing_only_the_nodes_kept_free_is_told_to_retry(profiles):
    view = cluster(("empty", "H100-SXM", [1.0], "eu"))
    p = Placer(profiles, view, PlacerSettings(keep_whole_nodes_free=1)).place(wl())
    assert p.outcome == "retry" and p.gamma == p.record.gamma == 0 and p.node is None
    assert p.record.reason == "the last 1 empty node(s) of its pool are kept free for exclusive tenants"


def test_the_tightest_neighbour_binds_and_of_two_as_tight_the_first_named():
    from sovereignspec.core.running import neighbour_bound

    assert neighbour_bound([("a", 0.1, 0.05), ("b", 0.2, 0.1), ("c", 0.3, 0.1)]) == (2.0, "a")
    assert neighbour_bound([("a", None, 0.05), ("b", 0.2, None), ("c", 0.25, 0.125)]) == (2.0, "c")
    assert neighbour_bound([]) == (math.inf, None)


def test_the_ledger_memo_is_filled_and_reused_and_optional(profiles):
    from sovereignspec.core.running import with_ledger_load

    view = cluster(("n", "H100-SXM", [1.0, 1.0], "eu"))
    placed = [(wl("a", seqs=64), "n", 0, 0)]
    memo: dict = {}
    first = with_ledger_load(view, placed, profiles, memo)
    assert len(memo) == 1 and first.gpus[0].headroom < 1.0 and first.gpus[1].headroom == 1.0
    assert with_ledger_load(view, placed, profiles, memo) == first
    assert with_ledger_load(view, placed, profiles) == first  # no memo: computed afresh
    # A decision beside the ledger's load still reports what telemetry measured.
    placer = Placer(profiles, first)
    assert placer.measured[0] == 1.0 > placer.headroom[0]


def test_the_gpus_a_model_needs_are_the_fewest_any_gpu_type_of_its_nodes_allows(profiles):
    # Llama-3.3-70B: TP 4 on an H100, TP 8 on an RTX 4090; the nodes have 2 GPUs each.
    nodes = [NodeState("h100", {JUR: "eu"}, 2, capacity=2), NodeState("rtx", {JUR: "eu"}, 2, capacity=2)]
    gpus = [GpuState("h100", i, "H100-SXM", 1.0) for i in range(2)] + [
        GpuState("rtx", i, "RTX-4090", 1.0) for i in range(2)
    ]
    p = Placer(profiles, ClusterView(nodes, gpus)).place(wl(model="llama-3.3-70b", drafter="ngram"))
    assert p.outcome == "rejected"
    assert p.record.reason == "it needs 4 GPUs on one node; the largest node it may use has 2"


def test_a_node_exactly_the_size_needed_but_full_now_means_retry_not_reject(profiles):
    nodes = [NodeState("four", {JUR: "eu"}, 0, capacity=4, tenants=frozenset({"other"}))]
    gpus = [GpuState("four", i, "H100-SXM", 0.5) for i in range(4)]
    p = Placer(profiles, ClusterView(nodes, gpus)).place(wl(gpus=4))
    assert p.outcome == "retry" and p.record.reason == "no admissible node with free GPUs now"
    assert p.record.excluded == {"four": "capacity: not enough free GPUs"}


def test_no_node_in_the_namespaces_jurisdictions_is_rejected_naming_them(profiles):
    view = cluster(("eu-a", "H100-SXM", [1.0], "eu"))
    p = Placer(profiles, view).place(wl(allowed_jurisdictions=frozenset({"kr", "jp"})))
    assert p.outcome == "rejected"
    assert (
        p.record.reason
        == "no node of its flavor and node constraints in the jurisdictions its namespace allows (jp, kr)"
    )


def test_a_newcomer_with_an_slo_becomes_the_gpus_binding_neighbour_at_its_margin(profiles):
    placer = Placer(profiles, cluster(("n", "H100-SXM", [1.0], "eu")))
    p = placer.place(wl("chat", tpot_slo_s=0.05, seqs=8))
    margin = PlacerSettings().slo_margin
    assert placer.binding[0] == "chat"
    assert placer.slo_ratio[0] == pytest.approx(0.05 / (p.record.tpot_ms / 1e3) / (1 + margin), rel=1e-12)


def test_a_neighbour_is_blamed_only_for_the_draft_it_refused(profiles):
    # Saturated beside a tight neighbour: nothing would raise the token rate anyway; the reason says
    # so and does not blame the neighbour for γ = 0.
    view = cluster(("n", "H100-SXM", [0.0], "eu", ["old"], [], [1.0005]))
    placer = Placer(profiles, view)
    placer.binding[0] = "old-tenant/chat"
    p = placer.place(wl())
    assert p.record.reason == "no γ raises the GPU's token rate at this headroom (saturated): plain decode"
    assert p.record.held_back == {}
    # An idle GPU where the objective's own favourite is γ = 1, refused by the tight neighbour.
    view = cluster(("n", "H100-SXM", [1.0], "eu", ["old"], [], [1.0005]))
    placer = Placer(profiles, view, PlacerSettings(headroom_uncertainty=0.0))
    placer.binding[0] = "old-tenant/chat"
    p = placer.place(wl(alpha=0.3, seqs=8, context=1024))
    assert p.record.unconstrained_gamma == 1
    assert p.record.reason == "γ=1 would push neighbour old-tenant/chat past its TPOT SLO: plain decode"


def test_with_pack_shared_work_goes_where_work_already_runs_when_that_costs_it_nothing(profiles):
    view = cluster(("a-empty", "H100-SXM", [1.0], "eu"), ("b-busy", "H100-SXM", [1.0], "eu", ["other"]))
    packed = Placer(profiles, view, PlacerSettings(pack=True)).place(wl("s", tenant="t"))
    assert packed.node == "b-busy"
    assert Placer(profiles, view).place(wl("s", tenant="t")).node == "a-empty"  # without pack: names


def test_a_workload_that_may_draft_one_token_is_told_which_neighbour_held_it_back(profiles):
    view = cluster(("n", "H100-SXM", [1.0], "eu", ["old"], [], [1.0005]))
    placer = Placer(profiles, view, PlacerSettings(headroom_uncertainty=0.0))
    placer.binding[0] = "old-tenant/chat"
    p = placer.place(wl(alpha=0.3, seqs=8, context=1024, gamma_max=1))
    assert p.gamma == 0 and p.record.unconstrained_gamma == 1
    assert p.record.held_back == {"n/gpu0": "γ=1 would push neighbour old-tenant/chat past its TPOT SLO"}


@pytest.mark.parametrize(
    ("tolerance", "exclusive", "second"),
    [(0.0, False, ("n1", 0)), (0.1, False, ("n0", 1)), (0.0, True, ("n0", 1)), (0.1, True, ("n0", 1))],
)
def test_packing_keeps_work_on_the_nodes_it_holds_within_the_tolerance(
    profiles, tolerance, exclusive, second
):
    # Each node: one GPU at 0.95, seven at 0.9. The second workload's best GPU is n1's 0.95
    # (4.17 ms); n0's 0.9 GPUs are 7 % slower (4.46 ms). Shared work stays on n0, where work runs,
    # within a 10 % tolerance, and at 0 takes the faster GPU; exclusive work stays where its
    # tenant runs alone whatever the cost, leaving n1 whole for the next exclusive tenant.
    view = cluster(("n0", "H100-SXM", [0.95] + [0.9] * 7, "eu"), ("n1", "H100-SXM", [0.95] + [0.9] * 7, "eu"))
    placer = Placer(profiles, view, PlacerSettings(pack=True, pack_tolerance=tolerance))
    first = placer.place(wl("a", tenant="x", exclusive=exclusive, gpus=1))
    then = placer.place(wl("b", tenant="x", exclusive=exclusive, gpus=1))
    assert (first.node, first.gpu_index) == ("n0", 0)
    assert (then.node, then.gpu_index) == second
    assert exclusive or then.record.tpot_ms <= (1 + tolerance) * 4.1667 + 1e-3


@pytest.mark.parametrize(("exclusive", "second"), [(False, "n1"), (True, "n0")])
def test_shared_packing_never_costs_more_than_the_tolerance_and_exclusive_packing_always_holds(
    profiles, exclusive, second
):
    # n0's other GPUs are 3x slower than n1's best: shared work does not pack onto them; an
    # exclusive tenant's second workload does, rather than take a second whole node.
    view = cluster(("n0", "H100-SXM", [0.95] + [0.7] * 7, "eu"), ("n1", "H100-SXM", [0.95] + [0.7] * 7, "eu"))
    placer = Placer(profiles, view, PlacerSettings(pack=True, pack_tolerance=0.1))
    placer.place(wl("a", tenant="x", exclusive=exclusive, gpus=1))
    assert placer.place(wl("b", tenant="x", exclusive=exclusive, gpus=1)).node == second


def test_by_default_packing_costs_shared_work_nothing(profiles):
    # The same cluster as above: with `pack` and no tolerance given, the second shared workload
    # takes n1's faster GPU rather than a 7 % slower one on n0, where work already runs.
    view = cluster(("n0", "H100-SXM", [0.95] + [0.9] * 7, "eu"), ("n1", "H100-SXM", [0.95] + [0.9] * 7, "eu"))
    placer = Placer(profiles, view, PlacerSettings(pack=True))
    placer.place(wl("a", tenant="x", gpus=1))
    then = placer.place(wl("b", tenant="x", gpus=1))
    assert (then.node, then.gpu_index) == ("n1", 0)


@pytest.mark.parametrize("drafter", [None, "no-such-drafter"])
def test_a_workload_that_cannot_draft_is_priced_with_no_draft_cost_or_overhead(profiles, drafter):
    from sovereignspec.core.placement import spec_request

    req, off = spec_request(profiles, PlacerSettings(), wl(drafter=drafter))
    assert off and (req.draft_cost, req.spec_overhead, req.gamma_max) == (0.0, 0.0, 0)


def test_without_telemetry_a_gpu_is_estimated_from_its_placements_on_an_idle_gpu(profiles):
    from sovereignspec.core.running import with_ledger_load

    # No reading on either GPU; one placement on gpu0. gpu0's estimate is what an idle GPU
    # (headroom 1) has left after taking that placement in; gpu1, with none, is estimated idle.
    view = ClusterView(
        [NodeState("n", {JUR: "eu"}, free_gpus=2)],
        [GpuState("n", 0, "H100-SXM", None), GpuState("n", 1, "H100-SXM", None)],
    )
    w = wl("a", seqs=64)
    estimated = with_ledger_load(view, [(w, "n", 0, 2)], profiles)
    idle = Placer(profiles, cluster(("n", "H100-SXM", [1.0, 1.0], "eu")))
    assert idle.account(w, "n", 0, 2)
    assert [g.stale_estimate for g in estimated.gpus] == [float(idle.headroom[0]), 1.0]
    assert 0.0 < estimated.gpus[0].stale_estimate < 1.0


def test_a_node_whose_gpus_are_all_free_is_empty_and_kept_free_and_one_in_use_is_not(profiles):
    # Capacity known (as the operator reads it from the Node): 8 GPUs, 8 free is an empty node,
    # the last one, kept for exclusive tenants; with one GPU in use it takes shared work.
    def view(free):
        node = NodeState("n", {JUR: "eu"}, free_gpus=free, capacity=8)
        return ClusterView([node], [GpuState("n", i, "H100-SXM", 1.0) for i in range(8)])

    settings_ = PlacerSettings(keep_whole_nodes_free=1)
    assert Placer(profiles, view(8), settings_).place(wl("s", gpus=1)).outcome == "retry"
    assert Placer(profiles, view(7), settings_).place(wl("s", gpus=1)).outcome == "placed"


def test_a_reading_exactly_at_the_uncertainty_is_called_saturated(profiles):
    # Judged one uncertainty worse, a reading of exactly the uncertainty is no headroom at all.
    unc = PlacerSettings().headroom_uncertainty
    p = Placer(profiles, cluster(("n", "H100-SXM", [unc], "eu"))).place(wl(alpha=0.6, seqs=64))
    assert p.gamma == 0
    assert p.record.reason == "no γ raises the GPU's token rate at this headroom (saturated): plain decode"


def test_a_full_node_with_one_gpu_that_holds_the_model_is_excluded_as_full_not_as_too_small(profiles):
    # Where the model fits is counted per node over its GPUs: one that fits is enough.
    nodes = [NodeState("a-one", {JUR: "eu"}, 0, capacity=1, tenants=frozenset({"other"})),
             NodeState("b-free", {JUR: "eu"}, 1, capacity=1)]  # fmt: skip
    gpus = [GpuState("a-one", 0, "H100-SXM", 0.5), GpuState("b-free", 0, "H100-SXM", 1.0)]
    p = Placer(profiles, ClusterView(nodes, gpus)).place(wl())
    assert p.node == "b-free"
    assert p.record.excluded == {"a-one": "capacity: not enough free GPUs"}


def test_a_node_whose_gpus_cannot_hold_the_model_is_excluded_saying_so(profiles):
    # A GPU type too small for the model at any tensor-parallel degree (no shipped pair is).
    h100 = profiles.gpus["H100-SXM"]
    tiny = replace(profiles, gpus={**profiles.gpus, "tiny": replace(h100, name="tiny", mem_bytes=1e6)})
    view = cluster(("a-tiny", "tiny", [1.0], "eu"), ("b-h100", "H100-SXM", [1.0], "eu"))
    p = Placer(tiny, view).place(wl())
    assert p.node == "b-h100"
    assert p.record.excluded == {"a-tiny": "capacity: llama-3.1-8b does not fit this node's GPUs"}


# -- pods over several nodes -----------------------------------------------------------------------


def _eight(name, jurisdiction, tenants=(), exclusive=()):
    return (name, "H100-SXM", [1.0] * 8, jurisdiction, list(tenants), list(exclusive))


def test_pods_no_node_holds_together_are_spread_and_pinned_by_their_jurisdictions_label(profiles):
    view = cluster(*[_eight(f"eu{i}", "eu") for i in range(4)], _eight("kr0", "kr"))
    placer = Placer(profiles, view)
    p = placer.place(wl("job", gpus=32, pods=4, jurisdiction="eu"))
    assert p.outcome == "placed" and p.record.node_selector == {JUR: "eu"}
    assert sorted(n for n, _, _ in p.record.pods) == ["eu0", "eu1", "eu2", "eu3"]
    assert all(g >= p.gamma for _, _, g in p.record.pods) and p.gamma == min(g for _, _, g in p.record.pods)
    assert list(placer.free) == [0, 0, 0, 0, 8]  # every eu GPU taken once, kr untouched
    assert (
        "4 pods of 8 GPUs over eu0/gpu0" in p.record.reason and "pinned by " + JUR + "=eu" in p.record.reason
    )
    # Room on one node: all pods there, pinned by hostname as any workload (no spread).
    one = Placer(profiles, cluster(_eight("big", "eu"))).place(wl("job", gpus=8, pods=4, jurisdiction="eu"))
    assert one.node == "big" and one.record.pods == () and one.record.node_selector is None


def test_pods_are_never_spread_where_the_label_also_selects_a_node_they_may_not_use(profiles):
    # bank holds eu4 alone and exclusively: a selector on eu could send a pod there.
    view = cluster(*[_eight(f"eu{i}", "eu") for i in range(4)], _eight("eu4", "eu", ["bank"], ["bank"]))
    p = Placer(profiles, view).place(wl("job", gpus=32, pods=4, jurisdiction="eu"))
    assert p.outcome == "retry", p.record.reason
    assert f"{JUR}=eu selects eu4, which it may not use (1 such)" in p.record.reason
    # An exclusive tenant may not have its pods pinned by a label that selects anyone else's node.
    view = cluster(*[_eight(f"eu{i}", "eu") for i in range(4)], ("eu4", "H100-SXM", [1.0], "eu", ["other"]))
    p = Placer(profiles, view).place(
        wl("job", tenant="bank", gpus=32, pods=4, jurisdiction="eu", exclusive=True)
    )
    assert p.outcome == "retry" and "selects eu4, which it may not use" in p.record.reason


def test_pods_that_the_nodes_they_may_use_can_never_hold_are_rejected_saying_how_many_fit(profiles):
    view = cluster(*[_eight(f"eu{i}", "eu") for i in range(3)], _eight("kr0", "kr"))
    known = ClusterView([replace(n, capacity=8) for n in view.nodes], view.gpus)  # as Nodes report it
    p = Placer(profiles, known).place(wl("job", gpus=32, pods=4, jurisdiction="eu"))
    assert p.outcome == "rejected"
    assert p.record.reason == "its 4 pods of 8 GPUs never fit: the nodes it may use hold 3"
    # A node of unknown size might hold more: then it waits.
    assert Placer(profiles, view).place(wl("job", gpus=32, pods=4, jurisdiction="eu")).outcome == "retry"


def test_a_spread_that_cannot_place_every_pod_places_none_and_leaves_the_view_as_it_was(profiles):
    # Four empty eu nodes, the last kept free for exclusive tenants: room counts 4 pods, the fourth
    # is refused. Nothing of the first three may remain: a later workload decides as on a fresh view.
    view = cluster(*[_eight(f"eu{i}", "eu") for i in range(4)])
    settings_ = PlacerSettings(keep_whole_nodes_free=1)
    placer = Placer(profiles, view, settings_)
    p = placer.place(wl("job", gpus=32, pods=4, jurisdiction="eu"))
    assert p.outcome == "retry" and f"{JUR}=eu took 3 of them" in p.record.reason
    assert list(placer.free) == [8, 8, 8, 8] and not placer.occupied.any()
    later = placer.place(wl("chat", tenant="t2"))
    fresh = Placer(profiles, view, settings_).place(wl("chat", tenant="t2"))
    assert later.record == fresh.record


def _known(view):
    """The view with each node's capacity known (as the operator reads it from the Node)."""
    return ClusterView([replace(n, capacity=n.free_gpus) for n in view.nodes], view.gpus)


def test_spread_pods_share_the_lowest_gamma_any_of_them_got_and_report_each_gpu(profiles):
    # eu0's best GPU is busier than eu1's: its pod drafts less. The pod set gets that lower γ.
    # GPU 0 of each node is saturated, so the pods take GPU 1.
    view = cluster(("eu0", "H100-SXM", [0.05, 0.3], "eu"), ("eu1", "H100-SXM", [0.05, 0.95], "eu"))
    p = Placer(profiles, view).place(wl("job", gpus=4, pods=2, jurisdiction="eu", seqs=64))
    assert p.outcome == "placed", p.record.reason
    gammas = {n: g for n, _, g in p.record.pods}
    assert gammas["eu0"] < gammas["eu1"] and p.gamma == gammas["eu0"], p.record.pods
    assert [i for _, i, _ in p.record.pods] == [1, 1]


def test_two_pods_spread_and_one_gpu_pods_count_their_room_one_gpu_each(profiles):
    view = _known(cluster(_eight("eu0", "eu"), _eight("eu1", "eu")))
    assert Placer(profiles, view).place(wl("job", gpus=16, pods=2, jurisdiction="eu")).record.node_selector
    small = _known(cluster(("a", "H100-SXM", [1.0] * 2, "eu"), ("b", "H100-SXM", [1.0] * 2, "eu")))
    p = Placer(profiles, small).place(wl("job", gpus=3, pods=3, jurisdiction="eu"))
    assert p.outcome == "placed" and len(p.record.pods) == 3, p.record.reason


def test_room_for_pods_counts_whole_pods_per_node_now_and_ever(profiles):
    # Three 12-GPU nodes hold one 8-GPU pod each (never four); with one node busy now, room is
    # short only for now (Retry), and the reason says how many fit.
    nodes = [(f"eu{i}", "H100-SXM", [1.0] * 12, "eu") for i in range(3)]
    never = Placer(profiles, _known(cluster(*nodes))).place(wl("job", gpus=32, pods=4, jurisdiction="eu"))
    assert never.outcome == "rejected"
    assert never.record.reason == "its 4 pods of 8 GPUs never fit: the nodes it may use hold 3"
    four = [_eight(f"eu{i}", "eu") for i in range(4)]
    placer = Placer(profiles, _known(cluster(*four)))
    placer.place(wl("holder", gpus=1, jurisdiction="eu"))  # takes one GPU of one node
    p = placer.place(wl("job", gpus=32, pods=4, jurisdiction="eu"))
    assert p.outcome == "retry" and f"{JUR}=eu has room for 3 of them now" in p.record.reason, p.record.reason


def test_pods_of_unconstrained_work_may_be_pinned_by_the_pool_alone_when_every_node_of_it_is_usable(profiles):
    # No jurisdiction asked; two labelled eu nodes and one without a jurisdiction label. The eu
    # label holds two of three pods; the whole pool holds them, and every node of it is usable.
    view = cluster(_eight("eu0", "eu"), _eight("eu1", "eu"), _eight("bare", None))
    ns = ClusterView(view.nodes, view.gpus)
    p = Placer(profiles, ns).place(wl("job", gpus=24, pods=3))
    assert p.outcome == "placed" and p.record.node_selector == {}, p.record.reason
    assert sorted(n for n, _, _ in p.record.pods) == ["bare", "eu0", "eu1"]


def test_room_for_pods_now_counts_whole_pods_per_node_not_a_sum_of_fractions(profiles):
    # Three 16-GPU nodes with 12 free each hold one 8-GPU pod each now (4.5 by fractions).
    nodes = [(f"eu{i}", "H100-SXM", [1.0] * 16, "eu") for i in range(3)]
    placer = Placer(profiles, _known(cluster(*nodes)))
    for i in range(3):
        placer.place(wl(f"holder{i}", gpus=4, jurisdiction="eu", node_pool=frozenset({f"eu{i}"})))
    assert list(placer.free) == [12, 12, 12]
    p = placer.place(wl("job", gpus=32, pods=4, jurisdiction="eu"))
    assert p.outcome == "retry" and f"{JUR}=eu has room for 3 of them now" in p.record.reason, p.record.reason


# -- Kueue's Topology Aware Scheduling: nodes assigned before checks run ---------------------------


def _on(*pairs):
    return tuple((frozenset([n]), c) for n, c in pairs)


def test_pods_are_decided_on_the_nodes_kueue_assigned_not_where_the_placer_would_put_them(profiles):
    # eu1 is the idler node; Kueue's topology assignment put both pods on eu0: they are decided
    # there, and no nodeSelector of ours competes with Kueue's.
    view = cluster(("eu0", "H100-SXM", [0.3] * 4, "eu"), ("eu1", "H100-SXM", [1.0] * 4, "eu"))
    placer = Placer(profiles, view)
    p = placer.place(wl("job", gpus=2, pods=2, jurisdiction="eu", assigned=_on(("eu0", 2))))
    assert p.outcome == "placed", p.record.reason
    assert [n for n, _, _ in p.record.pods] == ["eu0", "eu0"]
    assert p.record.node_selector == {}
    assert list(placer.free) == [2, 4]
    assert "2 pods of 1 GPUs on Kueue's topology assignment, over eu0/gpu" in p.record.reason


@pytest.mark.parametrize(
    ("node", "tenants", "exclusive", "said"),
    [
        ("kr0", [], [], "which it may not use: jurisdiction"),
        ("eu1", ["bank"], ["bank"], "which it may not use: exclusive-tenant-present"),
        ("gone", [], [], "gone, which is not a known GPU node"),
    ],
)
def test_an_assignment_onto_a_node_the_workload_may_not_use_is_never_placed_and_names_it(
    profiles, node, tenants, exclusive, said
):
    view = cluster(
        ("eu0", "H100-SXM", [1.0] * 4, "eu"),
        ("eu1", "H100-SXM", [1.0] * 4, "eu", tenants, exclusive),
        ("kr0", "H100-SXM", [1.0] * 4, "kr"),
    )
    placer = Placer(profiles, view)
    p = placer.place(wl("job", gpus=2, pods=2, jurisdiction="eu", assigned=_on(("eu0", 1), (node, 1))))
    assert p.outcome == "retry" and p.node is None, p.record.reason
    assert f"Kueue's topology assignment puts pods on {node}" in p.record.reason and said in p.record.reason
    assert list(placer.free) == [4, 4, 4]  # nothing committed, not even the pod on eu0


def test_an_assignment_outside_the_flavors_nodes_or_without_room_now_waits_and_commits_nothing(profiles):
    view = cluster(("eu0", "H100-SXM", [1.0] * 2, "eu"), ("eu1", "H100-SXM", [1.0] * 2, "eu"))
    placer = Placer(profiles, view)
    outside = placer.place(
        wl("job", gpus=1, jurisdiction="eu", node_pool=frozenset({"eu0"}), assigned=_on(("eu1", 1)))
    )
    assert outside.outcome == "retry" and "outside its flavor's nodes" in outside.record.reason
    full = placer.place(
        wl(
            "job",
            gpus=3,
            pods=3,
            jurisdiction="eu",
            assigned=_on(("eu0", 1), ("eu1", 2)),
        )
    )
    assert full.outcome == "placed"
    more = placer.place(wl("more", gpus=2, pods=2, jurisdiction="eu", assigned=_on(("eu0", 1), ("eu1", 1))))
    assert (
        more.outcome == "retry"
        and "eu1, where Kueue's topology assignment puts a pod, has no room" in more.record.reason
    )
    assert list(placer.free) == [1, 0]  # the pod that fitted on eu0 was not kept


def test_pods_on_an_assignment_share_the_lowest_gamma_any_got_and_an_empty_one_waits(profiles):
    # Kueue put one pod on a busy eu0 and one on an idle eu1: each judged where it is, the pod
    # set's one γ the lower of the two (never the idle node's, which would push eu0's pod).
    view = cluster(("eu0", "H100-SXM", [0.02] * 2, "eu"), ("eu1", "H100-SXM", [1.0] * 2, "eu"))
    p = Placer(profiles, view).place(
        wl("job", gpus=2, pods=2, jurisdiction="eu", seqs=64, assigned=_on(("eu0", 1), ("eu1", 1)))
    )
    gammas = {n: g for n, _, g in p.record.pods}
    assert gammas["eu1"] > gammas["eu0"] and p.gamma == gammas["eu0"], p.record.pods
    # An assignment of no pods (nothing Kueue writes, but nothing to raise on either): it waits.
    none = Placer(profiles, view).place(wl("job", gpus=2, pods=2, jurisdiction="eu", assigned=()))
    assert none.outcome == "retry" and "places none of its pods" in none.record.reason
    # A domain no node carries (Kueue's levels naming no hostname): it waits, saying so, rather
    # than deciding its other pods alone.
    nowhere = Placer(profiles, view).place(
        wl("job", gpus=2, pods=2, jurisdiction="eu", assigned=(*_on(("eu1", 1)), (frozenset(), 1)))
    )
    assert nowhere.outcome == "retry" and "a domain no node carries" in nowhere.record.reason


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (PlacerSettings(), "gamma_max"),
        (GpuState("n", 0, "H100-SXM", 0.5), "headroom"),
        (NodeState("n", {}, 8), "free_gpus"),
        (ClusterView([], []), "nodes"),
        (Reevaluation(1, 1.2, 1.1), "gamma_now"),
        (Placement("ns/w", "n", 0, 2, None), "gamma"),  # type: ignore[arg-type]  # the record is not read
    ],
)
def test_what_a_decision_reads_and_says_is_immutable(value: object, field: str) -> None:
    """One settings object, one cluster view serve every workload of a tick (and the dispatcher's
    workers): no decision may change what the next one reads."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, None)


def test_the_gamma_table_its_choice_and_the_cached_gamma_axis_cannot_be_changed(profiles):
    # The table is kept for the decision record, and the γ axis is cached and shared by every
    # decision at that α: a write through any of them would change what a later decision reads.
    import numpy as np

    from sovereignspec.core.optimiser import blocker, choose, gamma_axis, gamma_table
    from sovereignspec.core.placement import spec_request
    from sovereignspec.core.roofline import roofline_for

    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    req, _ = spec_request(profiles, PlacerSettings(), wl(seqs=4))
    table = gamma_table(roof, req, np.zeros(1), np.full(1, np.inf))
    with pytest.raises(dataclasses.FrozenInstanceError):
        table.step = None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        choose(table).gamma = None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        blocker(table).gamma = None  # type: ignore[misc]
    for array in gamma_axis(0.123456, 3):  # an α no other test asks for: a write would stay cached
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 99


def _exactly(start: float, make, target: float) -> float:
    """A double x at or a few ulps from `start` for which make(x) == target exactly."""
    import numpy as np

    x = start
    for _ in range(8):
        if make(x) == target:
            return x
        x = float(np.nextafter(x, np.inf if make(x) < target else -np.inf))
    raise AssertionError(f"no double within 8 ulps of {start!r} reaches {target!r} exactly")


def test_a_speedup_exactly_at_the_margin_and_a_step_exactly_at_the_slo_are_allowed(profiles):
    # "S_real must reach 1 + margin" and "no neighbour pushed past its SLO": both bounds are
    # inclusive, and hold at equality (with the margin and the SLO ratio each chosen so that the
    # comparison meets γ = 1's own figures exactly).
    from dataclasses import replace

    import numpy as np

    from sovereignspec.core.optimiser import gamma_table
    from sovereignspec.core.placement import spec_request
    from sovereignspec.core.roofline import roofline_for

    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    req, _ = spec_request(profiles, PlacerSettings(), wl(seqs=4))
    idle, free = np.full(1, 8.0), np.full(1, np.inf)
    first = gamma_table(roof, req, idle, free)
    speedup, step, before = float(first.speedup[1, 0]), float(first.step[1, 0]), float(first.step_before[0])
    assert speedup > 1.0 and step > before  # γ = 1 pays here, and costs the neighbours something
    margin = _exactly(speedup - 1.0, lambda m: 1.0 + m, speedup)
    slo = _exactly(step / before, lambda r: r * before, step)
    table = gamma_table(roof, replace(req, margin=margin), idle, np.full(1, slo))
    assert bool(table.self_ok[1, 0]) and bool(table.externality_ok[1, 0])
    # Armed (a row of a per-batch table), the bar is 1 + margin times the armed γ = 0's speed-up.
    armed = replace(req, armed=True)
    base = gamma_table(roof, armed, idle, free)
    s0, s1 = float(base.speedup[0, 0]), float(base.speedup[1, 0])
    assert s1 > s0
    margin = _exactly(s1 / s0 - 1.0, lambda m: (1.0 + m) * s0, s1)
    assert bool(gamma_table(roof, replace(armed, margin=margin), idle, free).self_ok[1, 0])


SEVERAL_PODS = pytest.mark.parametrize(
    "shape",
    [
        {"gpus": 3, "pods": 3},  # no node holds all three: spread pod by pod
        {"gpus": 3, "pods": 3, "pod_sets": (2, 1)},  # a group: each pod set pinned to a node
        {"gpus": 2, "pods": 2, "assigned": _on(("eu0", 1), ("eu1", 1))},  # Kueue's topology assignment
    ],
    ids=["spread", "pod sets", "assigned"],
)


@SEVERAL_PODS
def test_an_unexplained_decision_of_several_pods_carries_no_breakdown(profiles, shape):
    # A tick's bulk decisions skip the breakdown (`reasons.record`, explain=False); so must each
    # pod's own decision inside a decision of several pods, whose record the joint one is made of.
    # The joint record is made from the pod with the lowest γ, the first on a tie: on idle GPUs the
    # first pod of a set; with eu0's second GPU busy, a pod set's second pod, which lands there.
    for eu0 in ([1.0, 1.0], [1.0, 0.05]):
        view = cluster(("eu0", "H100-SXM", eu0, "eu"), ("eu1", "H100-SXM", [1.0], "eu"))
        quiet = Placer(profiles, view).place(wl("job", jurisdiction="eu", **shape), explain=False)
        assert quiet.outcome == "placed" and len(quiet.record.pods) == shape["pods"], quiet.record.reason
        assert quiet.record.excluded == {} and quiet.record.reason.endswith(("; speculative", "; plain"))


@SEVERAL_PODS
def test_an_explained_decision_of_several_pods_says_why_as_a_one_pod_decision_does(profiles, shape):
    # The operator's Event and check message: the joint record is its lowest-γ pod's, so that
    # pod's why and breakdown (S_real, τ, steps) come with it, as a one-pod decision's do.
    for eu0 in ([1.0, 1.0], [1.0, 0.05]):
        view = cluster(("eu0", "H100-SXM", eu0, "eu"), ("eu1", "H100-SXM", [1.0], "eu"))
        told = Placer(profiles, view).place(wl("job", jurisdiction="eu", **shape), explain=True)
        assert told.outcome == "placed" and len(told.record.pods) == shape["pods"], told.record.reason
        why = told.record.reason.split("; ", 1)[1]
        assert why.startswith("γ*=") or why.endswith("plain decode"), told.record.reason
        assert told.record.gamma == min(g for _, _, g in told.record.pods)
        assert None not in (told.record.speedup, told.record.tau, told.record.step_ms), told.record
