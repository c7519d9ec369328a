"""What a pending workload asks for: its declared keys read from every pod set (and its owner where
the kind keeps them there), held to the grammar and the policy, as the core's `WorkloadRequest`; or
why it is Rejected or waits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sovereignspec.core.cluster import WorkloadRequest
from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border import kinds
from sovereignspec.operator.border.nodes import PoolMemo, node_pool, topology_assignment
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.workloads import (
    KEYS_ON_OWNER,
    UnreadableFieldError,
    declared_metadata,
    key_of,
    namespace_of,
    owner_key,
    owner_missing,
    owner_of,
    pod_set_counts,
    pod_set_names,
    requested_gpus,
    requested_pods,
)
from sovereignspec.operator.border.world import TenancyOf, World, safe_key
from sovereignspec.telemetry.snapshot import Snapshot, blend_acceptance

# What the registry (`kinds`) says of kinds, as the view reads them.
STAGED = frozenset(k.name for k in kinds.KINDS if k.stages_per_pod)  # one engine over its pods


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
    namespace = namespace_of(wl)
    kind = owner_of(wl)[0]
    declared = _declared(wl, owner, kind, profiles, tenancy or ann.Tenancy(namespace))
    if declared.sovereignty_problems:
        return declared, None, ""
    declared = _checkpoint_allowed(declared, policy)
    d = policy.defaults
    model = declared.model or d.model
    alpha, source = _alpha(declared, policy, snapshot, namespace, model)
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
        # A LeaderWorkerSet group is one engine over its pods: the engines' multi-node layout, tensor
        # parallel inside each pod and a pipeline stage per pod (docs/serving-shapes.md).
        stages=pods if kind in STAGED else 1,
        pod_sets=pod_set_counts(wl) if pods > 1 else (),
    )
    return declared, request, source


def _declared(
    wl: dict[str, Any],
    owner: Mapping[str, Mapping[str, str]] | None,
    kind: str,
    profiles: ProfileSet,
    tenancy: ann.Tenancy,
) -> ann.Declared:
    """Every pod set's annotations parsed and combined into what the workload declares."""
    sets, misplaced = declared_metadata(wl, owner, kind)
    models, drafters = set(profiles.models), set(profiles.drafters)
    return ann.combine(
        [
            (
                name,
                ann.parse(
                    notes,
                    tenancy,
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


def _checkpoint_allowed(declared: ann.Declared, policy: PolicySpec) -> ann.Declared:
    """A checkpoint the administrator has not allowed is not loaded into a shared engine: dropped,
    and said as a problem."""
    if declared.draft_checkpoint is None or policy.drafts.allows(declared.draft_checkpoint):
        return declared
    allowed = ", ".join(policy.drafts.allowed) or "none (the policy's drafts.allowed is empty)"
    refused = ann.Problem(
        "draft-checkpoint", declared.draft_checkpoint, f"one the policy allows: {allowed}", False
    )
    return replace(declared, draft_checkpoint=None, problems=(*declared.problems, refused))


def _alpha(
    declared: ann.Declared, policy: PolicySpec, snapshot: Snapshot, namespace: str, model: str
) -> tuple[float, str]:
    """The acceptance rate decided with, and where it came from: declared or the policy's default,
    blended with what this namespace's own engines observed (see PrometheusReader.acceptance)."""
    prior = declared.alpha if declared.alpha is not None else policy.defaults.acceptance_rate
    source = "declared" if declared.alpha is not None else "policy default"
    observed = snapshot.acceptance.get((namespace, model))
    learned = learned_alpha(prior, observed, policy)
    if learned is not None and observed is not None:
        return learned, f"{source} {prior:.2f} blended with {observed[0]:.2f} observed"
    return prior, source


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
    tokens = observed[1] if observed[1] >= 0 else weight  # an engine that reports a rate, not tokens
    return blend_acceptance(prior, (observed[0], tokens), weight)


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1e3


def unreadable(wl: dict[str, Any], entry: dict[str, Any], why: str) -> PendingWorkload:
    return _undecided(wl, entry, safe_key(wl), rejection=f"the Workload cannot be read: {why}")


def _undecided(wl: dict[str, Any], entry: dict[str, Any], key: str, **why: str) -> PendingWorkload:
    """A workload not placed this tick: Rejected (`rejection`) or left Pending (`waiting`)."""
    return PendingWorkload(
        key=key,
        workload=wl,
        check=str(entry.get("name", "")),
        entry=entry,
        declared=ann.Declared(tenant=namespace_of(wl, "")),
        request=None,
        alpha_source="",
        pod_set_names=[],
        pod_set_notes=[],
        flavor=None,
        **why,
    )


def pending_workload(
    wl: dict[str, Any],
    entry: dict[str, Any],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    world: World,
    tenancy: TenancyOf,
    pools: PoolMemo | None = None,
) -> PendingWorkload:
    try:
        pool, flavor = node_pool(wl, world.node_views, world.flavors, world.flavor_tolerations, pools)
    except UnreadableFieldError as exc:  # a constraint that cannot be read, or past its bound
        return unreadable(wl, entry, str(exc))
    namespace = namespace_of(wl)
    owner = world.owners.get(owner_key(wl))
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
            wl, policy, profiles, snapshot, pool, tenancy(namespace, policy), owner
        )
        assigned = topology_assignment(wl, world.node_views)
        if request is not None and assigned is not None:
            request = replace(request, assigned=assigned)
        if request is None:
            problems = "; ".join(str(x) for x in declared.sovereignty_problems)
            rejection = f"{problems} (sovereignty fields fail closed)"
    except UnreadableFieldError as exc:
        declared, request, source = ann.Declared(tenant=namespace), None, ""
        rejection = str(exc)
    names = pod_set_names(wl)
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
