"""What actually runs against where it may run: every bound GPU pod against its namespace's
jurisdictions, under Kueue or not; and against how it was decided: a plain decision whose engines
draft."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

from sovereignspec.core.cluster import WorkloadRequest
from sovereignspec.engines import engine_config
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.world import World
from sovereignspec.operator.decision.ledger import Committed, handed
from sovereignspec.operator.decision.violations import ignored, violations
from sovereignspec.operator.roles.controller import Controller
from sovereignspec.operator.roles.watches import Watches
from sovereignspec.operator.runtime import metrics
from sovereignspec.profiles import load_profiles
from tests.unit.builders import CHECK, JURISDICTION, node, policy

EU_ONLY = {"team-a": {"sovereignspec.io/jurisdiction": "eu"}}


def pod(
    name: str = "p",
    on: str | None = "h-kr",
    gpus: str = "1",
    namespace: str = "team-a",
    phase: str = "Running",
    uid: str | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"},
        "spec": {"nodeName": on, "containers": [{"resources": {"requests": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": phase},
    }


NODES = [node("h-eu", "eu"), node("h-kr", "kr"), node("h-bare", None)]


def found(
    pods: list[dict[str, Any]],
    namespaces: dict[str, dict[str, str]] | None = None,
    policies: dict[str, PolicySpec] | None = None,
    nodes: list[dict[str, Any]] | None = None,
) -> list[tuple[str, str, str | None]]:
    world = World(
        [], NODES if nodes is None else nodes, {}, EU_ONLY if namespaces is None else namespaces, pods, {},
        {CHECK: policy()} if policies is None else policies,
    )  # fmt: skip
    return [(v.pod, v.node, v.jurisdiction) for v in violations(world, policy())]


@pytest.mark.parametrize(
    ("why", "pods", "expected"),
    [
        ("a GPU pod of an eu-only namespace on a kr node", [pod()], [("p", "h-kr", "kr")]),
        ("the same on an eu node", [pod(on="h-eu")], []),
        ("on a node with no jurisdiction label (fails closed)", [pod(on="h-bare")], [("p", "h-bare", None)]),
        ("a pod asking for no GPU", [pod(gpus="0")], []),
        ("a pod that has finished", [pod(phase="Succeeded")], []),
        ("a pod that failed", [pod(phase="Failed")], []),
        ("a pod not bound yet", [pod(on=None)], []),
        ("a pod on a node no longer in the cluster (the ledger's drift)", [pod(on="gone")], []),
        ("a namespace that declares no jurisdiction", [pod(namespace="team-b")], []),
    ],
)
def test_a_gpu_pod_outside_its_namespaces_jurisdictions_is_a_violation(
    why: str, pods: list[dict[str, Any]], expected: list[tuple[str, str, str | None]]
) -> None:
    assert found(pods) == expected, why


def test_the_policys_tenancy_binds_a_namespace_too_and_is_named_as_the_source() -> None:
    spec = policy(tenancy={"namespaces": {"team-b": {"jurisdictions": ["kr"]}}})
    world = World([], NODES, {}, {}, [pod(namespace="team-b", on="h-eu")], {}, {CHECK: spec})
    (v,) = violations(world, policy())
    assert (v.namespace, v.node, v.jurisdiction, v.allowed) == ("team-b", "h-eu", "eu", frozenset({"kr"}))
    assert "tenancy.namespaces" in v.source and v.check == CHECK
    assert "h-eu, in eu" in v.message and "only in kr" in v.message


def test_the_node_label_read_is_the_policys_jurisdiction_label() -> None:
    spec = policy(sovereignty={"jurisdictionLabel": "example.com/country"})
    nodes = [{"metadata": {"name": "h-x", "labels": {JURISDICTION: "eu", "example.com/country": "kr"}}}]
    assert found([pod(on="h-x")], policies={CHECK: spec}, nodes=nodes) == [("p", "h-x", "kr")]


def test_with_no_policy_of_ours_the_default_policy_is_used() -> None:
    assert found([pod()], policies={}) == [("p", "h-kr", "kr")]


def test_a_pod_that_cannot_be_read_fails_alone_and_is_named() -> None:
    broken = {
        "metadata": {"name": "bad", "namespace": "team-a"},
        "spec": {"nodeName": "h-kr", "containers": 7},
    }
    world = World([], NODES, {}, EU_ONLY, [broken, pod("good")], {}, {CHECK: policy()})
    errors: list[str] = []
    assert [v.pod for v in violations(world, policy(), errors)] == ["good"]
    assert len(errors) == 1 and "team-a/bad" in errors[0]


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def event(self, obj: dict[str, Any], kind: str, reason: str, message: str, warning: bool = False) -> None:
        assert warning
        self.posted.append((kind, obj["metadata"]["name"], reason))


def _total() -> float:
    return float(metrics.VIOLATIONS_TOTAL._value.get())


def test_the_controller_counts_and_tells_each_violation_once_while_it_lasts() -> None:
    controller = Controller(client.ApiClient(client.Configuration()), load_profiles())
    events = Events()
    controller.writer = events  # type: ignore[assignment]
    running = World([], NODES, {}, EU_ONLY, [pod("a"), pod("b", on="h-eu")], {}, {CHECK: policy()})
    before = _total()
    for _ in range(3):  # every tick looks; each violation is counted and told once
        controller.watches.sovereignty(running, policy())
    assert _total() == before + 1 and events.posted == [("Pod", "a", "SovereigntyViolation")]
    assert metrics.VIOLATIONS._value.get() == 1
    gone = World([], NODES, {}, EU_ONLY, [pod("b", on="h-eu")], {}, {CHECK: policy()})
    controller.watches.sovereignty(gone, policy())
    assert metrics.VIOLATIONS._value.get() == 0
    controller.watches.sovereignty(running, policy())  # bound again (a new binding): counted again
    assert _total() == before + 2 and len(events.posted) == 2


def decided(
    name: str,
    mode: str | None,
    namespace: str = "team-a",
    part: int = 0,
    gamma: int = 4,
    table: list[list[int]] | None = None,
    at: float = 0.0,
) -> Committed:
    """A running decision as the ledger reads it back; speculative ones hand vLLM `gamma` at the
    declared batch and, with `table`, a per-batch table (what `engines.engine_config` writes)."""
    request = WorkloadRequest(f"{namespace}/{name}", namespace, "llama-3.1-8b", "eagle3", 0.8)
    workload = {"metadata": {"name": f"job-{name}-1a2b3", "namespace": namespace, "uid": name}}
    notes = {} if mode is None else {"sovereignspec.io/mode": mode, "sovereignspec.io/draft-budget": "0"}
    if mode == "speculative":
        config = engine_config(load_profiles().drafters["eagle3"], "llama-3.1-8b", gamma, table)
        notes |= {"sovereignspec.io/draft-budget": str(gamma)}
        notes |= {f"sovereignspec.io/{k}": v for k, v in config.notes.items()}
    entry = {"name": CHECK, "state": "Ready", "podSetUpdates": [{"name": "main", "annotations": notes}]}
    handed_mode, largest = handed(notes)  # as the ledger reads them back
    return Committed(
        f"{namespace}/{name}", namespace, name, "h-eu", 0, gamma if mode == "speculative" else 0, 1, request,
        at, None, CHECK, workload, entry, part=part, mode=handed_mode, largest_budget=largest,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "tokens", "found"),
    [
        ("plain", 1200.0, True),  # drafts against its decision
        ("plain", 0.0, False),  # kept it
        ("speculative", 1200.0, False),  # handed a configuration: drafting is the decision
        (None, 1200.0, False),  # an entry without our mode annotation is no decision of plain
    ],
)
def test_a_plain_decision_is_ignored_only_where_its_engines_draft(mode, tokens, found) -> None:
    c = decided("chat", mode)
    drafting = {("team-a", "chat"): tokens, ("team-b", "chat"): 5.0}
    result = ignored([c], drafting)
    assert [i.committed.key for i in result] == (["team-a/chat"] if found else [])
    if found:
        assert "decided plain decode (sovereignspec.io/mode: plain) on node h-eu" in result[0].message
        assert "1200 draft tokens" in result[0].message


def test_a_spread_workload_is_one_ignored_decision_and_other_namespaces_owners_are_not_its() -> None:
    parts = [decided("chat", "plain", part=k) for k in range(3)]
    other = decided("chat", "plain", namespace="team-b")
    assert len(ignored([*parts, other], {("team-a", "chat"): 10.0})) == 1


def test_the_controller_counts_and_tells_each_ignored_decision_once_while_it_lasts() -> None:
    controller = Controller(client.ApiClient(client.Configuration()), load_profiles())
    events = Events()
    controller.writer = events  # type: ignore[assignment]
    view = SimpleNamespace(committed=[decided("chat", "plain"), decided("kept", "plain")])
    total = metrics.DECISIONS_IGNORED_TOTAL._value.get
    before = total()
    for _ in range(3):
        controller.watches.decisions(view.committed, {("team-a", "chat"): 40.0})
    assert total() == before + 1 and events.posted == [("Workload", "job-chat-1a2b3", "DecisionIgnored")]
    assert metrics.DECISIONS_IGNORED._value.get() == 1
    controller.watches.decisions(view.committed, {})  # it stopped drafting
    assert metrics.DECISIONS_IGNORED._value.get() == 0
    controller.watches.decisions(view.committed, {("team-a", "chat"): 3.0})  # and again
    assert total() == before + 2 and len(events.posted) == 2


def test_the_largest_budget_a_decision_hands_is_its_gamma_or_its_tables_largest() -> None:
    assert decided("chat", "speculative", gamma=3).largest_budget == 3
    table = [[1, 4, 6], [5, 16, 3], [17, 2**31, 1]]  # light batches may draft further
    assert decided("chat", "speculative", gamma=1, table=table).largest_budget == 6
    assert decided("chat", "plain").largest_budget == 0  # a plain decision hands budget 0
    assert decided("chat", None).largest_budget is None  # no decision of ours
    unreadable = {"sovereignspec.io/mode": "speculative", "sovereignspec.io/draft-budget": "four"}
    assert handed(unreadable) == ("speculative", None)  # no budget to hold its engines to


@pytest.mark.parametrize(
    ("gamma", "table", "tokens", "drafts", "found"),
    [
        (4, None, 1200.0, 300.0, False),  # 4 per draft: what it was handed
        (4, None, 1000.0, 300.0, False),  # fewer (ngram finds no match, a lighter table range)
        (4, None, 4.2 * 300, 300.0, False),  # within the counters' tolerance
        (4, None, 8 * 300.0, 300.0, True),  # 8 per draft: beyond its budget
        (1, [[1, 4, 6], [5, 2**31, 1]], 6 * 300.0, 300.0, False),  # its table's largest, at a light batch
        (1, [[1, 4, 6], [5, 2**31, 1]], 7 * 300.0, 300.0, True),  # beyond the table's largest
        (4, None, 8 * 300.0, 0.0, False),  # no drafts read: no mean, nothing said
    ],
)
def test_a_speculative_decision_is_ignored_only_where_its_engines_draft_beyond_its_largest_budget(
    gamma, table, tokens, drafts, found
) -> None:
    c = decided("chat", "speculative", gamma=gamma, table=table)
    owner = ("team-a", "chat")
    result = ignored([c], {owner: tokens}, {owner: drafts})
    assert [i.committed.key for i in result] == (["team-a/chat"] if found else [])
    if found:
        top = max([gamma, *(k for _, _, k in table or [])])
        message = result[0].message
        assert f"at most {top} draft tokens per step on node h-eu" in message, message
        assert f"proposed {tokens / drafts:.1f} per draft" in message and "beyond its table" in message


class Recorded:
    writer = "replica-0"

    def __init__(self) -> None:
        self.facts: list[dict[str, Any]] = []

    def add(self, facts: list[dict[str, Any]]) -> None:
        self.facts += facts


def test_an_ignored_decision_is_recorded_once_while_it_lasts_and_evicted_only_where_its_policy_says() -> None:
    events = Events()
    watches = Watches(lambda: events, Recorded())  # type: ignore[arg-type]
    plain, spec = decided("chat", "plain", at=1000.0), decided("wide", "speculative", gamma=2, at=1000.0)
    view = SimpleNamespace(committed=[plain, spec])
    drafting, drafts = {("team-a", "chat"): 40.0, ("team-a", "wide"): 800.0}, {("team-a", "wide"): 100.0}
    evicting = PolicySpec.model_validate({"watch": {"evictIgnored": True}, "retry": {"baseSeconds": 30}})
    # The window began before the decisions: their counts may be their predecessors'. Told, not evicted.
    assert watches.decisions(view.committed, drafting, drafts, 999.0, evicting) == []
    facts = watches.audit.facts  # type: ignore[union-attr]
    assert [(f["kind"], f["workload"]["name"], f["mode"], f["allowed"]) for f in facts] == [
        ("ignored", "job-chat-1a2b3", "plain", None),
        ("ignored", "job-wide-1a2b3", "speculative", 2),
    ]
    assert facts[1]["draftTokens"] == 800.0 and facts[1]["drafts"] == 100.0
    # Past the window: evicted with Retry and a requeue, once its eviction was written.
    writes = watches.decisions(view.committed, drafting, drafts, 1001.0, evicting)
    assert [(w.key, w.state, w.outcome, w.requeue_after) for w in writes] == [
        ("team-a/chat", "Retry", "ignored", 30), ("team-a/wide", "Retry", "ignored", 30),
    ]  # fmt: skip
    assert writes[0].message.startswith("decision ignored: decided plain decode")
    assert "Evicted to be decided again (watch.evictIgnored)" in writes[1].message
    assert [e.reason for e in writes[0].events] == ["DecisionIgnored"] and writes[0].pod_set_updates is None
    watches.evicted |= {"team-a/chat"}  # the controller adds those written
    again = watches.decisions(view.committed, drafting, drafts, 1001.0, evicting)
    assert [w.key for w in again] == ["team-a/wide"]
    assert len(watches.audit.facts) == 2  # type: ignore[union-attr]  # recorded once while it lasts
    # Without the option, never a write.
    kept = PolicySpec()
    assert Watches(lambda: events).decisions(view.committed, drafting, drafts, 1001.0, kept) == []  # type: ignore[arg-type]


def test_a_policy_not_watched_in_a_tick_keeps_its_ignored_decisions_and_one_no_longer_running_is_forgotten():
    events = Events()
    watches = Watches(lambda: events)
    chat, other = decided("chat", "plain"), decided("other", "plain")
    watches.decisions([chat], {("team-a", "chat"): 9.0}, settle=False)
    watches.settle({chat.key, other.key})
    assert watches.ignoring == {"team-a/chat"} and metrics.DECISIONS_IGNORED._value.get() == 1
    # The tick ended before chat's policy was watched (another policy's decisions were written first).
    watches.decisions([other], {}, settle=False)
    watches.settle({chat.key, other.key})
    assert watches.ignoring == {"team-a/chat"} and len(events.posted) == 1  # not told twice
    watches.settle(set())  # it runs no more
    assert watches.ignoring == set() and metrics.DECISIONS_IGNORED._value.get() == 0
