"""Typed views of the API objects the decision reads, each parsed once where a tick reads it (the
border between Kubernetes' dicts and the decision). A view holds what the decision asks of the
object, already normalised; code past the border reads fields, never `obj["metadata"]`.

Only Nodes have a view so far (read for every workload's pool, the ledger's reach, the cluster's
capacity, TAS domains and the audit); Workloads are still read as dicts (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sovereignspec.operator import annotations as ann
from sovereignspec.operator.workloads import GPU_RESOURCE, UnreadableFieldError, gpu_quantity

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
