"""`python -m benchmarks.tenant_mix` (or `make bench-mix`): exclusive tenants and multi-node
groups in one jurisdiction, each tenant's wait, side by side in one run.

The operator's own decision path without an API server: every tick builds the view from the
Workloads as the API would hold them (`view.build`) and decides what is pending (`plan.plan`); a
Ready decision is written back into the Workload's check entry as the controller writes it, and
the ledger of the next tick reads it. Seeded arrivals over `--ticks` ticks on `--nodes` eu nodes
of 8 GPUs: exclusive tenants (one 8-GPU pod each, no other tenant on its node), and serving groups
of a leader and a worker of 8 GPUs each (one engine over two nodes). Each runs for a seeded number
of ticks, then leaves. Two runs on the same arrivals: the groups as LeaderWorkerSets with a leader
template (two pod sets: each pinned to its node by hostname, holding only those nodes), and as
groups of one pod set (pinned by the jurisdiction's label, holding every eu node while they run).
Printed per kind of tenant: placed, still waiting at the end, and the wait in ticks (median, p90,
max).

    make bench-mix
    make bench-mix ARGS="--nodes 12 --ticks 400 --seed 7"
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
from dataclasses import dataclass, field
from typing import Any

from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.world import World
from sovereignspec.operator.decision.plan import plan
from sovereignspec.operator.decision.view import build
from sovereignspec.profiles import load_profiles
from sovereignspec.telemetry.snapshot import GpuReading, Snapshot

CHECK = "sovereignspec"
JURISDICTION = "node-restriction.kubernetes.io/jurisdiction"
NOTES = {"sovereignspec.io/model": "llama-3.1-8b", "sovereignspec.io/jurisdiction": "eu"}


@dataclass
class Tenant:
    name: str
    kind: str  # "exclusive" | "group"
    arrives: int
    runs: int
    placed: int | None = None
    workload: dict[str, Any] = field(default_factory=dict)


def _pod_set(name: str, count: int) -> dict[str, Any]:
    container = {"name": "server", "resources": {"requests": {"nvidia.com/gpu": "8"}}}
    return {
        "name": name,
        "count": count,
        "template": {"metadata": {"annotations": dict(NOTES)}, "spec": {"containers": [container]}},
    }


def workload(t: Tenant, pod_sets: bool) -> dict[str, Any]:
    """The Workload Kueue makes for the tenant, quota reserved, our check Pending."""
    if t.kind == "exclusive":
        sets = [_pod_set("main", 1)]
        sets[0]["template"]["metadata"]["annotations"]["sovereignspec.io/exclusive-node"] = "true"
    else:
        sets = [_pod_set("leader", 1), _pod_set("worker", 1)] if pod_sets else [_pod_set("main", 2)]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": t.name, "namespace": t.name, "uid": t.name, "resourceVersion": "1"},
        "spec": {"podSets": sets},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"}],
            "admissionChecks": [{"name": CHECK, "state": "Pending", "message": ""}],
        },
    }


def arrivals(seed: int, ticks: int, rate: float) -> list[Tenant]:
    rng = random.Random(seed)
    out: list[Tenant] = []
    for tick in range(ticks):
        for _ in range(2):
            if rng.random() < rate:
                kind = rng.choice(("exclusive", "group"))
                out.append(Tenant(f"{kind[:3]}-{len(out):04d}", kind, tick, rng.randint(10, 40)))
    return out


def run(tenants: list[Tenant], nodes: int, ticks: int, pod_sets: bool) -> list[Tenant]:
    tenants = copy.deepcopy(tenants)
    profiles = load_profiles()
    spec = PolicySpec.model_validate(
        {"telemetry": {"source": "prometheus", "prometheusURL": "http://prometheus:9090"}}
    )
    names = [f"eu-{i:02d}" for i in range(nodes)]
    node_objs = [
        {
            "metadata": {
                "name": n,
                "labels": {"kubernetes.io/hostname": n, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                           JURISDICTION: "eu"},
            },
            "status": {"allocatable": {"nvidia.com/gpu": "8"}},
        }
        for n in names
    ]  # fmt: skip
    snapshot = Snapshot(
        gpus={
            (n, g): GpuReading(n, g, 0.5, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.0)
            for n in names
            for g in range(8)
        },
        fetched_at=0.0,
    )
    for t in tenants:
        t.workload = workload(t, pod_sets)
    namespaces = {t.name: {"sovereignspec.io/tenant": t.name} for t in tenants}
    for tick in range(ticks):
        live = [t for t in tenants if t.arrives <= tick and (t.placed is None or tick < t.placed + t.runs)]
        world = World([t.workload for t in live], node_objs, {}, namespaces, [], {}, {CHECK: spec})
        view = build(world, {CHECK}, spec, profiles, snapshot, 0.0)
        by_key = {f"{t.name}/{t.name}": t for t in live}
        for write in plan("default", spec, view, profiles, "2026-12-05T00:00:00Z"):
            t = by_key[write.key]
            entry = t.workload["status"]["admissionChecks"][0]
            if write.state == "Ready":
                entry.update(state="Ready", podSetUpdates=write.pod_set_updates)
                t.placed = tick
            elif write.state == "Retry":
                entry.update(message=write.message)  # Kueue requeues it: Pending again
            elif write.state == "Rejected":
                raise SystemExit(f"{t.name} Rejected: {write.message}")
    return tenants


def summary(tenants: list[Tenant], kind: str, ticks: int) -> str:
    mine = [t for t in tenants if t.kind == kind]
    waits = [t.placed - t.arrives for t in mine if t.placed is not None]
    left = [ticks - t.arrives for t in mine if t.placed is None]
    if not waits:
        return (
            f"{len(waits):>7} {len(left):>8} {'-':>7} {'-':>6} {'-':>6}   (still waiting up to {max(left)})"
        )
    ordered = sorted(waits)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    text = f"{len(waits):>7} {len(left):>8} {statistics.median(waits):>7.1f} {p90:>6} {max(waits):>6}"
    return text + (f"   (still waiting up to {max(left)} ticks)" if left else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tenant_mix", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--nodes", type=int, default=8, help="eu nodes of 8 GPUs (default 8)")
    parser.add_argument("--ticks", type=int, default=300, help="ticks (default 300)")
    parser.add_argument(
        "--rate", type=float, default=0.12, help="arrival chance per slot, 2 a tick (default 0.12)"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.nodes < 2 or args.ticks < 1 or not 0 < args.rate <= 1:
        parser.error("--nodes >= 2, --ticks >= 1, --rate in (0, 1]")
    tenants = arrivals(args.seed, args.ticks, args.rate)
    print(
        f"{len(tenants)} tenants over {args.ticks} ticks on {args.nodes} eu nodes of 8 GPUs "
        f"(seed {args.seed}): exclusive tenants (one 8-GPU pod) and groups (a leader and a worker of 8 GPUs)"
    )
    head = f"{'groups pinned':<26} {'tenant':<10} {'placed':>7} {'waiting':>8}"
    print(f"{head} {'median':>7} {'p90':>6} {'max':>6}")
    for label, pod_sets in (("by jurisdiction label", False), ("per pod set (hostname)", True)):
        done = run(tenants, args.nodes, args.ticks, pod_sets)
        for kind in ("exclusive", "group"):
            print(f"{label:<26} {kind:<10} {summary(done, kind, args.ticks)}")
    print("(waits in ticks, from arrival to the Ready decision; each tick decides everything pending)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
