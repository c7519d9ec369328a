"""`make demo`: SovereignSpec deciding for a mix of tenants on the local control plane.

Brings up etcd, kube-apiserver and Kueue (or reuses them), installs SovereignSpec's CRD and RBAC
and `deploy/examples/`, starts a synthetic GPU/vLLM telemetry source behind a real Prometheus and
the operator (as its own least-privilege user), submits a mix of tenants' serving Jobs, and prints
the decisions Kueue admitted. The control plane stays up afterwards for kubectl; `make
cluster-down` stops it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from kubernetes import client

from localdev import controlplane, kueue
from localdev.gpunodes import EXAMPLES, apply_examples, documents, server_side_apply
from localdev.operator import OperatorProcess, SyntheticTelemetry, install
from localdev.prometheus import LocalPrometheus
from sovereignspec.operator.plan import shorten

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


def _decision(api: client.ApiClient, job: str, namespace: str) -> tuple[str, str] | None:
    """(state, message) of our check on the job's workload, once decided."""
    for wl in kueue.workloads(api, namespace):
        if not any(r.get("name") == job for r in wl["metadata"].get("ownerReferences", [])):
            continue
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
        batch = client.BatchV1Api(api)
        names: list[tuple[str, str, str]] = []  # (job, namespace, tenant)
        for doc in documents(EXAMPLES / "40-workloads.yaml"):  # applied with the rest above
            names.append((doc["metadata"]["name"], doc["metadata"]["namespace"], "acme"))
        for name, tenant, notes, gpus in WORKLOADS:
            namespace = _tenant_namespace(api, tenant)
            server_side_apply(api, _job(name, namespace, notes, gpus), "sovereignspec-demo")
            names.append((name, namespace, tenant))
        deadline = time.monotonic() + 120
        decisions: dict[str, tuple[str, str]] = {}
        while len(decisions) < len(names) and time.monotonic() < deadline:
            for name, namespace, _ in names:
                if name not in decisions and (d := _decision(api, name, namespace)):
                    decisions[name] = d
            time.sleep(0.5)
        time.sleep(1)
        rows = []
        for name, namespace, tenant in names:
            job = batch.read_namespaced_job(name, namespace)
            notes = job.spec.template.metadata.annotations or {}
            state, message = decisions.get(name, ("Pending", "no decision within 120 s"))
            node = (job.spec.template.spec.node_selector or {}).get("kubernetes.io/hostname", "-")
            rows.append(
                (
                    name,
                    tenant,
                    state,
                    node if state == "Ready" else "-",
                    notes.get("sovereignspec.io/mode", "-") if state == "Ready" else "-",
                    notes.get("sovereignspec.io/draft-budget", "-") if state == "Ready" else "-",
                    notes.get("sovereignspec.io/predicted-speedup", "-") if state == "Ready" else "-",
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
        return 0 if all(n in decisions for n, _, _ in names) else 1
    finally:
        operator.stop()
        prometheus.close()
        telemetry.close()


if __name__ == "__main__":
    sys.exit(main())
