"""What telemetry says at one moment, normalised across exporter versions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# GPU activity metrics, most telling first. Tensor-pipe activity measures the compute that
# speculation competes for; engine-busy and utilisation count memory-bound kernels as busy, so they
# understate headroom (a safe direction) and serve only as fallbacks.
# `sovereignspec agent` (NVML) exports the same kinds of reading under its own names.
ACTIVITY_METRICS = (
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "sovereignspec_gpu_tensor_active_ratio",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "sovereignspec_gpu_sm_occupancy_ratio",
    "DCGM_FI_DEV_GPU_UTIL",
    "sovereignspec_gpu_utilization_ratio",
)
# Tensor-pipe activity is a fraction of the tensor cores' peak, not of the whole GPU's.
TENSOR_METRICS = frozenset({"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "sovereignspec_gpu_tensor_active_ratio"})
# A MIG instance's series (dcgm-exporter and the agent label it GPU_I_ID) is not a whole GPU:
# placement works on whole GPUs, so such series are not read as one.
MIG_LABEL = "GPU_I_ID"
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
    )  # (namespace, model) -> (α, tokens)
    tpot: dict[tuple[str, str], float] = field(default_factory=dict)  # (namespace, job) -> seconds
    fetched_at: float = 0.0
    error: str | None = None  # why nothing (or not everything) could be read
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> series/counters treated as missing
    drafting: dict[tuple[str, str], float] = field(default_factory=dict)  # (namespace, owner) -> draft tokens
    drafts: dict[tuple[str, str], float] = field(default_factory=dict)  # (namespace, owner) -> drafts
    drafting_since: float = 0.0  # when the window `drafting` and `drafts` count over began


def normalise_activity(name: str, values: list[float]) -> list[float]:
    """Ratios, not yet validated.

    DCGM_FI_DEV_GPU_UTIL is "GPU utilization (in %)" in dcgm-exporter's counter files, a whole
    number; some exporters give a ratio instead. The set is read as percent unless one of its
    finite values is a fraction strictly between 0 and 1: so an idle fleet reporting 0 % and 1 %
    reads idle, not a 1 % GPU as fully busy."""
    if name != "DCGM_FI_DEV_GPU_UTIL":
        return list(values)
    ratio = any(math.isfinite(v) and 0.0 < v < 1.0 and v != int(v) for v in values)
    return list(values) if ratio else [v / 100.0 for v in values]


def activity_readings(
    name: str, series: list[tuple[str | None, str | None, float, float]], rejected: dict[str, int]
) -> tuple[dict[tuple[str, int], GpuReading], set[tuple[str, int]]]:
    """Validated readings of one activity metric from (host, gpu label, value, observed at).

    Telemetry that cannot be true is not read as idle: a non-finite, negative or above-one ratio,
    or two series for one GPU, leaves that GPU without a reading (plain decode, with the reason
    counted in `rejected`). Returns the readings and the GPUs poisoned this way."""
    ratios = normalise_activity(name, [v for _, _, v, _ in series])
    readings: dict[tuple[str, int], GpuReading] = {}
    poisoned: set[tuple[str, int]] = set()
    for (host, gpu, _, observed), ratio in zip(series, ratios, strict=True):
        if host is None or gpu is None or not gpu.isascii() or not gpu.isdigit() or len(gpu) > 4:
            continue
        key = (host, int(gpu))
        why = None
        if not math.isfinite(ratio):
            why = "non-finite"
        elif ratio < 0.0:
            why = "negative"
        elif ratio > 1.0:
            why = "above-one"
        elif key in readings or key in poisoned:
            why = "duplicate"
        if why is not None:
            rejected[why] = rejected.get(why, 0) + 1
            poisoned.add(key)
            readings.pop(key, None)
            continue
        readings[key] = GpuReading(host, int(gpu), ratio, name, observed)
    return readings, poisoned


def merge_activity(
    per_metric: dict[str, tuple[dict[tuple[str, int], GpuReading], set[tuple[str, int]]]],
) -> dict[tuple[str, int], GpuReading]:
    """The most telling metric per GPU; a GPU that any metric contradicts has no reading."""
    out: dict[tuple[str, int], GpuReading] = {}
    bad: set[tuple[str, int]] = set()
    for name in reversed(ACTIVITY_METRICS):  # better metrics overwrite worse ones
        readings, poisoned = per_metric.get(name, ({}, set()))
        out.update(readings)
        bad |= poisoned
    for key in bad:
        out.pop(key, None)
    return out


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
