"""Scrape dcgm-exporter endpoints directly (no Prometheus in between)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from sovereignspec.telemetry.snapshot import (
    ACTIVITY_METRICS,
    MIG_LABEL,
    GpuReading,
    Snapshot,
    activity_readings,
    host_of,
    merge_activity,
)


def parse_exposition(
    text: str, scraped_at: float, rejected: dict[str, int] | None = None
) -> dict[tuple[str, int], GpuReading]:
    samples: dict[str, list[tuple[str | None, str | None, float, float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in ACTIVITY_METRICS and not s.labels.get(MIG_LABEL):
                labels = dict(s.labels)
                samples.setdefault(s.name, []).append(
                    (host_of(labels), labels.get("gpu"), float(s.value), scraped_at)
                )
    counts = rejected if rejected is not None else {}
    return merge_activity({n: activity_readings(n, series, counts) for n, series in samples.items()})


class DcgmScraper:
    def __init__(self, endpoints: list[str], timeout: float = 3.0) -> None:
        self.endpoints = endpoints
        self.timeout = timeout

    def snapshot(self) -> Snapshot:
        now = time.time()
        readings: dict[tuple[str, int], GpuReading] = {}
        rejected: dict[str, int] = {}
        errors = []
        for url in self.endpoints:
            try:
                with urllib.request.urlopen(url, timeout=self.timeout) as resp:
                    text = resp.read().decode()
            except (urllib.error.URLError, OSError) as exc:
                errors.append(f"dcgm-exporter at {url} unreachable: {exc}")
                continue
            try:
                readings.update(parse_exposition(text, time.time(), rejected))
            except ValueError as exc:  # not the exposition format at all
                errors.append(f"dcgm-exporter at {url} answered something that is not metrics: {exc}")
        return Snapshot(gpus=readings, fetched_at=now, error="; ".join(errors) or None, rejected=rejected)
