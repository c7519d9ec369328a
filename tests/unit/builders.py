"""Small builders of the API objects a tick reads, in the manner of Kueue's `MakeWorkload`:
defaults that make a valid object, one method per thing a test wants different."""

from __future__ import annotations

import copy
from typing import Any

from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.world import World
from sovereignspec.telemetry.snapshot import GpuReading, Snapshot

CHECK = "sovereignspec"
JURISDICTION = "node-restriction.kubernetes.io/jurisdiction"
TENSOR = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
NOW = 1_000.0  # the tick's clock; readings are observed at it unless a test says otherwise
STAMP = "2026-12-02T00:00:00Z"


class WorkloadBuilder:
    def __init__(self, name: str, namespace: str = "team-a") -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "7"},
            "spec": {
                "podSets": [
                    {
                        "name": "main",
                        "count": 1,
                        "template": {
                            "metadata": {"annotations": {}},
                            "spec": {
                                "containers": [
                                    {"name": "server", "resources": {"requests": {"nvidia.com/gpu": "1"}}}
                                ]
                            },
                        },
                    }
                ]
            },
            "status": {
                "conditions": [{"type": "QuotaReserved", "status": "True"}],
                "admissionChecks": [{"name": CHECK, "state": "Pending", "message": ""}],
            },
        }

    def annotate(self, **notes: str) -> WorkloadBuilder:
        """Our annotations by short name: `model="llama-3.1-8b"`, `acceptance_rate="0.8"`."""
        target = self._obj["spec"]["podSets"][0]["template"]["metadata"]["annotations"]
        for key, value in notes.items():
            target[ann.PREFIX + key.replace("_", "-")] = value
        return self

    def gpus(self, text: str) -> WorkloadBuilder:
        containers = self._obj["spec"]["podSets"][0]["template"]["spec"]["containers"]
        containers[0]["resources"]["requests"]["nvidia.com/gpu"] = text
        return self

    def pods(self, count: int) -> WorkloadBuilder:
        """Pods of the pod set (a Job's parallelism), each with the container's GPUs."""
        self._obj["spec"]["podSets"][0]["count"] = count
        return self

    def leader_and_workers(self, workers: int, **notes: str) -> WorkloadBuilder:
        """As Kueue makes a LeaderWorkerSet group's Workload when the set has a leader template:
        pod set 0 becomes "leader" (one pod), then "worker" (`workers` pods, the same spec) whose
        template carries `notes` (our keys by short name) as its own annotations. Owned by the
        LeaderWorkerSet "chat"."""
        leader = self._obj["spec"]["podSets"][0]
        leader.update(name="leader", count=1)
        worker = copy.deepcopy(leader)
        worker.update(name="worker", count=workers)
        worker["template"]["metadata"]["annotations"] = {
            ann.PREFIX + k.replace("_", "-"): v for k, v in notes.items()
        }
        self._obj["spec"]["podSets"].append(worker)
        return self.owned_by("LeaderWorkerSet", "chat")

    def topology(self, levels: list[str], *domains: tuple[list[str], int]) -> WorkloadBuilder:
        """Kueue's Topology Aware Scheduling assignment of pod set 0: one slice per domain (its
        value at each level, its pod count), universal values, as Kueue writes a single domain."""
        slices = [
            {
                "domainCount": 1,
                "valuesPerLevel": [{"universal": v} for v in values],
                "podCounts": {"universal": count},
            }
            for values, count in domains
        ]
        self._obj["status"]["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [
                {"name": "main", "flavors": {}, "topologyAssignment": {"levels": levels, "slices": slices}}
            ],
        }
        return self

    def check(self, state: str, **extra: Any) -> WorkloadBuilder:
        self._obj["status"]["admissionChecks"] = [{"name": CHECK, "state": state, "message": "", **extra}]
        return self

    def without_quota(self) -> WorkloadBuilder:
        self._obj["status"]["conditions"] = []
        return self

    def owned_by(self, kind: str, name: str) -> WorkloadBuilder:
        version = {
            "Pod": "v1",
            "StatefulSet": "apps/v1",
            "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1",
        }.get(kind, "batch/v1")
        ref = {"apiVersion": version, "kind": kind, "name": name, "uid": f"uid-{name}", "controller": True}
        self._obj["metadata"]["ownerReferences"] = [ref]
        return self

    def as_pods_workload(self, pod: str) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
        """As Kueue's pod integration makes it for `pod`: owned by the Pod, its template the Pod's
        spec and no metadata. Returns the Workload and the Pod's metadata (`World.owners`)."""
        obj = self.owned_by("Pod", pod).obj()
        tpl = obj["spec"]["podSets"][0]["template"]
        notes = tpl.pop("metadata")["annotations"]
        return obj, {"annotations": notes, "labels": {"kueue.x-k8s.io/queue-name": "serving"}}

    def as_statefulsets_workload(self, sts: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """As Kueue's statefulset integration makes it for `sts`: owned by the StatefulSet, one pod
        set of its replicas, the template's spec and no metadata. Returns the Workload and the
        StatefulSet (as its informer keeps it) whose pod template carries the keys."""
        obj = self.owned_by("StatefulSet", sts).obj()
        # Kueue lists the group's Pods as owners too, after the StatefulSet.
        obj["metadata"]["ownerReferences"] += [
            {"apiVersion": "v1", "kind": "Pod", "name": f"{sts}-{i}", "uid": f"uid-{sts}-{i}"}
            for i in range(2)
        ]
        tpl = obj["spec"]["podSets"][0]["template"]
        notes = tpl.pop("metadata")["annotations"]
        owner = {
            "metadata": {"name": sts, "namespace": obj["metadata"]["namespace"], "annotations": {}},
            "spec": {"template": {"metadata": {"annotations": notes, "labels": {}}}},
        }
        return obj, owner

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._obj)


def chat(name: str = "chat", namespace: str = "team-a") -> WorkloadBuilder:
    """A latency-class chat server with a good EAGLE-3 drafter: speculates on an idle GPU."""
    return WorkloadBuilder(name, namespace).annotate(
        model="llama-3.1-8b", drafter="eagle3", acceptance_rate="0.8", latency_class="latency"
    )


def node(
    name: str, jurisdiction: str | None = "eu", gpus: int = 4, product: str = "NVIDIA-H100-80GB-HBM3"
) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": product}
    if jurisdiction is not None:
        labels[JURISDICTION] = jurisdiction
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


def snapshot(readings: dict[tuple[str, int], float], observed_at: float = NOW) -> Snapshot:
    """Tensor activity per (node, GPU): 0.0 is idle, 1.0 saturated."""
    return Snapshot(
        gpus={k: GpuReading(k[0], k[1], v, TENSOR, observed_at) for k, v in readings.items()}, fetched_at=NOW
    )


def policy(**spec: Any) -> PolicySpec:
    base: dict[str, Any] = {"telemetry": {"source": "prometheus", "prometheusURL": "http://prometheus:9090"}}
    base.update(spec)
    return PolicySpec.model_validate(base)


def cached_owners(*workloads: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, dict[str, str]]]:
    """`World.owners` with each workload's owner cached, carrying none of our keys (a Job's, a
    LeaderWorkerSet's: their keys are on the Workload's pod templates)."""
    from sovereignspec.operator.border.workloads import owner_of

    return {
        (wl["metadata"]["namespace"], *owner_of(wl)): {"annotations": {}, "labels": {}} for wl in workloads
    }


def world(
    workloads: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    spec: PolicySpec,
    namespaces: dict[str, dict[str, str]] | None = None,
    owners: dict[tuple[str, str, str], dict[str, dict[str, str]]] | None = None,
    pods: list[dict[str, Any]] | None = None,
) -> World:
    ns = namespaces if namespaces is not None else {"team-a": {"sovereignspec.io/jurisdiction": "eu"}}
    return World(workloads, nodes, {}, ns, pods or [], owners or {}, {CHECK: spec})
