"""`python -m benchmarks.operator` (or `make bench-operator`): admission latency and memory of the
operator on the local control plane, beside a trivial always-Ready check, in one run.

Setup: 250 simulated nodes x 8 GPUs = 2,000 GPUs with telemetry through a real Prometheus; three
identical ClusterQueues over them: one with the SovereignSpec AdmissionCheck (its sovereignty
record on and required, as installed), one with a second SovereignSpec operator's check whose
record is off (its role lacks AuditSegments; --no-audit-required), and one with a trivial check
answered by this benchmark itself (a watch that writes Ready by server-side apply as soon as quota
is reserved). 500 Jobs go to each queue, interleaved; the record's bytes per decision are printed.
For every Workload the benchmark notes, from its own watch, when QuotaReserved and when Admitted
became true, and reports the median and p99 of the difference per queue and their ratio, the
operator's peak RSS and CPU seconds, and the API server's requests during the burst by verb and
resource, per decided workload (`apiserver_request_total` before and after: every client's requests,
Kueue's and this benchmark's too), with the LISTs per 100 decided workloads and the operator's own
cache LISTs (from its metrics: after start-up it LISTs only when a watch cannot be resumed).

`--jobs N` (per queue) and `--gpus N` (8 per node) size it: `make bench-operator ARGS="--jobs 5000"`.
`--mix` makes them the serving shapes: a third each of Jobs, Deployments of one replica (a Pod the
controller-manager makes and Kueue admits alone) and LeaderWorkerSet groups of two pods (one
Workload per group): `make bench-operator ARGS="--mix"`.
"""

from __future__ import annotations

import argparse
import json
import math
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

from kubernetes import client, watch
from prometheus_client.parser import text_string_to_metric_families
from urllib3.exceptions import ProtocolError

from localdev import controlplane
from localdev import kueue as k
from localdev.gpunodes import apply_node, server_side_apply
from localdev.operator import OperatorProcess, SyntheticTelemetry, install, policy, service_account_kubeconfig
from localdev.prometheus import LocalPrometheus

JOBS = 500
NODES = 250
GPUS_PER_NODE = 8
KUEUE = (k.GROUP, k.VERSION)
TRIVIAL = "bench.sovereignspec.io/trivial"
OURS = "sovereignspec.io/bench"
UNRECORDED = "sovereignspec.io/bench-unrecorded"
LABELS = {
    "ours": "SovereignSpec check",
    "unrecorded": "the same, record off",
    "trivial": "trivial always-Ready check",
}


def unrecorded_kubeconfig(api: client.ApiClient, namespace: str) -> Any:
    """An operator identity with the chart's ClusterRole less its AuditSegment rule: with
    --no-audit-required its record is off (a 403, said once) and it decides all the same; the
    benchmark's measure of what the record costs."""
    role = client.RbacAuthorizationV1Api(api).read_cluster_role("sovereignspec").to_dict()
    rules = [
        {
            k: v
            for k, v in r.items()
            if v is not None and k in ("api_groups", "resources", "verbs", "resource_names")
        }
        for r in role["rules"]
        if "auditsegments" not in (r.get("resources") or [])
    ]
    names = {"api_groups": "apiGroups", "resource_names": "resourceNames"}
    server_side_apply(api, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "sovereignspec-unrecorded"},
        "rules": [{names.get(k, k): v for k, v in r.items()} for r in rules],
    }, "bench")  # fmt: skip
    return service_account_kubeconfig(api, namespace, "unrecorded", cluster_role="sovereignspec-unrecorded")


def record_bytes(api: client.ApiClient) -> tuple[int, int]:
    """(bytes, decision records) of the record in the cluster: each record as its segment holds it."""
    from sovereignspec.operator.roles.audit import read_segments

    records = [r for s in read_segments(client.CustomObjectsApi(api)) for r in s["records"]]
    size = sum(len(json.dumps(r, separators=(",", ":")).encode()) for r in records)
    return size, sum(1 for r in records if r.get("kind") == "decision")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def api_requests(api: client.ApiClient) -> dict[tuple[str, str], float]:
    """The API server's request counters so far: (verb, resource) -> requests, over every code."""
    text = api.call_api(
        *api.param_serialize(method="GET", resource_path="/metrics", auth_settings=["BearerToken"])
    ).read()
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text.decode()):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name == "apiserver_request_total":
                key = (sample.labels.get("verb", ""), sample.labels.get("resource", ""))
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def _cache_lists(text: str) -> float:
    """The operator's full LISTs so far (sovereignspec_cache_lists_total, every resource)."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "sovereignspec_cache_lists_total"
    )


def _notes(i: int) -> dict[str, str]:
    return {
        "sovereignspec.io/model": "llama-3.1-8b",
        "sovereignspec.io/drafter": "eagle3" if i % 3 else "ngram",
        "sovereignspec.io/acceptance-rate": f"{0.5 + (i % 5) * 0.1:.1f}",
        "sovereignspec.io/tpot-slo-ms": "60",
    }


def job(name: str, namespace: str, queue: str, i: int) -> dict[str, Any]:
    return k.job(name, namespace, queue, annotations=_notes(i))


def _server_template(i: int, app: str) -> dict[str, Any]:
    tpl = k.job(app, "x", "q", annotations=_notes(i))["spec"]["template"]
    tpl["metadata"]["labels"] = {"app": app}
    tpl["spec"]["restartPolicy"] = "Always"
    return dict(tpl)


def workload(name: str, namespace: str, queue: str, i: int, mix: bool) -> dict[str, Any]:
    """Job i, or with `mix` every third a Job, a Deployment of one replica (its Pod admitted alone,
    made by the controller-manager) or a LeaderWorkerSet group of two one-GPU pods (made by the
    LeaderWorkerSet controller and the controller-manager): one Workload each."""
    if not mix or i % 3 == 0:
        return job(name, namespace, queue, i)
    meta = {"name": name, "namespace": namespace, "labels": {"kueue.x-k8s.io/queue-name": queue}}
    if i % 3 == 1:
        spec = {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": _server_template(i, name),
        }
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}
    group = {"size": 2, "workerTemplate": _server_template(i, name)}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": meta,
        "spec": {"replicas": 1, "leaderWorkerTemplate": group},
    }


class Recorder:
    """Watches Workloads in the benchmark namespaces; notes when each condition first turned true."""

    def __init__(self, api: client.ApiClient, namespaces: dict[str, str]) -> None:
        self.api = api
        self.namespaces = namespaces  # namespace -> queue label
        self.reserved: dict[str, float] = {}
        self.admitted: dict[str, float] = {}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._watch, args=(ns,), daemon=True) for ns in namespaces]
        for t in self.threads:
            t.start()

    def _watch(self, namespace: str) -> None:
        custom = client.CustomObjectsApi(self.api)
        listing = (custom.list_namespaced_custom_object, *KUEUE, namespace, "workloads")
        for ev in _events(self.stop, *listing):
            now = time.monotonic()
            wl = ev["object"]
            key = f"{namespace}/{wl['metadata']['name']}"
            conds = {c["type"]: c["status"] for c in wl.get("status", {}).get("conditions", [])}
            if conds.get("QuotaReserved") == "True":
                self.reserved.setdefault(key, now)
            if conds.get("Admitted") == "True":
                self.admitted.setdefault(key, now)


def _events(stop: threading.Event, *listing: Any) -> Iterator[dict[str, Any]]:
    """A watch's events until `stop`, watched afresh every 30 s and wherever the stream breaks. A
    break once stopping (the figures are in and the control plane goes down) ends it quietly, so
    a benchmark's watch threads print nothing of their own after its figures."""
    while not stop.is_set():
        w = watch.Watch()
        try:
            for ev in w.stream(*listing, timeout_seconds=30):
                yield ev
                if stop.is_set():
                    w.stop()
                    return
        except (ProtocolError, OSError, client.ApiException):
            if stop.is_set():
                return
            time.sleep(1)  # the API server is restarting or refusing: watch again


class TrivialCheck:
    """The baseline admission-check controller: Ready as soon as quota is reserved."""

    def __init__(self, api: client.ApiClient, namespace: str, check: str) -> None:
        self.api, self.namespace, self.check = api, namespace, check
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        custom = client.CustomObjectsApi(self.api)
        for ev in _events(
            self.stop, custom.list_namespaced_custom_object, *KUEUE, self.namespace, "workloads"
        ):
            wl = ev["object"]
            status = wl.get("status", {})
            reserved = any(
                c["type"] == "QuotaReserved" and c["status"] == "True" for c in status.get("conditions", [])
            )
            entry = next((c for c in status.get("admissionChecks", []) if c["name"] == self.check), None)
            if reserved and entry and entry["state"] == "Pending":
                k.set_check_state(self.api, wl, self.check, "Ready", "trivial", "bench-trivial-check")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.operator", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=JOBS, help=f"Jobs per queue (default {JOBS})")
    parser.add_argument(
        "--mix",
        action="store_true",
        help="a third each of Jobs, Deployments (one replica) and LeaderWorkerSet groups (two pods)",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=NODES * GPUS_PER_NODE,
        help=f"GPUs, {GPUS_PER_NODE} per node (default 2000)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.gpus < 1:
        parser.error("--jobs and --gpus: accepted: positive integers")
    jobs, nodes = args.jobs, math.ceil(args.gpus / GPUS_PER_NODE)
    with controlplane.session("bench-operator"):
        return _run(args, jobs, nodes)


def _run(args: argparse.Namespace, jobs: int, nodes: int) -> int:
    api = controlplane.api_client()
    install(api)
    token = secrets.token_hex(3)
    telemetry = SyntheticTelemetry()
    prometheus = LocalPrometheus(scrape_interval="2s").start()
    prometheus.set_targets("synthetic", [telemetry.target])
    print(f"creating {nodes} nodes x {GPUS_PER_NODE} GPUs ...", flush=True)
    products = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-H200", "NVIDIA-GeForce-RTX-4090"]
    for i in range(nodes):
        name = f"bench-{token}-{i:03d}"
        cap = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": str(GPUS_PER_NODE)}
        labels = {
            "kubernetes.io/hostname": name,
            "nvidia.com/gpu.product": products[i % 4],
            "sovereignspec.io/bench": token,
            "node-restriction.kubernetes.io/jurisdiction": "eu",
        }
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        apply_node(api, {**node, "status": {"capacity": cap, "allocatable": cap}})
        for g in range(GPUS_PER_NODE):
            telemetry.set_headroom(name, g, ((i * GPUS_PER_NODE + g) % 20) / 20)
    while len(prometheus.query("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")) < nodes * GPUS_PER_NODE:
        time.sleep(1)

    flavor, ours_check, trivial_check = f"bench-{token}", f"bench-ours-{token}", f"bench-trivial-{token}"
    policy_name = f"bench-{token}"
    k.apply(api, k.resource_flavor(flavor, {"sovereignspec.io/bench": token}), "bench")
    server_side_apply(api, policy(policy_name, prometheus.url), "bench")
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": policy_name}
    unrecorded_check = f"bench-unrecorded-{token}"
    k.apply(api, k.admission_check(ours_check, OURS, params), "bench")
    k.apply(api, k.admission_check(unrecorded_check, UNRECORDED, params), "bench")
    k.apply(api, k.admission_check(trivial_check, TRIVIAL), "bench")
    k.set_check_active(api, trivial_check, "bench-trivial-check")
    namespaces = {}
    checks = (("ours", ours_check), ("unrecorded", unrecorded_check), ("trivial", trivial_check))
    for label, check in checks:
        name = f"bench-{label}-{token}"
        k.apply(api, k.cluster_queue(name, {flavor: nodes * GPUS_PER_NODE}, [check], cpu="100000"), "bench")
        client.CoreV1Api(api).create_namespace(cast(Any, {"metadata": {"name": name}}))
        k.apply(api, k.local_queue("q", name, name), "bench")
        namespaces[label] = name

    operator = OperatorProcess(OURS).start()
    unrecorded = OperatorProcess(
        UNRECORDED,
        extra=["--no-audit-required"],
        kubeconfig=unrecorded_kubeconfig(api, namespaces["unrecorded"]),
    ).start()
    bytes_before, decisions_before = record_bytes(api)
    trivial = TrivialCheck(api, namespaces["trivial"], trivial_check)
    recorder = Recorder(api, dict.fromkeys(namespaces.values(), "q"))
    time.sleep(2)
    print(f"submitting {jobs} jobs to each queue ...", flush=True)
    requests_before, cpu_before = api_requests(api), operator.cpu_seconds()
    lists_before = _cache_lists(operator.metrics())
    started = time.monotonic()
    for i in range(jobs):
        for ns in namespaces.values():
            server_side_apply(api, workload(f"j{i:03d}", ns, "q", i, args.mix), "bench")
    # Jobs never finish here (no kubelet), so each queue admits at most its GPU quota.
    admissible = min(jobs, nodes * GPUS_PER_NODE)
    deadline = time.monotonic() + max(600.0, 0.5 * jobs)
    while time.monotonic() < deadline and len(recorder.admitted) < len(namespaces) * admissible:
        time.sleep(1)
    elapsed = time.monotonic() - started
    peak = operator.peak_rss_bytes()
    cpu = operator.cpu_seconds() - cpu_before
    requests_after = api_requests(api)
    cache_lists = _cache_lists(operator.metrics()) - lists_before
    bytes_after, decisions_after = record_bytes(api)
    recorder.stop.set()
    trivial.stop.set()
    operator.stop()
    unrecorded.stop()
    said = [line for line in unrecorded.logs().splitlines() if "the sovereignty record is off" in line]
    off_said = said[0].split(": ", 1)[-1] if said else "NOTHING: its record was not off"
    prometheus.close()
    telemetry.close()

    results = {}
    for label, ns in namespaces.items():
        waits = [
            recorder.admitted[k] - recorder.reserved[k]
            for k in recorder.admitted
            if k.startswith(ns + "/") and k in recorder.reserved
        ]
        results[label] = waits
    shapes = "workloads (Jobs, Deployments, LeaderWorkerSet groups)" if args.mix else "Jobs"
    print(
        f"\n{jobs} {shapes} per queue over {nodes * GPUS_PER_NODE} GPUs ({admissible} per queue can be "
        f"admitted: the quota, as nothing finishes here); admitted in {elapsed:.1f} s"
    )
    print(f"{'queue':<28} {'admitted':>8} {'median s':>9} {'p99 s':>8}")
    for label, waits in results.items():
        print(
            f"{LABELS[label]:<28} {len(waits):>8} {statistics.median(waits):>9.3f} {pct(waits, 0.99):>8.3f}"
        )
    for base in ("trivial", "unrecorded"):
        ratio_med = statistics.median(results["ours"]) / statistics.median(results[base])
        ratio_p99 = pct(results["ours"], 0.99) / pct(results[base], 0.99)
        print(f"ratio SovereignSpec / {LABELS[base]}: median {ratio_med:.2f}, p99 {ratio_p99:.2f}")
    recorded = decisions_after - decisions_before
    per = (bytes_after - bytes_before) / max(recorded, 1)
    print(
        f"the record (audit.required, in the cluster): {recorded} decision records, {per:.0f} bytes per "
        f"decision (no pod runs here: no bindings); the record-off operator said: {off_said}"
    )
    print(f"operator peak RSS: {peak / 2**20:.1f} MiB; CPU during the burst: {cpu:.1f} s")
    decided = max(len(results["ours"]), 1)
    delta = {
        key: n - requests_before.get(key, 0.0)
        for key, n in requests_after.items()
        if n - requests_before.get(key, 0.0) > 0 and key[0] != "WATCH"
    }
    print(f"API requests during the burst (every client), per workload SovereignSpec decided ({decided}):")
    print(f"{'verb':<8} {'resource':<32} {'requests':>9} {'per workload':>13}")
    for (verb, resource), n in sorted(delta.items(), key=lambda item: -item[1]):
        print(f"{verb:<8} {resource or '-':<32} {n:>9.0f} {n / decided:>13.3f}")
    lists = sum(n for (verb, _), n in delta.items() if verb == "LIST")
    gets = sum(n for (verb, _), n in delta.items() if verb == "GET")
    print(
        f"LIST during the burst: {lists:.0f} ({100 * lists / decided:.2f} per 100 decided workloads); "
        f"the operator's own cache LISTs: {cache_lists:.0f}; GET: {gets / decided:.3f} per decided workload"
    )
    return 0 if all(len(w) == admissible for w in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
