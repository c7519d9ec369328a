"""Online calibration on the real control plane: engines that run plain report their batch and step
time through a real Prometheus, the operator learns their GPU type into a LearnedProfile, the next
decision is priced by it, and an administrator's `kubectl patch` pins the shipped profile back.

The GPU type is one no other test uses (L40S), so what is learned here prices nothing else; the
test deletes its LearnedProfile, which starts that learning over."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from kubernetes import client

from localdev import controlplane
from sovereignspec.core.roofline import roofline_for, tensor_parallel_for
from sovereignspec.profiles import load_profiles
from tests.cluster.conftest import wait_until
from tests.cluster.operator_env import admitted_job, make_pool, our_entry, submit, workload_of

GPU, MODEL = "L40S", "llama-3.1-8b"
NAME = "l40s.llama-3.1-8b"
BATCHES = (1, 8, 32, 64, 128, 256)


def true_step_s(batch: int) -> float:
    """The world's physics: an L40S slower than its profile (compute 0.6x, bandwidth 0.75x)."""
    profiles = load_profiles()
    shipped, model = profiles.gpus[GPU], profiles.models[MODEL]
    true = replace(shipped, compute_efficiency=shipped.compute_efficiency * 0.6,
                   bandwidth_efficiency=shipped.bandwidth_efficiency * 0.75)  # fmt: skip
    return float(roofline_for(true, model, tensor_parallel_for(true, model)).step_time(batch, batch, 1024))


def learned() -> dict[str, Any] | None:
    custom = client.CustomObjectsApi(controlplane.api_client())
    try:
        return dict(custom.get_cluster_custom_object("sovereignspec.io", "v1alpha1", "learnedprofiles", NAME))
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_plain_engines_teach_their_gpu_the_next_decision_is_priced_by_it_and_a_pin_takes_it_back(
    env, operator, namespace
):
    pool = make_pool(env, namespace, [(GPU, "eu", 8, [0.9] * 8)])
    plain = {"model": MODEL, "context_length": 1024, "latency_class": "throughput"}
    try:
        for b in BATCHES:
            submit(pool, f"engine-{b}", **plain)
        for b in BATCHES:
            admitted_job(pool, f"engine-{b}")
            env.telemetry.set_step(namespace, f"engine-{b}", b, true_step_s(b))

        def in_force() -> dict[str, Any] | None:
            obj = learned()
            status = (obj or {}).get("status") or {}
            return status if status.get("inForce") == "learned" else None

        status = wait_until(in_force, timeout=120, what="a learned L40S profile in force")
        assert status["identified"] is True and status["pointCount"] >= 12, status
        assert (
            float(status["heldOutErrorPct"].rstrip("%")) < 5.0 < float(status["shippedErrorPct"].rstrip("%"))
        )
        assert learned()["spec"] == {"gpuType": GPU, "model": MODEL, "use": "auto", "frozen": False}

        # The next decision on that GPU type is priced by what was learned, and says so.
        submit(pool, "after", model=MODEL, drafter="eagle3", acceptance_rate=0.8, latency_class="latency")
        admitted_job(pool, "after")
        message = our_entry(pool, workload_of(pool, "after"))["message"]
        assert "priced with the learned profile" in message, message

        # An administrator pins the shipped profile, as the README says; our fields stay ours.
        patch = json.dumps({"spec": {"use": "shipped"}})
        controlplane.kubectl("patch", "learnedprofile", NAME, "--type", "merge", "-p", patch)
        wait_until(lambda: (learned() or {}).get("status", {}).get("inForce") == "shipped", timeout=60,
                   what="the shipped profile pinned")  # fmt: skip

        def gauge() -> float | None:
            for line in operator.metrics().splitlines():
                if line.startswith("sovereignspec_learned_profile_in_force{") and f'"{GPU}"' in line:
                    return float(line.rsplit(" ", 1)[1])
            return None

        assert wait_until(lambda: gauge() == 0.0, timeout=30, what="the in-force gauge at 0") is True
        submit(pool, "pinned", model=MODEL, drafter="eagle3", acceptance_rate=0.8, latency_class="latency")
        admitted_job(pool, "pinned")
        assert "learned profile" not in our_entry(pool, workload_of(pool, "pinned"))["message"]
    finally:
        for b in BATCHES:
            env.telemetry.clear_step(namespace, f"engine-{b}")
        client.BatchV1Api(env.api).delete_collection_namespaced_job(
            namespace, propagation_policy="Background"
        )
        if learned() is not None:
            client.CustomObjectsApi(env.api).delete_cluster_custom_object(
                "sovereignspec.io", "v1alpha1", "learnedprofiles", NAME
            )
