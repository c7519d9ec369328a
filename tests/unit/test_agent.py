"""`sovereignspec agent` through a stand-in NVML module (the functions and structures of
nvidia-ml-py that the agent calls), and for real without a driver (this machine has none)."""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sovereignspec.agent import Agent, main, render
from sovereignspec.telemetry.dcgm import parse_exposition


class NVMLError(Exception):
    pass


def fake_nvml(gpus: list[dict[str, Any]], init_fails: bool = False) -> ModuleType:
    """GPUs: {"name", "util", "mem": (used, total), "power_mw", "energy_mj", "gpm": {...} | None,
    "mig": [ {"instance": id, "mem": (used, total), "gpm": {...}} ] | None}. A GPM dict gives
    {"sm": percent, "tensor": percent} reported between two samples."""
    nv = ModuleType("pynvml_standin")
    nv.NVMLError = NVMLError  # type: ignore[attr-defined]
    nv.NVML_SUCCESS = 0  # type: ignore[attr-defined]
    nv.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]
    nv.NVML_GPM_METRICS_GET_VERSION = 1  # type: ignore[attr-defined]
    nv.NVML_GPM_METRIC_SM_OCCUPANCY = 3  # type: ignore[attr-defined]
    nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5  # type: ignore[attr-defined]
    handles = {("gpu", i): g for i, g in enumerate(gpus)}

    def need(value: Any) -> Any:
        if value is None:
            raise NVMLError("Not Supported")
        return value

    def init() -> None:
        if init_fails:
            raise NVMLError("Driver Not Loaded")

    def mig_handle(h: tuple, j: int) -> tuple:
        migs = handles[h].get("mig") or []
        if j >= len(migs):
            raise NVMLError("Not Found")
        return ("mig", h[1], j)

    def obj(h: tuple) -> dict[str, Any]:
        return handles[("gpu", h[1])]["mig"][h[2]] if h[0] == "mig" else handles[h]

    def sample_get(h: tuple, sample: SimpleNamespace, instance: int | None = None) -> SimpleNamespace:
        g = handles[h]
        src = g["gpm"] if instance is None else next(m for m in g["mig"] if m["instance"] == instance)["gpm"]
        sample.src = need(src)
        return sample

    def metrics_get(request: SimpleNamespace) -> SimpleNamespace:
        src = request.sample2.src
        for m in request.metrics[: request.numMetrics]:
            value = {3: src.get("sm"), 5: src.get("tensor")}[m.metricId]
            m.nvmlReturn, m.value = (0, value) if value is not None else (3, 0.0)
        return request

    nv.nvmlInit = init  # type: ignore[attr-defined]
    nv.nvmlShutdown = lambda: None  # type: ignore[attr-defined]
    nv.nvmlDeviceGetCount = lambda: len(gpus)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetName = lambda h: handles[h]["name"].encode()  # type: ignore[attr-defined]
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h[1]}" + (f"-MIG-{h[2]}" if h[0] == "mig" else "")  # type: ignore[attr-defined]
    nv.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=need(handles[h].get("util")), memory=0)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=obj(h)["mem"][0], total=obj(h)["mem"][1])  # type: ignore[attr-defined]
    nv.nvmlDeviceGetPowerUsage = lambda h: need(handles[h].get("power_mw"))  # type: ignore[attr-defined]
    nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: need(handles[h].get("energy_mj"))  # type: ignore[attr-defined]
    nv.nvmlGpmQueryDeviceSupport = lambda h: SimpleNamespace(
        isSupportedDevice=int(handles[h].get("gpm") is not None or bool(handles[h].get("mig")))
    )  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMigMode = lambda h: (1, 1) if handles[h].get("mig") else (0, 0)  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7 if handles[h].get("mig") else 0  # type: ignore[attr-defined]
    nv.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle  # type: ignore[attr-defined]
    nv.nvmlDeviceGetGpuInstanceId = lambda h: obj(h)["instance"]  # type: ignore[attr-defined]
    nv.nvmlGpmSampleAlloc = lambda: SimpleNamespace(src=None)  # type: ignore[attr-defined]
    nv.nvmlGpmSampleFree = lambda s: None  # type: ignore[attr-defined]
    nv.nvmlGpmSampleGet = sample_get  # type: ignore[attr-defined]
    nv.nvmlGpmMigSampleGet = lambda h, i, s: sample_get(h, s, i)  # type: ignore[attr-defined]
    nv.nvmlGpmMetricsGet = metrics_get  # type: ignore[attr-defined]
    nv.c_nvmlGpmMetricsGet_t = lambda: SimpleNamespace(  # type: ignore[attr-defined]
        version=0, numMetrics=0, sample1=None, sample2=None,
        metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(4)],
    )  # fmt: skip
    return nv


H100 = {"name": "NVIDIA H100 80GB HBM3", "util": 63, "mem": (40 << 30, 80 << 30), "power_mw": 412_000,
        "energy_mj": 9_000_000, "gpm": {"sm": 55.0, "tensor": 31.5}}  # fmt: skip
A100_MIG = {"name": "NVIDIA A100-SXM4-80GB", "util": None, "mem": (1 << 30, 80 << 30), "power_mw": 90_000,
            "energy_mj": 1_000, "gpm": None,
            "mig": [{"instance": 1, "mem": (2 << 30, 10 << 30), "gpm": {"sm": 20.0, "tensor": 10.0}},
                    {"instance": 2, "mem": (3 << 30, 10 << 30), "gpm": {"sm": 40.0, "tensor": None}}],
            }  # fmt: skip
A10 = {
    "name": "NVIDIA A10",
    "util": 0,
    "mem": (0, 24 << 30),
    "power_mw": None,
    "energy_mj": None,
    "gpm": None,
}


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict, name: str, **labels: str) -> float | None:
    for (n, ls), v in found.items():
        d = dict(ls)
        if n == name and all(d.get(k) == x for k, x in labels.items()):
            return v
    return None


def test_every_gpu_and_mig_instance_is_rendered_with_dcgm_exporters_label_names() -> None:
    agent = Agent(fake_nvml([H100, A100_MIG, A10]), "node-7")
    agent.collect()
    first = samples(render(agent))
    assert value(first, "sovereignspec_gpu_tensor_active_ratio") is None  # GPM needs two samples
    agent.collect()
    found = samples(render(agent))
    h = {"Hostname": "node-7", "gpu": "0", "UUID": "GPU-0", "GPU_I_ID": ""}
    assert value(found, "sovereignspec_gpu_utilization_ratio", **h) == pytest.approx(0.63)
    assert value(found, "sovereignspec_gpu_tensor_active_ratio", **h) == pytest.approx(0.315)
    assert value(found, "sovereignspec_gpu_sm_occupancy_ratio", **h) == pytest.approx(0.55)
    assert value(found, "sovereignspec_gpu_power_watts", **h) == pytest.approx(412.0)
    assert value(found, "sovereignspec_gpu_energy_joules_total", **h) == pytest.approx(9000.0)
    assert value(found, "sovereignspec_gpu_memory_total_bytes", **h) == 80 << 30
    assert value(found, "sovereignspec_gpu_utilization_ratio", modelName="NVIDIA H100 80GB HBM3") is not None
    # MIG: each instance on its own, with its GPU instance id; what NVML does not support is absent
    assert value(found, "sovereignspec_gpu_tensor_active_ratio", gpu="1", GPU_I_ID="1") == pytest.approx(0.10)
    assert value(found, "sovereignspec_gpu_sm_occupancy_ratio", gpu="1", GPU_I_ID="2") == pytest.approx(0.40)
    assert value(found, "sovereignspec_gpu_tensor_active_ratio", gpu="1", GPU_I_ID="2") is None
    assert value(found, "sovereignspec_gpu_memory_used_bytes", gpu="1", GPU_I_ID="2") == 3 << 30
    assert value(found, "sovereignspec_gpu_utilization_ratio", gpu="1") is None  # not supported, not 0
    assert value(found, "sovereignspec_gpu_power_watts", gpu="2") is None
    assert value(found, "sovereignspec_gpu_utilization_ratio", gpu="2") == 0.0


def test_the_operator_reads_the_agents_tensor_activity_as_headroom_and_skips_mig_instances() -> None:
    agent = Agent(fake_nvml([H100, A100_MIG, A10]), "node-7")
    agent.collect()
    agent.collect()
    readings = parse_exposition(render(agent), 100.0)
    assert readings[("node-7", 0)].metric == "sovereignspec_gpu_tensor_active_ratio"
    assert readings[("node-7", 0)].activity == pytest.approx(0.315)
    assert ("node-7", 1) not in readings  # only MIG instances (and memory) there: no whole-GPU reading
    assert readings[("node-7", 2)].metric == "sovereignspec_gpu_utilization_ratio"


def test_without_a_driver_the_agent_says_so_in_one_line_and_exits_non_zero(capsys) -> None:
    assert main(["--once"], nvml=fake_nvml([], init_fails=True)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "NVML unavailable" in err and "Driver Not Loaded" in err


def test_on_this_machine_with_no_nvidia_driver_the_real_command_fails_cleanly() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sovereignspec.cli", "agent", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert (
        proc.stderr.startswith("sovereignspec agent: error: NVML unavailable")
        and "Traceback" not in proc.stderr
    )
    assert proc.stderr.count("\n") == 1
