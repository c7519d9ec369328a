"""Simulated GPU nodes and Kueue objects from `deploy/examples/`, created through the API.

There is no kubelet, so Node objects (with their labels and `nvidia.com/gpu` capacity in status)
are written by this harness, exactly as the manifests describe them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from localdev.controlplane import REPO

EXAMPLES = REPO / "deploy" / "examples"


def documents(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc:
            yield doc


NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def apply_node(api: client.ApiClient, node: dict[str, Any]) -> None:
    """Create or update a Node, then write its status (capacity) through the status subresource.

    As a kubelet and the node lifecycle controller would for a healthy node: a Ready condition,
    and no `node.kubernetes.io/not-ready` taint (the API server's TaintNodesByCondition admission
    puts it on every new Node; the controller lifts it once the kubelet reports Ready). SovereignSpec
    places nothing on a node that is not Ready or carries it."""
    core = client.CoreV1Api(api)
    body = {k: v for k, v in node.items() if k != "status"}
    try:
        core.create_node(cast(Any, body))
    except ApiException as exc:
        if exc.status != 409:
            raise
        core.patch_node(
            node["metadata"]["name"], {"metadata": {"labels": node["metadata"].get("labels", {})}}
        )
    name = node["metadata"]["name"]
    status = dict(node.get("status") or {})
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status.setdefault(
        "conditions",
        [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "simulated node",
          "lastHeartbeatTime": now, "lastTransitionTime": now}],
    )  # fmt: skip
    core.patch_node_status(name, {"status": status})
    taints = core.read_node(name).spec.taints or []
    if any(t.key == NOT_READY_TAINT for t in taints):
        kept = [t.to_dict() for t in taints if t.key != NOT_READY_TAINT]
        core.patch_node(
            name, {"spec": {"taints": [{k: v for k, v in t.items() if v is not None} for t in kept]}}
        )


def apply_examples(
    api: client.ApiClient, files: tuple[str, ...] = ("00-gpu-nodes.yaml",)
) -> list[dict[str, Any]]:
    """Apply example manifests (server-side apply for everything but Nodes); returns the documents."""
    applied = []
    for name in files:
        for doc in documents(EXAMPLES / name):
            if doc["kind"] == "Node":
                apply_node(api, doc)
            else:
                server_side_apply(api, doc, "sovereignspec-examples")
            applied.append(doc)
    return applied


def server_side_apply(api: client.ApiClient, doc: dict[str, Any], manager: str, subresource: str = "") -> Any:
    """PATCH with application/apply-patch+yaml to the object's URL (any kind, any group)."""
    group_version = doc["apiVersion"]
    kind = doc["kind"]
    meta = doc["metadata"]
    plural = _plural(api, group_version, kind)
    prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
    ns = f"/namespaces/{meta['namespace']}" if meta.get("namespace") else ""
    path = f"{prefix}{ns}/{plural}/{meta['name']}" + (f"/{subresource}" if subresource else "")
    resp = api.call_api(
        *api.param_serialize(
            method="PATCH",
            resource_path=path,
            query_params=[("fieldManager", manager), ("force", "true")],
            header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
            body=doc,
            auth_settings=["BearerToken"],
        )
    )
    data = resp.read()
    if resp.status >= 400:  # call_api does not raise: a refused apply must not pass for done
        raise client.ApiException(status=resp.status, reason=data.decode(errors="replace")[:800])
    return data


_PLURALS: dict[tuple[str, str], str] = {}


def _plural(api: client.ApiClient, group_version: str, kind: str) -> str:
    key = (group_version, kind)
    if key not in _PLURALS:
        if group_version == "v1":
            resources = client.CoreV1Api(api).get_api_resources().resources
        else:
            group, version = group_version.split("/")
            resources = client.CustomObjectsApi(api).get_api_resources(group, version).resources
        for r in resources:
            if "/" not in r.name:
                _PLURALS[(group_version, r.kind)] = r.name
    return _PLURALS[key]
