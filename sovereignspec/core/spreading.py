"""Pods over several nodes: a workload whose pods no node holds together is spread pod by pod
(all or none), per pod set, or onto the domains Kueue's topology-aware scheduling assigned; and
what may pin it (a jurisdiction's label, or nothing where every node it selects is one it may use).
Functions of the `Placer` whose state they read and update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from sovereignspec.core import reasons
from sovereignspec.core.cluster import Placement, WorkloadRequest
from sovereignspec.core.sovereignty import check_node

if TYPE_CHECKING:
    from sovereignspec.core.placement import Placer


def selectors(
    p: Placer, w: WorkloadRequest, pool: NDArray[np.bool_]
) -> list[tuple[dict[str, str], NDArray[np.bool_]]]:
    """Node labels that could pin `w`'s pods (one nodeSelector for all of them), with the nodes
    of its pool each selects: a jurisdiction's label, each value `w` may use; last, none (the
    whole pool, usable only where every node of it is one `w` may use, as any option)."""
    label = p.policy.jurisdiction_label
    values = sorted(
        {t.labels[label] for t, ok in zip(p._node_tenancy, pool, strict=True) if ok and label in t.labels}
    )
    allowed = p.tenancy.permanent_mask(w.requirement)
    out = []
    for value in values:
        nodes = pool & np.array([t.labels.get(label) == value for t in p._node_tenancy], dtype=np.bool_)
        if (nodes & allowed).any():
            out.append(({label: value}, nodes))
    out.append(({}, pool))
    return out


def spread(p: Placer, w: WorkloadRequest, explain: bool) -> Placement | str:
    """`w`'s pods over several nodes, when no node has room for all of them.

    A check writes one nodeSelector per pod set, so the pods cannot be sent to named nodes: they
    are pinned by labels instead, and only by labels every node of which `w` may use now (its
    jurisdiction, no other tenant's exclusive node, and, for an exclusive tenant, nobody else's;
    the model fits all their GPUs), so that wherever the scheduler binds them, sovereignty
    holds. Each pod is placed as `place` would place it (its own GPUs on one node) and
    committed; if they do not all fit, nothing is. The pods share one mode and γ: the lowest
    any of them got (the load committed is each pod's own choice, never less). Without such
    labels with room now: why, per label."""
    assert w.gpus is not None
    per_pod = w.gpus // w.pods
    by_set = per_pod_set(p, w, per_pod, explain)
    if by_set is not None:
        return by_set
    fits = p._fits(w, p._model(w.model_key))
    now = p.tenancy.mask(w.requirement)
    why = []
    for selector, nodes in selectors(p, w, p._pool(w)):
        name = ", ".join(f"{k}={v}" for k, v in selector.items()) or "its flavor's nodes"
        barred = [n for n, ok in zip(p.node_names, nodes & ~now, strict=True) if ok]
        if barred:
            why.append(f"{name} selects {barred[0]}, which it may not use ({len(barred)} such)")
            continue
        if not fits[nodes[p.gpu_node]].all():
            why.append(f"{name} selects GPUs {w.model_shown} does not fit")
            continue
        room = int((p.free[nodes] // max(per_pod, 1)).sum())
        if room < w.pods:
            why.append(f"{name} has room for {room} of them now")
            continue
        one = replace(
            w,
            gpus=per_pod,
            pods=1,
            node_pool=frozenset(n for n, ok in zip(p.node_names, nodes, strict=True) if ok),
        )
        saved = p._save()
        placed = []
        for _ in range(w.pods):
            pod = p.place(one, commit=True, explain=explain)
            if pod.outcome != "placed":
                break
            placed.append(pod)
        if len(placed) < w.pods:
            p._restore(saved)
            why.append(f"{name} took {len(placed)} of them")
            continue
        # A pod may be bound on any node the labels select: the tenant is there for tenancy's
        # sake (no other tenant's exclusive claim may land beside it), GPUs counted as planned.
        for i in np.nonzero(nodes)[0].tolist():
            p._hold(i, w)
        pinned = ", ".join(f"{k}={v}" for k, v in selector.items()) or "its flavor's nodes"
        return joint_placement(p, w, placed, per_pod, f"over @, pinned by {pinned}", selector, explain)
    head = f"no node has room for its {w.pods} pods of {per_pod} GPUs together, and no node label pins them"
    return f"{head} to nodes it may use with room: {'; '.join(why) or 'no node of its pool has the label'}"


def per_pod_set(p: Placer, w: WorkloadRequest, per_pod: int, explain: bool) -> Placement | None:
    """`w`'s pods with each pod set on one node of its own, when it has several pod sets and
    each has a node with room for all its pods: a check writes one nodeSelector per pod set,
    so each is pinned by hostname and the workload holds those nodes only (pinned by a label,
    it would hold every node the label selects, and keep other tenants' exclusive work off
    all of them). Each pod is placed as `place` would place it and committed, the first of a
    pod set choosing its node; None (nothing committed) if some pod set finds none."""
    if len(w.pod_sets) < 2 or sum(w.pod_sets) != w.pods or per_pod < 1:
        return None
    saved = p._save()
    placed: list[Placement] = []
    nodes: list[str] = []
    one = replace(w, gpus=per_pod, pods=1, pod_sets=())
    pool = p._pool(w)
    for count in w.pod_sets:
        room = pool & (p.free >= count * per_pod)
        first = p.place(
            replace(one, node_pool=frozenset(n for n, ok in zip(p.node_names, room, strict=True) if ok)),
            commit=True,
            explain=explain,
        )
        if first.outcome != "placed" or first.node is None:
            p._restore(saved)
            return None
        here = [first]
        for _ in range(count - 1):
            pod = p.place(replace(one, node_pool=frozenset({first.node})), commit=True, explain=explain)
            if pod.outcome != "placed":
                p._restore(saved)
                return None
            here.append(pod)
        placed += here
        nodes.append(first.node)
    index = {n: i for i, n in enumerate(p.node_names)}
    for node in set(nodes):
        p._hold(index[node], w)
    joint = joint_placement(p, w, placed, per_pod, "over @, each pod set pinned to its node", {}, explain)
    return replace(joint, record=replace(joint.record, node_selector=None, pod_set_nodes=tuple(nodes)))


def on_assignment(p: Placer, w: WorkloadRequest, explain: bool) -> Placement:
    """`w`'s pods where Kueue's Topology Aware Scheduling assigned them (Kueue pins each pod to
    its domain itself). Sovereignty first: every node of every domain must be one `w` may use
    now, inside its pool, else Retry naming it (Kueue evicts the workload and assigns afresh:
    never Ready on a node it may not use). Then each pod is placed in its domain as `place`
    would place it and committed; all or none. One mode and γ: the lowest any pod got."""
    assert w.assigned is not None
    total = sum(count for _, count in w.assigned)
    if total < 1:
        return reasons.unplaced(p, w, "retry", "Kueue's topology assignment places none of its pods", explain)
    index = {n: i for i, n in enumerate(p.node_names)}
    now = p.tenancy.mask(w.requirement)  # as this tick has filled the view so far
    for nodes, _ in w.assigned:
        if not nodes:
            return reasons.unplaced(
                p, w, "retry", "Kueue's topology assignment names a domain no node carries", explain
            )
        for node in sorted(nodes):
            i = index.get(node)
            if i is None:
                why = f"Kueue's topology assignment puts pods on {node}, which is not a known GPU node"
                return reasons.unplaced(p, w, "retry", why, explain)
            if not now[i]:
                broken = check_node(w.requirement, p._node_tenancy[i], p.policy.jurisdiction_label)
                detail = (
                    f"{broken.constraint}: {broken.detail}"
                    if broken is not None
                    else "tenancy: another tenant was placed there in this tick"
                )
                why = f"Kueue's topology assignment puts pods on {node}, which it may not use: {detail}"
                return reasons.unplaced(p, w, "retry", why, explain)
            if w.node_pool is not None and node not in w.node_pool:
                why = f"Kueue's topology assignment puts pods on {node}, outside its flavor's nodes"
                return reasons.unplaced(p, w, "retry", why, explain)
    per_pod = w.gpus // total if w.gpus is not None else None
    saved = p._save()
    placed: list[Placement] = []
    for nodes, count in w.assigned:
        one = replace(w, gpus=per_pod, pods=1, node_pool=nodes, assigned=None)
        for _ in range(count):
            pod = p.place(one, commit=True, explain=explain)
            if pod.outcome != "placed":
                p._restore(saved)
                where = ", ".join(sorted(nodes))
                why = (
                    f"{where}, where Kueue's topology assignment puts a pod, has no room for it "
                    f"now: {pod.record.reason}"
                )
                return reasons.unplaced(p, w, "retry", why, explain)
            placed.append(pod)
    return joint_placement(p, w, placed, per_pod, "on Kueue's topology assignment, over @", {}, explain)


def joint_placement(
    p: Placer,
    w: WorkloadRequest,
    placed: list[Placement],
    per_pod: int | None,
    how: str,
    selector: Mapping[str, str],
    explain: bool,
) -> Placement:
    """One decision for pods placed one by one: one mode and γ, the lowest any got (the load
    committed is each pod's own choice, never less). `how` says where, @ standing for the GPUs.
    The record is that pod's: placed with `explain`, its why and breakdown come with it, as a
    one-pod decision's do."""
    worst = min(placed, key=lambda p: p.gamma)  # the first of the lowest γ
    pods = tuple((p.node or "", int(p.gpu_index or 0), p.gamma) for p in placed)
    shown = ", ".join(f"{n}/gpu{g}" for n, g, _ in pods)
    size = f" of {per_pod} GPUs" if per_pod is not None else ""
    what = f"{len(placed)} pods{size}"
    tpot = worst.record.tpot_ms
    if w.stages > 1:
        # One engine: a token passes every stage in turn, so its TPOT is their sum.
        what = f"one engine in {w.stages} pipeline stages{size}"
        tpot = sum(p.record.tpot_ms for p in placed if p.record.tpot_ms is not None)
    record = replace(
        worst.record,
        workload=w.name,
        reason=f"{what} {how.replace('@', shown)}; {worst.record.reason}",
        pods=pods,
        node_selector=dict(selector),
        tpot_ms=tpot,
    )
    if explain:
        record = replace(record, excluded=reasons.excluded(p, w, None))
    return Placement(w.name, worst.node, worst.gpu_index, worst.gamma, record)
