"""`python -m benchmarks.multicluster` (or `make bench-multicluster`): dispatch latency of the
SovereignSpec dispatcher against Kueue's own AllAtOnce dispatcher, on the same Jobs, in one run.

Setup: the local multi-cluster (a manager and two workers, eu and kr, each a real kube-apiserver,
etcd and Kueue; 4 simulated nodes x 64 GPUs per worker, telemetry through a Prometheus each).
The workers' ClusterQueues carry no admission check here, so that what is measured is the
manager's path alone: Job created on the manager -> Workload admitted there through a worker
(status.clusterName set, Admitted true), observed by this benchmark's own watch.

Also printed: the dispatch alone, from the manager's QuotaReserved to that admission.

Two arms, one after the other on the same clusters, each with N Jobs (1 GPU, the three tenants
interleaved: team-eu bound to eu, team-kr to kr, team-global to none):
  1. Kueue's AllAtOnce: the manager's Kueue without `multiKueue.dispatcherName`, its ClusterQueue
     with MultiKueue's check only; every Job is copied to both workers and the first to admit wins;
  2. SovereignSpec: `dispatcherName: sovereignspec.io/dispatcher`, the ClusterQueue with
     SovereignSpec's dispatch check before MultiKueue's; the dispatcher nominates one worker.
The manager's Kueue is restarted between the arms with the other configuration. Printed per arm:
median, p95 and max latency, the makespan (first Job created to last admitted), and how many
jurisdiction-bound Jobs were admitted across their boundary; then the ratios.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import threading
import time
from typing import Any

from kubernetes import client, watch

from localdev import kueue as k
from localdev import multicluster as mc
from localdev.gpunodes import server_side_apply

NAMESPACES = tuple(mc.TENANTS)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Admissions:
    """When each manager Workload (by its Job) was first seen admitted through a worker."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.admitted: dict[tuple[str, str], tuple[float, str]] = {}
        self.reserved: dict[tuple[str, str], float] = {}  # quota reserved on the manager
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._watch, args=(ns,), daemon=True) for ns in NAMESPACES]

    def start(self) -> Admissions:
        for t in self._threads:
            t.start()
        return self

    def _watch(self, namespace: str) -> None:
        api = client.CustomObjectsApi(mc.api("manager"))
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(
                    api.list_namespaced_custom_object,
                    k.GROUP,
                    k.VERSION,
                    namespace,
                    "workloads",
                    timeout_seconds=30,
                ):
                    self._seen(namespace, event["object"])
                    if self._stop.is_set():
                        break
            except Exception:
                time.sleep(0.2)

    def _seen(self, namespace: str, wl: dict[str, Any]) -> None:
        reserved = k.condition(wl, "QuotaReserved")
        if reserved and reserved["status"] == "True":
            for ref in wl["metadata"].get("ownerReferences", []):
                if ref.get("name", "").startswith(self.prefix):
                    self.reserved.setdefault((namespace, ref["name"]), time.monotonic())
        admitted = k.condition(wl, "Admitted")
        cluster = (wl.get("status") or {}).get("clusterName")
        if not admitted or admitted["status"] != "True" or not cluster:
            return
        for ref in wl["metadata"].get("ownerReferences", []):
            name = ref.get("name", "")
            if name.startswith(self.prefix):
                self.admitted.setdefault((namespace, name), (time.monotonic(), cluster))

    def stop(self) -> None:
        self._stop.set()


def warm_up(label: str) -> None:
    """One Job through the whole path before the burst: MultiKueue has connected to the workers
    since the manager's Kueue restarted (its MultiKueueCluster status may still say so from before)."""
    name = f"warm-{secrets.token_hex(2)}"
    server_side_apply(mc.api("manager"), k.job(name, "team-global", mc.QUEUE), "sovereignspec-bench")
    watcher = Admissions(name).start()
    deadline = time.monotonic() + 180
    while not watcher.admitted and time.monotonic() < deadline:
        time.sleep(0.2)
    watcher.stop()
    if not watcher.admitted:
        raise RuntimeError(f"{label}: the warm-up Job was not admitted within 180 s")


def run_arm(label: str, jobs: int, timeout: float) -> dict[str, Any]:
    warm_up(label)
    prefix = f"b{secrets.token_hex(2)}-"
    watcher = Admissions(prefix).start()
    time.sleep(1.0)  # the watches are open before the first Job
    manager = mc.api("manager")
    created: dict[tuple[str, str], float] = {}
    for i in range(jobs):
        ns = NAMESPACES[i % len(NAMESPACES)]
        name = f"{prefix}{i}"
        body = k.job(name, ns, mc.QUEUE, annotations={"sovereignspec.io/model": "llama-3.1-8b",
                                                       "sovereignspec.io/drafter": "eagle3"})  # fmt: skip
        created[(ns, name)] = time.monotonic()
        server_side_apply(manager, body, "sovereignspec-bench")
    deadline = time.monotonic() + timeout
    while len(watcher.admitted) < jobs and time.monotonic() < deadline:
        time.sleep(0.2)
    watcher.stop()
    latencies = [watcher.admitted[j][0] - created[j] for j in created if j in watcher.admitted]
    # The dispatch alone: quota reserved on the manager -> admitted through a worker.
    dispatch = [
        watcher.admitted[j][0] - watcher.reserved[j] for j in watcher.admitted if j in watcher.reserved
    ]
    crossed = sum(
        1
        for (ns, _), (_, cluster) in watcher.admitted.items()
        if mc.TENANTS[ns] is not None and mc.WORKERS[cluster] != mc.TENANTS[ns]
    )
    first, last = min(created.values()), max((t for t, _ in watcher.admitted.values()), default=float("nan"))
    result = {
        "label": label,
        "admitted": len(latencies),
        "jobs": jobs,
        "p50": statistics.median(latencies) if latencies else float("nan"),
        "p95": pct(latencies, 0.95) if latencies else float("nan"),
        "max": max(latencies) if latencies else float("nan"),
        "makespan": last - first,
        "dispatch_p50": statistics.median(dispatch) if dispatch else float("nan"),
        "dispatch_p95": pct(dispatch, 0.95) if dispatch else float("nan"),
        "crossed": crossed,
        "bound": sum(1 for ns, _ in created if mc.TENANTS[ns] is not None),
    }
    print(
        f"{label:28s} admitted {result['admitted']:4d}/{jobs}  p50 {result['p50']:6.2f} s"
        f"  p95 {result['p95']:6.2f} s  max {result['max']:6.2f} s  makespan {result['makespan']:6.2f} s  "
        f"across a boundary {crossed}/{result['bound']}\n"
        f"{'':28s} dispatch (quota reserved on the manager -> admitted through a worker): "
        f"p50 {result['dispatch_p50']:6.2f} s  p95 {result['dispatch_p95']:6.2f} s",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.multicluster")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    started_here = not mc.is_up()
    mc.stop_served_fleet()  # this run's fleet only
    # Room for both arms' Jobs (none finishes: no kubelet runs them).
    fleet = mc.up(worker_checks=False, gpus_per_node=64)
    try:
        mc.wait_connected()
        fleet.start_operators(workers=False)
        print(f"{args.jobs} Jobs per arm; 2 workers x 256 simulated GPUs; manager quota 512 GPUs", flush=True)
        mc.set_dispatcher(None)
        k.apply(
            mc.api("manager"), k.cluster_queue(mc.QUEUE, {"gpu": 512}, [mc.MULTIKUEUE_CHECK], cpu="100000")
        )
        all_at_once = run_arm("kueue AllAtOnce", args.jobs, args.timeout)
        mc.set_dispatcher("sovereignspec.io/dispatcher")
        checks = [mc.DISPATCH_CHECK, mc.MULTIKUEUE_CHECK]
        k.apply(mc.api("manager"), k.cluster_queue(mc.QUEUE, {"gpu": 512}, checks, cpu="100000"))
        ours = run_arm("sovereignspec dispatcher", args.jobs, args.timeout)
        for key in ("p50", "p95", "makespan", "dispatch_p50", "dispatch_p95"):
            print(f"ratio sovereignspec / AllAtOnce, {key}: {ours[key] / all_at_once[key]:.2f}")
        return 0 if ours["admitted"] == args.jobs and all_at_once["admitted"] == args.jobs else 1
    finally:
        fleet.close()
        if started_here:
            mc.down()


if __name__ == "__main__":
    sys.exit(main())
