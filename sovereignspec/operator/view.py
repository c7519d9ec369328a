"""The cluster as the core sees it, rebuilt from API objects at every tick: nodes, the placement
ledger and the workloads waiting for a decision.

The ledger is the set of Workloads whose SovereignSpec check is Ready with our podSetUpdates (the
node in the nodeSelector, the GPU and γ in annotations) and that have not finished. It lives in the
API, not in memory, so a restarted controller sees exactly what the previous one decided, and two
decisions can never contradict each other: every tick starts from what is already written.

This module does no I/O: it takes plain dicts (as the API returns them) and returns plain data.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sovereignspec.core.placement import ClusterView, GpuState, NodeState, WorkloadRequest, with_ledger_load
from sovereignspec.core.roofline import headroom_from_tensor_activity
from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator import annotations as ann
from sovereignspec.operator.policy import PolicySpec
from sovereignspec.telemetry.snapshot import Snapshot, blend_acceptance

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
TENSOR_METRIC = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"


def condition(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions", [])
    )


def key_of(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def our_entry(wl: dict[str, Any], checks: set[str]) -> dict[str, Any] | None:
    for entry in wl.get("status", {}).get("admissionChecks", []):
        if entry.get("name") in checks:
            return dict(entry)
    return None


def job_name(wl: dict[str, Any]) -> str:
    for ref in wl["metadata"].get("ownerReferences", []):
        if ref.get("kind") == "Job":
            return str(ref.get("name", ""))
    return str(wl["metadata"]["name"])


def requested_gpus(wl: dict[str, Any]) -> int:
    total = 0
    for ps in wl.get("spec", {}).get("podSets", []):
        per_pod = 0
        for c in ps.get("template", {}).get("spec", {}).get("containers", []):
            res = c.get("resources", {})
            value = res.get("requests", {}).get(GPU_RESOURCE) or res.get("limits", {}).get(GPU_RESOURCE) or 0
            per_pod += int(value)
        total += per_pod * int(ps.get("count", 1))
    return total


def template(wl: dict[str, Any]) -> dict[str, Any]:
    pod_sets = wl.get("spec", {}).get("podSets", [])
    return dict(pod_sets[0].get("template", {})) if pod_sets else {}


def parse_time(text: str | None) -> float:
    if not text:
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


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


@dataclass
class PendingWorkload:
    key: str
    workload: dict[str, Any]
    check: str
    entry: dict[str, Any]
    declared: ann.Declared
    request: WorkloadRequest | None  # None: rejected before placement (bad sovereignty input)
    alpha_source: str
    pod_set_names: list[str]
    template_annotations: dict[str, str]
    flavor: str | None


@dataclass
class View:
    cluster: ClusterView
    committed: list[Committed]
    pending: list[PendingWorkload]
    stale_reason: str | None  # why telemetry could not be used, if it could not
    gpu_headroom: dict[tuple[str, int], float | None] = field(default_factory=dict)


def declared_request(
    wl: dict[str, Any],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    node_pool: frozenset[str] | None,
) -> tuple[ann.Declared, WorkloadRequest | None, str]:
    """The workload as the core needs it: declared annotations, policy defaults, learned α."""
    meta = wl["metadata"]
    tpl = template(wl)
    declared = ann.parse(
        tpl.get("metadata", {}).get("annotations"),
        meta["namespace"],
        set(profiles.models),
        set(profiles.drafters),
    )
    if declared.sovereignty_problems:
        return declared, None, ""
    d = policy.defaults
    model = declared.model or d.model
    prior = declared.alpha if declared.alpha is not None else d.acceptance_rate
    source = "declared" if declared.alpha is not None else "policy default"
    alpha = prior
    if policy.telemetry.acceptance.learn and (observed := snapshot.acceptance.get((declared.tenant, model))):
        weight = policy.telemetry.acceptance.prior_weight_tokens
        tokens = observed[1] if observed[1] >= 0 else weight  # SGLang reports a rate, not tokens
        alpha = blend_acceptance(prior, (observed[0], tokens), weight)
        source = f"{source} {prior:.2f} blended with {observed[0]:.2f} observed"
    problems = declared.performance_problems
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
    )
    return declared, request, source


def _ms(value: float | None) -> float | None:
    return None if value is None else value / 1e3


def _matches(labels: dict[str, str], selector: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def node_pool(
    wl: dict[str, Any], nodes: list[dict[str, Any]], flavors: dict[str, dict[str, str]]
) -> tuple[frozenset[str], str | None]:
    """Nodes the workload's assigned flavor and its own nodeSelector allow."""
    assignments = wl.get("status", {}).get("admission", {}).get("podSetAssignments", [])
    flavor = None
    for a in assignments:
        fl = a.get("flavors", {})
        flavor = fl.get(GPU_RESOURCE) or next(iter(fl.values()), None)
        if flavor:
            break
    selector = dict(flavors.get(flavor, {})) if flavor else {}
    selector.update(template(wl).get("spec", {}).get("nodeSelector", {}) or {})
    names = frozenset(
        n["metadata"]["name"] for n in nodes if _matches(n["metadata"].get("labels", {}), selector)
    )
    return names, flavor


def build(
    workloads: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    flavors: dict[str, dict[str, str]],
    checks: set[str],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    now: float,
) -> View:
    committed: list[Committed] = []
    pending: list[PendingWorkload] = []
    for wl in workloads:
        entry = our_entry(wl, checks)
        if entry is None or condition(wl, "Finished"):
            continue
        pool, flavor = node_pool(wl, nodes, flavors)
        state = entry.get("state")
        if state == "Ready":
            done = _committed(wl, entry, policy, profiles, snapshot, pool)
            if done is not None:
                committed.append(done)
        elif state == "Pending" and condition(wl, "QuotaReserved") and wl.get("spec", {}).get("active", True):
            declared, request, source = declared_request(wl, policy, profiles, snapshot, pool)
            tpl = template(wl)
            pending.append(
                PendingWorkload(
                    key=key_of(wl),
                    workload=wl,
                    check=entry["name"],
                    entry=entry,
                    declared=declared,
                    request=request,
                    alpha_source=source,
                    pod_set_names=[ps["name"] for ps in wl["spec"].get("podSets", [])],
                    template_annotations=dict(tpl.get("metadata", {}).get("annotations") or {}),
                    flavor=flavor,
                )
            )
    cluster, headroom, stale_reason = _cluster(nodes, committed, policy, profiles, snapshot, now)
    cluster = with_ledger_load(
        cluster, [(c.request, c.node, c.gpu_index, c.gamma) for c in committed], profiles
    )
    return View(cluster, committed, pending, stale_reason, headroom)


def _committed(
    wl: dict[str, Any],
    entry: dict[str, Any],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    pool: frozenset[str],
) -> Committed | None:
    for update in entry.get("podSetUpdates", []):
        node = (update.get("nodeSelector") or {}).get(ann.HOSTNAME)
        notes = update.get("annotations") or {}
        if node and ann.OUT_MODE in notes:
            _, request, _ = declared_request(wl, policy, profiles, snapshot, pool)
            if request is None:
                return None
            tpot = notes.get(ann.OUT_TPOT)
            return Committed(
                key=key_of(wl),
                namespace=wl["metadata"]["namespace"],
                job=job_name(wl),
                node=node,
                gpu_index=int(notes.get(ann.OUT_GPU_INDEX, "0")),
                gamma=int(notes.get(ann.OUT_BUDGET, "0")),
                gpus=requested_gpus(wl),
                request=request,
                decided_at=parse_time(notes.get(ann.OUT_DECIDED_AT)),
                predicted_tpot_s=float(tpot) / 1e3 if tpot else None,
            )
    return None


def _cluster(
    nodes: list[dict[str, Any]],
    committed: list[Committed],
    policy: PolicySpec,
    profiles: ProfileSet,
    snapshot: Snapshot,
    now: float,
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
    for c in committed:
        by_gpu[(c.node, c.gpu_index)].append(c)

    node_states: list[NodeState] = []
    gpu_states: list[GpuState] = []
    headroom_out: dict[tuple[str, int], float | None] = {}
    for node in nodes:
        meta = node["metadata"]
        labels = meta.get("labels", {}) or {}
        gpu_type = policy.profiles.gpu_products.get(labels.get(GPU_PRODUCT_LABEL, ""))
        status = node.get("status", {})
        count = int((status.get("allocatable") or status.get("capacity") or {}).get(GPU_RESOURCE, 0) or 0)
        if gpu_type not in profiles.gpus or count <= 0:
            continue
        name = meta["name"]
        host = labels.get(ann.HOSTNAME, name)
        efficiency = profiles.gpus[gpu_type].compute_efficiency
        for gi in range(count):
            reading = None if stale_reason else snapshot.gpus.get((host, gi)) or snapshot.gpus.get((name, gi))
            headroom = None
            if reading is not None and now - reading.observed_at <= staleness:
                scale = efficiency if reading.metric == TENSOR_METRIC else 1.0
                headroom = float(headroom_from_tensor_activity(reading.activity, scale))
            headroom_out[(name, gi)] = headroom
            ratio, binding = math.inf, None
            for c in by_gpu.get((name, gi), []):
                if c.request.tpot_slo_s is None:
                    continue
                tpot = snapshot.tpot.get((c.namespace, c.job)) or c.predicted_tpot_s
                if tpot and c.request.tpot_slo_s / tpot < ratio:
                    ratio, binding = c.request.tpot_slo_s / tpot, c.key
            gpu_states.append(GpuState(name, gi, gpu_type, headroom, ratio, binding))
        mine = [c for c in committed if c.node == name]
        free = 0 if node.get("spec", {}).get("unschedulable") else max(count - sum(c.gpus for c in mine), 0)
        tenants = frozenset(c.request.tenant for c in mine)
        exclusive = frozenset(c.request.tenant for c in mine if c.request.exclusive)
        node_states.append(NodeState(name, labels, free, tenants, exclusive))
    return ClusterView(node_states, gpu_states), headroom_out, stale_reason
