"""Placement: which node and GPU, which mode and which γ, for one workload or a whole tick.

The order of a decision, for each workload:

1. sovereignty (`sovereignty.TenancyIndex`): nodes the workload may never or may not now use are
   removed before any speed-up is computed; then nodes without enough free GPUs for its
   tensor-parallel degree;
2. γ* on every remaining GPU (`optimiser`), from the GPU's headroom reading and its tightest
   neighbour; GPUs with stale telemetry are scored as saturated and allowed plain decode only;
3. the heterogeneous-placement policy:
   - latency-sensitive work goes where its predicted time per output token is lowest: where the
     headroom is, and where it can speculate if its drafter pays anywhere;
   - throughput work runs where it adds the most tokens per second to the cluster: its own rate
     less what its neighbours lose to the longer step, among GPUs where it meets its own TPOT SLO
     and keeps every neighbour within theirs (falling back to its own SLO, then to any).
   Latency work whose drafter pays nowhere still takes the fastest GPU rather than a packed one:
   its SLO is about latency, and load predictions miss what they cannot see (prefill, bursts).
   A tick decides high-acceptance work first, so it reaches the idle GPUs first.

Ties are broken, in order: lower TPOT (latency work) / more tokens per second added (throughput
work), compared after rounding to 1e-9 relative, then higher headroom (latency work) / lower TPOT
(throughput work), then node name, then GPU index. A tick decides pending workloads
latency-sensitive first, then by declared acceptance rate (high first), then by name; each
placement updates the GPU's load and neighbours before the next is decided, so decisions in one
tick never contradict each other.

Speed: a tick keeps, per workload signature (model, drafter, α, batch, context, limits), the γ table
for every GPU and recomputes only the GPUs whose state changed since it was last used. Sorting the
tick puts alike workloads next to each other, so most placements recompute one GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from sovereignspec.core import choosing, reasons, spreading
from sovereignspec.core.budget import spec_request
from sovereignspec.core.cluster import (
    UNBOUNDED_GPUS,
    ClusterView,
    GpuState,
    ModelKey,
    Placement,
    PlacerSettings,
    WorkloadRequest,
)
from sovereignspec.core.optimiser import GammaTable, SpecRequest, choose, gamma_axis, gamma_table
from sovereignspec.core.roofline import (
    Roofline,
    compute_bound,
    fits_at,
    pipeline_stage,
    roofline_for,
    stack_rooflines,
    tensor_parallel_for,
)
from sovereignspec.core.scalar import Coeffs, best_gamma
from sovereignspec.core.sovereignty import NodeTenancy, TenancyIndex
from sovereignspec.core.specs import ProfileSet
from sovereignspec.core.speedup import verify_tokens

SCALAR_UPDATE_LIMIT = 8  # GPUs to refresh below which plain floats beat numpy


@dataclass
class _ModelArrays:
    roof: Roofline  # per GPU
    tp: NDArray[np.int64]
    fits: NDArray[np.bool_]
    matrix: NDArray[np.float64]  # roof's fields stacked, for fast subsets
    # The same at each GPU's low end of its calibrated compute efficiency; None where no GPU type
    # has an interval (nothing measured around the point).
    cautious: NDArray[np.float64] | None = None
    # Per GPU type (Placer.gpu_types' order), as floats for the scalar path: every GPU of a type
    # has the same coefficients.
    coeffs: list[Coeffs] = field(default_factory=list)
    cautious_coeffs: list[Coeffs] = field(default_factory=list)


@dataclass
class _Scores:
    """The γ table's choice for one signature on every GPU, with the GPU versions it was computed at."""

    version: NDArray[np.int64]
    arrays: dict[str, NDArray[np.float64]] = field(default_factory=dict)


# What selection and bookkeeping need per GPU; the record recomputes the rest for the chosen GPU.
_SCORE_FIELDS = ("gamma", "tpot", "step", "step_plain", "before", "bg_seqs", "cautious")


class Placer:
    """Decides placements against a cluster view and keeps that view current as it places."""

    def __init__(
        self, profiles: ProfileSet, cluster: ClusterView, policy: PlacerSettings | None = None
    ) -> None:
        self.profiles = profiles
        self.policy = policy or PlacerSettings()
        nodes = sorted(cluster.nodes, key=lambda n: n.name)
        self.node_names = [n.name for n in nodes]
        self._unavailable = {i: n.unavailable for i, n in enumerate(nodes) if n.unavailable}
        node_index = {n.name: i for i, n in enumerate(nodes)}
        gpus = sorted(cluster.gpus, key=lambda g: (node_index[g.node], g.index))
        self.gpus = gpus
        self.gpu_node = np.array([node_index[g.node] for g in gpus], dtype=np.int64)
        self.gpu_index = np.array([g.index for g in gpus], dtype=np.int64)
        self.gpu_types = sorted({g.gpu_type for g in gpus})
        type_index = {t: i for i, t in enumerate(self.gpu_types)}
        self.gpu_type = np.array([type_index[g.gpu_type] for g in gpus], dtype=np.int64)
        self._type_of: list[int] = self.gpu_type.tolist()
        self.stale = np.array([g.headroom is None for g in gpus], dtype=np.bool_)
        self.headroom = np.array([_headroom(g) for g in gpus], dtype=np.float64)
        # What telemetry measured, before declared placements (the ledger's, and this tick's).
        self.measured = np.array(
            [g.measured if g.measured is not None else _headroom(g) for g in gpus], dtype=np.float64
        )
        self.slo_ratio = np.array([g.slo_ratio for g in gpus], dtype=np.float64) / (
            1.0 + self.policy.slo_margin
        )
        self.binding: list[str | None] = [g.binding_neighbour for g in gpus]
        self.free = np.array([n.free_gpus for n in nodes], dtype=np.int64)
        # Capacity unknown (None): no size is ever ruled out for good.
        self.capacity = np.array(
            [UNBOUNDED_GPUS if n.capacity is None else max(n.capacity, n.free_gpus) for n in nodes],
            dtype=np.int64,
        )
        self.occupied = np.array(
            [bool(n.tenants) or (n.capacity is not None and n.free_gpus < n.capacity) for n in nodes],
            dtype=np.bool_,
        )
        self.tenancy = TenancyIndex([n.tenancy for n in nodes], self.policy.jurisdiction_label)
        self._node_tenancy = [n.tenancy for n in nodes]
        self.version = np.zeros(len(gpus), dtype=np.int64)
        self._position = {(g.node, g.index): i for i, g in enumerate(gpus)}
        self._models: dict[ModelKey, _ModelArrays] = {}
        self._scores: dict[tuple[object, ...], _Scores] = {}
        self._exhausted: dict[tuple[object, ...], tuple[Literal["retry", "rejected"], str]] = {}
        self._pools: dict[frozenset[str], NDArray[np.bool_]] = {}
        self._all_nodes = np.ones(len(nodes), dtype=np.bool_)

    # -- per-model coefficients --------------------------------------------------------------

    def _model(self, key: ModelKey) -> _ModelArrays:
        if key not in self._models:
            name, stages, given = key
            model = pipeline_stage(self.profiles.models[name], stages, given)
            per_type: list[Roofline] = []
            low_end: list[Roofline] = []
            tps: list[int] = []
            fits: list[bool] = []
            for t in self.gpu_types:
                gpu = self.profiles.gpu_for(t, name)
                if given is not None:  # a group's stage runs on the GPUs its pod asks for
                    tp, fit = given, fits_at(gpu, model, given)
                else:
                    try:
                        tp, fit = tensor_parallel_for(gpu, model), True
                    except ValueError:  # never chosen: `fits` excludes the type; any degree builds it
                        tp, fit = model.tensor_parallel, False
                fits.append(fit)
                tps.append(tp)
                per_type.append(roofline_for(gpu, model, tp))
                low = replace(gpu, compute_efficiency=gpu.compute_range[0])
                low_end.append(roofline_for(low, model, tp))
            roof = stack_rooflines(per_type).take(self.gpu_type)
            cautious = stack_rooflines(low_end).take(self.gpu_type).matrix()
            self._models[key] = _ModelArrays(
                roof,
                np.array(tps, dtype=np.int64)[self.gpu_type],
                np.array(fits, dtype=np.bool_)[self.gpu_type],
                roof.matrix(),
                None if np.array_equal(cautious, roof.matrix()) else cautious,
                [Coeffs(*stack_rooflines([r]).matrix()[:, 0].tolist()) for r in per_type],
                [Coeffs(*stack_rooflines([r]).matrix()[:, 0].tolist()) for r in low_end],
            )
        return self._models[key]

    def spec_request(self, w: WorkloadRequest) -> tuple[SpecRequest, str | None]:
        """The optimiser's view of `w`, and why speculation is off for it (None if it isn't)."""
        return spec_request(self.profiles, self.policy, w)

    # -- γ tables, cached per signature -------------------------------------------------------

    def _scores_for(self, w: WorkloadRequest, req: SpecRequest, mask: NDArray[np.bool_]) -> _Scores:
        """The signature's γ table choices, current on every GPU in `mask` (the others may lag)."""
        key = (w.model_key, req, self.policy.externality)
        cached = self._scores.get(key)
        if cached is None:
            cached = _Scores(version=np.full(len(self.gpus), -1, dtype=np.int64))
            cached.arrays = {f: np.zeros(len(self.gpus), dtype=np.float64) for f in _SCORE_FIELDS}
            self._scores[key] = cached
        stale = np.nonzero((cached.version != self.version) & mask)[0]
        for idx, r in self._by_margin(w.model, req, stale):
            if idx.size > SCALAR_UPDATE_LIMIT:
                self._evaluate(w.model_key, r, idx, cached)
            elif idx.size:
                self._evaluate_scalar(w.model_key, r, idx, cached)
        cached.version[stale] = self.version[stale]
        return cached

    def for_gpu_type(self, req: SpecRequest, model: str, gpu_type: str) -> SpecRequest:
        """`req` as judged on a GPU of `gpu_type`: its margin widened by what the engines observed of
        that GPU type's profile for `model` (`ProfileSet.margin_for`; the same request without any)."""
        extra = self.profiles.margin_for(gpu_type, model)
        return replace(req, margin=req.margin + extra) if extra > 0.0 else req

    def _by_margin(
        self, model: str, req: SpecRequest, idx: NDArray[np.int64]
    ) -> list[tuple[NDArray[np.int64], SpecRequest]]:
        """`idx` split by the request each GPU is judged with: one group unless an observed error
        widens some GPU type's margin. A GPU's type never changes, so a signature's cached
        choices stay per GPU what its own type's margin gives."""
        if not self.profiles.extra_margin or not idx.size:
            return [(idx, req)]
        types = self.gpu_type[idx]
        return [
            (idx[types == t], self.for_gpu_type(req, model, self.gpu_types[int(t)])) for t in np.unique(types)
        ]

    def _table(
        self, model: ModelKey, req: SpecRequest, idx: NDArray[np.int64], cautious: bool = False
    ) -> tuple[GammaTable, NDArray[np.float64]]:
        """The γ table on GPUs `idx`, judged at the pessimistic load each reading maps to (with
        `cautious`, at the low end of each GPU's calibrated compute efficiency)."""
        m = self._model(model)
        matrix = m.cautious if cautious and m.cautious is not None else m.matrix
        roof = Roofline.from_matrix(matrix[:, idx])
        h_pess = np.maximum(self.headroom[idx] - self.policy.headroom_uncertainty, 0.0)
        bg = roof.seqs_for_headroom(h_pess, req.context)
        q = self.slo_ratio[idx] if self.policy.externality else np.full(idx.size, np.inf)
        return gamma_table(roof, req, bg, q, allow_spec=~self.stale[idx]), bg

    def _evaluate(self, model: ModelKey, req: SpecRequest, idx: NDArray[np.int64], out: _Scores) -> None:
        table, bg = self._table(model, req, idx)
        choice = choose(table)
        a = out.arrays
        a["gamma"][idx] = choice.gamma
        a["tpot"][idx] = choice.tpot
        a["step"][idx] = choice.step
        a["step_plain"][idx] = table.step[0]
        a["before"][idx] = table.step_before
        a["bg_seqs"][idx] = bg
        a["cautious"][idx] = 0.0
        cautious = self._model(model).cautious
        if cautious is None or not (choice.gamma > 0).any():
            return
        # Where the chosen step is compute-bound at the low end of the calibrated compute
        # efficiency, the ridge's interval straddles the load: decide there, never drafting more.
        low = Roofline.from_matrix(cautious[:, idx])
        near = (choice.gamma > 0) & compute_bound(
            low, bg + req.seqs * (choice.gamma + 1.0), bg + req.seqs, req.context
        )
        if not near.any():
            return
        sub = idx[near]
        t2, bg2 = self._table(model, req, sub, cautious=True)
        c2 = choose(t2)
        lower = c2.gamma < choice.gamma[near]
        if not lower.any():
            return
        g = sub[lower]
        a["gamma"][g] = c2.gamma[lower]
        a["tpot"][g] = c2.tpot[lower]
        a["step"][g] = c2.step[lower]
        a["step_plain"][g] = t2.step[0][lower]
        a["before"][g] = t2.step_before[lower]
        a["bg_seqs"][g] = bg2[lower]
        a["cautious"][g] = 1.0

    def _evaluate_scalar(
        self, model: ModelKey, req: SpecRequest, idx: NDArray[np.int64], out: _Scores
    ) -> None:
        """The same as `_evaluate` for a few GPUs (one changed since the last use): plain floats
        beat a dozen numpy calls on one-element arrays."""
        m = self._model(model)
        _, _, taus_array = gamma_axis(req.alpha, req.gamma_max)
        taus = taus_array.tolist()
        a = out.arrays
        for g in idx.tolist():
            args = (
                taus,
                req.seqs,
                req.context,
                req.draft_cost,
                req.spec_overhead,
                req.margin,
                max(float(self.headroom[g]) - self.policy.headroom_uncertainty, 0.0),
                float(self.slo_ratio[g]) if self.policy.externality else math.inf,
                not bool(self.stale[g]),
            )
            choice = best_gamma(m.coeffs[self._type_of[g]], *args)
            a["cautious"][g] = 0.0
            if m.cautious is not None and choice.gamma > 0:
                low = m.cautious_coeffs[self._type_of[g]]
                n = choice.load + req.seqs * (choice.gamma + 1.0)
                if compute_bound(low, n, choice.load + req.seqs, req.context):
                    careful = best_gamma(low, *args)
                    if careful.gamma < choice.gamma:
                        choice = careful
                        a["cautious"][g] = 1.0
            a["gamma"][g] = choice.gamma
            a["tpot"][g] = choice.step / taus[choice.gamma]
            a["step"][g] = choice.step
            a["step_plain"][g] = choice.plain
            a["before"][g] = choice.before
            a["bg_seqs"][g] = choice.load

    # -- decisions ----------------------------------------------------------------------------

    def _pool(self, w: WorkloadRequest) -> NDArray[np.bool_]:
        """Per node: in the workload's node pool (its flavor's nodes and its own nodeSelector)."""
        if w.node_pool is None:
            return self._all_nodes
        mask = self._pools.get(w.node_pool)
        if mask is None:
            mask = np.array([name in w.node_pool for name in self.node_names], dtype=np.bool_)
            self._pools[w.node_pool] = mask
        return mask

    def _fits(self, w: WorkloadRequest, m: _ModelArrays) -> NDArray[np.bool_]:
        """Per GPU: the model's weights fit on the GPUs each of `w`'s pods asks for."""
        if w.gpus is None:
            return m.fits
        return np.asarray(m.fits & (m.tp * w.pods <= w.gpus), dtype=np.bool_)

    def _need(self, w: WorkloadRequest, m: _ModelArrays) -> NDArray[np.int64]:
        return m.tp if w.gpus is None else np.full(len(self.gpus), w.gpus, dtype=np.int64)

    def candidates(self, w: WorkloadRequest) -> NDArray[np.bool_]:
        """GPUs `w` may use now: sovereignty first, then its node pool, capacity and fit."""
        m = self._model(w.model_key) if w.model in self.profiles.models else None
        if m is None:
            return np.zeros(len(self.gpus), dtype=np.bool_)
        allowed = (self.tenancy.mask(w.requirement) & self._pool(w))[self.gpu_node]
        return np.asarray(
            allowed & self._fits(w, m) & (self.free[self.gpu_node] >= self._need(w, m)), dtype=np.bool_
        )

    def _reserved(self, w: WorkloadRequest, mask: NDArray[np.bool_]) -> NDArray[np.bool_]:
        """GPUs on empty nodes that shared work must leave alone: the pool's last N empty nodes."""
        keep = self.policy.keep_whole_nodes_free
        if keep <= 0 or w.exclusive:
            return np.zeros(len(self.gpus), dtype=np.bool_)
        empty = ~self.occupied & self._pool(w)
        if int(empty.sum()) > keep:
            return np.zeros(len(self.gpus), dtype=np.bool_)
        return np.asarray(empty[self.gpu_node] & mask, dtype=np.bool_)

    def place(self, w: WorkloadRequest, commit: bool = True, explain: bool = True) -> Placement:
        """Decide `w`; with `commit`, update the view as if it ran there. `explain` adds every term
        and every excluded node to the record (the operator's Event); a bulk tick can skip it."""
        if w.model not in self.profiles.models:
            return reasons.unplaced(self, w, "rejected", f"unknown model {w.model!r}", explain)
        if w.assigned is not None:
            return spreading.on_assignment(self, w, explain)
        key = (w.model_key, w.requirement, w.node_pool, w.gpus, w.pods)
        if key in self._exhausted:  # capacity only shrinks and tenancy only tightens as a view fills
            return reasons.unplaced(self, w, *self._exhausted[key], explain)
        mask = self.candidates(w)
        reserved = self._reserved(w, mask)
        if reserved.any() and not (mask & ~reserved).any():
            keep = self.policy.keep_whole_nodes_free
            why = f"the last {keep} empty node(s) of its pool are kept free for exclusive tenants"
            return reasons.unplaced(self, w, "retry", why, explain)
        mask &= ~reserved
        spread_why = None
        if not mask.any() and w.pods > 1 and w.gpus is not None:
            spread = spreading.spread(self, w, explain)
            if isinstance(spread, Placement):
                return spread
            spread_why = spread
        if not mask.any():
            self._exhausted[key] = choosing.nowhere(self, w, spread_why)
            return reasons.unplaced(self, w, *self._exhausted[key], explain)

        req, off = self.spec_request(w)
        s = self._scores_for(w, req, mask).arrays
        chosen, among = choosing.choose(self, w, req, s, mask)
        record = reasons.record(self, w, req, off, chosen, s, among, mask, explain)
        if w.stages > 1 and w.pods > 1:  # a whole group on this node: a token passes every stage
            assert record.tpot_ms is not None  # every placed record has one
            record = replace(record, tpot_ms=w.stages * record.tpot_ms)
        if commit:
            g = chosen
            self._commit(
                w, req, g, int(s["gamma"][g]), float(s["step"][g]), float(s["before"][g]), float(s["tpot"][g])
            )
        return Placement(w.name, record.node, record.gpu_index, record.gamma, record)

    def _hold(self, node: int, w: WorkloadRequest) -> None:
        """`w`'s tenant on `node` (for tenancy: who runs there), its GPUs counted elsewhere."""
        self.occupied[node] = True
        self.tenancy.place(node, w.requirement)
        t = self._node_tenancy[node]
        if w.tenant in t.tenants and (not w.exclusive or w.tenant in t.exclusive_tenants):
            return  # already held so: most commits land where their tenant runs
        self._node_tenancy[node] = NodeTenancy(
            t.name,
            t.labels,
            t.tenants | {w.tenant},
            t.exclusive_tenants | ({w.tenant} if w.exclusive else set()),
        )

    def _save(self) -> tuple[Any, ...]:
        return (
            self.headroom.copy(),
            self.slo_ratio.copy(),
            list(self.binding),
            self.free.copy(),
            self.occupied.copy(),
            list(self._node_tenancy),
            self.tenancy.save(),
            set(self._exhausted),
        )

    def _restore(self, saved: tuple[Any, ...]) -> None:
        headroom, slo, binding, free, occupied, tenancy, index, exhausted = saved
        self.headroom, self.slo_ratio, self.binding = headroom, slo, binding
        self.free, self.occupied, self._node_tenancy = free, occupied, tenancy
        self.tenancy.restore(index)
        for key in set(self._exhausted) - exhausted:  # learnt on the trial's fuller view
            del self._exhausted[key]
        self._scores.clear()  # scored on the trial's view (a failed spread is rare: start afresh)

    def account(self, w: WorkloadRequest, node: str, gpu_index: int, gamma: int) -> bool:
        """Take in a placement decided earlier, as `place` would have committed it: the GPU's load
        and neighbours, the node's capacity and tenancy. Used when the view is rebuilt from the API
        and a placement is newer than the GPU's telemetry reading. False if the GPU is unknown."""
        g = self._position.get((node, gpu_index))
        if g is None or w.model not in self.profiles.models:
            return False
        req, _ = self.spec_request(w)
        req = replace(req, gamma_max=max(req.gamma_max, gamma))
        table, _ = self._table(w.model_key, req, np.array([g]))
        step = float(table.step[gamma, 0])
        self._commit(w, req, g, gamma, step, float(table.step_before[0]), step / float(table.taus[gamma]))
        return True

    def tick(self, pending: Iterable[WorkloadRequest], explain: bool = False) -> list[Placement]:
        """Decide a batch of pending workloads at one scheduling tick, in the documented order."""
        return [self.place(w, commit=True, explain=explain) for w in sorted(pending, key=tick_order)]

    # -- bookkeeping --------------------------------------------------------------------------

    def _commit(
        self,
        w: WorkloadRequest,
        req: SpecRequest,
        g: int,
        gamma: int,
        step: float,
        before: float,
        tpot: float,
    ) -> None:
        m = self._model(w.model_key)
        # The reading (or, without telemetry, the estimate) moves by what the workload adds to the
        # load it reports (not the pessimistic one).
        c = m.coeffs[self._type_of[g]]
        n = c.seqs_for_headroom(float(self.headroom[g]), req.context)
        self.headroom[g] = c.headroom(verify_tokens(n, gamma, req.seqs), n + req.seqs, req.context)
        # Every neighbour's TPOT grows with the step; the newcomer joins them with its own SLO.
        self.slo_ratio[g] /= step / before
        if w.stage_slo_s is not None:
            own = w.stage_slo_s / tpot / (1.0 + self.policy.slo_margin)
            if own < self.slo_ratio[g]:
                self.slo_ratio[g] = own
                self.binding[g] = w.name
        node = int(self.gpu_node[g])
        self.free[node] -= int(m.tp[g]) if w.gpus is None else w.gpus
        self._hold(node, w)
        self.version[g] += 1


def _headroom(g: GpuState) -> float:
    if g.headroom is not None:
        return g.headroom
    return 0.0 if g.stale_estimate is None else g.stale_estimate


def tick_order(w: WorkloadRequest) -> tuple[bool, float, str]:
    """Latency work first, then the most likely to gain (highest α), then by name."""
    return (w.latency_class != "latency", -w.alpha, w.name)
