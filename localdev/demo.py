"""`make demo`: SovereignSpec deciding for a mix of tenants on the local control plane.

Brings up etcd, kube-apiserver and Kueue (or reuses them), installs SovereignSpec's CRD and RBAC
and `deploy/examples/`, starts a synthetic GPU/vLLM telemetry source behind a real Prometheus and
the operator (as its own least-privilege user), submits a mix of tenants' serving Jobs, a
Deployment and a LeaderWorkerSet group (`deploy/examples/serving-shapes/`), and prints the
decisions. The control plane stays up afterwards for kubectl; `make
cluster-down` stops it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from localdev import controlplane, kueue
from localdev.gpunodes import EXAMPLES, apply_examples, documents, server_side_apply
from localdev.operator import OperatorProcess, SyntheticTelemetry, install
from localdev.prometheus import LocalPrometheus
from sovereignspec.operator.decision.plan import shorten

NAMESPACE = "llm-serving"
CONTROLLER = "sovereignspec.io/speculation"
CHECK = "sovereignspec"

# Telemetry the demo publishes: headroom per GPU of the example nodes (1 = idle, 0 = saturated).
HEADROOM = {
    "gpu-a100-eu-1": [0.2, 0.3, 0.1, 0.25, 0.2, 0.15, 0.3, 0.2],
    "gpu-a100-eu-2": [0.6] * 8,
    "gpu-h100-eu-1": [0.95, 0.9, 0.92, 0.1, 0.05, 0.9, 0.85, 0.95],
    "gpu-h100-kr-1": [0.0] * 8,
    "gpu-h200-kr-1": [0.9] * 8,
    "gpu-4090-kr-1": [0.0] * 4,
    "gpu-4090-kr-2": [0.05] * 4,
}
EFFICIENCY = {"4090": 0.65}

# (job, tenant, annotations, GPUs): a mix of tenants, drafters, acceptance, SLOs and sovereignty.
WORKLOADS: list[tuple[str, str, dict[str, str], int]] = [
    ("legal-draft", "lawfirm", {"model": "llama-3.1-8b", "drafter": "eagle3",
                                "acceptance-rate": "0.85", "tpot-slo-ms": "30", "jurisdiction": "eu"}, 1),
    ("bank-assist", "bank", {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance-rate": "0.8",
                             "jurisdiction": "kr", "exclusive-node": "true"}, 1),
    ("gov-summarise", "ministry", {"model": "llama-3.1-8b", "drafter": "ngram", "acceptance-rate": "0.5",
                                   "latency-class": "throughput", "jurisdiction": "kr"}, 1),
    ("retail-batch", "retail", {"model": "llama-3.1-8b", "drafter": "none",
                                "latency-class": "throughput"}, 1),
    ("research-70b", "lab", {"model": "llama-3.3-70b", "drafter": "llama-3.2-1b-draft",
                             "acceptance-rate": "0.7", "tpot-slo-ms": "80"}, 4),
    ("media-caption", "media", {"model": "llama-3.1-8b", "drafter": "ngram", "acceptance-rate": "0.4",
                                "context-length": "256"}, 1),
    ("startup-chat", "startup", {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance-rate": "high"}, 1),
    ("health-records", "clinic", {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance-rate": "0.8",
                                  "jurisdiction": "us"}, 1),
]  # fmt: skip


def _tenant_namespace(api: client.ApiClient, tenant: str) -> str:
    """A namespace per tenant, labelled by the administrator with its tenant, queueing to the
    example ClusterQueue: tenancy comes from namespaces, never from a workload's own claim."""
    name = f"tenant-{tenant}"
    server_side_apply(
        api,
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": name, "labels": {"sovereignspec.io/tenant": tenant}}},
        "sovereignspec-demo",
    )  # fmt: skip
    kueue.apply(api, kueue.local_queue("serving", name, "gpu-serving"), "sovereignspec-demo")
    return name


def _job(name: str, namespace: str, notes: dict[str, str], gpus: int) -> dict[str, Any]:
    annotations = {f"sovereignspec.io/{k}": v for k, v in notes.items()}
    return kueue.job(name, namespace, "serving", annotations=annotations, gpus=gpus, cpu="4")


Match = Callable[[dict[str, Any]], bool]


def _owned_by(kind: str, name: str, prefix: bool = False) -> Match:
    def match(wl: dict[str, Any]) -> bool:
        refs = wl["metadata"].get("ownerReferences") or []
        return any(
            r.get("kind") == kind
            and (str(r.get("name", "")).startswith(name) if prefix else r.get("name") == name)
            for r in refs
        )

    return match


def _decision(api: client.ApiClient, wl: dict[str, Any], namespace: str) -> tuple[str, str] | None:
    """(state, message) of our check on a workload, once decided."""
    entry = kueue.check_state(wl, CHECK)
    if entry is None:
        return None
    if entry["state"] != "Pending":
        return str(entry["state"]), str(entry["message"])
    if "Previously: " in entry.get("message", ""):
        state = entry["message"].rsplit("Previously: ", 1)[1]
        events = client.CoreV1Api(api).list_namespaced_event(namespace).items
        why = next((e.message for e in events if e.involved_object.name == wl["metadata"]["name"]
                    and e.reason == state), state)  # fmt: skip
        return state, str(why)
    return None


def _where(entry: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """The node (or a spread group's nodes) and our annotations, from our check's podSetUpdates."""
    update = (entry.get("podSetUpdates") or [{}])[0]
    notes = update.get("annotations") or {}
    host = (update.get("nodeSelector") or {}).get("kubernetes.io/hostname")
    if host is None and notes.get("sovereignspec.io/nodes"):
        host = "+".join(sorted({x.split("/")[0] for x in notes["sovereignspec.io/nodes"].split(",")}))
    return host or "-", notes


def main() -> int:
    print("starting a fresh local control plane (etcd, kube-apiserver, Kueue) ...", flush=True)
    controlplane.down()  # the demo starts from nothing, whatever an earlier run left behind
    controlplane.up()
    api = controlplane.api_client()
    install(api)
    # The examples as the README says to apply them without the chart (the CRD and RBAC come from
    # install() above); then the demo's own Prometheus in the policy.
    applied = controlplane.kubectl("apply", "-f", str(EXAMPLES), "-f", str(EXAMPLES / "without-chart"))
    if applied.returncode != 0:
        raise RuntimeError(f"kubectl apply -f {EXAMPLES} failed:\n{applied.stderr}")
    apply_examples(api, ("00-gpu-nodes.yaml",))  # node capacity is status: written as a kubelet would

    telemetry = SyntheticTelemetry()
    for node, values in HEADROOM.items():
        eff = EFFICIENCY["4090"] if "4090" in node else 0.7
        for gpu, h in enumerate(values):
            telemetry.set_headroom(node, gpu, h, eff)
    prometheus = LocalPrometheus().start()
    prometheus.set_targets("synthetic-gpus", [telemetry.target])
    while not prometheus.query("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"):
        time.sleep(0.5)

    pointed = {
        "apiVersion": "sovereignspec.io/v1alpha1",
        "kind": "SpeculationPolicy",
        "metadata": {"name": "default"},
        "spec": {"telemetry": {"prometheusURL": prometheus.url}, "reevaluationSeconds": 2},
    }
    server_side_apply(api, pointed, "sovereignspec-demo")
    operator = OperatorProcess(CONTROLLER).start()
    print(f"operator running (log: {operator.log_path}); Prometheus at {prometheus.url}", flush=True)
    try:
        # (label, namespace, tenant, which Workloads, how many): the Jobs, then the serving shapes.
        wanted: list[tuple[str, str, str, Match, int]] = []
        for doc in documents(EXAMPLES / "40-workloads.yaml"):  # applied with the rest above
            name = doc["metadata"]["name"]
            wanted.append((name, doc["metadata"]["namespace"], "acme", _owned_by("Job", name), 1))
        for name, tenant, notes, gpus in WORKLOADS:
            namespace = _tenant_namespace(api, tenant)
            server_side_apply(api, _job(name, namespace, notes, gpus), "sovereignspec-demo")
            wanted.append((name, namespace, tenant, _owned_by("Job", name), 1))
        # A Deployment (each replica its own Workload) and a LeaderWorkerSet group across nodes,
        # applied as deploy/examples/README.md says.
        shapes = controlplane.kubectl("apply", "-f", str(EXAMPLES / "serving-shapes"))
        if shapes.returncode != 0:
            raise RuntimeError(f"kubectl apply -f {EXAMPLES / 'serving-shapes'} failed:\n{shapes.stderr}")
        for doc in documents(EXAMPLES / "serving-shapes" / "50-deployment.yaml"):
            name = doc["metadata"]["name"]
            wanted.append(
                (name, NAMESPACE, "acme", _owned_by("Pod", f"{name}-", prefix=True), doc["spec"]["replicas"])
            )
        for doc in documents(EXAMPLES / "serving-shapes" / "60-leaderworkerset.yaml"):
            name = doc["metadata"]["name"]
            wanted.append(
                (name, NAMESPACE, "acme", _owned_by("LeaderWorkerSet", name), doc["spec"]["replicas"])
            )
        deadline = time.monotonic() + 120
        found: dict[str, tuple[str, str, str, tuple[str, str] | None]] = {}  # workload -> row facts
        while time.monotonic() < deadline:
            for label, namespace, tenant, match, _ in wanted:
                for wl in kueue.workloads(api, namespace):
                    if match(wl) and (
                        wl["metadata"]["name"] not in found or found[wl["metadata"]["name"]][3] is None
                    ):
                        found[wl["metadata"]["name"]] = (
                            label,
                            namespace,
                            tenant,
                            _decision(api, wl, namespace),
                        )
            counts = {label: sum(1 for f in found.values() if f[0] == label and f[3]) for label, *_ in wanted}
            if all(counts[label] >= n for label, _, _, _, n in wanted):
                break
            time.sleep(0.5)
        time.sleep(1)
        rows = []
        for wl_name, (label, namespace, tenant, decided) in found.items():
            state, message = decided or ("Pending", "no decision within 120 s")
            wl = next(w for w in kueue.workloads(api, namespace) if w["metadata"]["name"] == wl_name)
            node, notes = _where(kueue.check_state(wl, CHECK) or {}) if state == "Ready" else ("-", {})
            kind = next((r["kind"] for r in wl["metadata"].get("ownerReferences") or []), "?")
            rows.append(
                (
                    label if kind == "Job" else f"{label} ({'group' if kind != 'Pod' else 'replica'})",
                    tenant,
                    state,
                    node,
                    notes.get("sovereignspec.io/mode", "-"),
                    notes.get("sovereignspec.io/draft-budget", "-"),
                    notes.get("sovereignspec.io/predicted-speedup", "-"),
                    message.split("; ", 2)[-1] if state == "Ready" else message,
                )
            )
        header = ("workload", "tenant", "check", "node", "mode", "γ", "S_real", "reason")
        widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(7)]
        print()
        print("  ".join(h.ljust(w) for h, w in zip(header[:7], widths, strict=True)) + "  reason")
        for r in rows:
            print(
                "  ".join(str(v).ljust(w) for v, w in zip(r[:7], widths, strict=True))
                + "  "
                + shorten(r[7], 150)
            )
        print()
        print("Every decision's full record is an Event on its Workload:")
        kubectl = f"~/.cache/sovereignspec/bin/kubectl-* --kubeconfig {controlplane.kubeconfig()}"
        print(f"  {kubectl} -n NAMESPACE get events --field-selector involvedObject.kind=Workload")
        print("The control plane is still up; `make cluster-down` stops it.")
        complete = all(sum(1 for r in found.values() if r[0] == w[0] and r[3]) >= w[4] for w in wanted)
        return 0 if complete else 1
    finally:
        operator.stop()
        prometheus.close()
        telemetry.close()


if __name__ == "__main__":
    sys.exit(main())
