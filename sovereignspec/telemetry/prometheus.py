"""Read GPU activity, acceptance and TPOT through the Prometheus HTTP API (urllib, no client lib)."""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from sovereignspec.telemetry.snapshot import (
    ACTIVITY_METRICS,
    GpuReading,
    Snapshot,
    host_of,
    normalise_activity,
)


class PrometheusError(RuntimeError):
    pass


class PrometheusReader:
    def __init__(self, url: str, timeout: float = 3.0, window: str = "5m") -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.window = window

    def query(self, promql: str) -> list[dict[str, Any]]:
        target = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(target, timeout=self.timeout) as resp:
                doc = json.load(resp)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise PrometheusError(f"Prometheus at {self.url} unreachable: {exc}") from exc
        if doc.get("status") != "success":
            raise PrometheusError(
                f"Prometheus at {self.url} answered {doc.get('errorType')}: {doc.get('error')}"
            )
        return list(doc["data"]["result"])

    def gpu_activity(self) -> dict[tuple[str, int], GpuReading]:
        readings: dict[tuple[str, int], GpuReading] = {}
        for name in reversed(ACTIVITY_METRICS):  # better metrics overwrite worse ones
            values = self.query(name)
            stamps = {_key(r["metric"]): float(r["value"][1]) for r in self.query(f"timestamp({name})")}
            ratios = normalise_activity(name, [float(r["value"][1]) for r in values])
            for r, ratio in zip(values, ratios, strict=True):
                host, gpu = host_of(r["metric"]), r["metric"].get("gpu")
                if host is None or gpu is None or not gpu.isdigit():
                    continue
                observed = stamps.get(_key(r["metric"]), float(r["value"][0]))
                readings[(host, int(gpu))] = GpuReading(host, int(gpu), ratio, name, observed)
        return readings

    def acceptance(self) -> dict[tuple[str, str], tuple[float, float]]:
        """(tenant, model) -> (acceptance rate, draft tokens in the window), from vLLM and SGLang."""
        by = "tenant, namespace, model_name"
        w = self.window
        accepted = self.query(f"sum by ({by}) (increase(vllm:spec_decode_num_accepted_tokens_total[{w}]))")
        drafted = self.query(f"sum by ({by}) (increase(vllm:spec_decode_num_draft_tokens_total[{w}]))")
        out: dict[tuple[str, str], tuple[float, float]] = {}
        totals = {_tenant_model(r["metric"]): float(r["value"][1]) for r in drafted}
        for r in accepted:
            key = _tenant_model(r["metric"])
            tokens = totals.get(key, 0.0)
            if tokens > 0:
                out[key] = (float(r["value"][1]) / tokens, tokens)
        # SGLang exports the rate itself; weight it by one window of its running requests' tokens
        # is unknown, so it counts as much as the prior's weight (see blend_acceptance).
        for r in self.query(f"avg by ({by}) (avg_over_time(sglang:spec_accept_rate[{w}]))"):
            key = _tenant_model(r["metric"])
            out.setdefault(key, (float(r["value"][1]), -1.0))
        return out

    def tpot(self) -> dict[tuple[str, str], float]:
        """(namespace, job) -> p90 time per output token over the last two minutes."""
        q = (
            "histogram_quantile(0.9, sum by (le, namespace, job_name) "
            "(rate(vllm:time_per_output_token_seconds_bucket[2m])))"
        )
        out = {}
        for r in self.query(q):
            value = float(r["value"][1])
            if not math.isnan(value) and r["metric"].get("job_name"):
                out[(r["metric"].get("namespace", ""), r["metric"]["job_name"])] = value
        return out

    def snapshot(self) -> Snapshot:
        now = time.time()
        try:
            gpus = self.gpu_activity()
        except PrometheusError as exc:
            return Snapshot(fetched_at=now, error=str(exc))
        errors = []
        acceptance: dict[tuple[str, str], tuple[float, float]] = {}
        tpot: dict[tuple[str, str], float] = {}
        try:
            acceptance = self.acceptance()
            tpot = self.tpot()
        except PrometheusError as exc:
            errors.append(str(exc))
        return Snapshot(gpus, acceptance, tpot, now, "; ".join(errors) or None)


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def _tenant_model(labels: dict[str, str]) -> tuple[str, str]:
    return (labels.get("tenant") or labels.get("namespace", ""), labels.get("model_name", ""))
