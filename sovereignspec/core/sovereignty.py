"""Hard sovereignty constraints, applied before any speed-up is computed.

Two rules, each holding both ways:

- jurisdiction: a workload that requires jurisdiction X lands only on nodes whose jurisdiction
  label says X. A node without the label is in no jurisdiction and takes no such workload.
- exclusivity: an exclusive tenant takes no node that runs another tenant, and no tenant lands on a
  node where an exclusive tenant (other than itself) runs.

Every excluded node comes back with the constraint that excluded it and whether that can change
(`permanent`: labels say no; otherwise occupancy might free up), so the operator can tell a user
"never in this queue" (Rejected) from "not now" (Retry). No speed-up ever overrides a result here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

DEFAULT_JURISDICTION_LABEL = "node-restriction.kubernetes.io/jurisdiction"


@dataclass(frozen=True)
class Requirement:
    tenant: str
    jurisdiction: str | None = None
    exclusive: bool = False
    # What the namespace's administrators allow (None: anywhere); a declared jurisdiction narrows it.
    allowed: frozenset[str] | None = None


@dataclass(frozen=True)
class NodeTenancy:
    """A node as the filter sees it: its labels and who runs on it now."""

    name: str
    labels: Mapping[str, str]
    tenants: frozenset[str] = frozenset()
    exclusive_tenants: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Exclusion:
    constraint: str  # "jurisdiction" | "exclusive-tenant-present" | "shared-node"
    detail: str
    permanent: bool


def check_node(
    req: Requirement, node: NodeTenancy, jurisdiction_label: str = DEFAULT_JURISDICTION_LABEL
) -> Exclusion | None:
    """Why `node` may not take `req`, or None if it may. Permanent reasons are checked first."""
    if req.allowed is not None:
        actual = node.labels.get(jurisdiction_label)
        if actual not in req.allowed:
            where = (
                f"node is in {actual}" if actual is not None else f"node has no {jurisdiction_label} label"
            )
            return Exclusion(
                "jurisdiction", f"namespace allows only {', '.join(sorted(req.allowed))}; {where}", True
            )
    if req.jurisdiction is not None:
        actual = node.labels.get(jurisdiction_label)
        if actual is None:
            return Exclusion(
                "jurisdiction", f"requires {req.jurisdiction}; node has no {jurisdiction_label} label", True
            )
        if actual != req.jurisdiction:
            return Exclusion("jurisdiction", f"requires {req.jurisdiction}; node is in {actual}", True)
    others_exclusive = node.exclusive_tenants - {req.tenant}
    if others_exclusive:
        return Exclusion(
            "exclusive-tenant-present",
            f"node is held exclusively by {', '.join(sorted(others_exclusive))}",
            False,
        )
    if req.exclusive:
        others = node.tenants - {req.tenant}
        if others:
            return Exclusion("shared-node", f"exclusive tenant; node runs {', '.join(sorted(others))}", False)
    return None


class TenancyIndex:
    """The same rules as `check_node`, vectorised over nodes and updated as a tick places work.

    Tenants and jurisdictions are interned to integers; per node it keeps the number of distinct
    tenants, one of them (enough to test "only this tenant"), and the exclusive holder if any.
    """

    NONE = -1

    def __init__(
        self, nodes: list[NodeTenancy], jurisdiction_label: str = DEFAULT_JURISDICTION_LABEL
    ) -> None:
        self._ids: dict[str, int] = {}
        self.names = [n.name for n in nodes]
        self.jurisdiction = np.array(
            [
                self._intern("j:" + n.labels[jurisdiction_label])
                if jurisdiction_label in n.labels
                else self.NONE
                for n in nodes
            ],
            dtype=np.int64,
        )
        self._tenants: list[set[int]] = [{self._intern("t:" + t) for t in n.tenants} for n in nodes]
        self.tenant_count = np.array([len(t) for t in self._tenants], dtype=np.int64)
        self.some_tenant = np.array([min(t) if t else self.NONE for t in self._tenants], dtype=np.int64)
        holders = [sorted(n.exclusive_tenants) for n in nodes]
        # Two exclusive holders on one node cannot arise through this filter; if it already exists,
        # mark the node held by nobody we could ever match so that it admits no one.
        self.exclusive_holder = np.array(
            [self._intern("t:" + h[0]) if len(h) == 1 else (self.NONE if not h else -2) for h in holders],
            dtype=np.int64,
        )

    def _intern(self, key: str) -> int:
        return self._ids.setdefault(key, len(self._ids))

    def mask(self, req: Requirement) -> NDArray[np.bool_]:
        """Nodes that may take `req` now."""
        tenant = self._intern("t:" + req.tenant)
        ok = self.permanent_mask(req)
        ok &= (self.exclusive_holder == self.NONE) | (self.exclusive_holder == tenant)
        if req.exclusive:
            ok &= (self.tenant_count == 0) | ((self.tenant_count == 1) & (self.some_tenant == tenant))
        return ok

    def permanent_mask(self, req: Requirement) -> NDArray[np.bool_]:
        """Nodes whose labels allow `req` at all, whoever runs there."""
        ok = np.ones(len(self.names), dtype=np.bool_)
        if req.jurisdiction is not None:
            ok &= self.jurisdiction == self._ids.get("j:" + req.jurisdiction, -3)
        if req.allowed is not None:
            ok &= np.isin(self.jurisdiction, [self._ids.get("j:" + j, -3) for j in sorted(req.allowed)])
        return ok

    def alone(self, tenant: str) -> NDArray[np.bool_]:
        """Nodes where `tenant` runs and no one else does."""
        ident = self._ids.get("t:" + tenant, -3)
        return np.asarray((self.tenant_count == 1) & (self.some_tenant == ident), dtype=np.bool_)

    def save(self) -> tuple[list[set[int]], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """The per-node state `place` changes, to `restore` when a trial placement is undone."""
        return (
            [set(t) for t in self._tenants],
            self.tenant_count.copy(),
            self.some_tenant.copy(),
            self.exclusive_holder.copy(),
        )

    def restore(
        self, saved: tuple[list[set[int]], NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]
    ) -> None:
        tenants, count, some, holder = saved
        self._tenants = [set(t) for t in tenants]
        self.tenant_count, self.some_tenant, self.exclusive_holder = count.copy(), some.copy(), holder.copy()

    def place(self, node: int, req: Requirement) -> None:
        """Record that `req`'s tenant now runs on `node`."""
        tenant = self._intern("t:" + req.tenant)
        if tenant not in self._tenants[node]:
            self._tenants[node].add(tenant)
            self.tenant_count[node] += 1
            self.some_tenant[node] = min(self._tenants[node])
        if req.exclusive:
            self.exclusive_holder[node] = tenant
