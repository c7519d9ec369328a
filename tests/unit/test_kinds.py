"""The workload-kind registry (`operator.kinds`) is the one place a kind is described: the chart's
RBAC, the harness's Kueue integrations and the informers are held to it here."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from sovereignspec.operator.border import kinds
from sovereignspec.operator.border.workloads import KEYS_ON_OWNER, job_name, owner_of

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts/sovereignspec/files/clusterrole-rules.yaml"
# Kueue's framework name for each registered kind (its integration manager's names).
FRAMEWORKS = {
    "Job": "batch/job",
    "Pod": "pod",
    "StatefulSet": "statefulset",
    "LeaderWorkerSet": "leaderworkerset.x-k8s.io/leaderworkerset",
}


def granted() -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in yaml.safe_load(RULES.read_text())
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_chart_lets_the_operator_list_and_watch_every_registered_kind_and_a_pods_parent() -> None:
    have = granted()
    for resource in (*kinds.KINDS, kinds.DEPLOYMENT):
        for verb in ("list", "watch"):
            assert (resource.group, resource.plural, verb) in have, (resource.name, verb)
        assert (resource.group, resource.plural, "get") not in have, "caches only: never get"


def test_the_harness_enables_kueues_integration_for_every_registered_kind() -> None:
    text = (REPO / "hack/cluster-up.sh").read_text()
    listed = re.search(r"frameworks: \[(.*?)\]", text)
    assert listed, "hack/cluster-up.sh: no Kueue frameworks line"
    frameworks = {f.strip().strip('"') for f in listed.group(1).split(",")}
    assert set(FRAMEWORKS) == {k.name for k in kinds.KINDS}
    assert {FRAMEWORKS[k.name] for k in kinds.KINDS} <= frameworks


def test_every_kind_has_a_distinct_resource_and_a_known_cut() -> None:
    assert len({(k.group, k.plural) for k in kinds.KINDS}) == len(kinds.KINDS)
    assert {k.cut for k in kinds.KINDS} <= {"metadata", "template", "queued-pod"}
    assert kinds.POD.path == "/api/v1/pods" and kinds.JOB.path == "/apis/batch/v1/jobs"


def workload(*owners: tuple[str, str], name: str = "wl-1") -> dict[str, object]:
    refs = [{"kind": kind, "name": n} for kind, n in owners]
    return {"metadata": {"name": name, "ownerReferences": refs}}


def test_a_groups_owner_is_read_before_the_pods_kueue_also_lists() -> None:
    for kind in kinds.KINDS:
        if kind is kinds.POD:
            continue
        wl = workload(("Pod", "p-0"), (kind.name, "owner"))
        assert owner_of(wl) == (kind.name, "owner")
    assert owner_of(workload(("Pod", "p-0"))) == ("Pod", "p-0")
    assert owner_of(workload(("ConfigMap", "x"))) == (kinds.WORKLOAD, "wl-1")


def test_a_groups_metrics_are_joined_on_its_workload_and_anything_else_on_its_owner() -> None:
    groups = {"StatefulSet", "LeaderWorkerSet"}  # Kueue builds one Workload for the group's pods
    for kind in kinds.KINDS:
        expected = "wl-1" if kind.name in groups else "owner"
        assert job_name(workload((kind.name, "owner"))) == expected, kind.name
    assert set(KEYS_ON_OWNER) == {"Pod", "StatefulSet"}
