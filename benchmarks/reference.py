"""A plain-Python, one-number-at-a-time implementation of the same placement decisions.

It exists for two reasons: the tests use it as an equivalence oracle for the vectorised `Placer`
(same inputs, same decisions, same γ), and the benchmark measures the vectorised code against it.
It shares no code with `placement` beyond the input types and the scalar sovereignty check: the
one-GPU cost model and the γ rule are written out again below from the docstrings of `roofline`,
`speedup` and `optimiser` (not imported from them), so a change to the product's formula shows here
as a disagreement. It recomputes every GPU for every workload: obviously right, not fast. Its
arithmetic runs in the product's order, so that the two round alike and ties fall alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sovereignspec.core.cluster import ClusterView, PlacerSettings, WorkloadRequest
from sovereignspec.core.placement import tick_order
from sovereignspec.core.roofline import tensor_parallel_for
from sovereignspec.core.sovereignty import NodeTenancy, check_node
from sovereignspec.core.specs import GpuSpec, ModelSpec, ProfileSet

TIE_QUANTUM = 1e-9
USABLE_MEMORY = 0.92  # of a GPU's memory, for weights and KV cache


def quantize(x: float) -> float:
    return round(x / TIE_QUANTUM)


def tau(alpha: float, gamma: float) -> float:
    """Expected tokens per verification step (Leviathan et al.)."""
    if abs(1.0 - alpha) < 1e-12:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def _smax(a: float, b: float, p: float) -> float:
    hi, lo = (a, b) if a >= b else (b, a)
    if p == math.inf or hi <= 0.0:
        return hi
    return float(hi * (1.0 + (lo / hi) ** p) ** (1.0 / p))


@dataclass(frozen=True)
class Coeffs:
    """One GPU running one model at tensor parallelism `tp`, straight from the datasheet and card."""

    w: float  # weight bytes per rank
    kv: float  # KV bytes per context token per rank
    wf: float  # GEMM FLOPs per query token per rank
    af: float  # attention FLOPs per query token per context token per rank
    p: float  # effective FLOP/s
    b: float  # effective bytes/s
    fixed: float  # per step, with the tensor-parallel all-reduces
    cap: float  # bytes for weights and KV
    kappa: float
    overlap: float

    @staticmethod
    def of(gpu: GpuSpec, model: ModelSpec, tp: int) -> Coeffs:
        return Coeffs(
            w=model.params * model.bytes_per_param / tp,
            kv=model.kv_bytes_per_token / tp,
            wf=2.0 * model.params / tp,
            af=4.0 * model.layers * model.hidden / tp,
            p=gpu.effective_flops,
            b=gpu.effective_bandwidth,
            fixed=gpu.step_overhead_s + (2.0 * model.layers if tp > 1 else 0.0) * gpu.allreduce_s,
            cap=USABLE_MEMORY * gpu.mem_bytes,
            kappa=gpu.serial_fraction,
            overlap=gpu.overlap,
        )

    def step(self, n_tokens: float, n_seqs: float, ctx: float) -> float:
        """Attention's roofline plus the GEMMs' (a share κ of their compute not hidden), plus fixed."""
        gemm = n_tokens * self.wf / self.p
        attention = n_tokens * (self.af * ctx) / self.p
        streamed = self.w / self.b + self.kappa * gemm
        kv_reads = n_seqs * ctx * self.kv / self.b
        return self.fixed + _smax(kv_reads, attention, self.overlap) + _smax(streamed, gemm, self.overlap)

    def headroom(self, n_tokens: float, n_seqs: float, ctx: float) -> float:
        compute = n_tokens * ((self.wf + self.af * ctx) / self.p)
        return 1.0 - min(1.0, compute / ((self.w + n_seqs * ctx * self.kv) / self.b))

    def seqs_for_headroom(self, h: float, ctx: float) -> float:
        """The plain load at which the GPU reads headroom h; capped by the KV cache."""
        u = 1.0 - min(max(h, 0.0), 1.0)
        denom = (self.wf + self.af * ctx) / self.p - u * (ctx * self.kv / self.b)
        cap = max(self.cap - self.w, 0.0) / (max(ctx, 1.0) * self.kv)
        s = u * (self.w / self.b) / denom if denom > 0.0 else math.inf
        return min(s, cap)


@dataclass(frozen=True)
class Choice:
    gamma: int
    step: float
    plain: float
    before: float
    load: float


def best_gamma(
    c: Coeffs,
    taus: list[float],
    b: float,
    ctx: float,
    cost: float,
    overhead: float,
    margin: float,
    judged_headroom: float,
    slo_ratio: float,
    allow_spec: bool,
) -> Choice:
    """γ*: the feasible γ (own S_real ≥ 1 + margin, step within the neighbours' bound; γ = 0 always)
    with the highest aggregate token rate, ties to the smaller γ."""
    n = c.seqs_for_headroom(judged_headroom, ctx)
    plain = c.step(n + b, n + b, ctx)
    before = c.step(n, n, ctx)
    draft_pass = c.step(1.0, 1.0, ctx)
    best = (quantize(((b / (n + b)) * taus[0] + n / (n + b)) * (plain / plain)), 0, plain)
    for gamma in range(1, len(taus) if allow_spec else 1):
        step = c.step(n + (gamma + 1.0) * b, n + b, ctx) + gamma * (cost * draft_pass) + overhead * plain
        ratio = plain / step
        aggregate = ((b / (n + b)) * taus[gamma] + n / (n + b)) * ratio
        feasible = taus[gamma] * ratio >= 1.0 + margin and step <= slo_ratio * before
        if feasible and quantize(aggregate) > best[0]:
            best = (quantize(aggregate), gamma, step)
    return Choice(best[1], best[2], plain, before, n)


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
            if w.gpus is not None and tp > w.gpus:  # the weights need more GPUs than the pod has
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
            args = (
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
            choice = best_gamma(c, *args)
            # Near the ridge: if the chosen step has no headroom left at the low end of the
            # calibrated compute efficiency, the choice there, when it drafts less.
            gpu = profiles.gpus[g.gpu_type]
            low_ce = gpu.compute_efficiency_low
            if choice.gamma > 0 and low_ce is not None and low_ce != gpu.compute_efficiency:
                low_c = Coeffs.of(replace(gpu, compute_efficiency=low_ce), model, tp)
                if low_c.headroom(choice.load + b * (choice.gamma + 1.0), choice.load + b, ctx) <= 0.0:
                    careful = best_gamma(low_c, *args)
                    if careful.gamma < choice.gamma:
                        choice = careful
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
