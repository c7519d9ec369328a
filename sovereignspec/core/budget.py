"""The draft budget a workload is judged with: what the optimiser is asked for it (its drafter's cost,
γ_max, margin), and why speculation is off for it. One definition, for the placer, the running-work
view and the per-batch table the operator hands the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from sovereignspec.core.cluster import PlacerSettings, WorkloadRequest
from sovereignspec.core.decision import DecisionRecord
from sovereignspec.core.handoff import Table, armed_at_declared, handoff
from sovereignspec.core.optimiser import SpecRequest
from sovereignspec.core.specs import ProfileSet


def spec_request(
    profiles: ProfileSet, policy: PlacerSettings, w: WorkloadRequest
) -> tuple[SpecRequest, str | None]:
    """The optimiser's view of `w`, and why speculation is off for it (None if it isn't)."""
    gamma_max = policy.gamma_max if w.gamma_max is None else min(w.gamma_max, policy.gamma_max)
    cost, overhead, off = 0.0, 0.0, w.force_plain
    if w.drafter is None:
        off = off or "no drafter declared"
    elif w.drafter not in profiles.drafters:
        off = off or f"unknown drafter {w.drafter!r}"
    else:
        drafter = profiles.drafters[w.drafter]
        if not drafter.supports(w.model):
            off = off or f"drafter {w.drafter} does not draft for {w.model}"
        cost, overhead = drafter.cost_for(w.model), drafter.spec_overhead
    if gamma_max == 0:
        off = off or "speculation disabled (γ_max = 0)"
    req = SpecRequest(
        alpha=w.alpha,
        seqs=float(w.seqs),
        context=float(w.context),
        draft_cost=cost,
        spec_overhead=overhead,
        gamma_max=0 if off else gamma_max,
        # Per GPU type, an observed error widens it (`Placer.for_gpu_type`, core.learning).
        margin=policy.margin,
    )
    return req, off


@dataclass(frozen=True)
class EngineBudget:
    """What the engine of a placed workload is handed beyond γ: its per-batch table (None: none,
    γ alone), and where the table runs armed with K = 0 at the declared batch, the (speed-up,
    seconds per output token) it gets there (slower than plain by a draft pass and the machinery)."""

    table: Table | None
    armed: tuple[float, float] | None = None


def engine_budget(
    profiles: ProfileSet, policy: PlacerSettings, w: WorkloadRequest, record: DecisionRecord
) -> EngineBudget | None:
    """The per-batch budget for `w` placed as `record` says, judged at the chosen GPU's load and
    neighbours' bound with the same limits the placement used (`spec_request`: a bad annotation's
    plain, its γ_max; the margin widened where the engines observed the profile off). It may
    speculate at light batches even where γ* at the declared batch is 0. None without a drafter,
    a reading of the GPU's headroom, or any γ allowed."""
    wanted = spec_request(profiles, policy, w)[0]
    drafter = profiles.drafters.get(w.drafter) if w.drafter else None
    if drafter is None or record.headroom is None or record.gpu_type is None or wanted.gamma_max <= 0:
        return None
    gpu = profiles.gpu_for(record.gpu_type, w.model)
    model = w.stage_of(profiles.models[w.model])
    table = handoff(
        gpu,
        model,
        drafter,
        w.alpha,
        float(w.context),
        wanted.gamma_max,
        wanted.margin + profiles.margin_for(record.gpu_type, w.model),
        record.headroom,
        record.step_limit_s,
        (float(w.seqs), record.gamma),
        record.headroom_measured,
    )
    if table is None or record.gamma != 0:
        return EngineBudget(table)
    return EngineBudget(
        table, armed_at_declared(gpu, model, drafter, float(w.seqs), float(w.context), record.headroom)
    )
