"""A transport error is that one write's, not the pass's.

The operator reaches the API server through a loopback link that resets chosen requests after they
are sent (a dying API server, a dropped connection: the client sees a reset, not an HTTP status). It
goes on deciding every other workload in the pass, counts each loss in
`sovereignspec_failures_total{part=...}`, logs it, and decides again what must land."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import yaml

from localdev import controlplane
from localdev import kueue as k
from localdev.cutting_proxy import CuttingProxy
from localdev.gpunodes import server_side_apply
from localdev.operator import OperatorProcess, policy, service_account_kubeconfig
from tests.cluster.conftest import wait_until
from tests.cluster.operator_env import decided, make_pool, our_entry, submit, workload_of

CHAT = {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance_rate": 0.8, "latency_class": "latency"}


def _failures(text: str, part: str) -> float:
    found = re.search(rf'^sovereignspec_failures_total{{part="{part}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


@pytest.fixture
def behind_proxy(env, namespace, unique) -> Iterator[tuple[Any, CuttingProxy, OperatorProcess]]:
    """Our own check and policy, and an operator on a ServiceAccount token whose every request goes
    through the cutting proxy (which cuts nothing until a test says what)."""
    name = unique("cut-policy")
    server_side_apply(env.api, policy(name, env.prometheus.url), "sovereignspec-e2e")
    check, controller = unique("cut-check"), "sovereignspec.io/cut"
    k.apply(
        env.api,
        k.admission_check(
            check, controller, {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": name}
        ),
    )
    proxy = CuttingProxy(controlplane.ports()["APISERVER_PORT"], controlplane.state_dir() / "pki").start()
    kubeconfig = service_account_kubeconfig(env.api, namespace, "sovereignspec")
    doc = yaml.safe_load(kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = proxy.url
    kubeconfig.write_text(yaml.safe_dump(doc))
    operator = OperatorProcess(controller, kubeconfig=kubeconfig).start()
    try:
        yield replace(env, check=check, controller=controller), proxy, operator
    finally:
        operator.stop()
        proxy.close()


def test_events_lost_to_resets_are_counted_and_every_workload_is_still_decided(behind_proxy, namespace):
    env, proxy, operator = behind_proxy
    events = f"/api/v1/namespaces/{namespace}/events"
    proxy.cut = lambda method, path: method == "POST" and path == events
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.95] * 4)])
    jobs = [f"evented-{i}" for i in range(3)]
    for job in jobs:
        submit(pool, job, **CHAT)
    for job in jobs:
        entry = our_entry(pool, decided(pool, job))
        assert entry["state"] == "Ready" and entry["message"].startswith("speculative"), entry["message"]
    # Each decision's Event is sent (and cut) after its status write: wait for them, then read.
    wait_until(lambda: proxy.cut_count() >= len(jobs), timeout=30, what="every decision's Event sent and cut")
    wait_until(lambda: _failures(operator.metrics(), "event") >= len(jobs), timeout=30, what="event failures")
    text = operator.metrics()
    # No pass was abandoned over an Event: the transport error stayed inside the Event's write.
    assert _failures(text, "policy") == 0 and _failures(text, "tick") == 0, text
    assert "could not post Event" in operator.logs()


def test_a_status_write_lost_to_resets_is_retried_and_holds_back_no_other_workload(behind_proxy, namespace):
    env, proxy, operator = behind_proxy
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.95] * 4)])
    # Kueue names a Job's Workload job-<job name>-<hash>; the cut is in place before it exists.
    unlucky = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/workloads/job-unlucky-"
    cut_paths: list[str] = []

    def cut(method: str, path: str) -> bool:
        """The unlucky workload's first three status writes are reset; later ones go through."""
        if method == "PATCH" and path.startswith(unlucky) and path.endswith("/status") and len(cut_paths) < 3:
            cut_paths.append(path)
            return True
        return False

    proxy.cut = cut
    submit(pool, "unlucky", **CHAT)
    submit(pool, "lucky", **CHAT)
    for job in ("lucky", "unlucky"):
        entry = our_entry(pool, decided(pool, job, timeout=120))
        assert entry["state"] == "Ready" and entry["message"].startswith("speculative"), (
            job,
            entry["message"],
        )
    text = operator.metrics()
    status = f"{unlucky[: -len('job-unlucky-')]}{workload_of(pool, 'unlucky')['metadata']['name']}/status"
    assert proxy.cuts == [("PATCH", status)] * 3
    assert _failures(text, "write") == 3, text
    assert _failures(text, "policy") == 0 and _failures(text, "tick") == 0, text
    assert "writing the decision for" in operator.logs()
