"""Which nodes a workload may be placed on, from its flavor, its nodeSelector and tolerations,
and Kueue's topology assignment; and whether a node takes new work now. Plain dicts in, plain data
out: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sovereignspec.operator.workloads import (
    BEYOND_BOUNDS,
    GPU_RESOURCE,
    UnreadableFieldError,
    labels_match,
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

_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")


def _term_rules(term: Any, where: str) -> tuple[tuple[str, str, str, tuple[str, ...]], ...]:
    """A nodeSelectorTerm as (matchExpressions | matchFields, key, operator, values) rules, checked
    as the API server validates them (an unknown operator, In without values, Gt with two)."""
    if not isinstance(term, dict):
        raise UnreadableFieldError(f"{where}: got {term!r}; accepted: a nodeSelectorTerm")
    rules = []
    for part in ("matchExpressions", "matchFields"):
        for i, rule in enumerate(term.get(part) or []):
            at = f"{where}.{part}[{i}]"
            if not isinstance(rule, dict):
                raise UnreadableFieldError(f"{at}: got {rule!r}; accepted: a node selector requirement")
            op, key, values = rule.get("operator"), rule.get("key"), rule.get("values") or []
            if op not in _OPERATORS or not isinstance(key, str) or not key:
                raise UnreadableFieldError(
                    f"{at}: got key {key!r}, operator {op!r}; "
                    f"accepted: a key and one of {', '.join(_OPERATORS)}"
                )
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise UnreadableFieldError(f"{at}.values: got {values!r}; accepted: a list of strings")
            wanted = {"In": "some", "NotIn": "some", "Exists": "none", "DoesNotExist": "none"}.get(op, "one")
            if (
                (wanted == "some" and not values)
                or (wanted == "none" and values)
                or (wanted == "one" and (len(values) != 1 or not _integer(values[0])))
            ):
                raise UnreadableFieldError(f"{at}.values: got {values!r}; not what operator {op} takes")
            if part == "matchFields" and key != "metadata.name":
                raise UnreadableFieldError(f"{at}.key: got {key!r}; accepted: metadata.name")
            rules.append((part, key, str(op), tuple(values)))
    return tuple(rules)


def _integer(text: str) -> bool:
    return text.lstrip("-").isascii() and text.lstrip("-").isdigit() and len(text) <= 19


def required_affinity(pod_spec: Mapping[str, Any], where: str) -> tuple[Any, ...] | None:
    """A pod's required node affinity as rules per term (terms ORed, rules ANDed); None: none.
    Raises UnreadableFieldError for one that cannot be read."""
    node_affinity = (
        ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
        if isinstance(pod_spec.get("affinity"), dict)
        else {}
    )
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    at = f"{where}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(terms, list):
        raise UnreadableFieldError(f"{at}.nodeSelectorTerms: got {terms!r}; accepted: a list of terms")
    return tuple(_term_rules(t, f"{at}.nodeSelectorTerms[{i}]") for i, t in enumerate(terms))


def affinity_admits(node: Mapping[str, Any], terms: tuple[Any, ...]) -> bool:
    """Kubernetes' rule (component-helpers nodeaffinity): some term whose every rule the node meets;
    a term with no rules meets nothing."""
    labels = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    return any(rules and all(_meets(labels if part == "matchExpressions" else fields, key, op, values)
                             for part, key, op, values in rules) for rules in terms)  # fmt: skip


def _meets(labels: Mapping[str, Any], key: str, op: str, values: tuple[str, ...]) -> bool:
    present = key in labels
    value = str(labels.get(key, ""))
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if not present or not _integer(value):
        return False
    return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])


def node_pool(
    wl: dict[str, Any],
    nodes: list[dict[str, Any]],
    flavors: dict[str, dict[str, str]],
    tolerations_of: Mapping[str, list[Any]] | None = None,
    memo: PoolMemo | None = None,
) -> tuple[frozenset[str], str | None]:
    """Nodes the workload's assigned flavor and every one of its pod sets allow: each pod set's
    nodeSelector and required node affinity met, its lasting taints tolerated (the flavor's
    tolerations count, as Kueue adds them to the pods). The scheduler holds each pod to its own
    constraints beside ours, so a node one pod set refuses is none of the workload's. `memo`
    shares the answer between workloads that ask the same (one tick's nodes: most workloads do).
    Raises UnreadableFieldError for a constraint that cannot be read."""
    assignments = (wl.get("status") or {}).get("admission", {}).get("podSetAssignments") or []
    flavor = None
    for a in assignments:
        fl = a.get("flavors") or {}
        flavor = fl.get(GPU_RESOURCE) or next(iter(fl.values()), None)
        if flavor:
            break
    flavor_labels = dict(flavors.get(flavor, {})) if flavor else {}
    extra = list((tolerations_of or {}).get(flavor or "", []))
    asks = []
    pod_sets = (wl.get("spec") or {}).get("podSets") or [{}]
    for n, ps in enumerate(pod_sets):
        pod_spec = ((ps.get("template") or {}).get("spec") or {}) if isinstance(ps, dict) else {}
        where = f"spec.podSets[{n}].template.spec"
        if BEYOND_BOUNDS in pod_spec:  # cut by the cache (operator/informer.py): refused by name
            raise UnreadableFieldError(f"{where}.{pod_spec[BEYOND_BOUNDS]}")
        own = pod_spec.get("nodeSelector") or {}
        if not isinstance(own, dict):
            raise UnreadableFieldError(f"{where}.nodeSelector: got {own!r}; accepted: a map of labels")
        selector = {**flavor_labels, **{str(k): str(v) for k, v in own.items()}}
        conflicting = {k for k, v in own.items() if k in flavor_labels and flavor_labels[k] != str(v)}
        tolerations = list(pod_spec.get("tolerations") or []) + extra
        affinity = required_affinity(pod_spec, where)
        asks.append((tuple(sorted(selector.items())), bool(conflicting), tolerations, affinity))
    key = tuple((sel, conflicting, repr(tol), aff) for sel, conflicting, tol, aff in asks)
    names = memo.get(key) if memo is not None else None
    if names is None:
        names = frozenset(n["metadata"]["name"] for n in nodes if all(_allows(n, ask) for ask in asks))
        if memo is not None:
            memo[key] = names
    return names, flavor


def _allows(node: Mapping[str, Any], ask: tuple[Any, ...]) -> bool:
    selector, conflicting, tolerations, affinity = ask
    return (
        not conflicting
        and labels_match(node["metadata"].get("labels") or {}, dict(selector))
        and _admits(node, tolerations)
        and (affinity is None or affinity_admits(node, affinity))
    )


def assigned_pool(wl: Mapping[str, Any], nodes: list[dict[str, Any]], pool: frozenset[str]) -> frozenset[str]:
    """A decided workload's reach: the nodes of Kueue's topology assignment where it has one (its
    pods may run only there), else its pool."""
    try:
        assigned = topology_assignment(wl, nodes)
    except UnreadableFieldError:
        return pool
    return pool if assigned is None else pool & frozenset().union(*(n for n, _ in assigned))
