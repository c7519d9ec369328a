"""The real Prometheus harness scrapes a target and answers queries over its HTTP API."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from localdev.operator import SyntheticTelemetry
from localdev.ports import free_port
from sovereignspec.telemetry.prometheus import PrometheusReader
from tests.cluster.conftest import wait_until


def test_prometheus_scrapes_an_exporter_and_answers_promql(prometheus):
    registry = CollectorRegistry()
    gauge = Gauge(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor pipe activity", ["gpu", "Hostname"], registry=registry
    )
    gauge.labels("0", "gpu-h100-eu-1").set(0.42)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        prometheus.set_targets("dcgm", [f"127.0.0.1:{port}"])
        result = wait_until(lambda: prometheus.query("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), timeout=30)
        assert float(result[0]["value"][1]) == 0.42
        assert result[0]["metric"]["Hostname"] == "gpu-h100-eu-1"
    finally:
        server.shutdown()
        thread.join(5)


def test_prometheus_can_be_stopped_and_started_again_on_the_same_port(prometheus):
    port = prometheus.port
    prometheus.stop()
    prometheus.start()
    assert prometheus.port == port and prometheus.query("vector(1)")[0]["value"][1] == "1"


def test_learned_acceptance_comes_from_vllms_per_position_counter_or_by_inverting_the_rate(prometheus):
    current, older = SyntheticTelemetry(), SyntheticTelemetry()
    older.registry.unregister(older.per_pos)  # a vLLM without the per-position counter
    try:
        current.set_acceptance("acme", "shop", "llama-3.1-8b", 0.7, gamma=4)
        older.set_acceptance("bank", "vault", "llama-3.1-8b", 0.55, gamma=5)
        prometheus.set_targets("vllm", [current.target, older.target])
        reader = PrometheusReader(prometheus.url, window="1m")

        def both() -> dict[tuple[str, str], tuple[float, float]] | None:
            seen = reader.acceptance()
            return seen if len(seen) == 2 else None

        seen = wait_until(both, timeout=30, what="both tenants' acceptance")
        alpha, tokens = seen[("shop", "llama-3.1-8b")]
        assert alpha == pytest.approx(0.7, abs=1e-6) and tokens > 0
        alpha, tokens = seen[("vault", "llama-3.1-8b")]
        assert alpha == pytest.approx(0.55, abs=1e-6) and tokens > 0
    finally:
        current.close()
        older.close()
