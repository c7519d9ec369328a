"""SovereignSpec installed and used as the README says, on a real node (see conftest.py).

The tests run in order and build on each other: the chart installed, the check Active, the
examples applied, a serving Job decided and run, a serving Deployment's replicas decided and run,
the chart upgraded, the leader among the two operator Pods lost in the middle of a burst (its Pod
deleted; its container SIGKILLed), then a real vLLM served by a
Pod of our decision, scraped through Kubernetes service discovery, its α learned by the next decision.
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from localdev import controlplane
from localdev import kueue as k
from localdev.operator import SyntheticTelemetry
from localdev.ports import free_port
from localdev.prometheus import LocalPrometheus
from localdev.s3 import LocalS3
from sovereignspec.telemetry.prometheus import PrometheusReader
from tests import waiting
from tests.engine.env import SETTINGS, local_profiles
from tests.engine_client import SERVED, EngineClient, get
from tests.pod_e2e.conftest import GATEWAY, NODE, REPO, SERVING_IMAGE, RealEngine

RELEASE, NAMESPACE, CHECK = "sovereignspec", "sovereignspec-system", "sovereignspec"
SERVING_NS = "llm-serving"
EXAMPLES = REPO / "deploy" / "examples"
NODE_GPUS = 32
DECISIONS = ("SpeculativeDecode", "PlainDecode")


def helm(*args: str) -> str:
    binary = controlplane.require_binary("helm")
    kubeconfig = str(controlplane.kubeconfig())
    from tests.pod_e2e.conftest import run

    return run(str(binary), "--kubeconfig", kubeconfig, *args)


def kubectl(*args: str, stdin: str | None = None) -> str:
    proc = controlplane.kubectl(*args, stdin=stdin)
    assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
    return proc.stdout


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    return waiting.wait_until(predicate, timeout=timeout, interval=0.5, what=what)


def operator_pods(api: client.ApiClient) -> list[Any]:
    return (
        client.CoreV1Api(api)
        .list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/name=sovereignspec")
        .items
    )


def ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def operator_state(api: client.ApiClient) -> str:
    """What a user would look at when the operator's Pods are not as expected: each Pod (its
    ReplicaSet, phase, readiness, deletion, containers), its log's tail (and the previous
    container's, after a restart) and the namespace's recent events."""
    core = client.CoreV1Api(api)
    out = []
    for pod in operator_pods(api):
        meta, status = pod.metadata, pod.status
        out.append(
            f"pod {meta.name} rs={(meta.labels or {}).get('pod-template-hash')} phase={status.phase} "
            f"ready={ready(pod)} deleting={meta.deletion_timestamp} "
            f"conditions={[(c.type, c.status, c.reason) for c in status.conditions or []]}"
        )
        for st in status.container_statuses or []:
            out.append(
                f"  {st.name}: restarts={st.restart_count} state={st.state.to_dict() if st.state else None}"
            )
            for previous in (False, True) if st.restart_count else (False,):
                try:
                    log = core.read_namespaced_pod_log(meta.name, NAMESPACE, previous=previous, tail_lines=15)
                except client.ApiException as e:
                    log = f"({e.status})"
                out.append(f"  {'previous' if previous else 'current'} container's log (tail):\n{log}")
    events = sorted(core.list_namespaced_event(NAMESPACE).items, key=lambda e: str(e.last_timestamp or ""))
    for ev in events[-25:]:
        about = f"{ev.involved_object.kind}/{ev.involved_object.name}"
        out.append(f"event {ev.last_timestamp} {about} {ev.reason}: {ev.message}")
    return "\n".join(out) or "no operator Pod"


def wait_for_ready_operator_pods(api: client.ApiClient, count: int, timeout: float, what: str) -> list[Any]:
    """The rollout settled: exactly `count` operator Pods, every one Ready and none on its way out
    (a Pod being deleted stays Ready until its process ends); on a timeout, the Pods' story."""

    def settled() -> list[Any] | None:
        pods = operator_pods(api)
        done = len(pods) == count and all(ready(p) and p.metadata.deletion_timestamp is None for p in pods)
        return pods if done else None

    try:
        return wait_until(settled, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{operator_state(api)}") from None


FOREIGN = "".join(chr(c) for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]) + '\u2028\U000f0000 é "q" \\'


def serving_job(name: str, seconds: int = 0) -> dict[str, Any]:
    """The example serving Job (40-workloads.yaml) as it is: its annotations, queue, launcher init
    container, downward-API volume and `sovereignspec launch` entrypoint, with the stand-in engine
    in place of vLLM and requests this node can hold."""
    job = copy.deepcopy(
        next(d for d in yaml.safe_load_all((EXAMPLES / "40-workloads.yaml").read_text()) if d)
    )
    job["metadata"]["name"] = name
    # A neighbour's annotation with every control character: the kubelet Go-quotes it into the
    # downward-API file the launcher reads, which must start the engine all the same.
    job["spec"]["template"]["metadata"].setdefault("annotations", {})["team.example.com/notes"] = FOREIGN
    pod = job["spec"]["template"]["spec"]
    # The node's network (the pod network's namespace), where the test reaches a real engine on a
    # fixed port; the operator's own Pods are on the pod network.
    pod["hostNetwork"] = True
    engine = pod["containers"][0]
    engine["image"] = SERVING_IMAGE
    engine.pop("ports", None)  # on the host's network a port would let one such pod per node run
    engine["args"] = ["python3", "/standin.py", "--seconds", str(seconds)]
    engine["resources"] = {
        "requests": {"cpu": "10m", "memory": "32Mi", "nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    return job


def workload_of(api: client.ApiClient, job: str) -> dict[str, Any] | None:
    wls = client.CustomObjectsApi(api).list_namespaced_custom_object(
        "kueue.x-k8s.io", "v1beta2", SERVING_NS, "workloads"
    )
    for wl in wls["items"]:
        if any(r.get("name") == job for r in wl["metadata"].get("ownerReferences", [])):
            return dict(wl)
    return None


def our_entry(wl: dict[str, Any] | None) -> dict[str, Any]:
    """Our check's entry in the Workload's status ({} before there is one)."""
    entries = ((wl or {}).get("status") or {}).get("admissionChecks") or []
    return next((e for e in entries if e["name"] == CHECK), {})


def our_state(wl: dict[str, Any] | None) -> str | None:
    state = our_entry(wl).get("state")
    return None if state is None else str(state)


def _job_story(api: client.ApiClient, job: str, tail: int = 1500) -> str:
    core = client.CoreV1Api(api)
    wl = workload_of(api, job)
    out = [f"workload checks: {((wl or {}).get('status') or {}).get('admissionChecks')}",
           f"workload conditions: {((wl or {}).get('status') or {}).get('conditions')}"]  # fmt: skip
    for p in core.list_namespaced_pod(SERVING_NS, label_selector=f"job-name={job}").items:
        statuses = [*(p.status.init_container_statuses or []), *(p.status.container_statuses or [])]
        out.append(
            f"pod {p.metadata.name} {p.status.phase}: {[(c.name, c.state.to_dict()) for c in statuses]}"
        )
        for c in [*(p.spec.init_containers or []), *p.spec.containers]:
            try:
                log = core.read_namespaced_pod_log(p.metadata.name, SERVING_NS, container=c.name)
                out.append(f"  {c.name} log: {log[-tail:]}")
            except client.ApiException as e:
                out.append(f"  {c.name} log: {e.status}")
    for e in core.list_namespaced_event(SERVING_NS).items:
        if job in e.involved_object.name:
            out.append(f"event {e.involved_object.kind}/{e.involved_object.name} {e.reason}: {e.message}")
    return "\n".join(out)


def decision_line(api: client.ApiClient, job: str) -> dict[str, Any]:
    """What the stand-in engine printed: the decision it read through the downward API."""
    core = client.CoreV1Api(api)

    def finished_pod() -> Any:
        pods = core.list_namespaced_pod(SERVING_NS, label_selector=f"job-name={job}").items
        return next((p for p in pods if p.status.phase == "Succeeded"), None)

    try:
        pod = wait_until(finished_pod, 180, f"the pod of {job} to run and finish")
    except AssertionError as e:  # say where it stopped: the check, the Job, its pods and their logs
        raise AssertionError(f"{e}\n{_job_story(api, job)}") from None
    assert pod.spec.node_name == NODE
    logs = core.read_namespaced_pod_log(pod.metadata.name, SERVING_NS)
    line = next(x for x in logs.splitlines() if x.startswith("SOVEREIGNSPEC-DECISION "))
    argv = next(x for x in logs.splitlines() if x.startswith("ENGINE-ARGV "))
    return {"pod": pod, "decision": json.loads(line.split(" ", 1)[1]),
            "argv": json.loads(argv.split(" ", 1)[1]), "logs": logs}  # fmt: skip


@pytest.fixture(scope="module")
def telemetry() -> Any:
    """dcgm-exporter and vLLM stand-in for the real node's GPUs, behind a real Prometheus (one with
    Kubernetes service discovery: the real engine's Pod is found through the API server)."""
    synthetic = SyntheticTelemetry()
    for gpu in range(NODE_GPUS):
        synthetic.set_headroom(NODE, gpu, 1.0)  # a fresh node: every GPU idle
    # Listening on the pod network's gateway too: the operator's Pods read it there.
    prom = LocalPrometheus(kubernetes_sd=True, listen="0.0.0.0").start()
    prom.set_targets("synthetic", [synthetic.target])
    wait_until(lambda: prom.query("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), 30, "Prometheus to scrape")
    yield prom
    prom.close()
    synthetic.close()


@pytest.fixture(scope="module")
def record_bucket() -> Any:
    """The sovereignty record's bucket: a real S3 server with Object Lock, listening on the pod
    network's gateway too (the operator's Pods write there) and a bucket an administrator made with
    Object Lock enabled."""
    server = LocalS3(listen="0.0.0.0").start()
    bucket = server.bucket("sovereignty-record")
    yield server, bucket
    server.close()


def audit_cli(server: LocalS3, bucket: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`sovereignspec audit` as a regulator runs it, from outside the cluster: the bucket read with
    its own credentials, the cluster's Workloads with an administrator's kubeconfig."""
    return subprocess.run(
        [sys.executable, "-m", "sovereignspec.cli", "audit", "--kubeconfig", str(controlplane.kubeconfig()),
         "--audit-bucket", bucket, "--audit-endpoint", server.endpoint, *args],
        capture_output=True, text=True, check=False, timeout=120, env={**os.environ, **server.env()},
    )  # fmt: skip


@pytest.fixture(scope="module")
def cluster(node_cluster: client.ApiClient) -> client.ApiClient:
    """The node as GPU Feature Discovery, the device plugin and an administrator would leave it:
    GPU labels, `nvidia.com/gpu` capacity in status, the jurisdiction label."""
    api = node_cluster
    core = client.CoreV1Api(api)
    core.patch_node(NODE, {"metadata": {"labels": {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": str(NODE_GPUS), "node-restriction.kubernetes.io/jurisdiction": "eu",
        "topology.kubernetes.io/region": "eu-west-1"}}})  # fmt: skip
    core.patch_node_status(NODE, {"status": {"capacity": {"nvidia.com/gpu": str(NODE_GPUS)}}})

    def advertised() -> bool:
        return (core.read_node(NODE).status.allocatable or {}).get("nvidia.com/gpu") == str(NODE_GPUS)

    wait_until(advertised, 60, "the node to advertise its GPUs")
    return api


def test_helm_install_with_defaults_gives_a_ready_operator_pod_authenticated_by_its_token(
    cluster: client.ApiClient, telemetry: LocalPrometheus, record_bucket: tuple[LocalS3, str]
) -> None:
    chart = str(REPO / "charts" / "sovereignspec")
    server, bucket = record_bucket
    # The record's bucket as the chart's values say: its credentials in a Secret an administrator
    # made in the release's namespace, never in the values.
    kubectl("create", "namespace", NAMESPACE)
    literals = [f"--from-literal={k}={v}" for k, v in server.env().items()]
    kubectl("-n", NAMESPACE, "create", "secret", "generic", "record-bucket", *literals)
    helm("install", RELEASE, chart, "-n", NAMESPACE, "--create-namespace",
         "--set", f"policy.spec.telemetry.prometheusURL={telemetry.url_on(GATEWAY)}",
         "--set", f"audit.bucket.name={bucket}",
         "--set", f"audit.bucket.endpoint={server.endpoint_on(GATEWAY)}",
         "--set", "audit.bucket.retentionDays=1", "--set", "audit.bucket.credentialsSecret=record-bucket",
         "--post-renderer", str(REPO / "tests/pod_e2e/post-render.sh"))  # fmt: skip
    try:
        pod = wait_until(lambda: next((p for p in operator_pods(cluster) if ready(p)), None), 150,
                         "the operator Pod to become Ready")  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{operator_state(cluster)}") from None
    spec = pod.spec
    # The chart's restricted defaults, as rendered, and no credentials but the projected token.
    assert spec.security_context.run_as_non_root and spec.security_context.run_as_user == 65532
    container = spec.containers[0]
    assert container.security_context.read_only_root_filesystem
    assert container.security_context.capabilities.drop == ["ALL"]
    assert spec.service_account_name == RELEASE
    token_volumes = [v for v in spec.volumes if v.projected is not None]
    assert any(s.service_account_token for v in token_volumes for s in v.projected.sources)
    # One Secret: the metrics endpoint's certificate (the chart's own CA's), no credential.
    assert [v.secret.secret_name for v in spec.volumes if v.secret is not None] == [f"{RELEASE}-metrics-cert"]
    assert not [e for e in container.env or [] if "KUBECONFIG" in e.name]
    # The bucket's credentials only by reference to their Secret.
    assert [f.secret_ref.name for f in container.env_from or []] == ["record-bucket"]
    assert not [e for e in container.env or [] if e.name.startswith("AWS_")]
    assert pod.status.container_statuses[0].restart_count == 0


def test_every_request_of_the_operator_carries_its_service_account_identity(
    cluster: client.ApiClient,
) -> None:
    """From the API server's audit log: the operator's Pod wrote the check's status as its
    ServiceAccount, was refused nothing, and nothing reached the API server anonymously."""
    kubectl("wait", "--for", "condition=Active", f"admissioncheck/{CHECK}", "--timeout", "90s")
    log = Path(os.environ["SOVEREIGNSPEC_CLUSTER_DIR"]) / "logs" / "audit.log"
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    me = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
    mine = [e for e in events if e["user"].get("username") == me]
    status_writes = [
        e for e in mine
        if e["verb"] == "patch" and e["objectRef"].get("subresource") == "status"
        and e["objectRef"]["resource"] == "admissionchecks"
    ]  # fmt: skip
    assert status_writes, "no status write as the ServiceAccount"
    assert any(e["verb"] == "list" and e["objectRef"]["resource"] == "workloads" for e in mine)
    assert [e["requestURI"] for e in events if e["user"].get("username") == "system:anonymous"] == []
    refused = [e["requestURI"] for e in mine if e["responseStatus"]["code"] in (401, 403)]
    assert refused == [], refused


def service_monitor_job(tmp: Path) -> dict[str, Any]:
    """The chart's ServiceMonitor (rendered with serviceMonitor.enabled, as a Prometheus Operator
    would read it) as the scrape job that operator would generate: endpoints of the metrics Service
    found through the API server, HTTPS verified against the CA Secret it names, the scraper's own
    ServiceAccount token, bound to the chart's metrics-reader ClusterRole as values.yaml says."""
    version = kubectl("version", "-o", "json")
    server = json.loads(version)["serverVersion"]["gitVersion"]  # the chart's kubeVersion is checked
    rendered = helm("template", RELEASE, str(REPO / "charts" / "sovereignspec"), "-n", NAMESPACE,
                    "--kube-version", server, "--set", "metrics.serviceMonitor.enabled=true")  # fmt: skip
    monitor = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    tls = endpoint["tlsConfig"]
    secret = client.CoreV1Api(controlplane.api_client()).read_namespaced_secret(
        tls["ca"]["secret"]["name"], NAMESPACE
    )
    ca = tmp / "metrics-ca.crt"
    ca.write_bytes(base64.b64decode(secret.data[tls["ca"]["secret"]["key"]]))
    group, sa = "rbac.authorization.k8s.io", {"name": "metrics-scraper", "namespace": "monitoring"}
    discovery = [{"apiGroups": [""], "resources": ["endpoints", "services", "pods"],
                  "verbs": ["get", "list", "watch"]},
                 {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                  "verbs": ["get", "list", "watch"]}]  # fmt: skip
    rbac = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": sa},
        {"apiVersion": f"{group}/v1", "kind": "ClusterRole", "metadata": {"name": "metrics-scraper"},
         "rules": discovery},
        *({"apiVersion": f"{group}/v1", "kind": "ClusterRoleBinding",
           "metadata": {"name": f"metrics-scraper-{i}"},
           "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": role},
           "subjects": [{"kind": "ServiceAccount", **sa}]}
          for i, role in enumerate(("metrics-scraper", f"{RELEASE}-metrics-reader"))),
    ]  # fmt: skip
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    token = tmp / "metrics-scraper.token"
    token.write_text(
        kubectl("-n", "monitoring", "create", "token", "metrics-scraper", "--duration", "2h").strip()
    )
    api = controlplane.endpoint()
    selector = monitor["spec"]["selector"]["matchLabels"]
    label = "__meta_kubernetes_service_label_"
    return {
        "job_name": "sovereignspec-metrics",
        "scrape_interval": "1s",
        "scheme": endpoint["scheme"],
        "authorization": {"credentials_file": str(token)},
        "tls_config": {"ca_file": str(ca), "server_name": tls["serverName"]},
        "kubernetes_sd_configs": [{
            "role": "endpoints", "api_server": api.server, "namespaces": {"names": [NAMESPACE]},
            "authorization": {"credentials_file": str(token)},
            "tls_config": {"ca_file": str(api.ca)}}],
        "relabel_configs": [
            *({"action": "keep", "source_labels": [label + re.sub(r"[^a-zA-Z0-9_]", "_", k)], "regex": v}
              for k, v in selector.items()),
            {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
             "regex": endpoint["port"]},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}],
    }  # fmt: skip


def test_the_charts_two_replicas_run_on_their_own_pod_addresses_probed_and_scraped_over_verified_https(
    cluster: client.ApiClient, telemetry: LocalPrometheus, tmp_path: Path
) -> None:
    """The default install as shipped: two operator Pods on the pod network, each on an address of
    its own, Ready through the chart's probes; Prometheus, configured as the chart's ServiceMonitor
    says, scrapes both over HTTPS it verifies, with a ServiceAccount token; exactly one leads."""
    pods = wait_for_ready_operator_pods(cluster, 2, 180, "both operator Pods to be Ready")
    addresses = {p.status.pod_ip for p in pods}
    assert len(addresses) == 2 and NODE not in addresses, addresses
    assert all(ipaddress.ip_address(a) in ipaddress.ip_network(os.environ["SOVEREIGNSPEC_POD_SUBNET"])
               for a in addresses), addresses  # fmt: skip
    for pod in pods:
        assert not pod.spec.host_network
        (c,) = pod.spec.containers
        assert c.liveness_probe.http_get.path == "/healthz" and c.readiness_probe is not None
        assert {p.name for p in c.ports} == {"metrics", "liveness"}
    telemetry.add_scrape_config(service_monitor_job(tmp_path))

    def both_up() -> list[dict[str, Any]] | None:
        up = telemetry.query('up{job="sovereignspec-metrics"}')
        return up if len(up) == 2 and all(r["value"][1] == "1" for r in up) else None

    try:
        up = wait_until(both_up, 60, "Prometheus to scrape both operator Pods over verified HTTPS")
    except AssertionError as exc:
        targets = telemetry.query('up{job="sovereignspec-metrics"}')
        raise AssertionError(f"{exc}\nup: {targets}\n{operator_state(cluster)}") from None
    assert {r["metric"]["instance"].rsplit(":", 1)[0] for r in up} == addresses
    leaders = wait_until(lambda: telemetry.query('sovereignspec_leader{job="sovereignspec-metrics"}'), 30,
                         "the leader gauge of both")  # fmt: skip
    assert sorted(float(r["value"][1]) for r in leaders) == [0.0, 1.0], leaders
    # The same endpoint to a token RBAC does not allow: refused, so the target is down.
    anonymous = {**service_monitor_job(tmp_path), "job_name": "unauthorised"}
    anonymous["authorization"] = {"credentials": "not-a-token"}
    telemetry.add_scrape_config(anonymous)
    down = wait_until(lambda: (r := telemetry.query('up{job="unauthorised"}')) and len(r) == 2 and r, 60,
                      "the unauthorised scrape's targets")  # fmt: skip
    assert [r["value"][1] for r in down] == ["0", "0"], down
    telemetry.remove_scrape_config("unauthorised")


def test_examples_apply_as_the_readme_says_and_a_serving_job_runs_speculative_on_the_chosen_node(
    cluster: client.ApiClient,
) -> None:
    kubectl("apply", "-f", str(EXAMPLES))
    # The examples' simulated nodes have no kubelet: the node lifecycle controller marks them
    # unreachable, and SovereignSpec must place nothing there.
    for n in ("gpu-a100-eu-1", "gpu-a100-eu-2", "gpu-h100-eu-1"):
        kubectl("wait", "--for", "condition=Ready=Unknown", f"node/{n}", "--timeout", "90s")
    kubectl("wait", "--for", "condition=Active", f"admissioncheck/{CHECK}", "--timeout", "60s")
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(serving_job("acme-chat-speculative")))
    seen = decision_line(cluster, "acme-chat-speculative")
    assert our_state(workload_of(cluster, "acme-chat-speculative")) == "Ready"
    # It ran with the neighbour's annotation of every control character, as written.
    assert seen["pod"].metadata.annotations["team.example.com/notes"] == FOREIGN
    decision = seen["decision"]
    # The chart's policy (telemetry from the Prometheus given at install) survived the examples.
    assert decision["mode"] == "speculative", seen["logs"]
    assert seen["pod"].spec.node_selector.get("kubernetes.io/hostname") == NODE
    gamma = int(decision["draft-budget"])
    assert gamma >= 2, seen["logs"]
    vllm = json.loads(decision["vllm-speculative-config"])
    # γ* at the declared batch (the policy's default max-num-seqs, 8); lighter batches may go further,
    # and the engine is started with the table's largest budget.
    table = vllm.get("num_speculative_tokens_per_batch_size", [[1, 2**31, gamma]])
    top = max(k for _, _, k in table)
    assert vllm["num_speculative_tokens"] == top >= gamma, vllm
    assert all(k <= gamma for _, hi, k in table if hi >= 8), vllm
    # The engine was started by `sovereignspec launch` with the decision's own configuration.
    argv = seen["argv"]
    assert argv[0] == "--speculative-config" and len(argv) == 2, argv
    assert json.loads(argv[1]) == vllm
    # The user is told why the example's own nodes were passed over.
    name = workload_of(cluster, "acme-chat-speculative")["metadata"]["name"]  # type: ignore[index]
    events = client.CoreV1Api(cluster).list_namespaced_event(SERVING_NS).items
    excluded = [e.message for e in events if e.reason == "ExcludedNodes" and e.involved_object.name == name]
    assert excluded and "gpu-h100-eu-1: unavailable: not Ready (NodeStatusNeverUpdated)" in excluded[0], (
        excluded
    )


def serving_deployment(name: str, replicas: int) -> dict[str, Any]:
    """The example serving Job's pod as the replicas of a Deployment. Kueue's deployment integration
    reads the queue label on the Deployment and admits each replica alone, as a Pod."""
    tpl = serving_job(name, seconds=3600)["spec"]["template"]
    tpl["spec"]["restartPolicy"] = "Always"
    tpl["metadata"].setdefault("labels", {})["app"] = name
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": SERVING_NS,
            "labels": {"kueue.x-k8s.io/queue-name": "serving"},
        },
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": tpl},
    }


def test_a_deployments_replicas_are_each_decided_and_run_speculative_on_the_chosen_node(
    cluster: client.ApiClient,
) -> None:
    core = client.CoreV1Api(cluster)
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(serving_deployment("chat-deployment", 2)))

    def decision(pod: Any) -> dict[str, Any] | None:
        if pod.status.phase != "Running":
            return None
        logs = core.read_namespaced_pod_log(pod.metadata.name, SERVING_NS, container="vllm")
        line = next((x for x in logs.splitlines() if x.startswith("SOVEREIGNSPEC-DECISION ")), None)
        return json.loads(line.split(" ", 1)[1]) if line else None

    def running() -> list[tuple[Any, dict[str, Any]]] | None:
        pods = core.list_namespaced_pod(SERVING_NS, label_selector="app=chat-deployment").items
        seen = [(p, d) for p in pods if (d := decision(p)) is not None]
        return seen if len(seen) == 2 else None

    try:
        replicas = wait_until(running, 240, "both replicas of chat-deployment to run with their decision")
    except AssertionError as e:
        pods = core.list_namespaced_pod(SERVING_NS, label_selector="app=chat-deployment").items
        story = [f"{p.metadata.name} {p.status.phase} gates={p.spec.scheduling_gates} {p.status.conditions}"
                 for p in pods]  # fmt: skip
        raise AssertionError(f"{e}\n" + "\n".join(story)) from None
    for pod, seen in replicas:
        assert pod.spec.node_name == NODE and pod.spec.node_selector.get("kubernetes.io/hostname") == NODE
        assert seen["mode"] == "speculative" and int(seen["draft-budget"]) >= 1, seen
        assert our_state(workload_of(cluster, pod.metadata.name)) == "Ready"  # its own Workload
    assert len({seen["gpu-index"] for _, seen in replicas}) == 2  # never one GPU twice
    kubectl("-n", SERVING_NS, "delete", "deployment", "chat-deployment", "--wait=true")


def test_the_record_in_the_bucket_verifies_from_outside_and_says_where_each_pod_ran(
    cluster: client.ApiClient, record_bucket: tuple[LocalS3, str]
) -> None:
    """What the operator's Pods wrote to the bucket (through the chart's values and Secret) is read
    by `sovereignspec audit` from outside the cluster: the chain intact, every Workload the check
    admitted recorded, every binding inside its jurisdictions, the serving Job's pod on the node it
    ran on; and nothing of it in the cluster's own AuditSegments."""
    server, bucket = record_bucket

    def serving_records() -> list[dict[str, Any]]:
        out = audit_cli(server, bucket, "export", "--namespace", SERVING_NS, "--format", "jsonl")
        assert out.returncode == 0, out.stdout + out.stderr
        return [json.loads(line) for line in out.stdout.splitlines()]

    def replicas_ended() -> list[dict[str, Any]] | None:
        # The Deployment's replicas ran an hour's sleep until the last test deleted them: each was
        # recorded bound and, at the tick after it left, ended.
        records = serving_records()
        bound = {r["pod"]["name"] for r in records if r["kind"] == "binding"}
        ended = {r["pod"]["name"] for r in records if r["kind"] == "ended"}
        replicas = {n for n in bound if n.startswith("chat-deployment-")}
        return records if len(replicas) == 2 and replicas <= ended else None

    records = wait_until(replicas_ended, 60, "the replicas' bindings and ends in the bucket")
    for r in records:
        if r["kind"] in ("binding", "ended"):
            assert r["node"] == NODE, r
    ready = {
        r["workload"]["owner"]["name"] for r in records if r["kind"] == "decision" and r["state"] == "Ready"
    }
    assert "acme-chat-speculative" in ready, ready
    where = audit_cli(server, bucket, "where", f"{SERVING_NS}/acme-chat-speculative")
    assert where.returncode == 0 and NODE in where.stdout, where.stdout + where.stderr
    done = audit_cli(server, bucket, "verify")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every admitted workload recorded" in done.stdout, done.stdout
    verified = re.search(r"intact: (\d+) records", done.stdout)
    # The Job's and the two replicas' decisions at least.
    assert verified and int(verified.group(1)) >= 3, done.stdout
    segments = client.CustomObjectsApi(cluster).list_cluster_custom_object(
        "sovereignspec.io", "v1alpha1", "auditsegments"
    )["items"]
    assert segments == [], "the record went to the cluster, not the bucket"


def test_helm_upgrade_of_a_policy_value_is_picked_up_without_a_restart(cluster: client.ApiClient) -> None:
    before = {p.metadata.uid for p in operator_pods(cluster)}
    chart, renderer = str(REPO / "charts" / "sovereignspec"), str(REPO / "tests/pod_e2e/post-render.sh")
    helm("upgrade", RELEASE, chart, "-n", NAMESPACE, "--reuse-values", "--set", "policy.spec.gammaMax=1",
         "--post-renderer", renderer)  # fmt: skip
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(serving_job("acme-chat-after-upgrade")))
    seen = decision_line(cluster, "acme-chat-after-upgrade")
    assert seen["decision"]["mode"] == "speculative", seen["logs"]
    assert seen["decision"]["draft-budget"] == "1", seen["logs"]
    after = operator_pods(cluster)
    assert {p.metadata.uid for p in after} == before and len(before) == 2
    assert all(p.status.container_statuses[0].restart_count == 0 for p in after)


LEASE = RELEASE  # the chart's Lease: the release's full name


def leader_identity(api: client.ApiClient) -> str:
    """The identity of the process that holds the Lease: POD-NAME_PROCESS-ID ("" when handed over)."""
    lease = client.CoordinationV1Api(api).read_namespaced_lease(LEASE, NAMESPACE)
    return str(lease.spec.holder_identity or "")


def leader_pod(api: client.ApiClient) -> str:
    """The Pod whose process holds the Lease."""
    return leader_identity(api).rpartition("_")[0]


def sigkill_container(pod: str) -> None:
    """SIGKILL the operator's process in `pod`, found on the node by the POD_NAME the chart gives it:
    no clean-up, no hand-over, as an out-of-memory kill or a crashed runtime would do it."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"operator" in cmdline and f"POD_NAME={pod}".encode() in environ:
            os.kill(int(proc.name), 9)
            return
    raise AssertionError(f"no operator process of {pod} on the node")


@pytest.mark.parametrize("how", ["pod deleted", "container SIGKILLed"])
def test_the_leader_lost_mid_burst_leaves_every_job_decided_exactly_once_on_distinct_gpus(
    cluster: client.ApiClient, how: str
) -> None:
    """Two operator Pods from the chart; the leader's Pod deleted (it hands the Lease over), or its
    container SIGKILLed (the standby waits out the lease: 15 s by default; the container restarted
    in the same Pod competes too, and may win), in the middle of a burst of long-running one-GPU
    Jobs. Every Job is decided once, no GPU twice, and decisions resume within the lease duration
    and a tick."""
    wait_for_ready_operator_pods(cluster, 2, 180, "both operator Pods to be Ready")
    old, old_process = leader_pod(cluster), leader_identity(cluster)
    tag = "del" if how == "pod deleted" else "kill"
    jobs = [f"burst-{tag}-{i:02d}" for i in range(12)]
    try:
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([serving_job(j, seconds=900) for j in jobs[:6]]))
        wait_until(lambda: sum(our_state(workload_of(cluster, j)) == "Ready" for j in jobs[:6]) >= 3, 120,
                   "the first decisions of the burst")  # fmt: skip
        lost = time.monotonic()
        if how == "pod deleted":
            kubectl("-n", NAMESPACE, "delete", "pod", old, "--wait=false")
        else:
            sigkill_container(old)
        kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([serving_job(j, seconds=900) for j in jobs[6:]]))
        try:
            # A new process: the standby, or (SIGKILL) the killed container restarted in the same Pod,
            # whichever first sees the old record unrenewed for the lease duration.
            new = wait_until(
                lambda: (h := leader_identity(cluster)) not in ("", old_process) and h, 60, "a new leader"
            )
        except AssertionError as exc:
            lease = client.CoordinationV1Api(cluster).read_namespaced_lease(LEASE, NAMESPACE).spec
            raise AssertionError(f"{exc}\nLease: {lease}\n{operator_state(cluster)}") from None
        took_over = time.monotonic() - lost
        wait_until(lambda: any(our_state(workload_of(cluster, j)) == "Ready" for j in jobs[6:]), 60,
                   "the first decision after the leader was lost")  # fmt: skip
        resumed = time.monotonic() - lost
        wait_until(lambda: all(our_state(workload_of(cluster, j)) == "Ready" for j in jobs), 180,
                   "every Job of the burst to be decided")  # fmt: skip
        everything = time.monotonic() - lost
        print(f"FAILOVER ({how}): new leader {took_over:.1f} s, first decision {resumed:.1f} s, "
              f"all {len(jobs)} decided {everything:.1f} s after the leader was lost")  # fmt: skip
        assert new != old_process
        wls = {j: workload_of(cluster, j) for j in jobs}
        names = {wl["metadata"]["name"] for wl in wls.values() if wl}
        assert len(names) == len(jobs)

        def decision_events() -> Counter[str]:
            events = client.CoreV1Api(cluster).list_namespaced_event(SERVING_NS).items
            return Counter(
                e.involved_object.name for e in events if e.reason in DECISIONS for _ in range(e.count or 1)
            )

        # A decision's Event follows its status write: the last ones may still be on their way.
        wait_until(lambda: all(decision_events()[n] for n in names), 30, "each decision's Event")
        time.sleep(2)  # and a second one, if there were to be one, would come as soon
        per_workload = decision_events()
        assert {n: per_workload[n] for n in names} == dict.fromkeys(names, 1)
        # The 12 Jobs run at once on the node's 32 GPUs: each on a GPU of its own.
        spots = Counter(
            (u["nodeSelector"]["kubernetes.io/hostname"], u["annotations"]["sovereignspec.io/gpu-index"])
            for wl in wls.values() for u in our_entry(wl)["podSetUpdates"]
        )  # fmt: skip
        assert set(spots.values()) == {1} and len(spots) == len(jobs), spots
        # The lease (15 s) and a retry (2 s, jittered) at most; a tick (and a catch-up) after it.
        assert took_over <= 15 + 2 * 1.2 + 3, took_over
        assert resumed <= took_over + 10, (took_over, resumed)
        # The old leader's Pod: gone (its replacement a standby) or restarted as a standby.
        wait_for_ready_operator_pods(cluster, 2, 180, "two operator Pods again")
    finally:
        kubectl(
            "-n",
            SERVING_NS,
            "delete",
            "job",
            *jobs,
            "--cascade=foreground",
            "--wait=true",
            "--ignore-not-found",
        )


DRAFT = "llama-3.2-1b-draft"
PROFILES = "sovereignspec-profiles"
SCRAPE = REPO / "deploy" / "prometheus" / "serving-engines.yaml"


def real_engine_job(name: str, engine: RealEngine, port: int) -> dict[str, Any]:
    """The example serving Job with a real `vllm serve` behind the launcher: the engine's environment
    and checkpoints mounted read-only from the node (in place of an engine image and a model volume),
    its API port named `http` for the shipped scrape job, on the host's network."""
    job = serving_job(name)
    job["spec"]["backoffLimit"] = 0  # an engine that fails shows its log once, never restarts unseen
    tpl = job["spec"]["template"]
    tpl["metadata"]["annotations"]["sovereignspec.io/drafter"] = DRAFT
    pod = tpl["spec"]
    engine_c = pod["containers"][0]
    engine_c["args"] = [
        str(engine.venv / "bin" / "vllm"), "serve", "/models/target", "--served-model-name", SERVED,
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024", "--max-num-seqs", "8",
        "--seed", "0",
        # vLLM's CPU build compiles its graphs with torch inductor at start, which needs a C++
        # compiler in the image (vLLM's own CPU image installs gcc); the Debian base has none.
        "--enforce-eager",
    ]  # fmt: skip
    engine_c["ports"] = [{"name": "http", "containerPort": port}]
    engine_c["env"] = [{"name": k, "value": v} for k, v in
                       {**SETTINGS, "VLLM_CACHE_ROOT": "/cache/vllm", "HOME": "/cache"}.items()]  # fmt: skip
    engine_c["securityContext"] = {"runAsUser": 0, "runAsGroup": 0}  # the node's environment is root's
    engine_c["resources"] = {
        "requests": {"cpu": "100m", "memory": "2Gi", "nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    host: list[tuple[str, Path, str, str]] = [
        ("engine", engine.venv, str(engine.venv), "Directory"),
        ("models", engine.models, "/models", "Directory"),
    ]
    if engine.interpreter is not None:
        host.append(("interpreter", engine.interpreter, str(engine.interpreter), "Directory"))
    host += [(f"lib-{i}", lib, str(lib), "File") for i, lib in enumerate(engine.libraries)]
    for volume, path, mount, kind in host:
        pod["volumes"].append({"name": volume, "hostPath": {"path": str(path), "type": kind}})
        engine_c["volumeMounts"].append({"name": volume, "mountPath": mount, "readOnly": True})
    pod["volumes"] += [
        {"name": "cache", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},  # as vLLM's own manifests
    ]
    engine_c["volumeMounts"] += [
        {"name": "cache", "mountPath": "/cache"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    return job


def service_discovery_job(tmp: Path) -> dict[str, Any]:
    """The shipped scrape job as a Prometheus outside the cluster runs it: Kubernetes service
    discovery of pods through the API server, as a ServiceAccount that may list pods (the RBAC the
    job's comment asks for), relabelling unchanged."""
    group, sa = "rbac.authorization.k8s.io", {"name": "prometheus", "namespace": "monitoring"}
    rbac = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "monitoring"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": sa},
        {"apiVersion": f"{group}/v1", "kind": "ClusterRole", "metadata": {"name": "prometheus-pods"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": f"{group}/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "prometheus-pods"},
         "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": "prometheus-pods"},
         "subjects": [{"kind": "ServiceAccount", **sa}]},
    ]  # fmt: skip
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    token = tmp / "prometheus.token"
    token.write_text(kubectl("-n", "monitoring", "create", "token", "prometheus", "--duration", "2h").strip())
    job = yaml.safe_load(SCRAPE.read_text())
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]  # in-cluster: the Pod's own token and CA
    api = controlplane.endpoint()
    job["kubernetes_sd_configs"][0].update(
        api_server=api.server,
        authorization={"credentials_file": str(token)},
        tls_config={"ca_file": str(api.ca)},
        namespaces={"names": [SERVING_NS]},
    )
    job["scrape_interval"] = "1s"
    return job


@pytest.mark.timeout(1500, func_only=True)
def test_a_real_vllm_pod_runs_the_decision_and_its_measured_alpha_reaches_the_next_decision(
    cluster: client.ApiClient, telemetry: LocalPrometheus, real_engine: RealEngine, tmp_path: Path
) -> None:
    """The whole loop on the real node: the administrator offers the draft model for the served
    target (a profiles ConfigMap) and serves its checkpoint from a local path (the policy's
    drafts.checkpoints), both through `helm upgrade`; a real vLLM in a serving Pod is admitted
    speculative and runs the decided table; Prometheus finds it through Kubernetes service discovery
    with the shipped relabelling; the operator's next decision in that namespace uses the α the
    engine measured."""
    core = client.CoreV1Api(cluster)
    profiles = local_profiles(tmp_path / "profiles", (DRAFT,))
    files = [f"--from-file={f.name}={f}" for f in sorted(profiles.glob("*/*.yaml"))]
    kubectl("-n", NAMESPACE, "create", "configmap", PROFILES, *files)
    old = {p.metadata.name for p in operator_pods(cluster)}
    drafts = {"checkpoints": {DRAFT: {SERVED: "/models/perturbed"}}}
    chart, renderer = str(REPO / "charts" / "sovereignspec"), str(REPO / "tests/pod_e2e/post-render.sh")
    helm("upgrade", RELEASE, chart, "-n", NAMESPACE, "--reuse-values",
         "--set", f"profilesConfigMap={PROFILES}", "--set", "policy.spec.gammaMax=8",
         "--set-json", f"policy.spec.drafts={json.dumps(drafts)}",
         "--post-renderer", renderer)  # fmt: skip

    def replaced() -> bool:  # a rolling update: both replicas replaced, one of them leading
        pods = operator_pods(cluster)
        return len(pods) == 2 and not old & {p.metadata.name for p in pods} and all(map(ready, pods))

    wait_until(replaced, 180, "both operator Pods replaced by ones with the profiles ConfigMap, Ready")
    telemetry.add_scrape_config(service_discovery_job(tmp_path))

    port = free_port()
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(real_engine_job("vllm-real", real_engine, port)))
    engine = EngineClient(port)

    def serving() -> bool:
        pods = core.list_namespaced_pod(SERVING_NS, label_selector="job-name=vllm-real").items
        if any(p.status.phase in ("Failed", "Succeeded") for p in pods):
            raise AssertionError(f"the engine's Pod ended\n{_job_story(cluster, 'vllm-real', 12000)}")
        try:
            get(engine.url + "/health", timeout=2)
        except OSError:
            return False
        return True

    t0 = time.monotonic()
    try:
        wait_until(serving, 600, "the real engine's Pod to serve")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{_job_story(cluster, 'vllm-real', 12000)}") from None
    started_s = time.monotonic() - t0
    (pod,) = core.list_namespaced_pod(SERVING_NS, label_selector="job-name=vllm-real").items
    assert pod.spec.node_name == NODE
    notes = pod.metadata.annotations
    assert notes["sovereignspec.io/mode"] == "speculative", our_entry(workload_of(cluster, "vllm-real"))
    config = json.loads(notes["sovereignspec.io/vllm-speculative-config"])
    assert config["method"] == "draft_model" and config["model"] == "/models/perturbed", config
    fixed = [[1, 2**31, config["num_speculative_tokens"]]]
    table = config.get("num_speculative_tokens_per_batch_size") or fixed
    k1 = next(k for lo, hi, k in table if lo <= 1 <= hi)

    # A series vLLM creates at its first draft holds that traffic in Prometheus's first sample of it,
    # which increase() never sees: a few tokens first, scraped to the end, then the measured run
    # (long, so that what little of the first request the window holds cannot move α).
    engine.complete(1, tokens=8)
    drafts = f'vllm:spec_decode_num_drafts_total{{namespace="{SERVING_NS}",job_name="vllm-real"}}'

    def scraped_up_to_now() -> bool:
        seen = telemetry.query(drafts)
        now = engine.metrics().get("vllm:spec_decode_num_drafts_total")
        return bool(seen) and float(seen[0]["value"][1]) == now

    wait_until(scraped_up_to_now, 60, "Prometheus to discover the engine's Pod and scrape its first drafts")
    done = engine.complete(1, tokens=512)
    # The engine ran the decided table: at batch 1, K drafts per drafting step.
    assert done["mean_draft_length"] == pytest.approx(k1, abs=0.15), (done, table)
    measured = done["alpha_position0"]
    assert measured is not None and 0.3 < measured < 0.97, done
    selector = f'namespace="{SERVING_NS}",job_name="vllm-real"'
    wait_until(lambda: engine.scraped_by(telemetry.query, selector), 60, "the run's last scrape")
    reader = PrometheusReader(telemetry.url, window="5m")

    def learned() -> tuple[float, float] | None:
        got = reader.acceptance().get((SERVING_NS, SERVED))
        enough = got is not None and got[1] >= 0.9 * done["drafts"] * done["mean_draft_length"]
        return got if enough else None

    alpha, _ = wait_until(learned, 60, "the engine's traffic in Prometheus, relabelled")
    assert alpha == pytest.approx(measured, abs=0.03), (alpha, done)

    # The next decision in the namespace, by the operator's Pod, from the same Prometheus.
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(serving_job("after-real-engine")))
    wait_until(lambda: our_state(workload_of(cluster, "after-real-engine")) == "Ready", 120,
               "the next serving Job to be decided")  # fmt: skip
    message = str(our_entry(workload_of(cluster, "after-real-engine")).get("message", ""))
    blended = re.search(r"declared 0\.80 blended with (\d\.\d\d) observed", message)
    assert blended is not None, message
    assert float(blended.group(1)) == pytest.approx(measured, abs=0.03), message
    print(
        f"real vLLM in a Pod: serving {started_s:.0f}s after apply; table {table}; "
        f"α measured {measured:.3f}, read {alpha:.3f}; next decision: {message}"
    )
    kubectl("-n", SERVING_NS, "delete", "job", "vllm-real", "--wait=true", "--cascade=foreground")


# The chart users have installed: the tip of the repository before its CRD became a template, leader
# election came and the version went to 0.2.0 (its image tag, appVersion 0.1.0, is unchanged: the
# node has this tree's image under it).
PREVIOUS_CHART = "a633c6e0447c6964a5d073ec3f6e64b97e718bea"
CRD = "speculationpolicies.sovereignspec.io"


def previous_chart(tmp: Path) -> Path:
    """The chart as of PREVIOUS_CHART, from this repository's history (its crds/ link with it)."""
    what = [PREVIOUS_CHART, "charts/sovereignspec", "crds"]
    archive = subprocess.run(["git", "-C", str(REPO), "archive", *what], capture_output=True, check=False)
    assert archive.returncode == 0, f"this test needs the repository's history: {archive.stderr.decode()}"
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
    return tmp / "charts" / "sovereignspec"


def set_queue_checks(cluster: client.ApiClient, checks: dict[str, list[dict[str, Any]]]) -> None:
    """Each ClusterQueue's admission checks (queue -> entries; an empty list: none)."""
    custom = client.CustomObjectsApi(cluster)
    for queue, entries in checks.items():
        strategy = {"admissionChecks": entries} if entries else None
        body = {"spec": {"admissionChecksStrategy": strategy}}
        custom.patch_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", queue, body)


def queues_using(cluster: client.ApiClient, check: str) -> dict[str, list[dict[str, Any]]]:
    listed = client.CustomObjectsApi(cluster).list_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta2", "clusterqueues"
    )
    out = {}
    for cq in listed["items"]:
        entries = ((cq["spec"].get("admissionChecksStrategy") or {}).get("admissionChecks")) or []
        if any(e.get("name") == check for e in entries):
            out[cq["metadata"]["name"]] = entries
    return out


def decided_ready(cluster: client.ApiClient, job: str) -> None:
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(serving_job(job)))
    wait_until(lambda: our_state(workload_of(cluster, job)) == "Ready", 180, f"{job} to be decided")


def test_uninstall_keeps_the_policies_and_the_previous_chart_upgrades_to_this_one_and_rolls_back(
    cluster: client.ApiClient, telemetry: LocalPrometheus, tmp_path: Path
) -> None:
    """`helm uninstall` leaves the CRD and the users' SpeculationPolicies (the keep policy); the
    previous chart version installs over them; `helm upgrade` to this chart (after the README's two
    commands that let the release adopt the CRD it used to install from crds/) keeps every policy and
    decision and goes on deciding; `helm rollback` to the previous revision does too."""
    renderer = str(REPO / "tests/pod_e2e/post-render.sh")
    url = f"policy.spec.telemetry.prometheusURL={telemetry.url_on(GATEWAY)}"
    team = {"apiVersion": "sovereignspec.io/v1alpha1", "kind": "SpeculationPolicy",
            "metadata": {"name": "team-policy"}, "spec": {"gammaMax": 4}}  # fmt: skip
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(team))
    # As an administrator uninstalling it: first the check out of the queues that use it (Kueue keeps
    # an AdmissionCheck a ClusterQueue names from being deleted, and `helm uninstall --wait` waits).
    using = queues_using(cluster, CHECK)
    set_queue_checks(cluster, {q: [e for e in entries if e["name"] != CHECK] for q, entries in using.items()})
    helm("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "120s")
    kubectl("get", "crd", CRD)  # kept
    kubectl("get", "speculationpolicy", "team-policy")  # and what users made with it

    old = previous_chart(tmp_path)
    helm("install", RELEASE, str(old), "-n", NAMESPACE, "--set", url, "--post-renderer", renderer)
    wait_for_ready_operator_pods(cluster, 1, 150, "the previous chart's Pod")
    set_queue_checks(cluster, using)  # and back into the queues
    decided_ready(cluster, "before-upgrade")

    # What the README's upgrade note says: the release adopts the CRD it used to install from crds/.
    kubectl("label", "crd", CRD, "app.kubernetes.io/managed-by=Helm", "--overwrite")
    kubectl("annotate", "crd", CRD, f"meta.helm.sh/release-name={RELEASE}",
            f"meta.helm.sh/release-namespace={NAMESPACE}", "--overwrite")  # fmt: skip
    helm("upgrade", RELEASE, str(REPO / "charts" / "sovereignspec"), "-n", NAMESPACE, "--set", url,
         "--post-renderer", renderer)  # fmt: skip
    wait_for_ready_operator_pods(cluster, 2, 180, "the upgraded chart's two Pods")
    kubectl("get", "speculationpolicy", "team-policy")
    assert our_state(workload_of(cluster, "before-upgrade")) == "Ready"  # nothing lost
    decided_ready(cluster, "after-chart-upgrade")
    crd = client.ApiextensionsV1Api(cluster).read_custom_resource_definition(CRD)
    assert crd.metadata.annotations.get("helm.sh/resource-policy") == "keep"

    # Back to 0.1.0, whose own objects include the policy that 0.2.0 applies by a hook: Helm cannot
    # adopt a custom resource in a rollback, so (the README says so) it is deleted just before; the
    # rollback makes it again, within the controller's 10 s grace for a vanished policy.
    kubectl("delete", "speculationpolicy", "default")
    helm("rollback", RELEASE, "1", "-n", NAMESPACE, "--wait")
    kubectl("get", "speculationpolicy", "default")
    kubectl("get", "crd", CRD)  # a revision without it as a template does not delete it
    kubectl("get", "speculationpolicy", "team-policy")
    wait_for_ready_operator_pods(cluster, 1, 180, "the previous chart's one Pod again")
    decided_ready(cluster, "after-rollback")
    for job in ("before-upgrade", "after-chart-upgrade"):
        assert our_state(workload_of(cluster, job)) == "Ready"
    kubectl("-n", SERVING_NS, "delete", "job", "before-upgrade", "after-chart-upgrade", "after-rollback",
            "--wait=true")  # fmt: skip


DISPATCH_RELEASE, DISPATCH_NS, DISPATCH_CHECK = (
    "sovereignspec-dispatcher",
    "sovereignspec-dispatch",
    "dispatch",
)
WORKER_NAME, TEAM = "pod-e2e-worker", "team-dispatch"


@pytest.fixture(scope="module")
def worker_cluster() -> Any:
    """A worker control plane (etcd, kube-apiserver, Kueue; no node) in the pod network's namespace,
    its API server on the gateway too for the dispatcher's Pods: simulated GPU nodes in the eu
    jurisdiction, a queue, the ServiceAccount MultiKueue acts as. Yields the kubeconfig MultiKueue is
    given and the worker's Prometheus (synthetic dcgm-exporter series)."""
    from localdev.gpunodes import apply_node
    from localdev.multicluster import _multikueue_account
    from localdev.operator import install
    from tests.pod_e2e.conftest import WORKER, run

    env = {**WORKER, "SOVEREIGNSPEC_WITH_NODE": ""}
    state = Path(WORKER["SOVEREIGNSPEC_CLUSTER_DIR"])
    down = str(REPO / "hack" / "cluster-down.sh")
    telemetry = SyntheticTelemetry()
    prom = LocalPrometheus(listen="0.0.0.0")  # the dispatcher's Pods read it on the gateway
    try:
        run(str(REPO / "hack" / "cluster-up.sh"), env=env)
        from kubernetes import config

        api = config.new_client_from_config(config_file=str(state / "admin.kubeconfig"))
        install(api)
        capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
        labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                  "node-restriction.kubernetes.io/jurisdiction": "eu"}  # fmt: skip
        for i in range(2):
            host = f"worker-gpu-{i}"
            apply_node(api, {"apiVersion": "v1", "kind": "Node",
                             "metadata": {"name": host, "labels": {**labels, "kubernetes.io/hostname": host}},
                             "status": {"capacity": capacity, "allocatable": capacity}})  # fmt: skip
            for gpu in range(8):
                telemetry.set_headroom(host, gpu, 1.0)
        k.apply(api, k.resource_flavor("gpu", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}))
        k.apply(api, k.cluster_queue("serving", {"gpu": 16}, [], cpu="1000"))
        client.CoreV1Api(api).create_namespace({"metadata": {"name": TEAM}})
        k.apply(api, k.local_queue("serving", TEAM, "serving"))
        token = _multikueue_account(api)
        ca = (state / "pki" / "ca.crt").read_bytes()
        kubeconfig = yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": WORKER_NAME, "cluster": {
                "server": f"https://{GATEWAY}:{WORKER['SOVEREIGNSPEC_APISERVER_PORT']}",
                "certificate-authority-data": base64.b64encode(ca).decode()}}],
            "users": [{"name": "multikueue", "user": {"token": token}}],
            "contexts": [{"name": WORKER_NAME, "context": {"cluster": WORKER_NAME, "user": "multikueue"}}],
            "current-context": WORKER_NAME,
        })  # fmt: skip
        prom.start()
        prom.set_targets("dcgm", [telemetry.target])
        wait_until(
            lambda: len(prom.query("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")) >= 16, 60, "the worker's telemetry"
        )
        yield api, kubeconfig, prom
    finally:
        prom.close()
        telemetry.close()
        subprocess.run([down], env={**os.environ, **env}, capture_output=True, check=False)


def test_the_dispatcher_role_installed_from_the_chart_nominates_a_worker_under_its_own_token(
    cluster: client.ApiClient, worker_cluster: Any
) -> None:
    """The chart with role=dispatcher, beside the worker release, on this control plane as a
    MultiKueue manager (Kueue's dispatcherName is SovereignSpec's): a serving Job in a namespace of
    the eu jurisdiction is nominated to the eu worker by the dispatcher's Pod, as its ServiceAccount,
    and MultiKueue creates its Workload there."""
    worker_api, kubeconfig, prom = worker_cluster
    core = client.CoreV1Api(cluster)
    secret = {"apiVersion": "v1", "kind": "Secret", "stringData": {"kubeconfig": kubeconfig},
              "metadata": {"name": WORKER_NAME, "namespace": "kueue-system"}}  # fmt: skip
    mkc = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "MultiKueueCluster",
        "metadata": {
            "name": WORKER_NAME,
            "labels": {"sovereignspec.io/jurisdiction": "eu"},
            "annotations": {
                "sovereignspec.io/prometheus-url": prom.url_on(GATEWAY),
                "sovereignspec.io/gpu-type": "H100-SXM",
            },
        },
        "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": WORKER_NAME}}},
    }
    mkconfig = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "MultiKueueConfig",
                "metadata": {"name": "pod-e2e"}, "spec": {"clusters": [WORKER_NAME]}}  # fmt: skip
    kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all([secret, mkc, mkconfig]))
    mk_params = {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": "pod-e2e"}
    multikueue = k.admission_check("multikueue", "kueue.x-k8s.io/multikueue", mk_params)
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(multikueue))
    helm("install", DISPATCH_RELEASE, str(REPO / "charts" / "sovereignspec"), "-n", DISPATCH_NS,
         "--create-namespace", "--set", "role=dispatcher", "--set", "crds.enabled=false",
         "--set", f"admissionCheck.name={DISPATCH_CHECK}", "--set", "policy.name=dispatch",
         "--set", "dispatcher.nominationWriters={kueue}",
         "--post-renderer", str(REPO / "tests/pod_e2e/post-render.sh"))  # fmt: skip

    def pods() -> list[Any]:
        selector = "app.kubernetes.io/name=sovereignspec"
        return list(core.list_namespaced_pod(DISPATCH_NS, label_selector=selector).items)

    wait_until(lambda: len([p for p in pods() if ready(p)]) == 2, 180, "the dispatcher's two Pods")
    kubectl("wait", "--for", "condition=Active", f"admissioncheck/{DISPATCH_CHECK}", "--timeout", "90s")
    kubectl("wait", "--for", "condition=Active", "multikueuecluster/" + WORKER_NAME, "--timeout", "120s")
    k.apply(cluster, k.resource_flavor("dispatch-gpu", {}))
    k.apply(cluster, k.cluster_queue("dispatch", {"dispatch-gpu": 16}, [DISPATCH_CHECK, "multikueue"]))
    labels = {"sovereignspec.io/tenant": TEAM, "sovereignspec.io/jurisdiction": "eu"}
    core.create_namespace({"metadata": {"name": TEAM, "labels": labels}})
    k.apply(cluster, k.local_queue("serving", TEAM, "dispatch"))
    notes = {"sovereignspec.io/model": "llama-3.1-8b", "sovereignspec.io/drafter": "eagle3",
             "sovereignspec.io/acceptance-rate": "0.8"}  # fmt: skip
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump(k.job("dispatched", TEAM, "serving", annotations=notes)))

    def nominated() -> dict[str, Any] | None:
        wls = k.workloads(cluster, TEAM)
        wl = wls[0] if wls else None
        entry = k.check_state(wl, DISPATCH_CHECK) if wl else None
        return wl if entry and entry["state"] == "Ready" else None

    wl = wait_until(nominated, 120, "the dispatcher's nomination")
    assert wl["status"].get("nominatedClusterNames") in ([WORKER_NAME], None), wl["status"]
    # MultiKueue acted on it: the Workload exists on the worker.
    wait_until(lambda: k.workloads(worker_api, TEAM), 120, "the Workload on the worker")
    # Written by the dispatcher's Pod, as its ServiceAccount (the audit log).
    log = Path(os.environ["SOVEREIGNSPEC_CLUSTER_DIR"]) / "logs" / "audit.log"
    me = f"system:serviceaccount:{DISPATCH_NS}:{DISPATCH_RELEASE}"
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    target = ("workloads", "status", wl["metadata"]["name"])
    fields = ("resource", "subresource", "name")
    writes = [e for e in events if e["user"].get("username") == me and e["verb"] == "patch"
              and tuple(e["objectRef"].get(f) for f in fields) == target]  # fmt: skip
    # Accepted, and never refused or invalid. A 409 is the resourceVersion guard losing a race
    # with Kueue's own status write (the seal or a first wait landing as Kueue admits): designed,
    # decided again from the next version; it failed this assertion once in CI (2026-12-07).
    codes = [e["responseStatus"]["code"] for e in writes]
    assert any(c < 400 for c in codes) and all(c < 400 or c == 409 for c in codes), writes
    lease = client.CoordinationV1Api(cluster).read_namespaced_lease(DISPATCH_RELEASE, DISPATCH_NS)
    assert lease.spec.holder_identity.rpartition("_")[0] in {p.metadata.name for p in pods()}
