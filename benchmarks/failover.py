"""make bench-failover: the leader lost in the middle of a burst, under load.

Two operator replicas run as the chart runs them (leader election on the chart's Lease rules and
durations, each authenticated only by a ServiceAccount token) over 5,000 one-GPU workloads
submitted as a burst onto as many GPUs. Once a third of them are decided the leader is lost:
killed (SIGKILL) in one round, paused (SIGSTOP) in another and let go (SIGCONT) once the standby
decides; a third round loses nothing, as the baseline. Printed per round: the time from the loss to
the standby's first decision (against the lease duration + 2 s), workloads never decided (lost),
workloads given a second decision (repeated), and GPUs given beyond a node's (over-commits); the
last three must be 0.

`--workloads N` for a smaller run. Starts its own control plane and stops everything it started.
"""

from __future__ import annotations

import argparse
import math
import re
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any, cast

import yaml
from kubernetes import client

from localdev import controlplane
from localdev import kueue as k
from localdev.gpunodes import apply_node, server_side_apply
from localdev.operator import OperatorProcess, SyntheticTelemetry, install, policy, service_account_kubeconfig
from localdev.prometheus import LocalPrometheus
from sovereignspec.operator.runtime.leader import LeaseRecord

WORKLOADS = 5000
GPUS_PER_NODE = 8
LEASE = "sovereignspec-bench"
# The chart's durations (values.yaml leaderElection): what a cluster runs.
LEASE_S, RENEW_S, RETRY_S = 15, 10, 2
RULES = controlplane.REPO / "charts/sovereignspec/files/role-rules-leader-election.yaml"
NOTES = {"sovereignspec.io/model": "llama-3.1-8b", "sovereignspec.io/drafter": "eagle3",
         "sovereignspec.io/acceptance-rate": "0.8", "sovereignspec.io/latency-class": "latency"}  # fmt: skip
DECISIONS = ("SpeculativeDecode", "PlainDecode")


def allow_leases(api: client.ApiClient, namespace: str, account: str) -> None:
    """The chart's Role for its Lease (its one source, the Lease's name put in), bound to `account`."""
    group = "rbac.authorization.k8s.io"
    rules = yaml.safe_load(re.sub(r"\{\{[^}]*\}\}", LEASE, RULES.read_text()))
    meta = {"name": "leader-election", "namespace": namespace}
    role = {"apiVersion": f"{group}/v1", "kind": "Role", "metadata": meta, "rules": rules}
    binding = {"apiVersion": f"{group}/v1", "kind": "RoleBinding", "metadata": meta,
               "roleRef": {"apiGroup": group, "kind": "Role", "name": "leader-election"},
               "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]}  # fmt: skip
    server_side_apply(api, role, "bench")
    server_side_apply(api, binding, "bench")


def holder(api: client.ApiClient, namespace: str) -> str:
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(LEASE, namespace)
    except client.ApiException as e:
        if e.status == 404:
            return ""
        raise
    record = LeaseRecord.of(client.ApiClient().sanitize_for_serialization(lease))
    return record.holder if record is not None else ""


def leading(
    api: client.ApiClient, namespace: str, operators: list[OperatorProcess]
) -> OperatorProcess | None:
    """The operator process the Lease names (its identity holds its pid)."""
    who = holder(api, namespace)
    return next((o for o in operators if o.proc is not None and f"/{o.proc.pid}_" in who), None)


def decisions_made(operator: OperatorProcess) -> float:
    """The operator's own count of decisions written (sovereignspec_decisions_total, every label)."""
    if operator.proc is None or operator.proc.poll() is not None:
        raise RuntimeError(f"the operator exited:\n{operator.logs()[-3000:]}")
    try:
        text = operator.metrics()
    except OSError:
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sovereignspec_decisions_total{")
    )


def our_entries(api: client.ApiClient, namespace: str, check: str) -> dict[str, dict[str, Any]]:
    """Each Workload's entry of our check, by Workload name."""
    out = {}
    for wl in k.workloads(api, namespace):
        entry = k.check_state(wl, check)
        if entry is not None:
            out[wl["metadata"]["name"]] = entry
    return out


# What the new leader does between the loss and its first decision, as its log says it.
STEPS = (("took the Lease", "leads now"), ("cache caught up", "caught up with the API server"),
         ("sealed", "sealed for"))  # fmt: skip
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def takeover_steps(logs: str, lost_wall: float) -> dict[str, Any]:
    """Seconds from the loss to each of the new leader's steps (`STEPS`), and how much it sealed."""
    out: dict[str, Any] = {}
    for line in logs.splitlines():
        stamp = STAMP.match(line)
        if "sealed" in out and "first tick" not in out and "a slow tick: " in line:
            out["first tick"] = line.split("a slow tick: ", 1)[1]  # where its time went
        for label, text in STEPS:
            if stamp and text in line and label not in out:
                at = time.mktime(time.strptime(stamp.group(1)[:19], "%Y-%m-%d %H:%M:%S"))
                out[label] = at + int(stamp.group(1)[20:]) / 1000 - lost_wall
                if label == "sealed":
                    out["how much"] = (
                        line.split("sealed for")[0].rsplit(":", 1)[-1].strip()
                        + " "
                        + (line.rsplit("(", 1)[-1].rstrip(")"))
                    )
    return out


def submit_all(api: client.ApiClient, namespace: str, n: int, done: threading.Event) -> None:
    for i in range(n):
        server_side_apply(api, k.job(f"w{i:05d}", namespace, "q", annotations=NOTES, gpus=1), "bench")
    done.set()


def one_round(api: client.ApiClient, token: str, flavor: str, url: str, n: int, how: str) -> dict[str, Any]:
    """One burst of `n` workloads with the leader lost (`how`: SIGKILL or SIGSTOP) a third of the way."""
    ns = f"failover-{how.lower()}-{token}"
    check, controller = ns, f"sovereignspec.io/{ns}"
    client.CoreV1Api(api).create_namespace(cast(Any, {"metadata": {"name": ns}}))
    server_side_apply(api, policy(ns, url), "bench")
    params = {"apiGroup": "sovereignspec.io", "kind": "SpeculationPolicy", "name": ns}
    k.apply(api, k.admission_check(check, controller, params), "bench")
    k.apply(api, k.cluster_queue(ns, {flavor: n}, [check], cpu="100000"), "bench")
    k.apply(api, k.local_queue("q", ns, ns), "bench")
    kubeconfig = service_account_kubeconfig(api, ns, "sovereignspec")
    allow_leases(api, ns, "sovereignspec")
    flags = ["--leader-elect", "--leader-election-namespace", ns, "--leader-election-id", LEASE,
             "--lease-duration", str(LEASE_S), "--renew-deadline", str(RENEW_S),
             "--retry-period", str(RETRY_S)]  # fmt: skip
    operators = [OperatorProcess(controller, extra=flags, kubeconfig=kubeconfig).start() for _ in range(2)]
    try:
        first = None
        while first is None:
            first = leading(api, ns, operators)
            time.sleep(0.2)
        standby = next(o for o in operators if o is not first)
        submitted = threading.Event()
        feeder = threading.Thread(target=submit_all, args=(api, ns, n, submitted), daemon=True)
        started = time.monotonic()
        feeder.start()
        while decisions_made(first) < n / 3:
            time.sleep(0.2)
        before, decided_by_first = decisions_made(standby), decisions_made(first)
        assert first.proc is not None
        first_decision_s, exit_code, steps = math.nan, None, {}
        if how != "none":  # "none": the same burst with no loss, the baseline
            first.proc.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGSTOP)
            lost_at, lost_wall = time.monotonic(), time.time()
            while decisions_made(standby) <= before:
                time.sleep(0.05)
            first_decision_s = time.monotonic() - lost_at
            if how == "SIGSTOP":
                first.proc.send_signal(signal.SIGCONT)  # its writes checked before the pause go out now
            exit_code = first.proc.wait(timeout=60)
        feeder.join()
        if how != "none":  # once its first tick has ended and said where its time went (its line
            # comes at the tick's end, after the first decision, and the burst may be all submitted)
            tick_ends = time.monotonic() + 60
            steps = takeover_steps(standby.logs(), lost_wall)
            while "first tick" not in steps and time.monotonic() < tick_ends:
                time.sleep(0.5)
                steps = takeover_steps(standby.logs(), lost_wall)
        deadline = time.monotonic() + max(600.0, 0.3 * n)
        entries: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            entries = our_entries(api, ns, check)
            if sum(e.get("state") == "Ready" for e in entries.values()) >= n:
                break
            time.sleep(2)
        elapsed = time.monotonic() - started
        ready = {name: e for name, e in entries.items() if e.get("state") == "Ready"}
        # Over-committed: more GPUs given on a node than it has (each workload asks one). The
        # decision's gpu-index is advisory (the device plugin assigns devices) and may repeat.
        given: Counter[str] = Counter()
        for e in ready.values():
            for update in e.get("podSetUpdates") or []:
                given[(update.get("nodeSelector") or {}).get("kubernetes.io/hostname", "")] += 1
        told: Counter[str] = Counter()
        for ev in client.CoreV1Api(api).list_namespaced_event(ns).items:
            if ev.reason in DECISIONS:
                told[str(ev.involved_object.name)] += ev.count or 1
        return {
            "how": how, "first_decision_s": first_decision_s, "exit": exit_code, "elapsed_s": elapsed,
            "lost": n - len(ready), "repeated": sum(1 for c in told.values() if c > 1),
            "over_commits": sum(c - GPUS_PER_NODE for c in given.values() if c > GPUS_PER_NODE),
            "standby_decisions": decisions_made(standby) - before, "before_loss": decided_by_first,
            "steps": steps,
        }  # fmt: skip
    finally:
        for o in operators:
            if o.proc is not None and o.proc.poll() is None:
                o.proc.send_signal(signal.SIGCONT)
            o.stop()


def report(rounds: list[dict[str, Any]], n: int, nodes: int) -> bool:
    """The rounds side by side; whether every bound held."""
    bound = LEASE_S + 2
    print(f"\n{n} one-GPU workloads per round over {nodes * GPUS_PER_NODE} GPUs; two replicas, lease "
          f"{LEASE_S} s / renew {RENEW_S} s / retry {RETRY_S} s (the chart's)")  # fmt: skip
    print(f"{'leader':<8} {'first decision after loss (s)':>30} {'bound':>6} {'lost':>5} {'repeated':>9} "
          f"{'over-commits':>13} {'old leader exit':>16} {'all decided in (s)':>19}")  # fmt: skip
    for r in rounds:
        code = "-" if r["exit"] is None else str(r["exit"])
        print(f"{r['how']:<8} {r['first_decision_s']:>30.2f} {bound:>6} {r['lost']:>5} {r['repeated']:>9} "
              f"{r['over_commits']:>13} {code:>16} {r['elapsed_s']:>19.1f}")  # fmt: skip
    ok = all(
        r["lost"] == r["repeated"] == r["over_commits"] == 0 and not r["first_decision_s"] > bound
        for r in rounds
    )
    print("\nthe new leader's steps, seconds after the loss (from its log; its first decision as above)")
    print(f"{'leader':<8} " + " ".join(f"{label:>16}" for label, _ in STEPS) + "  sealed of named")
    for r in rounds:
        if r["steps"]:
            at = [r["steps"].get(label, math.nan) for label, _ in STEPS]
            print(
                f"{r['how']:<8} "
                + " ".join(f"{t:>16.2f}" for t in at)
                + f"  {r['steps'].get('how much', '?')}"
            )
    for r in rounds:
        if r["steps"].get("first tick"):
            print(f"{r['how']}: its first tick as leader took {r['steps']['first tick']}")
    print("every bound held" if ok else "a bound was not held (above)")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.failover", description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", type=int, default=WORKLOADS, help=f"per round (default {WORKLOADS})")
    parser.add_argument(
        "--rounds", default="none,SIGKILL,SIGSTOP", help="which (default none,SIGKILL,SIGSTOP; none: no loss)"
    )
    parser.add_argument("--keep", action="store_true", help="leave the control plane up to look at")
    args = parser.parse_args(argv)
    if args.workloads < 3:
        parser.error("--workloads: accepted: an integer >= 3")
    if not set(args.rounds.split(",")) <= {"none", "SIGKILL", "SIGSTOP"}:
        parser.error(f"--rounds: got {args.rounds!r}; accepted: none, SIGKILL, SIGSTOP, comma-separated")
    n = args.workloads
    with controlplane.session("bench-failover", stop=False if args.keep else None):
        api = controlplane.api_client()
        install(api)
        token = secrets.token_hex(3)
        nodes = math.ceil(n / GPUS_PER_NODE)
        telemetry = SyntheticTelemetry()
        prometheus = LocalPrometheus(scrape_interval="2s").start()
        try:
            prometheus.set_targets("synthetic", [telemetry.target])
            print(f"creating {nodes} nodes x {GPUS_PER_NODE} GPUs ...", flush=True)
            for i in range(nodes):
                name = f"failover-{token}-{i:04d}"
                cap = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": str(GPUS_PER_NODE)}
                labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                          "sovereignspec.io/bench": token,
                          "node-restriction.kubernetes.io/jurisdiction": "eu"}  # fmt: skip
                node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
                apply_node(api, {**node, "status": {"capacity": cap, "allocatable": cap}})
                for g in range(GPUS_PER_NODE):
                    telemetry.set_headroom(name, g, 0.9)
            while len(prometheus.query("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")) < nodes * GPUS_PER_NODE:
                time.sleep(1)
            flavor = f"failover-{token}"
            k.apply(api, k.resource_flavor(flavor, {"sovereignspec.io/bench": token}), "bench")
            rounds = []
            for how in args.rounds.split(","):
                lost = "nothing lost" if how == "none" else f"the leader lost ({how}) a third of the way"
                print(f"round {how}: {n} workloads, {lost} ...", flush=True)
                # Each round a check, queue and namespace of its own on the same nodes: the rounds'
                # operators serve different checks, so neither sees the other's workloads (which stay:
                # without a kubelet their pods never end; the control plane goes with the session).
                rounds.append(one_round(api, token, flavor, prometheus.url, n, how))
        finally:
            prometheus.close()
            telemetry.close()
        ok = report(rounds, n, nodes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
