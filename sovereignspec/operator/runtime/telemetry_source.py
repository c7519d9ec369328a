"""Both roles' telemetry: one snapshot per source configuration of a SpeculationPolicy (Prometheus,
DCGM exporters, none), reused briefly, its failures counted and never cached. The dispatcher reads
each worker cluster's Prometheus with the same settings, only its URL its own."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sovereignspec.operator.border.policy import PolicySpec, PrometheusClient
from sovereignspec.operator.runtime import metrics
from sovereignspec.telemetry.dcgm import DcgmScraper
from sovereignspec.telemetry.prometheus import ClientConfig, PrometheusReader
from sovereignspec.telemetry.snapshot import Snapshot

log = logging.getLogger(__name__)


def client_config(c: PrometheusClient) -> ClientConfig:
    """The policy's `telemetry.prometheusClient` as the reader takes it."""
    return ClientConfig(
        timeout=c.timeout_seconds,
        retries=c.retries,
        bearer_token_file=c.authorization.credentials_file if c.authorization else None,
        basic_auth_username=c.basic_auth.username if c.basic_auth else None,
        basic_auth_password_file=c.basic_auth.password_file if c.basic_auth else None,
        ca_file=c.tls.ca_file,
        cert_file=c.tls.cert_file,
        key_file=c.tls.key_file,
    )


class TelemetryCache:
    """One snapshot per telemetry configuration, reused for a second so that a burst of ticks does
    not hammer Prometheus."""

    def __init__(self, max_age: float, clock: Callable[[], float] = time.time) -> None:
        self.max_age = max_age
        self.clock = clock
        self._cache: dict[tuple[object, ...], Snapshot] = {}

    def get(self, spec: PolicySpec, prometheus_url: str | None = None) -> Snapshot:
        """The policy's telemetry now; with `prometheus_url`, that Prometheus (a worker cluster's,
        for the dispatcher) read with the policy's settings."""
        t = spec.telemetry
        source = "prometheus" if prometheus_url else t.source
        url = prometheus_url or t.prometheus_url
        key = (
            source,
            url,
            t.prometheus_client,
            tuple(t.dcgm_endpoints),
            t.acceptance.window,
            t.step_window_seconds,
            tuple(sorted((k, tuple(sorted(v.items()))) for k, v in t.acceptance.engine_options().items())),
        )
        cached = self._cache.get(key)
        if cached is not None and not cached.error and self.clock() - cached.fetched_at < self.max_age:
            return cached  # failures are not cached: the next tick tries again
        label = prometheus_url or t.source  # a worker's Prometheus by its URL, as before
        try:
            if source == "prometheus" and url:
                snap = PrometheusReader(
                    url,
                    window=t.acceptance.window,
                    engine_options=t.acceptance.engine_options(),
                    client=client_config(t.prometheus_client),
                    step_window_s=t.step_window_seconds,
                ).snapshot()
            elif t.source == "dcgm-exporter" and t.dcgm_endpoints:
                snap = DcgmScraper(t.dcgm_endpoints).snapshot()
            elif t.source == "none":
                snap = Snapshot(fetched_at=self.clock())
            else:
                snap = Snapshot(
                    fetched_at=self.clock(), error=f"telemetry source {t.source} has no endpoint configured"
                )
        except Exception as exc:  # a source that answers nonsense is a source that is down
            log.warning("telemetry source %s failed: %s: %s", label, type(exc).__name__, exc)
            snap = Snapshot(fetched_at=self.clock(), error=f"telemetry source {label} failed: {exc}"[:300])
        self._cache[key] = snap
        metrics.TELEMETRY_UP.labels(source=label).set(0 if snap.error and not snap.gpus else 1)
        if snap.error:
            metrics.TELEMETRY_ERRORS.labels(source=label).inc()
        for reason, count in snap.rejected.items():
            metrics.TELEMETRY_REJECTED.labels(source=label, reason=reason).inc(count)
        return snap

    def steps(self, spec: PolicySpec) -> dict[tuple[str, str], tuple[float, float]]:
        """The engines' step readings through the policy's Prometheus (`PrometheusReader.steps`),
        read when online calibration asks (once per refit, not per tick); none without a
        Prometheus, or when it fails (logged and counted: the learner then takes no reading)."""
        t = spec.telemetry
        if t.source != "prometheus" or not t.prometheus_url:
            return {}
        reader = PrometheusReader(
            t.prometheus_url, client=client_config(t.prometheus_client), step_window_s=t.step_window_seconds
        )
        try:
            steps = reader.steps()
        except Exception as exc:  # a source that answers nonsense is a source that is down
            log.warning("step readings from %s failed: %s: %s", t.prometheus_url, type(exc).__name__, exc)
            metrics.TELEMETRY_ERRORS.labels(source=t.source).inc()
            return {}
        for reason, count in reader.rejected.items():
            metrics.TELEMETRY_REJECTED.labels(source=t.source, reason=reason).inc(count)
        return steps
