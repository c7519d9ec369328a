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

from sovereignspec.core.handoff import Table
from sovereignspec.core.specs import DrafterSpec

# SGLang's adaptive mode runs only these algorithms, and only with top-k 1
# (python/sglang/srt/speculative/adaptive_spec_params.py: adaptive_unsupported_reason).
SGLANG_ADAPTIVE = frozenset({"EAGLE", "EAGLE3"})


@dataclass(frozen=True)
class EngineConfig:
    """What a speculative decision hands each engine ("" everywhere for plain decode)."""

    vllm: str = ""  # JSON for vLLM's --speculative-config
    sglang: str = ""  # SGLang flags
    sglang_adaptive: str = ""  # JSON for SGLang's --speculative-adaptive-config ("" if unsupported)


def engine_config(
    drafter: DrafterSpec, model: str, gamma: int, table: Table | None = None, checkpoint: str | None = None
) -> EngineConfig:
    """vLLM and SGLang configuration for a decision of `gamma` draft tokens at the declared batch.

    `table` is the per-batch budget (`core.handoff.handoff`); its largest K may exceed `gamma` when light
    batches pay and the declared one does not (γ = 0 there). Engines that read a table get it;
    the fixed-γ forms (SGLang's NGRAM and STANDALONE; vLLM before 0.24, see `launch`) run `gamma`.
    `checkpoint`, where given, is the draft checkpoint instead of the profile's for `model`.
    No γ > 0 anywhere is plain decode: nothing at all."""
    # Never below the decision at the declared batch, whatever a cautious table says there.
    top = max(max((k for _, _, k in table), default=gamma), gamma) if table else gamma
    if top <= 0:
        return EngineConfig()
    names = drafter.engines
    # `checkpoint` (the policy's, or the workload's within the policy's allowlist) replaces the
    # profile's; an ngram drafter has none to replace.
    draft = (checkpoint if drafter.kind != "ngram" else None) or names.draft_models.get(model, "")
    vllm: dict[str, object] = {"method": names.vllm_method, "num_speculative_tokens": top}
    if draft:
        vllm["model"] = draft
    if names.vllm_method == "ngram":
        vllm.update({"prompt_lookup_min": 2, "prompt_lookup_max": 5})
    if table and len(table) > 1:
        vllm["num_speculative_tokens_per_batch_size"] = table

    algorithm = names.sglang_algorithm
    adaptive = ""
    steps = gamma  # a fixed γ unless the adaptive mode reads the table
    if table and algorithm in SGLANG_ADAPTIVE:
        adaptive = _json({str(lo): {"candidate_steps": _candidates(k)} for lo, _, k in table})
        steps = top
    sglang = ""
    if steps > 0:
        flags = [f"--speculative-algorithm {algorithm}"]
        if draft:
            flags.append(f"--speculative-draft-model-path {draft}")
        if algorithm == "NGRAM":
            # A chain, not a tree: breadth 1 drafts γ tokens in a row.
            flags += ["--speculative-ngram-min-bfs-breadth 1", "--speculative-ngram-max-bfs-breadth 1"]
        else:
            flags += [f"--speculative-num-steps {steps}", "--speculative-eagle-topk 1"]
        flags.append(f"--speculative-num-draft-tokens {steps + 1}")
        sglang = " ".join(flags)
    return EngineConfig(_json(vllm), sglang, adaptive)


def _candidates(k: int) -> list[int]:
    """SGLang's steps to choose from at one batch range: up to K, a few (each one is a CUDA graph)."""
    return sorted({1, (k + 1) // 2, k}) if k > 0 else [0]


def _json(doc: object) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)
