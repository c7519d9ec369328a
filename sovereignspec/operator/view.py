"""The cluster as the core sees it, rebuilt from API objects at every tick: nodes, the placement
ledger and the workloads waiting for a decision.

The ledger is built only from facts users cannot forge:

- our own admission-check entries (status, written by us) on every Workload that is not finished,
  for every AdmissionCheck this controller serves, whichever policy it uses: the node in the
  podSetUpdates' nodeSelector, the GPU and γ in their annotations;
- Pods bound to a node (`spec.nodeName`) that request GPUs and belong to no ledger entry on that
  node: their GPUs are taken, and their namespace's tenant runs there.

Never from pod-template annotations: a template is the user's to write. A tenant is what the
namespace's administrators say (`tenancy_of`), never what a workload claims.

Every object is read on its own: one that cannot be read fails alone (its workload is Rejected
with the reason, or its node is left out), never the tick.

This module does no I/O: it takes plain dicts (as the API returns them) and returns plain data.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sovereignspec.core.placement import (
    ClusterView,
    GpuState,
    LedgerMemo,
    NodeState,
    WorkloadRequest,
    neighbour_bound,
    reevaluate,
    with_ledger_load,
)
from sovereignspec.core.roofline import headroom_from_tensor_activity
from sovereignspec.core.sovereignty import Exclusion, NodeTenancy, check_node
from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator import annotations as ann
from sovereignspec.operator import kinds
from sovereignspec.operator.nodes import PoolMemo, assigned_pool, node_pool, node_unavailable
from sovereignspec.operator.policy import PolicySpec
from sovereignspec.operator.workloads import (
    GPU_RESOURCE,
    KEYS_ON_OWNER,
    UnreadableFieldError,
    condition,
    container_gpus,
    declared_metadata,
    gpu_quantity,
    job_name,
    key_of,
    our_entry,
    owner_missing,
    owner_of,
    parse_time,
    pod_set_counts,
    requested_gpus,
    requested_pods,
    topology_assignment,
)
from sovereignspec.telemetry.snapshot import TENSOR_METRICS, GpuReading, Snapshot, blend_acceptance

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

# Namespace labels administrators set (namespaces are cluster-scoped: tenants cannot edit them).
TENANT_LABEL = "sovereignspec.io/tenant"
NAMESPACE_JURISDICTION_LABEL = "sovereignspec.io/jurisdiction"
MAX_GAMMA = 32
# What the registry (`kinds`) says of kinds, as the view reads them.
STAGED = frozenset(k.name for k in kinds.KINDS if k.stages_per_pod)  # one engine over its pods
POD_OWNERS = frozenset(k.name for k in kinds.KINDS if k.pods_owned)  # named by their pods as owner
# A namespace's tenancy under a policy (memoised per tick in `build`).
TenancyOf = Callable[[str, PolicySpec], ann.Tenancy]


def tenancy_of(namespace: str, labels: Mapping[str, str] | None, policy: PolicySpec) -> ann.Tenancy:
    """Who a namespace belongs to and where its work may run, from what administrators control:
    the policy's `tenancy.namespaces` and the Namespace's labels. Two sources that disagree fail
    closed (the tenancy carries a problem)."""
    labels = labels or {}
    mapped = policy.tenancy.namespaces.get(namespace)
    tenant, source = namespace, "the namespace name"
    problem = None
    label_tenant = labels.get(TENANT_LABEL)
    if label_tenant is not None:
        if not ann.TENANT_RE.fullmatch(str(label_tenant)):
            problem = f"namespace label {TENANT_LABEL}={label_tenant!r} is not a DNS-1123 name"
        tenant, source = str(label_tenant), f"namespace label {TENANT_LABEL}"
    if mapped is not None and mapped.tenant is not None:
        if label_tenant is not None and mapped.tenant != label_tenant:
            problem = (
                f"SpeculationPolicy tenancy says {mapped.tenant!r}, namespace label {TENANT_LABEL} says "
                f"{label_tenant!r}: an administrator must make them agree"
            )
        tenant, source = mapped.tenant, "the SpeculationPolicy's tenancy.namespaces"
    allowed: frozenset[str] | None = None
    label_j = labels.get(NAMESPACE_JURISDICTION_LABEL)
    if label_j is not None:
        if not ann.JURISDICTION_RE.fullmatch(str(label_j)):
            problem = f"namespace label {NAMESPACE_JURISDICTION_LABEL}={label_j!r} is not a jurisdiction code"
        allowed = frozenset({str(label_j)})
    if mapped is not None and mapped.jurisdictions is not None:
        listed = frozenset(mapped.jurisdictions)
        allowed = listed if allowed is None else allowed & listed
        if not allowed:
            problem = (
                f"namespace label {NAMESPACE_JURISDICTION_LABEL}={label_j!r} is outside the "
                f"SpeculationPolicy's jurisdictions {sorted(listed)}"
            )
    return ann.Tenancy(tenant, allowed, source, problem)


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


@dataclass
class PendingWorkload:
    key: str
    workload: dict[str, Any]
    check: str
    entry: dict[str, Any]
    declared: ann.Declared
    request: WorkloadRequest | None  # None: rejected before placement (`rejection` says why)
    alpha_source: str
    pod_set_names: list[str]
    # Per pod set (name, our keys of its template's annotations): each is checked for our output
    # keys, which a user's template must not set against the decision.
    pod_set_notes: list[tuple[str, dict[str, str]]]
    flavor: str | None
    rejection: str | None = None
    waiting: str | None = None  # not decided yet, and why (it stays Pending, saying so)


@dataclass(frozen=True)
class Drift:
    """A running workload whose node no longer satisfies its sovereignty requirement (or, with
    `event` BoundElsewhere, one whose pod the scheduler bound where it was not planned)."""

    committed: Committed
    why: str
    event: str = "SovereigntyDrift"


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


@dataclass(frozen=True)
class World:
    """What one tick read from the API, as plain dicts."""

    workloads: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    flavors: dict[str, dict[str, str]]
    namespaces: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> labels
    pods: list[dict[str, Any]] = field(default_factory=list)  # pods bound to a node
    # (namespace, kind, name) of a Workload's owner -> its "annotations" and "labels" (our keys of them)
    owners: dict[tuple[str, str, str], dict[str, dict[str, str]]] = field(default_factory=dict)
    policies: dict[str, PolicySpec] = field(default_factory=dict)  # every check we serve -> its policy
    # flavor -> the tolerations Kueue adds to the pods it admits on that flavor
    flavor_tolerations: dict[str, list[Any]] = field(default_factory=dict)


def declared_request(
    wl: dict[str, Any],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    node_pool: frozenset[str] | None,
    tenancy: ann.Tenancy | None = None,
    owner: Mapping[str, Mapping[str, str]] | None = None,
) -> tuple[ann.Declared, WorkloadRequest | None, str]:
    """The workload as the core needs it: declared annotations, policy defaults, learned α.
    `owner` is the metadata of what Kueue made it for (`World.owners`).
    Raises UnreadableFieldError for a field of the Workload that cannot be read."""
    meta = wl["metadata"]
    kind = owner_of(wl)[0]
    sets, misplaced = declared_metadata(wl, owner, kind)
    models, drafters = set(profiles.models), set(profiles.drafters)
    declared = ann.combine(
        [
            (
                name,
                ann.parse(
                    notes,
                    tenancy or ann.Tenancy(meta["namespace"]),
                    models,
                    drafters,
                    labels=labels,
                    # the owner's own annotations are the workload's: read once
                    owner_annotations=misplaced if n == 0 else None,
                    owner=_misplaced_on(kind, owner),
                ),
            )
            for n, (name, notes, labels) in enumerate(sets)
        ]
    )
    if declared.sovereignty_problems:
        return declared, None, ""
    if declared.draft_checkpoint is not None and not policy.drafts.allows(declared.draft_checkpoint):
        # A checkpoint the administrator has not allowed is not loaded into a shared engine.
        allowed = ", ".join(policy.drafts.allowed) or "none (the policy's drafts.allowed is empty)"
        refused = ann.Problem(
            "draft-checkpoint", declared.draft_checkpoint, f"one the policy allows: {allowed}", False
        )
        declared = replace(declared, draft_checkpoint=None, problems=(*declared.problems, refused))
    d = policy.defaults
    model = declared.model or d.model
    prior = declared.alpha if declared.alpha is not None else d.acceptance_rate
    source = "declared" if declared.alpha is not None else "policy default"
    alpha = prior
    # Observed in this namespace's own engines (see PrometheusReader.acceptance).
    observed = snapshot.acceptance.get((meta["namespace"], model))
    learned = learned_alpha(prior, observed, policy)
    if learned is not None and observed is not None:
        alpha = learned
        source = f"{source} {prior:.2f} blended with {observed[0]:.2f} observed"
    problems = declared.performance_problems
    pods = requested_pods(wl)
    request = WorkloadRequest(
        name=key_of(wl),
        tenant=declared.tenant,
        model=model,
        drafter=declared.drafter,
        alpha=alpha,
        seqs=declared.seqs or d.max_num_seqs,
        context=declared.context or d.context_length,
        latency_class=declared.latency_class or d.latency_class,  # type: ignore[arg-type]
        tpot_slo_s=declared.tpot_slo_s if declared.tpot_slo_s is not None else _ms(d.tpot_slo_ms),
        jurisdiction=declared.jurisdiction,
        exclusive=declared.exclusive,
        gamma_max=policy.gamma_max,
        force_plain="; ".join(str(p) for p in problems) or None,
        node_pool=node_pool,
        gpus=requested_gpus(wl) or None,
        pods=pods,
        allowed_jurisdictions=declared.allowed_jurisdictions,
        # A LeaderWorkerSet group is one engine over its pods: vLLM's multi-node layout, tensor
        # parallel inside each pod and a pipeline stage per pod (docs/serving-shapes.md).
        stages=pods if kind in STAGED else 1,
        pod_sets=pod_set_counts(wl) if pods > 1 else (),
    )
    return declared, request, source


def _misplaced_on(kind: str, owner: Mapping[str, Mapping[str, str]] | None) -> str:
    """Whose own annotations misplaced keys were found on, as the user will read it."""
    registered = kinds.BY_NAME.get(kind)
    if registered is None:
        return kinds.WORKLOAD
    if registered.parent is None:
        return kind
    return registered.parent.name if (owner or {}).get("owner_annotations") else kinds.WORKLOAD


def learned_alpha(prior: float, observed: tuple[float, float] | None, policy: PolicySpec) -> float | None:
    """`prior` blended with what the engines observed, where the policy learns (None: nothing to learn)."""
    if not policy.telemetry.acceptance.learn or not observed:
        return None
    weight = policy.telemetry.acceptance.prior_weight_tokens
    tokens = observed[1] if observed[1] >= 0 else weight  # SGLang reports a rate, not tokens
    return blend_acceptance(prior, (observed[0], tokens), weight)


def reading_headroom(
    reading: GpuReading | None, efficiency: float, now: float, staleness: float
) -> float | None:
    """A GPU's headroom from its activity reading (None: no reading, or one older than `staleness`)."""
    if reading is None or now - reading.observed_at > staleness:
        return None
    scale = efficiency if reading.metric in TENSOR_METRICS else 1.0
    return float(headroom_from_tensor_activity(reading.activity, scale))


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1e3


@dataclass(frozen=True)
class Aging:
    """A running speculative workload judged again at its GPU's reading now."""

    committed: Committed
    headroom: float
    gamma_now: int  # what SovereignSpec would choose on that GPU now
    speedup_in_force: float  # its own S_real at the γ it runs, now
    aggregate_in_force: float  # the GPU's aggregate speed-up at that γ, now: below 1, a net loss


def _aging(
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
    hostnames, by_host = _hostnames(world.nodes)
    tenancy = _Tenancies(world)
    committed, pending, missing_nodes = _read_workloads(
        world, checks, policy, profiles, snapshot, hostnames, by_host, tenancy, errors
    )
    misbound: list[tuple[str, str, str]] = []
    moved: dict[int, str] = {}
    pods_by_node = _foreign_pods(world, committed, tenancy, policy, errors, misbound, moved)
    planned = _planned_nodes(committed)  # before any is counted where bound
    _count_where_bound(committed, moved)
    cluster, headroom, stale_reason = _cluster(
        world.nodes, committed, pods_by_node, policy, profiles, snapshot, now, errors
    )
    cluster = with_ledger_load(
        cluster,
        [(c.request, c.node, c.gpu_index, c.gamma) for c in committed if c.node in hostnames],
        profiles,
        ledger_memo,
    )
    drift = _drift(committed, cluster, policy, missing_nodes)
    elsewhere = _bound_elsewhere(committed, cluster, policy, misbound, drift, planned)
    drift += [d for d in elsewhere if d.event == "SovereigntyDrift"]
    bound = [d for d in elsewhere if d.event != "SovereigntyDrift"]
    aging = _aging(committed, cluster, headroom, world, policy, profiles)
    return View(cluster, committed, pending, stale_reason, headroom, drift, hostnames, errors, aging, bound)


def _hostnames(nodes: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, str]]:
    """Node name -> its hostname label (the name where it has none), and hostname -> the first
    node that carries it."""
    hostnames: dict[str, str] = {}
    by_host: dict[str, str] = {}
    for n in nodes:
        name = n["metadata"]["name"]
        host = str((n["metadata"].get("labels") or {}).get(ann.HOSTNAME) or name)
        hostnames[name] = host
        by_host.setdefault(host, name)
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
                    pool, _ = node_pool(wl, world.nodes, world.flavors, world.flavor_tolerations, pools)
                except UnreadableFieldError:  # decided once, unreadable now: its reach is every node
                    pool = frozenset(hostnames)
                pool = assigned_pool(wl, world.nodes, pool)
                for done in _committed(
                    wl, entry, spec, profiles, snapshot, pool, by_host, tenancy, world, errors
                ):
                    committed.append(done)
                    if done.node not in hostnames:
                        missing_nodes[done.key] = done
            elif (
                state == "Pending"
                and entry.get("name") in checks
                and condition(wl, "QuotaReserved")
                and (wl.get("spec") or {}).get("active", True)
            ):
                pending.append(_pending(wl, entry, policy, profiles, snapshot, world, tenancy, pools))
        except Exception as exc:  # one unreadable object fails alone
            errors.append(f"Workload {_safe_key(wl)}: {type(exc).__name__}: {exc}")
            if isinstance(wl, dict) and isinstance(wl.get("metadata"), dict) and "name" in wl["metadata"]:
                entry = our_entry(wl, frozenset(checks)) or {}
                if entry.get("state") == "Pending" and condition(wl, "QuotaReserved"):
                    pending.append(_unreadable(wl, entry, f"{type(exc).__name__}: {exc}"))
    return committed, pending, missing_nodes


def _planned_nodes(committed: list[Committed]) -> dict[str, set[str]]:
    """Workload key -> the nodes its entries name."""
    planned: dict[str, set[str]] = defaultdict(set)
    for c in committed:
        planned[c.key].add(c.node)
    return planned


def _count_where_bound(committed: list[Committed], moved: dict[int, str]) -> None:
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


def _safe_key(wl: object) -> str:
    try:
        return key_of(wl)  # type: ignore[arg-type]
    except Exception:
        return "(unnamed)"


def _unreadable(wl: dict[str, Any], entry: dict[str, Any], why: str) -> PendingWorkload:
    return _undecided(wl, entry, _safe_key(wl), rejection=f"the Workload cannot be read: {why}")


def _undecided(wl: dict[str, Any], entry: dict[str, Any], key: str, **why: str) -> PendingWorkload:
    """A workload not placed this tick: Rejected (`rejection`) or left Pending (`waiting`)."""
    meta = wl["metadata"]
    return PendingWorkload(
        key=key,
        workload=wl,
        check=str(entry.get("name", "")),
        entry=entry,
        declared=ann.Declared(tenant=str(meta.get("namespace", ""))),
        request=None,
        alpha_source="",
        pod_set_names=[],
        pod_set_notes=[],
        flavor=None,
        **why,
    )


def _pending(
    wl: dict[str, Any],
    entry: dict[str, Any],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    world: World,
    tenancy: TenancyOf,
    pools: PoolMemo | None = None,
) -> PendingWorkload:
    meta = wl["metadata"]
    try:
        pool, flavor = node_pool(wl, world.nodes, world.flavors, world.flavor_tolerations, pools)
    except UnreadableFieldError as exc:  # a constraint that cannot be read, or past its bound
        return _unreadable(wl, entry, str(exc))
    owner = world.owners.get((meta["namespace"], *owner_of(wl)))
    missing = owner_missing(wl, owner)
    if missing is not None:
        # Its keys (or the place they would be misplaced) are on an object not cached yet: the
        # Workload's watch event can come first. Deciding now would read no keys: fail open.
        why = (
            "its keys are read from it" if missing[0] in KEYS_ON_OWNER else "keys misplaced on it fail closed"
        )
        if missing[0] == kinds.POD.name:  # the operator watches only the Pods Kueue's pod integration queues
            why += f"; Pods are read when they carry the {ann.KUEUE_QUEUE} label"
        waiting = f"waiting for its {missing[0]} {missing[1]} to be read ({why}); decided then"
        return _undecided(wl, entry, key_of(wl), waiting=waiting)
    rejection = None
    try:
        declared, request, source = declared_request(
            wl, policy, profiles, snapshot, pool, tenancy(meta["namespace"], policy), owner
        )
        assigned = topology_assignment(wl, world.nodes)
        if request is not None and assigned is not None:
            request = replace(request, assigned=assigned)
        if request is None:
            problems = "; ".join(str(x) for x in declared.sovereignty_problems)
            rejection = f"{problems} (sovereignty fields fail closed)"
    except UnreadableFieldError as exc:
        declared, request, source = ann.Declared(tenant=meta["namespace"]), None, ""
        rejection = str(exc)
    names = [str(ps.get("name", "")) for ps in (wl.get("spec") or {}).get("podSets") or []]
    sets = declared_metadata(wl, owner)[0]
    return PendingWorkload(
        key=key_of(wl),
        workload=wl,
        check=str(entry["name"]),
        entry=entry,
        declared=declared,
        request=request,
        alpha_source=source,
        pod_set_names=names,
        pod_set_notes=[(name, {str(k): str(v) for k, v in notes.items()}) for name, notes, _ in sets],
        flavor=flavor,
        rejection=rejection,
    )


def _int(text: object, low: int, high: int, default: int) -> int:
    if isinstance(text, str) and ann.INTEGER_RE.fullmatch(text):
        return min(max(int(text), low), high)
    return default


def _committed(
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
        meta = wl["metadata"]
        t = tenancy(meta["namespace"], policy)
        try:
            _, request, _ = declared_request(
                wl, policy, profiles, snapshot, pool, t, world.owners.get((meta["namespace"], *owner_of(wl)))
            )
            gpus = requested_gpus(wl)
        except UnreadableFieldError as exc:
            errors.append(f"Workload {key_of(wl)}: {exc}")
            request, gpus = None, -1
        if request is None:  # decided once, unreadable now: count it, and hold its node (fail closed)
            d = policy.defaults
            request = WorkloadRequest(
                key_of(wl), t.tenant, d.model, None, d.acceptance_rate, exclusive=True, node_pool=pool
            )
        tpot = notes.get(ann.OUT_TPOT)
        try:
            predicted = float(tpot) / 1e3 if tpot and ann.DECIMAL_RE.fullmatch(tpot) else None
        except ValueError:
            predicted = None
        where = [(node, _int(notes.get(ann.OUT_GPU_INDEX), 0, 1024, 0))]
        reach: frozenset[str] = frozenset()
        if spread:  # each pod where it was counted, with its share of the GPUs
            where = [(by_host.get(h, h), g) for h, g in spread]
            # Where its pods may be bound: every node some pod set's nodeSelector selects.
            selectors = [
                {str(k): str(v) for k, v in (u.get("nodeSelector") or {}).items()} for u in updates
            ] or [{}]
            reach = frozenset(
                str(n["metadata"]["name"])
                for n in world.nodes
                if str(n["metadata"]["name"]) in pool
                and any(
                    all((n["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
                    for selector in selectors
                )
            )
            gpus = gpus // len(spread) if gpus > 0 else gpus
            request = replace(request, gpus=gpus if gpus > 0 else request.gpus, pods=1)
        return [
            Committed(
                key=key_of(wl),
                namespace=meta["namespace"],
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
            )
            for part, (on, index) in enumerate(where)
        ]
    return []


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


def _pod_gpus(pod: Mapping[str, Any]) -> int:
    return container_gpus(pod.get("spec") or {}, "spec")


def _foreign_pods(
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
    # Room per (namespace, Workload, node); a Pod finds its Workload by Kueue's prebuilt label
    # (a StatefulSet's, a LeaderWorkerSet group's), by its Job or StatefulSet, or as itself.
    room: dict[tuple[str, str], float] = defaultdict(float)  # (Workload key, node)
    by_owner: dict[tuple[str, str, str], list[str]] = defaultdict(list)  # -> Workload keys
    entries: dict[str, list[int]] = defaultdict(list)  # Workload key -> its entries' indices
    for i, c in enumerate(committed):
        entries[c.key].append(i)
        room[(c.key, c.node)] += c.gpus if c.gpus >= 0 else math.inf
        for r in c.workload.get("metadata", {}).get("ownerReferences") or []:
            ref = (c.namespace, str(r.get("kind")), str(r.get("name")))
            if c.key not in by_owner[ref]:
                by_owner[ref].append(c.key)
    out: dict[str, list[tuple[str, int]]] = defaultdict(list)
    off_plan: list[tuple[str, str, int, list[str], str]] = []  # (node, Pod, GPUs, Workloads, namespace)
    for pod in world.pods:
        try:
            meta, spec = pod["metadata"], pod.get("spec") or {}
            node = spec.get("nodeName")
            phase = (pod.get("status") or {}).get("phase")
            if not node or phase in ("Succeeded", "Failed"):
                continue
            gpus = _pod_gpus(pod)
            if gpus <= 0:
                continue
            namespace = str(meta.get("namespace", ""))
            prebuilt = (meta.get("labels") or {}).get(ann.KUEUE_PREBUILT)
            owners = [
                (str(r.get("kind")), str(r.get("name")))
                for r in meta.get("ownerReferences") or []
                if r.get("kind") in POD_OWNERS
            ] + [(kinds.POD.name, str(meta.get("name", "")))]
            keys = ([f"{namespace}/{prebuilt}"] if prebuilt else []) + [
                wl for o in owners for wl in by_owner.get((namespace, *o), [])
            ]
            key = next((k for k in ((wl, str(node)) for wl in keys) if room.get(k, 0.0) >= gpus), None)
            if key is not None:
                room[key] -= gpus
                continue
            off_plan.append((str(node), str(meta.get("name", "")), gpus, keys, namespace))
        except Exception as exc:
            errors.append(f"Pod {_safe_key(pod)}: {type(exc).__name__}: {exc}")
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


def _cluster(
    nodes: list[dict[str, Any]],
    committed: list[Committed],
    pods_by_node: Mapping[str, list[tuple[str, int]]],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    now: float,
    errors: list[str],
) -> tuple[ClusterView, dict[tuple[str, int], float | None], str | None]:
    staleness = policy.telemetry.staleness_seconds
    stale_reason = None
    if policy.telemetry.source == "none":
        stale_reason = "telemetry is off in this policy (source: none)"
    elif snapshot.error and not snapshot.gpus:
        stale_reason = snapshot.error
    elif now - snapshot.fetched_at > staleness:
        stale_reason = f"telemetry last read {now - snapshot.fetched_at:.0f}s ago (limit {staleness:.0f}s)"

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
        meta = node["metadata"]
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        gpu_type = policy.profiles.gpu_products.get(labels.get(GPU_PRODUCT_LABEL, ""))
        status = node.get("status") or {}
        try:
            raw = (status.get("allocatable") or status.get("capacity") or {}).get(GPU_RESOURCE, 0) or 0
            count = gpu_quantity(raw, f"Node {meta['name']} status.allocatable[{GPU_RESOURCE}]")
        except UnreadableFieldError as exc:
            errors.append(str(exc))
            continue
        if gpu_type not in profiles.gpus or count <= 0:
            continue
        count = min(count, 1024)
        name = meta["name"]
        host = labels.get(ann.HOSTNAME, name)
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
        unavailable = node_unavailable(node)
        free = 0 if unavailable else max(count - used, 0)
        holders = mine + reaching.get(name, [])
        tenants = frozenset(c.request.tenant for c in holders) | frozenset(t for t, _ in foreign)
        exclusive = frozenset(c.request.tenant for c in holders if c.request.exclusive)
        node_states.append(NodeState(name, labels, free, tenants, exclusive, count, unavailable))
    return ClusterView(node_states, gpu_states), headroom_out, stale_reason


def _breaks(c: Committed, n: NodeState, policy: PolicySpec) -> Exclusion | None:
    """Why running on node `n` breaks `c`'s sovereignty requirement, if it does for good (a
    label, or any other tenant beside an exclusive one). Its own presence is not a reason: the
    node is judged as the others left it."""
    req = c.request.requirement
    others = NodeTenancy(n.name, n.labels, n.tenants - {req.tenant}, n.exclusive_tenants - {req.tenant})
    why = check_node(req, others, policy.sovereignty.jurisdiction_label)
    return why if why is not None and (why.permanent or req.exclusive) else None


def _bound_elsewhere(
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


def _drift(
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
