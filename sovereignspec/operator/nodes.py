"""Which nodes a workload may be placed on, from its flavor, its nodeSelector and tolerations,
and Kueue's topology assignment; and whether a node takes new work now. Plain dicts in, plain data
out: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sovereignspec.operator.workloads import (
    GPU_RESOURCE,
    UnreadableFieldError,
    labels_match,
    template,
    topology_assignment,
)

# Taints the node lifecycle controller and the kubelet set while a node is down or unhealthy.
# They come and go: such a node takes no new work now (free 0), but stays in a workload's pool, so
# that a workload is made to wait for it and never Rejected because its node is briefly away.
TRANSIENT_TAINT_PREFIX = "node.kubernetes.io/"

_BLOCKING = ("NoSchedule", "NoExecute")


def _taints(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    taints = (node.get("spec") or {}).get("taints") or []
    return [t for t in taints if isinstance(t, dict) and t.get("effect") in _BLOCKING]


def node_unavailable(node: Mapping[str, Any]) -> str | None:
    """Why a node takes no new work now (cordoned, not Ready, a node.kubernetes.io/ taint), or None.

    A Node with no Ready condition at all is one nobody reports on (the simulated nodes of the
    examples before any controller-manager marks them): it counts as available."""
    if (node.get("spec") or {}).get("unschedulable"):
        return "cordoned"
    for c in (node.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") != "True":
            return f"not Ready ({c.get('reason') or c.get('status')})"
    for t in _taints(node):
        if str(t.get("key", "")).startswith(TRANSIENT_TAINT_PREFIX):
            return f"tainted {t.get('key')}:{t.get('effect')}"
    return None


def _tolerates(tolerations: list[Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' toleration rule (k8s.io/api core/v1 Toleration.ToleratesTaint)."""
    for tol in tolerations:
        if not isinstance(tol, dict):
            continue
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        key, op = tol.get("key") or "", tol.get("operator") or "Equal"
        if op == "Exists" and (not key or key == taint.get("key")):
            return True
        if (
            op == "Equal"
            and key == taint.get("key")
            and (tol.get("value") or "") == (taint.get("value") or "")
        ):
            return True
    return False


def _admits(node: Mapping[str, Any], tolerations: list[Any]) -> bool:
    """The workload tolerates every lasting NoSchedule/NoExecute taint of the node (taints that an
    administrator sets, such as a GPU pool's `nvidia.com/gpu:NoSchedule`)."""
    return all(
        _tolerates(tolerations, t)
        for t in _taints(node)
        if not str(t.get("key", "")).startswith(TRANSIENT_TAINT_PREFIX)
    )


PoolMemo = dict[tuple[Any, ...], frozenset[str]]


def node_pool(
    wl: dict[str, Any],
    nodes: list[dict[str, Any]],
    flavors: dict[str, dict[str, str]],
    tolerations_of: Mapping[str, list[Any]] | None = None,
    memo: PoolMemo | None = None,
) -> tuple[frozenset[str], str | None]:
    """Nodes the workload's assigned flavor and its own nodeSelector allow, and whose lasting taints
    it tolerates (the flavor's tolerations count, as Kueue adds them to the pods). `memo` shares
    the answer between workloads that ask the same (one tick's nodes: most workloads do)."""
    assignments = (wl.get("status") or {}).get("admission", {}).get("podSetAssignments") or []
    flavor = None
    for a in assignments:
        fl = a.get("flavors") or {}
        flavor = fl.get(GPU_RESOURCE) or next(iter(fl.values()), None)
        if flavor:
            break
    selector = dict(flavors.get(flavor, {})) if flavor else {}
    pod_spec = template(wl).get("spec") or {}
    selector.update(pod_spec.get("nodeSelector") or {})
    tolerations = list(pod_spec.get("tolerations") or []) + list((tolerations_of or {}).get(flavor or "", []))
    key = (tuple(sorted((str(k), str(v)) for k, v in selector.items())), repr(tolerations))
    names = memo.get(key) if memo is not None else None
    if names is None:
        names = frozenset(
            n["metadata"]["name"]
            for n in nodes
            if labels_match(n["metadata"].get("labels") or {}, selector) and _admits(n, tolerations)
        )
        if memo is not None:
            memo[key] = names
    return names, flavor


def assigned_pool(wl: Mapping[str, Any], nodes: list[dict[str, Any]], pool: frozenset[str]) -> frozenset[str]:
    """A decided workload's reach: the nodes of Kueue's topology assignment where it has one (its
    pods may run only there), else its pool."""
    try:
        assigned = topology_assignment(wl, nodes)
    except UnreadableFieldError:
        return pool
    return pool if assigned is None else pool & frozenset().union(*(n for n, _ in assigned))
