"""The engine's per-batch draft budget: what a placed workload's engine is handed, in the core's
terms (`sovereignspec.engines` writes it as each engine's flags).

An engine reads γ from a table of its own batch size for its whole life; these functions judge that
table with the placement's optimiser, at the GPU's load and beside the neighbours' SLO bound."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from numpy.typing import NDArray

from sovereignspec.core.optimiser import GammaTable, SpecRequest, choose, gamma_table
from sovereignspec.core.roofline import roofline_for
from sovereignspec.core.specs import DrafterSpec, GpuSpec, ModelSpec

BATCH_BREAKPOINTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

Table = list[list[int]]  # inclusive [first batch, last batch, K] ranges from batch 1


def _ranges(ks: list[int]) -> Table:
    """Breakpoints' K as contiguous inclusive ranges; equal neighbours merge."""
    out: Table = []
    start = 1
    for b, k in zip(BATCH_BREAKPOINTS, ks, strict=True):
        if out and out[-1][2] == k:
            out[-1][1] = b
        else:
            out.append([start, b, k])
        start = b + 1
    return out


def _budget(
    gpu: GpuSpec,
    model: ModelSpec,
    drafter: DrafterSpec,
    alpha: float,
    context: float,
    gamma_max: int,
    margin: float,
    cap: int | None,
    background: float,
    step_limit: float,
    decided: tuple[float, int] | None,
    measured_background: float | None,
    caution: float,
) -> tuple[list[int], list[GammaTable]]:
    """(K at each batch breakpoint, the optimiser's table there that judged it).

    Every row is judged armed (`SpecRequest.armed`): an engine handed a table runs in speculative
    mode at every batch, so K = 0 on its row pays a draft pass and the machinery, and a K > 0 there
    is weighed against that, not against plain decode.

    γ* is the optimiser's at each batch beside `background` sequences of other work, keeping the
    shared step within `step_limit` seconds (the neighbours' TPOT SLOs as a bound on the step: inf
    without any). Range i covers (b[i-1], b[i]] and carries K = γ*(b[i]), the budget at its
    largest batch (the cheaper end: γ* falls with the batch), capped at `cap` if given and made
    non-increasing in batch. With `decided` ((batch, γ) of the placement), the γ decided there
    bounds the declared batch and those above it, and every lighter batch runs at least that.

    `measured_background` (with `decided`; the part of `background` that telemetry measured, the
    rest being what placements declare): below the declared batch, whether a γ pays is judged beside
    the measured part and the declared part at the same fraction as the batch is of the declared
    one; the neighbours' bound, beside all of it. `caution` > 0: the shortest γ whose objective is
    within that fraction of the best, not the best itself. Equal neighbours merge."""
    roof = roofline_for(gpu, model)
    # The GPU's judged load beside every batch: a light engine beside a busy GPU may not pay for
    # its drafting passes (they hold up everyone's step), and must keep the shared step within the
    # neighbours' bound when they are busy.
    bg = np.full(1, float(background))
    q = np.full(1, float(step_limit) / float(roof.step_time(bg, bg, context)[0]))  # against the step before
    stars = []
    tables: list[GammaTable] = []
    for b in BATCH_BREAKPOINTS:
        c, o = drafter.cost_for(model.name), drafter.spec_overhead
        req = SpecRequest(alpha, float(b), context, c, o, gamma_max, margin, armed=True)
        table = gamma_table(roof, req, bg, q)
        if measured_background is not None and decided is not None and b < decided[0]:
            light = _light_load(background, measured_background, b / decided[0])
            judged = gamma_table(roof, req, light, np.full(1, np.inf))
            table = replace(judged, externality_ok=table.externality_ok)
        k = _cautious(table, caution) if caution else int(choose(table).gamma[0])
        stars.append(min(k, cap) if cap is not None else k)
        tables.append(table)
    return _shaped(stars, decided), tables


def _light_load(background: float, measured: float, fraction: float) -> NDArray[np.float64]:
    """The load a batch below the declared one is judged beside when asking whether a γ pays: the
    others' declared peaks at the same fraction as this engine is of its own (co-located replicas
    see the same daily traffic), and what is measured running now in full. Whether it keeps the
    neighbours within their SLOs stays judged beside all of it."""
    floor = min(float(measured), float(background))
    return np.full(1, floor + (float(background) - floor) * fraction)


def _shaped(stars: list[int], decided: tuple[float, int] | None) -> list[int]:
    """Each breakpoint's γ* made a table the engine can run: non-increasing in batch; with a
    decision, never above it from the declared batch up, and at least it below."""
    ks: list[int] = []
    if decided is None:
        for k in stars:  # non-increasing: the running minimum
            ks.append(min(k, ks[-1]) if ks else k)
        return ks
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
    carry = decided[1]  # every lighter batch runs at least the decision
    for k in reversed(stars[:first]):
        carry = max(k, carry)
        below.append(carry)
    return below[::-1] + above


def _pays(ks: list[int], tables: list[GammaTable], declared: float, margin: float) -> bool:
    """Whether arming the engine with the table beats plain decode for its whole life.

    Plain decode is the alternative at every batch, and the table's K = 0 rows are not it (they pay
    a draft pass and the machinery). With no distribution of the engine's batch to go on, every
    batch from 1 to the declared one is taken as equally likely (traffic that swings between idle
    and the declared peak); the GPU's mean aggregate speed-up over them must beat plain by the
    self-benefit margin, as a single γ must. And no row the engine can run (up to the declared
    batch) may push a neighbour past its SLO bound, K = 0 rows included."""
    total = weight = 0.0
    last = max(1, math.ceil(declared))
    lo = 1
    for i, (b, k, table) in enumerate(zip(BATCH_BREAKPOINTS, ks, tables, strict=True)):
        hi = last if i == len(BATCH_BREAKPOINTS) - 1 else min(b, last)
        if hi < lo:
            break
        if not table.externality_ok[k, 0]:
            return False
        count = hi - lo + 1
        total += count * float(table.aggregate[k, 0])
        weight += count
        lo = hi + 1
    return total >= (1.0 + margin) * weight


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
    SLO. And a longer draft must beat a shorter one by the self-benefit margin, as speculating at
    all must beat plain decode (`caution`): the margin covers the model's error, which is largest
    where verification bends towards the compute roof."""
    if drafter is None or not drafter.supports(model.name) or gamma_max <= 0:
        return None
    roof = roofline_for(gpu, model)
    background = float(roof.seqs_for_headroom(headroom, context))
    running = float(roof.seqs_for_headroom(headroom if measured is None else measured, context))
    ks, tables = _budget(
        gpu,
        model,
        drafter,
        alpha,
        context,
        gamma_max,
        margin,
        None,
        background,
        step_limit,
        decided,
        running,
        margin,
    )
    if not any(k > 0 for k in ks) or not _pays(ks, tables, decided[0], margin):
        return None
    return _reaching(_ranges(ks), decided)


def _reaching(table: Table, decided: tuple[float, int]) -> Table:
    """The engine carries the last range's K to every larger batch: a declared batch past the
    last breakpoint must find the decision made there, not the lighter batches' budget."""
    top = BATCH_BREAKPOINTS[-1]
    if decided[0] > top:
        end = math.ceil(decided[0])
        if table[-1][2] == decided[1]:
            table[-1][1] = end
        else:
            table.append([top + 1, end, decided[1]])
    return table


def _cautious(table: GammaTable, caution: float) -> int:
    """The shortest feasible γ whose objective is within `caution` (relative) of the best one."""
    objective = np.where(table.feasible[:, 0], table.aggregate[:, 0], -np.inf)
    return int(np.flatnonzero(objective * (1.0 + caution) >= objective.max())[0])


def armed_at_declared(
    gpu: GpuSpec, model: ModelSpec, drafter: DrafterSpec, seqs: float, context: float, headroom: float
) -> tuple[float, float]:
    """(speed-up, seconds per output token) of an engine armed with a table whose K is 0 at its
    declared batch `seqs`, beside the load the GPU's `headroom` reading shows: plain decode's work
    plus a draft pass and the machinery, so below 1. What the decision reports for such an engine."""
    roof = roofline_for(gpu, model)
    background = np.full(1, float(roof.seqs_for_headroom(headroom, context)))
    req = SpecRequest(
        1.0, float(seqs), context, drafter.cost_for(model.name), drafter.spec_overhead, 0, 0.0, armed=True
    )
    table = gamma_table(roof, req, background, np.full(1, np.inf))
    return float(table.speedup[0, 0]), float(table.step[0, 0])
