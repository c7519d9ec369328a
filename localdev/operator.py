"""Run SovereignSpec against the local control plane: install its CRD and RBAC, start the operator
as a real process (under the least-privilege `sovereignspec-operator` user), and feed it synthetic
GPU and vLLM telemetry through a real Prometheus."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from localdev import controlplane
from localdev.gpunodes import server_side_apply
from localdev.ports import free_port
from localdev.prometheus import LocalPrometheus

REPO = controlplane.REPO
CRD = REPO / "crds" / "sovereignspec.io_speculationpolicies.yaml"
CRDS = sorted((REPO / "crds").glob("*.yaml"))  # every one the chart installs
RULES = REPO / "charts" / "sovereignspec" / "files" / "clusterrole-rules.yaml"
OPERATOR_USER = "sovereignspec-operator"
MANAGER = "sovereignspec-localdev"


def install(api: client.ApiClient) -> None:
    """Our CRDs and the operator's ClusterRole bound to its user."""
    for crd_file in CRDS:
        server_side_apply(api, yaml.safe_load(crd_file.read_text()), MANAGER)
    rules = yaml.safe_load(RULES.read_text())
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "sovereignspec"},
        "rules": rules,
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "sovereignspec"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "sovereignspec"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}],
    }
    server_side_apply(api, role, MANAGER)
    server_side_apply(api, binding, MANAGER)
    ext = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + 30
    names = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in CRDS]
    while time.monotonic() < deadline:
        crds = [ext.read_custom_resource_definition(name) for name in names]
        if all(
            any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))
            for crd in crds
            if crd.status is not None
        ) and all(crd.status is not None for crd in crds):
            return
        time.sleep(0.2)
    raise RuntimeError(f"our CRDs were not established: {names}")


class OperatorProcess:
    """`sovereignspec operator` as a child process, with its own log file."""

    def __init__(
        self,
        controller_name: str,
        extra: list[str] | None = None,
        kubeconfig: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.controller_name = controller_name
        self.env = {**os.environ, **(env or {})}
        self.kubeconfig = kubeconfig or controlplane.kubeconfig("operator")
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        self.log_path = Path(tempfile.mkdtemp(prefix="sovereignspec-operator-")) / "operator.log"
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> OperatorProcess:
        cmd = [
            sys.executable, "-m", "sovereignspec", "operator",
            "--kubeconfig", str(self.kubeconfig),
            "--controller-name", self.controller_name,
            "--bind", "127.0.0.1",
            "--metrics-port", str(self.metrics_port),
            "--liveness-port", str(self.liveness_port),
            *self.extra,
        ]  # fmt: skip
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited ({self.proc.returncode}):\n{self.logs()[-4000:]}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1
                ) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"operator not live after {timeout}s:\n{self.logs()[-4000:]}")

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=3) as resp:
            return str(resp.read().decode())

    def kill(self) -> None:
        """SIGKILL: no clean-up, no goodbye, as a node failure would do it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def cpu_seconds(self) -> float:
        """User plus system CPU time the operator process has used so far."""
        assert self.proc is not None
        # /proc/PID/stat: fields 14 and 15 (utime, stime) in clock ticks, after the ")" of the name.
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_bytes(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return 0


def service_account_kubeconfig(
    api: client.ApiClient,
    namespace: str,
    name: str,
    cluster_role: str | None = "sovereignspec",
    admin_kubeconfig: Path | None = None,
    extra_roles: tuple[str, ...] = (),
) -> Path:
    """A kubeconfig that authenticates only with a ServiceAccount's bearer token (as a Pod's
    projected token does), the account bound to `cluster_role` and `extra_roles` (None: no
    permissions at all). `admin_kubeconfig` names the cluster (default: the local control plane)."""
    core = client.CoreV1Api(api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
    )
    for role in (*([cluster_role] if cluster_role is not None else []), *extra_roles):
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{namespace}-{name}" + ("" if role == cluster_role else f"-{role}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }
        server_side_apply(api, binding, MANAGER)
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    token = core.create_namespaced_service_account_token(name, namespace, request).status.token
    admin = yaml.safe_load((admin_kubeconfig or controlplane.kubeconfig("admin")).read_text())
    cluster = admin["clusters"][0]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": cluster["name"], "user": name}}],
        "current-context": name,
    }
    path = Path(tempfile.mkdtemp(prefix="sovereignspec-sa-")) / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


class SyntheticTelemetry:
    """A stand-in for dcgm-exporter and vLLM: GPU tensor activity per (node, gpu), vLLM acceptance
    counters per (tenant, model) and a TPOT histogram per (namespace, job), on one HTTP endpoint
    that a real Prometheus scrapes."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tensor = Gauge(
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.",
            ["gpu", "Hostname", "modelName"], registry=self.registry,
        )  # fmt: skip
        self.accepted = Counter(
            "vllm:spec_decode_num_accepted_tokens", "accepted draft tokens",
            ["tenant", "namespace", "model_name"], registry=self.registry,
        )  # fmt: skip
        self.drafted = Counter(
            "vllm:spec_decode_num_draft_tokens", "draft tokens", ["tenant", "namespace", "model_name"],
            registry=self.registry,
        )  # fmt: skip
        self.drafts = Counter(
            "vllm:spec_decode_num_drafts", "drafts", ["tenant", "namespace", "model_name"],
            registry=self.registry,
        )  # fmt: skip
        self.per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos", "accepted tokens per draft position",
            ["tenant", "namespace", "model_name", "position"], registry=self.registry,
        )  # fmt: skip
        self.tpot_hist = Histogram(
            "vllm:request_time_per_output_token_seconds", "TPOT", ["namespace", "job_name"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.5, 1.0),
        )  # fmt: skip
        # A plain engine's batch and time per output event (its step), for online calibration.
        self.running = Gauge(
            "vllm:num_requests_running", "requests in the batch", ["namespace", "job_name"],
            registry=self.registry,
        )  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "time per output event", ["namespace", "job_name"],
            registry=self.registry, buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )  # fmt: skip
        self._steps: dict[tuple[str, str], tuple[float, float]] = {}
        self._tpot: dict[tuple[str, str], float] = {}
        self._acceptance: dict[tuple[str, str, str], tuple[float, int]] = {}
        # A scrape sees each tick's counter updates all or not at all, so ratios of counters hold.
        self._lock = threading.Lock()
        self._server = _serve_text_format(self.registry, self._lock)
        self.port = self._server.server_address[1]
        self._stop = threading.Event()
        self._feeder = threading.Thread(target=self._feed, daemon=True)
        self._feeder.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_headroom(self, node: str, gpu: int, headroom: float, compute_efficiency: float = 0.7) -> None:
        """Publish the tensor-pipe activity at which the operator reads `headroom` on that GPU."""
        self.tensor.labels(str(gpu), node, "synthetic").set((1.0 - headroom) * compute_efficiency)

    def set_acceptance(self, tenant: str, namespace: str, model: str, alpha: float, gamma: int = 4) -> None:
        """vLLM's counters for drafts of `gamma` tokens accepted token by token with probability α."""
        self._acceptance[(tenant, namespace, model)] = (alpha, gamma)

    def set_tpot(self, namespace: str, job: str, seconds: float) -> None:
        self._tpot[(namespace, job)] = seconds

    def set_step(self, namespace: str, job: str, batch: float, seconds: float) -> None:
        """A plain engine of `job` running `batch` requests, each step taking `seconds`."""
        with self._lock:
            self._steps[(namespace, job)] = (batch, seconds)

    def clear_step(self, namespace: str, job: str) -> None:
        """That engine gone: its series leave the endpoint."""
        with self._lock:
            if self._steps.pop((namespace, job), None) is not None:
                self.running.remove(namespace, job)
                self.itl.remove(namespace, job)

    def _feed(self) -> None:
        # Counters and histograms only mean something as rates: keep them moving.
        while not self._stop.wait(0.25):
            with self._lock:
                self._tick()

    def _tick(self) -> None:
        for (ns, job), (batch, seconds) in list(self._steps.items()):
            self.running.labels(ns, job).set(batch)
            for _ in range(20):
                self.itl.labels(ns, job).observe(seconds)
        for (ns, job), seconds in list(self._tpot.items()):
            for _ in range(20):
                self.tpot_hist.labels(ns, job).observe(seconds)
        for (tenant, ns, model), (alpha, gamma) in list(self._acceptance.items()):
            drafts = 250
            self.drafts.labels(tenant, ns, model).inc(drafts)
            self.drafted.labels(tenant, ns, model).inc(drafts * gamma)
            for pos in range(gamma):
                accepted = drafts * alpha ** (pos + 1)
                self.per_pos.labels(tenant, ns, model, str(pos)).inc(accepted)
                self.accepted.labels(tenant, ns, model).inc(accepted)

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()


def _serve_text_format(registry: CollectorRegistry, lock: threading.Lock) -> ThreadingHTTPServer:
    """/metrics in the classic text format only. vLLM's metric names contain colons; a client that
    negotiates OpenMetrics or UTF-8 escaping would rename them, and real exporters do not."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def policy(name: str, prometheus_url: str | None, **spec: Any) -> dict[str, Any]:
    telemetry = (
        {"source": "prometheus", "prometheusURL": prometheus_url} if prometheus_url else {"source": "none"}
    )
    body = {"telemetry": telemetry, "reevaluationSeconds": 2}
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}  # type: ignore[dict-item]
        else:
            body[key] = value
    return {
        "apiVersion": "sovereignspec.io/v1alpha1",
        "kind": "SpeculationPolicy",
        "metadata": {"name": name},
        "spec": body,
    }


__all__ = [
    "LocalPrometheus",
    "OperatorProcess",
    "SyntheticTelemetry",
    "install",
    "policy",
    "service_account_kubeconfig",
]
