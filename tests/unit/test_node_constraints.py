"""A pod set's own node constraints narrow where it may be placed: its nodeSelector and its
required node affinity (the scheduler holds each pod to them beside our pin), on every pod set.
A workload no node of its jurisdiction satisfies, now or ever, is Rejected saying so; one whose
nodes exist but are full waits. And what the cache keeps of those constraints is bounded: past a
bound, the workload is Rejected naming the field, never held whole."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.border import workloads as wls
from sovereignspec.operator.border.cuts import strip_workload
from sovereignspec.operator.border.nodes import node_pool
from sovereignspec.operator.border.objects import NodeView
from sovereignspec.operator.border.workloads import UnreadableFieldError
from sovereignspec.operator.decision.plan import Write, plan
from sovereignspec.operator.decision.view import build
from sovereignspec.profiles import load_profiles
from tests.unit.builders import (
    CHECK,
    JURISDICTION,
    NOW,
    STAMP,
    cached_owners,
    chat,
    node,
    policy,
    snapshot,
    world,
)

A100 = "NVIDIA-A100-SXM4-80GB"
NODES = [node("eu-1", "eu"), node("eu-2", "eu", product=A100), node("kr-1", "kr")]
IDLE = snapshot({(n, g): 0.0 for n in ("eu-1", "eu-2", "kr-1") for g in range(4)})


@functools.cache
def profiles() -> ProfileSet:
    return load_profiles()


def decide(wl: dict[str, Any], namespace_jurisdiction: str = "kr", nodes: list[Any] = NODES) -> Write:
    spec = policy()
    namespaces = {"team-a": {"sovereignspec.io/jurisdiction": namespace_jurisdiction}}
    view = build(
        world([wl], nodes, spec, namespaces, cached_owners(wl)), {CHECK}, spec, profiles(), IDLE, NOW
    )
    (write,) = plan("default", spec, view, profiles(), STAMP)
    return write


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, **({"values": list(values)} if values else {})}


def with_affinity(wl: dict[str, Any], *terms: dict[str, Any], pod_set: int = 0) -> dict[str, Any]:
    spec = wl["spec"]["podSets"][pod_set]["template"]["spec"]
    spec["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }
    return wl


def pinned(write: Write) -> str:
    (update, *_) = write.pod_set_updates or [{}]
    return str(update["nodeSelector"]["kubernetes.io/hostname"])


@pytest.mark.parametrize(
    ("why", "terms"),
    [
        ("an eu node by name", [{"matchFields": [expr("metadata.name", "In", "eu-1")]}]),
        ("the eu jurisdiction", [{"matchExpressions": [expr(JURISDICTION, "In", "eu")]}]),
        ("not kr", [{"matchExpressions": [expr(JURISDICTION, "NotIn", "kr")]}]),
        ("a GPU no kr node has", [{"matchExpressions": [expr("nvidia.com/gpu.product", "In", A100)]}]),
        ("a label no node has", [{"matchExpressions": [expr("pool", "Exists")]}]),
    ],
)  # fmt: skip
def test_a_required_affinity_no_node_of_its_jurisdiction_meets_is_rejected_saying_so(
    why: str, terms: list[dict[str, Any]]
) -> None:
    # A kr namespace: before, Ready with a kr hostname pin that the pod's own affinity refuses, so
    # it never schedules while its GPUs are held.
    write = decide(with_affinity(chat("x").obj(), *terms))
    assert (write.state, write.pod_set_updates) == ("Rejected", None), (why, write.message)
    assert any(
        said in write.message
        for said in (
            "no node of its flavor and node constraints in jurisdiction kr",
            "required node affinity",
        )
    ), write.message


def test_a_required_affinity_narrows_the_nodes_and_terms_are_ored() -> None:
    product = {"matchExpressions": [expr("nvidia.com/gpu.product", "In", A100)]}
    write = decide(with_affinity(chat("x").obj(), product), "eu")
    assert (write.state, pinned(write)) == ("Ready", "eu-2"), write.message
    by_name = {"matchFields": [expr("metadata.name", "In", "eu-1")]}
    assert pinned(decide(with_affinity(chat("x").obj(), by_name), "eu")) == "eu-1"
    either = decide(with_affinity(chat("x").gpus("4").obj(), by_name, product), "eu")
    assert pinned(either) in ("eu-1", "eu-2")


def test_an_empty_term_meets_no_node_as_kubernetes_reads_it() -> None:
    write = decide(with_affinity(chat("x").obj(), {}), "eu")
    assert write.state == "Rejected", write.message


def test_every_pod_set_constraints_count_not_only_the_first() -> None:
    # The leader may go anywhere in eu; the worker's template wants the A100 node: so does the group.
    wl = chat("lws-x-0").leader_and_workers(1).obj()
    with_affinity(wl, {"matchExpressions": [expr("nvidia.com/gpu.product", "In", A100)]}, pod_set=1)
    write = decide(wl, "eu")
    assert write.state == "Ready", write.message
    assert {u["nodeSelector"].get("kubernetes.io/hostname") for u in write.pod_set_updates or []} == {"eu-2"}


def test_a_workload_whose_constrained_nodes_are_full_waits_rather_than_being_rejected() -> None:
    by_name = {"matchFields": [expr("metadata.name", "In", "eu-1")]}
    write = decide(
        with_affinity(chat("x").gpus("4").obj(), by_name), "eu", [node("eu-1", "eu", gpus=2), *NODES[1:]]
    )
    assert write.state == "Rejected", write.message  # 4 GPUs on a node of 2: never
    big = node("eu-1", "eu", gpus=8)
    big["spec"] = {"unschedulable": True}  # there, cordoned now: it waits for it
    write = decide(with_affinity(chat("x").gpus("4").obj(), by_name), "eu", [big, *NODES[1:]])
    assert write.state == "Retry", write.message


@pytest.mark.parametrize(
    ("rule", "named"),
    [
        (expr("zone", "Near", "a"), "operator 'Near'"),
        (expr("zone", "In"), "not what operator In takes"),
        (expr("gen", "Gt", "x"), "not what operator Gt takes"),
        (expr("zone", "Exists", "a"), "not what operator Exists takes"),
    ],
)
def test_an_affinity_that_cannot_be_read_is_rejected_naming_the_field(
    rule: dict[str, Any], named: str
) -> None:
    write = decide(with_affinity(chat("x").obj(), {"matchExpressions": [rule]}), "eu")
    assert write.state == "Rejected", write.message
    assert "spec.podSets[0].template.spec.affinity.nodeAffinity" in write.message and named in write.message


def test_gt_and_lt_compare_label_values_as_integers() -> None:
    nodes = [node("eu-1", "eu"), node("eu-2", "eu")]
    nodes[0]["metadata"]["labels"]["gen"] = "9"
    nodes[1]["metadata"]["labels"]["gen"] = "10"
    wl = with_affinity(chat("x").obj(), {"matchExpressions": [expr("gen", "Gt", "9")]})
    assert node_pool(wl, [NodeView.of(n) for n in nodes], {})[0] == {"eu-2"}
    wl = with_affinity(chat("x").obj(), {"matchExpressions": [expr("gen", "Lt", "10")]})
    assert node_pool(wl, [NodeView.of(n) for n in nodes], {})[0] == {"eu-1"}


# -- what the cache keeps of the constraints -----------------------------------------------------


def test_a_stripped_workload_keeps_its_constraints_and_decides_as_the_whole_one() -> None:
    wl = with_affinity(chat("x").obj(), {"matchExpressions": [expr("nvidia.com/gpu.product", "In", A100)]})
    tpl = wl["spec"]["podSets"][0]["template"]
    tpl["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    tpl["spec"]["nodeSelector"] = {JURISDICTION: "eu"}
    tpl["metadata"]["labels"] = {f"team.example.com/l{i}": "v" * 63 for i in range(2000)}
    kept = strip_workload(json.loads(json.dumps(wl)))
    assert len(json.dumps(kept)) < 3_000 < len(json.dumps(wl)) // 40
    assert kept["spec"]["podSets"][0]["template"]["metadata"]["labels"] == {}
    whole, cut = decide(wl, "eu"), decide(kept, "eu")
    assert (cut.state, cut.message) == (whole.state, whole.message) and pinned(cut) == "eu-2"


TERMS = "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


ANY, MANY = expr("a", "Exists"), expr("a", "In", *map(str, range(257)))


@pytest.mark.parametrize(
    ("field", "grow"),
    [
        ("nodeSelector: 65 entries", {"nodeSelector": {f"k{i}": "v" for i in range(65)}}),
        ("tolerations: 65", {"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(65)]}),
        ("containers: 65", {"containers": [{"name": f"c{i}"} for i in range(65)]}),
        (f"{TERMS}: 17 terms", {"affinity": required(*[{"matchExpressions": [ANY]}] * 17)}),
        (f"{TERMS}: 65 requirements", {"affinity": required({"matchExpressions": [ANY] * 65})}),
        (f"{TERMS}: 257 values", {"affinity": required({"matchExpressions": [MANY]})}),
    ],
    ids=["selector", "tolerations", "containers", "terms", "requirements", "values"],
)  # fmt: skip
def test_a_constraint_past_its_bound_is_not_kept_and_the_workload_is_rejected_naming_it(
    field: str, grow: Any
) -> None:
    wl = chat("x").obj()
    wl["spec"]["podSets"][0]["template"]["spec"].update(grow)
    kept = strip_workload(json.loads(json.dumps(wl)))
    assert len(json.dumps(kept)) < 3_000
    with pytest.raises(UnreadableFieldError, match="accepted: at most"):
        node_pool(kept, [NodeView.of(n) for n in NODES], {})
    write = decide(kept, "eu")
    assert write.state == "Rejected" and f"spec.podSets[0].template.spec.{field}" in write.message, (
        write.message
    )
    assert wls.BEYOND_BOUNDS not in write.message and "UnreadableFieldError" not in write.message
