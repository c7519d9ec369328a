"""Which nodes a workload may be placed on, from its flavor, its nodeSelector and tolerations,
and Kueue's topology assignment; and whether a node takes new work now. Nodes as their typed views
(operator/border/objects.py), workloads as dicts; plain data out: no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sovereignspec.operator.border.objects import NodeView, Taint
from sovereignspec.operator.border.workloads import (
    BEYOND_BOUNDS,
    GPU_RESOURCE,
    UnreadableFieldError,
    labels_match,
)


def _tolerates(tolerations: list[Any], taint: Taint) -> bool:
    """Kubernetes' toleration rule (k8s.io/api core/v1 Toleration.ToleratesTaint)."""
    for tol in tolerations:
        if not isinstance(tol, dict):
            continue
        if tol.get("effect") and tol.get("effect") != taint.effect:
            continue
        key, op = tol.get("key") or "", tol.get("operator") or "Equal"
        if op == "Exists" and (not key or key == taint.key):
            return True
        if op == "Equal" and key == taint.key and (tol.get("value") or "") == taint.value:
            return True
    return False


def _admits(node: NodeView, tolerations: list[Any]) -> bool:
    """The workload tolerates every lasting NoSchedule/NoExecute taint of the node (taints that an
    administrator sets, such as a GPU pool's `nvidia.com/gpu:NoSchedule`)."""
    return all(_tolerates(tolerations, t) for t in node.taints if not t.transient)


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


def affinity_admits(node: NodeView, terms: tuple[Any, ...]) -> bool:
    """Kubernetes' rule (component-helpers nodeaffinity): some term whose every rule the node meets;
    a term with no rules meets nothing."""
    labels = node.labels
    fields = {"metadata.name": node.name}
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
    nodes: Sequence[NodeView],
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
        if BEYOND_BOUNDS in pod_spec:  # cut by the cache (operator/runtime/informer.py): refused by name
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
        names = frozenset(n.name for n in nodes if all(_allows(n, ask) for ask in asks))
        if memo is not None:
            memo[key] = names
    return names, flavor


def _allows(node: NodeView, ask: tuple[Any, ...]) -> bool:
    selector, conflicting, tolerations, affinity = ask
    return (
        not conflicting
        and labels_match(node.labels, dict(selector))
        and _admits(node, tolerations)
        and (affinity is None or affinity_admits(node, affinity))
    )


def assigned_pool(wl: Mapping[str, Any], nodes: Sequence[NodeView], pool: frozenset[str]) -> frozenset[str]:
    """A decided workload's reach: the nodes of Kueue's topology assignment where it has one (its
    pods may run only there), else its pool."""
    try:
        assigned = topology_assignment(wl, nodes)
    except UnreadableFieldError:
        return pool
    return pool if assigned is None else pool & frozenset().union(*(n for n, _ in assigned))


def _domain_values(level: Mapping[str, Any], count: int, where: str) -> list[str]:
    if "universal" in level:
        return [str(level["universal"])] * count
    ind = level.get("individual") or {}
    roots = ind.get("roots") or []
    if not isinstance(roots, list) or len(roots) != count:
        raise UnreadableFieldError(f"{where}.individual.roots: got {roots!r}; accepted: {count} values")
    return [f"{ind.get('prefix') or ''}{r}{ind.get('suffix') or ''}" for r in roots]


def topology_assignment(
    wl: Mapping[str, Any], nodes: Sequence[NodeView]
) -> tuple[tuple[frozenset[str], int], ...] | None:
    """Where Kueue's Topology Aware Scheduling put the workload's pods before checks ran
    (`status.admission.podSetAssignments[].topologyAssignment`, v1beta2's sliced form): per domain,
    the nodes whose labels carry its value at every level, and its pod count. None: no assignment.
    Raises UnreadableFieldError for an assignment that cannot be read."""
    out: list[tuple[frozenset[str], int]] = []
    found = False
    # Nodes by their values at an assignment's levels: one pass over the nodes per level list,
    # not one per domain (a slice may name thousands of domains).
    index: dict[tuple[str, ...], dict[tuple[str | None, ...], set[str]]] = {}
    assignments = ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    for a, psa in enumerate(assignments):
        ta = psa.get("topologyAssignment") if isinstance(psa, dict) else None
        if not ta:
            continue
        found = True
        levels = [str(x) for x in ta.get("levels") or []]
        for s, piece in enumerate(ta.get("slices") or []):
            where = f"status.admission.podSetAssignments[{a}].topologyAssignment.slices[{s}]"
            count = piece.get("domainCount")
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise UnreadableFieldError(f"{where}.domainCount: got {count!r}; accepted: an integer >= 1")
            per_level = piece.get("valuesPerLevel") or []
            if len(per_level) != len(levels):
                raise UnreadableFieldError(
                    f"{where}.valuesPerLevel: got {len(per_level)} levels; "
                    f"accepted: {len(levels)} (one per level)"
                )
            values = [
                _domain_values(lv, count, f"{where}.valuesPerLevel[{i}]") for i, lv in enumerate(per_level)
            ]
            counts = piece.get("podCounts") or {}
            pods = (
                [counts["universal"]] * count
                if "universal" in counts
                else list(counts.get("individual") or [])
            )
            if len(pods) != count or not all(
                isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in pods
            ):
                raise UnreadableFieldError(
                    f"{where}.podCounts: got {counts!r}; accepted: {count} counts >= 1"
                )
            by_values = index.get(tuple(levels))
            if by_values is None:
                by_values = index[tuple(levels)] = {}
                for n in nodes:
                    by_values.setdefault(tuple(n.labels.get(lv) for lv in levels), set()).add(n.name)
            for d in range(count):
                members = by_values.get(tuple(values[i][d] for i in range(len(levels))), set())
                out.append((frozenset(members), int(pods[d])))
    return tuple(out) if found else None
