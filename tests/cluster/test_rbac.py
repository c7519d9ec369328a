"""The chart's ClusterRole, bound to a ServiceAccount as the chart binds it, checked by
impersonation (`kubectl auth can-i --as=system:serviceaccount:…`) against two tables: what the
controller must be able to do, and what it must not. The whole grant is also held to the first
table, so any widening of the role fails here."""

from __future__ import annotations

import re

import pytest

from localdev import controlplane
from localdev.operator import install, service_account_kubeconfig

MAY = [
    ("list", "workloads.kueue.x-k8s.io"),
    ("watch", "workloads.kueue.x-k8s.io"),
    ("patch", "workloads.kueue.x-k8s.io/status"),
    ("list", "admissionchecks.kueue.x-k8s.io"),
    ("watch", "admissionchecks.kueue.x-k8s.io"),
    ("patch", "admissionchecks.kueue.x-k8s.io/status"),
    ("list", "resourceflavors.kueue.x-k8s.io"),
    ("watch", "resourceflavors.kueue.x-k8s.io"),
    ("list", "speculationpolicies.sovereignspec.io"),
    ("watch", "speculationpolicies.sovereignspec.io"),
    ("list", "learnedprofiles.sovereignspec.io"),
    ("watch", "learnedprofiles.sovereignspec.io"),
    ("create", "learnedprofiles.sovereignspec.io"),
    ("patch", "learnedprofiles.sovereignspec.io"),
    ("patch", "learnedprofiles.sovereignspec.io/status"),
    ("list", "auditsegments.sovereignspec.io"),
    ("create", "auditsegments.sovereignspec.io"),
    ("list", "nodes"),
    ("watch", "nodes"),
    ("list", "namespaces"),
    ("watch", "namespaces"),
    ("list", "pods"),
    ("watch", "pods"),
    ("list", "jobs.batch"),
    ("watch", "jobs.batch"),
    ("list", "statefulsets.apps"),
    ("watch", "statefulsets.apps"),
    ("list", "deployments.apps"),
    ("watch", "deployments.apps"),
    ("list", "leaderworkersets.leaderworkerset.x-k8s.io"),
    ("watch", "leaderworkersets.leaderworkerset.x-k8s.io"),
    ("create", "events"),
    ("list", "events"),
]
MUST_NOT = [
    ("get", "workloads.kueue.x-k8s.io"),
    ("get", "nodes"),
    ("get", "pods"),
    ("get", "namespaces"),
    ("get", "secrets"),
    ("list", "secrets"),
    ("get", "configmaps"),
    ("create", "pods"),
    ("delete", "pods"),
    ("create", "pods/exec"),
    ("update", "workloads.kueue.x-k8s.io"),
    ("patch", "workloads.kueue.x-k8s.io"),
    ("delete", "workloads.kueue.x-k8s.io"),
    ("update", "workloads.kueue.x-k8s.io/status"),
    ("create", "admissionchecks.kueue.x-k8s.io"),
    ("patch", "admissionchecks.kueue.x-k8s.io"),
    ("delete", "admissionchecks.kueue.x-k8s.io"),
    ("patch", "clusterqueues.kueue.x-k8s.io"),
    ("patch", "speculationpolicies.sovereignspec.io"),
    ("get", "learnedprofiles.sovereignspec.io"),
    ("delete", "learnedprofiles.sovereignspec.io"),
    ("update", "auditsegments.sovereignspec.io"),
    ("patch", "auditsegments.sovereignspec.io"),
    ("delete", "auditsegments.sovereignspec.io"),
    ("deletecollection", "auditsegments.sovereignspec.io"),
    ("patch", "nodes"),
    ("patch", "jobs.batch"),
    ("get", "jobs.batch"),
    ("patch", "statefulsets.apps"),
    ("get", "deployments.apps"),
    ("patch", "leaderworkersets.leaderworkerset.x-k8s.io"),
    ("patch", "events"),
    ("create", "events.events.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("impersonate", "serviceaccounts"),
    ("create", "serviceaccounts/token"),
]


@pytest.fixture
def account(api, namespace):
    install(api)  # the chart's rules, as ClusterRole "sovereignspec"
    service_account_kubeconfig(api, namespace, "sovereignspec")
    return f"system:serviceaccount:{namespace}:sovereignspec"


def _can(account: str, verb: str, resource: str) -> bool:
    name, _, sub = resource.partition("/")
    extra = [f"--subresource={sub}"] if sub else []
    out = controlplane.kubectl("auth", "can-i", verb, name, *extra, "--all-namespaces", f"--as={account}")
    assert out.stdout.strip() in ("yes", "no"), out.stdout + out.stderr
    return out.stdout.strip() == "yes"


@pytest.mark.parametrize(("verb", "resource"), MAY)
def test_the_service_account_may_do_what_the_controller_needs(account, verb, resource):
    assert _can(account, verb, resource)


@pytest.mark.parametrize(("verb", "resource"), MUST_NOT)
def test_the_service_account_must_not_do_more(account, verb, resource):
    assert not _can(account, verb, resource)


def test_the_whole_grant_is_no_wider_than_the_table(account, namespace):
    """`auth can-i --list` for the account, less what every authenticated user gets anyway (the
    same list for a ServiceAccount without bindings), must be exactly the table."""
    from localdev.operator import service_account_kubeconfig as make

    make_client = controlplane.api_client()
    make(make_client, namespace, "nobody", cluster_role=None)
    granted = _listing(account, namespace) - _listing(f"system:serviceaccount:{namespace}:nobody", namespace)
    expected = set()
    for verb, resource in MAY:
        name, _, sub = resource.partition("/")
        expected.add((name + (f"/{sub}" if sub else ""), verb))
    extra = {(r, v) for r, v in granted if (r, v) not in expected and (r, "*") not in expected}
    assert not extra, f"granted beyond the table: {sorted(extra)}"


def _listing(account: str, namespace: str) -> set[tuple[str, str]]:
    """(resource, verb) pairs from `kubectl auth can-i --list` (a table: resource first, verbs
    last in brackets; non-resource URL rows have no resource and are skipped)."""
    out = controlplane.kubectl("auth", "can-i", "--list", "-n", namespace, f"--as={account}")
    assert out.returncode == 0, out.stderr
    pairs = set()
    for line in out.stdout.splitlines()[1:]:
        if not line or line[0].isspace():
            continue
        fields = re.split(r"\s{2,}", line.strip())
        verbs = fields[-1].strip("[]").split()
        pairs |= {(fields[0], verb) for verb in verbs}
    return pairs
