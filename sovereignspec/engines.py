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
import math
from dataclasses import dataclass, replace

import numpy as np

from sovereignspec.core.optimiser import GammaTable, SpecRequest, choose, gamma_table
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
    background: float = 0.0,
    step_limit: float = math.inf,
    decided: tuple[float, int] | None = None,
    measured_background: float | None = None,
    caution: float = 0.0,
) -> Table:
    """γ* at each batch breakpoint, as contiguous inclusive ranges.

    γ* is the optimiser's at each batch beside `background` sequences of other work, keeping the
    shared step within `step_limit` seconds (the neighbours' TPOT SLOs as a bound on the step: inf
    without any). Range i covers (b[i-1], b[i]] and carries K = γ*(b[i]), the budget at its
    largest batch (the cheaper end: γ* falls with the batch), capped at `cap` if given and made
    non-increasing in batch. With `decided` ((batch, γ) of the placement), the γ decided there
    bounds the declared batch and those above it, and every lighter batch runs at least that.

    `measured_background` (with `decided`; the part of `background` that telemetry measured, the
    rest being what placements declare): below the declared batch, whether a γ pays is judged beside
    the measured part and the declared part at the same fraction as the batch is of the declared
    one; the neighbours' bound, beside all of it. `caution` > 0: the shortest γ whose objective is within that
    fraction of the best, not the best itself. Equal neighbours merge."""
    roof = roofline_for(gpu, model)
    # The GPU's judged load beside every batch: a light engine beside a busy GPU may not pay for
    # its drafting passes (they hold up everyone's step), and must keep the shared step within the
    # neighbours' bound when they are busy.
    bg = np.full(1, float(background))
    q = np.full(1, float(step_limit) / float(roof.step_time(bg, bg, context)[0]))  # against the step before
    stars = []
    for b in BATCH_BREAKPOINTS:
        req = SpecRequest(
            alpha, float(b), context, drafter.cost_for(model.name), drafter.spec_overhead, gamma_max, margin
        )
        table = gamma_table(roof, req, bg, q)
        if measured_background is not None and decided is not None and b < decided[0]:
            # Whether speculation pays is judged beside the others' declared peaks at the same
            # fraction as this engine is of its own (co-located replicas see the same daily
            # traffic), and beside what is measured running now in full; whether it keeps the
            # neighbours within their SLOs, beside all of it.
            floor = min(float(measured_background), float(background))
            light = np.full(1, floor + (float(background) - floor) * b / decided[0])
            judged = gamma_table(roof, req, light, np.full(1, np.inf))
            table = replace(judged, externality_ok=table.externality_ok)
        k = _cautious(table, caution) if caution else int(choose(table).gamma[0])
        stars.append(min(k, cap) if cap is not None else k)
    ks: list[int] = []
    if decided is None:
        for k in stars:  # non-increasing: the running minimum
            ks.append(min(k, ks[-1]) if ks else k)
    else:
        # From the declared batch up: never above the decision there, non-increasing. Below it:
        # at least what the next larger batch runs (fewer sequences verify fewer tokens, so what
        # held for the neighbours at a larger batch holds here), more where that batch's own γ*
        # says so (beside other load, a light batch may not pay for its drafting passes alone).
        first = next((i for i, b in enumerate(BATCH_BREAKPOINTS) if b >= decided[0]), len(stars))
        above: list[int] = []
        for star in stars[first:]:
            k = min(star, decided[1])
            above.append(min(k, above[-1]) if above else k)
        below: list[int] = []
        carry = above[0] if above else 0
        for k in reversed(stars[:first]):
            carry = max(k, carry)
            below.append(carry)
        ks = below[::-1] + above
    out: Table = []
    start = 1
    for b, k in zip(BATCH_BREAKPOINTS, ks, strict=True):
        if out and out[-1][2] == k:
            out[-1][1] = b
        else:
            out.append([start, b, k])
        start = b + 1
    return out


def handoff(
    gpu: GpuSpec,
    model: ModelSpec,
    drafter: DrafterSpec | None,
    alpha: float,
    context: float,
    gamma_max: int,
    margin: float,
    headroom: float,
    step_limit: float,
    decided: tuple[float, int],
    measured: float | None = None,
) -> Table | None:
    """The per-batch budget a placed workload's engine is handed, or None for plain decode.

    A workload whose declared batch would saturate its GPU (γ* = 0 there) still speculates when its
    batch is light: the table says γ = 0 at the batches that do not pay and γ* below them, each
    judged beside the load the GPU's `headroom` reading shows (as read: the judgement one
    uncertainty worse is for the declared batch, and would invent load at every smaller one) and
    with no step longer than the neighbours' SLOs allow (`step_limit`: q × the step before the
    workload, at the decision); from the declared batch up it is never above the γ* `decided` there
    ((batch, γ)). None when no batch pays, or the drafter does not draft for the model.

    Two judgements differ from the placement's, because the table runs for the engine's whole life
    without being looked at again. Below the declared batch the load the GPU's other placements
    declare (`headroom` less the `measured` reading; their engines do not run yet, or run below
    their peak) is taken at the same fraction as this batch is of its declared one: replicas that
    share a GPU mostly share the day's traffic, and judging a light batch beside everyone's declared
    peak would never let it speculate. What telemetry measures counts in full, and the neighbours'
    SLO bound is held beside all of it, so the guess can cost throughput but never a neighbour's
    SLO. And a longer draft must beat a shorter one by the self-benefit margin,
    as speculating at all must beat plain decode (`caution`): the margin covers the model's error,
    which is largest where verification bends towards the compute roof."""
    if drafter is None or not drafter.supports(model.name) or gamma_max <= 0:
        return None
    roof = roofline_for(gpu, model)
    background = float(roof.seqs_for_headroom(headroom, context))
    running = float(roof.seqs_for_headroom(headroom if measured is None else measured, context))
    table = budget_by_batch(
        gpu,
        model,
        drafter,
        alpha,
        context,
        gamma_max,
        margin,
        background=background,
        step_limit=step_limit,
        decided=decided,
        measured_background=running,
        caution=margin,
    )
    return table if any(k > 0 for _, _, k in table) else None


def _cautious(table: GammaTable, caution: float) -> int:
    """The shortest feasible γ whose objective is within `caution` (relative) of the best one."""
    objective = np.where(table.feasible[:, 0], table.aggregate[:, 0], -np.inf)
    return int(np.flatnonzero(objective * (1.0 + caution) >= objective.max())[0])


def engine_config(drafter: DrafterSpec, model: str, gamma: int, table: Table | None = None) -> EngineConfig:
    """vLLM and SGLang configuration for a decision of `gamma` draft tokens at the declared batch.

    `table` is the per-batch budget (`handoff`); its largest K may exceed `gamma` when light
    batches pay and the declared one does not (γ = 0 there). Engines that read a table get it;
    the fixed-γ forms (SGLang's NGRAM and STANDALONE; vLLM before 0.24, see `launch`) run `gamma`.
    No γ > 0 anywhere is plain decode: nothing at all."""
    top = max((k for _, _, k in table), default=gamma) if table else gamma
    if top <= 0:
        return EngineConfig()
    names = drafter.engines
    draft = names.draft_models.get(model, "")
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
