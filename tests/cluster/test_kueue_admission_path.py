"""The whole Kueue admission-check path on the real control plane, with no SovereignSpec code:
the test plays the external admission-check controller itself."""

from __future__ import annotations

from datetime import UTC, datetime

from kubernetes import client

from localdev import kueue as k
from localdev.gpunodes import server_side_apply
from tests.cluster.conftest import wait_until

OURS = "e2e.sovereignspec.io/test"
THEIRS = "other.example.com/provisioner"


def _write_check(api, wl, name, manager, state, message, pod_set_updates=None):
    entry = {
        "name": name,
        "state": state,
        "message": message,
        "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if pod_set_updates is not None:
        entry["podSetUpdates"] = pod_set_updates
    body = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": wl["metadata"]["name"], "namespace": wl["metadata"]["namespace"]},
        "status": {"admissionChecks": [entry]},  # only our own entry: SSA merges by name
    }
    server_side_apply(api, body, manager, "status")


def test_a_check_written_ready_by_ssa_admits_the_job_with_its_pod_set_updates(
    api, gpu_nodes, namespace, unique
):
    flavor, ours, theirs, cq = unique("h100"), unique("ours"), unique("theirs"), unique("cq")
    k.apply(api, k.resource_flavor(flavor, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}))
    k.apply(api, k.admission_check(ours, OURS))
    k.apply(api, k.admission_check(theirs, THEIRS))
    k.set_check_active(api, ours, "e2e-ours")
    k.set_check_active(api, theirs, "e2e-theirs")
    k.apply(api, k.cluster_queue(cq, {flavor: 8}, [ours, theirs]))
    k.apply(api, k.local_queue("serving", namespace, cq))
    k.apply(
        api, k.job("llm", namespace, "serving", annotations={"sovereignspec.io/tenant": "acme"}, suspend=True)
    )

    def reserved():
        # Kueue may write QuotaReserved and the checks' Pending entries in separate updates.
        wls = k.workloads(api, namespace)
        reserved = wls and (c := k.condition(wls[0], "QuotaReserved")) and c["status"] == "True"
        return wls[0] if reserved and k.check_state(wls[0], ours) and k.check_state(wls[0], theirs) else None

    wl = wait_until(reserved, what="QuotaReserved")
    assert k.check_state(wl, ours)["state"] == "Pending"
    assert k.check_state(wl, theirs)["state"] == "Pending"
    assert wl["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"] == flavor

    # The other controller speaks first, then we write ours Ready under our own field manager.
    _write_check(api, wl, theirs, "other-controller", "Pending", "waiting for capacity")
    updates = [
        {
            "name": wl["spec"]["podSets"][0]["name"],
            "annotations": {"sovereignspec.io/mode": "speculative"},
            "nodeSelector": {"kubernetes.io/hostname": "gpu-h100-eu-1"},
        }
    ]
    _write_check(api, wl, ours, "sovereignspec-e2e-controller", "Ready", "placed by the test", updates)

    wl = k.workloads(api, namespace)[0]
    assert k.check_state(wl, ours)["state"] == "Ready"
    theirs_entry = k.check_state(wl, theirs)
    assert (theirs_entry["state"], theirs_entry["message"]) == ("Pending", "waiting for capacity")
    assert k.condition(wl, "Admitted") is None or k.condition(wl, "Admitted")["status"] != "True"

    _write_check(api, wl, theirs, "other-controller", "Ready", "provisioned")

    batch = client.BatchV1Api(api)

    def unsuspended():
        j = batch.read_namespaced_job("llm", namespace)
        return j if j.spec.suspend is False else None

    job = wait_until(unsuspended, what="the Job to be unsuspended")
    wl = k.workloads(api, namespace)[0]
    assert k.condition(wl, "Admitted")["status"] == "True"
    template = job.spec.template
    assert template.metadata.annotations["sovereignspec.io/mode"] == "speculative"
    assert template.metadata.annotations["sovereignspec.io/tenant"] == "acme"
    assert template.spec.node_selector["kubernetes.io/hostname"] == "gpu-h100-eu-1"
    assert template.spec.node_selector["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"  # the flavor's
    assert k.check_state(wl, theirs)["message"] == "provisioned"


def test_kueue_webhook_suspends_a_job_created_running_with_a_queue_name(api, namespace, unique):
    cq = unique("cq-webhook")
    k.apply(api, k.cluster_queue(cq, {}, []))
    k.apply(api, k.local_queue("q", namespace, cq))
    k.apply(api, k.job("eager", namespace, "q", suspend=False))
    assert client.BatchV1Api(api).read_namespaced_job("eager", namespace).spec.suspend is True
