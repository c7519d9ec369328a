"""Small builders for Kueue objects (v1beta2), for the tests, the demo and the benchmarks."""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client

from localdev.gpunodes import server_side_apply

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
TEST_MANAGER = "sovereignspec-e2e"


def apply(api: client.ApiClient, doc: dict[str, Any], manager: str = TEST_MANAGER) -> None:
    server_side_apply(api, doc, manager)


def resource_flavor(name: str, node_labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": node_labels},
    }


def admission_check(name: str, controller: str, parameters: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"controllerName": controller}
    if parameters:
        spec["parameters"] = parameters
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AdmissionCheck",
        "metadata": {"name": name},
        "spec": spec,
    }


def set_check_active(api: client.ApiClient, name: str, manager: str, active: bool = True) -> None:
    status = {
        "conditions": [
            {
                "type": "Active",
                "status": "True" if active else "False",
                "reason": "Active" if active else "BadParametersRef",
                "message": "set by the test",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
    }
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AdmissionCheck",
        "metadata": {"name": name},
        "status": status,
    }
    server_side_apply(api, body, manager, "status")


def cluster_queue(name: str, flavors: dict[str, int], checks: list[str], cpu: str = "1000") -> dict[str, Any]:
    """A ClusterQueue over `flavors` (flavor -> GPUs) with `checks`. Kueue refuses empty lists:
    a queue without flavors has no resource group, one without checks no strategy."""
    spec: dict[str, Any] = {"namespaceSelector": {}}
    if flavors:
        quota = [
            {
                "name": f,
                "resources": [
                    {"name": "cpu", "nominalQuota": cpu},
                    {"name": "nvidia.com/gpu", "nominalQuota": g},
                ],
            }
            for f, g in flavors.items()
        ]
        spec["resourceGroups"] = [{"coveredResources": ["cpu", "nvidia.com/gpu"], "flavors": quota}]
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
    }


def local_queue(name: str, namespace: str, cluster_queue_name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }


def job(
    name: str,
    namespace: str,
    queue: str,
    annotations: dict[str, str] | None = None,
    gpus: int = 1,
    suspend: bool | None = True,
    cpu: str = "1",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "template": {
            "metadata": {"annotations": annotations or {}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "server",
                        "image": "vllm/vllm-openai:latest",
                        "resources": {
                            "requests": {"cpu": cpu, "nvidia.com/gpu": str(gpus)},
                            "limits": {"nvidia.com/gpu": str(gpus)},
                        },
                    }
                ],
            },
        }
    }
    if suspend is not None:
        spec["suspend"] = suspend
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": spec,
    }


CARRIES = ("annotations", "labels", "affinity")


def flooded_job(
    name: str, namespace: str, queue: str, notes: dict[str, str], kib: int, carry: str = "all", seed: int = 0
) -> dict[str, Any]:
    """A Job whose pod template carries `kib` KiB of what SovereignSpec does not read besides
    `notes`: in one annotation, in labels (63-character values, as many as it takes), in a
    preferred node affinity (values of 63 characters); "all": a third of each (`make
    bench-flood`, tests/cluster/test_flood.py)."""
    body = job(name, namespace, queue, annotations=dict(notes))
    template = body["spec"]["template"]
    kinds = CARRIES if carry == "all" else (carry,)
    size = kib * 1024 // len(kinds)
    if "annotations" in kinds:
        template["metadata"]["annotations"]["team.example.com/blob"] = "x" * size
    if "labels" in kinds:
        # every value its own (one shared value would be one string in the operator's memory)
        template["metadata"]["labels"] = {
            f"team.example.com/l{j:05d}": f"{seed:010d}-{j:05d}-".ljust(63, "v") for j in range(size // 90)
        }
    if "affinity" in kinds:
        values = [f"{seed:010d}-{j:06d}".ljust(63, "z") for j in range(size // 66)]
        term = {"matchExpressions": [{"key": "team.example.com/rack", "operator": "NotIn", "values": values}]}
        template["spec"]["affinity"] = {
            "nodeAffinity": {
                # within the bounds kept: read, and met by every node
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "team.example.com/rack", "operator": "DoesNotExist"}]}
                    ]
                },
                # never read by SovereignSpec: not kept
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": term}],
            }
        }
    return body


def workloads(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    listed = cast(dict[str, Any], client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, "workloads"))  # fmt: skip
    return list(listed["items"])


def condition(wl: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in wl.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def check_state(wl: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in wl.get("status", {}).get("admissionChecks", []) if c["name"] == name), None)


def set_check_state(
    api: client.ApiClient, wl: dict[str, Any], check: str, state: str, message: str, manager: str
) -> None:
    """Write one admission-check entry of a Workload by server-side apply (another controller's way)."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Workload",
        "metadata": {"name": wl["metadata"]["name"], "namespace": wl["metadata"]["namespace"]},
        "status": {"admissionChecks": [{"name": check, "state": state, "message": message,
                                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
    }  # fmt: skip
    server_side_apply(api, body, manager, "status")
