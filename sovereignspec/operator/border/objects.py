"""Typed views of the API objects the decision reads, each parsed once where a tick reads it (the
border between Kubernetes' dicts and the decision). A view holds what the decision asks of the
object, already normalised; code past the border reads fields, never `obj["metadata"]`.

Nodes (read for every workload's pool, the ledger's reach, the cluster's capacity, TAS domains, the
sovereignty watch and the record) and bound Pods (read by the ledger, the sovereignty watch and the
record) have views, and so do AdmissionChecks (both roles), a manager Workload's MultiKueue fields
and MultiKueueConfigs (the dispatcher) and LearnedProfiles (the learner). Workloads are read by
`workloads.py`'s functions (plain dicts in, plain data out), so that no module of the decision
indexes one itself (tests/unit/test_api_border.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border.workloads import (
    GPU_RESOURCE,
    UnreadableFieldError,
    container_gpus,
    gpu_quantity,
)

# Taints the node lifecycle controller and the kubelet set while a node is down or unhealthy.
# They come and go: such a node takes no new work now (free 0), but stays in a workload's pool, so
# that a workload is made to wait for it and never Rejected because its node is briefly away.
TRANSIENT_TAINT_PREFIX = "node.kubernetes.io/"

_BLOCKING = ("NoSchedule", "NoExecute")

# A node may report at most this many GPUs (a larger figure is a typo or a hostile device plugin).
MAX_NODE_GPUS = 1024


@dataclass(frozen=True, slots=True)
class Taint:
    """A NoSchedule or NoExecute taint (PreferNoSchedule never blocks, so it is not kept)."""

    key: str
    value: str
    effect: str

    @property
    def transient(self) -> bool:
        return self.key.startswith(TRANSIENT_TAINT_PREFIX)


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    hostname: str  # its kubernetes.io/hostname label, else its name (how decisions name nodes)
    taints: tuple[Taint, ...]
    unavailable: str | None  # why it takes no new work now (cordoned, not Ready, a transient taint)
    gpus: int  # allocatable (else capacity) nvidia.com/gpu, at most MAX_NODE_GPUS; 0 where unreadable
    gpu_error: str | None  # why `gpus` could not be read, or None

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeView:
        meta = node["metadata"]
        name = str(meta["name"])
        labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        taints = tuple(
            Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t["effect"]))
            for t in spec.get("taints") or []
            if isinstance(t, dict) and t.get("effect") in _BLOCKING
        )
        gpus, gpu_error = 0, None
        try:
            raw = (status.get("allocatable") or status.get("capacity") or {}).get(GPU_RESOURCE, 0) or 0
            gpus = min(gpu_quantity(raw, f"Node {name} status.allocatable[{GPU_RESOURCE}]"), MAX_NODE_GPUS)
        except UnreadableFieldError as exc:
            gpu_error = str(exc)
        return cls(
            name,
            labels,
            labels.get(ann.HOSTNAME) or name,
            taints,
            _unavailable(spec, status, taints),
            gpus,
            gpu_error,
        )


def _unavailable(spec: Mapping[str, Any], status: Mapping[str, Any], taints: tuple[Taint, ...]) -> str | None:
    """A Node with no Ready condition at all is one nobody reports on (the simulated nodes of the
    examples before any controller-manager marks them): it counts as available."""
    if spec.get("unschedulable"):
        return "cordoned"
    for c in status.get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") != "True":
            return f"not Ready ({c.get('reason') or c.get('status')})"
    for t in taints:
        if t.transient:
            return f"tainted {t.key}:{t.effect}"
    return None


ENDED_PHASES = ("Succeeded", "Failed")


def last_finish(status: Mapping[str, Any]) -> str | None:
    """A pod's containers' last `state.terminated.finishedAt` (RFC 3339 in UTC: it orders as text)."""
    finished = [
        str(t["finishedAt"])
        for c in status.get("containerStatuses") or []
        if isinstance(c, dict)
        and isinstance(t := (c.get("state") or {}).get("terminated"), dict)
        and t.get("finishedAt")
    ]
    return max(finished) if finished else None


def _owner_refs(meta: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [r for r in meta.get("ownerReferences") or [] if isinstance(r, dict)]


def owners_of(meta: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """An object's owners' (kind, name), in order (entries that are not objects left out)."""
    return tuple((str(r.get("kind")), str(r.get("name"))) for r in _owner_refs(meta))


def object_owners(obj: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """`owners_of` an object itself (a Workload), whatever its metadata holds."""
    meta = obj.get("metadata")
    return owners_of(meta if isinstance(meta, Mapping) else {})


def controlling_owner(meta: Mapping[str, Any]) -> tuple[str, str] | None:
    """An object's controlling owner's (kind, name), else its first owner's: what the record names
    as its workload. None where it has no owner."""
    refs = _owner_refs(meta)
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    return (str(ref.get("kind", "")), str(ref.get("name", ""))) if ref else None


@dataclass(frozen=True, slots=True)
class PodView:
    """A Pod bound to a node (the pods cache holds no other), as the ledger, the sovereignty watch
    and the record read it."""

    namespace: str
    name: str
    uid: str
    node: str | None
    phase: str | None
    gpus: int  # what its containers ask for; 0 where unreadable
    gpu_error: str | None  # why `gpus` could not be read ("TypeName: message"), or None
    owners: tuple[tuple[str, str], ...]  # its ownerReferences' (kind, name), in order
    controller: tuple[str, str] | None  # its controlling owner (else its first), as the record names it
    prebuilt: str | None  # the Workload Kueue built for its group (kueue.x-k8s.io/prebuilt-workload-name)
    started_at: str | None
    finished_at: str | None  # its containers' last finish, where the kubelet reported one
    raw: Mapping[str, Any]  # the object as cached: what an Event about it names

    @property
    def running(self) -> bool:
        """Bound and not ended: it holds its GPUs."""
        return bool(self.node) and self.phase not in ENDED_PHASES

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> PodView:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        gpus, gpu_error = 0, None
        try:
            gpus = container_gpus(spec, "spec")
        except Exception as exc:  # a pod that cannot be read is said, and skipped alone where read
            gpu_error = f"{type(exc).__name__}: {exc}"
        node = spec.get("nodeName")
        prebuilt = (meta.get("labels") or {}).get(ann.KUEUE_PREBUILT)
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            node=str(node) if node else None,
            phase=status.get("phase"),
            gpus=gpus,
            gpu_error=gpu_error,
            owners=owners_of(meta),
            controller=controlling_owner(meta),
            prebuilt=str(prebuilt) if prebuilt else None,
            started_at=status.get("startTime"),
            finished_at=last_finish(status),
            raw=pod,
        )


@dataclass(frozen=True, slots=True)
class PolicyObject:
    """A SpeculationPolicy as cached: its name, its generation (for the record) and its spec as
    written (`policy.parse_policy` reads it where a check resolves it, and says what is wrong)."""

    name: str
    generation: int | None  # None where absent or not an integer
    spec: object

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> PolicyObject:
        meta = obj.get("metadata") or {}
        generation = meta.get("generation")
        whole = isinstance(generation, int) and not isinstance(generation, bool)
        return cls(str(meta.get("name", "")), generation if whole else None, obj.get("spec"))


@dataclass(frozen=True, slots=True)
class MultiKueueConfigView:
    """A MultiKueueConfig as the dispatcher reads it: its name and the worker clusters it lists
    (entries that are not names left out)."""

    name: str
    clusters: tuple[str, ...]

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> MultiKueueConfigView:
        meta = obj.get("metadata") or {}
        clusters = (obj.get("spec") or {}).get("clusters") or []
        return cls(str(meta.get("name", "")), tuple(str(c) for c in clusters if isinstance(c, str)))


@dataclass(frozen=True, slots=True)
class LearnedObject:
    """A LearnedProfile as cached: its name, its spec as written (`LearnedSpec` validates it where
    the learner reads it, and says what is wrong) and its status ({} where absent or not an object)."""

    name: str
    spec: object
    status: Mapping[str, Any]

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> LearnedObject:
        meta = obj.get("metadata") or {}
        status = obj.get("status")
        return cls(
            str(meta.get("name", "")), obj.get("spec") or {}, status if isinstance(status, Mapping) else {}
        )


@dataclass(frozen=True, slots=True)
class AdmissionCheckView:
    """An AdmissionCheck as both roles read it: whose it is, the parameters it names and its Active
    condition as last written."""

    name: str
    controller_name: str | None
    parameters: Mapping[str, Any] | None  # spec.parameters (apiGroup, kind, name), as written
    active: Mapping[str, Any] | None  # its Active condition, or None before anyone set one
    generation: int  # metadata.generation; 0 where absent or not an integer
    resource_version: str | None
    raw: Mapping[str, Any]  # the object as cached: what an Event about it names

    @property
    def active_seen(self) -> tuple[Any, Any, Any]:
        """The Active condition's (status, reason, message); Nones before one was set."""
        c = self.active or {}
        return c.get("status"), c.get("reason"), c.get("message")

    @classmethod
    def of(cls, ac: Mapping[str, Any]) -> AdmissionCheckView:
        meta = ac.get("metadata") or {}
        spec = ac.get("spec") or {}
        conditions = (ac.get("status") or {}).get("conditions") or []
        active = next((c for c in conditions if isinstance(c, dict) and c.get("type") == "Active"), None)
        params = spec.get("parameters")
        generation = meta.get("generation", 0)
        controller = spec.get("controllerName")
        return cls(
            name=str(meta.get("name", "")),
            controller_name=str(controller) if controller is not None else None,
            parameters=params if isinstance(params, dict) else None,
            active=active,
            generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else 0,
            resource_version=meta.get("resourceVersion"),
            raw=ac,
        )


def labels_by_name(objects: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Each object's labels by its name (Namespaces: where a tenancy is read), as strings."""
    out: dict[str, dict[str, str]] = {}
    for obj in objects:
        meta = obj.get("metadata") or {}
        out[str(meta.get("name", ""))] = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    return out


def flavors_of(
    objects: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, dict[str, str]], dict[str, list[Any]]]:
    """ResourceFlavors' node labels (as strings) and the tolerations Kueue adds to the pods it
    admits on each, by flavor name."""
    labels: dict[str, dict[str, str]] = {}
    tolerations: dict[str, list[Any]] = {}
    for f in objects:
        name = str((f.get("metadata") or {}).get("name", ""))
        spec = f.get("spec") or {}
        labels[name] = {str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()}
        tolerations[name] = list(spec.get("tolerations") or [])
    return labels, tolerations


@dataclass(frozen=True, slots=True)
class MultiKueueStatus:
    """Where MultiKueue has a manager's Workload: the worker that admitted it, the workers
    nominated for it, and the admission checks its ClusterQueue puts on it."""

    cluster: str | None  # status.clusterName: the worker it runs on
    nominated: tuple[str, ...]  # status.nominatedClusterNames
    checks: tuple[str, ...]  # status.admissionChecks[].name

    @property
    def where(self) -> str | None:
        """The worker whose GPUs it holds: where it was admitted, else the one worker it was
        nominated to alone (and waits for); None while it may go to several or none."""
        return self.cluster or (self.nominated[0] if len(self.nominated) == 1 else None)

    @classmethod
    def of(cls, wl: Mapping[str, Any]) -> MultiKueueStatus:
        status = wl.get("status") or {}
        cluster = status.get("clusterName")
        entries = status.get("admissionChecks") or []
        return cls(
            cluster=cluster if isinstance(cluster, str) and cluster else None,
            nominated=tuple(n for n in status.get("nominatedClusterNames") or [] if isinstance(n, str)),
            checks=tuple(str(e.get("name")) for e in entries if isinstance(e, dict)),
        )
