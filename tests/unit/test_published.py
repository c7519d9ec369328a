"""The calibrated model held to published measurements, each with its tolerance stated.

Figures are copied from the papers named (see ../shared/calibration/README.md for what each says);
nothing here is computed by the code under test except the model's own predictions.
"""

import csv
from pathlib import Path

import pytest

from sovereignspec.core.roofline import roofline_for
from sovereignspec.core.speedup import tau

MEASUREMENTS = Path(__file__).resolve().parents[2] / "profiles" / "measurements"

# Liu, Yu, Park, Stoica, Cheung, "Speculative Decoding: Performance or Illusion?" (arXiv 2601.11580),
# SpecDecode-Bench simulator/predictor.py class Llama8BH100 @260263c: least squares over measured
# vLLM v0.10.1 runs of Llama-3.1-8B on one H100 80GB at batch 1, 8, 16, 32 and 64 (seconds).
C_KV = 3.92645679e-08  # per token held in the KV cache
C_QUERY = 2.10103129e-05  # per query token in the step
C_FIXED = 5.88590713e-03
OVERHEAD_PER_STEP = 1.20683946e-03


def _vllm_h100_step_s(batch, context, query_tokens):
    return batch * context * C_KV + batch * query_tokens * C_QUERY + C_FIXED + OVERHEAD_PER_STEP


@pytest.mark.parametrize("batch", [1, 2, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("context", [256, 512, 1024, 2048, 4096])
@pytest.mark.parametrize("query_tokens", [1, 2, 3, 5])
def test_h100_step_time_is_within_10_percent_of_the_vllm_fit(profiles, batch, context, query_tokens):
    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    predicted = float(roof.step_time(batch * query_tokens, batch, context))
    assert predicted == pytest.approx(_vllm_h100_step_s(batch, context, query_tokens), rel=0.10)


def _magicdec_rows():
    # MagicDec (Sadhukhan et al., ICLR 2025), Appendix Table 3: Llama-3.1-8B and LLaMA-2-7B-32K on
    # 8x A100 (TP8), plain step T_AR and verification of γ = 2 drafts T_V, ms.
    with (MEASUREMENTS / "magicdec_a100_table3.csv").open() as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("#")]
    return [
        pytest.param(
            "llama-3.1-8b" if "3.1" in r[1] else "llama-2-7b-32k",
            float(r[5]),
            int(r[6]),
            float(r[9]) / float(r[11]),
            id=f"{r[0]}-{r[1]}-ctx{r[5]}-b{r[6]}",
        )
        for r in rows
    ]


@pytest.mark.parametrize(("model", "context", "batch", "measured_ratio"), _magicdec_rows())
def test_a100_verification_over_plain_step_is_within_0_10_of_magicdec(
    profiles, model, context, batch, measured_ratio
):
    roof = roofline_for(profiles.gpus["A100-80G-SXM"], profiles.models[model], tp=8)
    ratio = float(roof.step_time(3 * batch, batch, context) / roof.step_time(batch, batch, context))
    assert ratio == pytest.approx(measured_ratio, abs=0.10)


# EAGLE-3 (Li et al., arXiv 2503.01840), Table 4: SGLang on one H100, Llama-3.1-8B-Instruct, MT-bench,
# batch 1: 158.34 tokens/s plain, 373.25 tokens/s with EAGLE-3 (2.357x). Table 1 gives the only
# published mean acceptance length of this pair on MT-bench, tau = 6.13 (HF backend, tree depth 8);
# Appendix A: 60 draft tokens verified per step.
SGLANG_PLAIN_TOKENS_PER_S = 158.34
SGLANG_EAGLE3_SPEEDUP = 373.25 / 158.34
EAGLE3_TAU, EAGLE3_DEPTH, EAGLE3_VERIFIED = 6.13, 8, 60


def test_h100_batch_1_plain_decode_is_within_15_percent_of_sglang(profiles):
    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    tokens_per_s = 1.0 / float(roof.step_time(1, 1, 512))
    assert tokens_per_s == pytest.approx(SGLANG_PLAIN_TOKENS_PER_S, rel=0.15)


def _alpha_for_tau(target, gamma):
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if float(tau(mid, gamma)) < target else (lo, mid)
    return lo


@pytest.mark.xfail(
    strict=True,
    reason="the model prices a chain; SGLang's run is a top-k tree whose H100 acceptance is not "
    "published: with the paper's HF tau (6.13) the model gives about 3.2x against 2.36x (docs/model.md)",
)
def test_h100_batch_1_eagle3_speedup_is_within_20_percent_of_sglang(profiles):
    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    drafter = profiles.drafters["eagle3"]
    c, o = drafter.cost_for("llama-3.1-8b"), drafter.spec_overhead
    alpha = _alpha_for_tau(EAGLE3_TAU, EAGLE3_DEPTH)
    plain = float(roof.step_time(1, 1, 512))
    step = float(roof.step_time(EAGLE3_VERIFIED, 1, 512)) + (EAGLE3_DEPTH * c + o) * plain
    speedup = float(tau(alpha, EAGLE3_DEPTH)) * plain / step
    assert speedup == pytest.approx(SGLANG_EAGLE3_SPEEDUP, rel=0.20)
