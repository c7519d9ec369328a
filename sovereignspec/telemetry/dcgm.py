"""Scrape dcgm-exporter endpoints directly (no Prometheus in between)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from sovereignspec.telemetry.snapshot import (
    ACTIVITY_METRICS,
    GpuReading,
    Snapshot,
    host_of,
    normalise_activity,
)


def parse_exposition(text: str, scraped_at: float) -> dict[tuple[str, int], GpuReading]:
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in ACTIVITY_METRICS:
                samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    readings: dict[tuple[str, int], GpuReading] = {}
    for name in reversed(ACTIVITY_METRICS):
        series = samples.get(name, [])
        ratios = normalise_activity(name, [v for _, v in series])
        for (labels, _), ratio in zip(series, ratios, strict=True):
            host, gpu = host_of(labels), labels.get("gpu")
            if host is not None and gpu is not None and gpu.isdigit():
                readings[(host, int(gpu))] = GpuReading(host, int(gpu), ratio, name, scraped_at)
    return readings


class DcgmScraper:
    def __init__(self, endpoints: list[str], timeout: float = 3.0) -> None:
        self.endpoints = endpoints
        self.timeout = timeout

    def snapshot(self) -> Snapshot:
        now = time.time()
        readings: dict[tuple[str, int], GpuReading] = {}
        errors = []
        for url in self.endpoints:
            try:
                with urllib.request.urlopen(url, timeout=self.timeout) as resp:
                    text = resp.read().decode()
            except (urllib.error.URLError, OSError) as exc:
                errors.append(f"dcgm-exporter at {url} unreachable: {exc}")
                continue
            readings.update(parse_exposition(text, time.time()))
        return Snapshot(gpus=readings, fetched_at=now, error="; ".join(errors) or None)
