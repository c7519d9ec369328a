"""SovereignSpec as MultiKueue's dispatcher, on a local multi-cluster: a manager and two workers
(eu, kr), each a real kube-apiserver + etcd + Kueue, MultiKueue connected to the workers with
ServiceAccount tokens, the dispatcher on the manager authenticated by its ServiceAccount token,
SovereignSpec's worker role in each worker, telemetry through a real Prometheus per worker.

Beside ours, the manager's ClusterQueue carries a third check, written by another controller (the
`audit` thread here): its entries must survive our writes, and Kueue must still clear
`nominatedClusterNames` (through its MutatingAdmissionPolicy) once a worker admits."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from localdev import controlplane
from localdev import kueue as k
from localdev import multicluster as mc
from localdev.gpunodes import server_side_apply
from sovereignspec.operator.roles import record
from sovereignspec.operator.roles.audit import read_segments
from tests.cluster.conftest import wait_until

AUDIT, AUDIT_MANAGER, AUDIT_MESSAGE = "audit", "audit-controller", "audited by another controller"
NAMESPACES = tuple(mc.TENANTS)


class Audit:
    """Another admission-check controller on the manager: marks its own entry Ready by SSA."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Audit:
        k.apply(self.api, k.admission_check(AUDIT, "example.com/audit"))
        k.set_check_active(self.api, AUDIT, AUDIT_MANAGER)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            for ns in NAMESPACES:
                try:
                    for wl in k.workloads(self.api, ns):
                        entry = k.check_state(wl, AUDIT)
                        if entry and entry["state"] == "Pending" and k.condition(wl, "QuotaReserved"):
                            k.set_check_state(self.api, wl, AUDIT, "Ready", AUDIT_MESSAGE, AUDIT_MANAGER)
                except Exception:
                    continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture(scope="module")
def fleet() -> Iterator[mc.Fleet]:
    reused = mc.is_up()
    mc.stop_served_fleet()  # a fleet `make multicluster-up` left running would decide beside ours
    audit, f = None, None
    try:
        f = mc.up(extra_checks=(AUDIT,))
        mc.wait_connected()
        f.wait_for_telemetry()
        f.start_operators()
        audit = Audit(mc.api("manager")).start()
        yield f
    finally:
        if audit is not None:
            audit.stop()
        if f is not None:
            f.close()
        if not reused:
            mc.down()


def submit(name: str, namespace: str, **notes: Any) -> None:
    annotations = {"sovereignspec.io/model": "llama-3.1-8b", "sovereignspec.io/drafter": "eagle3"}
    annotations.update({f"sovereignspec.io/{key.replace('_', '-')}": str(v) for key, v in notes.items()})
    body = k.job(name, namespace, mc.QUEUE, annotations=annotations)
    server_side_apply(mc.api("manager"), body, "sovereignspec-e2e")


def manager_workload(namespace: str, job: str) -> dict[str, Any] | None:
    for wl in k.workloads(mc.api("manager"), namespace):
        if any(r.get("name") == job for r in wl["metadata"].get("ownerReferences", [])):
            return wl
    return None


def admitted_on(namespace: str, job: str) -> str | None:
    """The worker the manager's Workload was admitted on, once it is."""
    wl = manager_workload(namespace, job)
    if wl is None or not k.condition(wl, "Admitted") or k.condition(wl, "Admitted")["status"] != "True":
        return None
    return (wl.get("status") or {}).get("clusterName")


def admissions(jobs: list[tuple[str, str]]) -> dict[tuple[str, str], str] | None:
    """Where each Job was admitted (its manager Workload's clusterName), once all are; else None."""
    found: dict[tuple[str, str], str] = {}
    wanted = set(jobs)
    for ns in {ns for ns, _ in jobs}:
        for wl in k.workloads(mc.api("manager"), ns):
            admitted = k.condition(wl, "Admitted")
            cluster = (wl.get("status") or {}).get("clusterName")
            if not admitted or admitted["status"] != "True" or not cluster:
                continue
            for ref in wl["metadata"].get("ownerReferences", []):
                if (ns, ref.get("name")) in wanted:
                    found[(ns, ref["name"])] = cluster
    return found if len(found) == len(wanted) else None


def worker_jobs(member: str) -> dict[tuple[str, str], dict[str, Any]]:
    batch = client.BatchV1Api(mc.api(member))
    out = {}
    for ns in NAMESPACES:
        for j in batch.list_namespaced_job(ns).items:
            out[(ns, j.metadata.name)] = j
    return out


def worker_entry(member: str, namespace: str, job: str) -> dict[str, Any] | None:
    for wl in k.workloads(mc.api(member), namespace):
        if any(r.get("name") == job for r in wl["metadata"].get("ownerReferences", [])):
            return k.check_state(wl, mc.WORKER_CHECK)
    return None


def test_fifty_mixed_jobs_run_only_in_their_tenants_jurisdiction(fleet: mc.Fleet) -> None:
    token = secrets.token_hex(2)
    jobs = [(NAMESPACES[i % 3], f"mix-{token}-{i}") for i in range(50)]
    for ns, name in jobs:
        submit(name, ns)
    where = wait_until(
        lambda: admissions(jobs),
        timeout=180,
        what="all 50 Jobs admitted through a worker",
    )
    for (ns, name), member in where.items():
        jurisdiction = mc.TENANTS[ns]
        if jurisdiction is not None:
            assert mc.WORKERS[member] == jurisdiction, f"{ns}/{name} ran on {member}"
    # On the workers' own objects: each Job exists on exactly one worker, in its jurisdiction,
    # placed there by the worker's SovereignSpec.
    on = {m: worker_jobs(m) for m in mc.WORKERS}
    for ns, name in jobs:
        holders = [m for m in mc.WORKERS if (ns, name) in on[m]]
        assert holders == [where[(ns, name)]], f"{ns}/{name} is on {holders}"
        if mc.TENANTS[ns] is not None:
            assert mc.WORKERS[holders[0]] == mc.TENANTS[ns]
        entry = wait_until(lambda ns=ns, name=name: worker_entry(where[(ns, name)], ns, name), timeout=30)
        assert entry["state"] == "Ready", entry
    assert Counter(where.values())["worker-eu"] >= 17  # team-eu's 17 at least
    # The manager's other controller's entries survived our writes; Kueue cleared the nominations.
    for ns, name in jobs:
        wl = manager_workload(ns, name)
        assert wl is not None
        audit = k.check_state(wl, AUDIT)
        assert audit is not None and audit["state"] == "Ready" and audit["message"] == AUDIT_MESSAGE
        assert not (wl["status"].get("nominatedClusterNames") or []), wl["status"]
        ours = k.check_state(wl, mc.DISPATCH_CHECK)
        assert ours is not None and ours["state"] == "Ready" and "nominated" in ours["message"]
        owners = {f["manager"] for f in wl["metadata"].get("managedFields", [])}
        assert AUDIT_MANAGER in owners and "sovereignspec-dispatcher" in owners
    # The manager's sovereignty record: each Job's nomination and the worker that admitted it.
    uids = {(ns, name): (manager_workload(ns, name) or {})["metadata"]["uid"] for ns, name in jobs}

    def recorded() -> list[dict[str, Any]] | None:
        segments = read_segments(client.CustomObjectsApi(mc.api("manager")))
        assert record.verify(segments) == []
        records = record.records_of(segments)
        admitted = {r["workload"]["uid"] for r in records if r["kind"] == "admission"}
        return records if set(uids.values()) <= admitted else None

    records = wait_until(recorded, timeout=60, what="every admission in the manager's record")
    for (ns, name), uid in uids.items():
        mine = [r for r in records if r["workload"]["uid"] == uid]
        nominations = [r for r in mine if r["kind"] == "dispatch" and r["state"] == "Ready"]
        # Recorded once, ahead of its write (audit.required): a second one only after the first was
        # refused by the API server (a conflict) and said so.
        unwritten = [r for r in mine if r["kind"] == "unwritten"]
        assert len(nominations) == 1 + len(unwritten), mine
        assert nominations and all(
            mc.TENANTS[ns] is None or set(r["workerJurisdictions"].values()) == {mc.TENANTS[ns]}
            for r in nominations
        ), nominations
        (admission,) = [r for r in mine if r["kind"] == "admission"]
        assert (
            admission["worker"] == where[(ns, name)]
            and admission["workerJurisdiction"] == mc.WORKERS[where[(ns, name)]]
        )
    assert [r for r in record.outside(records) if r["workload"]["uid"] in set(uids.values())] == []


def _wait_headroom(fleet: mc.Fleet, member: str, activity: float) -> None:
    """Until the worker's Prometheus serves the new reading (and the dispatcher's 1 s cache ages)."""
    promql = f"max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{Hostname='{member}-gpu-0'}})"
    wait_until(
        lambda: (
            (r := fleet.prometheus[member].query(promql)) and abs(float(r[0]["value"][1]) - activity) < 1e-6
        ),
        timeout=30,
        what=f"{member}'s new telemetry in its Prometheus",
    )
    time.sleep(1.2)


@pytest.mark.parametrize("saturated", ["worker-kr", "worker-eu"])
def test_latency_sensitive_high_alpha_work_goes_to_the_worker_with_headroom(
    fleet: mc.Fleet, saturated: str
) -> None:
    idle = next(m for m in mc.WORKERS if m != saturated)
    fleet.set_headroom(saturated, 0.0)
    fleet.set_headroom(idle, 1.0)
    try:
        _wait_headroom(fleet, saturated, 1.0 * mc.EFFICIENCY)
        name = f"chat-{secrets.token_hex(2)}"
        submit(name, "team-global", latency_class="latency", acceptance_rate="0.9")
        member = wait_until(lambda: admitted_on("team-global", name), timeout=60, what=f"{name} admitted")
        assert member == idle
        wl = manager_workload("team-global", name)
        assert wl is not None
        message = k.check_state(wl, mc.DISPATCH_CHECK)["message"]  # type: ignore[index]
        assert f"nominated {idle}" in message and "speculative" in message, message
    finally:
        fleet.set_headroom(saturated, 1.0)


def test_a_workload_no_worker_can_ever_take_is_rejected_with_the_reason(fleet: mc.Fleet) -> None:
    name = f"nowhere-{secrets.token_hex(2)}"
    submit(name, "team-global", jurisdiction="jp")

    def rejected() -> str | None:
        wl = manager_workload("team-global", name)
        entry = k.check_state(wl, mc.DISPATCH_CHECK) if wl else None
        if entry is None:
            return None
        text = entry["message"]
        return text if entry["state"] == "Rejected" or "Previously: Rejected" in text else None

    wait_until(rejected, timeout=60, what=f"{name} rejected")
    events = client.CoreV1Api(mc.api("manager")).list_namespaced_event("team-global").items
    mine = [
        e
        for e in events
        if e.reason == "NoWorkerCluster" and e.involved_object.name.startswith(f"job-{name}")
    ]
    assert mine and "no worker cluster can ever take it" in mine[0].message
    assert (
        "requires jp; worker is in kr" in mine[0].message
        and "requires jp; worker is in eu" in mine[0].message
    )
    assert not any((ns, name) in worker_jobs(m) for m in mc.WORKERS for ns in NAMESPACES)


def test_a_worker_going_away_never_sends_its_work_across_and_everything_is_admitted_once(
    fleet: mc.Fleet,
) -> None:
    token = secrets.token_hex(2)
    kr = [("team-kr", f"away-kr-{token}-{i}") for i in range(6)]
    eu = [("team-eu", f"away-eu-{token}-{i}") for i in range(6)]
    glob = [("team-global", f"away-gl-{token}-{i}") for i in range(4)]
    seen_while_down: dict[str, Any] = {}

    def while_down() -> None:
        for ns, name in [*kr, *eu, *glob]:
            submit(name, ns)
        # eu work and the unbound tenant's go on through worker-eu meanwhile ...
        on_eu = wait_until(lambda: admissions(eu), timeout=90, what="eu work admitted while kr is down")
        assert set(on_eu.values()) == {"worker-eu"}
        # ... and kr work is never sent to eu: nothing of team-kr reaches worker-eu.
        time.sleep(3)
        seen_while_down["kr_on_eu"] = [j for j in kr if j in worker_jobs("worker-eu")]
        seen_while_down["kr_admitted"] = [j for j in kr if admitted_on(*j)]

    directory = mc.state_dir() / "worker-kr"
    controlplane.restart_apiserver(
        down_seconds=1.0, directory=directory, while_down=while_down, ready=lambda: mc._ready("worker-kr")
    )
    assert seen_while_down["kr_on_eu"] == []
    assert seen_while_down["kr_admitted"] == []
    everything = [*kr, *eu, *glob]
    where = wait_until(
        lambda: admissions(everything),
        timeout=240,
        what="everything admitted once worker-kr is back",
    )
    assert all(where[j] == "worker-kr" for j in kr)
    assert all(where[j] == "worker-eu" for j in eu)
    on = {m: worker_jobs(m) for m in mc.WORKERS}
    for j in everything:  # admitted once: on exactly one worker
        assert [m for m in mc.WORKERS if j in on[m]] == [where[j]], j


def test_nobody_but_the_dispatcher_can_nominate_a_worker_and_the_work_stays_in_its_jurisdiction(
    fleet: mc.Fleet,
) -> None:
    # Another controller (here the harness's admin user, as any over-privileged controller would be)
    # tries again and again, from the Workload's creation to its admission, to point a kr-bound
    # workload at worker-eu by server-side apply. The chart's ValidatingAdmissionPolicy refuses every
    # try; the workload runs on worker-kr and worker-eu never holds a copy.
    name = f"rogue-{secrets.token_hex(2)}"
    submit(name, "team-kr")
    refused: list[str] = []
    accepted: list[int] = []
    copies: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not admitted_on("team-kr", name):
        wl = manager_workload("team-kr", name)
        if wl is not None:
            body = {
                "apiVersion": f"{k.GROUP}/{k.VERSION}",
                "kind": "Workload",
                "metadata": {"name": wl["metadata"]["name"], "namespace": "team-kr"},
                "status": {"nominatedClusterNames": ["worker-eu"]},
            }
            try:
                server_side_apply(mc.api("manager"), body, "rogue-controller", subresource="status")
                accepted.append(1)
            except client.ApiException as e:
                # Ours (403) until MultiKueue sets clusterName; then Kueue's own CRD rule answers first.
                assert e.status == 403 or (e.status == 422 and "mutually exclusive" in str(e.reason)), e
                if e.status == 403:
                    refused.append(str(e.reason))
        if any(ns == "team-kr" and job == name for ns, job in worker_jobs("worker-eu")):
            copies.append("worker-eu")
        time.sleep(0.05)
    assert admitted_on("team-kr", name) == "worker-kr"
    assert accepted == [] and refused, (len(accepted), len(refused))
    assert "only the SovereignSpec dispatcher" in refused[0] and "refused for admin" in refused[0], refused[0]
    # After admission (Kueue cleared the field) setting it is refused too.
    wl = manager_workload("team-kr", name)
    assert wl is not None and not (wl["status"].get("nominatedClusterNames") or [])
    with pytest.raises(client.ApiException) as late:
        server_side_apply(
            mc.api("manager"),
            {
                "apiVersion": f"{k.GROUP}/{k.VERSION}",
                "kind": "Workload",
                "metadata": {"name": wl["metadata"]["name"], "namespace": "team-kr"},
                "status": {"nominatedClusterNames": ["worker-eu"]},
            },
            "rogue-controller",
            subresource="status",
        )
    # Refused either way: by Kueue's own rule first (no nomination beside a clusterName: 422), or ours.
    assert late.value.status in (403, 422), late.value
    after = manager_workload("team-kr", name)
    assert after is not None and not (after["status"].get("nominatedClusterNames") or [])
    time.sleep(3)  # what MultiKueue would have sent is gone or never came: nothing on worker-eu
    assert copies == [] and (("team-kr", name) not in worker_jobs("worker-eu"))
    assert not [w for w in k.workloads(mc.api("worker-eu"), "team-kr") if name in json.dumps(w["metadata"])]
