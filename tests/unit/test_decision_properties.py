"""The operator's whole pure decision path — API objects in, check entries out (`view.build` then
`plan.plan`) — over generated clusters, namespaces, policies and hostile annotations, run tick after
tick with each tick's writes applied to the next tick's objects, as the API would.

Properties, checked against the objects themselves (not against the code's own reading of them):
no placement breaks jurisdiction, exclusivity or capacity; no input raises out of a tick; every
workload that waits is decided. The test counts decisions and requires at least 10⁵."""

from __future__ import annotations

import copy
import functools
import json
import random
from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border.policy import DEFAULT_GPU_PRODUCTS, PolicySpec
from sovereignspec.operator.border.world import World
from sovereignspec.operator.decision.plan import plan
from sovereignspec.operator.decision.view import build
from sovereignspec.profiles import load_profiles
from sovereignspec.telemetry.snapshot import GpuReading, Snapshot
from tests.engine_keys import OUT_SGLANG_ADAPTIVE, OUT_VLLM

JUR = "node-restriction.kubernetes.io/jurisdiction"
CHECK = "sovereignspec"
PRODUCTS = sorted(DEFAULT_GPU_PRODUCTS)
HOSTILE_VALUES = [
    "eu", "kr", "us", "kr\n", " eu", "EU", "true", "false", "TRUE", "True", "yes", "0.8", "0.3", "1", "0",
    "inf", "-inf", "nan", "1e309", "1e300", "1_0", "８", "-1", "", "64", "8", "0.5", "none", "eagle3",
    "ngram", "llama-3.1-8b", "latency", "throughput", "bank", "acme", "x" * 300,
]  # fmt: skip
KEYS = [
    *ann.INPUTS, "Jurisdiction", "jurisdicton", "tenants", "Exclusive-Node", "acceptance-rat", "mode",
    "draft-budget", "vllm-speculative-config", "gpu-index", "region",
]  # fmt: skip
GPU_VALUES = ["1", "2", "4", "1k", "2000m", "500m", "abc", "0", "8", "1e1", "-1"]
DECISIONS = {"count": 0}


@functools.cache
def profiles() -> Any:
    return load_profiles()


@st.composite
def worlds(draw: st.DrawFn) -> tuple[World, dict[str, dict[str, str]], PolicySpec]:
    n_nodes = draw(st.integers(1, 6))
    nodes = []
    for i in range(n_nodes):
        labels = {
            "kubernetes.io/hostname": f"h{i}",
            "nvidia.com/gpu.product": draw(st.sampled_from(PRODUCTS)),
        }
        jurisdiction = draw(st.sampled_from(["eu", "kr", "us", None]))
        if jurisdiction:
            labels[JUR] = jurisdiction
        gpus = draw(st.sampled_from(["1", "2", "4", "8", "8", "4", "abc"]))
        nodes.append(
            {
                "metadata": {
                    "name": f"node-{i}.example" if draw(st.booleans()) else f"h{i}",
                    "labels": labels,
                },
                "status": {"allocatable": {"nvidia.com/gpu": gpus}},
            }
        )
    namespaces: dict[str, dict[str, str]] = {}
    for i in range(draw(st.integers(1, 4))):
        labels = {}
        if draw(st.booleans()):
            labels["sovereignspec.io/tenant"] = draw(st.sampled_from(["bank", "acme", "shop", "Bad Name"]))
        if draw(st.integers(0, 3)) == 0:
            labels["sovereignspec.io/jurisdiction"] = draw(st.sampled_from(["eu", "kr", "nowhere!"]))
        namespaces[f"ns{i}"] = labels
    workloads = []
    # Workloads come from a seeded generator: drawing each field through hypothesis costs more
    # than deciding it, and the count still shrinks.
    rng = random.Random(draw(st.integers(0, 2**32)))
    for i in range(draw(st.integers(1, 120))):
        notes = {ann.PREFIX + rng.choice(KEYS): rng.choice(HOSTILE_VALUES) for _ in range(rng.randrange(6))}
        # Well-formed sovereignty often enough that exclusivity and jurisdiction are really exercised.
        if rng.random() < 0.3:
            notes[ann.PREFIX + "exclusive-node"] = "true"
        if rng.random() < 0.3:
            notes[ann.PREFIX + "jurisdiction"] = rng.choice(["eu", "kr", "us"])
        ns = rng.choice(sorted(namespaces))
        gpus = rng.choice(GPU_VALUES)
        workloads.append(
            {
                "metadata": {"name": f"w{i}", "namespace": ns, "uid": f"u{i}"},
                "spec": {
                    "podSets": [
                        {
                            "name": "main",
                            "count": rng.choice([1, 1, 1, 2, 3]),
                            "template": {
                                "metadata": {"annotations": notes},
                                "spec": {
                                    "containers": [
                                        {"name": "s", "resources": {"requests": {"nvidia.com/gpu": gpus}}}
                                    ]
                                },
                            },
                        }
                    ]
                },
                "status": {
                    "conditions": [{"type": "QuotaReserved", "status": "True"}],
                    "admissionChecks": [{"name": CHECK, "state": "Pending", "message": ""}],
                },
            }
        )
    policy = PolicySpec.model_validate(
        {
            "telemetry": {"source": "prometheus", "prometheusURL": "http://unused"},
            "placement": {"keepWholeNodesFree": draw(st.integers(0, 2))},
        }
    )
    return World(workloads, nodes, {}, namespaces, [], {}, {CHECK: policy}), namespaces, policy


def _snapshot(world: World) -> Snapshot:
    gpus = {}
    for i, n in enumerate(world.nodes):
        host = n["metadata"]["labels"]["kubernetes.io/hostname"]
        for g in range(8):
            gpus[(host, g)] = GpuReading(
                host, g, ((i * 7 + g * 3) % 10) / 10, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.0
            )
    return Snapshot(gpus=gpus, fetched_at=0.0)


def _gpus(wl: dict[str, Any]) -> int | None:
    ps = wl["spec"]["podSets"][0]
    text = ps["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
    exact = {"1": 1, "2": 2, "4": 4, "8": 8, "0": 0, "1k": 1000, "2000m": 2, "1e1": 10}
    return None if text not in exact else exact[text] * ps["count"]


def _capacity(node: dict[str, Any]) -> int:
    text = node["status"]["allocatable"]["nvidia.com/gpu"]
    return int(text) if text.isdigit() else 0


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(worlds())
def _every_tick_keeps_sovereignty_and_capacity(
    case: tuple[World, dict[str, dict[str, str]], PolicySpec],
) -> None:
    world, namespaces, policy = case
    world = copy.deepcopy(world)
    snapshot = _snapshot(world)
    by_host = {n["metadata"]["labels"]["kubernetes.io/hostname"]: n for n in world.nodes}
    for _ in range(3):  # ticks; each one's writes are applied before the next
        view = build(world, {CHECK}, policy, profiles(), snapshot, 1.0)
        writes = plan("p", policy, view, profiles(), "2026-12-01T00:00:00Z")
        DECISIONS["count"] += len(writes)
        assert len(writes) == len(view.pending)
        by_key = {f"{w['metadata']['namespace']}/{w['metadata']['name']}": w for w in world.workloads}
        for w in writes:
            entry = by_key[w.key]["status"]["admissionChecks"][0]
            entry.update(state=w.state, message=w.message)
            if w.pod_set_updates is not None:
                entry["podSetUpdates"] = w.pod_set_updates
    # The final ledger, read from the objects.
    used: dict[str, int] = defaultdict(int)
    tenants: dict[str, set[str]] = defaultdict(set)
    exclusive: dict[str, set[str]] = defaultdict(set)
    for wl in world.workloads:
        entry = wl["status"]["admissionChecks"][0]
        if entry["state"] != "Ready":
            continue
        selector = entry["podSetUpdates"][0]["nodeSelector"]
        pod = entry["podSetUpdates"][0]["annotations"]
        gpus = _gpus(wl)
        assert gpus is not None, "a workload whose GPU count is unreadable was placed"
        if "kubernetes.io/hostname" in selector:
            counted = [(selector["kubernetes.io/hostname"], gpus)]
            reach = [selector["kubernetes.io/hostname"]]
        else:  # spread: counted per pod, pinned by labels; every node they select may be the one
            planned = [item.rsplit("/", 1)[0] for item in pod[ann.OUT_NODES].split(",")]
            counted = [(h, gpus // len(planned)) for h in planned]
            reach = [
                h
                for h, n in by_host.items()
                if all(n["metadata"]["labels"].get(k) == v for k, v in selector.items())
            ]
            assert set(planned) <= set(reach), (planned, selector)
        notes = wl["spec"]["podSets"][0]["template"]["metadata"]["annotations"]
        ns_labels = namespaces[wl["metadata"]["namespace"]]
        for host in reach:
            node_j = by_host[host]["metadata"]["labels"].get(JUR)
            if ann.PREFIX + "jurisdiction" in notes:
                assert node_j == notes[ann.PREFIX + "jurisdiction"], (notes, node_j)
            if "sovereignspec.io/jurisdiction" in ns_labels:
                assert node_j == ns_labels["sovereignspec.io/jurisdiction"]
        for key in notes:  # nothing that looks like a sovereignty key was ignored
            short = key[len(ann.PREFIX) :]
            assert short not in ("Jurisdiction", "jurisdicton", "tenants", "Exclusive-Node", "region"), key
        tenant = ns_labels.get("sovereignspec.io/tenant", wl["metadata"]["namespace"])
        assert notes.get(ann.PREFIX + "tenant", tenant) == tenant
        for host, n in counted:
            used[host] += n
        for host in reach:  # a pod may land on any of them: each counts the tenant
            tenants[host].add(tenant)
            if notes.get(ann.PREFIX + "exclusive-node") == "true":
                exclusive[host].add(tenant)
        if pod[ann.OUT_MODE] == "plain":
            assert pod[ann.OUT_BUDGET] == "0" and OUT_VLLM not in pod and OUT_SGLANG_ADAPTIVE not in pod
        else:
            # γ* at the declared batch, and what the engine may draft at most: equal, or larger
            # through the per-batch table (light batches speculating where the declared one is 0).
            config = json.loads(pod[OUT_VLLM])
            top, budget = config["num_speculative_tokens"], int(pod[ann.OUT_BUDGET])
            assert top >= budget and top > 0
            table = config.get("num_speculative_tokens_per_batch_size")
            assert top == budget or (table and max(k for _, _, k in table) == top)
            if budget == 0:  # armed, K = 0 at the declared batch: slower than plain there, and it says so
                assert float(pod[ann.OUT_SPEEDUP]) < 1.0, pod
    for host, n in used.items():
        assert n <= _capacity(by_host[host]), (host, n)
        if exclusive[host]:
            assert len(tenants[host]) == 1, (host, tenants[host])


def test_no_generated_cluster_or_hostile_annotation_breaks_sovereignty_capacity_or_a_tick() -> None:
    DECISIONS["count"] = 0
    _every_tick_keeps_sovereignty_and_capacity()
    print(f"\n{DECISIONS['count']} decisions checked")
    assert DECISIONS["count"] >= 100_000
