"""`sovereignspec agent`: GPU telemetry from NVML on a node without dcgm-exporter.

Reads every GPU (and every MIG instance) through NVML (`nvidia-ml-py`) and serves it in the
Prometheus text format, with dcgm-exporter's label names (`Hostname`, `gpu`, `UUID`, `modelName`,
`GPU_I_ID` for a MIG instance) so that one scrape configuration serves both:

| metric | unit | from |
| --- | --- | --- |
| `sovereignspec_gpu_tensor_active_ratio` | 0..1 | GPM `ANY_TENSOR_UTIL` (Hopper and later) |
| `sovereignspec_gpu_sm_occupancy_ratio` | 0..1 | GPM `SM_OCCUPANCY` (Hopper and later) |
| `sovereignspec_gpu_utilization_ratio` | 0..1 | `nvmlDeviceGetUtilizationRates().gpu` (whole GPUs) |
| `sovereignspec_gpu_memory_used_bytes`, `..._total_bytes` | bytes | `nvmlDeviceGetMemoryInfo` |
| `sovereignspec_gpu_power_watts` | W | `nvmlDeviceGetPowerUsage` |
| `sovereignspec_gpu_energy_joules_total` | J (counter) | `nvmlDeviceGetTotalEnergyConsumption` |

A reading NVML does not support on a device is left out, never written as 0. The tensor, SM and
utilisation ratios are headroom sources for the operator (after dcgm-exporter's equivalents).
GPM metrics need two samples: the first scrape after start has none.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

TENSOR = "sovereignspec_gpu_tensor_active_ratio"
SM_OCCUPANCY = "sovereignspec_gpu_sm_occupancy_ratio"
UTILIZATION = "sovereignspec_gpu_utilization_ratio"
LABELS = ("Hostname", "gpu", "UUID", "modelName", "GPU_I_ID")


@dataclass
class GpuStats:
    """One GPU or MIG instance at one moment; None where NVML does not support the reading."""

    gpu: int
    uuid: str
    model: str
    instance: str = ""  # the MIG GPU instance id; "" for a whole GPU
    values: dict[str, float] = field(default_factory=dict)


class Agent:
    """Collects from an NVML module (pynvml, or a stand-in with the same functions)."""

    def __init__(self, nvml: ModuleType, host: str) -> None:
        self.nvml = nvml
        self.host = host
        self._gpm: dict[tuple[int, str], Any] = {}  # previous GPM sample per GPU / MIG instance
        self.stats: list[GpuStats] = []

    def _try(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def collect(self) -> list[GpuStats]:
        nv = self.nvml
        out: list[GpuStats] = []
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            model = _text(self._try(nv.nvmlDeviceGetName, handle)) or "unknown"
            uuid = _text(self._try(nv.nvmlDeviceGetUUID, handle))
            whole = GpuStats(i, uuid, model)
            if (util := self._try(nv.nvmlDeviceGetUtilizationRates, handle)) is not None:
                whole.values[UTILIZATION] = util.gpu / 100.0
            self._memory(handle, whole)
            if (mw := self._try(nv.nvmlDeviceGetPowerUsage, handle)) is not None:
                whole.values["sovereignspec_gpu_power_watts"] = mw / 1000.0
            if (mj := self._try(nv.nvmlDeviceGetTotalEnergyConsumption, handle)) is not None:
                whole.values["sovereignspec_gpu_energy_joules_total"] = mj / 1000.0
            gpm = self._try(nv.nvmlGpmQueryDeviceSupport, handle)
            gpm_ok = bool(gpm is not None and gpm.isSupportedDevice)
            mig = self._try(nv.nvmlDeviceGetMigMode, handle)
            if mig is not None and mig[0] == nv.NVML_DEVICE_MIG_ENABLE:
                out.append(whole)
                out += self._instances(handle, whole, gpm_ok)
                continue
            if gpm_ok:
                self._gpm_values(handle, None, whole)
            out.append(whole)
        self.stats = out
        return out

    def _memory(self, handle: Any, stats: GpuStats) -> None:
        if (mem := self._try(self.nvml.nvmlDeviceGetMemoryInfo, handle)) is not None:
            stats.values["sovereignspec_gpu_memory_used_bytes"] = float(mem.used)
            stats.values["sovereignspec_gpu_memory_total_bytes"] = float(mem.total)

    def _instances(self, handle: Any, whole: GpuStats, gpm_ok: bool) -> list[GpuStats]:
        nv = self.nvml
        out = []
        for j in range(self._try(nv.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
            mig = self._try(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, j)
            if mig is None:
                continue  # an empty slot
            instance = self._try(nv.nvmlDeviceGetGpuInstanceId, mig)
            stats = GpuStats(
                whole.gpu, _text(self._try(nv.nvmlDeviceGetUUID, mig)), whole.model, str(instance)
            )
            self._memory(mig, stats)
            if gpm_ok and instance is not None:
                self._gpm_values(handle, instance, stats)
            out.append(stats)
        return out

    def _gpm_values(self, handle: Any, instance: int | None, stats: GpuStats) -> None:
        nv = self.nvml
        sample = self._try(nv.nvmlGpmSampleAlloc)
        if sample is None:
            return
        taken = (
            self._try(nv.nvmlGpmSampleGet, handle, sample)
            if instance is None
            else self._try(nv.nvmlGpmMigSampleGet, handle, instance, sample)
        )
        if taken is None:
            self._try(nv.nvmlGpmSampleFree, sample)
            return
        key = (stats.gpu, stats.instance)
        previous, self._gpm[key] = self._gpm.get(key), sample
        if previous is None:
            return
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.sample1, request.sample2 = previous, sample
        request.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_OCCUPANCY
        request.metrics[1].metricId = nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        got = self._try(nv.nvmlGpmMetricsGet, request)
        self._try(nv.nvmlGpmSampleFree, previous)
        if got is None:
            return
        for metric, name in ((got.metrics[0], SM_OCCUPANCY), (got.metrics[1], TENSOR)):
            if metric.nvmlReturn == nv.NVML_SUCCESS:
                stats.values[name] = min(max(metric.value / 100.0, 0.0), 1.0)

    def families(self) -> Iterator[Any]:
        """prometheus_client metric families of the last collection (a custom collector)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        names = sorted({n for s in self.stats for n in s.values})
        for name in names:
            counter = name.endswith("_total")
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            family = kind(name[: -len("_total")] if counter else name, HELP.get(name, name), labels=LABELS)
            for s in self.stats:
                if name in s.values:
                    family.add_metric([self.host, str(s.gpu), s.uuid, s.model, s.instance], s.values[name])
            yield family


HELP = {
    TENSOR: "Ratio of cycles any tensor pipe is active (NVML GPM ANY_TENSOR_UTIL).",
    SM_OCCUPANCY: "Ratio of warps resident to the SMs' maximum (NVML GPM SM_OCCUPANCY).",
    UTILIZATION: "Ratio of time a kernel was running (nvmlDeviceGetUtilizationRates).",
    "sovereignspec_gpu_memory_used_bytes": "Device memory in use.",
    "sovereignspec_gpu_memory_total_bytes": "Device memory in all.",
    "sovereignspec_gpu_power_watts": "Power draw.",
    "sovereignspec_gpu_energy_joules_total": "Energy consumed since the driver loaded.",
}


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


class _Registry:
    """A collector over the agent's latest stats (prometheus_client calls .collect())."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Any]:
        return self.agent.families()


def render(agent: Agent) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(_Registry(agent))  # type: ignore[arg-type,unused-ignore]
    return generate_latest(registry).decode()


def main(argv: list[str] | None = None, nvml: ModuleType | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sovereignspec agent", description=__doc__.splitlines()[0])
    parser.add_argument("--bind", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=9400)
    parser.add_argument(
        "--node",
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="the Hostname label (default: $NODE_NAME, set by the chart from spec.nodeName)",
    )
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between NVML reads")
    parser.add_argument("--once", action="store_true", help="print one reading and exit")
    args = parser.parse_args(argv)
    if nvml is None:
        import pynvml

        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        print(
            f"sovereignspec agent: error: NVML unavailable ({exc}): no NVIDIA driver on this node?",
            file=sys.stderr,
        )
        return 1
    agent = Agent(nvml, args.node)
    try:
        agent.collect()
        if args.once:
            if any(TENSOR not in s.values for s in agent.stats) and agent.stats:
                time.sleep(min(args.interval, 1.0))  # GPM needs a second sample
                agent.collect()
            sys.stdout.write(render(agent))
            return 0
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry()
        registry.register(_Registry(agent))  # type: ignore[arg-type,unused-ignore]
        start_http_server(args.port, addr=args.bind, registry=registry)
        print(f"sovereignspec agent: {len(agent.stats)} GPUs/instances on {args.node}, :{args.port}/metrics",
              file=sys.stderr, flush=True)  # fmt: skip
        while True:
            time.sleep(args.interval)
            agent.collect()
    except KeyboardInterrupt:
        return 0
    finally:
        nvml.nvmlShutdown()
