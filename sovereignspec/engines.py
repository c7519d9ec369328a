"""The decision in the serving engines' own terms.

vLLM (>= 0.24): one `--speculative-config` JSON with the method, the draft checkpoint,
`num_speculative_tokens` and `num_speculative_tokens_per_batch_size`, the per-batch table its
scheduler reads (inclusive `[first batch, last batch, K]` ranges starting at batch 1; K is clamped
to `num_speculative_tokens` at run time and the last range's K holds for larger batches). Older
vLLM rejects the unknown key: `sovereignspec launch --vllm-legacy` drops it.

SGLang: the algorithm flags; for EAGLE/EAGLE3 with top-k 1 its adaptive mode
(`--speculative-adaptive` plus a JSON file of per-batch `candidate_steps`, keyed by each range's
first batch size); NGRAM drafts a chain of γ tokens (BFS breadth 1), the shape the model prices.

Field and flag names are held to the engines' source by tests/unit/test_engine_contract.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from sovereignspec.core.optimiser import SpecRequest, choose, gamma_table
from sovereignspec.core.roofline import roofline_for
from sovereignspec.core.specs import DrafterSpec, GpuSpec, ModelSpec

BATCH_BREAKPOINTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# SGLang's adaptive mode runs only these algorithms, and only with top-k 1
# (python/sglang/srt/speculative/adaptive_spec_params.py: adaptive_unsupported_reason).
SGLANG_ADAPTIVE = frozenset({"EAGLE", "EAGLE3"})

Table = list[list[int]]


@dataclass(frozen=True)
class EngineConfig:
    """What a speculative decision hands each engine ("" everywhere for plain decode)."""

    vllm: str = ""  # JSON for vLLM's --speculative-config
    sglang: str = ""  # SGLang flags
    sglang_adaptive: str = ""  # JSON for SGLang's --speculative-adaptive-config ("" if unsupported)


def budget_by_batch(
    gpu: GpuSpec,
    model: ModelSpec,
    drafter: DrafterSpec,
    alpha: float,
    context: float,
    gamma_max: int,
    margin: float,
    cap: int | None = None,
) -> Table:
    """γ* of an engine of its own at each batch breakpoint, as contiguous inclusive ranges.

    Range i covers (b[i-1], b[i]] and carries K = γ*(b[i]), the budget at its largest batch (the
    cheaper end: γ* falls with the batch), capped at `cap` (the cluster decision, which also
    accounts for neighbours) and made non-increasing in batch. Equal neighbours merge."""
    roof = roofline_for(gpu, model)
    ks: list[int] = []
    for b in BATCH_BREAKPOINTS:
        req = SpecRequest(
            alpha, float(b), context, drafter.cost_for(model.name), drafter.spec_overhead, gamma_max, margin
        )
        k = int(choose(gamma_table(roof, req, np.zeros(1), np.full(1, np.inf))).gamma[0])
        if cap is not None:
            k = min(k, cap)
        if ks:
            k = min(k, ks[-1])
        ks.append(k)
    out: Table = []
    start = 1
    for b, k in zip(BATCH_BREAKPOINTS, ks, strict=True):
        if out and out[-1][2] == k:
            out[-1][1] = b
        else:
            out.append([start, b, k])
        start = b + 1
    return out


def engine_config(drafter: DrafterSpec, model: str, gamma: int, table: Table | None = None) -> EngineConfig:
    """vLLM and SGLang configuration for a decision of `gamma` draft tokens.

    `table` is the per-batch budget (budget_by_batch with cap=gamma); without one the engines run a
    fixed γ. γ = 0 is plain decode: nothing at all."""
    if gamma <= 0:
        return EngineConfig()
    names = drafter.engines
    draft = names.draft_models.get(model, "")
    top = max((k for _, _, k in table), default=gamma) if table else gamma
    vllm: dict[str, object] = {"method": names.vllm_method, "num_speculative_tokens": top}
    if draft:
        vllm["model"] = draft
    if names.vllm_method == "ngram":
        vllm.update({"prompt_lookup_min": 2, "prompt_lookup_max": 5})
    if table and len(table) > 1:
        vllm["num_speculative_tokens_per_batch_size"] = table

    algorithm = names.sglang_algorithm
    sglang = [f"--speculative-algorithm {algorithm}"]
    if draft:
        sglang.append(f"--speculative-draft-model-path {draft}")
    if algorithm == "NGRAM":
        # A chain, not a tree: breadth 1 drafts γ tokens in a row.
        sglang += ["--speculative-ngram-min-bfs-breadth 1", "--speculative-ngram-max-bfs-breadth 1"]
    else:
        sglang += [f"--speculative-num-steps {gamma}", "--speculative-eagle-topk 1"]
    sglang.append(f"--speculative-num-draft-tokens {gamma + 1}")
    adaptive = ""
    if table and algorithm in SGLANG_ADAPTIVE:
        adaptive = _json({str(lo): {"candidate_steps": _candidates(k)} for lo, _, k in table})
    return EngineConfig(_json(vllm), " ".join(sglang), adaptive)


def _candidates(k: int) -> list[int]:
    """SGLang's steps to choose from at one batch range: up to K, a few (each one is a CUDA graph)."""
    return sorted({1, (k + 1) // 2, k}) if k > 0 else [0]


def _json(doc: object) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)
