"""The kinds Kueue makes Workloads for that this operator reads, one registry entry each (as
Kueue's integration manager registers its integrations): where a Workload's keys are read, how its
owner is found and cached, what its pods say about it, and the API resource (so its informer and
its RBAC rule) it comes from.

Adding a kind: one `Kind` in `KINDS`, its informer's cut in `informer.ClusterCache._owner_informer`
where it needs a new one, its rule in charts/sovereignspec/files/clusterrole-rules.yaml
(tests/unit/test_kinds.py holds the chart to the registry), and Kueue's integration enabled in
hack/kueue_manifests.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Resource:
    name: str
    group: str  # API group ("" for the core group)
    version: str
    plural: str

    @property
    def path(self) -> str:
        """The API path its objects are listed and watched at."""
        base = "/api" if not self.group else f"/apis/{self.group}"
        return f"{base}/{self.version}/{self.plural}"


@dataclass(frozen=True)
class Kind(Resource):
    # Where the keys of its pods' templates are read: from the Workload's pod sets (Kueue copies
    # their metadata), from the owner object itself (a Pod admitted alone), or from the owner's
    # pod template (a StatefulSet: Kueue copies no pod metadata into its Workload).
    keys: Literal["pod-sets", "owner", "owner-template"]
    # What its owners' informer keeps (`informer.ClusterCache.owners`).
    cut: Literal["metadata", "template", "queued-pod"]
    optional: bool = False  # its CRD may be absent from a cluster (then nothing of it is read)
    pods_owned: bool = False  # its pods name it in their ownerReferences (the ledger's match)
    group_of_pods: bool = False  # one Workload for a group of pods: metrics carry `workload`
    stages_per_pod: bool = False  # one engine over its pods, a pipeline stage in each
    # The object whose own annotations misplaced keys may sit on besides this one's (through a
    # ReplicaSet): a Deployment's, for a Pod admitted alone.
    parent: Resource | None = None

    @property
    def keys_on_owner(self) -> bool:
        return self.keys != "pod-sets"


JOB = Kind("Job", "batch", "v1", "jobs", "pod-sets", "metadata", pods_owned=True)
STATEFULSET = Kind(
    "StatefulSet", "apps", "v1", "statefulsets", "owner-template", "template",
    pods_owned=True, group_of_pods=True,
)  # fmt: skip
LEADERWORKERSET = Kind(
    "LeaderWorkerSet", "leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "pod-sets", "metadata",
    optional=True, group_of_pods=True, stages_per_pod=True,
)  # fmt: skip
# A Pod's parent, and the object between them (its pods' owner, named `<deployment>-<hash>`).
DEPLOYMENT = Resource("Deployment", "apps", "v1", "deployments")
REPLICASET = "ReplicaSet"
POD = Kind("Pod", "", "v1", "pods", "owner", "queued-pod", parent=DEPLOYMENT)

# In the order a Workload's owners are read: Kueue also lists a group's Pods as owners of its
# Workload, so the group's owner comes first.
KINDS: tuple[Kind, ...] = (JOB, STATEFULSET, LEADERWORKERSET, POD)
BY_NAME = {k.name: k for k in KINDS}

# Who a Workload is for when no registered kind owns it: the Workload itself.
WORKLOAD = "Workload"
