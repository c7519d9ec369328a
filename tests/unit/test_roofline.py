"""The roofline part of the model against values computed by hand from the datasheet figures.

Every expected number below is written out from the profile's datasheet entries (peak, bandwidth,
memory) and the model card (parameters, layers, heads), not from the code under test.
"""

import math

import pytest

from sovereignspec.core.roofline import headroom_from_tensor_activity, roofline_for, tensor_parallel_for

# Datasheet ridge points (dense bf16 FLOP/s over bytes/s), as in the design notes' table.
DATASHEET_RIDGE = {"A100-80G-SXM": 153, "H100-SXM": 295, "H200": 206, "L40S": 419, "RTX-4090": 164}


@pytest.mark.parametrize(("gpu", "ridge"), DATASHEET_RIDGE.items())
def test_profile_ridge_matches_the_datasheet_table(profiles, gpu, ridge):
    spec = profiles.gpus[gpu]
    assert spec.peak_flops / spec.mem_bandwidth == pytest.approx(ridge, abs=1.0)


def test_h100_8b_single_sequence_step_is_memory_bound_and_matches_the_hand_value(profiles):
    # Weights 8.03e9 x 2 B = 16.06 GB; KV per token 2 x 32 layers x 8 heads x 128 x 2 B = 131,072 B;
    # one sequence of 1,024 tokens reads 134,217,728 B. Effective bandwidth 3.35e12 x 0.8 = 2.68e12 B/s.
    memory_s = (16.06e9 + 134_217_728) / 2.68e12
    # FLOPs per token: 2 x 8.03e9 + 4 x 32 x 1,024 x 4,096 = 16.596870912e9; effective 989e12 x 0.7.
    compute_s = 16.596870912e9 / (989e12 * 0.7)
    assert memory_s > compute_s
    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    assert float(roof.step_time(1, 1, 1024)) == pytest.approx(memory_s + 0.5e-3, rel=1e-12)
    assert float(roof.memory_time(1, 1024)) == pytest.approx(memory_s, rel=1e-12)
    assert float(roof.compute_time(1, 1024)) == pytest.approx(compute_s, rel=1e-12)
    # ~6.54 ms per token: ~153 tokens/s for one stream, the familiar order for an 8B model on an H100.
    assert 1.0 / (memory_s + 0.5e-3) == pytest.approx(152.9, abs=0.5)


def test_a100_70b_runs_at_tp4_and_a_large_token_batch_is_compute_bound(profiles):
    gpu, model = profiles.gpus["A100-80G-SXM"], profiles.models["llama-3.3-70b"]
    assert tensor_parallel_for(gpu, model) == 4
    roof = roofline_for(gpu, model)
    # Per rank: weights 70.6e9 x 2 / 4 = 35.3 GB; 2,048 query tokens over 256 sequences of 512 tokens.
    kv_per_token = 2 * 80 * 8 * 128 * 2 / 4  # 81,920 B per rank
    memory_s = (35.3e9 + 256 * 512 * kv_per_token) / (2.039e12 * 0.8)
    flops_per_token = (2 * 70.6e9 + 4 * 80 * 512 * 8192) / 4
    compute_s = 2048 * flops_per_token / (312e12 * 0.7)
    assert compute_s > memory_s
    fixed_s = 0.5e-3 + 2 * 80 * 12e-6  # step overhead plus two all-reduces per layer over NVLink
    assert float(roof.step_time(2048, 256, 512)) == pytest.approx(compute_s + fixed_s, rel=1e-12)


def test_rtx4090_cannot_hold_70b_at_tp4_and_moves_to_tp8(profiles):
    # 141.2 GB of weights / 4 = 35.3 GB > 0.85 x 24 GB; / 8 = 17.65 GB fits.
    assert tensor_parallel_for(profiles.gpus["RTX-4090"], profiles.models["llama-3.3-70b"]) == 8


def test_zero_headroom_is_the_compute_ridge_and_the_mapping_inverts(profiles):
    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    ridge = float(roof.seqs_for_headroom(0.0, 256))
    # At the ridge compute time equals memory time, by hand: s·f/P = (W + s·L·kv)/B.
    f = 2 * 8.03e9 + 4 * 32 * 256 * 4096
    by_hand = (16.06e9 / 2.68e12) / (f / (989e12 * 0.7) - 256 * 131072 / 2.68e12)
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
