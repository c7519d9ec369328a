"""`python -m benchmarks.flood` (or `make bench-flood`): one tenant's flood of large annotations
against everyone else's admission, on the local control plane, side by side in one run.

Two phases, each with a fresh operator process: without the flood, then with it. The flood is one
tenant's namespace filling with `--flood` suspended Jobs (default 2,000), each carrying `--kib` KiB
(default 250) on its pod template that SovereignSpec never reads, under a quota of 16 GPUs, so most
of them wait, held in every cache. What they carry (`--carry`): one large annotation, ~2,000
labels, a preferred node affinity of thousands of values (a required one within the bounds the
caches keep beside it), or all three in equal parts (the default). Meanwhile `--others` (default
100) ordinary Jobs of other tenants arrive. Printed per phase: the operator's peak RSS (VmHWM) and
the others' admission latency (QuotaReserved to Admitted, median and p99), and the ratios between
phases.

    make bench-flood                       # the full flood: ~10 min, ~1 GB in etcd
    make bench-flood ARGS="--flood 200 --carry labels"
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import time
from typing import Any, cast

from kubernetes import client

from benchmarks.operator import OURS, Recorder, pct
from localdev import controlplane
from localdev import kueue as k
from localdev.gpunodes import apply_node, server_side_apply
from localdev.operator import OperatorProcess, SyntheticTelemetry, install, policy
from localdev.prometheus import LocalPrometheus

NODES = 16  # 128 GPUs: the others' quota (all but the flood's 16) holds every other Job
GPUS_PER_NODE = 8
FLOOD_GPUS = 16
CHART_LIMIT_MIB = 256  # deploy/chart values.yaml resources.limits.memory
NOTES = {
    "sovereignspec.io/model": "llama-3.1-8b",
    "sovereignspec.io/drafter": "eagle3",
    "sovereignspec.io/acceptance-rate": "0.8",
}


def _namespace(api: client.ApiClient, name: str, flavor: str, gpus: int, check: str) -> None:
    k.apply(api, k.cluster_queue(name, {flavor: gpus}, [check], cpu="100000"), "bench")
    client.CoreV1Api(api).create_namespace(cast(Any, {"metadata": {"name": name}}))
    k.apply(api, k.local_queue("q", name, name), "bench")


def _pool(api: client.ApiClient, telemetry: SyntheticTelemetry, prometheus: LocalPrometheus) -> str:
    """Nodes, a flavor, a policy and our check of their own (a phase's workloads are never
    deleted here: no namespace controller runs; the next phase must not see them)."""
    token = secrets.token_hex(3)
    for i in range(NODES):
        name = f"flood-{token}-{i}"
        cap = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": str(GPUS_PER_NODE)}
        labels = {
            "kubernetes.io/hostname": name,
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "sovereignspec.io/bench": token,
            "node-restriction.kubernetes.io/jurisdiction": "eu",
        }
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        apply_node(api, {**node, "status": {"capacity": cap, "allocatable": cap}})
        for g in range(GPUS_PER_NODE):
            telemetry.set_headroom(name, g, 0.9)
    hosts = f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{Hostname=~"flood-{token}-.*"}}'
    while len(prometheus.query(hosts)) < NODES * GPUS_PER_NODE:
        time.sleep(1)
    name = f"flood-{token}"
    k.apply(api, k.resource_flavor(name, {"sovereignspec.io/bench": token}), "bench")
    server_side_apply(api, policy(name, prometheus.url), "bench")
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": name}
    k.apply(api, k.admission_check(name, OURS, params), "bench")
    return name


def phase(
    api: client.ApiClient,
    telemetry: SyntheticTelemetry,
    prometheus: LocalPrometheus,
    label: str,
    flood: int,
    kib: int,
    others: int,
    carry: str = "all",
) -> dict[str, float]:
    flavor = check = _pool(api, telemetry, prometheus)
    token = secrets.token_hex(3)
    flooded, normal = f"flood-{label}-{token}", f"others-{label}-{token}"
    _namespace(api, flooded, flavor, FLOOD_GPUS, check)
    _namespace(api, normal, flavor, NODES * GPUS_PER_NODE - FLOOD_GPUS, check)
    operator = OperatorProcess(OURS).start()
    recorder = Recorder(api, {normal: "q"})
    print(f"[{label}] {flood} Jobs of {kib} KiB ({carry}) in {flooded}, {others} others in {normal} ...")
    started = time.monotonic()
    step = max(flood // max(others, 1), 1)
    sent_others = 0
    for i in range(max(flood, others * step)):
        if i < flood:
            server_side_apply(api, k.flooded_job(f"f{i:05d}", flooded, "q", NOTES, kib, carry, i), "bench")
        if i % step == 0 and sent_others < others:
            server_side_apply(api, k.job(f"o{sent_others:04d}", normal, "q", annotations=NOTES), "bench")
            sent_others += 1
    deadline = time.monotonic() + 600.0
    while time.monotonic() < deadline and len(recorder.admitted) < others:
        time.sleep(1)
    elapsed = time.monotonic() - started
    alive = operator.proc is not None and operator.proc.poll() is None
    peak = operator.peak_rss_bytes() if alive else float("nan")
    recorder.stop.set()
    operator.stop()
    waits = [recorder.admitted[x] - recorder.reserved[x] for x in recorder.admitted if x in recorder.reserved]
    return {
        "peak_mib": peak / 2**20,
        "admitted": float(len(waits)),
        "median_s": statistics.median(waits) if waits else float("nan"),
        "p99_s": pct(waits, 0.99) if waits else float("nan"),
        "elapsed_s": elapsed,
        "alive": float(alive),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.flood", description=__doc__.split("\n")[0])
    parser.add_argument("--flood", type=int, default=2000, help="the flooding tenant's Jobs (default 2000)")
    parser.add_argument("--kib", type=int, default=250, help="KiB of annotation on each (default 250)")
    parser.add_argument("--others", type=int, default=100, help="other tenants' Jobs (default 100)")
    parser.add_argument(
        "--carry",
        choices=(*k.CARRIES, "all"),
        default="all",
        help="what the flood's templates carry (default all)",
    )
    args = parser.parse_args(argv)
    if min(args.flood, args.kib, args.others) < 1:
        parser.error("--flood, --kib and --others: accepted: positive integers")
    if args.others > NODES * GPUS_PER_NODE - FLOOD_GPUS:
        parser.error(f"--others: accepted: at most {NODES * GPUS_PER_NODE - FLOOD_GPUS} (their GPUs)")
    # Its own control plane's flags (hack/cluster-up.sh restarts one that is up with others): at
    # 2,000 x 250 KiB of labels the API server's watch cache holds every Job and Workload decoded,
    # with their history, and went past this machine's memory (OOM-killed at 15.8 GB); without it a
    # LIST or watch is served from etcd, paged as the operator asks. etcd's 2 GiB default quota is
    # below what the flood writes.
    os.environ.setdefault("SOVEREIGNSPEC_APISERVER_FLAGS", "--watch-cache=false")
    os.environ.setdefault("SOVEREIGNSPEC_ETCD_FLAGS", f"--quota-backend-bytes={8 * 2**30}")
    # Stopped either way: one that was up before was restarted with these flags (and holds GBs).
    with controlplane.session("bench-flood", stop=True):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    api = controlplane.api_client()
    install(api)
    telemetry = SyntheticTelemetry()
    prometheus = LocalPrometheus(scrape_interval="2s").start()
    prometheus.set_targets("synthetic", [telemetry.target])
    # one 1 KiB Job: the same shape
    quiet = phase(api, telemetry, prometheus, "quiet", 1, 1, args.others, args.carry)
    loud = phase(api, telemetry, prometheus, "flood", args.flood, args.kib, args.others, args.carry)
    prometheus.close()
    telemetry.close()

    print(
        f"\n{args.others} others' Jobs; one tenant's {args.flood} Jobs x {args.kib} KiB of {args.carry}: "
        "without, with"
    )
    print(f"{'phase':<10} {'peak RSS MiB':>13} {'admitted':>9} {'median s':>9} {'p99 s':>8} {'operator':>9}")
    for label, r in (("no flood", quiet), ("flood", loud)):
        state = "alive" if r["alive"] else "DIED"
        print(
            f"{label:<10} {r['peak_mib']:>13.1f} {r['admitted']:>9.0f} {r['median_s']:>9.3f} "
            f"{r['p99_s']:>8.3f} {state:>9}"
        )
    print(f"(the chart's memory limit: {CHART_LIMIT_MIB} MiB)")
    print(
        f"ratio flood / no flood: peak RSS {loud['peak_mib'] / quiet['peak_mib']:.2f}, "
        f"others' median {loud['median_s'] / quiet['median_s']:.2f}, p99 {loud['p99_s'] / quiet['p99_s']:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
