"""What telemetry says at one moment, normalised across exporter versions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# GPU activity metrics, most telling first. Tensor-pipe activity measures the compute that
# speculation competes for; engine-busy and utilisation count memory-bound kernels as busy, so they
# understate headroom (a safe direction) and serve only as fallbacks.
ACTIVITY_METRICS = (
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL",
)
# dcgm-exporter renamed its host label from Hostname to hostname; both are read.
HOST_LABELS = ("hostname", "Hostname", "node", "kubernetes_node")


@dataclass(frozen=True)
class GpuReading:
    node: str
    gpu: int
    activity: float  # ratio in [0, 1]
    metric: str  # which metric it came from
    observed_at: float  # unix seconds of the sample


@dataclass(frozen=True)
class Snapshot:
    gpus: dict[tuple[str, int], GpuReading] = field(default_factory=dict)
    acceptance: dict[tuple[str, str], tuple[float, float]] = field(
        default_factory=dict
    )  # (tenant, model) -> (α, tokens)
    tpot: dict[tuple[str, str], float] = field(default_factory=dict)  # (namespace, job) -> seconds
    fetched_at: float = 0.0
    error: str | None = None  # why nothing (or not everything) could be read


def normalise_activity(name: str, values: list[float]) -> list[float]:
    """Ratios in [0, 1]. DCGM_FI_DEV_GPU_UTIL is a percentage before dcgm-exporter 4.9 and a ratio
    after; a series set with any value above 1 is read as percent."""
    if name == "DCGM_FI_DEV_GPU_UTIL" and any(v > 1.0 for v in values):
        values = [v / 100.0 for v in values]
    return [min(max(v, 0.0), 1.0) for v in values]


def host_of(labels: dict[str, str]) -> str | None:
    for key in HOST_LABELS:
        if labels.get(key):
            return labels[key]
    return None


def blend_acceptance(prior: float, observed: tuple[float, float] | None, prior_weight: float) -> float:
    """Bayesian-style blend: the prior counts as `prior_weight` draft tokens of evidence."""
    if observed is None:
        return prior
    rate, tokens = observed
    if tokens <= 0 or math.isnan(rate):
        return prior
    return (prior * prior_weight + rate * tokens) / (prior_weight + tokens)
