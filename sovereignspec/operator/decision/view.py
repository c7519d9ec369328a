"""The cluster as the core sees it, rebuilt from API objects at every tick: nodes with their
telemetry, the placement ledger (`ledger`) and the workloads waiting for a decision (`requests`),
read from what one tick saw (`world.World`).

Every object is read on its own: one that cannot be read fails alone (its workload is Rejected
with the reason, or its node is left out), never the tick.

This module does no I/O: it takes plain dicts (as the API returns them) and returns plain data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from sovereignspec.core.cluster import ClusterView, GpuState, NodeState
from sovereignspec.core.placement import tick_order
from sovereignspec.core.roofline import headroom_from_tensor_activity
from sovereignspec.core.running import LedgerMemo, neighbour_bound, with_ledger_load
from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border.nodes import PoolMemo, assigned_pool, node_pool
from sovereignspec.operator.border.objects import NodeView
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.workloads import (
    UnreadableFieldError,
    active,
    condition,
    named,
    our_entry,
)
from sovereignspec.operator.border.world import World, safe_key, tenancy_of
from sovereignspec.operator.decision.ledger import (
    Aging,
    Committed,
    Drift,
    aged,
    bound_elsewhere,
    count_where_bound,
    drifted,
    foreign_pods,
    ledger_entries,
    planned_nodes,
)
from sovereignspec.operator.decision.requests import PendingWorkload, pending_workload, unreadable
from sovereignspec.telemetry.snapshot import TENSOR_METRICS, GpuReading, Snapshot

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass
class View:
    cluster: ClusterView
    committed: list[Committed]
    pending: list[PendingWorkload]
    stale_reason: str | None  # why telemetry could not be used, if it could not
    gpu_headroom: dict[tuple[str, int], float | None] = field(default_factory=dict)
    drift: list[Drift] = field(default_factory=list)
    hostnames: dict[str, str] = field(default_factory=dict)  # node name -> kubernetes.io/hostname
    errors: list[str] = field(default_factory=list)  # objects that could not be read
    aging: list[Aging] = field(default_factory=list)  # running speculative work judged again now
    # Pods of ours bound where their decision did not plan them (the scheduler's choice among the
    # nodes a spread workload is pinned to): counted there as well until they end.
    bound_elsewhere: list[Drift] = field(default_factory=list)


def first_placements(view: View, limit: int) -> tuple[View, int]:
    """The view with at most `limit` of its workloads to place, the first in the core's tick order
    (`Placer.tick`), and how many are left for the next tick. Placed in that order, the first
    `limit` get what they would get in one tick over all of them; the rest are placed next tick,
    against a ledger that holds these. Workloads not to be placed (waiting, unreadable) all stay:
    their writes are cheap. Why: a tick writes nothing until it has planned and recorded all it
    holds, so a backlog of thousands (a new leader's first tick) would hold back every decision."""
    placeable = sorted(
        (tick_order(p.request), i)
        for i, p in enumerate(view.pending)
        if p.request is not None and p.waiting is None
    )
    if len(placeable) <= limit:
        return view, 0
    later = {i for _, i in placeable[limit:]}
    return replace(view, pending=[p for i, p in enumerate(view.pending) if i not in later]), len(later)


def reading_headroom(
    reading: GpuReading | None, efficiency: float, now: float, staleness: float
) -> float | None:
    """A GPU's headroom from its activity reading (None: no reading, or one older than `staleness`)."""
    if reading is None or now - reading.observed_at > staleness:
        return None
    scale = efficiency if reading.metric in TENSOR_METRICS else 1.0
    return float(headroom_from_tensor_activity(reading.activity, scale))


def build(
    world: World,
    checks: set[str],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    now: float,
    ledger_memo: LedgerMemo | None = None,
) -> View:
    """The view for one policy group (`checks`): its pending workloads, and the cluster-wide
    ledger (every check this controller serves). `ledger_memo`, kept by the caller from one view
    to the next, spares recomputing the load of GPUs whose placements did not change."""
    errors: list[str] = []
    hostnames, by_host = _hostnames(world.node_views)
    tenancy = _Tenancies(world)
    committed, pending, missing_nodes = _read_workloads(
        world, checks, policy, profiles, snapshot, hostnames, by_host, tenancy, errors
    )
    misbound: list[tuple[str, str, str]] = []
    moved: dict[int, str] = {}
    pods_by_node = foreign_pods(world, committed, tenancy, policy, errors, misbound, moved)
    planned = planned_nodes(committed)  # before any is counted where bound
    count_where_bound(committed, moved)
    cluster, headroom, stale_reason = _cluster(
        world.node_views, committed, pods_by_node, policy, profiles, snapshot, now, errors
    )
    cluster = with_ledger_load(
        cluster,
        [(c.request, c.node, c.gpu_index, c.gamma) for c in committed if c.node in hostnames],
        profiles,
        ledger_memo,
    )
    drift = drifted(committed, cluster, policy, missing_nodes)
    elsewhere = bound_elsewhere(committed, cluster, policy, misbound, drift, planned)
    drift += [d for d in elsewhere if d.event == "SovereigntyDrift"]
    bound = [d for d in elsewhere if d.event != "SovereigntyDrift"]
    aging = aged(committed, cluster, headroom, world, policy, profiles)
    return View(cluster, committed, pending, stale_reason, headroom, drift, hostnames, errors, aging, bound)


def _hostnames(nodes: Sequence[NodeView]) -> tuple[dict[str, str], dict[str, str]]:
    """Node name -> its hostname label (the name where it has none), and hostname -> the first
    node that carries it."""
    hostnames: dict[str, str] = {}
    by_host: dict[str, str] = {}
    for n in nodes:
        hostnames[n.name] = n.hostname
        by_host.setdefault(n.hostname, n.name)
    return hostnames, by_host


class _Tenancies:
    """A namespace's tenancy under a policy, read once per view."""

    def __init__(self, world: World) -> None:
        self.world = world
        self._memo: dict[tuple[str, int], ann.Tenancy] = {}

    def __call__(self, namespace: str, spec: PolicySpec) -> ann.Tenancy:
        key = (namespace, id(spec))
        if key not in self._memo:
            self._memo[key] = tenancy_of(namespace, self.world.namespaces.get(namespace), spec)
        return self._memo[key]


def _read_workloads(
    world: World,
    checks: set[str],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    hostnames: dict[str, str],
    by_host: dict[str, str],
    tenancy: _Tenancies,
    errors: list[str],
) -> tuple[list[Committed], list[PendingWorkload], dict[str, Committed]]:
    """The ledger (every Ready entry of a check we serve), the group's pending workloads, and the
    ledger's entries on nodes that no longer exist."""
    ours = frozenset(world.policies) | frozenset(checks)
    committed: list[Committed] = []
    pending: list[PendingWorkload] = []
    missing_nodes: dict[str, Committed] = {}
    pools: PoolMemo = {}
    for wl in world.workloads:
        try:
            entry = our_entry(wl, ours)
            if entry is None or condition(wl, "Finished"):
                continue
            state = entry.get("state")
            if state == "Ready":
                spec = world.policies.get(str(entry.get("name")), policy)
                try:
                    pool, _ = node_pool(wl, world.node_views, world.flavors, world.flavor_tolerations, pools)
                except UnreadableFieldError:  # decided once, unreadable now: its reach is every node
                    pool = frozenset(hostnames)
                pool = assigned_pool(wl, world.node_views, pool)
                for done in ledger_entries(
                    wl, entry, spec, profiles, snapshot, pool, by_host, tenancy, world, errors
                ):
                    committed.append(done)
                    if done.node not in hostnames:
                        missing_nodes[done.key] = done
            elif (
                state == "Pending"
                and entry.get("name") in checks
                and condition(wl, "QuotaReserved")
                and active(wl)
            ):
                pending.append(pending_workload(wl, entry, policy, profiles, snapshot, world, tenancy, pools))
        except Exception as exc:  # one unreadable object fails alone
            errors.append(f"Workload {safe_key(wl)}: {type(exc).__name__}: {exc}")
            if isinstance(wl, dict) and named(wl):
                entry = our_entry(wl, frozenset(checks)) or {}
                if entry.get("state") == "Pending" and condition(wl, "QuotaReserved"):
                    pending.append(unreadable(wl, entry, f"{type(exc).__name__}: {exc}"))
    return committed, pending, missing_nodes


def _stale_reason(policy: PolicySpec, snapshot: Snapshot, now: float) -> str | None:
    """Why no GPU's reading counts this tick (every GPU judged stale), or None."""
    staleness = policy.telemetry.staleness_seconds
    if policy.telemetry.source == "none":
        return "telemetry is off in this policy (source: none)"
    if snapshot.error and not snapshot.gpus:
        return snapshot.error
    if now - snapshot.fetched_at > staleness:
        return f"telemetry last read {now - snapshot.fetched_at:.0f}s ago (limit {staleness:.0f}s)"
    return None


def _cluster(
    nodes: Sequence[NodeView],
    committed: list[Committed],
    pods_by_node: Mapping[str, list[tuple[str, int]]],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    now: float,
    errors: list[str],
) -> tuple[ClusterView, dict[tuple[str, int], float | None], str | None]:
    staleness = policy.telemetry.staleness_seconds
    stale_reason = _stale_reason(policy, snapshot, now)

    by_gpu: dict[tuple[str, int], list[Committed]] = defaultdict(list)
    by_node: dict[str, list[Committed]] = defaultdict(list)
    reaching: dict[str, list[Committed]] = defaultdict(list)  # tenancy only: spread pods may land there
    for c in committed:
        by_gpu[(c.node, c.gpu_index)].append(c)
        by_node[c.node].append(c)
        for name in c.reach:
            reaching[name].append(c)

    node_states: list[NodeState] = []
    gpu_states: list[GpuState] = []
    headroom_out: dict[tuple[str, int], float | None] = {}
    for node in nodes:
        if node.gpu_error:
            errors.append(node.gpu_error)
        name, host, count = node.name, node.hostname, node.gpus
        gpu_type = policy.profiles.gpu_products.get(node.labels.get(GPU_PRODUCT_LABEL, ""))
        if gpu_type not in profiles.gpus or count <= 0:
            continue
        efficiency = profiles.gpus[gpu_type].compute_efficiency
        for gi in range(count):
            reading = None if stale_reason else snapshot.gpus.get((host, gi)) or snapshot.gpus.get((name, gi))
            headroom = reading_headroom(reading, efficiency, now, staleness)
            headroom_out[(name, gi)] = headroom
            ratio, binding = neighbour_bound(
                (c.key, c.request.tpot_slo_s, snapshot.tpot.get((c.namespace, c.job)) or c.predicted_tpot_s)
                for c in by_gpu.get((name, gi), [])
            )
            gpu_states.append(GpuState(name, gi, gpu_type, headroom, ratio, binding))
        mine = by_node.get(name, [])
        foreign = pods_by_node.get(name, [])
        used = sum(count if c.gpus < 0 else c.gpus for c in mine) + sum(g for _, g in foreign)
        unavailable = node.unavailable
        free = 0 if unavailable else max(count - used, 0)
        holders = mine + reaching.get(name, [])
        tenants = frozenset(c.request.tenant for c in holders) | frozenset(t for t, _ in foreign)
        exclusive = frozenset(c.request.tenant for c in holders if c.request.exclusive)
        node_states.append(NodeState(name, node.labels, free, tenants, exclusive, count, unavailable))
    return ClusterView(node_states, gpu_states), headroom_out, stale_reason
