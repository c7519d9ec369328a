"""The step-time model against values computed by hand.

Every expected number below is written out from the profile's datasheet entries (peak, bandwidth,
memory), its fitted coefficients (efficiencies, overhead, κ, p) and the model card (parameters,
layers, heads), not from the code under test.
"""

import math

import numpy as np
import pytest

from sovereignspec.core.roofline import headroom_from_tensor_activity, roofline_for, tensor_parallel_for

# Datasheet ridge points (dense bf16 FLOP/s over bytes/s), as in the design notes' table.
DATASHEET_RIDGE = {"A100-80G-SXM": 153, "H100-SXM": 295, "H200": 206, "L40S": 419, "RTX-4090": 164}


@pytest.mark.parametrize(("gpu", "ridge"), DATASHEET_RIDGE.items())
def test_profile_ridge_matches_the_datasheet_table(profiles, gpu, ridge):
    spec = profiles.gpus[gpu]
    assert spec.peak_flops / spec.mem_bandwidth == pytest.approx(ridge, abs=1.0)


def _smax(a, b, p):
    return (a**p + b**p) ** (1 / p)


def test_h100_8b_single_sequence_step_adds_attention_and_gemm_kernels_as_written_by_hand(profiles):
    gpu = profiles.gpus["H100-SXM"]
    B, P = 3.35e12 * gpu.bandwidth_efficiency, 989e12 * gpu.compute_efficiency
    # Weights 8.03e9 x 2 B = 16.06 GB; KV per token 2 x 32 layers x 8 heads x 128 x 2 B = 131,072 B.
    kv_s = 1024 * 131_072 / B
    attention_s = 4 * 32 * 1024 * 4096 / P  # one query token over 1,024 context tokens
    gemm_s = 2 * 8.03e9 / P
    streamed_s = 16.06e9 / B + gpu.serial_fraction * gemm_s
    by_hand = (
        gpu.step_overhead_s + _smax(kv_s, attention_s, gpu.overlap) + _smax(streamed_s, gemm_s, gpu.overlap)
    )
    roof = roofline_for(gpu, profiles.models["llama-3.1-8b"])
    assert float(roof.step_time(1, 1, 1024)) == pytest.approx(by_hand, rel=1e-12)
    assert float(roof.memory_time(1, 1024)) == pytest.approx((16.06e9 + 1024 * 131_072) / B, rel=1e-12)
    # ~7.2 ms per token, ~140 tokens/s for one stream: SGLang measured 158 tokens/s (EAGLE-3 paper,
    # table 4), vLLM's fitted runs 7.2 ms.
    assert 1.0 / by_hand == pytest.approx(158.34, rel=0.15)


def test_a100_70b_runs_at_tp4_and_per_rank_terms_follow_the_shards(profiles):
    gpu, model = profiles.gpus["A100-80G-SXM"], profiles.models["llama-3.3-70b"]
    assert tensor_parallel_for(gpu, model) == 4
    roof = roofline_for(gpu, model)
    B, P = 2.039e12 * gpu.bandwidth_efficiency, 312e12 * gpu.compute_efficiency
    # Per rank: weights 70.6e9 x 2 / 4 = 35.3 GB; 2,048 query tokens over 256 sequences of 512 tokens.
    kv_per_token = 2 * 80 * 8 * 128 * 2 / 4  # 81,920 B per rank
    kv_s = 256 * 512 * kv_per_token / B
    attention_s = 2048 * (4 * 80 * 8192 / 4) * 512 / P
    gemm_s = 2048 * (2 * 70.6e9 / 4) / P
    streamed_s = 35.3e9 / B + gpu.serial_fraction * gemm_s
    fixed_s = gpu.step_overhead_s + 2 * 80 * gpu.allreduce_s  # two all-reduces per layer
    by_hand = fixed_s + _smax(kv_s, attention_s, gpu.overlap) + _smax(streamed_s, gemm_s, gpu.overlap)
    assert float(roof.step_time(2048, 256, 512)) == pytest.approx(by_hand, rel=1e-12)


def test_the_step_time_has_no_corner_more_query_tokens_always_cost_more(profiles):
    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    n = np.arange(1, 2049, dtype=float)
    steps = roof.step_time(n, 32, 1024)
    assert (np.diff(steps) > 0).all()  # below the ridge too: verification is never free
    slopes = np.diff(steps)
    assert (np.diff(slopes) >= -1e-15).all()  # convex: the approach to the compute roof is smooth


def test_rtx4090_cannot_hold_70b_at_tp4_and_moves_to_tp8(profiles):
    # 141.2 GB of weights / 4 = 35.3 GB > 0.85 x 24 GB; / 8 = 17.65 GB fits.
    assert tensor_parallel_for(profiles.gpus["RTX-4090"], profiles.models["llama-3.3-70b"]) == 8


def test_zero_headroom_is_the_compute_ridge_and_the_mapping_inverts(profiles):
    gpu = profiles.gpus["H100-SXM"]
    roof = roofline_for(gpu, profiles.models["llama-3.1-8b"])
    ridge = float(roof.seqs_for_headroom(0.0, 256))
    B, P = 3.35e12 * gpu.bandwidth_efficiency, 989e12 * gpu.compute_efficiency
    # At the ridge compute time equals memory time, by hand: s·f/P = (W + s·L·kv)/B.
    f = 2 * 8.03e9 + 4 * 32 * 256 * 4096
    by_hand = (16.06e9 / B) / (f / P - 256 * 131072 / B)
    assert ridge == pytest.approx(by_hand, rel=1e-12)
    for h in (0.0, 0.25, 0.5, 0.9):
        s = roof.seqs_for_headroom(h, 256)
        assert float(roof.headroom(s, s, 256)) == pytest.approx(h, abs=1e-9)
    assert float(roof.seqs_for_headroom(1.0, 256)) == 0.0


def test_long_context_never_reaches_the_ridge_and_maps_to_kv_capacity(profiles):
    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    # 32k context: KV per sequence 4.29 GB, far more bytes than FLOPs per token can match.
    capacity = (0.92 * 80e9 - 16.06e9) / (32768 * 131072)
    assert float(roof.seqs_for_headroom(0.0, 32768)) == pytest.approx(capacity, rel=1e-12)
    assert math.isfinite(float(roof.seqs_for_headroom(0.0, 32768)))


def test_tensor_activity_maps_to_headroom_through_the_compute_efficiency():
    assert float(headroom_from_tensor_activity(0.0, 0.7)) == 1.0
    assert float(headroom_from_tensor_activity(0.35, 0.7)) == pytest.approx(0.5)
    assert float(headroom_from_tensor_activity(0.9, 0.7)) == 0.0


@pytest.mark.parametrize(("params", "tp"), [(15e9, 1), (30e9, 2), (60e9, 4), (120e9, 8), (300e9, 16)])
def test_the_tensor_parallel_degree_is_the_smallest_power_of_two_whose_shard_fits(profiles, params, tp):
    # L40S, 48 GB: a shard of weights may take 85 % of it (40.8 GB) at 2 bytes per parameter.
    from dataclasses import replace

    from sovereignspec.core.roofline import tensor_parallel_for

    model = replace(profiles.models["llama-3.1-8b"], name="m", params=params, tensor_parallel=1)
    assert tensor_parallel_for(profiles.gpus["L40S"], model) == tp


@pytest.mark.parametrize(("n_tokens", "n_seqs", "context"), [(8, 8, 512), (256, 4, 32768), (4096, 64, 4096)])
def test_the_explainers_terms_add_up_to_the_step_where_attention_compute_shows_too(
    profiles, n_tokens, n_seqs, context
):
    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    terms = roof.step_terms(float(n_tokens), float(n_seqs), float(context))
    assert sum(terms.values()) == pytest.approx(float(roof.step_time(n_tokens, n_seqs, context)), rel=1e-12)
    if n_tokens / n_seqs >= 64:  # 64 query tokens per sequence at 32K: attention's FLOPs show
        assert terms["attention_excess"] > 0.1 * terms["kv_reads"]


def test_a_reading_outside_0_1_maps_to_the_nearest_end(profiles):
    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    assert float(roof.seqs_for_headroom(1.3, 1024)) == float(roof.seqs_for_headroom(1.0, 1024)) == 0.0
    assert float(roof.seqs_for_headroom(-0.2, 1024)) == float(roof.seqs_for_headroom(0.0, 1024)) > 0.0


def test_a_context_under_one_token_counts_as_one_for_kv_capacity(profiles):
    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    one = float((roof.capacity_bytes - roof.weight_bytes) / roof.kv_bytes_per_token)
    assert float(roof.max_seqs(1)) == float(roof.max_seqs(0)) == pytest.approx(one, rel=1e-12)


def test_an_infinite_overlap_exponent_is_the_hard_roofline():
    from sovereignspec.core.roofline import smooth_max

    a, b = np.array([0.0, 1.0, 3.0, 2.0]), np.array([0.0, 2.0, 1.0, 2.0])
    assert (smooth_max(a, b, math.inf) == np.maximum(a, b)).all()
    assert (smooth_max(a, b, 8.0) >= np.maximum(a, b)).all() and smooth_max(0.0, 0.0, 8.0) == 0.0


def test_every_tensor_parallel_degree_above_one_pays_two_all_reduces_per_layer(profiles):
    gpu, model = profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"]
    assert float(roofline_for(gpu, model, 1).fixed_s) == gpu.step_overhead_s
    for tp in (2, 4, 8):
        fixed = float(roofline_for(gpu, model, tp).fixed_s)
        assert fixed == pytest.approx(gpu.step_overhead_s + 2 * model.layers * gpu.allreduce_s, rel=1e-12)


@pytest.mark.parametrize("gpu", ["H100-SXM", "A100-80G-SXM", "L40S"])
@pytest.mark.parametrize("model", ["llama-3.1-8b", "llama-3.3-70b"])
def test_compute_bound_is_headroom_zero_for_arrays_and_floats(profiles, gpu, model):
    # The caution near the ridge asks `compute_bound`; the headroom reading answers the same
    # question another way (1 - min(1, C/M)): they agree on a grid that crosses the ridge.
    from sovereignspec.core.roofline import compute_bound
    from sovereignspec.core.scalar import Coeffs

    g, m = profiles.gpus[gpu], profiles.models[model]
    roof = roofline_for(g, m)
    c = Coeffs.of(g, m, tensor_parallel_for(g, m))
    seqs = np.array([1.0, 16.0, 64.0, 200.0, 400.0, 900.0])
    for context in (128.0, 1024.0, 8192.0):
        for q in (1.0, 2.0, 4.0, 8.0):
            bound = compute_bound(roof, seqs * q, seqs, context)
            assert np.array_equal(bound, roof.headroom(seqs * q, seqs, context) == 0.0)
            assert [compute_bound(c, s * q, s, context) for s in seqs.tolist()] == bound.tolist()
    assert compute_bound(roof, 4000.0, 1.0, 128.0) and not compute_bound(roof, 1.0, 1.0, 128.0)


@pytest.mark.parametrize("p", [1.5, 8.0, 63.578, math.inf])
def test_the_smooth_maximum_is_its_definition_and_its_float_twin(p):
    from sovereignspec.core.roofline import smooth_max
    from sovereignspec.core.scalar import _smax

    rng = np.random.default_rng(7)
    a = np.concatenate([rng.random(200) * 1e-2, [0.0, 0.0, 1e-3, 5e-4]])
    b = np.concatenate([rng.random(200) * 1e-2, [0.0, 2e-3, 1e-3, 0.0]])
    got = smooth_max(a, b, p)
    # numpy's vectorised pow may differ from libm's by an ulp; every other operation is the same.
    twin = [_smax(x, y, p) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
    assert got == pytest.approx(twin, rel=1e-15, abs=0.0)
    if math.isinf(p):
        assert (got == np.maximum(a, b)).all()
    else:
        assert got == pytest.approx((a**p + b**p) ** (1.0 / p), rel=1e-12, abs=0.0)
    # Broadcast as the verification steps use it: one value per GPU against a row per draft length.
    rows = smooth_max(a, np.stack([b, 2.0 * b]), p)
    assert rows.shape == (2, a.size) and rows[0].tolist() == got.tolist()


@pytest.mark.parametrize("gpu", ["H100-SXM", "A100-80G-SXM", "RTX-4090"])
def test_the_step_is_one_formula_for_arrays_and_floats(profiles, gpu):
    from sovereignspec.core.roofline import step_at
    from sovereignspec.core.scalar import Coeffs, _smax

    roof = roofline_for(profiles.gpus[gpu], profiles.models["llama-3.1-8b"])
    c = Coeffs(*roof.matrix().tolist())
    tokens = np.array([1.0, 9.0, 64.0, 300.0, 2048.0])
    for ctx in (1.0, 512.0, 8192.0):
        rates = roof.step_rates(ctx)
        arrays = roof.step_at(rates, tokens, tokens / 2.0)
        assert arrays.tolist() == roof.step_time(tokens, tokens / 2.0, ctx).tolist()
        floats = [step_at(c, c.rates(ctx), n, n / 2.0, _smax) for n in tokens.tolist()]  # as best_gamma
        assert floats == [c.step(n, n / 2.0, ctx) for n in tokens.tolist()]
        assert arrays == pytest.approx(floats, rel=1e-15, abs=0.0)  # an ulp of pow at most


def _smooth_max_in_full(a, b, p):
    # The formula with both powers everywhere: what `smooth_max` computed before it skipped them.
    hi, lo = np.maximum(a, b), np.minimum(a, b)
    return hi * (1.0 + (lo / np.maximum(hi, np.finfo(np.float64).tiny)) ** p) ** (1.0 / p)


@pytest.mark.parametrize("p", [1.5, 8.0, 63.578, 64.0, math.inf])
def test_the_smooth_maximum_skips_its_powers_only_where_they_change_nothing(p):
    from sovereignspec.core.roofline import negligible_ratio, smooth_max

    rng = np.random.default_rng(11)
    edge = float(negligible_ratio(p))
    # Ratios everywhere in [0, 1] and densely on both sides of the bound the shortcut uses.
    ratios = np.concatenate([rng.random(4000), edge * (1.0 + rng.uniform(-1e-5, 1e-5, 4000)), [0.0, 1.0]])
    hi = rng.uniform(1e-6, 1.0, ratios.size)
    a, b = hi, ratios * hi
    got = smooth_max(a, b, p)
    assert np.array_equal(got, _smooth_max_in_full(a, b, p))
    assert np.array_equal(smooth_max(b, a, p), got)
    # Below the bound the power is under half an ulp of 1, so 1 + power is 1 exactly.
    below = ratios[ratios <= edge]
    assert (1.0 + below**p == 1.0).all()


def test_the_smooth_maximum_with_one_exponent_per_gpu_is_the_full_formula_per_column():
    from sovereignspec.core.roofline import smooth_max

    rng = np.random.default_rng(12)
    p = rng.choice([8.0, 63.578, 64.0, math.inf], size=500)  # GPU types of a mixed cluster
    a = rng.uniform(1e-6, 1.0, (9, 500))  # a row per draft length, a column per GPU
    b = a * rng.random((9, 500))
    assert np.array_equal(smooth_max(a, b, p), _smooth_max_in_full(a, b, p))
    assert np.array_equal(smooth_max(a, b, p[None, :]), _smooth_max_in_full(a, b, p))
    one = smooth_max(0.5, 0.45, 8.0)
    assert isinstance(one, np.floating) and one == _smooth_max_in_full(0.5, 0.45, 8.0)


@pytest.mark.parametrize("gamma", [0, 1, 3, 8])
def test_tau_for_floats_is_the_array_tau_and_gamma_plus_one_at_alpha_one(gamma):
    # The float τ decides in the placer's one-GPU updates and the simulator's requests; at α = 1
    # (and within 1e-12 of it, where the geometric sum divides by almost nothing) every drafted
    # token is accepted: γ + 1 per step, by hand.
    from sovereignspec.core.scalar import tau as scalar_tau
    from sovereignspec.core.speedup import tau

    assert scalar_tau(1.0, gamma) == gamma + 1.0
    assert scalar_tau(1.0 - 1e-13, gamma) == gamma + 1.0
    assert scalar_tau(0.5, 3) == pytest.approx(1.875, rel=1e-15)  # 1 + 1/2 + 1/4 + 1/8
    for alpha in (0.0, 0.3, 0.7, 0.999, 1.0 - 1e-13, 1.0):
        assert scalar_tau(alpha, gamma) == float(tau(alpha, gamma)), alpha


def test_a_gpus_coefficients_and_its_choice_cannot_be_changed_once_made(profiles):
    # One Coeffs serves every GPU of a type and a Choice is kept in the placer's caches: a write to
    # either would change other GPUs' or later decisions unseen.
    import dataclasses

    from sovereignspec.core.scalar import Choice, Coeffs

    c = Coeffs.of(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"], 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.flops = 1.0  # type: ignore[misc]
    choice = Choice(gamma=2, step=0.01, plain=0.008, before=0.007, load=4.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        choice.gamma = 3  # type: ignore[misc]


@pytest.mark.parametrize("gpu", ["H100-SXM", "RTX-4090"])
def test_headroom_and_its_inverse_for_floats_are_the_arrays_below_and_past_the_ridge(profiles, gpu):
    # The float twins update a GPU's reading after each placement (`Placer._commit`): a reading
    # past the ridge is 0 headroom, never below it, and one outside 0-1 maps to the nearest end.
    from sovereignspec.core.scalar import Coeffs

    model = profiles.models["llama-3.1-8b"]
    roof, c = roofline_for(profiles.gpus[gpu], model), Coeffs.of(profiles.gpus[gpu], model, 1)
    # (query tokens, sequences, context): from the weight stream to far past the ridge (a long
    # verification over few short sequences)
    steps = [(1.0, 1.0, 1024.0), (64.0, 64.0, 1024.0), (512.0, 64.0, 128.0), (32768.0, 64.0, 128.0)]
    for n, s, ctx in steps:
        assert c.headroom(n, s, ctx) == float(roof.headroom(n, s, ctx)), (n, s, ctx)
        assert 0.0 <= c.headroom(n, s, ctx) <= 1.0
    assert c.headroom(32768.0, 64.0, 128.0) == 0.0 < c.headroom(1.0, 1.0, 1024.0)
    # 1024 tokens of context keep these GPUs memory-bound at any batch (every reading below the
    # reachable one is the KV capacity); 128 crosses the ridge well inside it.
    for ctx in (1024.0, 128.0):
        for h in (-0.2, 0.0, 0.3, 0.9, 1.0, 1.3):
            assert c.seqs_for_headroom(h, ctx) == float(roof.seqs_for_headroom(h, ctx)), (h, ctx)
        assert c.seqs_for_headroom(1.3, ctx) == c.seqs_for_headroom(1.0, ctx) == 0.0
        assert c.seqs_for_headroom(-0.2, ctx) == c.seqs_for_headroom(0.0, ctx) > 0.0
    assert c.seqs_for_headroom(0.0, 128.0) < float(roof.max_seqs(128.0))  # the ridge, not the capacity


def test_a_model_whose_weights_fill_the_gpu_holds_no_sequences_for_arrays_and_floats(profiles):
    # Weights past the usable memory (a tensor-parallel degree too small for them) leave no room
    # for any KV cache: no load, never a negative one, whatever the reading.
    from sovereignspec.core.scalar import Coeffs

    gpu, model = profiles.gpus["RTX-4090"], profiles.models["llama-3.3-70b"]
    roof = roofline_for(gpu, model, 1)
    assert float(roof.weight_bytes) > float(roof.capacity_bytes)
    c = Coeffs(*roof.matrix().tolist())
    for ctx in (1.0, 128.0, 4096.0):
        assert float(roof.max_seqs(ctx)) == 0.0
        for h in (0.0, 0.5, 1.0):
            assert c.seqs_for_headroom(h, ctx) == float(roof.seqs_for_headroom(h, ctx)) == 0.0, (h, ctx)


def test_on_a_tie_the_float_choice_keeps_the_shorter_draft_as_the_array_argmax_does(profiles):
    # Two draft lengths whose scores are equal on the tie grid: the array path's argmax takes the
    # first (the shorter draft, less work for the same gain); the float path must do the same.
    from sovereignspec.core.scalar import Coeffs, best_gamma, speedup_at

    c = Coeffs.of(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"], 1)
    idle = 1.0  # no background: the aggregate is the workload's own speed-up
    ratio = {g: speedup_at(c, [1.0, 1.0, 1.0], g, 4.0, 1024.0, 0.05, 0.0, idle)[0] for g in (1, 2)}
    taus = [1.0, 1.8, 1.8 * ratio[1] / ratio[2]]  # γ = 2's τ chosen to score exactly what γ = 1 does
    choice = best_gamma(c, taus, 4.0, 1024.0, 0.05, 0.0, 0.0, idle, math.inf, True)
    assert choice.gamma == 1
    nudged = [1.0, 1.8, taus[2] * (1 + 1e-6)]  # a millionth more for γ = 2: now it wins
    assert best_gamma(c, nudged, 4.0, 1024.0, 0.05, 0.0, 0.0, idle, math.inf, True).gamma == 2
