"""What already runs, as the placer prices it: the load a GPU's placements imply before its
telemetry shows them (`with_ledger_load`), a running decision judged again at its GPU's reading
now (`reevaluate`), and the tightest neighbour's SLO bound on a GPU (`neighbour_bound`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from sovereignspec.core.budget import spec_request
from sovereignspec.core.cluster import (
    IDLE_HEADROOM,
    UNBOUNDED_GPUS,
    ClusterView,
    GpuState,
    NodeState,
    PlacerSettings,
    WorkloadRequest,
)
from sovereignspec.core.placement import Placer
from sovereignspec.core.roofline import (
    tensor_parallel_for,
)
from sovereignspec.core.scalar import Coeffs, best_gamma, speedup_at
from sovereignspec.core.scalar import tau as tau_scalar
from sovereignspec.core.specs import ProfileSet


@dataclass(frozen=True)
class Reevaluation:
    """A running workload's γ judged again at today's reading of its GPU."""

    gamma_now: int  # what the optimiser would choose now (neighbours' SLOs not counted)
    speedup_in_force: float  # its own S_real at the γ it runs, at today's load
    aggregate_in_force: float  # the GPU's aggregate speed-up at that γ: below 1, a net loss


def reevaluate(
    profiles: ProfileSet,
    policy: PlacerSettings,
    w: WorkloadRequest,
    gpu_type: str,
    gamma: int,
    headroom: float,
) -> Reevaluation | None:
    """`w`, running γ on a GPU of `gpu_type` that reads `headroom` now (judged one uncertainty
    worse, as decisions are). The reading includes the workload's own load, so the background it
    implies is an over-estimate: a pessimistic judgement, which is the side to err on when the
    question is whether speculation still pays. None when the model does not fit the GPU type."""
    model = profiles.models.get(w.model)
    gpu = profiles.gpu_for(gpu_type, w.model) if gpu_type in profiles.gpus else None
    if model is None or gpu is None:
        return None
    model = w.stage_of(model)
    try:
        c = Coeffs.of(gpu, model, tensor_parallel_for(gpu, model))  # a stage's: its pod's GPUs
    except ValueError:
        return None
    req, _ = spec_request(profiles, policy, w)
    req = replace(req, margin=req.margin + profiles.margin_for(gpu_type, w.model))
    judged = max(headroom - policy.headroom_uncertainty, 0.0)
    taus = [tau_scalar(req.alpha, g) for g in range(max(req.gamma_max, gamma) + 1)]
    now = best_gamma(c, taus[: req.gamma_max + 1], req.seqs, req.context, req.draft_cost,
                     req.spec_overhead, req.margin, judged, math.inf, True)  # fmt: skip
    own, aggregate = speedup_at(
        c, taus, gamma, req.seqs, req.context, req.draft_cost, req.spec_overhead, judged
    )
    return Reevaluation(now.gamma, own, aggregate)


def neighbour_bound(neighbours: Iterable[tuple[str, float | None, float | None]]) -> tuple[float, str | None]:
    """A GPU's q = min over its neighbours of TPOT SLO / TPOT now, and whose it is: (∞, None) when
    none has both. `neighbours`: (name, SLO seconds, TPOT seconds as measured, else as predicted).
    The operator's view and the simulator both bound a GPU's step by it."""
    ratio, binding = math.inf, None
    for name, slo, tpot in neighbours:
        if slo is None or not tpot:
            continue
        if slo / tpot < ratio:
            ratio, binding = slo / tpot, name
    return ratio, binding


# What a GPU's placements imply for its headroom, by (GPU type, its placements in order).
LedgerMemo = dict[tuple[Any, ...], float]


def with_ledger_load(
    cluster: ClusterView,
    placed: list[tuple[WorkloadRequest, str, int, int]],
    profiles: ProfileSet,
    memo: LedgerMemo | None = None,
) -> ClusterView:
    """Headroom = the lower of what telemetry reads and what the placements already made imply.

    A placement shows in GPU telemetry only once its server runs (image pull and model load take
    minutes), so a fresh reading can still miss it; the placements are known at once. What they
    imply is computed by accounting every one of them on an otherwise idle GPU. `placed` holds
    (workload, node, GPU index, γ).

    A GPU's implied headroom depends only on its type and its own placements, so `memo` (kept by
    the caller between views, pruned here to the GPUs of this one) spares accounting again the
    GPUs whose placements did not change."""
    if not placed:
        return cluster
    on_gpu: dict[tuple[str, int], list[tuple[WorkloadRequest, int]]] = defaultdict(list)
    for w, node, gpu, gamma in placed:
        on_gpu[(node, gpu)].append((w, gamma))
    types = {(g.node, g.index): g.gpu_type for g in cluster.gpus}
    keys = {slot: (types[slot], tuple(ws)) for slot, ws in on_gpu.items() if slot in types}
    memo = {} if memo is None else memo
    todo = {slot for slot, k in keys.items() if k not in memo}
    if todo:
        nodes = {node for node, _ in todo}
        idle = ClusterView(
            [NodeState(n.name, n.labels, UNBOUNDED_GPUS) for n in cluster.nodes if n.name in nodes],
            [
                GpuState(g.node, g.index, g.gpu_type, IDLE_HEADROOM)
                for g in cluster.gpus
                if (g.node, g.index) in todo
            ],
        )
        ledger = Placer(profiles, idle)
        for w, node, gpu, gamma in placed:
            if (node, gpu) in todo:
                ledger.account(w, node, gpu, gamma)
        for g, h in zip(ledger.gpus, ledger.headroom, strict=True):
            memo[keys[(g.node, g.index)]] = float(h)
    wanted = set(keys.values())
    for k in [k for k in memo if k not in wanted]:
        del memo[k]
    implied = {slot: memo[k] for slot, k in keys.items()}
    gpus = [  # a GPU with no placement implies an idle one
        replace(g, stale_estimate=implied.get((g.node, g.index), IDLE_HEADROOM))
        if g.headroom is None
        else replace(
            g,
            headroom=min(g.headroom, implied.get((g.node, g.index), IDLE_HEADROOM)),
            measured=g.headroom if g.measured is None else g.measured,
        )
        for g in cluster.gpus
    ]
    return ClusterView(cluster.nodes, gpus)
