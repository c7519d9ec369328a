"""Sovereignty in the simulated cluster: who is on a node, where a new replica may go, and the
invariant every policy is held to (checked after every event in tests)."""

from __future__ import annotations

from sovereignspec.core.sovereignty import DEFAULT_JURISDICTION_LABEL, NodeTenancy, Requirement, check_node
from sovereignspec.sim.scenario import Scenario
from sovereignspec.sim.state import Gpu, Replica


def tenancy(scenario: Scenario, gpus: list[Gpu], replicas: list[Replica], node: str) -> NodeTenancy:
    """Who runs on `node` now, with its jurisdiction label, as the operator's ledger would show it."""
    labels = {}
    jur = next(g.jurisdiction for g in gpus if g.node == node)
    if jur:
        labels[DEFAULT_JURISDICTION_LABEL] = jur
    tenants, exclusive = set(), set()
    for r in replicas:
        if gpus[r.gpu].node == node:
            t = scenario.tenants[r.tenant]
            tenants.add(t.name)
            if t.exclusive:
                exclusive.add(t.name)
    return NodeTenancy(node, labels, frozenset(tenants), frozenset(exclusive))


def assert_sovereignty(scenario: Scenario, gpus: list[Gpu], replicas: list[Replica]) -> None:
    """No replica outside its jurisdiction; no exclusive tenant sharing a node, either way."""
    # One pass over the replicas (this runs after every event in tests).
    on_node: dict[str, set[int]] = {}
    for r in replicas:
        on_node.setdefault(gpus[r.gpu].node, set()).add(r.tenant)
    tenants = scenario.tenants
    for r in replicas:
        t = tenants[r.tenant]
        g = gpus[r.gpu]
        if t.jurisdiction is not None and g.jurisdiction != t.jurisdiction:
            raise AssertionError(f"{t.name} placed in {g.jurisdiction}, requires {t.jurisdiction}")
        others = sorted(tenants[i].name for i in on_node[g.node] - {r.tenant})
        if t.exclusive and others:
            raise AssertionError(f"exclusive {t.name} shares {g.node} with {others}")
        holders = sorted(tenants[i].name for i in on_node[g.node] - {r.tenant} if tenants[i].exclusive)
        if holders:
            raise AssertionError(f"{t.name} on {g.node}, held exclusively by {holders}")


def admissible(scenario: Scenario, gpus: list[Gpu], replicas: list[Replica], tenant: int) -> list[Gpu]:
    """GPUs a new replica of `tenant` may use now: sovereignty, then a free engine slot."""
    t = scenario.tenants[tenant]
    req = Requirement(t.name, t.jurisdiction, t.exclusive)
    nodes = {g.node for g in gpus}
    ok_nodes = {n for n in nodes if check_node(req, tenancy(scenario, gpus, replicas, n)) is None}
    cap = scenario.replicas_per_gpu
    return [g for g in gpus if g.node in ok_nodes and len(g.replicas) < cap]
