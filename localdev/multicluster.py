"""A local MultiKueue multi-cluster: one manager and two workers in two jurisdictions.

    python -m localdev.multicluster up     # make multicluster-up
    python -m localdev.multicluster down   # make multicluster-down

`up` starts three control planes (hack/multicluster-up.sh: etcd, kube-apiserver and Kueue each,
on loopback; the manager's MultiKueue dispatcher set to SovereignSpec) and configures them as a
cluster administrator would: on each worker, simulated GPU nodes in its jurisdiction, SovereignSpec's
CRD, policy and check, the queues, and a ServiceAccount whose token MultiKueue uses; on the manager,
the workers' kubeconfig Secrets, a MultiKueueCluster per worker (its jurisdiction as a label, its
Prometheus and GPU type as annotations), the MultiKueueConfig, MultiKueue's AdmissionCheck and
SovereignSpec's dispatch check, and the queues. Telemetry (a synthetic exporter and a real
Prometheus per worker) and the operators are processes of whoever runs the multi-cluster
(`Fleet.start`: the demo, the tests, the benchmark).
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config

from localdev import controlplane
from localdev import kueue as k
from localdev.gpunodes import apply_node, server_side_apply
from localdev.operator import (
    MANAGER,
    REPO,
    OperatorProcess,
    SyntheticTelemetry,
    install,
    policy,
    service_account_kubeconfig,
)
from localdev.prometheus import LocalPrometheus

HACK = REPO / "hack"
WORKERS = {"worker-eu": "eu", "worker-kr": "kr"}  # name -> jurisdiction
INDEX = {"manager": 1, "worker-eu": 2, "worker-kr": 3}  # ports: hack/multicluster-lib.sh
GPU_TYPE, PRODUCT, EFFICIENCY = "H100-SXM", "NVIDIA-H100-80GB-HBM3", 0.7
NODE_JURISDICTION = "node-restriction.kubernetes.io/jurisdiction"
# Tenants: one per jurisdiction, and one whose namespace is bound to none (both workers admissible).
TENANTS = {"team-eu": "eu", "team-kr": "kr", "team-global": None}
QUEUE = "serving"
DISPATCH_CHECK, MULTIKUEUE_CHECK, WORKER_CHECK = "sovereignspec-dispatch", "multikueue", "sovereignspec"
DISPATCHER_RULES = REPO / "charts" / "sovereignspec" / "files" / "clusterrole-rules-dispatcher.yaml"


def state_dir() -> Path:
    return Path(os.environ.get("SOVEREIGNSPEC_MULTICLUSTER_DIR", REPO / ".multicluster"))


def kubeconfig(member: str, user: str = "admin") -> Path:
    return state_dir() / member / f"{user}.kubeconfig"


def api(member: str, user: str = "admin") -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig(member, user)))


def server(member: str) -> str:
    return f"https://127.0.0.1:1744{INDEX[member]}"


def is_up() -> bool:
    return all(kubeconfig(m).exists() for m in INDEX) and all(_ready(m) for m in INDEX)


def _ready(member: str) -> bool:
    try:
        client.CoreV1Api(api(member)).list_namespace(limit=1, _request_timeout=3)
        return True
    except Exception:
        return False


def _run(script: str) -> None:
    proc = subprocess.run([str(HACK / script)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"hack/{script} failed ({proc.returncode}):\n{proc.stderr[-6000:]}")


def member_env(member: str) -> dict[str, str]:
    """The environment hack/cluster-up.sh reads for one member (restarting its Kueue, say)."""
    i = INDEX[member]
    return {
        "SOVEREIGNSPEC_CLUSTER_DIR": str(state_dir() / member),
        "SOVEREIGNSPEC_ETCD_PORT": f"2579{i}",
        "SOVEREIGNSPEC_ETCD_PEER_PORT": f"2580{i}",
        "SOVEREIGNSPEC_APISERVER_PORT": f"1744{i}",
        "SOVEREIGNSPEC_KUEUE_HEALTH_PORT": f"1908{i}",
        "SOVEREIGNSPEC_KUEUE_METRICS_PORT": f"1845{i}",
        "SOVEREIGNSPEC_KUEUE_WEBHOOK_PORT": f"1945{i}",
        "SOVEREIGNSPEC_LWS_HEALTH_PORT": f"1918{i}",
        "SOVEREIGNSPEC_LWS_METRICS_PORT": f"1855{i}",
        "SOVEREIGNSPEC_LWS_WEBHOOK_PORT": f"1965{i}",
    }


# -- configuration, as a cluster administrator does it ---------------------------------------------


def _namespaces(a: client.ApiClient) -> None:
    core = client.CoreV1Api(a)
    existing = {n.metadata.name for n in core.list_namespace().items}
    for ns, jurisdiction in TENANTS.items():
        labels = {"sovereignspec.io/tenant": ns}
        if jurisdiction:
            labels["sovereignspec.io/jurisdiction"] = jurisdiction
        if ns not in existing:
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns, labels=labels)))
        k.apply(a, k.local_queue(QUEUE, ns, QUEUE))


def _multikueue_account(a: client.ApiClient) -> str:
    """A ServiceAccount on a worker that MultiKueue acts as: Workloads and the kinds of the
    integrations this harness enables that MultiKueue dispatches (Kueue v0.19.2 has adapters for
    Jobs, Pods, StatefulSets and LeaderWorkerSets, and watches each on every worker), nothing
    else. Returns its token."""
    verbs = ["create", "delete", "get", "list", "watch", "update", "patch"]
    rules = [
        {"apiGroups": ["batch"], "resources": ["jobs", "jobs/status"], "verbs": verbs},
        {"apiGroups": [""], "resources": ["pods", "pods/status"], "verbs": verbs},
        {"apiGroups": ["apps"], "resources": ["statefulsets", "statefulsets/status"], "verbs": verbs},
        {
            "apiGroups": ["leaderworkerset.x-k8s.io"],
            "resources": ["leaderworkersets", "leaderworkersets/status"],
            "verbs": verbs,
        },
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["workloads", "workloads/status"],
            "verbs": ["create", "delete", "get", "list", "watch", "update", "patch"],
        },
    ]
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "multikueue-remote"},
        "rules": rules,
    }
    server_side_apply(a, role, MANAGER)
    core = client.CoreV1Api(a)
    try:
        core.create_namespaced_service_account(
            "kueue-system", client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="multikueue"))
        )
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "multikueue-remote"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "multikueue-remote",
        },
        "subjects": [{"kind": "ServiceAccount", "name": "multikueue", "namespace": "kueue-system"}],
    }
    server_side_apply(a, binding, MANAGER)
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=86400)
    )
    return str(
        core.create_namespaced_service_account_token("multikueue", "kueue-system", request).status.token
    )


def worker_kubeconfig(member: str, token: str) -> str:
    """What MultiKueue accepts: the CA inline, a bearer token, no file paths."""
    ca = (state_dir() / member / "pki" / "ca.crt").read_bytes()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": member,
                "cluster": {
                    "server": server(member),
                    "certificate-authority-data": base64.b64encode(ca).decode(),
                },
            }
        ],
        "users": [{"name": "multikueue", "user": {"token": token}}],
        "contexts": [{"name": member, "context": {"cluster": member, "user": "multikueue"}}],
        "current-context": member,
    }
    return yaml.safe_dump(doc)


def configure_worker(
    member: str, prometheus_url: str, nodes: int = 4, gpus_per_node: int = 8, worker_check: bool = True
) -> str:
    """A worker: GPU nodes in its jurisdiction, SovereignSpec's policy and check on its queue.
    Returns the kubeconfig MultiKueue uses for it."""
    a = api(member)
    jurisdiction = WORKERS[member]
    install(a)
    capacity = {"cpu": "256", "memory": "2Ti", "pods": "220", "nvidia.com/gpu": str(gpus_per_node)}
    for i in range(nodes):
        name = f"{member}-gpu-{i}"
        labels = {
            "kubernetes.io/hostname": name,
            "nvidia.com/gpu.product": PRODUCT,
            NODE_JURISDICTION: jurisdiction,
        }
        apply_node(
            a,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "status": {"capacity": capacity, "allocatable": capacity},
            },
        )
    k.apply(a, k.resource_flavor("gpu", {"nvidia.com/gpu.product": PRODUCT}))
    checks = []
    if worker_check:
        server_side_apply(a, policy(WORKER_CHECK, prometheus_url), MANAGER)
        params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": WORKER_CHECK}
        k.apply(a, k.admission_check(WORKER_CHECK, "sovereignspec.io/speculation", params))
        checks = [WORKER_CHECK]
    k.apply(a, k.cluster_queue(QUEUE, {"gpu": nodes * gpus_per_node}, checks, cpu="100000"))
    _namespaces(a)
    return worker_kubeconfig(member, _multikueue_account(a))


def configure_manager(
    worker_configs: dict[str, str],
    prometheus_urls: dict[str, str],
    dispatcher: bool = True,
    gpus: int = 64,
    extra_checks: tuple[str, ...] = (),
) -> None:
    """The manager: the workers as MultiKueueClusters, MultiKueue's check and (with `dispatcher`)
    SovereignSpec's dispatch check on its one ClusterQueue."""
    a = api("manager")
    install(a)
    rules = yaml.safe_load(DISPATCHER_RULES.read_text())
    server_side_apply(
        a,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "sovereignspec-dispatcher"},
            "rules": rules,
        },
        MANAGER,
    )
    for member, text in worker_configs.items():
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": member, "namespace": "kueue-system"},
            "stringData": {"kubeconfig": text},
        }
        server_side_apply(a, secret, MANAGER)
        mkc = {
            "apiVersion": f"{k.GROUP}/{k.VERSION}",
            "kind": "MultiKueueCluster",
            "metadata": {
                "name": member,
                "labels": {"sovereignspec.io/jurisdiction": WORKERS[member]},
                "annotations": {
                    "sovereignspec.io/prometheus-url": prometheus_urls[member],
                    "sovereignspec.io/gpu-type": GPU_TYPE,
                },
            },
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": member}}},
        }
        k.apply(a, mkc)
    k.apply(
        a,
        {
            "apiVersion": f"{k.GROUP}/{k.VERSION}",
            "kind": "MultiKueueConfig",
            "metadata": {"name": "sovereign"},
            "spec": {"clusters": sorted(worker_configs)},
        },
    )
    mk_params = {"apiGroup": k.GROUP, "kind": "MultiKueueConfig", "name": "sovereign"}
    k.apply(a, k.admission_check(MULTIKUEUE_CHECK, "kueue.x-k8s.io/multikueue", mk_params))
    checks = [MULTIKUEUE_CHECK]
    if dispatcher:
        server_side_apply(a, policy(DISPATCH_CHECK, None), MANAGER)
        params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": DISPATCH_CHECK}
        k.apply(a, k.admission_check(DISPATCH_CHECK, "sovereignspec.io/dispatcher", params))
        checks = [DISPATCH_CHECK, MULTIKUEUE_CHECK]
    k.apply(a, k.resource_flavor("gpu", {}))
    k.apply(a, k.cluster_queue(QUEUE, {"gpu": gpus}, [*checks, *extra_checks], cpu="100000"))
    _namespaces(a)


# -- the running parts -------------------------------------------------------------------------


@dataclass
class Fleet:
    """Telemetry per worker (a synthetic exporter behind a real Prometheus), the workers' operators
    and the manager's dispatcher, as processes of the caller."""

    nodes: int = 4
    gpus_per_node: int = 16
    telemetry: dict[str, SyntheticTelemetry] = field(default_factory=dict)
    prometheus: dict[str, LocalPrometheus] = field(default_factory=dict)
    operators: dict[str, OperatorProcess] = field(default_factory=dict)

    def start_telemetry(self) -> dict[str, str]:
        for member in WORKERS:
            t = SyntheticTelemetry()
            for i in range(self.nodes):
                for g in range(self.gpus_per_node):
                    t.set_headroom(f"{member}-gpu-{i}", g, 1.0, EFFICIENCY)
            prom = LocalPrometheus().start()
            prom.set_targets("dcgm", [t.target])
            self.telemetry[member], self.prometheus[member] = t, prom
        return {m: p.url for m, p in self.prometheus.items()}

    def wait_for_telemetry(self, timeout: float = 60.0) -> None:
        """Until every worker's Prometheus serves all of its GPUs (decisions before that would rank
        the worker as one without telemetry)."""
        want = self.nodes * self.gpus_per_node
        deadline = time.monotonic() + timeout
        for member, prom in self.prometheus.items():
            while len(prom.query("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")) < want:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{member}'s telemetry did not reach its Prometheus in {timeout:.0f} s"
                    )
                time.sleep(0.5)
        time.sleep(1.2)  # the dispatcher reuses a worker's snapshot for 1 s

    def set_headroom(self, member: str, headroom: float) -> None:
        for i in range(self.nodes):
            for g in range(self.gpus_per_node):
                self.telemetry[member].set_headroom(f"{member}-gpu-{i}", g, headroom, EFFICIENCY)

    def start_operators(self, workers: bool = True, dispatcher: bool = True) -> None:
        if workers:
            for member in WORKERS:
                self.operators[member] = OperatorProcess(
                    "sovereignspec.io/speculation", kubeconfig=kubeconfig(member, "operator")
                ).start()
        if dispatcher:
            sa_name = f"sovereignspec-{int(time.time() * 1000) % 10**9}"
            sa = service_account_kubeconfig(
                api("manager"),
                "kueue-system",
                sa_name,
                admin_kubeconfig=kubeconfig("manager"),
                extra_roles=("sovereignspec-dispatcher",),
            )
            guard_nomination(api("manager"), "kueue-system", sa_name)
            self.operators["manager"] = OperatorProcess(
                "sovereignspec.io/dispatcher", extra=["--role", "dispatcher"], kubeconfig=sa
            ).start()

    def close(self) -> None:
        for op in self.operators.values():
            op.stop()
        for prom in self.prometheus.values():
            prom.close()
        for t in self.telemetry.values():
            t.close()


def guard_nomination(a: client.ApiClient, namespace: str, service_account: str) -> None:
    """The chart's ValidatingAdmissionPolicy that lets only the dispatcher set
    nominatedClusterNames, rendered by the pinned helm as `helm install --set role=dispatcher`
    renders it for this ServiceAccount (Kueue's harness user `kueue` listed as Kueue's account)."""
    chart = REPO / "charts" / "sovereignspec"
    args = [
        str(controlplane.require_binary("helm")),
        "template",
        "sovereignspec",
        str(chart),
        "-n",
        namespace,
        "--kube-version",
        "1.36.0",
    ]
    args += ["--set", "role=dispatcher", "--set", f"serviceAccount.name={service_account}"]
    args += [
        "--set",
        "dispatcher.nominationWriters={kueue}",
        "--show-only",
        "templates/nomination-policy.yaml",
    ]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    for doc in yaml.safe_load_all(out):
        if doc:
            server_side_apply(a, doc, MANAGER)
    # The API server loads a new policy asynchronously: wait until it refuses (in a dry run, on a
    # throwaway Workload no queue serves) the write it exists to refuse.
    probe = {
        "apiVersion": f"{k.GROUP}/{k.VERSION}",
        "kind": "Workload",
        "metadata": {"name": "nomination-probe", "namespace": namespace},
        "spec": {"podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": [
            {"name": "c", "image": "probe"}]}}}]},
    }  # fmt: skip
    server_side_apply(a, probe, MANAGER)
    body = {**probe, "spec": None, "status": {"nominatedClusterNames": ["probe"]}}
    del body["spec"]
    path = f"/apis/{k.GROUP}/{k.VERSION}/namespaces/{namespace}/workloads/nomination-probe/status"
    try:
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            resp = a.call_api(
                *a.param_serialize(
                    method="PATCH",
                    resource_path=path,
                    query_params=[("fieldManager", "nomination-probe"), ("force", "true"), ("dryRun", "All")],
                    header_params={
                        "Content-Type": "application/apply-patch+yaml",
                        "Accept": "application/json",
                    },
                    body=body,
                    auth_settings=["BearerToken"],
                )
            )
            resp.read()
            if resp.status == 403:
                return
            time.sleep(0.2)
        raise RuntimeError("the nomination policy did not refuse a nomination within 30 s")
    finally:
        client.CustomObjectsApi(a).delete_namespaced_custom_object(
            k.GROUP, k.VERSION, namespace, "workloads", "nomination-probe"
        )


def up(
    dispatcher: bool = True,
    worker_checks: bool = True,
    extra_checks: tuple[str, ...] = (),
    gpus_per_node: int = 16,
) -> Fleet:
    """Start (or reuse) the three control planes and configure them; start telemetry in a Fleet."""
    if not is_up():
        _run("multicluster-up.sh")
    fleet = Fleet(gpus_per_node=gpus_per_node)
    try:
        urls = fleet.start_telemetry()
        configs = {
            m: configure_worker(m, urls[m], fleet.nodes, gpus_per_node, worker_check=worker_checks)
            for m in WORKERS
        }
        gpus = len(WORKERS) * fleet.nodes * gpus_per_node
        configure_manager(configs, urls, dispatcher=dispatcher, gpus=gpus, extra_checks=extra_checks)
    except BaseException:
        fleet.close()
        raise
    return fleet


def set_dispatcher(name: str | None) -> None:
    """Restart the manager's Kueue with `multiKueue.dispatcherName` set to `name` (None: Kueue's
    own AllAtOnce dispatcher), as an administrator changing its configuration would."""
    path = state_dir() / "manager" / "kueue" / "config.yaml"
    doc = yaml.safe_load(path.read_text())
    section = doc.setdefault("multiKueue", {})
    if name is None:
        section.pop("dispatcherName", None)
    else:
        section["dispatcherName"] = name
    path.write_text(yaml.safe_dump(doc))
    env = member_env("manager")
    port, webhook = env["SOVEREIGNSPEC_KUEUE_HEALTH_PORT"], int(env["SOVEREIGNSPEC_KUEUE_WEBHOOK_PORT"])

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
                if resp.status != 200:
                    return False
            socket.create_connection(("127.0.0.1", webhook), timeout=2).close()
            return True
        except OSError:
            return False

    controlplane.restart("kueue", 0.5, 120.0, state_dir() / "manager", None, ready)
    # The webhook server comes up with the manager; a Job created before it would not be suspended.
    wait_connected()


def down() -> None:
    _run("multicluster-down.sh")


def wait_connected(timeout: float = 90.0) -> None:
    """Until MultiKueue reports every worker Active."""
    custom = client.CustomObjectsApi(api("manager"))
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        listed = cast(
            dict[str, Any], custom.list_cluster_custom_object(k.GROUP, k.VERSION, "multikueueclusters")
        )
        items = listed["items"]
        last = {i["metadata"]["name"]: k.condition(i, "Active") for i in items}
        if len(last) == len(WORKERS) and all(c and c["status"] == "True" for c in last.values()):
            return
        time.sleep(0.5)
    raise RuntimeError(f"MultiKueue did not connect to every worker: {last}")


def _fleet_pid() -> Path:
    return state_dir() / "fleet.pid"


def stop_served_fleet() -> None:
    """Stop a fleet that `up` left serving in the background (its operators and telemetry)."""
    path = _fleet_pid()
    if not path.exists():
        return
    pid = int(path.read_text().strip() or 0)
    try:
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            os.killpg(pid, 0)
            time.sleep(0.2)
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    path.unlink(missing_ok=True)


def serve() -> int:
    """Configure the multi-cluster and run its fleet until SIGTERM (the background part of `up`)."""
    fleet = up()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        wait_connected()
        fleet.start_operators()
        # The demo's readings: eu idle, kr at 40 % headroom.
        fleet.set_headroom("worker-kr", 0.4)
        fleet.wait_for_telemetry()
        (state_dir() / "fleet.ready").write_text("ready\n")
        stop.wait()
    finally:
        fleet.close()
    return 0


def up_in_background(timeout: float = 300.0) -> None:
    """`make multicluster-up`: the control planes, then the fleet in a process of its own."""
    if not is_up():
        _run("multicluster-up.sh")
    stop_served_fleet()
    ready = state_dir() / "fleet.ready"
    ready.unlink(missing_ok=True)
    log = (state_dir() / "fleet.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "localdev.multicluster", "serve"],
        cwd=REPO,  # localdev is not installed: it runs from the checkout
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    _fleet_pid().write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (state_dir() / "fleet.log").read_text(errors="replace")[-4000:]
            raise RuntimeError(f"the multi-cluster's fleet did not start (exit {proc.poll()}):\n{tail}")
        time.sleep(0.5)


# (job, namespace, annotations) the demo submits to the manager.
DEMO_JOBS: list[tuple[str, str, dict[str, str]]] = [
    ("eu-legal-chat", "team-eu", {"acceptance-rate": "0.85", "latency-class": "latency"}),
    (
        "eu-batch-summaries",
        "team-eu",
        {"drafter": "ngram", "acceptance-rate": "0.5", "latency-class": "throughput"},
    ),
    ("kr-bank-assist", "team-kr", {"acceptance-rate": "0.8", "latency-class": "latency"}),
    ("kr-gov-archive", "team-kr", {"drafter": "none", "latency-class": "throughput"}),
    ("global-support-chat", "team-global", {"acceptance-rate": "0.9", "latency-class": "latency"}),
    ("global-translation", "team-global", {"acceptance-rate": "0.7", "latency-class": "throughput"}),
    ("global-in-japan", "team-global", {"jurisdiction": "jp"}),
]


def demo() -> int:
    """`make demo-multicluster`: tenants of both jurisdictions (and one bound to none) submit Jobs
    to the manager; print where each was dispatched and admitted, and why."""
    up_in_background()
    manager = api("manager")
    token = f"{int(time.time()) % 100000}"
    for job, ns, notes in DEMO_JOBS:
        annotations = {"sovereignspec.io/model": "llama-3.1-8b", "sovereignspec.io/drafter": "eagle3"}
        annotations.update({f"sovereignspec.io/{key}": v for key, v in notes.items()})
        server_side_apply(manager, k.job(f"{job}-{token}", ns, QUEUE, annotations=annotations), MANAGER)
    deadline = time.monotonic() + 120
    rows: dict[str, tuple[str, str, str]] = {}
    while time.monotonic() < deadline and len(rows) < len(DEMO_JOBS):
        for _, ns, _ in DEMO_JOBS:
            for wl in k.workloads(manager, ns):
                job = next((r["name"] for r in wl["metadata"].get("ownerReferences", [])), "")
                if not job.endswith(f"-{token}") or job in rows:
                    continue
                ours = k.check_state(wl, DISPATCH_CHECK) or {}
                text = str(ours.get("message", ""))
                cluster = (wl.get("status") or {}).get("clusterName")
                admitted = (k.condition(wl, "Admitted") or {}).get("status") == "True"
                if cluster and admitted:
                    rows[job] = (ns, str(cluster), text)
                elif ours.get("state") == "Rejected" or "Previously: Rejected" in text:
                    # Kueue resets the entry after the deactivation; our reason is in the Event.
                    events = client.CoreV1Api(manager).list_namespaced_event(ns).items
                    why = next((e.message for e in events if e.reason == "NoWorkerCluster"
                                and e.involved_object.name == wl["metadata"]["name"]), text)  # fmt: skip
                    rows[job] = (ns, "(rejected)", str(why))
        time.sleep(1.0)
    print(f"{'job':34s} {'namespace':12s} {'admitted on':12s} why (SovereignSpec's dispatch check)")
    for job, (ns, where, text) in sorted(rows.items()):
        print(f"{job:34s} {ns:12s} {where:12s} {text[:160]}")
    missing = len(DEMO_JOBS) - len(rows)
    if missing:
        print(f"{missing} job(s) not decided within 120 s: see {state_dir() / 'fleet.log'}")
    print(f"\nkubectl --kubeconfig {kubeconfig('manager')} get workloads -A   # the manager")
    print(f"kubectl --kubeconfig {kubeconfig('worker-kr')} get jobs -A       # a worker")
    print("make multicluster-down stops it all.")
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localdev.multicluster")
    parser.add_argument("action", choices=("up", "down", "serve", "demo"))
    args = parser.parse_args(argv)
    if args.action == "down":
        stop_served_fleet()
        down()
        return 0
    if args.action == "serve":
        return serve()
    if args.action == "demo":
        return demo()
    up_in_background()
    for member in INDEX:
        print(f"{member:10s} {server(member)}  kubeconfig {kubeconfig(member)}")
    print(
        f"fleet (telemetry, operators): log {state_dir() / 'fleet.log'}; make multicluster-down stops it all"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
