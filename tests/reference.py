"""A plain-Python, one-number-at-a-time implementation of the same placement decisions.

It exists for two reasons: the tests use it as an equivalence oracle for the vectorised `Placer`
(same inputs, same decisions, same γ), and the benchmark measures the vectorised code against it.
It shares no code with `placement` beyond the input types, the scalar sovereignty check and the
one-GPU formulas of `scalar`, and it recomputes every GPU for every workload: it is written to be
obviously right, not fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sovereignspec.core.placement import ClusterView, PlacerSettings, WorkloadRequest, tick_order
from sovereignspec.core.roofline import tensor_parallel_for
from sovereignspec.core.scalar import Coeffs, best_gamma, quantize, tau
from sovereignspec.core.sovereignty import NodeTenancy, check_node
from sovereignspec.core.specs import ProfileSet


@dataclass(frozen=True)
class RefDecision:
    workload: str
    outcome: str
    node: str | None
    gpu_index: int | None
    gamma: int


def reference_tick(
    profiles: ProfileSet,
    cluster: ClusterView,
    pending: list[WorkloadRequest],
    policy: PlacerSettings | None = None,
) -> list[RefDecision]:
    policy = policy or PlacerSettings()
    tenancy = {n.name: NodeTenancy(n.name, n.labels, n.tenants, n.exclusive_tenants) for n in cluster.nodes}
    free = {n.name: n.free_gpus for n in cluster.nodes}
    gpus = sorted(cluster.gpus, key=lambda g: (g.node, g.index))
    stale_gpu = [g.headroom is None for g in gpus]
    headroom = [g.headroom if g.headroom is not None else (g.stale_estimate or 0.0) for g in gpus]
    slo_ratio = [g.slo_ratio / (1.0 + policy.slo_margin) for g in gpus]
    out: list[RefDecision] = []

    for w in sorted(pending, key=tick_order):
        if w.model not in profiles.models:
            out.append(RefDecision(w.name, "rejected", None, None, 0))
            continue
        model = profiles.models[w.model]
        gamma_max = policy.gamma_max if w.gamma_max is None else min(w.gamma_max, policy.gamma_max)
        drafter = profiles.drafters.get(w.drafter) if w.drafter else None
        spec_on = (
            drafter is not None and drafter.supports(w.model) and w.force_plain is None and gamma_max > 0
        )
        cost = drafter.cost_for(w.model) if drafter is not None else 0.0
        overhead = drafter.spec_overhead if drafter is not None else 0.0
        top = gamma_max if spec_on else 0
        b, ctx = float(w.seqs), float(w.context)

        taus = [tau(w.alpha, float(g)) for g in range(top + 1)]
        # (gpu position, γ, tpot, plain step, step before, headroom, coeffs, step, tp, load)
        rows: list[tuple[int, int, float, float, float, float, Coeffs, float, int, float]] = []
        permanent_ok = False
        for pos, g in enumerate(gpus):
            try:
                tp = tensor_parallel_for(profiles.gpus[g.gpu_type], model)
            except ValueError:
                continue
            if w.node_pool is not None and g.node not in w.node_pool:
                continue
            why = check_node(w.requirement, tenancy[g.node], policy.jurisdiction_label)
            if why is None or not why.permanent:
                permanent_ok = True
            need = tp if w.gpus is None else w.gpus
            if why is not None or free[g.node] < need:
                continue
            c = Coeffs.of(profiles.gpus[g.gpu_type], model, tp)
            stale = stale_gpu[pos]
            h = headroom[pos]
            choice = best_gamma(
                c,
                taus,
                b,
                ctx,
                cost,
                overhead,
                policy.margin,
                max(h - policy.headroom_uncertainty, 0.0),
                slo_ratio[pos] if policy.externality else math.inf,
                not stale,
            )
            tpot = choice.step / taus[choice.gamma]
            rows.append(
                (pos, choice.gamma, tpot, choice.plain, choice.before, h, c, choice.step, need, choice.load)
            )

        if not rows:
            outcome = "retry" if permanent_ok else "rejected"
            out.append(RefDecision(w.name, outcome, None, None, 0))
            continue
        low = min(r[2] for r in rows)
        if w.latency_class == "latency":
            chosen = min(rows, key=lambda r: (quantize(r[2] / low), -quantize(r[5]), r[0]))
        else:
            own = [r for r in rows if w.tpot_slo_s is None or r[2] <= w.tpot_slo_s]
            both = [r for r in own if r[3] <= slo_ratio[r[0]] * r[4]]
            pool = both or own or rows
            gains = [b / r[2] - r[9] * (1.0 / r[4] - 1.0 / r[7]) for r in pool]
            largest = max(abs(x) for x in gains)
            keys = [quantize(x / largest) if largest > 0 else 0.0 for x in gains]
            chosen = min(
                zip(keys, pool, strict=True), key=lambda kr: (-kr[0], quantize(kr[1][2] / low), kr[1][0])
            )[1]
        pos, gamma, tpot, _, before, h, c, step, tp, _load = chosen
        g = gpus[pos]
        out.append(RefDecision(w.name, "placed", g.node, g.index, gamma))

        # The same bookkeeping as Placer._commit.
        n = c.seqs_for_headroom(h, ctx)
        headroom[pos] = c.headroom(n + b * (gamma + 1.0), n + b, ctx)
        slo_ratio[pos] /= step / before
        if w.tpot_slo_s is not None:
            slo_ratio[pos] = min(slo_ratio[pos], w.tpot_slo_s / tpot / (1.0 + policy.slo_margin))
        free[g.node] -= tp
        held = tenancy[g.node]
        tenancy[g.node] = NodeTenancy(
            held.name,
            held.labels,
            held.tenants | {w.tenant},
            held.exclusive_tenants | ({w.tenant} if w.exclusive else set()),
        )
    return out
