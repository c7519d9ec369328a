"""Every pod set of a workload is held to the same rules: a LeaderWorkerSet group with a leader
template is one Workload of two pod sets (Kueue's "leader" and "worker"), each pod running what
its own template says. The strictest sovereignty declared on any of them binds the group; a
contradiction, a look-alike key, another tenant or our output keys forged on any pod set is
Rejected before Kueue can ungate a pod. And a workload whose owner the caches do not hold yet
waits, saying so, instead of being decided without its keys."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.decision.plan import Write, plan
from sovereignspec.operator.decision.view import build
from sovereignspec.profiles import load_profiles
from tests.engine_keys import OUT_VLLM
from tests.unit.builders import CHECK, NOW, STAMP, cached_owners, chat, node, policy, snapshot, world

# team-a may run in eu and in kr (the policy's tenancy); h-eu and h-kr have 8 idle GPUs each.
NODES = [node("h-eu", "eu", gpus=8), node("h-kr", "kr", gpus=8)]
IDLE = snapshot({(n, g): 0.0 for n in ("h-eu", "h-kr") for g in range(8)})
NAMESPACES: dict[str, dict[str, str]] = {"team-a": {}}


@functools.cache
def profiles() -> ProfileSet:
    return load_profiles()


def decide(wl: dict[str, Any], owners: dict[Any, Any] | None = None) -> Write:
    spec = policy(tenancy={"namespaces": {"team-a": {"jurisdictions": ["eu", "kr"]}}})
    owners = cached_owners(wl) if owners is None else owners
    view = build(world([wl], NODES, spec, NAMESPACES, owners), {CHECK}, spec, profiles(), IDLE, NOW)
    (write,) = plan("default", spec, view, profiles(), STAMP)
    return write


def group(leader: dict[str, str], workers: dict[str, str]) -> dict[str, Any]:
    """A group of a leader and one worker of 4 GPUs each, with our keys as given on each template."""
    return chat("lws-chat-0").annotate(**leader).gpus("4").leader_and_workers(1, **workers).obj()


def hosts(write: Write) -> set[str]:
    """The nodes a Ready decision pins or counts its pods on."""
    out = set()
    for update in write.pod_set_updates or []:
        selector = update["nodeSelector"]
        if "kubernetes.io/hostname" in selector:
            out.add(selector["kubernetes.io/hostname"])
        for item in str(update["annotations"].get(ann.OUT_NODES, "")).split(","):
            if item:
                out.add(item.rpartition("/")[0])
    return out


def test_a_jurisdiction_declared_only_on_the_worker_template_binds_the_whole_group() -> None:
    # The leader says nothing: without reading the worker's template the group could go to kr.
    for leader, workers in (({}, {"jurisdiction": "kr"}), ({"jurisdiction": "kr"}, {})):
        write = decide(group(leader, workers))
        assert write.state == "Ready", write.message
        assert hosts(write) == {"h-kr"}, (leader, workers, write.pod_set_updates)
        assert {u["name"] for u in write.pod_set_updates or []} == {"leader", "worker"}


def test_an_exclusive_node_asked_by_the_worker_alone_makes_the_group_exclusive() -> None:
    from sovereignspec.operator.decision.view import build as view_of

    spec = policy(tenancy={"namespaces": {"team-a": {"jurisdictions": ["eu", "kr"]}}})
    wl = group({}, {"exclusive_node": "true"})
    view = view_of(
        world([wl], NODES, spec, NAMESPACES, cached_owners(wl)), {CHECK}, spec, profiles(), IDLE, NOW
    )
    (pending,) = view.pending
    assert pending.request is not None and pending.request.exclusive


@pytest.mark.parametrize(
    ("leader", "workers", "said"),
    [
        ({"jurisdiction": "eu"}, {"jurisdiction": "kr"}, "jurisdiction: got 'leader=eu, worker=kr'"),
        ({}, {"tenant": "bank"}, "pod set worker: annotation sovereignspec.io/tenant: got 'bank'"),
        ({}, {"region": "eu"}, "pod set worker: annotation sovereignspec.io/region: got 'eu'"),
        ({}, {"jurisdiction": "us"}, "pod set worker: annotation sovereignspec.io/jurisdiction: got 'us'"),
        ({}, {"jurisdiction": "EU"}, "pod set worker: annotation sovereignspec.io/jurisdiction: got 'EU'"),
    ],
    ids=["split-jurisdictions", "another-tenant", "look-alike-key", "outside-the-namespace", "bad-grammar"],
)  # fmt: skip
def test_a_sovereignty_problem_on_any_pod_set_rejects_the_group_naming_the_pod_set(
    leader: dict[str, str], workers: dict[str, str], said: str
) -> None:
    write = decide(group(leader, workers))
    assert (write.state, write.pod_set_updates) == ("Rejected", None), write.message
    assert said in write.message and "sovereignty fields fail closed" in write.message, write.message


@pytest.mark.parametrize(
    ("key", "value"),
    [(ann.OUT_MODE, "speculative"), (ann.OUT_BUDGET, "4"), (OUT_VLLM, "{}"), (ann.OUT_NODES, "h-kr/0")],
)
def test_our_output_keys_forged_on_the_worker_template_reject_the_group_before_placement(
    key: str, value: str
) -> None:
    # Kueue would refuse our podSetUpdates as conflicting with the worker's template and start the
    # leader alone: refused here, no pod ungated.
    wl = group({}, {})
    wl["spec"]["podSets"][1]["template"]["metadata"]["annotations"][key] = value
    write = decide(wl)
    assert (write.state, write.pod_set_updates) == ("Rejected", None), write.message
    assert f"pod set worker: the pod template sets {key}={value!r}" in write.message, write.message
    assert "remove it from spec.template" in write.message, write.message


def test_keys_forged_on_both_templates_are_each_named_and_removing_them_is_asked() -> None:
    wl = group({}, {})
    for i, (key, value) in enumerate([(ann.OUT_MODE, "speculative"), (ann.OUT_BUDGET, "4")]):
        wl["spec"]["podSets"][i]["template"]["metadata"]["annotations"][key] = value
    write = decide(wl)
    assert write.state == "Rejected", write.message
    assert f"pod set leader: the pod template sets {ann.OUT_MODE}='speculative'" in write.message
    assert f"pod set worker: the pod template sets {ann.OUT_BUDGET}='4'" in write.message
    assert "remove them from spec.template" in write.message, write.message


def test_a_worker_templates_gpu_type_the_placement_contradicts_is_refused_naming_the_pod_set() -> None:
    # A plain-looking key passes the check before placement; placed on H100s, the worker's
    # A100 contradicts what the decision writes (its engine would read the worker's).
    wl = group({}, {})
    wl["spec"]["podSets"][1]["template"]["metadata"]["annotations"][ann.OUT_GPU_TYPE] = "A100-80G-SXM"
    write = decide(wl)
    assert (write.state, write.pod_set_updates) == ("Rejected", None), write.message
    assert f"pod set worker: the pod template sets {ann.OUT_GPU_TYPE}='A100-80G-SXM'" in write.message


def test_a_plain_mode_on_the_worker_template_gets_a_plain_decision_for_the_whole_group() -> None:
    wl = group({}, {})
    wl["spec"]["podSets"][1]["template"]["metadata"]["annotations"][ann.OUT_MODE] = "plain"
    write = decide(wl)
    assert (write.state, write.mode) == ("Ready", "plain"), write.message
    assert all(u["annotations"][ann.OUT_MODE] == "plain" for u in write.pod_set_updates or [])


def test_pod_sets_that_disagree_on_the_engine_get_plain_decode_saying_which() -> None:
    write = decide(group({"acceptance_rate": "0.8"}, {"acceptance_rate": "0.3"}))
    assert (write.state, write.mode) == ("Ready", "plain"), write.message
    (bad,) = [e for e in write.events if e.reason == "BadAnnotation"]
    assert "leader=0.8, worker=0.3" in bad.message and "the same value on every pod set" in bad.message


def test_a_single_pod_sets_messages_are_unchanged() -> None:
    write = decide(chat("x").annotate(jurisdiction="us").obj())
    assert write.state == "Rejected"
    assert "annotation sovereignspec.io/jurisdiction: got 'us'" in write.message
    assert "pod set" not in write.message, write.message


@pytest.mark.parametrize("kind", ["Pod", "StatefulSet", "LeaderWorkerSet", "Job"])
def test_a_workload_whose_owner_is_not_cached_yet_waits_saying_so_and_is_decided_once_it_is(
    kind: str,
) -> None:
    wl = chat("wl").annotate(jurisdiction="kr").owned_by(kind, "chat").obj()
    write = decide(wl, owners={})
    assert (write.state, write.outcome, write.pod_set_updates) == ("Pending", "waiting", None)
    assert write.message.startswith(f"waiting for its {kind} chat to be read"), write.message
    # Said once: the same message is not written again while it waits.
    wl["status"]["admissionChecks"][0]["message"] = write.message
    spec = policy(tenancy={"namespaces": {"team-a": {"jurisdictions": ["eu", "kr"]}}})
    view = build(world([wl], NODES, spec, NAMESPACES, {}), {CHECK}, spec, profiles(), IDLE, NOW)
    assert plan("default", spec, view, profiles(), STAMP) == []
    if kind in ("Job", "LeaderWorkerSet"):  # its keys are on the Workload: decided once it is cached
        assert hosts(decide(wl)) == {"h-kr"}


def test_a_deployments_replica_waits_for_its_deployment_where_misplaced_keys_would_be() -> None:
    wl, pod = chat("pod-chat-7d9f-x").as_pods_workload("chat-7d9f-x")
    pod["missing"] = {"Deployment": "chat"}
    write = decide(wl, owners={("team-a", "Pod", "chat-7d9f-x"): pod})
    assert (write.state, write.outcome) == ("Pending", "waiting"), write.message
    assert "waiting for its Deployment chat to be read (keys misplaced on it fail closed)" in write.message


# -- a group over nodes holds only the nodes it uses --------------------------------------------

EU3 = [node(f"eu-{i}", "eu", gpus=8) for i in (1, 2, 3)]
IDLE3 = snapshot({(f"eu-{i}", g): 0.0 for i in (1, 2, 3) for g in range(8)})


def decide_on(workloads: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> list[Write]:
    spec = policy()
    namespaces = {
        ns: {"sovereignspec.io/jurisdiction": "eu", "sovereignspec.io/tenant": ns}
        for ns in ("team-a", "bank")
    }
    owners = cached_owners(*workloads)
    view = build(world(workloads, nodes, spec, namespaces, owners), {CHECK}, spec, profiles(), IDLE3, NOW)
    return plan("default", spec, view, profiles(), STAMP)


def wide_group() -> dict[str, Any]:
    """A leader and a worker of 8 GPUs each: no node holds both."""
    return chat("lws-wide-0").gpus("8").leader_and_workers(1).obj()


def as_ready(wl: dict[str, Any], write: Write) -> dict[str, Any]:
    wl["status"]["admissionChecks"][0].update(state="Ready", podSetUpdates=write.pod_set_updates)
    return wl


def test_a_group_of_two_pod_sets_pins_each_to_its_node_and_holds_no_other() -> None:
    (write,) = decide_on([wide_group()], EU3)
    assert write.state == "Ready", write.message
    selectors = [u["nodeSelector"] for u in write.pod_set_updates or []]
    hosts = [s.get("kubernetes.io/hostname") for s in selectors]
    assert None not in hosts and len(set(hosts)) == 2, selectors  # by hostname, not the jurisdiction
    assert sorted(g.split("/")[0] for g in write.placed) == sorted(hosts), write.placed  # each pod's GPU
    assert "each pod set pinned to its node" in write.message, write.message
    # Running, it holds those two nodes: an exclusive tenant gets the third.
    bank = chat("vault", "bank").annotate(exclusive_node="true").gpus("8").obj()
    writes = {w.key: w for w in decide_on([as_ready(wide_group(), write), bank], EU3)}
    assert writes["bank/vault"].state == "Ready", writes["bank/vault"].message
    (update,) = writes["bank/vault"].pod_set_updates or []
    assert update["nodeSelector"]["kubernetes.io/hostname"] not in hosts


def test_a_group_beside_an_exclusive_tenant_is_placed_on_the_nodes_left() -> None:
    # The bank runs exclusively on eu-3: pinned by the jurisdiction's label the group would wait
    # for good (eu-3 is selected too); each pod set on its node, it fits on eu-1 and eu-2.
    bank = chat("vault", "bank").annotate(exclusive_node="true").gpus("8").obj()
    bank["status"]["admissionChecks"][0].update(
        state="Ready",
        podSetUpdates=[{"name": "main", "nodeSelector": {"kubernetes.io/hostname": "eu-3"},
                        "annotations": {ann.OUT_GPU_INDEX: "0"}}],
    )  # fmt: skip
    writes = {w.key: w for w in decide_on([bank, wide_group()], EU3)}
    group = writes["team-a/lws-wide-0"]
    assert group.state == "Ready", group.message
    hosts = {u["nodeSelector"]["kubernetes.io/hostname"] for u in group.pod_set_updates or []}
    assert hosts == {"eu-1", "eu-2"}


def test_one_pod_set_of_pods_over_nodes_is_still_pinned_by_its_jurisdiction() -> None:
    # A check writes one nodeSelector per pod set: two pods of one pod set on two nodes cannot be
    # named each; they are pinned by the jurisdiction's label as before.
    (write,) = decide_on(
        [chat("lws-main-0").gpus("8").pods(2).owned_by("LeaderWorkerSet", "chat").obj()], EU3
    )
    assert write.state == "Ready", write.message
    (update,) = write.pod_set_updates or []
    assert "kubernetes.io/hostname" not in update["nodeSelector"], update


def test_a_group_of_one_gpu_pods_on_one_gpu_nodes_pins_each_pod_set_to_its_node() -> None:
    # One GPU a pod is still a pod set's own node each (the smallest share it takes).
    narrow = chat("lws-narrow-0").gpus("1").leader_and_workers(1).obj()
    (write,) = decide_on([narrow], [node(f"eu-{i}", "eu", gpus=1) for i in (1, 2)])
    assert write.state == "Ready", write.message
    hosts = {u["nodeSelector"].get("kubernetes.io/hostname") for u in write.pod_set_updates or []}
    assert hosts == {"eu-1", "eu-2"}, write.pod_set_updates


def test_a_pod_set_of_several_pods_goes_to_a_node_with_room_for_all_of_them() -> None:
    # The leader takes eu-1; the worker's three pods of 4 GPUs fit eu-3 together, not eu-2 (room
    # for one, and first in node order): pinned there, not spread by the jurisdiction's label.
    group = chat("lws-room-0").gpus("4").leader_and_workers(3).obj()
    (write,) = decide_on(
        [group], [node("eu-1", "eu", gpus=4), node("eu-2", "eu", gpus=4), node("eu-3", "eu", gpus=12)]
    )
    assert write.state == "Ready", write.message
    hosts = [u["nodeSelector"].get("kubernetes.io/hostname") for u in write.pod_set_updates or []]
    assert hosts == ["eu-1", "eu-3"], write.pod_set_updates
    # Every pod, each on GPUs of its own (each pod committed before the next is placed).
    assert sorted(write.placed) == ["eu-1/gpu0", "eu-3/gpu0", "eu-3/gpu1", "eu-3/gpu2"]
