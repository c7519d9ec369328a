"""The decision in the serving engines' own terms: vLLM's --speculative-config and SGLang's flags.

Also a per-batch-size draft budget derived from the same cost model, so that an engine that adapts
γ to its running batch (vLLM's dynamic speculation, SGLang's adaptive mode) agrees with the cluster
decision instead of fighting it.
"""

from __future__ import annotations

import json

import numpy as np

from sovereignspec.core.optimiser import SpecRequest, choose, gamma_table
from sovereignspec.core.roofline import roofline_for
from sovereignspec.core.specs import DrafterSpec, GpuSpec, ModelSpec

BATCH_BREAKPOINTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


def engine_config(drafter: DrafterSpec, model: str, gamma: int) -> tuple[str, str]:
    """vLLM and SGLang configuration for `gamma` draft tokens (γ = 0: both empty, plain decode)."""
    if gamma <= 0:
        return "", ""
    names = drafter.engines
    draft = names.draft_models.get(model, "")
    vllm: dict[str, object] = {"method": names.vllm_method, "num_speculative_tokens": gamma}
    if draft:
        vllm["model"] = draft
    if names.vllm_method == "ngram":
        vllm.update({"prompt_lookup_min": 2, "prompt_lookup_max": 5})
    sglang = [f"--speculative-algorithm {names.sglang_algorithm}"]
    if draft:
        sglang.append(f"--speculative-draft-model-path {draft}")
    if names.sglang_algorithm != "NGRAM":
        sglang += [f"--speculative-num-steps {gamma}", "--speculative-eagle-topk 1"]
    sglang.append(f"--speculative-num-draft-tokens {gamma + 1}")
    return json.dumps(vllm, separators=(",", ":"), sort_keys=True), " ".join(sglang)


def budget_by_batch(
    gpu: GpuSpec,
    model: ModelSpec,
    drafter: DrafterSpec,
    alpha: float,
    context: float,
    gamma_max: int,
    margin: float,
) -> list[list[int]]:
    """γ* for an engine of its own at each batch size, merged into [start, end, γ] ranges."""
    roof = roofline_for(gpu, model)
    batches = np.array(BATCH_BREAKPOINTS, dtype=np.float64)
    out: list[list[int]] = []
    for b in batches:
        req = SpecRequest(
            alpha, float(b), context, drafter.cost_for(model.name), drafter.spec_overhead, gamma_max, margin
        )
        g = int(choose(gamma_table(roof, req, np.zeros(1), np.full(1, np.inf))).gamma[0])
        if out and out[-1][2] == g:
            out[-1][1] = int(b)
        else:
            out.append([int(b), int(b), g])
    return out
