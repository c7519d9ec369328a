"""The sovereignty record in an S3 bucket under Object Lock (issue 46), against a real S3 server
(Versity's gateway, built from its Go module; localdev/s3.py): segments written once under
COMPLIANCE retention, refused deletion, a second version that changes nothing a reader sees, a
segment another replica wrote first followed never forked, a bucket without Object Lock or a store
that does not answer holding placements with the reason, and `sovereignspec audit` reading the
bucket with no cluster at all."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from minio.error import S3Error

from localdev import controlplane
from localdev.operator import OperatorProcess
from localdev.s3 import LocalS3
from sovereignspec.auditing import _rewrites
from sovereignspec.operator.border.world import World
from sovereignspec.operator.decision.plan import Write
from sovereignspec.operator.roles import record
from sovereignspec.operator.roles.audit import SEGMENT_RECORDS, AuditLog, ahead, read_segments
from sovereignspec.operator.roles.bucket import BucketStore
from tests.cluster.auditing import audit, mine
from tests.cluster.operator_env import (
    admitted_job,
    decided,
    event,
    make_pool,
    our_entry,
    own_check,
    submit,
    workload_of,
)
from tests.unit.builders import CHECK, policy
from tests.waiting import wait_until

CHAT = {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance_rate": 0.8, "latency_class": "latency"}


@pytest.fixture(scope="module")
def s3() -> Iterator[LocalS3]:
    server = LocalS3().start()
    yield server
    server.close()


@pytest.fixture
def creds(s3: LocalS3, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)


def fact(i: int) -> dict[str, Any]:
    return {"kind": "decision", "at": f"2026-12-06T02:00:{i % 60:02d}Z", "replica": "op-0",
            "workload": {"namespace": "team-a", "name": f"w{i}", "uid": f"u{i}"},
            "state": "Ready"}  # fmt: skip


def store(s3: LocalS3, bucket: str, days: int = 30) -> BucketStore:
    return BucketStore(s3.endpoint, bucket, "sovereignspec/audit/", days)


def writer(s3: LocalS3, bucket: str, name: str = "op-0") -> AuditLog:
    return AuditLog(None, name, store(s3, bucket))  # type: ignore[arg-type]


def test_segments_are_written_once_under_compliance_retention_and_no_one_may_delete_them(s3, creds) -> None:
    bucket = s3.bucket(f"locked-{secrets.token_hex(3)}")
    log = writer(s3, bucket)
    log.add([fact(i) for i in range(SEGMENT_RECORDS + 3)])
    assert log.flush() and log.backlog == []
    segs = store(s3, bucket).read_segments()
    assert [(s["name"], s["count"]) for s in segs] == [
        ("audit-000000000000", SEGMENT_RECORDS), ("audit-000000000001", 3),
    ]  # fmt: skip
    assert record.verify(segs) == []
    admin = s3.client()
    key = "sovereignspec/audit/audit-000000000000.json"
    retention = admin.get_object_retention(bucket, key)
    until = retention.retain_until_date
    assert retention.mode == "COMPLIANCE"
    assert dt.timedelta(days=29) < until - dt.datetime.now(dt.UTC) <= dt.timedelta(days=30)
    (version,) = [o.version_id for o in admin.list_objects(bucket, prefix=key, include_version=True)]
    with pytest.raises(S3Error) as refused:  # the root account itself
        admin.remove_object(bucket, key, version_id=version)
    assert refused.value.code == "AccessDenied"

    # A forger with write access puts a new version over segment 0, a record edited in it: readers
    # still take the first, the chain still verifies, and `audit verify` names the forged version.
    edited = json.loads(json.dumps(segs[0]))
    edited["records"][1]["node"] = "h-kr"
    forged = json.dumps(edited).encode()
    admin.put_object(bucket, key, io.BytesIO(forged), len(forged))
    again = store(s3, bucket)
    assert again.read_segments() == segs and record.verify(again.read_segments()) == []
    ((name, version, _),) = again.later_versions()
    assert _rewrites(segs, again.later_versions()) == [
        f"record 1 of segment {name} (later version {version}): its digest is not its content's: "
        "edited after it was written"
    ]


def test_a_segment_another_replica_wrote_first_is_followed_never_forked(s3, creds) -> None:
    bucket = s3.bucket(f"race-{secrets.token_hex(3)}")
    old, new = writer(s3, bucket, "op-0"), writer(s3, bucket, "op-1")
    old.add([fact(0)])
    assert old.flush()  # op-0's head: segment 1 next
    new.add([fact(1)])
    assert new.flush()  # op-1 wrote segment 1
    old.add([fact(2)])  # op-0, resumed from a pause, still thinks segment 1 is next
    assert old.flush()
    segs = store(s3, bucket).read_segments()
    assert record.verify(segs) == []
    assert [(s["index"], s["writer"]) for s in segs] == [(0, "op-0"), (1, "op-1"), (2, "op-0")]
    # op-0's losing write of segment 1 stays (locked) as a later version; op-1's is segment 1. The
    # loser's is a whole chain from where op-1's began: `audit verify` notes it, and fails on nothing.
    later = store(s3, bucket).later_versions()
    assert [(name, content["writer"]) for name, _, content in later] == [("audit-000000000001", "op-0")]
    assert _rewrites(segs, later) == []


def _placement() -> Write:
    workload = {"metadata": {"name": "chat", "namespace": "team-a", "uid": "u-chat"}}
    return Write("team-a/chat", workload, CHECK, {}, "Ready", "placed", [{"name": "main"}], outcome="placed",
                 placed=("h-eu/gpu0",))  # fmt: skip


def _world() -> World:
    return World([], [], {})


def test_a_bucket_without_object_lock_holds_placements_saying_what_the_store_said(s3, creds) -> None:
    bucket = s3.bucket(f"plain-{secrets.token_hex(3)}", locked=False)
    log = writer(s3, bucket)
    (w,) = ahead(log, [_placement()], _world(), policy())
    assert w.state == "Retry" and "waiting for the sovereignty record (audit.required)" in w.message
    assert log.error == "InvalidRequest: Bucket is missing ObjectLockConfiguration", log.error


def test_a_store_that_does_not_answer_holds_placements_and_the_backlog_is_written_when_it_returns(
    creds,
) -> None:
    server = LocalS3().start()
    try:
        for name, value in server.env().items():
            os.environ[name] = value
        bucket = server.bucket("outage")
        log = writer(server, bucket)
        log.add([fact(0)])
        server.stop()
        (w,) = ahead(log, [_placement()], _world(), policy())
        assert w.state == "Retry" and log.error, log.error
        assert [f["workload"]["uid"] for f in log.backlog] == ["u0"]  # the older record waits
        server.start()  # the same port and directory
        (w,) = ahead(log, [_placement()], _world(), policy())
        assert w.state == "Ready" and log.backlog == []
        uids = [r["workload"]["uid"] for r in record.records_of(store(server, bucket).read_segments())]
        assert uids == ["u0", "u-chat"]
    finally:
        server.close()


def test_the_audit_command_reads_a_bucket_with_no_cluster_at_all(s3, creds, tmp_path) -> None:
    bucket = s3.bucket(f"cli-{secrets.token_hex(3)}")
    log = writer(s3, bucket)
    log.add([fact(i) for i in range(3)])
    assert log.flush()
    flags = ["--audit-bucket", bucket, "--audit-endpoint", s3.endpoint]
    env = {**os.environ, **s3.env(), "KUBECONFIG": str(tmp_path / "none")}
    done = subprocess.run(
        [sys.executable, "-m", "sovereignspec.cli", "audit", *flags, "export", "--format", "csv"],
        capture_output=True, text=True, check=False, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [line.split(",")[4] for line in done.stdout.splitlines()[1:]] == ["w0", "w1", "w2"]
    wrong = subprocess.run(
        [sys.executable, "-m", "sovereignspec.cli", "audit", *flags[:2], "--audit-endpoint",
         "ftp://x", "export"], capture_output=True, text=True, check=False, timeout=60, env=env,
    )  # fmt: skip
    assert wrong.returncode == 2 and "expected http(s)://HOST[:PORT]" in wrong.stderr, wrong.stderr


def test_the_operator_as_deployed_keeps_its_record_in_the_bucket_and_verify_reads_it_there(
    s3, env, namespace, unique
) -> None:
    """The operator process with --audit-bucket (its credentials in its environment, as the chart
    gives them from a Secret): a placement's decision lands in the bucket before the placement,
    nothing in the cluster's AuditSegments names it, and `audit verify` reading the bucket (and
    the cluster's Workloads) finds the chain intact and the workload recorded."""
    bucket = s3.bucket(f"op-{secrets.token_hex(3)}")
    own = own_check(env, unique("bucket"))
    flags = ["--audit-bucket", bucket, "--audit-endpoint", s3.endpoint, "--audit-retention-days", "1"]
    operator = OperatorProcess(own.controller, extra=flags, env=s3.env()).start()
    try:
        assert f"sovereignty record: kept in s3 bucket {bucket}" in operator.logs()
        pool = make_pool(own, namespace, [("H100-SXM", "eu", 2, [0.95] * 2)])
        submit(pool, "chat", **CHAT)
        wl = decided(pool, "chat")
        assert our_entry(pool, wl)["state"] == "Ready"
    finally:
        operator.stop()
    uid = wl["metadata"]["uid"]
    with pytest.MonkeyPatch.context() as mp:
        for key, value in s3.env().items():
            mp.setenv(key, value)
        records = record.records_of(store(s3, bucket, 1).read_segments())
    decisions = [r for r in records if r["kind"] == "decision" and r["workload"].get("uid") == uid]
    assert decisions and decisions[-1]["state"] == "Ready", records  # a conflict may add an earlier one
    admin = str(controlplane.kubeconfig("admin"))
    done = subprocess.run(
        [sys.executable, "-m", "sovereignspec.cli", "audit", "--kubeconfig", admin,
         "--audit-bucket", bucket, "--audit-endpoint", s3.endpoint, "verify"],
        capture_output=True, text=True, check=False, timeout=60, env={**os.environ, **s3.env()},
    )  # fmt: skip
    # Other tests' admitted workloads are in the cluster's record, not this bucket: only ours counts.
    assert [line for line in done.stdout.splitlines() if namespace in line or "digest" in line] == [], (
        done.stdout
    )
    in_cluster = audit("export", "--namespace", namespace).stdout
    assert uid not in in_cluster


@pytest.mark.parametrize("required", [True, False], ids=["required", "not-required"])
def test_the_bucket_stopped_mid_burst_admits_nothing_unrecorded_and_everything_is_recorded_after(
    env, namespace, unique, required
) -> None:
    """The operator as deployed, its bucket's server stopped in the middle of a burst. With
    audit.required: nothing is admitted while it is down (each placement waits, saying why) and
    everything is once it is back, each decision in the bucket. Without: decisions go on, and
    every one is in the bucket once it is back."""
    server = LocalS3().start()
    try:
        bucket = server.bucket("burst")
        own = own_check(env, unique(f"outage-{str(required).lower()}"))
        flags = ["--audit-bucket", bucket, "--audit-endpoint", server.endpoint, "--audit-retention-days", "1"]
        flags += [] if required else ["--no-audit-required"]
        operator = OperatorProcess(own.controller, extra=flags, env=server.env()).start()
        try:
            pool = make_pool(own, namespace, [("H100-SXM", "eu", 8, [0.95] * 8)])
            jobs = [f"burst-{i}" for i in range(6)]
            for job in jobs[:3]:
                submit(pool, job, **CHAT)
            for job in jobs[:3]:
                assert our_entry(pool, decided(pool, job))["state"] == "Ready"
            server.stop()  # mid-burst
            for job in jobs[3:]:
                submit(pool, job, **CHAT)
            if required:
                message = event(pool, "RecordUnavailable", timeout=60).message
                assert "waiting for the sovereignty record (audit.required)" in message, message
                time.sleep(3.0)  # several ticks with the store down
                batch = client.BatchV1Api(env.api)
                assert [batch.read_namespaced_job(j, namespace).spec.suspend for j in jobs[3:]] == [True] * 3
            else:
                for job in jobs[3:]:
                    assert our_entry(pool, decided(pool, job))["state"] == "Ready"
            server.start()  # the same port and directory
            uids = {}
            for job in jobs:
                admitted_job(pool, job, timeout=180)
                uids[job] = (workload_of(pool, job) or {})["metadata"]["uid"]
        finally:
            operator.stop()

        def recorded() -> set[str] | None:
            with pytest.MonkeyPatch.context() as mp:
                for key, value in server.env().items():
                    mp.setenv(key, value)
                segs = store(server, bucket, 1).read_segments()
            assert record.verify(segs) == []
            seen = {r["workload"]["uid"] for r in record.records_of(segs) if r.get("state") == "Ready"}
            return seen if set(uids.values()) <= seen else None

        wait_until(recorded, timeout=60, what="every admitted workload's decision in the bucket")
    finally:
        server.close()


def test_audit_copy_moves_the_clusters_record_into_a_bucket_digests_unchanged_and_refuses_another_chain(
    s3, creds, env, operator, namespace
) -> None:
    """An embedded record moved into a bucket as it is: `audit copy` writes the cluster's segments
    (each under the bucket's retention) after those the bucket holds, `verify` reads the bucket's
    copy intact, a second copy adds only what is new, and a bucket holding another chain is refused
    with nothing written."""
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 1, [0.95])])
    submit(pool, "moved", **CHAT)
    wl = decided(pool, "moved")  # at least this decision in the cluster's record
    uid = wl["metadata"]["uid"]
    wait_until(
        lambda: uid in audit("export", "--namespace", namespace).stdout,
        timeout=30, what="the decision in the cluster's record",
    )  # fmt: skip
    bucket = s3.bucket(f"copy-{secrets.token_hex(3)}")
    where = ["--audit-bucket", bucket, "--audit-endpoint", s3.endpoint, "--audit-retention-days", "1"]
    first = audit(*where, "copy")
    assert first.returncode == 0 and "(0 were there already)" in first.stdout, first.stdout + first.stderr
    copied = store(s3, bucket, 1).read_segments()
    cluster = sorted(read_segments(client.CustomObjectsApi(env.api)), key=lambda s: int(s["index"]))
    keyed = sorted(copied, key=lambda s: int(s["index"]))
    strip = [{k: v for k, v in s.items() if k != "name"} for s in keyed]
    assert strip == [{k: v for k, v in s.items() if k != "name"} for s in cluster[: len(strip)]]
    assert record.verify(copied) == [] and uid in {
        (r.get("workload") or {}).get("uid") for r in record.records_of(copied)
    }  # a `leader` record names no workload (another test's failover, earlier in the session)
    # Intact, and this test's workload recorded (others decided since the copy are not, yet).
    assert mine(audit(*where, "verify").stdout, namespace) == []
    again = audit(*where, "copy")
    assert again.returncode == 0 and f"({len(copied)} were there already)" in again.stdout, again.stdout
    # A bucket that holds another chain's first segment: refused, nothing written over it.
    other = s3.bucket(f"other-{secrets.token_hex(3)}")
    log = writer(s3, other)
    log.add([fact(0)])
    assert log.flush()
    refused = audit("--audit-bucket", other, "--audit-endpoint", s3.endpoint, "copy")
    assert refused.returncode == 2 and "not the cluster's first ones (another chain)" in refused.stderr, (
        refused.stderr
    )
    assert len(store(s3, other).read_segments()) == 1


def test_the_leader_killed_mid_burst_leaves_one_chain_in_the_bucket_with_every_placement_recorded(
    s3, creds, env, namespace, unique
) -> None:
    """Two replicas writing one bucket under leader election, the leader SIGKILLed in the middle of
    a burst: the bucket's chain verifies (no gap, no fork), every placement is in it (written ahead of
    its decision), and both replicas' hand-overs and decisions are."""
    from tests.cluster.test_leader_election import elected, leads

    own, kubeconfig, flags = elected(env, namespace, unique, "bucketfail")
    bucket = s3.bucket(f"failover-{secrets.token_hex(3)}")
    flags += ["--audit-bucket", bucket, "--audit-endpoint", s3.endpoint, "--audit-retention-days", "1"]
    operators = [
        OperatorProcess(own.controller, extra=flags, kubeconfig=kubeconfig, env=s3.env()).start()
        for _ in range(2)
    ]
    try:
        pool = make_pool(own, namespace, [("H100-SXM", "eu", 8, [0.95] * 8)])
        first = wait_until(
            lambda: next((o for o in operators if leads(env.api, namespace, o)), None),
            timeout=30, what="one operator to lead",
        )  # fmt: skip
        jobs = [f"burst-{i:02d}" for i in range(8)]
        for job in jobs[:3]:
            submit(pool, job, **CHAT)
        wait_until(lambda: decided(pool, jobs[0]), timeout=60, what="the first decision")
        first.kill()  # SIGKILL: no hand-over, the standby waits out the lease
        for job in jobs[3:]:
            submit(pool, job, **CHAT)
        finals = {j: decided(pool, j, timeout=90) for j in jobs}
    finally:
        for o in operators:
            o.stop()
    segments = store(s3, bucket, 1).read_segments()
    assert record.verify(segments) == []
    records = record.records_of(segments)
    recorded = {r["workload"]["uid"] for r in records if r["kind"] == "decision" and r["state"] == "Ready"}
    placed = {wl["metadata"]["uid"] for wl in finals.values() if our_entry(pool, wl)["state"] == "Ready"}
    assert placed and placed <= recorded, (placed - recorded, records)
    assert len({r["replica"] for r in records if r["kind"] == "leader"}) == 2, records
    assert len({r["replica"] for r in records if r["kind"] == "decision"}) == 2, records


def _run_pod(pool: Any, job: str) -> str:
    """The Job's one pod, bound where its admitted template says (the scheduler's part, done by
    hand: the harness runs no scheduler), owned by the Job; returns its node."""
    j = client.BatchV1Api(pool.env.api).read_namespaced_job(job, pool.namespace)
    host = j.spec.template.spec.node_selector["kubernetes.io/hostname"]
    node = next(name for name, h in pool.hosts.items() if h == host)
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": j.metadata.uid, "controller": True}
    pod = {
        "metadata": {"name": f"{job}-0", "namespace": pool.namespace, "ownerReferences": [owner]},
        "spec": {"nodeName": node, "containers": [{"name": "engine", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip
    client.CoreV1Api(pool.env.api).create_namespaced_pod(pool.namespace, pod)
    return node


def test_a_burst_across_tenants_and_jurisdictions_verifies_in_the_bucket_and_where_names_every_pods_node(
    s3, creds, env, namespace, unique
) -> None:
    """The operator as deployed with its record in the bucket; two tenants, one allowed only eu and
    one only kr, each with a burst of Jobs over eu and kr nodes. Every decision places the tenant in
    its own jurisdiction; each Job's pod bound where its admitted template says. `audit verify`,
    reading the bucket and the cluster, finds nothing wrong with either tenant; `audit where` names,
    for every Job, the node it was decided on and the node its pod was bound to, both inside the
    tenant's jurisdiction."""
    from tests.cluster.operator_env import add_namespace, in_namespace

    bucket = s3.bucket(f"tenants-{secrets.token_hex(3)}")
    own = own_check(env, unique("tenants"))
    flags = ["--audit-bucket", bucket, "--audit-endpoint", s3.endpoint, "--audit-retention-days", "1"]
    operator = OperatorProcess(own.controller, extra=flags, env=s3.env()).start()
    try:
        pool = make_pool(
            own, namespace, [("H100-SXM", "eu", 4, [0.95] * 4), ("H100-SXM", "kr", 4, [0.95] * 4)]
        )
        juris = {name: j for name, (_, j, _) in pool.nodes.items()}
        client.CoreV1Api(env.api).patch_namespace(
            namespace, {"metadata": {"labels": {"sovereignspec.io/jurisdiction": "eu"}}}
        )
        kr = in_namespace(pool, add_namespace(pool, "kr", {"sovereignspec.io/jurisdiction": "kr"}))
        tenants = {pool.namespace: (pool, "eu"), kr.namespace: (kr, "kr")}
        jobs = [(p, f"burst-{i}") for i in range(3) for p in (pool, kr)]  # interleaved, as they arrive
        for p, job in jobs:
            submit(p, job, **CHAT)
        bound: dict[tuple[str, str], str] = {}
        for p, job in jobs:
            assert our_entry(p, decided(p, job))["state"] == "Ready"
            admitted_job(p, job, timeout=120)
            bound[(p.namespace, job)] = _run_pod(p, job)
        assert {(ns, juris[node]) for (ns, _), node in bound.items()} == {
            (ns, j) for ns, (_, j) in tenants.items()
        }  # every pod inside its tenant's jurisdiction: the decisions kept them there

        def everything_recorded() -> list[dict[str, Any]] | None:
            records = record.records_of(store(s3, bucket, 1).read_segments())
            pods = {(r["pod"]["namespace"], r["workload"]["name"]) for r in records if r["kind"] == "binding"}
            return records if set(bound) <= pods else None

        records = wait_until(everything_recorded, timeout=60, what="every pod's binding in the bucket")
    finally:
        operator.stop()
    assert record.verify(store(s3, bucket, 1).read_segments()) == []
    decisions = [r for r in records if r["kind"] == "decision" and r.get("state") == "Ready"]
    assert {(r["workload"]["namespace"], r["nodeJurisdiction"]) for r in decisions} == {
        (ns, j) for ns, (_, j) in tenants.items()
    }, decisions
    admin = str(controlplane.kubeconfig("admin"))

    def audit_bucket(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sovereignspec.cli", "audit", "--kubeconfig", admin,
             "--audit-bucket", bucket, "--audit-endpoint", s3.endpoint, *args],
            capture_output=True, text=True, check=False, timeout=60, env={**os.environ, **s3.env()},
        )  # fmt: skip

    verified = audit_bucket("verify")
    # The cluster's other admitted workloads are in its own record, not this bucket: only ours count.
    assert [line for ns in tenants for line in mine(verified.stdout, ns)] == [], verified.stdout
    for (ns, job), node in bound.items():
        where = audit_bucket("where", f"{ns}/{job}")
        j = tenants[ns][1]
        assert where.returncode == 0, where.stdout + where.stderr
        assert f"Ready (placed) on {node} ({j})" in where.stdout, where.stdout
        assert f"pod {job}-0 bound to {node} ({j}; allowed: {j})" in where.stdout, where.stdout
