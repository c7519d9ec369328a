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
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from sovereignspec.core.decision import DecisionRecord
from sovereignspec.core.defaults import (
    GAMMA_MAX,
    HEADROOM_UNCERTAINTY,
    NEIGHBOUR_SLO_MARGIN,
    SELF_BENEFIT_MARGIN,
)
from sovereignspec.core.optimiser import (
    GammaTable,
    SpecRequest,
    blocker,
    choose,
    gamma_axis,
    gamma_table,
    quantize,
)
from sovereignspec.core.roofline import (
    Roofline,
    compute_bound,
    fits_at,
    pipeline_stage,
    roofline_for,
    stack_rooflines,
    tensor_parallel_for,
)
from sovereignspec.core.scalar import Coeffs, best_gamma, speedup_at
from sovereignspec.core.scalar import tau as tau_scalar
from sovereignspec.core.sovereignty import (
    DEFAULT_JURISDICTION_LABEL,
    NodeTenancy,
    Requirement,
    TenancyIndex,
    check_node,
)
from sovereignspec.core.specs import ModelSpec, ProfileSet
from sovereignspec.core.speedup import verify_tokens

LatencyClass = Literal["latency", "throughput"]
EXPLAIN_LIMIT = 32  # excluded nodes named in one record; the rest are counted
SCALAR_UPDATE_LIMIT = 8  # GPUs to refresh below which plain floats beat numpy
# As many GPUs as any node could have: a node of unknown capacity, and the ledger's idle nodes.
UNBOUNDED_GPUS = int(np.iinfo(np.int32).max)
# A model as one GPU runs it: (name, pipeline stages, GPUs per stage or None for its own degree).
ModelKey = tuple[str, int, int | None]
IDLE_HEADROOM = 1.0  # a GPU nothing runs on


@dataclass(frozen=True)
class PlacerSettings:
    gamma_max: int = GAMMA_MAX
    margin: float = SELF_BENEFIT_MARGIN
    headroom_uncertainty: float = HEADROOM_UNCERTAINTY
    externality: bool = True
    # The neighbours' bound is judged this much tighter: the model's error on how far a step grows,
    # and a request's TPOT spreading around its steps' (batches change, prefills interleave). 0.2:
    # the shipped profiles are ~5-11 % RMS off measured step times and prefills add a few per cent
    # to a decode's TPOT; 0.1 left 0.4 % of a tight neighbour's requests past its SLO (docs/simulator.md).
    slo_margin: float = NEIGHBOUR_SLO_MARGIN
    jurisdiction_label: str = DEFAULT_JURISDICTION_LABEL
    # Room for exclusive tenants: shared work takes none of the last N empty nodes of its node pool,
    # and, with `pack`, goes to a node that already runs work when that costs it at most
    # `pack_tolerance` of its best TPOT; exclusive work to a node its tenant holds alone, if any.
    keep_whole_nodes_free: int = 0
    pack: bool = False
    pack_tolerance: float = 0.0


@dataclass(frozen=True)
class WorkloadRequest:
    name: str
    tenant: str
    model: str
    drafter: str | None
    alpha: float
    seqs: int = 8
    context: int = 1024
    latency_class: LatencyClass = "latency"
    tpot_slo_s: float | None = None
    jurisdiction: str | None = None
    exclusive: bool = False
    gamma_max: int | None = None
    force_plain: str | None = None  # why speculation is off for this workload (e.g. a bad annotation)
    node_pool: frozenset[str] | None = None  # nodes its flavor and nodeSelector allow (None: any)
    gpus: int | None = None  # GPUs it requests on one node (None: the model's tensor-parallel degree)
    # Pods it has, each gpus // pods GPUs: on one node if one has room, else spread (see `_spread`).
    pods: int = 1
    allowed_jurisdictions: frozenset[str] | None = None  # what its namespace allows (None: anywhere)
    # Where Kueue's Topology Aware Scheduling put its pods before checks ran: per topology domain,
    # the nodes it covers and its pod count (None: no assignment; see `_on_assignment`).
    assigned: tuple[tuple[frozenset[str], int], ...] | None = None
    # Its pods are one engine in this many pipeline stages, each pod a stage on its own GPUs (a
    # LeaderWorkerSet group: tensor parallel inside a pod, pipeline parallel across pods).
    stages: int = 1
    # Its pods by pod set, in order (a LeaderWorkerSet group's leader and workers): spread, each
    # pod set may be pinned to one node of its own (`_per_pod_set`). Empty: one pod set.
    pod_sets: tuple[int, ...] = ()

    @property
    def requirement(self) -> Requirement:
        return Requirement(self.tenant, self.jurisdiction, self.exclusive, self.allowed_jurisdictions)

    @property
    def model_key(self) -> ModelKey:
        """Its model as one GPU sees it: the whole model at its own degree, or one stage of a group
        on the GPUs each pod asks for."""
        if self.stages <= 1 or self.gpus is None:
            return (self.model, 1, None)
        return (self.model, self.stages, self.gpus // self.pods)

    @property
    def stage_slo_s(self) -> float | None:
        """Its TPOT SLO as one stage's share: a token passes every stage in turn."""
        return None if self.tpot_slo_s is None else self.tpot_slo_s / self.stages

    @property
    def model_shown(self) -> str:
        """Its model as `model_key` sees it, for messages."""
        _, stages, tp = self.model_key
        return self.model if stages <= 1 else f"a stage of {self.model} in {stages} on {tp} GPUs"

    def stage_of(self, model: ModelSpec) -> ModelSpec:
        """`model` as one GPU runs it (`model_key`): itself, or a group's largest stage."""
        _, stages, tp = self.model_key
        return pipeline_stage(model, stages, tp)


@dataclass(frozen=True)
class GpuState:
    node: str
    index: int
    gpu_type: str
    headroom: float | None  # None: no fresh telemetry (the GPU may run plain decode only)
    slo_ratio: float = math.inf  # min over neighbours of slo / current tpot
    binding_neighbour: str | None = None
    # Without telemetry, the load its known placements imply (for placing plain work); else 0.
    stale_estimate: float | None = None
    # The telemetry reading itself where `headroom` also takes off the load that placements not yet
    # running declare (`with_ledger_load`); None: `headroom` is the reading.
    measured: float | None = None


@dataclass(frozen=True)
class NodeState:
    name: str
    labels: Mapping[str, str]
    free_gpus: int
    tenants: frozenset[str] = frozenset()
    exclusive_tenants: frozenset[str] = frozenset()
    capacity: int | None = None  # GPUs the node has in all (None: unknown)
    unavailable: str | None = None  # why it takes no new work now (not Ready, cordoned), if so

    @property
    def tenancy(self) -> NodeTenancy:
        return NodeTenancy(self.name, self.labels, self.tenants, self.exclusive_tenants)


@dataclass(frozen=True)
class ClusterView:
    nodes: list[NodeState]
    gpus: list[GpuState]


@dataclass(frozen=True)
class Placement:
    workload: str
    node: str | None
    gpu_index: int | None
    gamma: int
    record: DecisionRecord

    @property
    def outcome(self) -> str:
        return self.record.outcome

    @property
    def mode(self) -> str:
        return self.record.mode


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
        margin=policy.margin,
    )
    return req, off


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
    model, gpu = profiles.models.get(w.model), profiles.gpus.get(gpu_type)
    if model is None or gpu is None:
        return None
    model = w.stage_of(model)
    try:
        c = Coeffs.of(gpu, model, tensor_parallel_for(gpu, model))  # a stage's: its pod's GPUs
    except ValueError:
        return None
    req, _ = spec_request(profiles, policy, w)
    judged = max(headroom - policy.headroom_uncertainty, 0.0)
    taus = [tau_scalar(req.alpha, g) for g in range(max(req.gamma_max, gamma) + 1)]
    now = best_gamma(c, taus[: req.gamma_max + 1], req.seqs, req.context, req.draft_cost,
                     req.spec_overhead, req.margin, judged, math.inf, True)  # fmt: skip
    own, aggregate = speedup_at(
        c, taus, gamma, req.seqs, req.context, req.draft_cost, req.spec_overhead, judged
    )
    return Reevaluation(now.gamma, own, aggregate)


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
                gpu = self.profiles.gpus[t]
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
        if stale.size > SCALAR_UPDATE_LIMIT:
            self._evaluate(w.model_key, req, stale, cached)
        elif stale.size:
            self._evaluate_scalar(w.model_key, req, stale, cached)
        cached.version[stale] = self.version[stale]
        return cached

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

    def _never_fits(self, w: WorkloadRequest) -> str:
        """Why no node can ever take `w` (its pool, its sovereignty, its size), most specific first."""
        pool = self._pool(w)
        if not pool.any():
            return (
                "no node matches its flavor's node labels and every pod set's nodeSelector and "
                "required node affinity, with taints they tolerate"
            )
        sovereign = self.tenancy.permanent_mask(w.requirement) & pool
        if not sovereign.any():
            if w.jurisdiction is not None:
                return f"no node of its flavor and node constraints in jurisdiction {w.jurisdiction}"
            allowed = ", ".join(sorted(w.allowed_jurisdictions or ()))
            where = "no node of its flavor and node constraints in the jurisdictions its namespace allows"
            return f"{where} ({allowed})"
        m = self._model(w.model_key)
        fits = sovereign[self.gpu_node] & self._fits(w, m)
        if not fits.any():
            whole = sovereign[self.gpu_node] & m.fits
            if w.gpus is not None and whole.any():
                return (
                    f"{w.model_shown} fits no GPU of the nodes it may use on the {w.gpus // w.pods} "
                    f"GPUs each of its pods asks for (it needs {int(m.tp[whole].min())})"
                )
            return f"{w.model_shown} fits no GPU of the nodes it may use"
        need = int(w.gpus) if w.gpus is not None else int(m.tp[fits].min())
        largest = int(self.capacity[self.gpu_node[fits]].max())
        return f"it needs {need} GPUs on one node; the largest node it may use has {largest}"

    def place(self, w: WorkloadRequest, commit: bool = True, explain: bool = True) -> Placement:
        """Decide `w`; with `commit`, update the view as if it ran there. `explain` adds every term
        and every excluded node to the record (the operator's Event); a bulk tick can skip it."""
        if w.model not in self.profiles.models:
            return self._unplaced(w, "rejected", f"unknown model {w.model!r}", explain)
        if w.assigned is not None:
            return self._on_assignment(w, explain)
        key = (w.model_key, w.requirement, w.node_pool, w.gpus, w.pods)
        if key in self._exhausted:  # capacity only shrinks and tenancy only tightens as a view fills
            return self._unplaced(w, *self._exhausted[key], explain)
        mask = self.candidates(w)
        reserved = self._reserved(w, mask)
        if reserved.any() and not (mask & ~reserved).any():
            keep = self.policy.keep_whole_nodes_free
            why = f"the last {keep} empty node(s) of its pool are kept free for exclusive tenants"
            return self._unplaced(w, "retry", why, explain)
        mask &= ~reserved
        spread_why = None
        if not mask.any() and w.pods > 1 and w.gpus is not None:
            spread = self._spread(w, explain)
            if isinstance(spread, Placement):
                return spread
            spread_why = spread
        if not mask.any():
            m = self._model(w.model_key)
            permanent = (self.tenancy.permanent_mask(w.requirement) & self._pool(w))[self.gpu_node]
            fit = permanent & self._fits(w, m)
            whole = fit & (self.capacity[self.gpu_node] >= self._need(w, m))
            if spread_why is not None and w.gpus is not None and fit.any():
                # Spread, the pods need room for one each: the nodes it may ever use, by capacity.
                per_pod = w.gpus // w.pods
                nodes = np.zeros(len(self.node_names), dtype=np.bool_)
                nodes[self.gpu_node[fit]] = True
                most = int((self.capacity[nodes] // per_pod).sum())
                if most < w.pods:
                    why = f"its {w.pods} pods of {per_pod} GPUs never fit: the nodes it may use hold {most}"
                    self._exhausted[key] = ("rejected", why)
                else:
                    self._exhausted[key] = ("retry", spread_why)
            elif not whole.any():
                self._exhausted[key] = ("rejected", self._never_fits(w))
            else:
                self._exhausted[key] = ("retry", "no admissible node with free GPUs now")
            return self._unplaced(w, *self._exhausted[key], explain)

        req, off = self.spec_request(w)
        s = self._scores_for(w, req, mask).arrays
        cand = np.nonzero(mask)[0]
        away = np.zeros(cand.size, np.bool_)  # False sorts first: packing prefers home
        if self.policy.pack:
            # Fewest nodes. Exclusive work goes where its tenant already runs alone while that has
            # room: a second whole node is what the next exclusive tenant needs. Shared work goes
            # where work already runs when that costs at most the tolerance, else only on a tie.
            home = self.tenancy.alone(w.tenant) if w.exclusive else self.occupied
            at_home = home[self.gpu_node[cand]]
            tpot_all = s["tpot"][cand]
            near = at_home & (tpot_all <= (1.0 + self.policy.pack_tolerance) * tpot_all.min())
            if w.exclusive:
                near = at_home
            if (w.exclusive or self.policy.pack_tolerance > 0.0) and near.any():
                cand, at_home = cand[near], at_home[near]
            away = ~at_home
        tpot = s["tpot"][cand]
        tpot_q = quantize(tpot / tpot.min())
        head_q = quantize(self.headroom[cand])
        if w.latency_class == "latency":
            chosen = cand[_first_min(tpot_q, away, -head_q)]
        else:
            fits_own = tpot <= w.stage_slo_s if w.stage_slo_s is not None else np.ones(cand.size, np.bool_)
            keeps_neighbours = s["step_plain"][cand] <= self.slo_ratio[cand] * s["before"][cand]
            pool = np.ones(cand.size, np.bool_)
            for subset in (fits_own & keeps_neighbours, fits_own):
                if subset.any():
                    pool = subset
                    break
            local = np.nonzero(pool)[0]
            # Where it adds the most tokens per second to the cluster: its own rate, less what its
            # neighbours lose to the longer step (their plain-equivalent rate N/T before and after).
            idx = cand[local]
            gain = req.seqs / s["tpot"][idx] - s["bg_seqs"][idx] * (
                1.0 / s["before"][idx] - 1.0 / s["step"][idx]
            )
            gain_q = quantize(gain / np.abs(gain).max()) if np.abs(gain).max() > 0 else np.zeros(idx.size)
            chosen = int(idx[_first_min(-gain_q, away[local], tpot_q[local])])

        record = self._record(w, req, off, int(chosen), s, int(cand.size), mask, explain)
        if w.stages > 1 and w.pods > 1:  # a whole group on this node: a token passes every stage
            assert record.tpot_ms is not None  # every placed record has one
            record = replace(record, tpot_ms=w.stages * record.tpot_ms)
        if commit:
            g = int(chosen)
            self._commit(
                w, req, g, int(s["gamma"][g]), float(s["step"][g]), float(s["before"][g]), float(s["tpot"][g])
            )
        return Placement(w.name, record.node, record.gpu_index, record.gamma, record)

    # -- pods over several nodes --------------------------------------------------------------

    def _selectors(
        self, w: WorkloadRequest, pool: NDArray[np.bool_]
    ) -> list[tuple[dict[str, str], NDArray[np.bool_]]]:
        """Node labels that could pin `w`'s pods (one nodeSelector for all of them), with the nodes
        of its pool each selects: a jurisdiction's label, each value `w` may use; last, none (the
        whole pool, usable only where every node of it is one `w` may use, as any option)."""
        label = self.policy.jurisdiction_label
        values = sorted(
            {
                t.labels[label]
                for t, ok in zip(self._node_tenancy, pool, strict=True)
                if ok and label in t.labels
            }
        )
        allowed = self.tenancy.permanent_mask(w.requirement)
        out = []
        for value in values:
            nodes = pool & np.array(
                [t.labels.get(label) == value for t in self._node_tenancy], dtype=np.bool_
            )
            if (nodes & allowed).any():
                out.append(({label: value}, nodes))
        out.append(({}, pool))
        return out

    def _spread(self, w: WorkloadRequest, explain: bool) -> Placement | str:
        """`w`'s pods over several nodes, when no node has room for all of them.

        A check writes one nodeSelector per pod set, so the pods cannot be sent to named nodes: they
        are pinned by labels instead, and only by labels every node of which `w` may use now (its
        jurisdiction, no other tenant's exclusive node, and, for an exclusive tenant, nobody else's;
        the model fits all their GPUs), so that wherever the scheduler binds them, sovereignty
        holds. Each pod is placed as `place` would place it (its own GPUs on one node) and
        committed; if they do not all fit, nothing is. The pods share one mode and γ: the lowest
        any of them got (the load committed is each pod's own choice, never less). Without such
        labels with room now: why, per label."""
        assert w.gpus is not None
        per_pod = w.gpus // w.pods
        by_set = self._per_pod_set(w, per_pod, explain)
        if by_set is not None:
            return by_set
        fits = self._fits(w, self._model(w.model_key))
        now = self.tenancy.mask(w.requirement)
        why = []
        for selector, nodes in self._selectors(w, self._pool(w)):
            name = ", ".join(f"{k}={v}" for k, v in selector.items()) or "its flavor's nodes"
            barred = [n for n, ok in zip(self.node_names, nodes & ~now, strict=True) if ok]
            if barred:
                why.append(f"{name} selects {barred[0]}, which it may not use ({len(barred)} such)")
                continue
            if not fits[nodes[self.gpu_node]].all():
                why.append(f"{name} selects GPUs {w.model_shown} does not fit")
                continue
            room = int((self.free[nodes] // max(per_pod, 1)).sum())
            if room < w.pods:
                why.append(f"{name} has room for {room} of them now")
                continue
            one = replace(
                w,
                gpus=per_pod,
                pods=1,
                node_pool=frozenset(n for n, ok in zip(self.node_names, nodes, strict=True) if ok),
            )
            saved = self._save()
            placed = []
            for _ in range(w.pods):
                p = self.place(one, commit=True, explain=False)
                if p.outcome != "placed":
                    break
                placed.append(p)
            if len(placed) < w.pods:
                self._restore(saved)
                why.append(f"{name} took {len(placed)} of them")
                continue
            # A pod may be bound on any node the labels select: the tenant is there for tenancy's
            # sake (no other tenant's exclusive claim may land beside it), GPUs counted as planned.
            for i in np.nonzero(nodes)[0].tolist():
                self._hold(i, w)
            pinned = ", ".join(f"{k}={v}" for k, v in selector.items()) or "its flavor's nodes"
            return self._joint(w, placed, per_pod, f"over @, pinned by {pinned}", selector, explain)
        head = (
            f"no node has room for its {w.pods} pods of {per_pod} GPUs together, and no node label pins them"
        )
        return (
            f"{head} to nodes it may use with room: {'; '.join(why) or 'no node of its pool has the label'}"
        )

    def _per_pod_set(self, w: WorkloadRequest, per_pod: int, explain: bool) -> Placement | None:
        """`w`'s pods with each pod set on one node of its own, when it has several pod sets and
        each has a node with room for all its pods: a check writes one nodeSelector per pod set,
        so each is pinned by hostname and the workload holds those nodes only (pinned by a label,
        it would hold every node the label selects, and keep other tenants' exclusive work off
        all of them). Each pod is placed as `place` would place it and committed, the first of a
        pod set choosing its node; None (nothing committed) if some pod set finds none."""
        if len(w.pod_sets) < 2 or sum(w.pod_sets) != w.pods or per_pod < 1:
            return None
        saved = self._save()
        placed: list[Placement] = []
        nodes: list[str] = []
        one = replace(w, gpus=per_pod, pods=1, pod_sets=())
        pool = self._pool(w)
        for count in w.pod_sets:
            room = pool & (self.free >= count * per_pod)
            first = self.place(
                replace(
                    one, node_pool=frozenset(n for n, ok in zip(self.node_names, room, strict=True) if ok)
                ),
                commit=True,
                explain=False,
            )
            if first.outcome != "placed" or first.node is None:
                self._restore(saved)
                return None
            here = [first]
            for _ in range(count - 1):
                p = self.place(replace(one, node_pool=frozenset({first.node})), commit=True, explain=False)
                if p.outcome != "placed":
                    self._restore(saved)
                    return None
                here.append(p)
            placed += here
            nodes.append(first.node)
        index = {n: i for i, n in enumerate(self.node_names)}
        for node in set(nodes):
            self._hold(index[node], w)
        joint = self._joint(w, placed, per_pod, "over @, each pod set pinned to its node", {}, explain)
        return replace(joint, record=replace(joint.record, node_selector=None, pod_set_nodes=tuple(nodes)))

    def _on_assignment(self, w: WorkloadRequest, explain: bool) -> Placement:
        """`w`'s pods where Kueue's Topology Aware Scheduling assigned them (Kueue pins each pod to
        its domain itself). Sovereignty first: every node of every domain must be one `w` may use
        now, inside its pool, else Retry naming it (Kueue evicts the workload and assigns afresh:
        never Ready on a node it may not use). Then each pod is placed in its domain as `place`
        would place it and committed; all or none. One mode and γ: the lowest any pod got."""
        assert w.assigned is not None
        total = sum(count for _, count in w.assigned)
        if total < 1:
            return self._unplaced(w, "retry", "Kueue's topology assignment places none of its pods", explain)
        index = {n: i for i, n in enumerate(self.node_names)}
        now = self.tenancy.mask(w.requirement)  # as this tick has filled the view so far
        for nodes, _ in w.assigned:
            if not nodes:
                return self._unplaced(
                    w, "retry", "Kueue's topology assignment names a domain no node carries", explain
                )
            for node in sorted(nodes):
                i = index.get(node)
                if i is None:
                    why = f"Kueue's topology assignment puts pods on {node}, which is not a known GPU node"
                    return self._unplaced(w, "retry", why, explain)
                if not now[i]:
                    broken = check_node(w.requirement, self._node_tenancy[i], self.policy.jurisdiction_label)
                    detail = (
                        f"{broken.constraint}: {broken.detail}"
                        if broken is not None
                        else "tenancy: another tenant was placed there in this tick"
                    )
                    why = f"Kueue's topology assignment puts pods on {node}, which it may not use: {detail}"
                    return self._unplaced(w, "retry", why, explain)
                if w.node_pool is not None and node not in w.node_pool:
                    why = f"Kueue's topology assignment puts pods on {node}, outside its flavor's nodes"
                    return self._unplaced(w, "retry", why, explain)
        per_pod = w.gpus // total if w.gpus is not None else None
        saved = self._save()
        placed: list[Placement] = []
        for nodes, count in w.assigned:
            one = replace(w, gpus=per_pod, pods=1, node_pool=nodes, assigned=None)
            for _ in range(count):
                p = self.place(one, commit=True, explain=False)
                if p.outcome != "placed":
                    self._restore(saved)
                    where = ", ".join(sorted(nodes))
                    why = (
                        f"{where}, where Kueue's topology assignment puts a pod, has no room for it "
                        f"now: {p.record.reason}"
                    )
                    return self._unplaced(w, "retry", why, explain)
                placed.append(p)
        return self._joint(w, placed, per_pod, "on Kueue's topology assignment, over @", {}, explain)

    def _joint(
        self,
        w: WorkloadRequest,
        placed: list[Placement],
        per_pod: int | None,
        how: str,
        selector: Mapping[str, str],
        explain: bool,
    ) -> Placement:
        """One decision for pods placed one by one: one mode and γ, the lowest any got (the load
        committed is each pod's own choice, never less). `how` says where, @ standing for the GPUs."""
        worst = min(placed, key=lambda p: p.gamma)  # the first of the lowest γ
        pods = tuple((p.node or "", int(p.gpu_index or 0), p.gamma) for p in placed)
        shown = ", ".join(f"{n}/gpu{g}" for n, g, _ in pods)
        size = f" of {per_pod} GPUs" if per_pod is not None else ""
        what = f"{len(placed)} pods{size}"
        tpot = worst.record.tpot_ms
        if w.stages > 1:
            # One engine: a token passes every stage in turn, so its TPOT is their sum.
            what = f"one engine in {w.stages} pipeline stages{size}"
            tpot = sum(p.record.tpot_ms for p in placed if p.record.tpot_ms is not None)
        record = replace(
            worst.record,
            workload=w.name,
            reason=f"{what} {how.replace('@', shown)}; {worst.record.reason}",
            pods=pods,
            node_selector=dict(selector),
            tpot_ms=tpot,
        )
        if explain:
            record = replace(record, excluded=self._excluded(w, None))
        return Placement(w.name, worst.node, worst.gpu_index, worst.gamma, record)

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

    def _held_back(self, w: WorkloadRequest, req: SpecRequest, mask: NDArray[np.bool_]) -> dict[str, str]:
        """Candidate GPUs where the objective wanted speculation and a neighbour's SLO refused it."""
        out: dict[str, str] = {}
        if req.gamma_max == 0:
            return out
        idx = np.nonzero(mask)[0]
        table, _ = self._table(w.model_key, req, idx)
        # Per GPU, the objective's own favourite γ (as `optimiser.blocker`, all columns at once).
        free = np.argmax(quantize(table.aggregate), axis=0)
        refused = (free > 0) & ~table.externality_ok[free, np.arange(idx.size)]
        for col in np.nonzero(refused)[0][:EXPLAIN_LIMIT].tolist():
            g = int(idx[col])
            where = f"{self.node_names[int(self.gpu_node[g])]}/gpu{int(self.gpu_index[g])}"
            gamma = int(table.gammas[free[col]])
            out[where] = f"γ={gamma} would push neighbour {self.binding[g]} past its TPOT SLO"
        return out

    def _excluded(self, w: WorkloadRequest, mask: NDArray[np.bool_] | None) -> dict[str, str]:
        out: dict[str, str] = {}
        skipped = 0
        usable_nodes = set(self.gpu_node[mask].tolist()) if mask is not None else set()
        m = self._models.get(w.model_key)
        for i, tenancy in enumerate(self._node_tenancy):
            if i in usable_nodes:
                continue
            why = check_node(w.requirement, tenancy, self.policy.jurisdiction_label)
            if w.node_pool is not None and tenancy.name not in w.node_pool:
                text = "node-pool: not selected by the workload's flavor or nodeSelector"
            elif why is not None:
                text = f"{why.constraint}: {why.detail}"
            elif m is not None and not self._fits(w, m)[self.gpu_node == i].any():
                text = f"capacity: {w.model_shown} does not fit this node's GPUs"
            elif i in self._unavailable:
                text = f"unavailable: {self._unavailable[i]}"
            else:
                text = "capacity: not enough free GPUs"
            if len(out) < EXPLAIN_LIMIT:
                out[tenancy.name] = text
            else:
                skipped += 1
        if skipped:
            out["..."] = f"{skipped} more nodes excluded"
        return out

    def _unplaced(
        self, w: WorkloadRequest, outcome: Literal["retry", "rejected"], why: str, explain: bool
    ) -> Placement:
        record = DecisionRecord(
            workload=w.name,
            tenant=w.tenant,
            outcome=outcome,
            mode="plain",
            gamma=0,
            reason=why,
            alpha=w.alpha,
            excluded=self._excluded(w, None) if explain else {},
        )
        return Placement(w.name, None, None, 0, record)

    def _record(
        self,
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
        where = {
            "workload": w.name,
            "tenant": w.tenant,
            "outcome": "placed",
            "mode": "speculative" if gamma > 0 else "plain",
            "gamma": gamma,
            "node": self.node_names[int(self.gpu_node[g])],
            "gpu_index": int(self.gpu_index[g]),
            "gpu_type": self.gpu_types[int(self.gpu_type[g])],
            "alpha": w.alpha,
            "tpot_ms": 1e3 * float(s["tpot"][g]),
            "candidates": n_candidates,
            # What the engine hand-off judges its per-batch table at (`core.handoff.handoff`).
            "headroom": None if bool(self.stale[g]) else float(self.headroom[g]),
            "headroom_measured": None if bool(self.stale[g]) else float(self.measured[g]),
            "background_seqs": float(s["bg_seqs"][g]),  # at the pessimistic reading
            "neighbour_slo_ratio": float(self.slo_ratio[g]),
            "step_before_ms": 1e3 * float(s["before"][g]),
        }
        if not explain:  # a tick's bulk decisions: where and how, without the breakdown
            return DecisionRecord(reason="speculative" if gamma > 0 else "plain", **where)  # type: ignore[arg-type]
        cautious = bool(s["cautious"][g])
        table, _ = self._table(w.model_key, req, np.array([g]), cautious=cautious)
        why_not = blocker(table)
        stale = bool(self.stale[g])
        binding = self.binding[g] if math.isfinite(self.slo_ratio[g]) else None
        if gamma > 0:
            reason = (
                f"γ*={gamma} maximises the GPU's token rate with S_real ≥ {1 + req.margin:.2f} "
                f"and every neighbour within its TPOT SLO"
            )
        elif off:
            reason = off
        elif stale:
            reason = "no fresh telemetry for this GPU: plain decode until it returns"
        elif why_not.by_externality:
            reason = f"γ={why_not.gamma} would push neighbour {binding} past its TPOT SLO: plain decode"
        elif why_not.by_self_benefit:
            reason = f"no γ reaches S_real ≥ {1 + req.margin:.2f} at this headroom: plain decode"
        elif self.headroom[g] <= self.policy.headroom_uncertainty:
            reason = "no γ raises the GPU's token rate at this headroom (saturated): plain decode"
        else:
            reason = (
                f"no γ raises the GPU's token rate at headroom {float(self.headroom[g]):.2f} "
                "(the drafts cost more than they save at this load): plain decode"
            )
        gpu = self.profiles.gpus[where["gpu_type"]]  # type: ignore[index]
        tp = int(self._model(w.model_key).tp[g])
        low, high = gpu.compute_range
        model = w.stage_of(self.profiles.models[w.model])
        r_low, r_point, r_high = (
            float(roofline_for(replace(gpu, compute_efficiency=ce), model, tp).ridge_seqs(req.context))
            for ce in (low, gpu.compute_efficiency, high)
        )
        ridge = (r_low, r_point, r_high)
        if cautious:
            reason += (
                f" (near the compute ridge, which the calibration places at {ridge[0]:.0f}-{ridge[2]:.0f} "
                f"sequences here: γ decided at the low end of its compute efficiency, {low:.3g} "
                f"against {gpu.compute_efficiency:.3g})"
            )
        h = where["headroom"]
        return DecisionRecord(
            reason=reason,
            ridge_seqs=ridge,
            headroom_pessimistic=None if h is None else max(float(h) - self.policy.headroom_uncertainty, 0.0),
            tau=float(table.taus[gamma]),
            step_plain_ms=1e3 * float(s["step_plain"][g]),
            step_ms=1e3 * float(s["step"][g]),
            speedup=float(table.speedup[gamma, 0]),
            aggregate_speedup=float(table.aggregate[gamma, 0]),
            unconstrained_gamma=why_not.gamma,
            binding_neighbour=binding,
            neighbour_step_ratio=float(s["step"][g] / s["before"][g]),
            excluded=self._excluded(w, mask),
            held_back=self._held_back(w, req, mask),
            **where,  # type: ignore[arg-type]
        )


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


def _headroom(g: GpuState) -> float:
    if g.headroom is not None:
        return g.headroom
    return 0.0 if g.stale_estimate is None else g.stale_estimate


def tick_order(w: WorkloadRequest) -> tuple[bool, float, str]:
    """Latency work first, then the most likely to gain (highest α), then by name."""
    return (w.latency_class != "latency", -w.alpha, w.name)


def _first_min(primary: NDArray[np.float64], *then: NDArray[Any]) -> int:
    """The first position minimising (primary, *then) in that order; GPUs are in (node name, index)
    order."""
    best = primary == primary.min()
    for key in then:
        if best.sum() <= 1:
            break
        masked = np.where(best, key, np.inf)
        best &= masked == masked.min()
    return int(np.argmax(best))


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
