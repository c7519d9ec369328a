"""The placement ledger, built only from facts users cannot forge:

- our own admission-check entries (status, written by us) on every Workload that is not finished,
  for every AdmissionCheck this controller serves, whichever policy it uses: the node in the
  podSetUpdates' nodeSelector, the GPU and γ in their annotations;
- Pods bound to a node (`spec.nodeName`) that request GPUs and belong to no ledger entry on that
  node: their GPUs are taken, and their namespace's tenant runs there.

Never from pod-template annotations: a template is the user's to write. And what drifted from it:
entries whose node no longer satisfies their sovereignty requirement, pods bound where they were
not planned, running speculative work judged again at its GPU's reading now.

No I/O: plain dicts in, plain data out.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sovereignspec.core.cluster import ClusterView, NodeState, WorkloadRequest
from sovereignspec.core.running import reevaluate
from sovereignspec.core.sovereignty import Exclusion, NodeTenancy, check_node
from sovereignspec.core.specs import ProfileSet
from sovereignspec.engines import handed_table
from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border import kinds
from sovereignspec.operator.border.objects import PodView, object_owners
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.workloads import (
    UnreadableFieldError,
    job_name,
    key_of,
    labels_match,
    namespace_of,
    owner_key,
    parse_time,
    requested_gpus,
)
from sovereignspec.operator.border.world import TenancyOf, World
from sovereignspec.operator.decision.requests import declared_request
from sovereignspec.telemetry.snapshot import Snapshot

MAX_GAMMA = 32
POD_OWNERS = frozenset(k.name for k in kinds.KINDS if k.pods_owned)  # named by their pods as owner


@dataclass(frozen=True)
class Committed:
    key: str
    namespace: str
    job: str
    node: str
    gpu_index: int
    gamma: int
    gpus: int
    request: WorkloadRequest
    decided_at: float
    predicted_tpot_s: float | None
    check: str = ""
    workload: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    entry: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    part: int = 0  # which of a spread workload's pods (each has an entry of its own)
    # A spread workload's reach: every node its labels select, where a pod may be bound (tenancy).
    reach: frozenset[str] = frozenset()
    mode: str | None = None  # the mode it handed its pods (None: an entry without our annotation)
    largest_budget: int | None = None  # `handed`'s: the most draft tokens per step it allows


def handed(notes: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """What a decision's annotations hand its engines: the mode, and the most draft tokens per step
    (its budget at the declared batch, or its per-batch table's largest where lighter batches draft
    more; None: no budget written, e.g. a decision of an older version, or an unreadable one)."""
    mode = notes.get(ann.OUT_MODE)
    try:
        budget = int(str(notes[ann.OUT_BUDGET]))
    except (KeyError, ValueError):
        return (None if mode is None else str(mode)), None
    short = {str(k)[len(ann.PREFIX) :]: str(v) for k, v in notes.items() if str(k).startswith(ann.PREFIX)}
    largest = max([budget, *(k for _, _, k in handed_table(short))])
    return (None if mode is None else str(mode)), largest


@dataclass(frozen=True)
class Drift:
    """A running workload whose node no longer satisfies its sovereignty requirement (or, with
    `event` BoundElsewhere, one whose pod the scheduler bound where it was not planned)."""

    committed: Committed
    why: str
    event: str = "SovereigntyDrift"


@dataclass(frozen=True)
class Aging:
    """A running speculative workload judged again at its GPU's reading now."""

    committed: Committed
    headroom: float
    gamma_now: int  # what SovereignSpec would choose on that GPU now
    speedup_in_force: float  # its own S_real at the γ it runs, now
    aggregate_in_force: float  # the GPU's aggregate speed-up at that γ, now: below 1, a net loss


def aged(
    committed: list[Committed],
    cluster: ClusterView,
    headroom: Mapping[tuple[str, int], float | None],
    world: World,
    policy: PolicySpec,
    profiles: ProfileSet,
) -> list[Aging]:
    types = {(g.node, g.index): g.gpu_type for g in cluster.gpus}
    out = []
    for c in committed:
        h = headroom.get((c.node, c.gpu_index))
        gpu_type = types.get((c.node, c.gpu_index))
        if c.gamma <= 0 or h is None or gpu_type is None:
            continue  # plain, or nothing to judge it by: no claim either way
        spec = world.policies.get(c.check, policy)
        again = reevaluate(profiles, spec.placer_settings(), c.request, gpu_type, c.gamma, h)
        if again is not None:
            out.append(Aging(c, h, again.gamma_now, again.speedup_in_force, again.aggregate_in_force))
    return out


def planned_nodes(committed: list[Committed]) -> dict[str, set[str]]:
    """Workload key -> the nodes its entries name."""
    planned: dict[str, set[str]] = defaultdict(set)
    for c in committed:
        planned[c.key].add(c.node)
    return planned


def count_where_bound(committed: list[Committed], moved: dict[int, str]) -> None:
    """Entries whose pods were bound elsewhere (`moved`: index -> node) are counted where bound, on
    a GPU no other entry there names."""
    if not moved:
        return
    taken: dict[str, Counter[int]] = defaultdict(Counter)
    for c in committed:
        taken[c.node][c.gpu_index] += 1
    for i, node in moved.items():
        old = committed[i]
        taken[old.node][old.gpu_index] -= 1
        names = {g for g, n in taken[node].items() if n > 0}
        index = min(set(range(len(names) + 1)) - names)
        taken[node][index] += 1
        committed[i] = replace(old, node=node, gpu_index=index)


def _int(text: object, low: int, high: int, default: int) -> int:
    if isinstance(text, str) and ann.INTEGER_RE.fullmatch(text):
        return min(max(int(text), low), high)
    return default


def ledger_entries(
    wl: dict[str, Any],
    entry: dict[str, Any],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    pool: frozenset[str],
    by_host: Mapping[str, str],
    tenancy: TenancyOf,
    world: World,
    errors: list[str],
) -> list[Committed]:
    """The ledger's entries from our check entry (one per node it was counted on: one, or each
    spread pod's); the workload's own fields only for its load."""
    updates = [u for u in entry.get("podSetUpdates") or [] if isinstance(u, dict)]
    for update in updates:
        notes = update.get("annotations") or {}
        host = (update.get("nodeSelector") or {}).get(ann.HOSTNAME)
        # Spread pods are counted where `nodes` says, whether their pod sets are pinned by a label
        # or each by its node's hostname.
        spread = _spread_pods(notes.get(ann.OUT_NODES))
        if not host and not spread:
            continue
        node = by_host.get(str(host), str(host))
        request, gpus = _counted_request(wl, policy, profiles, snapshot, pool, tenancy, world, errors)
        predicted = _decimal_ms(notes.get(ann.OUT_TPOT))
        mode, largest = handed(notes)
        where = [(node, _int(notes.get(ann.OUT_GPU_INDEX), 0, 1024, 0))]
        reach: frozenset[str] = frozenset()
        if spread:  # each pod where it was counted, with its share of the GPUs
            where = [(by_host.get(h, h), g) for h, g in spread]
            reach = _reach(world, pool, updates)
            gpus = gpus // len(spread) if gpus > 0 else gpus
            request = replace(request, gpus=gpus if gpus > 0 else request.gpus, pods=1)
        return [
            Committed(
                key=key_of(wl),
                namespace=namespace_of(wl),
                job=job_name(wl),
                node=on,
                gpu_index=index,
                gamma=_int(notes.get(ann.OUT_BUDGET), 0, MAX_GAMMA, 0),
                gpus=gpus,  # -1: unknown, counts as the whole node
                request=request,
                decided_at=parse_time(notes.get(ann.OUT_DECIDED_AT)),
                predicted_tpot_s=predicted,
                check=str(entry.get("name", "")),
                workload=wl,
                entry=entry,
                part=part,
                reach=reach,
                mode=mode,
                largest_budget=largest,
            )
            for part, (on, index) in enumerate(where)
        ]
    return []


def _counted_request(
    wl: dict[str, Any],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    pool: frozenset[str],
    tenancy: TenancyOf,
    world: World,
    errors: list[str],
) -> tuple[WorkloadRequest, int]:
    """The request a decided workload is counted with, and its GPUs (-1: unknown). Decided once
    and unreadable now: counted all the same, holding its node (fail closed)."""
    t = tenancy(namespace_of(wl), policy)
    try:
        owner = world.owners.get(owner_key(wl))
        _, request, _ = declared_request(wl, policy, profiles, snapshot, pool, t, owner)
        gpus = requested_gpus(wl)
    except UnreadableFieldError as exc:
        errors.append(f"Workload {key_of(wl)}: {exc}")
        request, gpus = None, -1
    if request is None:
        d = policy.defaults
        request = WorkloadRequest(
            key_of(wl), t.tenant, d.model, None, d.acceptance_rate, exclusive=True, node_pool=pool
        )
    return request, gpus


def _decimal_ms(text: object) -> float | None:
    """A time we wrote in milliseconds, in seconds; None if it is not one."""
    try:
        return float(text) / 1e3 if isinstance(text, str) and ann.DECIMAL_RE.fullmatch(text) else None
    except ValueError:
        return None


def _reach(world: World, pool: frozenset[str], updates: list[dict[str, Any]]) -> frozenset[str]:
    """Where a spread workload's pods may be bound: every node of its pool that some pod set's
    nodeSelector selects."""
    selectors = [{str(k): str(v) for k, v in (u.get("nodeSelector") or {}).items()} for u in updates] or [{}]
    return frozenset(
        n.name
        for n in world.node_views
        if n.name in pool and any(labels_match(n.labels, selector) for selector in selectors)
    )


def _spread_pods(text: object) -> list[tuple[str, int]]:
    """`ann.OUT_NODES` ("host/gpu,host/gpu"), as we wrote it; [] if it is not that."""
    if not isinstance(text, str) or not text:
        return []
    out = []
    for item in text.split(","):
        host, _, index = item.rpartition("/")
        if not host or not ann.INTEGER_RE.fullmatch(index):
            return []
        out.append((host, min(int(index), 1024)))
    return out


def foreign_pods(
    world: World,
    committed: list[Committed],
    tenancy: TenancyOf,
    policy: PolicySpec,
    errors: list[str],
    misbound: list[tuple[str, str, str]],
    moved: dict[int, str],
) -> dict[str, list[tuple[str, int]]]:
    """Per node: (tenant, GPUs) of bound GPU pods that no ledger entry on that node accounts for.
    An entry accounts for its own pods on its node up to the GPUs it counted there (all of a
    workload's on one node; one pod's share for each pod of a spread one). A spread pod the
    scheduler bound off its plan on a node its labels select takes one of its workload's planned
    spots that no pod holds: `moved` (entry index -> the node it is bound on) says where that entry
    now counts, so the ledger learns the real binding instead of counting the pod twice. Beyond
    that, a pod is counted as its tenant's (never under-counted)."""
    room, by_owner, entries = _rooms(committed)
    out: dict[str, list[tuple[str, int]]] = defaultdict(list)
    off_plan: list[tuple[str, str, int, list[str], str]] = []  # (node, Pod, GPUs, Workloads, namespace)
    for pod in world.pod_views:
        if pod.running and pod.gpu_error is not None:
            errors.append(f"Pod {pod.namespace}/{pod.name}: {pod.gpu_error}")
            continue
        bound = _bound_gpu_pod(pod, by_owner)  # read from the view: nothing left to fail
        if bound is None:
            continue
        node, _, gpus, keys, _ = bound
        key = next((k for k in ((wl, node) for wl in keys) if room.get(k, 0.0) >= gpus), None)
        if key is None:
            off_plan.append(bound)
        else:
            room[key] -= gpus
    # Once every pod bound where planned has taken its spot: the others, each into a free spot of
    # its workload (of its size) if one is left, else counted as its tenant's.
    for node, name, gpus, keys, namespace in off_plan:
        try:
            ours = next((wl for wl in keys if wl in entries), None)
            if ours is not None:  # (Workload, Pod, node)
                misbound.append((ours, name, node))
            spot = next(
                (
                    i
                    for wl in keys
                    for i in entries.get(wl, ())
                    if committed[i].gpus == gpus
                    and node in committed[i].reach  # where its labels let the scheduler put it
                    and room[(wl, committed[i].node)] >= gpus
                    and i not in moved
                ),
                None,
            )
            if spot is not None:
                room[(committed[spot].key, committed[spot].node)] -= gpus
                moved[spot] = node
                continue
            out[node].append((tenancy(namespace, policy).tenant, gpus))
        except Exception as exc:
            errors.append(f"Pod {namespace}/{name}: {type(exc).__name__}: {exc}")
    return out


Rooms = tuple[
    dict[tuple[str, str], float],  # (Workload key, node) -> GPUs its entries counted there
    dict[tuple[str, str, str], list[str]],  # (namespace, owner kind, owner name) -> Workload keys
    dict[str, list[int]],  # Workload key -> its entries' indices
]


def _rooms(committed: list[Committed]) -> Rooms:
    """Room per (Workload, node); a Pod finds its Workload by Kueue's prebuilt label (a
    StatefulSet's, a LeaderWorkerSet group's), by its Job or StatefulSet, or as itself."""
    room: dict[tuple[str, str], float] = defaultdict(float)
    by_owner: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    entries: dict[str, list[int]] = defaultdict(list)
    for i, c in enumerate(committed):
        entries[c.key].append(i)
        room[(c.key, c.node)] += c.gpus if c.gpus >= 0 else math.inf
        for kind, name in object_owners(c.workload):
            ref = (c.namespace, kind, name)
            if c.key not in by_owner[ref]:
                by_owner[ref].append(c.key)
    return room, by_owner, entries


def _bound_gpu_pod(
    pod: PodView, by_owner: Mapping[tuple[str, str, str], list[str]]
) -> tuple[str, str, int, list[str], str] | None:
    """(node, Pod name, GPUs, the Workload keys it may belong to, namespace) of a bound GPU pod
    that has not ended; None for any other pod."""
    if pod.node is None or not pod.running or pod.gpus <= 0:
        return None
    owners = [o for o in pod.owners if o[0] in POD_OWNERS] + [(kinds.POD.name, pod.name)]
    keys = ([f"{pod.namespace}/{pod.prebuilt}"] if pod.prebuilt else []) + [
        wl for o in owners for wl in by_owner.get((pod.namespace, *o), [])
    ]
    return pod.node, pod.name, pod.gpus, keys, pod.namespace


def _breaks(c: Committed, n: NodeState, policy: PolicySpec) -> Exclusion | None:
    """Why running on node `n` breaks `c`'s sovereignty requirement, if it does for good (a
    label, or any other tenant beside an exclusive one). Its own presence is not a reason: the
    node is judged as the others left it."""
    req = c.request.requirement
    others = NodeTenancy(n.name, n.labels, n.tenants - {req.tenant}, n.exclusive_tenants - {req.tenant})
    why = check_node(req, others, policy.sovereignty.jurisdiction_label)
    return why if why is not None and (why.permanent or req.exclusive) else None


def bound_elsewhere(
    committed: list[Committed],
    cluster: ClusterView,
    policy: PolicySpec,
    misbound: list[tuple[str, str, str]],
    drift: list[Drift],
    planned: Mapping[str, set[str]],
) -> list[Drift]:
    """A pod of ours bound on a node its decision did not plan it on: sovereignty drift if that
    node breaks the workload's requirement, else a BoundElsewhere warning (its GPUs are counted
    where it is bound, its γ was judged on the planned node). One per workload."""
    nodes = {n.name: n for n in cluster.nodes}
    first: dict[str, Committed] = {}
    for entry in committed:
        first.setdefault(entry.key, entry)
    drifted = {d.committed.key for d in drift}
    out: list[Drift] = []
    seen: set[str] = set()
    for key, pod, node in misbound:
        c = first.get(key)
        if c is None or key in seen or key in drifted:
            continue
        seen.add(key)
        plan = ", ".join(sorted(planned.get(key, ())))
        n = nodes.get(node)
        why = _breaks(c, n, policy) if n is not None else None
        if why is not None:
            text = (
                f"its pod {pod} is bound on {node}, which does not satisfy it: {why.constraint}: {why.detail}"
            )
            out.append(Drift(c, text))
        else:
            text = (
                f"its pod {pod} is bound on {node}, not on a node it was planned on ({plan}): its GPUs "
                f"are counted there, and its γ was judged on the planned node"
            )
            out.append(Drift(c, text, event="BoundElsewhere"))
    return out


def drifted(
    committed: list[Committed], cluster: ClusterView, policy: PolicySpec, missing: Mapping[str, Committed]
) -> list[Drift]:
    """Ledger entries whose node no longer satisfies their requirement (or is gone)."""
    nodes = {n.name: n for n in cluster.nodes}
    out = [Drift(c, f"its node {c.node} no longer exists") for c in missing.values()]
    for c in committed:
        n = nodes.get(c.node)
        if n is None:
            continue
        why = _breaks(c, n, policy)
        if why is not None:
            out.append(Drift(c, f"its node {c.node} no longer satisfies it: {why.constraint}: {why.detail}"))
    return out
