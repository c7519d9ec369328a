"""Fixtures' building blocks for the operator tests: an isolated GPU pool per test (own nodes,
flavors, ClusterQueue and LocalQueue), job submission and waiting for our decision."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client

from localdev import kueue as k
from localdev.gpunodes import apply_node, server_side_apply
from localdev.operator import SyntheticTelemetry, policy
from localdev.prometheus import LocalPrometheus
from tests.cluster.conftest import wait_until

PRODUCTS = {
    "H100-SXM": "NVIDIA-H100-80GB-HBM3",
    "A100-80G-SXM": "NVIDIA-A100-SXM4-80GB",
    "RTX-4090": "NVIDIA-GeForce-RTX-4090",
    "H200": "NVIDIA-H200",
    "L40S": "NVIDIA-L40S",
}
EFFICIENCY = {"H100-SXM": 0.7, "A100-80G-SXM": 0.7, "RTX-4090": 0.65, "H200": 0.7, "L40S": 0.6}
JURISDICTION = "node-restriction.kubernetes.io/jurisdiction"


@dataclass
class Env:
    api: client.ApiClient
    telemetry: SyntheticTelemetry
    prometheus: LocalPrometheus
    check: str  # our AdmissionCheck
    controller: str


@dataclass
class Pool:
    env: Env
    namespace: str
    token: str
    nodes: dict[str, tuple[str, str, int]] = field(
        default_factory=dict
    )  # name -> (gpu type, jurisdiction, gpus)
    queue: str = "serving"
    hosts: dict[str, str] = field(default_factory=dict)  # node name -> kubernetes.io/hostname

    def headroom(self, node: str, values: list[float]) -> None:
        gpu_type = self.nodes[node][0]
        for i, h in enumerate(values):
            self.env.telemetry.set_headroom(self.hosts.get(node, node), i, h, EFFICIENCY[gpu_type])


def make_pool(
    env: Env,
    namespace: str,
    nodes: list[tuple[str, str, int, list[float]]],
    extra_checks: list[str] | None = None,
    fqdn: bool = False,
    queue: str = "serving",
) -> Pool:
    """nodes: (gpu type, jurisdiction, gpu count, headroom per GPU). One flavor per GPU type, in
    the order given; a ClusterQueue with our check (and `extra_checks`) and a LocalQueue. With
    `fqdn`, Node names are FQDNs and their kubernetes.io/hostname labels the short names."""
    token = secrets.token_hex(3)
    pool = Pool(env, namespace, token, queue=queue)
    flavors: dict[str, str] = {}
    for i, (gpu_type, jurisdiction, count, headrooms) in enumerate(nodes):
        host = f"t{token}-{gpu_type.lower()}-{jurisdiction}-{i}"
        name = f"{host}.gpu.example.internal" if fqdn else host
        pool.hosts[name] = host
        labels = {
            "kubernetes.io/hostname": host,
            "nvidia.com/gpu.product": PRODUCTS[gpu_type],
            JURISDICTION: jurisdiction,
            "topology.kubernetes.io/region": jurisdiction,
            "sovereignspec.io/test-pool": token,
        }
        capacity = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": str(count)}
        apply_node(
            env.api,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "status": {"capacity": capacity, "allocatable": capacity},
            },
        )
        pool.nodes[name] = (gpu_type, jurisdiction, count)
        pool.headroom(name, headrooms)
        flavors.setdefault(gpu_type, f"t{token}-{gpu_type.lower()}")
    for gpu_type, flavor in flavors.items():
        k.apply(
            env.api,
            k.resource_flavor(
                flavor, {"nvidia.com/gpu.product": PRODUCTS[gpu_type], "sovereignspec.io/test-pool": token}
            ),
        )
    # Telemetry for the new nodes must reach Prometheus before anything is decided on them.
    for name, (_, _, count) in pool.nodes.items():
        wait_until(
            lambda name=name, count=count: len(env.prometheus.query(
                f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{Hostname="{pool.hosts[name]}"}}')) >= count,
            timeout=30,
            what=f"telemetry of {name} in Prometheus",
        )  # fmt: skip
    time.sleep(1.2)  # the operator reuses a telemetry snapshot for 1 s; let it see the new nodes
    cq = f"t{token}"
    k.apply(
        env.api, k.cluster_queue(cq, dict.fromkeys(flavors.values(), 64), [env.check, *(extra_checks or [])])
    )
    k.apply(env.api, k.local_queue(pool.queue, namespace, cq))  # a LocalQueue's ClusterQueue is immutable
    return pool


def second_check(env: Env, unique: Any, **spec: Any) -> Env:
    """Another AdmissionCheck served by the same operator, with a policy of its own (`spec` merged
    into the test policy's, `localdev.operator.policy`)."""
    name = unique("policy")
    server_side_apply(env.api, policy(name, env.prometheus.url, **spec), "sovereignspec-e2e")
    check = unique("check")
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": name}
    k.apply(env.api, k.admission_check(check, env.controller, params))
    return replace(env, check=check)


def own_check(env: Env, name: str) -> Env:
    """`env` with a check and policy of its own, named `name`, served by controller
    sovereignspec.io/NAME: for an operator process a test starts with flags of its own."""
    server_side_apply(env.api, policy(name, env.prometheus.url), "sovereignspec-e2e")
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": name}
    controller = f"sovereignspec.io/{name}"
    k.apply(env.api, k.admission_check(name, controller, params))
    return replace(env, check=name, controller=controller)


def annotations(**values: Any) -> dict[str, str]:
    return {f"sovereignspec.io/{k.replace('_', '-')}": str(v) for k, v in values.items()}


def submit(pool: Pool, name: str, gpus: int = 1, **notes: Any) -> None:
    body = k.job(name, pool.namespace, pool.queue, annotations=annotations(**notes), gpus=gpus)
    server_side_apply(pool.env.api, body, "sovereignspec-e2e")


def workload_of(pool: Pool, job: str) -> dict[str, Any] | None:
    for wl in k.workloads(pool.env.api, pool.namespace):
        if any(r.get("name") == job for r in wl["metadata"].get("ownerReferences", [])):
            return wl
    return None


def decided(pool: Pool, job: str, timeout: float = 60.0) -> dict[str, Any]:
    """The workload once our check left Pending (Ready, Retry or Rejected).

    Kueue evicts a workload whose check is Retry or Rejected and resets every check to Pending
    ("Reset to Pending after eviction. Previously: Rejected"); the decision then shows in that
    message and in our Event, which `outcome` reads."""

    def check() -> dict[str, Any] | None:
        wl = workload_of(pool, job)
        entry = k.check_state(wl, pool.env.check) if wl else None
        if not entry:
            return None
        return wl if entry["state"] != "Pending" or "Previously:" in entry.get("message", "") else None

    return wait_until(check, timeout=timeout, what=f"a decision for {job}")


def outcome(pool: Pool, job: str) -> tuple[str, str]:
    """(state, our message) of the decision on `job`, surviving Kueue's reset after eviction."""
    wl = decided(pool, job)
    entry = k.check_state(wl, pool.env.check)
    assert entry is not None
    if entry["state"] != "Pending":
        return entry["state"], entry["message"]
    state = entry["message"].rsplit("Previously: ", 1)[1]
    return state, event(pool, state, wl["metadata"]["name"]).message


def admitted_job(pool: Pool, job: str, timeout: float = 60.0) -> client.V1Job:
    batch = client.BatchV1Api(pool.env.api)

    def running() -> client.V1Job | None:
        j = batch.read_namespaced_job(job, pool.namespace)
        return j if j.spec.suspend is False else None

    return wait_until(running, timeout=timeout, what=f"job {job} to be admitted")


def events(pool: Pool, name: str | None = None) -> list[client.CoreV1Event]:
    items = client.CoreV1Api(pool.env.api).list_namespaced_event(pool.namespace).items
    return [e for e in items if name is None or e.involved_object.name == name]


def event(
    pool: Pool, reason: str, name: str | None = None, timeout: float = 30.0, containing: str = ""
) -> client.CoreV1Event:
    """Wait for an Event with `reason` (ours are posted right after the decision is written), and
    `containing` in its message where given."""
    return wait_until(
        lambda: next((e for e in events(pool, name) if e.reason == reason and containing in e.message), None),
        timeout=timeout,
        what=reason,
    )


def our_entry(pool: Pool, wl: dict[str, Any]) -> dict[str, Any]:
    entry = k.check_state(wl, pool.env.check)
    assert entry is not None
    return entry


def wait_for_series(prometheus: LocalPrometheus, promql: str, timeout: float = 30.0) -> None:
    wait_until(lambda: prometheus.query(promql), timeout=timeout, what=promql)


def now() -> float:
    return time.monotonic()


def job_body(
    pool: Pool, name: str, gpus: int | str = 1, namespace: str | None = None, **notes: Any
) -> dict[str, Any]:
    """A serving Job as `submit` makes it, to be changed by the test before `submit_body`."""
    body = k.job(name, namespace or pool.namespace, pool.queue, annotations=annotations(**notes))
    for kind in ("requests", "limits"):
        body["spec"]["template"]["spec"]["containers"][0]["resources"][kind]["nvidia.com/gpu"] = str(gpus)
    return body


def submit_body(pool: Pool, body: dict[str, Any]) -> None:
    server_side_apply(pool.env.api, body, "sovereignspec-e2e")


def add_namespace(pool: Pool, suffix: str, labels: dict[str, str] | None = None) -> str:
    """Another namespace queueing into the pool's ClusterQueue (a second tenant's, say)."""
    name = f"{pool.namespace}-{suffix}"  # the namespace keeps its random token: reruns never collide
    client.CoreV1Api(pool.env.api).create_namespace(
        {"metadata": {"name": name, "labels": {"sovereignspec.io/test": "true", **(labels or {})}}}
    )
    k.apply(pool.env.api, k.local_queue(pool.queue, name, f"t{pool.token}"))
    return name


def in_namespace(pool: Pool, namespace: str) -> Pool:
    """The same pool seen from another namespace (for submit, decided, outcome, events)."""
    return Pool(pool.env, namespace, pool.token, pool.nodes, pool.queue, pool.hosts)
