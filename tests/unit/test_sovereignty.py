import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sovereignspec.core.sovereignty import (
    DEFAULT_JURISDICTION_LABEL as JUR,
)
from sovereignspec.core.sovereignty import (
    NodeTenancy,
    Requirement,
    TenancyIndex,
    check_node,
)


def node(name, jurisdiction=None, tenants=(), exclusive=()):
    labels = {JUR: jurisdiction} if jurisdiction else {}
    return NodeTenancy(name, labels, frozenset(tenants), frozenset(exclusive))


CASES = [
    # (requirement, node, excluded constraint or None, permanent)
    (Requirement("a", "eu"), node("n", "eu"), None, None),
    (Requirement("a", "eu"), node("n", "kr"), "jurisdiction", True),
    (Requirement("a", "eu"), node("n"), "jurisdiction", True),
    (Requirement("a"), node("n"), None, None),
    (Requirement("a"), node("n", tenants={"b"}), None, None),  # sharing unless a tenant asks otherwise
    (Requirement("a", exclusive=True), node("n", tenants={"b"}), "shared-node", False),
    (Requirement("a", exclusive=True), node("n", tenants={"a"}), None, None),
    (Requirement("a"), node("n", tenants={"b"}, exclusive={"b"}), "exclusive-tenant-present", False),
    (Requirement("b"), node("n", tenants={"b"}, exclusive={"b"}), None, None),
    (Requirement("a", "kr", exclusive=True), node("n", "eu", tenants={"b"}), "jurisdiction", True),
]


@pytest.mark.parametrize(("req", "n", "constraint", "permanent"), CASES)
def test_check_node_table(req, n, constraint, permanent):
    why = check_node(req, n)
    if constraint is None:
        assert why is None
    else:
        assert why is not None and why.constraint == constraint and why.permanent is permanent


def excluded(req, nodes):
    """Each node `check_node` keeps `req` off, with why."""
    return {n.name: why for n in nodes if (why := check_node(req, n)) is not None}


def test_the_check_names_every_excluded_node_and_knows_when_nothing_can_ever_fit():
    nodes = [node("a", "eu"), node("b", "kr"), node("c")]
    out = excluded(Requirement("t", "us"), nodes)
    assert set(out) == {"a", "b", "c"}
    assert "node is in eu" in out["a"].detail
    assert all(why.permanent for why in out.values())
    busy = excluded(Requirement("t", exclusive=True), [node("a", tenants={"x"})])
    assert set(busy) == {"a"} and not busy["a"].permanent


tenants = st.sampled_from(["t0", "t1", "t2", "t3"])
jurisdictions = st.sampled_from([None, "eu", "kr", "us"])
nodes_strategy = st.lists(
    st.tuples(jurisdictions, st.sets(tenants, max_size=3), st.booleans()), min_size=1, max_size=12
)


def _cluster(spec):
    out = []
    for i, (j, ts, excl) in enumerate(spec):
        holder = {min(ts)} if excl and ts else set()
        out.append(node(f"n{i:02d}", j, ts, holder))
    return out


@given(nodes_strategy, tenants, jurisdictions, st.booleans())
def test_the_filter_never_admits_a_violating_node(spec, tenant, jurisdiction, exclusive):
    nodes = _cluster(spec)
    req = Requirement(tenant, jurisdiction, exclusive)
    out = excluded(req, nodes)
    for n in nodes:
        if n.name in out:
            continue
        if jurisdiction is not None:
            assert n.labels.get(JUR) == jurisdiction
        if exclusive:
            assert n.tenants <= {tenant}
        assert n.exclusive_tenants <= {tenant}


@given(nodes_strategy, st.lists(st.tuples(tenants, jurisdictions, st.booleans()), max_size=10))
def test_the_vectorised_index_agrees_with_the_scalar_check_as_work_is_placed(spec, arrivals):
    nodes = _cluster(spec)
    index = TenancyIndex(nodes)
    for tenant, jurisdiction, exclusive in arrivals:
        req = Requirement(tenant, jurisdiction, exclusive)
        expected = np.array([check_node(req, n) is None for n in nodes])
        assert (index.mask(req) == expected).all()
        admissible = np.nonzero(expected)[0]
        if admissible.size:
            i = int(admissible[0])
            index.place(i, req)
            n = nodes[i]
            nodes[i] = NodeTenancy(
                n.name,
                n.labels,
                n.tenants | {tenant},
                n.exclusive_tenants | ({tenant} if exclusive else set()),
            )


def test_requirements_nodes_and_exclusions_are_values_that_nothing_changes_in_place() -> None:
    """A placer copies a node's tenancy when it places work there, and a requirement keys the
    placer's caches: changed in place, either would change what an earlier decision saw."""
    import dataclasses

    from sovereignspec.core.sovereignty import Exclusion

    values = [Requirement("a"), node("n"), Exclusion("jurisdiction", "node is in kr", True)]
    for value, field in zip(values, ("exclusive", "tenants", "permanent"), strict=True):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, field, None)
    assert hash(Requirement("a", "eu")) == hash(Requirement("a", "eu"))


def test_an_excluded_node_is_named_by_the_jurisdiction_it_is_in_or_the_label_it_lacks() -> None:
    labelled = check_node(Requirement("a", "eu", allowed=frozenset({"eu"})), node("n", "kr"))
    unlabelled = check_node(Requirement("a", "eu", allowed=frozenset({"eu"})), node("n"))
    assert labelled is not None and labelled.detail.endswith("node is in kr")
    assert unlabelled is not None and unlabelled.detail.endswith(f"node has no {JUR} label")


def test_an_exclusive_tenant_placed_by_the_index_keeps_every_other_tenant_off_its_node() -> None:
    """Whatever number the index gives the tenant (here the third it interns, after two
    jurisdictions): "no exclusive holder" is a number no tenant can have."""
    index = TenancyIndex([node("n0", "eu"), node("n1", "kr")])
    index.place(0, Requirement("x", exclusive=True))
    assert index.mask(Requirement("y")).tolist() == [False, True]
    assert index.mask(Requirement("x")).tolist() == [True, True]
