"""What a placement says: the decision record (every term of the chosen GPU, and with `explain`
every node excluded and why, every GPU where a neighbour's SLO held speculation back), an
unplaced workload's reason, and why a workload never fits. Functions of the `Placer` whose state
they read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

from sovereignspec.core.cluster import Placement, WorkloadRequest
from sovereignspec.core.decision import DecisionRecord
from sovereignspec.core.optimiser import Blocker, SpecRequest, blocker, quantize
from sovereignspec.core.roofline import roofline_for
from sovereignspec.core.sovereignty import check_node
from sovereignspec.core.specs import GpuSpec

if TYPE_CHECKING:
    from sovereignspec.core.placement import Placer

EXPLAIN_LIMIT = 32  # excluded nodes named in one record; the rest are counted


def held_back(p: Placer, w: WorkloadRequest, req: SpecRequest, mask: NDArray[np.bool_]) -> dict[str, str]:
    """Candidate GPUs where the objective wanted speculation and a neighbour's SLO refused it."""
    out: dict[str, str] = {}
    if req.gamma_max == 0:
        return out
    idx = np.nonzero(mask)[0]
    table, _ = p._table(w.model_key, req, idx)
    # Per GPU, the objective's own favourite γ (as `optimiser.blocker`, all columns at once).
    free = np.argmax(quantize(table.aggregate), axis=0)
    refused = (free > 0) & ~table.externality_ok[free, np.arange(idx.size)]
    for col in np.nonzero(refused)[0][:EXPLAIN_LIMIT].tolist():
        g = int(idx[col])
        where = f"{p.node_names[int(p.gpu_node[g])]}/gpu{int(p.gpu_index[g])}"
        gamma = int(table.gammas[free[col]])
        out[where] = f"γ={gamma} would push neighbour {p.binding[g]} past its TPOT SLO"
    return out


def excluded(p: Placer, w: WorkloadRequest, mask: NDArray[np.bool_] | None) -> dict[str, str]:
    """Why each node `w` cannot use was left out (the first EXPLAIN_LIMIT of them, by node order;
    the rest counted). Every decision's record carries it, so it costs what naming those few
    nodes costs, not a pass over the cluster per node: where the model fits is worked out once."""
    out: dict[str, str] = {}
    usable_nodes = set(p.gpu_node[mask].tolist()) if mask is not None else set()
    nodes = len(p._node_tenancy)
    left_out = nodes - sum(1 for i in usable_nodes if 0 <= i < nodes)
    m = p._models.get(w.model_key)
    fits_on: NDArray[np.bool_] | None = None  # per node: the model fits one of its GPUs
    for i, tenancy in enumerate(p._node_tenancy):
        if len(out) >= EXPLAIN_LIMIT:
            break
        if i in usable_nodes:
            continue
        why = check_node(w.requirement, tenancy, p.policy.jurisdiction_label)
        if w.node_pool is not None and tenancy.name not in w.node_pool:
            text = "node-pool: not selected by the workload's flavor or nodeSelector"
        elif why is not None:
            text = f"{why.constraint}: {why.detail}"
        elif m is not None and not (fits_on := _fits_on(p, w, m) if fits_on is None else fits_on)[i]:
            text = f"capacity: {w.model_shown} does not fit this node's GPUs"
        elif i in p._unavailable:
            text = f"unavailable: {p._unavailable[i]}"
        else:
            text = "capacity: not enough free GPUs"
        out[tenancy.name] = text
    if left_out > len(out):
        out["..."] = f"{left_out - len(out)} more nodes excluded"
    return out


def _fits_on(p: Placer, w: WorkloadRequest, m: Any) -> NDArray[np.bool_]:
    """Per node: whether `w`'s model fits at least one of its GPUs (a node with none: False)."""
    fits = np.asarray(p._fits(w, m), dtype=np.float64)
    return np.asarray(np.bincount(p.gpu_node, weights=fits, minlength=len(p._node_tenancy)) > 0)


def unplaced(
    p: Placer, w: WorkloadRequest, outcome: Literal["retry", "rejected"], why: str, explain: bool
) -> Placement:
    record = DecisionRecord(
        workload=w.name,
        tenant=w.tenant,
        outcome=outcome,
        mode="plain",
        gamma=0,
        reason=why,
        alpha=w.alpha,
        excluded=excluded(p, w, None) if explain else {},
    )
    return Placement(w.name, None, None, 0, record)


def record(
    p: Placer,
    w: WorkloadRequest,
    req: SpecRequest,
    off: str | None,
    g: int,
    s: Mapping[str, NDArray[np.float64]],
    n_candidates: int,
    mask: NDArray[np.bool_],
    explain: bool,
) -> DecisionRecord:
    gamma = int(s["gamma"][g])
    where = _where(p, w, g, s, n_candidates)
    if not explain:  # a tick's bulk decisions: where and how, without the breakdown
        return DecisionRecord(reason="speculative" if gamma > 0 else "plain", **where)
    cautious = bool(s["cautious"][g])
    req = p.for_gpu_type(req, w.model, where["gpu_type"])
    table, _ = p._table(w.model_key, req, np.array([g]), cautious=cautious)
    why_not = blocker(table)
    binding = p.binding[g] if math.isfinite(p.slo_ratio[g]) else None
    reason = _why(p, g, gamma, req, off, why_not, binding)
    gpu = p.profiles.gpu_for(where["gpu_type"], w.model)
    ridge = _ridge(p, w, g, req, gpu)
    if cautious:
        reason += (
            f" (near the compute ridge, which the calibration places at {ridge[0]:.0f}-{ridge[2]:.0f} "
            f"sequences here: γ decided at the low end of its compute efficiency, {gpu.compute_range[0]:.3g} "
            f"against {gpu.compute_efficiency:.3g})"
        )
    h = where["headroom"]
    return DecisionRecord(
        reason=reason,
        ridge_seqs=ridge,
        headroom_pessimistic=None if h is None else max(float(h) - p.policy.headroom_uncertainty, 0.0),
        tau=float(table.taus[gamma]),
        step_plain_ms=1e3 * float(s["step_plain"][g]),
        step_ms=1e3 * float(s["step"][g]),
        speedup=float(table.speedup[gamma, 0]),
        aggregate_speedup=float(table.aggregate[gamma, 0]),
        unconstrained_gamma=why_not.gamma,
        binding_neighbour=binding,
        neighbour_step_ratio=float(s["step"][g] / s["before"][g]),
        excluded=excluded(p, w, mask),
        held_back=held_back(p, w, req, mask),
        **where,
    )


def _where(
    p: Placer, w: WorkloadRequest, g: int, s: Mapping[str, NDArray[np.float64]], n_candidates: int
) -> dict[str, Any]:
    """What every record of a placement on GPU `g` says: where, how, and the load it was judged at."""
    gamma = int(s["gamma"][g])
    return {
        "workload": w.name,
        "tenant": w.tenant,
        "outcome": "placed",
        "mode": "speculative" if gamma > 0 else "plain",
        "gamma": gamma,
        "node": p.node_names[int(p.gpu_node[g])],
        "gpu_index": int(p.gpu_index[g]),
        "gpu_type": p.gpu_types[int(p.gpu_type[g])],
        "alpha": w.alpha,
        "tpot_ms": 1e3 * float(s["tpot"][g]),
        "candidates": n_candidates,
        # What the engine hand-off judges its per-batch table at (`core.handoff.handoff`).
        "headroom": None if bool(p.stale[g]) else float(p.headroom[g]),
        "headroom_measured": None if bool(p.stale[g]) else float(p.measured[g]),
        "background_seqs": float(s["bg_seqs"][g]),  # at the pessimistic reading
        "neighbour_slo_ratio": float(p.slo_ratio[g]),
        "step_before_ms": 1e3 * float(s["before"][g]),
    }


def _why(
    p: Placer, g: int, gamma: int, req: SpecRequest, off: str | None, why_not: Blocker, binding: str | None
) -> str:
    """Why this mode on GPU `g`: the first of what turned speculation off or what it won."""
    if gamma > 0:
        return (
            f"γ*={gamma} maximises the GPU's token rate with S_real ≥ {1 + req.margin:.2f} "
            f"and every neighbour within its TPOT SLO"
        )
    if off:
        return off
    if bool(p.stale[g]):
        return "no fresh telemetry for this GPU: plain decode until it returns"
    if why_not.by_externality:
        return f"γ={why_not.gamma} would push neighbour {binding} past its TPOT SLO: plain decode"
    if why_not.by_self_benefit:
        return f"no γ reaches S_real ≥ {1 + req.margin:.2f} at this headroom: plain decode"
    if p.headroom[g] <= p.policy.headroom_uncertainty:
        return "no γ raises the GPU's token rate at this headroom (saturated): plain decode"
    return (
        f"no γ raises the GPU's token rate at headroom {float(p.headroom[g]):.2f} "
        "(the drafts cost more than they save at this load): plain decode"
    )


def _ridge(
    p: Placer, w: WorkloadRequest, g: int, req: SpecRequest, gpu: GpuSpec
) -> tuple[float, float, float]:
    """The compute ridge on GPU `g` in sequences: at the low end, the estimate and the high end of
    its calibrated compute efficiency."""
    tp = int(p._model(w.model_key).tp[g])
    model = w.stage_of(p.profiles.models[w.model])
    low, high = gpu.compute_range
    r_low, r_point, r_high = (
        float(roofline_for(replace(gpu, compute_efficiency=ce), model, tp).ridge_seqs(req.context))
        for ce in (low, gpu.compute_efficiency, high)
    )
    return r_low, r_point, r_high


def never_fits(p: Placer, w: WorkloadRequest) -> str:
    """Why no node can ever take `w` (its pool, its sovereignty, its size), most specific first."""
    pool = p._pool(w)
    if not pool.any():
        return (
            "no node matches its flavor's node labels and every pod set's nodeSelector and "
            "required node affinity, with taints they tolerate"
        )
    sovereign = p.tenancy.permanent_mask(w.requirement) & pool
    if not sovereign.any():
        if w.jurisdiction is not None:
            return f"no node of its flavor and node constraints in jurisdiction {w.jurisdiction}"
        allowed = ", ".join(sorted(w.allowed_jurisdictions or ()))
        where = "no node of its flavor and node constraints in the jurisdictions its namespace allows"
        return f"{where} ({allowed})"
    m = p._model(w.model_key)
    fits = sovereign[p.gpu_node] & p._fits(w, m)
    if not fits.any():
        whole = sovereign[p.gpu_node] & m.fits
        if w.gpus is not None and whole.any():
            return (
                f"{w.model_shown} fits no GPU of the nodes it may use on the {w.gpus // w.pods} "
                f"GPUs each of its pods asks for (it needs {int(m.tp[whole].min())})"
            )
        return f"{w.model_shown} fits no GPU of the nodes it may use"
    need = int(w.gpus) if w.gpus is not None else int(m.tp[fits].min())
    largest = int(p.capacity[p.gpu_node[fits]].max())
    return f"it needs {need} GPUs on one node; the largest node it may use has {largest}"
