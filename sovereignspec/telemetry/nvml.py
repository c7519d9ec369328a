"""GPU activity from NVML on the local node (`nvidia-ml-py`, imported as `pynvml`).

For a node agent or a quick check on a GPU host; the operator itself runs centrally and reads
Prometheus or dcgm-exporter. Without a driver, `read()` returns an empty snapshot whose error says
so, instead of raising.
"""

from __future__ import annotations

import socket
import time

from sovereignspec.telemetry.snapshot import GpuReading, Snapshot


def read(node: str | None = None) -> Snapshot:
    now = time.time()
    try:
        import pynvml
    except ImportError:  # pragma: no cover - a declared dependency
        return Snapshot(fetched_at=now, error="nvidia-ml-py is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return Snapshot(fetched_at=now, error=f"NVML unavailable: {exc}")
    host = node or socket.gethostname()
    readings = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu  # percent of time a kernel ran
            readings[(host, i)] = GpuReading(
                host, i, util / 100.0, "nvmlDeviceGetUtilizationRates", time.time()
            )
    finally:
        pynvml.nvmlShutdown()
    return Snapshot(gpus=readings, fetched_at=now)
