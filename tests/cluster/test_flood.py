"""One tenant's flood of large pod templates does not stop the others: the operator's memory grows
with the number of Workloads, not their size. Sized down from the benchmark (`make bench-flood`:
2,000 Jobs of 250 KiB): 400 Jobs of 250 KiB in one namespace (a third each of an annotation,
labels and a node affinity SovereignSpec does not read), against an operator of its own (a fresh
process, so its peak RSS is this test's), while another tenant's Jobs are decided as usual."""

from __future__ import annotations

from typing import Any

import pytest
import urllib3
from kubernetes import client

from localdev import kueue as k
from localdev.gpunodes import server_side_apply
from localdev.operator import OperatorProcess
from tests.cluster.conftest import wait_until
from tests.cluster.operator_env import annotations, decided, make_pool, our_entry, own_check

CHAT = {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance_rate": 0.8}
FLOOD_JOBS = 400
# A fresh operator here peaks near 90 MiB; holding the flood (100 MB of annotation text, more as
# Python objects) took it past 190. Half way between, well under the chart's 256 MiB limit.
PEAK_LIMIT_MIB = 140


@pytest.mark.timeout(1200)  # 400 Jobs of 250 KiB in, then out: near the suite's 600 s on a loaded 2-core VM
def test_a_flood_of_large_templates_grows_no_memory_and_the_others_are_decided(env: Any, namespace, unique):
    own = own_check(env, unique("flood"))
    operator = OperatorProcess(own.controller).start()
    try:
        pool = make_pool(own, namespace, [("H100-SXM", "eu", 8, [0.9] * 8)])
        others_ns = f"{namespace[:40]}-others"
        client.CoreV1Api(env.api).create_namespace(
            {"metadata": {"name": others_ns, "labels": {"sovereignspec.io/test": "true"}}}
        )
        others = make_pool(own, others_ns, [("H100-SXM", "eu", 8, [0.9] * 8)])
        for i in range(FLOOD_JOBS):
            body = k.flooded_job(
                f"flood-{i:04d}", pool.namespace, pool.queue, annotations(**CHAT), 250, "all", i
            )
            server_side_apply(env.api, body, "flood-tenant")
            if i % 100 == 50:  # another tenant's work arrives during the flood
                body = k.job(f"chat-{i:04d}", others.namespace, others.queue, annotations=annotations(**CHAT))
                server_side_apply(env.api, body, "other-tenant")
        for i in range(50, FLOOD_JOBS, 100):
            assert our_entry(others, decided(others, f"chat-{i:04d}", timeout=120))["state"] == "Ready"

        def listed() -> bool:  # every flooded Workload exists, so the operator has seen them all
            items = client.CustomObjectsApi(env.api).list_namespaced_custom_object(
                k.GROUP, k.VERSION, pool.namespace, "workloads", limit=1
            )
            return int(items["metadata"].get("remainingItemCount", 0)) + 1 >= FLOOD_JOBS

        wait_until(listed, timeout=300, what="Kueue to create every flooded Workload")
        assert operator.proc is not None and operator.proc.poll() is None
        peak = operator.peak_rss_bytes() / 2**20
        assert peak < PEAK_LIMIT_MIB, f"operator peak RSS {peak:.0f} MiB"
    finally:
        operator.stop()
        # No namespace controller or garbage collector runs here: the flood's 100 MB go by hand,
        # or every later API server start (test_watch_cache restarts it) re-reads them.
        for ns in (namespace, f"{namespace[:40]}-others"):
            _clear(env.api, ns)
            client.CoreV1Api(env.api).delete_namespace(ns)


def _clear(api: Any, ns: str, timeout: float = 300.0) -> None:
    """Delete the namespace's Jobs and Workloads and wait until they are gone, so that the next test
    does not meet an API server and a Kueue still digesting 200 MB of deletions. One DELETE of the
    whole collection can outlast the API server's 60 s request timeout on a loaded machine (504:
    it went on deleting server-side), so each call is repeated until nothing is left."""
    batch, custom = client.BatchV1Api(api), client.CustomObjectsApi(api)

    def gone() -> bool:
        try:
            # Background, not the Job's legacy default (orphan): an orphan finalizer waits for a
            # garbage collector that does not run here, and the Jobs would never go.
            # A client-side limit past the API server's 60 s: a DELETE whose answer never comes is
            # asked again, not waited on for the rest of the test.
            batch.delete_collection_namespaced_job(ns, propagation_policy="Background", _request_timeout=90)
            custom.delete_collection_namespaced_custom_object(
                k.GROUP, k.VERSION, ns, "workloads", _request_timeout=90
            )
        except client.ApiException as e:
            if e.status not in (429, 500, 503, 504):
                raise
            return False
        except urllib3.exceptions.HTTPError:  # the read timed out (or its retries did)
            return False
        left = custom.list_namespaced_custom_object(k.GROUP, k.VERSION, ns, "workloads", limit=1)
        return not left["items"] and not batch.list_namespaced_job(ns, limit=1).items

    wait_until(gone, timeout=timeout, interval=2.0, what=f"the flood's Jobs and Workloads in {ns} to go")
