"""What one tick read from the API (`World`), and a namespace's tenancy as its administrators
set it: never what a workload claims."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border.objects import NodeView, PodView
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.workloads import key_of

# Namespace labels administrators set (namespaces are cluster-scoped: tenants cannot edit them).
TENANT_LABEL = "sovereignspec.io/tenant"
NAMESPACE_JURISDICTION_LABEL = "sovereignspec.io/jurisdiction"
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
    # every active check -> its SpeculationPolicy's name and generation (what the record names)
    policy_refs: dict[str, tuple[str, int | None]] = field(default_factory=dict)

    @cached_property
    def node_views(self) -> tuple[NodeView, ...]:
        """The nodes as the decision reads them, parsed once per World (one tick)."""
        return tuple(NodeView.of(n) for n in self.nodes)

    @cached_property
    def pod_views(self) -> tuple[PodView, ...]:
        """The bound pods as the ledger, the sovereignty watch and the record read them, parsed once."""
        return tuple(PodView.of(p) for p in self.pods)


def safe_key(wl: object) -> str:
    try:
        return key_of(wl)  # type: ignore[arg-type]
    except Exception:
        return "(unnamed)"
