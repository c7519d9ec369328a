"""Synthetic clusters and pending workloads for the placement benchmark (deterministic by seed)."""

from __future__ import annotations

import math
import random
from typing import Any

from sovereignspec.core.cluster import ClusterView, GpuState, NodeState, WorkloadRequest
from sovereignspec.core.sovereignty import DEFAULT_JURISDICTION_LABEL

GPU_MIX = (("A100-80G-SXM", 0.3), ("H100-SXM", 0.3), ("H200", 0.1), ("L40S", 0.15), ("RTX-4090", 0.15))
JURISDICTIONS = ("eu", "kr", "us")


def mixed_cluster(n_gpus: int, seed: int = 1, gpus_per_node: int = 8) -> ClusterView:
    """Nodes of 8 GPUs of one type each, types in GPU_MIX proportions, three jurisdictions,
    headroom readings spread from idle to saturated, 3 % of GPUs with stale telemetry, some
    neighbours with SLOs and some nodes already running (exclusive) tenants."""
    rng = random.Random(seed)
    types = [t for t, _ in GPU_MIX]
    weights = [w for _, w in GPU_MIX]
    nodes: list[NodeState] = []
    gpus: list[GpuState] = []
    for i in range(math.ceil(n_gpus / gpus_per_node)):
        name = f"node-{i:05d}"
        gpu_type = rng.choices(types, weights)[0]
        tenants = frozenset({f"tenant-{rng.randrange(200):03d}"}) if rng.random() < 0.3 else frozenset()
        exclusive = tenants if tenants and rng.random() < 0.2 else frozenset()
        labels = {DEFAULT_JURISDICTION_LABEL: rng.choice(JURISDICTIONS), "nvidia.com/gpu.product": gpu_type}
        count = min(gpus_per_node, n_gpus - len(gpus))
        nodes.append(
            NodeState(name, labels, free_gpus=count * 4, tenants=tenants, exclusive_tenants=exclusive)
        )
        for k in range(count):
            headroom = None if rng.random() < 0.03 else round(rng.random(), 3)
            ratio = math.inf if rng.random() < 0.5 else round(rng.uniform(1.02, 2.0), 3)
            gpus.append(
                GpuState(name, k, gpu_type, headroom, ratio, "neighbour" if math.isfinite(ratio) else None)
            )
    return ClusterView(nodes, gpus)


def tenant_shapes(n_tenants: int, seed: int = 2) -> list[dict[str, Any]]:
    """Each tenant serves one model with one drafter and one declared acceptance rate."""
    rng = random.Random(seed)
    shapes: list[dict[str, Any]] = []
    for t in range(n_tenants):
        model = rng.choice(["llama-3.1-8b", "llama-3.1-8b", "llama-3.3-70b"])
        drafters = ["eagle3", "ngram", None] + (["llama-3.2-1b-draft"] if model == "llama-3.3-70b" else [])
        shapes.append(
            {
                "tenant": f"tenant-{t:03d}",
                "model": model,
                "drafter": rng.choice(drafters),
                "alpha": round(rng.uniform(0.3, 0.9), 2),
                "seqs": rng.choice([4, 8, 16, 32]),
                "context": rng.choice([256, 1024, 4096]),
                "latency_class": rng.choice(["latency", "latency", "throughput"]),
                "tpot_slo_s": rng.choice([None, 0.03, 0.06]),
                "jurisdiction": rng.choice([None, None, *JURISDICTIONS]),
                "exclusive": rng.random() < 0.05,
            }
        )
    return shapes


def pending_workloads(n: int, n_tenants: int = 200, seed: int = 3) -> list[WorkloadRequest]:
    rng = random.Random(seed)
    shapes = tenant_shapes(n_tenants)
    out = []
    for i in range(n):
        shape = dict(rng.choice(shapes))
        out.append(WorkloadRequest(name=f"wl-{i:05d}", **shape))
    return out


def one_off_workloads(n: int, seed: int = 4) -> list[WorkloadRequest]:
    """Workloads that share no signature, so each placement evaluates every GPU from scratch."""
    rng = random.Random(seed)
    return [
        WorkloadRequest(
            f"single-{i:04d}",
            f"tenant-x{i}",
            rng.choice(["llama-3.1-8b", "llama-3.3-70b"]),
            rng.choice(["eagle3", "ngram"]),
            0.5 + i * 1e-4,
            seqs=rng.choice([4, 8, 16]),
            context=rng.choice([256, 1024, 4096]),
            tpot_slo_s=0.05,
        )
        for i in range(n)
    ]
