"""Which admissible GPU a workload gets, and why none is admissible where none is: functions of the
`Placer` whose state they read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import numpy as np
from numpy.typing import NDArray

from sovereignspec.core import reasons
from sovereignspec.core.cluster import WorkloadRequest, first_min
from sovereignspec.core.optimiser import SpecRequest, quantize

Mask = NDArray[np.bool_]

if TYPE_CHECKING:
    from sovereignspec.core.placement import Placer


def choose(
    p: Placer,
    w: WorkloadRequest,
    req: SpecRequest,
    s: dict[str, NDArray[np.float64]],
    mask: NDArray[np.bool_],
) -> tuple[int, int]:
    """The chosen GPU among `mask`'s, and how many it was chosen among (after packing)."""
    cand = np.nonzero(mask)[0]
    away = np.zeros(cand.size, np.bool_)  # False sorts first: packing prefers home
    if p.policy.pack:
        # Fewest nodes. Exclusive work goes where its tenant already runs alone while that has
        # room: a second whole node is what the next exclusive tenant needs. Shared work goes
        # where work already runs when that costs at most the tolerance, else only on a tie.
        home = p.tenancy.alone(w.tenant) if w.exclusive else p.occupied
        at_home = home[p.gpu_node[cand]]
        tpot_all = s["tpot"][cand]
        near = at_home & (tpot_all <= (1.0 + p.policy.pack_tolerance) * tpot_all.min())
        if w.exclusive:
            near = at_home
        if (w.exclusive or p.policy.pack_tolerance > 0.0) and near.any():
            cand, at_home = cand[near], at_home[near]
        away = ~at_home
    tpot = s["tpot"][cand]
    tpot_q = quantize(tpot / tpot.min())
    head_q = quantize(p.headroom[cand])
    if w.latency_class == "latency":
        return int(cand[first_min(tpot_q, away, -head_q)]), int(cand.size)
    fits_own = tpot <= w.stage_slo_s if w.stage_slo_s is not None else np.ones(cand.size, np.bool_)
    keeps_neighbours = s["step_plain"][cand] <= p.slo_ratio[cand] * s["before"][cand]
    pool = np.ones(cand.size, np.bool_)
    for subset in (fits_own & keeps_neighbours, fits_own):
        if subset.any():
            pool = subset
            break
    local = np.nonzero(pool)[0]
    # Where it adds the most tokens per second to the cluster: its own rate, less what its
    # neighbours lose to the longer step (their plain-equivalent rate N/T before and after).
    idx = cand[local]
    gain = req.seqs / s["tpot"][idx] - s["bg_seqs"][idx] * (1.0 / s["before"][idx] - 1.0 / s["step"][idx])
    gain_q = quantize(gain / np.abs(gain).max()) if np.abs(gain).max() > 0 else np.zeros(idx.size)
    return int(idx[first_min(-gain_q, away[local], tpot_q[local])]), int(cand.size)


def nowhere(
    p: Placer, w: WorkloadRequest, spread_why: str | None
) -> tuple[Literal["retry", "rejected"], str]:
    """Why no GPU is admissible now: "rejected" where none ever will be (the nodes `w` may ever use
    never hold it), else "retry"; `spread_why` is why a spread over nodes failed, if one was tried."""
    m = p._model(w.model_key)
    permanent = (p.tenancy.permanent_mask(w.requirement) & p._pool(w))[p.gpu_node]
    fit = permanent & p._fits(w, m)
    whole = fit & (p.capacity[p.gpu_node] >= p._need(w, m))
    if spread_why is not None and w.gpus is not None and fit.any():
        # Spread, the pods need room for one each: the nodes it may ever use, by capacity.
        per_pod = w.gpus // w.pods
        nodes = np.zeros(len(p.node_names), dtype=np.bool_)
        nodes[p.gpu_node[fit]] = True
        most = int((p.capacity[nodes] // per_pod).sum())
        if most < w.pods:
            return (
                "rejected",
                f"its {w.pods} pods of {per_pod} GPUs never fit: the nodes it may use hold {most}",
            )
        return "retry", spread_why
    if not whole.any():
        return "rejected", reasons.never_fits(p, w)
    return "retry", "no admissible node with free GPUs now"
