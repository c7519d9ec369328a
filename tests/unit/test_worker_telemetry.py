"""The dispatcher reads each worker cluster's Prometheus with the policy's whole telemetry
settings, as the worker role reads its own: the acceptance window, the client (CA, credentials)
and what SGLang's acceptance gauge means (`sglangAcceptRate`). One cache serves both roles."""

from __future__ import annotations

from typing import Any

import pytest

from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.runtime import telemetry_source
from sovereignspec.telemetry.snapshot import Snapshot


class Recorder:
    made: list[dict[str, Any]] = []  # noqa: RUF012 - one list per test (reset by the fixture)

    def __init__(self, url: str, **kw: Any) -> None:
        Recorder.made.append({"url": url, **kw})

    def snapshot(self) -> Snapshot:
        return Snapshot(fetched_at=0.0)


@pytest.fixture
def readers(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    from sovereignspec.operator.roles import dispatcher

    Recorder.made = []
    monkeypatch.setattr(telemetry_source, "PrometheusReader", Recorder)
    if hasattr(dispatcher, "PrometheusReader"):  # where the dispatcher built its own reader
        monkeypatch.setattr(dispatcher, "PrometheusReader", Recorder)
    return Recorder.made


def policy(**acceptance: Any) -> PolicySpec:
    return PolicySpec.model_validate(
        {"telemetry": {"source": "prometheus", "prometheusURL": "http://home:9090", "acceptance": acceptance}}
    )


def test_the_dispatcher_reads_a_workers_prometheus_with_the_policys_sglang_meaning(readers) -> None:
    # Found by reading: the dispatcher built its own reader without the policy's sglangAcceptRate,
    # so it learnt SGLang acceptance with the default meaning whatever the policy said.
    from kubernetes import client

    from sovereignspec.operator.border.worker_clusters import WORKER_JURISDICTION, WORKER_PROMETHEUS
    from sovereignspec.operator.roles.dispatcher import DispatchController
    from sovereignspec.profiles import load_profiles

    controller = DispatchController(client.ApiClient(), load_profiles())
    worker = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "MultiKueueCluster",
        "metadata": {
            "name": "worker-eu",
            "resourceVersion": "1",
            "labels": {WORKER_JURISDICTION: "eu"},
            "annotations": {WORKER_PROMETHEUS: "http://worker-eu:9090"},
        },
        "status": {"conditions": [{"type": "Active", "status": "True"}]},
    }
    controller.cache.clusters.put(worker)
    spec = policy(sglangAcceptRate="tokens-with-bonus", window="2m")
    controller._workers(spec)
    (made,) = readers
    assert made["url"] == "http://worker-eu:9090"
    assert made["engine_options"]["sglang"]["accept_rate"] == "tokens-with-bonus" and made["window"] == "2m"
    assert made["client"] == telemetry_source.client_config(spec.telemetry.prometheus_client)


def test_each_workers_prometheus_has_its_own_snapshot_reused_while_fresh(readers) -> None:
    cache = telemetry_source.TelemetryCache(1.0, clock=lambda: 0.0)
    spec = policy()
    for url in ("http://worker-eu:9090", "http://worker-kr:9090", "http://worker-eu:9090"):
        cache.get(spec, prometheus_url=url)
    assert [m["url"] for m in readers] == ["http://worker-eu:9090", "http://worker-kr:9090"]
