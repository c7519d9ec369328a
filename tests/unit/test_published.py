"""The calibrated model held to published measurements, each with its tolerance stated.

Figures are copied from the papers named (see ../shared/calibration/README.md for what each says);
nothing here is computed by the code under test except the model's own predictions, and those come
from what the operator decides with: the optimiser's γ table (`gamma_table`, as `Placer` calls it,
for a workload built by `budget.spec_request`), or the speculative step's one home
(`speedup.speculative_step`) where the published engine verifies a tree. No test restates a formula.
"""

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sovereignspec.core.budget import spec_request
from sovereignspec.core.cluster import PlacerSettings, WorkloadRequest
from sovereignspec.core.optimiser import gamma_table
from sovereignspec.core.roofline import roofline_for
from sovereignspec.core.speedup import speculative_step

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


def _decision_steps(profiles, gpu, model, drafter, batch, context, tp=None, drafting=True):
    """T_step for γ = 0..8 as the operator computes it: one workload of `batch` sequences on an idle
    GPU (no background, no neighbours). Without `drafting`, the drafter costs nothing: the table's
    steps are then the verification steps alone."""
    w = WorkloadRequest("w", "tenant", model, drafter, 0.8, seqs=batch, context=context)
    req, off = spec_request(profiles, PlacerSettings(), w)
    assert off is None and req.gamma_max == 8
    if not drafting:
        req = replace(req, draft_cost=0.0, spec_overhead=0.0)
    roof = roofline_for(profiles.gpus[gpu], profiles.models[model], tp)
    return gamma_table(roof, req, np.zeros(1), np.full(1, np.inf)).step[:, 0]


@pytest.mark.parametrize("batch", [1, 2, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("context", [256, 512, 1024, 2048, 4096])
@pytest.mark.parametrize("query_tokens", [1, 2, 3, 5])
def test_h100_step_time_is_within_10_percent_of_the_vllm_fit(profiles, batch, context, query_tokens):
    steps = _decision_steps(profiles, "H100-SXM", "llama-3.1-8b", "eagle3", batch, context, drafting=False)
    predicted = float(steps[query_tokens - 1])  # verifying γ = q - 1 drafts
    assert predicted == pytest.approx(_vllm_h100_step_s(batch, context, query_tokens), rel=0.10)


# The same fit's EAGLE-3 draft time (seconds): per KV token, per drafted token (summed over the
# batch), fixed per step.
DRAFT_C_KV = 2.37768493e-09
DRAFT_C_SPEC = 8.41429603e-07
DRAFT_C_FIXED = 2.13526175e-03


def _vllm_h100_draft_s(batch, context, gamma):
    return batch * context * DRAFT_C_KV + batch * gamma * DRAFT_C_SPEC + DRAFT_C_FIXED


@pytest.mark.parametrize("context", [256, 1024, 4096])
@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_h100_eagle3_drafting_grows_from_batch_1_to_64_as_the_vllm_runs_did(profiles, context, gamma):
    # The measured draft time grows 1.04-1.38x from batch 1 to 64, while the plain step grows
    # 1.35-2.6x: a draft pass is small-batch work. What the decision adds for drafting (its step
    # with the drafter's price less its step without) grows within 30 % of the measured growth
    # (worst: γ = 1 at 4K, 1.68x against 1.31x, where the per-step tax, priced against the plain
    # step, dominates); priced all against the batch's plain step (until 2026-12-02) the model's
    # drafting grew 1.27-2.57x, up to 96 % over.
    def drafting(batch):
        args = (profiles, "H100-SXM", "llama-3.1-8b", "eagle3", batch, context)
        return float(_decision_steps(*args)[gamma] - _decision_steps(*args, drafting=False)[gamma])

    measured = _vllm_h100_draft_s(64, context, gamma) / _vllm_h100_draft_s(1, context, gamma)
    assert drafting(64) / drafting(1) == pytest.approx(measured, rel=0.30)


@pytest.mark.parametrize("batch", [1, 8, 16, 32, 64])
@pytest.mark.parametrize("context", [256, 1024, 4096])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_h100_eagle3_speculative_step_is_within_25_percent_of_the_vllm_runs(profiles, batch, context, gamma):
    # The whole step the decision prices (verification, drafting and the machinery's tax) against
    # the fit's target forward plus its draft time, where the fit was measured (batch 1-64, k = 1,
    # 3, 5). The model is 11 % RMS off here, from -9 % (batch 1, 256, γ 1) to +23 % (batch 1, 4K,
    # γ 5: its verification of 6 tokens bends earlier than the fit's straight line). With drafting
    # priced against the batch's plain step the worst is 29 % (batch 64, 4K, γ 5).
    steps = _decision_steps(profiles, "H100-SXM", "llama-3.1-8b", "eagle3", batch, context)
    measured = _vllm_h100_step_s(batch, context, gamma + 1) + _vllm_h100_draft_s(batch, context, gamma)
    assert float(steps[gamma]) == pytest.approx(measured, rel=0.25)


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
    drafter = "eagle3" if model == "llama-3.1-8b" else "ngram"  # any drafter: its price is set to 0
    steps = _decision_steps(profiles, "A100-80G-SXM", model, drafter, batch, context, tp=8, drafting=False)
    assert float(steps[2] / steps[0]) == pytest.approx(measured_ratio, abs=0.10)


# EAGLE-3 (Li et al., arXiv 2503.01840), Table 4: SGLang on one H100, Llama-3.1-8B-Instruct, MT-bench,
# batch 1, without speculation: 158.34 tokens/s. The EAGLE-3 run with its acceptance length is the one
# that integrated EAGLE-3 into SGLang (sgl-project/sglang#4247, 2025-03-10, CUDA graphs, MT-bench's 80
# questions, `--speculative-num-steps 8`): 378.57 tokens/s at a mean acceptance length of 5.39 (the
# EAGLE authors give it as "~380 tokens/s on a single H100", hemingkx/Spec-Bench#22; the paper's
# 373.25 is the same setup). The paper's own tau for this pair, 6.13, is the HF backend on an RTX 3090
# (Table 1), not this engine. The run verifies a top-k tree of 60 drafted tokens (Appendix A) at depth
# 8 (eight draft passes).
SGLANG_PLAIN_TOKENS_PER_S = 158.34
SGLANG_EAGLE3_TOKENS_PER_S, SGLANG_EAGLE3_TAU = 378.57, 5.39
EAGLE3_DEPTH, EAGLE3_VERIFIED = 8, 60


def test_h100_batch_1_plain_decode_is_within_15_percent_of_sglang(profiles):
    steps = _decision_steps(profiles, "H100-SXM", "llama-3.1-8b", "eagle3", 1, 512)
    assert 1.0 / float(steps[0]) == pytest.approx(SGLANG_PLAIN_TOKENS_PER_S, rel=0.15)


def test_h100_batch_1_eagle3_speedup_is_within_10_percent_of_sglang(profiles):
    # The speculative step's one home, given the tree's verification step (60 tokens: the chain the
    # optimiser prices verifies γ + 1 = 9, 13 % cheaper here) and the decision's own batch-1 and
    # plain steps and drafter price. Tolerance 10 %: the two published figures of this run differ by
    # 1.4 % (378.57, 373.25 tokens/s), and the model's plain step at this point is 11 % slower than
    # SGLang's, most of which cancels in the ratio. The model is 7.8 % over; without the machinery's
    # tax it would be 12 % over, with drafting priced as a batch-1 step it is what it is at batch 1.
    w = WorkloadRequest("w", "tenant", "llama-3.1-8b", "eagle3", 0.8, seqs=1, context=512)
    req, _ = spec_request(profiles, PlacerSettings(), w)
    roof = roofline_for(profiles.gpus["H100-SXM"], profiles.models["llama-3.1-8b"])
    plain = roof.step_time(1.0, 1.0, 512)
    verify = roof.step_time(EAGLE3_VERIFIED, 1.0, 512)
    step = speculative_step(verify, plain, plain, EAGLE3_DEPTH, req.draft_cost, req.spec_overhead)
    speedup = SGLANG_EAGLE3_TAU * float(plain / step)
    assert speedup == pytest.approx(SGLANG_EAGLE3_TOKENS_PER_S / SGLANG_PLAIN_TOKENS_PER_S, rel=0.10)
