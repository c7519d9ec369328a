"""Which nodes a workload may be placed on now: readiness, cordons, taints and tolerations."""

from __future__ import annotations

from typing import Any

import pytest

from sovereignspec.operator.border.nodes import node_pool
from sovereignspec.operator.border.objects import NodeView


def node(name: str, *, ready: str | None = None, taints: list[dict[str, str]] | None = None,
         cordoned: bool = False, labels: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    status: dict[str, Any] = {}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": ready, "reason": "Kubelet" + ready}]
    return {
        "metadata": {"name": name, "labels": {"gpu": "yes", **(labels or {})}},
        "spec": {"taints": taints or [], "unschedulable": cordoned},
        "status": status,
    }


def workload(tolerations: list[dict[str, str]] | None = None, flavor: str = "gpu") -> dict[str, Any]:
    return {
        "metadata": {"name": "w", "namespace": "n"},
        "spec": {"podSets": [{"name": "main", "template": {"spec": {"tolerations": tolerations or []}}}]},
        "status": {"admission": {"podSetAssignments": [{"flavors": {"nvidia.com/gpu": flavor}}]}},
    }


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("n", "why"),
    [
        (node("plain"), None),  # nobody reports on it: available (simulated nodes)
        (node("ready", ready="True"), None),
        (node("down", ready="Unknown"), "not Ready (KubeletUnknown)"),
        (node("sick", ready="False"), "not Ready (KubeletFalse)"),
        (node("cordon", cordoned=True), "cordoned"),
        (
            node("gone", taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]),
            "tainted node.kubernetes.io/unreachable:NoExecute",
        ),
        (node("prefer", taints=[{"key": "node.kubernetes.io/x", "effect": "PreferNoSchedule"}]), None),
        (node("gpu-pool", ready="True", taints=[GPU_TAINT]), None),  # lasting: decided per workload
    ],
)
def test_a_node_takes_no_new_work_while_it_is_down_cordoned_or_transiently_tainted(
    n: dict[str, Any], why: str | None
) -> None:
    assert NodeView.of(n).unavailable == why


@pytest.mark.parametrize(
    ("tolerations", "flavor_tolerations", "in_pool"),
    [
        ([], [], False),
        ([{"key": "nvidia.com/gpu", "operator": "Exists"}], [], True),
        ([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}], [], True),
        ([{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}], [], False),
        ([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}], [], False),
        ([{"operator": "Exists"}], [], True),  # tolerates everything
        ([], [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}], True),
    ],
)
def test_a_lasting_taint_keeps_a_node_out_of_the_pool_of_workloads_that_do_not_tolerate_it(
    tolerations: list[dict[str, str]], flavor_tolerations: list[dict[str, str]], in_pool: bool
) -> None:
    nodes = [NodeView.of(node("tainted", taints=[GPU_TAINT])), NodeView.of(node("open"))]
    flavors, extra = {"gpu": {"gpu": "yes"}}, {"gpu": flavor_tolerations}
    pool, flavor = node_pool(workload(tolerations), nodes, flavors, extra)
    assert flavor == "gpu"
    assert ("tainted" in pool) is in_pool
    assert "open" in pool


def test_a_node_that_is_down_stays_in_the_pool_so_its_workloads_wait_rather_than_fail() -> None:
    down = node(
        "down", ready="Unknown", taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]
    )
    pool, _ = node_pool(workload(), [NodeView.of(down)], {"gpu": {"gpu": "yes"}})
    assert pool == frozenset({"down"})
