"""What the engines are handed: every drafter × mode, held to the engines' own fields and flags.

The pinned lists below were read from the engines' source (the search tool's stored snapshots):

- vLLM `SpeculativeConfig` fields: vllm/config/speculative.py at 002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443
  (`num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None`, "inclusive batch-size
  range"); the table's rules: vllm/v1/spec_decode/dynamic/utils.py at 14b450ca590cbff96e7004bdb147a5d3acf5a4f6
  (ranges positive, sorted, non-overlapping, first at 1, K >= 0; K clamped to num_speculative_tokens).
  The field arrived with vLLM PR #32374 ("Add Dynamic SD", merged May 2026), first released in v0.24.
  Read again for the newest release (0.33; the CPU build tested stays at 0.32): the same snapshot is
  the newest the index holds and the table is still batch-only 3-tuples. Its context-length forms
  are proposals, not merged: RFC #48627 and PR #48944 (optional 5-tuple rows [b_lo, b_hi, ctx_lo,
  ctx_hi, K], 3-tuples still meaning every context) and PR #54801 (a separate
  `num_speculative_tokens_per_seq_len`). Nothing here writes either; should one land, the 3-tuple
  table stays valid under it, and a context axis is where `core.handoff` would grow next.
- SGLang server arguments: python/sglang/srt/server_args.py (speculative_* fields: algorithm,
  draft_model_path, num_steps, eagle_topk, num_draft_tokens, ngram_min/max_bfs_breadth, adaptive,
  adaptive_config); adaptive rules: python/sglang/srt/speculative/adaptive_spec_params.py at
  015c872628e328b530880bcf95ae91222604b225 (EAGLE/EAGLE3 with top-k 1 only; JSON object keyed by
  batch-size strings, each with a non-empty `candidate_steps` list of ints >= 0; PRs #21599, #24055).
"""

from __future__ import annotations

import json
import math
import shlex
from itertools import pairwise

import numpy as np
import pytest

from sovereignspec.core.handoff import BATCH_BREAKPOINTS, _budget, _ranges
from sovereignspec.core.optimiser import SpecRequest, choose, gamma_table
from sovereignspec.core.roofline import roofline_for
from sovereignspec.engines import engine_config
from sovereignspec.engines import sglang as sglang_engine
from sovereignspec.engines import vllm as vllm_engine
from sovereignspec.profiles import load_profiles

VLLM_FIELDS = {
    "method", "model", "num_speculative_tokens", "num_speculative_tokens_per_batch_size",
    "prompt_lookup_min", "prompt_lookup_max",
}  # fmt: skip
VLLM_METHODS = {"ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "eagle", "eagle3", "mtp"}
SGLANG_FLAGS = {
    "--speculative-algorithm", "--speculative-draft-model-path", "--speculative-num-steps",
    "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--speculative-ngram-min-bfs-breadth",
    "--speculative-ngram-max-bfs-breadth", "--speculative-adaptive", "--speculative-adaptive-config",
}  # fmt: skip
SGLANG_ALGORITHMS = {"EAGLE", "EAGLE3", "NGRAM", "STANDALONE"}

PROFILES = load_profiles()
# Each engine's annotations (keys after the prefix), from its module.
VLLM, SGLANG, ADAPTIVE = vllm_engine.CONFIG, sglang_engine.ARGS, sglang_engine.ADAPTIVE


def budget_by_batch(gpu, model, drafter, alpha, context, gamma_max, margin, cap=None, caution=0.0):
    """γ* at each batch breakpoint on an idle GPU, as the table's inclusive ranges: the budget
    `core.handoff.handoff` builds its table from, without its placement-time bounds."""
    ks, _ = _budget(
        gpu, model, drafter, alpha, context, gamma_max, margin, cap, 0.0, math.inf, None, None, caution
    )
    return _ranges(ks)


def _model(drafter: str) -> str:
    """The first model (by name) the drafter drafts for."""
    return next(m for m in sorted(PROFILES.models) if PROFILES.drafters[drafter].supports(m))


def vllm_table_is_valid(table: list[list[int]]) -> None:
    """vLLM's own checks (dynamic/utils.py) of a 3-item schedule."""
    assert table and table[0][0] == 1
    previous_end = 0
    for lo, hi, k in table:
        assert 0 < lo <= hi and lo > previous_end and k >= 0
        previous_end = hi


@pytest.mark.parametrize("drafter", sorted(PROFILES.drafters))
@pytest.mark.parametrize("gamma", [0, 1, 4, 8])
def test_every_drafter_and_mode_hands_each_engine_only_fields_and_flags_it_has(
    drafter: str, gamma: int
) -> None:
    d = PROFILES.drafters[drafter]
    model = _model(drafter)
    gpu, models = PROFILES.gpus["H100-SXM"], PROFILES.models
    table = budget_by_batch(gpu, models[model], d, 0.8, 1024, 8, 0.02, cap=gamma)
    cfg = engine_config(d, model, gamma, table)
    if gamma == 0:
        assert (
            cfg.get(VLLM),
            cfg.get(SGLANG),
            cfg.get(ADAPTIVE),
        ) == ("", "", "")  # plain: nothing at all
        return
    vllm = json.loads(cfg.get(VLLM))
    assert set(vllm) <= VLLM_FIELDS and vllm["method"] in VLLM_METHODS
    per_batch = vllm.get("num_speculative_tokens_per_batch_size", [[1, 1, vllm["num_speculative_tokens"]]])
    vllm_table_is_valid(per_batch)
    # The table is capped at γ; the engine's ceiling is the decision (vLLM clamps every K to it).
    assert max(k for _, _, k in per_batch) <= gamma == vllm["num_speculative_tokens"]
    if vllm["method"] == "ngram":
        assert vllm["prompt_lookup_min"] <= vllm["prompt_lookup_max"]
    words = shlex.split(cfg.get(SGLANG))
    flags = [w for w in words if w.startswith("--")]
    assert set(flags) <= SGLANG_FLAGS and len(flags) == len(set(flags))
    value = dict(zip(words[::2], words[1::2], strict=True))
    assert value["--speculative-algorithm"] in SGLANG_ALGORITHMS
    # SGLang's adaptive mode (EAGLE/EAGLE3) reads the table: its steps are the table's largest K;
    # the other algorithms run the fixed γ decided at the declared batch.
    adaptive = value["--speculative-algorithm"] in {"EAGLE", "EAGLE3"}
    steps = max(gamma, *(k for _, _, k in table)) if adaptive else gamma
    assert int(value["--speculative-num-draft-tokens"]) == steps + 1
    if value["--speculative-algorithm"] == "NGRAM":  # a chain of γ tokens, as priced
        assert (
            value["--speculative-ngram-max-bfs-breadth"]
            == value["--speculative-ngram-min-bfs-breadth"]
            == "1"
        )
    else:
        assert value["--speculative-num-steps"] == str(steps) and value["--speculative-eagle-topk"] == "1"
    if value["--speculative-algorithm"] in {"EAGLE", "EAGLE3"}:
        adaptive = json.loads(cfg.get(ADAPTIVE))
        keys = sorted(int(k) for k in adaptive)
        assert keys == [lo for lo, _, _ in table]
        for lo, _, k in table:
            steps = adaptive[str(lo)]["candidate_steps"]
            assert steps and all(isinstance(s, int) and 0 <= s <= k for s in steps) and max(steps) == k
    else:
        assert cfg.get(ADAPTIVE) == ""  # SGLang's adaptive mode refuses other algorithms


def gamma_star(
    gpu: str, drafter: str, alpha: float, batch: int, gamma_max: int = 8, armed: bool = True
) -> int:
    """γ* on an idle GPU; `armed`: as a row of a table (K = 0 pays a draft pass and the machinery)."""
    d = PROFILES.drafters[drafter]
    m = PROFILES.models[_model(drafter)]
    req = SpecRequest(
        alpha, float(batch), 1024.0, d.cost_for(m.name), d.spec_overhead, gamma_max, 0.02, armed=armed
    )
    return int(
        choose(gamma_table(roofline_for(PROFILES.gpus[gpu], m), req, np.zeros(1), np.full(1, np.inf))).gamma[
            0
        ]
    )


@pytest.mark.parametrize("gpu", ["H100-SXM", "A100-80G-SXM", "RTX-4090"])
@pytest.mark.parametrize("drafter", ["eagle3", "ngram", "llama-3.2-1b-draft"])
@pytest.mark.parametrize("alpha", [0.4, 0.6, 0.8, 0.9])
@pytest.mark.parametrize("cap", [None, 2, 5])
def test_the_vllm_table_is_monotone_capped_and_the_optimisers_gamma_at_each_breakpoint(
    gpu: str, drafter: str, alpha: float, cap: int | None
) -> None:
    d = PROFILES.drafters[drafter]
    model = PROFILES.models[_model(drafter)]
    table = budget_by_batch(PROFILES.gpus[gpu], model, d, alpha, 1024, 8, 0.02, cap=cap)
    vllm_table_is_valid(table)
    assert [hi for _, hi, _ in table][-1] == BATCH_BREAKPOINTS[-1]
    assert all(b[0] == a[1] + 1 for a, b in pairwise(table))  # contiguous
    ks = [k for _, _, k in table]
    assert ks == sorted(ks, reverse=True)
    expected, running = {}, 10**9
    for b in BATCH_BREAKPOINTS:
        running = min(running, gamma_star(gpu, drafter, alpha, b), cap if cap is not None else 10**9)
        expected[b] = running
    for b in BATCH_BREAKPOINTS:
        k = next(k for lo, hi, k in table if lo <= b <= hi)
        assert k == expected[b], (b, table)
    if cap is None:  # the running minimum never bites: γ* itself already falls with the batch
        assert all(expected[b] == gamma_star(gpu, drafter, alpha, b) for b in BATCH_BREAKPOINTS)
    config = json.loads(engine_config(d, model.name, cap or 8, table).get(VLLM) or "{}")
    if config:
        assert all(k <= config["num_speculative_tokens"] for _, _, k in table)


def test_a_declared_batch_that_saturates_hands_a_table_that_speculates_only_at_light_batches() -> None:
    from sovereignspec.core.handoff import handoff

    gpu, model, d = PROFILES.gpus["H100-SXM"], PROFILES.models["llama-3.1-8b"], PROFILES.drafters["eagle3"]
    table = handoff(gpu, model, d, 0.7, 144.0, 8, 0.02, 1.0, math.inf, (256.0, 0))
    assert table is not None
    vllm_table_is_valid(table)
    ks = [k for _, _, k in table]
    assert ks[0] > 0 and ks == sorted(ks, reverse=True)
    assert all(k == 0 for lo, hi, k in table if hi >= 256)  # plain at the declared batch and above
    cfg = engine_config(d, model.name, 0, table)
    assert json.loads(cfg.get(VLLM))["num_speculative_tokens"] == ks[0]
    assert "--speculative-num-steps" in cfg.get(SGLANG) and cfg.get(
        sglang_engine.ADAPTIVE
    )  # EAGLE3 reads it adaptively
    ngram = engine_config(PROFILES.drafters["ngram"], model.name, 0, table)
    assert (
        ngram.get(VLLM) and ngram.get(SGLANG) == ""
    )  # SGLang's NGRAM runs a fixed γ: 0 at the declared batch


def test_a_declared_batch_past_the_last_breakpoint_finds_the_decision_there_not_the_last_ranges_k() -> None:
    """vLLM carries the last range's K to every larger batch (real-engine.md): a server declared at
    1024 sequences whose decision there is γ 0 must not run K = 1 from the 512 row."""
    from sovereignspec.core.handoff import handoff

    gpu, model, d = PROFILES.gpus["H100-SXM"], PROFILES.models["llama-3.1-8b"], PROFILES.drafters["ngram"]
    for declared, gamma in ((1024.0, 0), (600.5, 1), (700.0, 0)):
        table = handoff(gpu, model, d, 0.7, 144.0, 8, 0.02, 1.0, math.inf, (declared, gamma))
        assert table is not None
        vllm_table_is_valid(table)
        assert table[-1][1] == math.ceil(declared) and table[-1][2] == gamma, (declared, table)
        assert next(k for lo, hi, k in table if lo <= 512 <= hi) >= gamma  # lighter batches keep theirs


def test_the_hand_off_keeps_lighter_batches_at_or_above_the_decision_and_heavier_ones_at_or_below() -> None:
    from sovereignspec.core.handoff import handoff

    gpu, model, d = PROFILES.gpus["H100-SXM"], PROFILES.models["llama-3.1-8b"], PROFILES.drafters["eagle3"]
    for declared, gamma in ((16.0, 3), (48.0, 2), (96.0, 1)):
        table = handoff(gpu, model, d, 0.8, 1024.0, 8, 0.02, 0.9, math.inf, (declared, gamma))
        assert table is not None
        for _, hi, k in table:
            if hi >= declared:
                assert k <= gamma, (declared, table)
            else:
                assert k >= gamma, (declared, table)


def test_no_batch_that_pays_is_plain_decode() -> None:
    from sovereignspec.core.handoff import handoff

    gpu, model = PROFILES.gpus["H100-SXM"], PROFILES.models["llama-3.1-8b"]
    assert (
        handoff(gpu, model, PROFILES.drafters["eagle3"], 0.05, 1024.0, 8, 0.02, 1.0, math.inf, (8.0, 0))
        is None
    )
    assert handoff(gpu, model, None, 0.9, 1024.0, 8, 0.02, 1.0, math.inf, (8.0, 0)) is None
    assert (
        handoff(gpu, model, PROFILES.drafters["eagle3"], 0.9, 1024.0, 0, 0.02, 1.0, math.inf, (8.0, 0))
        is None
    )


def test_a_table_whose_k0_rows_cost_more_than_its_light_rows_gain_is_not_handed() -> None:
    from sovereignspec.core.handoff import handoff

    gpu, model, d = PROFILES.gpus["H100-SXM"], PROFILES.models["llama-3.1-8b"], PROFILES.drafters["eagle3"]
    # Telemetry reads the GPU idle (1.0: the neighbour's engine is not running yet); the ledger reads
    # it full (0.0: the neighbour's declared 256 sequences). The light batches would pay (1.03-1.29
    # beside the same fraction of the neighbour's load), but from 129 to 256 sequences, half of the
    # batches up to the declared one, the armed engine pays a draft pass and the machinery for
    # nothing (0.90): over a day that swings evenly from idle to the peak it is slower than plain.
    assert handoff(gpu, model, d, 0.7, 144.0, 8, 0.02, 0.0, math.inf, (256.0, 0), measured=1.0) is None
    # Alone on an idle GPU the light rows gain far more (up to 1.8x) and the table is handed.
    table = handoff(gpu, model, d, 0.7, 144.0, 8, 0.02, 1.0, math.inf, (256.0, 0))
    assert table is not None and table[0][2] > 0


def test_load_that_telemetry_measures_counts_in_full_at_every_batch() -> None:
    from sovereignspec.core.handoff import handoff

    gpu, model, d = PROFILES.gpus["H100-SXM"], PROFILES.models["llama-3.1-8b"], PROFILES.drafters["eagle3"]
    # A GPU measured saturated is saturated whatever this engine's batch: no light-batch guess.
    assert handoff(gpu, model, d, 0.7, 144.0, 8, 0.02, 0.0, math.inf, (256.0, 0), measured=0.0) is None
    assert handoff(gpu, model, d, 0.7, 144.0, 8, 0.02, 0.0, math.inf, (8.0, 0)) is None


def test_the_neighbours_bound_counts_the_draft_pass_and_machinery_of_the_k0_rows() -> None:
    from sovereignspec.core.handoff import handoff
    from sovereignspec.core.roofline import roofline_for

    gpu, model, d = PROFILES.gpus["H100-SXM"], PROFILES.models["llama-3.1-8b"], PROFILES.drafters["eagle3"]
    roof = roofline_for(gpu, model)
    ctx, declared = 144.0, 64.0
    background = float(roof.seqs_for_headroom(0.9, ctx))
    n = background + declared
    plain = float(roof.step_time(n, n, ctx))
    # The armed engine at its declared batch, where the table says K = 0: one draft pass (c of the
    # batch-1 step) and the machinery (o of the plain step) on top of the plain step.
    armed = plain + d.cost_for(model.name) * float(roof.step_time(1.0, 1.0, ctx)) + d.spec_overhead * plain

    def table(limit: float) -> list[list[int]] | None:
        return handoff(gpu, model, d, 0.7, ctx, 8, 0.02, 0.9, limit, (declared, 0), measured=1.0)

    # A bound plain decode keeps but the armed K = 0 row does not: no table, a truly plain engine
    # (here the K = 0 row at the declared batch is the longest step the table can run).
    assert table(plain * 1.01) is None
    assert table(armed * 0.999) is None
    some = table(armed * 1.001)
    assert some is not None and some[0][2] > 0
    assert all(k == 0 for _, hi, k in some if hi >= declared)
    # A neighbour already at its SLO (no step may grow at all): nothing.
    before = float(roof.step_time(background, background, ctx))
    assert table(before) is None


def test_a_row_of_a_table_at_k0_pays_a_draft_pass_and_the_machinery() -> None:
    gpu, model, d = PROFILES.gpus["H100-SXM"], PROFILES.models["llama-3.1-8b"], PROFILES.drafters["eagle3"]
    roof = roofline_for(gpu, model)
    c, o = d.cost_for(model.name), d.spec_overhead
    b, ctx = 256.0, 1024.0
    plain = float(roof.step_time(b, b, ctx))
    single = float(roof.step_time(1.0, 1.0, ctx))
    rows = {}
    for armed in (False, True):
        req = SpecRequest(0.7, b, ctx, c, o, 8, 0.02, armed=armed)
        rows[armed] = gamma_table(roof, req, np.zeros(1), np.full(1, np.inf))
    assert rows[False].step[0, 0] == pytest.approx(plain, rel=1e-12)  # plain decode: no draft at all
    assert rows[True].step[0, 0] == pytest.approx(plain + c * single + o * plain, rel=1e-12)
    assert rows[True].speedup[0, 0] == pytest.approx(plain / (plain + c * single + o * plain), rel=1e-12)
    # γ > 0 costs the same armed or not: γ passes and the machinery either way.
    assert np.allclose(rows[True].step[1:], rows[False].step[1:], rtol=1e-12)


@pytest.mark.parametrize(
    ("gpu", "alpha", "batch"), [("H100-SXM", 0.3, 256), ("H100-SXM", 0.4, 512), ("A100-80G-SXM", 0.5, 64)]
)
def test_an_armed_row_weighs_a_draft_against_the_armed_k0_not_against_plain_decode(
    gpu: str, alpha: float, batch: int
) -> None:
    # Here one draft token does not beat plain decode by the margin, but it beats the armed K = 0
    # (which pays the pass and machinery anyway): in a table the row runs K = 1.
    assert gamma_star(gpu, "eagle3", alpha, batch, armed=False) == 0
    assert gamma_star(gpu, "eagle3", alpha, batch, armed=True) == 1


@pytest.mark.parametrize(("alpha", "batch"), [(0.22, 256.0), (0.28, 512.0)])
def test_an_armed_row_drafts_only_where_that_beats_the_armed_k0_by_the_margin(
    alpha: float, batch: float
) -> None:
    # One draft token is a little faster than the armed K = 0 here (0.5-0.6 %), short of the 5 %
    # margin that covers the model's error: the row stays at K = 0.
    gpu, model, d = PROFILES.gpus["H100-SXM"], PROFILES.models["llama-3.1-8b"], PROFILES.drafters["eagle3"]
    req = SpecRequest(alpha, batch, 1024.0, d.cost_for(model.name), d.spec_overhead, 8, 0.05, armed=True)
    table = gamma_table(roofline_for(gpu, model), req, np.zeros(1), np.full(1, np.inf))
    best = int(np.argmax(table.speedup[:, 0]))
    assert best > 0 and 1.0 < table.speedup[best, 0] / table.speedup[0, 0] < 1.05
    assert int(choose(table).gamma[0]) == 0
    assert not table.self_ok[1:, 0].any()


def test_in_the_hand_off_a_longer_draft_must_beat_a_shorter_one_by_the_margin() -> None:
    gpu, model, d = PROFILES.gpus["H100-SXM"], PROFILES.models["llama-3.1-8b"], PROFILES.drafters["eagle3"]
    best = budget_by_batch(gpu, model, d, 0.7, 144.0, 8, 0.02)
    cautious = budget_by_batch(gpu, model, d, 0.7, 144.0, 8, 0.02, caution=0.02)

    def at(table: list[list[int]], b: int) -> int:
        return next(k for lo, hi, k in table if lo <= b <= hi)

    assert all(at(cautious, b) <= at(best, b) for b in BATCH_BREAKPOINTS)
    assert any(at(cautious, b) < at(best, b) for b in BATCH_BREAKPOINTS)
    assert at(cautious, 1) > 0  # caution shortens drafts; it does not switch speculation off


@pytest.mark.parametrize("gpu", ["A100-80G-SXM", "H100-SXM"])
@pytest.mark.parametrize("declared", [8.0, 16.0, 48.0])
def test_below_the_declared_batch_the_table_never_drafts_less_than_the_decision(
    gpu: str, declared: float
) -> None:
    from sovereignspec.core.handoff import handoff

    model, d = PROFILES.models["llama-3.1-8b"], PROFILES.drafters["eagle3"]
    # A cautious row (the shortest γ within the margin of the best) can sit below a decision made at
    # the declared batch; the lighter batches still run at least the decision, and the engine's
    # num_speculative_tokens is never below it (A100, α 0.5, idle: rows of 2 and 1 under a γ = 3).
    for alpha in (0.5, 0.6, 0.7, 0.8):
        for headroom in (0.2, 0.5, 1.0):
            for gamma in range(1, 6):
                table = handoff(PROFILES.gpus[gpu], model, d, alpha, 1024.0, 8, 0.02, headroom, math.inf,
                                (declared, gamma))  # fmt: skip
                if table is None:
                    continue
                assert all(k >= gamma for _, hi, k in table if hi < declared), (alpha, headroom, gamma, table)
                top = json.loads(engine_config(d, model.name, gamma, table).get(VLLM))[
                    "num_speculative_tokens"
                ]
                assert top >= gamma
