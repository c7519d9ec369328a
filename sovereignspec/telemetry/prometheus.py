"""Read GPU activity, acceptance and TPOT through the Prometheus HTTP API (urllib, no client lib)."""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from sovereignspec.core.speedup import alpha_from_draft_acceptance
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

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
        target = f"{self.url}/api/v1/query?" + urllib.parse.urlencode(params)
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
        """(tenant, model) -> (per-token acceptance α, draft tokens in the window).

        vLLM: α is the first draft position's acceptance (accepted_tokens_per_pos{position="0"} /
        drafts) when the per-position counter is there; otherwise it is recovered from accepted /
        drafted tokens at the mean draft length drafted / drafts. SGLang's spec_accept_rate is
        taken as α, with the prior's weight (it reports no token counts)."""
        by = "tenant, namespace, model_name"
        w = self.window
        # One evaluation time for every query: increase() extrapolates to the window's edges, so
        # counters read at different instants would not divide into a true ratio.
        at = time.time()

        def totals(metric: str, extra: str = "") -> dict[tuple[str, str], float]:
            rows = self.query(f"sum by ({by}) (increase({metric}{extra}[{w}]))", at)
            return {_tenant_model(r["metric"]): float(r["value"][1]) for r in rows}

        drafts = totals("vllm:spec_decode_num_drafts_total")
        draft_tokens = totals("vllm:spec_decode_num_draft_tokens_total")
        accepted = totals("vllm:spec_decode_num_accepted_tokens_total")
        first = totals("vllm:spec_decode_num_accepted_tokens_per_pos_total", '{position="0"}')
        out: dict[tuple[str, str], tuple[float, float]] = {}
        for key, tokens in draft_tokens.items():
            n = drafts.get(key, 0.0)
            if tokens <= 0 or n <= 0:
                continue
            if key in first:
                out[key] = (min(first[key] / n, 1.0), tokens)
            elif key in accepted:
                out[key] = (alpha_from_draft_acceptance(accepted[key] / tokens, round(tokens / n)), tokens)
        for r in self.query(f"avg by ({by}) (avg_over_time(sglang:spec_accept_rate[{w}]))", at):
            out.setdefault(_tenant_model(r["metric"]), (float(r["value"][1]), -1.0))
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
