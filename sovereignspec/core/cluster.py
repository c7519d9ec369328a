"""What the placer reads and returns: the cluster as plain data (nodes, GPUs with their readings),
the workloads asking to be placed, the settings a policy gives it, and a placement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
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
from sovereignspec.core.roofline import pipeline_stage
from sovereignspec.core.sovereignty import DEFAULT_JURISDICTION_LABEL, NodeTenancy, Requirement
from sovereignspec.core.specs import ModelSpec

LatencyClass = Literal["latency", "throughput"]
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


def first_min(primary: NDArray[np.float64], *then: NDArray[Any]) -> int:
    """The first position minimising (primary, *then) in that order; GPUs are in (node name, index)
    order."""
    best = primary == primary.min()
    for key in then:
        if best.sum() <= 1:
            break
        masked = np.where(best, key, np.inf)
        best &= masked == masked.min()
    return int(np.argmax(best))
