"""A MultiKueueCluster as the dispatcher reads it: the labels and annotations a cluster administrator
sets on each worker (its jurisdiction, the tenant it is dedicated to, its Prometheus, its GPUs'
profile), validated at the border, and whether MultiKueue has connected to it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sovereignspec.errors import describe
from sovereignspec.operator.border import annotations as ann

# What a cluster administrator sets on each MultiKueueCluster (a cluster-scoped object).
WORKER_JURISDICTION = ann.PREFIX + "jurisdiction"  # label: the worker's jurisdiction
WORKER_TENANT = ann.PREFIX + "tenant"  # label: the one tenant a worker is dedicated to
WORKER_PROMETHEUS = ann.PREFIX + "prometheus-url"  # annotation: the worker's Prometheus
WORKER_GPU_TYPE = ann.PREFIX + "gpu-type"  # annotation: the profile its GPUs are priced with


class WorkerDescription(BaseModel):
    """A MultiKueueCluster's labels and annotations, as the dispatcher accepts them."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    jurisdiction: str | None = Field(
        None,
        alias=WORKER_JURISDICTION,
        pattern=f"^{ann.JURISDICTION_RE.pattern}$",
        description="a jurisdiction code",
    )
    tenant: str | None = Field(
        None, alias=WORKER_TENANT, pattern=f"^{ann.TENANT_RE.pattern}$", description="a DNS-1123 name"
    )
    prometheus_url: str | None = Field(
        None, alias=WORKER_PROMETHEUS, pattern=r"https?://[^\s]{1,2000}", description="an http(s) URL"
    )
    gpu_type: str | None = Field(None, alias=WORKER_GPU_TYPE, max_length=64, description="a GPU profile name")


def describe_worker(obj: dict[str, Any]) -> tuple[WorkerDescription, str | None]:
    """The worker's description, or an empty one and what is wrong with it (fail closed)."""
    meta = obj.get("metadata") or {}
    fields = {**(meta.get("annotations") or {}), **(meta.get("labels") or {})}
    try:
        return WorkerDescription.model_validate(fields), None
    except ValidationError as exc:
        where = f"MultiKueueCluster {meta.get('name')}"
        return WorkerDescription(), describe(exc, WorkerDescription, where=where).replace("\n", "; ")


def connected(obj: dict[str, Any]) -> tuple[bool, str]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Active":
            return c.get("status") == "True", f"{c.get('reason', '')}: {c.get('message', '')}"[:200]
    return False, "MultiKueue has not connected to it yet"
