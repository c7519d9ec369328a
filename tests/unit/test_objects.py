"""The typed views of API objects (operator/border/objects.py): what a Node is read as, once per tick."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from sovereignspec.operator.border.objects import (
    MAX_NODE_GPUS,
    MultiKueueStatus,
    NodeView,
    PodView,
    Taint,
    controlling_owner,
)
from sovereignspec.operator.border.world import World
from sovereignspec.operator.roles.audit import workload_fields


def raw(name: str = "n1", labels: dict[str, Any] | None = None, **rest: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, **rest}


def test_a_node_is_named_by_its_hostname_label_and_by_its_name_where_it_has_none() -> None:
    assert NodeView.of(raw("n1", {"kubernetes.io/hostname": "host-1"})).hostname == "host-1"
    assert NodeView.of(raw("n1")).hostname == "n1"
    assert NodeView.of(raw("n1", {"kubernetes.io/hostname": ""})).hostname == "n1"


def test_label_values_are_read_as_strings() -> None:
    assert NodeView.of(raw(labels={"gen": 9, "zone": "a"})).labels == {"gen": "9", "zone": "a"}


@pytest.mark.parametrize(
    ("status", "gpus", "error"),
    [
        ({"allocatable": {"nvidia.com/gpu": "8"}}, 8, None),
        ({"capacity": {"nvidia.com/gpu": "4"}}, 4, None),  # no allocatable yet: its capacity
        ({"allocatable": {"nvidia.com/gpu": "2"}, "capacity": {"nvidia.com/gpu": "8"}}, 2, None),
        ({}, 0, None),
        ({"allocatable": {"cpu": "64"}}, 0, None),
        ({"allocatable": {"nvidia.com/gpu": str(MAX_NODE_GPUS)}}, MAX_NODE_GPUS, None),
        ({"allocatable": {"nvidia.com/gpu": str(MAX_NODE_GPUS + 1)}}, MAX_NODE_GPUS, None),
        ({"allocatable": {"nvidia.com/gpu": "1.5"}}, 0, "Node n1 status.allocatable[nvidia.com/gpu]"),
        ({"allocatable": {"nvidia.com/gpu": "eight"}}, 0, "Node n1 status.allocatable[nvidia.com/gpu]"),
    ],
    ids=["allocatable", "capacity", "allocatable-first", "none", "no-gpus", "at-cap", "past-cap",
         "fraction", "garbage"],
)  # fmt: skip
def test_a_nodes_gpus_are_its_allocatable_count_capped_and_an_unreadable_count_is_zero_and_said(
    status: dict[str, Any], gpus: int, error: str | None
) -> None:
    view = NodeView.of(raw(status=status))
    assert view.gpus == gpus
    if error is None:
        assert view.gpu_error is None
    else:
        assert view.gpu_error is not None and view.gpu_error.startswith(error)


def test_only_taints_that_block_scheduling_are_kept_and_node_kubernetes_io_ones_are_transient() -> None:
    view = NodeView.of(
        raw(
            spec={
                "taints": [
                    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                    {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                    {"key": "soft", "effect": "PreferNoSchedule"},
                    "not a taint",
                ]
            }
        )
    )
    assert view.taints == (
        Taint("nvidia.com/gpu", "present", "NoSchedule"),
        Taint("node.kubernetes.io/unreachable", "", "NoExecute"),
    )
    assert [t.transient for t in view.taints] == [False, True]
    assert view.unavailable == "tainted node.kubernetes.io/unreachable:NoExecute"


def test_cordoned_is_said_before_not_ready_and_not_ready_before_a_taint() -> None:
    down = {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}
    taints = {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]}
    assert NodeView.of(raw(spec={"unschedulable": True, **taints}, status=down)).unavailable == "cordoned"
    assert NodeView.of(raw(spec=taints, status=down)).unavailable == "not Ready (NodeStatusUnknown)"
    assert NodeView.of(raw(status={"conditions": [{"type": "Ready", "status": "True"}]})).unavailable is None


def test_a_view_is_frozen_and_a_world_parses_its_nodes_once() -> None:
    view = NodeView.of(raw())
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.name = "other"  # type: ignore[misc]
    world = World(workloads=[], nodes=[raw("a"), raw("b")], flavors={})
    assert [n.name for n in world.node_views] == ["a", "b"]
    assert world.node_views is world.node_views


def pod(
    node: str | None = "n1", phase: str | None = "Running", gpus: str = "2", **meta: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "team-a", "uid": "u1", **meta},
        "spec": {"nodeName": node, "containers": [
            {"resources": {"limits": {"nvidia.com/gpu": gpus}}},
            {"resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "9"}}},
        ]},
        "status": {"phase": phase},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("node", "phase", "running"),
    [("n1", "Running", True), ("n1", "Pending", True), ("n1", None, True), ("n1", "Succeeded", False),
     ("n1", "Failed", False), (None, "Running", False), ("", "Running", False)],
)  # fmt: skip
def test_a_pod_holds_its_gpus_while_it_is_bound_and_has_not_ended(
    node: str | None, phase: str | None, running: bool
) -> None:
    view = PodView.of(pod(node, phase))
    assert view.running is running
    assert view.node == (node or None)


def test_a_pods_gpus_are_each_containers_request_else_its_limit_and_an_unreadable_one_is_said() -> None:
    assert PodView.of(pod()).gpus == 3  # 2 (limit) + 1 (the request, before its limit)
    bad = PodView.of(pod(gpus="lots"))
    assert (bad.gpus, bad.gpu_error is not None) == (0, True)
    assert bad.gpu_error is not None and bad.gpu_error.startswith("UnreadableFieldError: spec.containers[0]")


def test_a_pod_is_owned_by_its_controller_else_its_first_owner_and_may_name_its_groups_workload() -> None:
    refs = [{"kind": "ReplicaSet", "name": "rs"}, {"kind": "Job", "name": "chat", "controller": True}]
    view = PodView.of(pod(ownerReferences=refs, labels={"kueue.x-k8s.io/prebuilt-workload-name": "wl-1"}))
    assert view.owners == (("ReplicaSet", "rs"), ("Job", "chat"))
    assert (view.controller, view.prebuilt) == (("Job", "chat"), "wl-1")
    first = PodView.of(pod(ownerReferences=[refs[0], {"kind": "Job", "name": "other"}]))
    assert (first.controller, first.prebuilt) == (("ReplicaSet", "rs"), None)
    assert PodView.of(pod()).controller is None


def test_a_workloads_record_names_the_same_owner_a_pod_view_does_and_skips_unreadable_refs() -> None:
    refs: list[Any] = ["garbage", {"kind": "LeaderWorkerSet", "name": "lws"}, {"kind": "Job", "name": "j"}]
    meta = {"namespace": "a", "name": "wl", "uid": "u", "ownerReferences": refs}
    assert controlling_owner(meta) == ("LeaderWorkerSet", "lws")
    assert workload_fields(meta)["owner"] == {"kind": "LeaderWorkerSet", "name": "lws"}
    assert workload_fields({"name": "wl"})["owner"] == {}


def test_a_pods_end_is_its_containers_last_finish() -> None:
    raw = pod(phase="Failed")
    raw["status"].update(startTime="2026-12-07T10:00:00Z", containerStatuses=[
        {"state": {"terminated": {"finishedAt": "2026-12-07T11:00:00Z"}}},
        {"state": {"terminated": {"finishedAt": "2026-12-07T11:30:00Z"}}},
        {"state": {"running": {"startedAt": "2026-12-07T12:00:00Z"}}},
    ])  # fmt: skip
    view = PodView.of(raw)
    assert (view.started_at, view.finished_at, view.raw is raw) == (
        "2026-12-07T10:00:00Z",
        "2026-12-07T11:30:00Z",
        True,
    )
    assert PodView.of(pod()).finished_at is None


def test_a_multikueue_status_says_where_a_workload_holds_gpus() -> None:
    admitted = MultiKueueStatus.of({"status": {"clusterName": "eu", "nominatedClusterNames": ["eu", "kr"]}})
    assert admitted.where == "eu"
    assert MultiKueueStatus.of({"status": {"nominatedClusterNames": ["kr"]}}).where == "kr"
    assert MultiKueueStatus.of({"status": {"nominatedClusterNames": ["eu", "kr"]}}).where is None
    odd = MultiKueueStatus.of({"status": {"clusterName": "", "nominatedClusterNames": [3, "kr"],
                                          "admissionChecks": [{"name": "mk"}, "junk"]}})  # fmt: skip
    assert (odd.cluster, odd.nominated, odd.checks, odd.where) == (None, ("kr",), ("mk",), "kr")
    assert MultiKueueStatus.of({}) == MultiKueueStatus(None, (), ())
