"""The sovereignty record: the hash chain and what `audit verify` finds in it, the facts a tick
records, and the writer's way through a failed store and a segment another replica wrote."""

from __future__ import annotations

import copy
import csv
import dataclasses
import io
import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from sovereignspec.auditing import verify as audit_verify
from sovereignspec.operator.border.cuts import strip_pod
from sovereignspec.operator.border.world import World
from sovereignspec.operator.decision.plan import Write
from sovereignspec.operator.roles import record
from sovereignspec.operator.roles.audit import (
    SEGMENT_RECORDS,
    AuditLog,
    ClusterStore,
    ahead,
    binding_facts,
    decision_facts,
)
from tests.unit.builders import CHECK, policy


def fact(i: int, namespace: str = "team-a", kind: str = "decision") -> dict[str, Any]:
    return {
        "kind": kind, "at": f"2026-12-06T01:{i // 60:02d}:{i % 60:02d}Z", "replica": "op-0_abc",
        "workload": {"namespace": namespace, "name": f"job-chat-{i}", "uid": f"u{i}",
                     "owner": {"kind": "Job", "name": f"chat-{i}"}},
        "tenant": namespace, "jurisdictions": ["eu"], "node": "h-eu", "nodeJurisdiction": "eu",
        "state": "Ready", "mode": "speculative", "gamma": 3, "check": CHECK,
    }  # fmt: skip


def segments(n_records: int = 7, per: int = 3) -> list[dict[str, Any]]:
    head, out = record.Head(), []
    facts = [fact(i) for i in range(n_records)]
    for start in range(0, n_records, per):
        index = head.segment
        records, head = record.chain(head, facts[start : start + per])
        out.append({"name": f"audit-{index:012d}", "index": index, "records": records})
    return out


def test_an_intact_chain_verifies_and_resumes_where_it_ended() -> None:
    segs = segments()
    assert record.verify(segs) == []
    head = record.head_of(segs)
    assert (head.seq, head.segment, head.digest) == (7, 3, segs[-1]["records"][-1]["digest"])
    more, _ = record.chain(head, [fact(7)])
    assert record.verify([*segs, {"name": "audit-000000000003", "index": 3, "records": more}]) == []
    assert record.head_of([]) == record.Head()


def _as_the_api_server_gives_it_back(value: Any) -> Any:
    """A custom object's JSON as the API server re-encodes it (Go's encoding/json): a whole float
    comes back as an integer, 800.0 as 800."""
    text = json.dumps(value)
    return json.loads(text, parse_float=lambda s: int(float(s)) if float(s).is_integer() else float(s))


def test_a_record_holding_whole_floats_verifies_after_the_api_server_re_encodes_it() -> None:
    # Found on the real control plane: an `ignored` record's 800.0 draft tokens came back as 800,
    # and verify named the record as edited.
    records, _ = record.chain(record.Head(), [{**fact(0), "tokens": 800.0, "nested": [{"x": 2.0, "y": 0.5}]}])
    stored = _as_the_api_server_gives_it_back(records)
    assert stored[0]["tokens"] == 800 and stored[0]["nested"] == [{"x": 2, "y": 0.5}]
    assert record.verify([{"name": "audit-000000000000", "index": 0, "records": stored}]) == []


def _findings(segs: list[dict[str, Any]]) -> list[str]:
    return [str(f) for f in record.verify(segs)]


def test_a_record_edited_after_it_was_written_is_named() -> None:
    segs = segments()
    segs[1]["records"][0]["node"] = "h-kr"  # the fourth record: where it ran, rewritten
    (finding,) = _findings(segs)
    edited = "its digest is not its content's: edited after it was written"
    assert finding == f"record 3 of segment audit-000000000001: {edited}"


def test_a_record_edited_with_its_digest_recomputed_breaks_the_next_one() -> None:
    segs = segments()
    r = segs[1]["records"][0]
    r["node"] = "h-kr"
    r["digest"] = record.digest_of(r)  # a careful forger: the next record still names the old digest
    (finding,) = _findings(segs)
    assert finding.startswith(
        "record 4 of segment audit-000000000001: it does not follow the record before it"
    )


def test_a_deleted_record_and_a_deleted_segment_are_named() -> None:
    segs = segments()
    del segs[1]["records"][1]  # record 4
    found = _findings(segs)
    assert "record 5 of segment audit-000000000001: it does not follow the record before it" in found[0]
    assert "record 5 of segment audit-000000000001: sequence number 5 where 4 was due" in found
    segs = segments()
    del segs[1]
    found = _findings(segs)
    assert found[0] == "segment audit-000000000002: segment 1 is missing (the next present is 2)"


def test_reordered_records_are_named() -> None:
    segs = segments()
    rs = segs[0]["records"]
    rs[0], rs[1] = rs[1], rs[0]
    found = _findings(segs)
    assert any(f.startswith("record 1 of segment audit-000000000000: it does not follow") for f in found)
    assert "record 1 of segment audit-000000000000: sequence number 1 where 0 was due" in found


def _later(first: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any]:
    return {**copy.deepcopy(first), "records": records}


@pytest.mark.parametrize(
    ("tamper", "named"),
    [
        ("edit", "record 3 of segment audit-000000000001 (later version v2): its digest is not"),
        ("remove", "record 4 of segment audit-000000000001 (later version v2): it does not follow"),
        ("reorder", "record 4 of segment audit-000000000001 (later version v2): it does not follow"),
    ],
)  # fmt: skip
def test_a_later_version_of_a_bucket_segment_edited_removed_or_reordered_is_named(tamper, named) -> None:
    """Object Lock keeps a segment's first version, which readers take; what a forger can do is
    write a later one. One that is not a whole chain from where the first began is named."""
    first = segments()[1]
    records = copy.deepcopy(first["records"])
    if tamper == "edit":
        records[0]["node"] = "h-kr"
    elif tamper == "remove":
        del records[0]
    else:
        records[0], records[1] = records[1], records[0]
    found = [str(f) for f in record.verify_rewrite(first, _later(first, records), "v2")]
    assert any(f.startswith(named) for f in found), found


def test_a_later_version_a_replica_wrote_after_losing_the_race_is_a_whole_chain_and_not_a_failure() -> None:
    segs = segments()
    first = segs[1]
    # The loser chained its own facts from the same head as the winner: after segment 0.
    losers, _ = record.chain(record.head_of(segs[:1]), [fact(40), fact(41)])
    assert record.verify_rewrite(first, _later(first, losers), "v2") == []
    # ...and a forger who recomputed every digest is not told from one: the first version stands.
    elsewhere = _later(first, losers)
    elsewhere["index"] = 2
    (finding,) = record.verify_rewrite(first, elsewhere, "v3")
    assert str(finding) == "segment audit-000000000001 (later version v3): it says it is segment 2"


def test_audit_verify_fails_on_a_forged_later_version_and_notes_a_losers(capsys) -> None:
    from sovereignspec.auditing import _rewrites

    segs = segments()
    first = segs[1]
    losers, _ = record.chain(record.head_of(segs[:1]), [fact(40)])
    edited = copy.deepcopy(first["records"])
    edited[1]["node"] = "h-kr"
    later = [
        ("audit-000000000001", "v2", _later(first, losers)),
        ("audit-000000000001", "v3", _later(first, edited)),
        ("audit-000000000001", "v4", {}),  # not JSON, or not an object
    ]
    failures = _rewrites(segs, later)
    assert failures == [
        "record 4 of segment audit-000000000001 (later version v3): its digest is not its content's: "
        "edited after it was written",
        "segment audit-000000000001 (later version v4): not a segment written by a replica",
    ]
    assert "segment audit-000000000001 has a later version v2: a replica that lost" in capsys.readouterr().out


def test_the_audit_verdict_names_unrecorded_workloads_and_bindings_outside_their_jurisdictions() -> None:
    segs = segments(2)
    outside_fact = {**fact(2, kind="binding"), "pod": {"namespace": "team-a", "name": "chat-2-x"},
                    "node": "h-kr", "nodeJurisdiction": "kr"}  # fmt: skip
    records, _ = record.chain(record.head_of(segs), [outside_fact])
    segs.append({"name": "audit-000000000001", "index": 1, "records": records})
    failures = audit_verify(segs, {"u0": "team-a/w0", "u1": "team-a/w1", "u9": "team-a/w9"})
    assert failures == [
        "admitted workload team-a/w9 (uid u9) has no decision record",
        "record 2: pod team-a/chat-2-x bound to node h-kr in kr, outside eu",
    ]


def test_export_as_json_lines_keeps_every_record_whole_and_csv_flattens_it() -> None:
    records = record.records_of(segments(3))
    lines = record.export(records, "jsonl").splitlines()
    assert [json.loads(x) for x in lines] == records
    rows = list(csv.DictReader(io.StringIO(record.export(records, "csv"))))
    assert [r["seq"] for r in rows] == ["0", "1", "2"]
    assert rows[0]["owner"] == "Job/chat-0" and rows[0]["jurisdictions"] == "eu" and rows[0]["node"] == "h-eu"
    assert rows[0]["digest"] == records[0]["digest"]


def test_where_finds_a_workload_by_its_own_name_or_its_owners() -> None:
    records = record.records_of(segments(3))
    assert [r["seq"] for r in record.where(records, "team-a", "chat-1")] == [1]
    assert [r["seq"] for r in record.where(records, "team-a", "job-chat-2")] == [2]
    assert record.where(records, "team-b", "chat-1") == []
    rogue = {
        "kind": "binding",
        "seq": 9,
        "pod": {"name": "rogue"},
        "workload": {"namespace": "team-a", "name": ""},
    }
    assert [r["seq"] for r in record.where([*records, rogue], "team-a", "rogue")] == [9]


# -- the facts a tick records ----------------------------------------------------------------------


def _world(pods: list[dict[str, Any]], kr_label: str = "kr") -> World:
    label = "node-restriction.kubernetes.io/jurisdiction"
    nodes = [
        {"metadata": {"name": "h-eu", "labels": {label: "eu", "kubernetes.io/hostname": "h-eu"}}},
        {"metadata": {"name": "h-kr", "labels": {label: kr_label, "kubernetes.io/hostname": "h-kr"}}},
    ]
    return World(
        [], nodes, {}, {"team-a": {"sovereignspec.io/jurisdiction": "eu"}}, pods, {}, {CHECK: policy()},
        policy_refs={CHECK: ("serving", 7)},
    )  # fmt: skip


def _pod(name: str, node: str, gpus: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}",
                     "ownerReferences": [{"kind": "Job", "name": "chat", "controller": True}]},
        "spec": {"nodeName": node,
                 "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": "Running", "startTime": "2026-12-06T00:59:00Z"},
    }  # fmt: skip


def test_a_decision_is_recorded_with_its_tenancy_its_node_and_that_nodes_jurisdiction() -> None:
    owner = [{"kind": "Job", "name": "chat", "controller": True}]
    workload = {
        "metadata": {"name": "job-chat-1a2b", "namespace": "team-a", "uid": "w1", "ownerReferences": owner}
    }
    updates = [{"name": "main", "annotations": {"sovereignspec.io/mode": "plain"}}]
    placed = Write("team-a/job-chat-1a2b", workload, CHECK, {}, "Ready", "placed on h-eu", updates,
                   outcome="placed", mode="plain", gamma=0, placed=("h-eu/gpu2",))  # fmt: skip
    waiting = Write(
        "team-a/x", workload, CHECK, {}, "Pending", "its owner is not cached yet", outcome="waiting"
    )
    (d,) = decision_facts([placed, waiting], _world([]), policy(), "op-0_abc", "2026-12-06T01:00:00Z")
    assert d["workload"] == {"namespace": "team-a", "name": "job-chat-1a2b", "uid": "w1",
                             "owner": {"kind": "Job", "name": "chat"}}  # fmt: skip
    assert (d["tenant"], d["jurisdictions"], d["jurisdictionsFrom"]) == (
        "team-a", ["eu"], "the namespace name",
    )  # fmt: skip
    assert (d["node"], d["gpus"], d["nodeJurisdiction"], d["mode"], d["gamma"]) == (
        "h-eu",
        ["h-eu/gpu2"],
        "eu",
        "plain",
        0,
    )
    assert (d["state"], d["replica"], d["check"]) == ("Ready", "op-0_abc", CHECK)
    assert (d["policy"], d["policyGeneration"]) == ("serving", 7)  # the rule it was decided under


def test_a_binding_is_recorded_once_and_again_when_its_nodes_jurisdiction_changes_under_it() -> None:
    seen: dict[Any, Any] = {}
    pods = [_pod("a", "h-eu"), _pod("b", "h-kr"), _pod("cpu", "h-eu", gpus="0")]
    first = binding_facts(_world(pods), policy(), "op", "t0", seen)
    assert [(f["pod"]["name"], f["node"], f["nodeJurisdiction"]) for f in first] == [
        ("a", "h-eu", "eu"),
        ("b", "h-kr", "kr"),
    ]
    assert first[0]["startedAt"] == "2026-12-06T00:59:00Z"  # the kubelet's start of the pod
    assert first[0]["workload"] == {
        "namespace": "team-a",
        "name": "chat",
        "owner": {"kind": "Job", "name": "chat"},
    }
    assert binding_facts(_world(pods), policy(), "op", "t1", seen) == []  # nothing new
    relabelled = binding_facts(_world(pods, kr_label="eu"), policy(), "op", "t2", seen)
    assert [(f["pod"]["name"], f["nodeJurisdiction"]) for f in relabelled] == [("b", "eu")]
    gone = binding_facts(_world([]), policy(), "op", "t3", seen)
    assert [(f["kind"], f["pod"]["name"], f["node"], f["phase"]) for f in gone] == [
        ("ended", "a", "h-eu", "Deleted"),
        ("ended", "b", "h-kr", "Deleted"),  # once, though seen under two labels
    ]
    assert seen == {} and binding_facts(_world([]), policy(), "op", "t4", seen) == []


def test_a_replica_that_starts_recording_goes_on_from_the_bindings_the_record_holds_open() -> None:
    # The last leader recorded a and b bound (b under two labels) and c bound and ended, then went
    # away; while none decided, b's pod ended. The next replica reads the open bindings from the
    # chain: b is recorded ended, once; a, still running, is not recorded bound again; c stays ended.
    pods = [_pod("a", "h-eu"), _pod("b", "h-kr"), _pod("c", "h-eu")]
    before: dict[Any, Any] = {}
    facts = binding_facts(_world(pods), policy(), "op-0", "t0", before)
    facts += binding_facts(_world(pods, kr_label="eu"), policy(), "op-0", "t1", before)
    facts += binding_facts(_world(pods[:2]), policy(), "op-0", "t2", before)
    assert [(f["kind"], f["pod"]["name"]) for f in facts][-1] == ("ended", "c")
    records, _ = record.chain(record.Head(), facts)
    carried = record.open_bindings(records)
    assert carried == before  # what the last replica held, from the chain alone
    later = binding_facts(_world(pods[:1]), policy(), "op-1", "t9", carried)
    assert [(f["kind"], f["pod"]["name"], f["node"], f["replica"]) for f in later] == [
        ("ended", "b", "h-kr", "op-1")
    ]
    assert record.open_bindings([*records, *later]) == carried  # a alone, still open


@pytest.mark.parametrize("first", ["write", "recall"])
def test_a_replica_reads_the_record_once_for_its_head_and_its_open_bindings_whichever_comes_first(
    first: str,
) -> None:
    store = _Counting()
    before: dict[Any, Any] = {}
    last = _log(store, "op-0")
    last.add(binding_facts(_world([_pod("a", "h-eu")]), policy(), "op-0", "t0", before))
    assert last.flush()
    store.lists = 0
    new = _log(store, "op-1")
    if first == "write":
        new.add([{"kind": "leader", "replica": "op-1"}])
        assert new.flush()
    assert new.recall() == before  # a's binding, open
    new.add([{"kind": "leader", "replica": "op-1", "again": True}])
    assert new.flush()
    assert store.lists == 1
    chained = record.records_of(new.read_segments())
    assert [r["seq"] for r in chained] == ([0, 1, 2] if first == "write" else [0, 1])


def test_a_pod_that_finishes_is_recorded_ended_with_its_containers_last_finish() -> None:
    seen: dict[Any, Any] = {}
    pod = _pod("a", "h-eu")
    binding_facts(_world([pod]), policy(), "op", "t0", seen)
    pod["status"] = {"phase": "Succeeded", "containerStatuses": [
        {"state": {"terminated": {"finishedAt": "2026-12-06T03:00:00Z"}}},
        {"state": {"terminated": {"finishedAt": "2026-12-06T03:00:05Z"}}},
    ]}  # fmt: skip
    (ended,) = binding_facts(_world([pod]), policy(), "op", "t1", seen)
    assert ended["kind"] == "ended" and ended["workload"]["owner"] == {"kind": "Job", "name": "chat"}
    assert (ended["phase"], ended["finishedAt"], ended["at"]) == ("Succeeded", "2026-12-06T03:00:05Z", "t1")
    assert record.outside([ended]) == []  # an end is not a binding outside its jurisdictions


def test_the_record_reads_a_pods_start_and_end_through_the_caches_cut_as_from_the_whole_pod() -> None:
    # What the operator holds of a pod is the informer's cut (strip_pod), not the pod: the times
    # the record names must survive it, and a cut pod must read exactly as the whole one.
    seen_whole: dict[Any, Any] = {}
    seen_cut: dict[Any, Any] = {}
    pod = _pod("a", "h-eu")
    pod["spec"]["containers"][0]["image"] = "vllm/vllm-openai"  # what the cut drops
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    whole = binding_facts(_world([pod]), policy(), "op", "t0", seen_whole)
    cut = binding_facts(_world([strip_pod(copy.deepcopy(pod))]), policy(), "op", "t0", seen_cut)
    assert cut == whole and cut[0]["startedAt"] == "2026-12-06T00:59:00Z"
    pod["status"] = {"phase": "Failed", "startTime": "2026-12-06T00:59:00Z", "containerStatuses": [
        {"name": "server", "state": {"terminated": {"finishedAt": "2026-12-06T03:00:05Z", "exitCode": 1}}},
        {"name": "side", "state": {"terminated": {"finishedAt": "2026-12-06T03:00:00Z"}}},
        {"name": "init", "state": {"running": {"startedAt": "2026-12-06T01:00:00Z"}}},
    ]}  # fmt: skip
    whole = binding_facts(_world([pod]), policy(), "op", "t1", seen_whole)
    cut = binding_facts(_world([strip_pod(copy.deepcopy(pod))]), policy(), "op", "t1", seen_cut)
    assert cut == whole
    ended = [(f["kind"], f["phase"], f["finishedAt"]) for f in cut]
    assert ended == [("ended", "Failed", "2026-12-06T03:00:05Z")]


def test_a_pod_that_cannot_be_read_is_skipped_alone_and_named() -> None:
    seen: dict[Any, Any] = {}
    errors: list[str] = []
    pods = [_pod("bad", "h-eu", gpus="lots"), _pod("a", "h-eu")]
    facts = binding_facts(_world(pods), policy(), "op", "t0", seen, errors)
    assert [f["pod"]["name"] for f in facts] == ["a"]
    assert len(errors) == 1 and errors[0].startswith("Pod team-a/bad: ")
    # A recorded pod that cannot be read now has not ended: nothing is said of it.
    pods[1]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "lots"
    assert binding_facts(_world(pods), policy(), "op", "t1", seen, []) == [] and len(seen) == 1


def test_the_record_fails_alone_its_failure_counted() -> None:
    from sovereignspec.operator.roles.audit import record_tick
    from sovereignspec.operator.runtime import metrics

    class Broken(Store):
        def list_cluster_custom_object(self, group: str, version: str, plural: str) -> dict[str, Any]:
            raise RuntimeError("a store that answers nonsense")

    log = _log(Broken())
    before = metrics.AUDIT_FAILURES._value.get()
    record_tick(log, [], _world([_pod("a", "h-eu")]), policy(), {})  # no exception escapes
    assert metrics.AUDIT_FAILURES._value.get() == before + 1 and len(log.backlog) == 1  # kept
    assert log.error == "RuntimeError: a store that answers nonsense"
    # A failure while building the facts (a world that cannot be read) is counted as the tick's.
    failures = metrics.TICK_FAILURES.labels(part="record")
    before = failures._value.get()
    record_tick(log, [], None, policy(), {})  # type: ignore[arg-type]
    assert failures._value.get() == before + 1


# -- the writer --------------------------------------------------------------------------------------


class Store:
    """The AuditSegment objects as the API server keeps them: names unique, creation refused as
    it refuses it (409 for a name taken, `fail` for anything else)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.fail: ApiException | None = None

    def list_cluster_custom_object(self, group: str, version: str, plural: str) -> dict[str, Any]:
        return {"items": [copy.deepcopy(o) for _, o in sorted(self.objects.items())]}

    def create_cluster_custom_object(
        self, group: str, version: str, plural: str, body: dict[str, Any]
    ) -> None:
        if self.fail is not None:
            raise self.fail
        name = body["metadata"]["name"]
        if name in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.objects[name] = copy.deepcopy(body)


class _Counting(Store):
    def __init__(self) -> None:
        super().__init__()
        self.lists = 0

    def list_cluster_custom_object(self, group: str, version: str, plural: str) -> dict[str, Any]:
        self.lists += 1
        return super().list_cluster_custom_object(group, version, plural)


def _log(store: Store, writer: str = "op-0") -> AuditLog:
    log = AuditLog.__new__(AuditLog)
    log.store, log.writer, log.head, log.backlog, log.written = ClusterStore(store), writer, None, [], 0
    log.off = log.error = log._opened = None
    return log


def test_records_wait_while_the_store_fails_and_are_written_in_order_when_it_returns() -> None:
    store = Store()
    log = _log(store)
    log.add([fact(0)])
    assert log.flush()
    store.fail = ApiException(status=503, reason="ServiceUnavailable")
    log.add([fact(1)])
    assert not log.flush() and len(log.backlog) == 1
    log.add([fact(2)])
    store.fail = None
    assert log.flush() and log.backlog == []
    segs = log.read_segments()
    assert record.verify(segs) == [] and [r["workload"]["uid"] for r in record.records_of(segs)] == [
        "u0",
        "u1",
        "u2",
    ]


def test_a_long_backlog_is_written_in_segments_that_fit_an_object() -> None:
    store = Store()
    log = _log(store)
    log.add([fact(i % 600) for i in range(2 * SEGMENT_RECORDS + 5)])
    assert log.flush()
    segs = log.read_segments()
    assert [s["count"] for s in segs] == [SEGMENT_RECORDS, SEGMENT_RECORDS, 5] and record.verify(segs) == []


def test_a_segment_another_replica_wrote_first_is_followed_never_forked() -> None:
    store = Store()
    old, new = _log(store, "op-0"), _log(store, "op-1")
    old.add([fact(0)])
    assert old.flush()  # the old leader's head: segment 1 next
    new.add([fact(1)])
    assert new.flush()  # the new leader wrote segment 1
    old.add([fact(2)])  # the old leader, resumed from a pause, still thinks segment 1 is next
    assert old.flush()
    segs = old.read_segments()
    assert record.verify(segs) == []
    assert [(s["index"], s["writer"]) for s in segs] == [(0, "op-0"), (1, "op-1"), (2, "op-0")]


@pytest.mark.parametrize(("status", "said"), [(404, "AuditSegment CRD"), (403, "role may not create")])
def test_without_the_crd_or_the_rbac_the_record_is_off_and_said_so_and_nothing_piles_up(status, said) -> None:
    store = Store()
    store.fail = ApiException(status=status, reason="NotFound")
    log = _log(store)
    log.add([fact(0)])
    assert not log.flush() and log.off is not None and said in log.off
    log.add([fact(1)])
    assert log.backlog == []
    assert log.flush() and log.off is not None  # nothing written: still off, nothing tried again


def test_a_broken_last_record_holds_placements_naming_it_and_an_empty_last_segment_is_skipped() -> None:
    store = Store()
    log = _log(store)
    log.add([fact(0), fact(1)])
    assert log.flush()
    # An empty segment written by hand after it: the chain goes on from record 1, unbroken.
    store.objects["audit-000000000001"] = {
        "spec": {"index": 1, "records": []},
        "metadata": {"name": "audit-000000000001"},
    }
    fresh = _log(store)
    fresh.add([fact(2)])
    assert fresh.flush()
    segs = fresh.read_segments()
    assert record.verify(segs) == [] and record.head_of(segs).seq == 3
    # A last record with no sequence number: placements wait, naming it; nothing is written on top.
    store.objects["audit-000000000003"] = {"spec": {"index": 3, "records": [{"kind": "junk"}]},
                                           "metadata": {"name": "audit-000000000003"}}  # fmt: skip
    (w, *_) = ahead(_log(store), _decisions(), _world([]), policy())
    assert w.state == "Retry" and "the record's head cannot be read: the last record of segment" in w.message
    assert len(store.objects) == 4


# -- audit.required: the record written ahead of the decision -------------------------------------


def _decisions() -> list[Write]:
    def one(name: str, state: str, outcome: str) -> Write:
        workload = {"metadata": {"name": name, "namespace": "team-a", "uid": f"u-{name}"}}
        placed = outcome == "placed"
        return Write(f"team-a/{name}", workload, CHECK, {"retryCount": 1}, state, f"{name} decided",
                     [{"name": "main"}] if placed else None, outcome=outcome,
                     placed=("h-eu/gpu0",) if placed else ())  # fmt: skip

    waiting = Write("team-a/w", {"metadata": {"name": "w"}}, CHECK, {}, "Pending", "owner", outcome="waiting")
    return [
        one("a", "Ready", "placed"),
        waiting,
        one("r", "Rejected", "rejected"),
        one("b", "Ready", "placed"),
    ]


def _uids(log: AuditLog) -> list[str]:
    return [r["workload"]["uid"] for r in record.records_of(log.read_segments())]


def test_a_placement_is_written_only_after_its_record_is_in_the_store_and_is_not_recorded_twice() -> None:
    log = _log(Store())
    log.add([fact(0, kind="binding")])  # an older record waiting: it stays first
    out = ahead(log, _decisions(), _world([]), policy())
    assert [(w.state, w.recorded) for w in out] == [
        ("Ready", True), ("Pending", False), ("Rejected", True), ("Ready", True),
    ]  # fmt: skip
    assert _uids(log) == ["u0", "u-a", "u-r", "u-b"] and log.backlog == []
    assert decision_facts(out, _world([]), policy(), "op-0", "t") == []  # after the tick: nothing again


def test_a_placement_whose_record_cannot_be_written_waits_saying_why_and_other_decisions_go_on() -> None:
    from sovereignspec.operator.runtime import metrics

    store = Store()
    store.fail = ApiException(status=503, reason="ServiceUnavailable")
    log = _log(store)
    held_before = metrics.AUDIT_HELD._value.get()
    out = ahead(log, _decisions(), _world([]), policy())
    a, waiting, rejected, b = out
    for w in (a, b):
        assert (w.state, w.outcome, w.pod_set_updates, w.requeue_after) == (
            "Retry",
            "retry",
            None,
            2 * policy().retry.base_seconds,
        )
        assert "waiting for the sovereignty record (audit.required): 503 ServiceUnavailable" in w.message
        assert [(e.reason, e.warning) for e in w.events] == [("RecordUnavailable", True)]
    assert (rejected.state, rejected.recorded, waiting.state) == ("Rejected", True, "Pending")
    assert metrics.AUDIT_HELD._value.get() == held_before + 2
    # The Rejection's record waits; the held placements' records are dropped (decided again).
    assert [f["workload"]["uid"] for f in log.backlog] == ["u-r"]
    store.fail = None
    assert log.flush() and _uids(log) == ["u-r"]


def test_a_record_not_installed_holds_nothing_is_said_and_comes_back_once_it_is_installed() -> None:
    """An operator newer than its chart (the AuditSegment CRD or its RBAC missing): decisions go on,
    the record is off and says so (log, sovereignspec_audit_off), and is on again once installed."""
    from sovereignspec.operator.runtime import metrics

    store = Store()
    store.fail = ApiException(status=404, reason="NotFound")
    log = _log(store)
    out = ahead(log, _decisions(), _world([]), policy())
    assert [w.state for w in out] == ["Ready", "Pending", "Rejected", "Ready"]
    assert log.off is not None and "the AuditSegment CRD is not installed" in log.off and log.backlog == []
    assert metrics.AUDIT_OFF._value.get() == 1
    store.fail = None  # the chart upgraded
    out = ahead(log, _decisions(), _world([]), policy())
    assert [w.state for w in out] == ["Ready", "Pending", "Rejected", "Ready"] and log.off is None
    assert _uids(log) == ["u-a", "u-r", "u-b"] and metrics.AUDIT_OFF._value.get() == 0


def test_a_store_that_fails_mid_backlog_holds_every_placement_behind_the_failure() -> None:
    class FailsSecond(Store):
        def create_cluster_custom_object(self, group: str, version: str, plural: str, body: Any) -> None:
            if self.objects:
                raise ApiException(status=500, reason="InternalError")
            super().create_cluster_custom_object(group, version, plural, body)

    log = _log(FailsSecond())
    log.add([fact(i) for i in range(SEGMENT_RECORDS + 1)])  # one segment is written, then a failure
    out = ahead(log, _decisions(), _world([]), policy())
    assert [w.state for w in out] == ["Retry", "Pending", "Rejected", "Retry"]
    assert [f["workload"]["uid"] for f in log.backlog] == [f"u{SEGMENT_RECORDS}", "u-r"]


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_an_empty_record_exports_to_an_empty_document(fmt: str) -> None:
    assert record.export([], fmt) in ("", ",".join(record.EXPORT_FIELDS) + "\n")


def test_audit_where_says_where_a_workload_was_decided_bound_and_left() -> None:
    from sovereignspec.auditing import _describe

    decision = {**fact(1), "seq": 4, "outcome": "placed"}
    binding = {"kind": "binding", "at": "t1", "seq": 5, "pod": {"name": "chat-1-x"}, "node": "h-eu",
               "nodeJurisdiction": "eu", "jurisdictions": ["eu"], "replica": "op-0"}  # fmt: skip
    ended = {"kind": "ended", "at": "t2", "seq": 9, "pod": {"name": "chat-1-x"}, "node": "h-eu",
             "phase": "Failed", "finishedAt": "t1b", "replica": "op-1"}  # fmt: skip
    assert [_describe(r) for r in (decision, binding, ended)] == [
        "2026-12-06T01:00:01Z  #4 job-chat-1: Ready (placed) on h-eu (eu), speculative γ=3, check "
        f"{CHECK}, decided by op-0_abc",
        "t1  #5 pod chat-1-x bound to h-eu (eu; allowed: eu) seen by op-0",
        "t2  #9 pod chat-1-x left h-eu: Failed, its containers finished at t1b, seen by op-1",
    ]


def test_a_decision_recorded_ahead_whose_write_the_api_refused_is_recorded_as_not_written() -> None:
    from sovereignspec.auditing import _describe

    log = _log(Store())
    a, _, rejected, b = ahead(log, _decisions(), _world([]), policy())
    a.written, rejected.written, b.written = "conflict", "rejected", "placed"  # as _carry_out sets them
    (unwritten,) = decision_facts([a, rejected, b], _world([]), policy(), "op-0", "t9")
    assert (unwritten["kind"], unwritten["workload"]["uid"], unwritten["reason"]) == (
        "unwritten",
        "u-a",
        "conflict",
    )
    assert "the decision recorded before it was not written (conflict" in _describe({**unwritten, "seq": 7})


def test_the_dispatcher_records_its_nominations_and_the_worker_that_admitted_once() -> None:
    from sovereignspec.auditing import _describe
    from sovereignspec.operator.roles.dispatch_record import admission_facts, dispatch_facts

    wl = {"metadata": {"name": "job-chat-1", "namespace": "team-a", "uid": "w1"}, "status": {}}
    places = {"worker-eu": "eu", "worker-kr": "kr"}
    namespaces = {"team-a": {"sovereignspec.io/jurisdiction": "eu"}}
    (d,) = dispatch_facts(
        [(wl, CHECK, "Ready", "nominate", ("worker-eu",))], places, namespaces, policy(), "d-0", "t0"
    )
    assert (d["kind"], d["nominated"], d["workerJurisdictions"], d["jurisdictions"]) == (
        "dispatch", ["worker-eu"], {"worker-eu": "eu"}, ["eu"],
    )  # fmt: skip
    assert (
        _describe({**d, "seq": 0})
        == "t0  #0 job-chat-1: Ready (nominate), nominated worker-eu (eu), dispatched by d-0"
    )
    seen: set[tuple[str, str]] = set()
    assert admission_facts([wl], places, namespaces, policy(), "d-0", "t1", seen) == []  # not admitted yet
    wl["status"] = {"clusterName": "worker-kr"}  # admitted by a worker its tenant may not use
    (a,) = admission_facts([wl], places, namespaces, policy(), "d-0", "t1", seen)
    assert (a["kind"], a["worker"], a["workerJurisdiction"]) == ("admission", "worker-kr", "kr")
    assert admission_facts([wl], places, namespaces, policy(), "d-0", "t2", seen) == []  # once
    records, _ = record.chain(record.Head(), [d, a])
    failures = audit_verify([{"name": "audit-000000000000", "index": 0, "records": records}], {})
    assert failures == [
        "record 1: workload team-a/job-chat-1 admitted by worker cluster worker-kr in kr, outside eu"
    ]


def _dispatches() -> list[Any]:
    from sovereignspec.operator.roles.dispatch_record import Decision

    def one(name: str, state: str, outcome: str, nominated: tuple[str, ...] | None) -> Decision:
        wl = {"metadata": {"name": name, "namespace": "team-a", "uid": f"u-{name}"}, "status": {}}
        event = ("Dispatched", "to worker-eu", False) if outcome == "nominate" else None
        return Decision(wl, CHECK, {"name": CHECK}, state, f"{name} decided", nominated, event, outcome)

    return [
        one("a", "Ready", "nominate", ("worker-eu",)),
        one("w", "Pending", "wait", None),
        one("r", "Rejected", "reject", None),
    ]


def test_the_dispatchers_nominations_are_recorded_before_they_are_written_or_held_saying_why() -> None:
    from sovereignspec.operator.roles.dispatch_record import ahead as dispatch_ahead
    from sovereignspec.operator.roles.dispatch_record import unwritten_facts

    places, namespaces = {"worker-eu": "eu"}, {"team-a": {"sovereignspec.io/jurisdiction": "eu"}}
    log = _log(Store())
    out = dispatch_ahead(log, _dispatches(), places, namespaces, policy(), "t0")
    assert [(d.state, d.outcome, d.recorded) for d in out] == [
        ("Ready", "nominate", True), ("Pending", "wait", False), ("Rejected", "reject", True),
    ]  # fmt: skip
    assert _uids(log) == ["u-a", "u-r"] and log.backlog == []
    # Recorded ahead, then refused by the API server (a conflict): said in the record.
    (u,) = unwritten_facts([(out[0], "conflict")], "d-0", "t1")
    assert (u["kind"], u["workload"]["uid"], u["reason"]) == ("unwritten", "u-a", "conflict")

    store = Store()
    store.fail = ApiException(status=503, reason="ServiceUnavailable")
    failing = _log(store)
    a, _, r = dispatch_ahead(failing, _dispatches(), places, namespaces, policy(), "t0")
    # The nomination waits (Pending: MultiKueue dispatches only what all checks call Ready), naming
    # the store's refusal; the rejection, which sends nothing anywhere, goes on and its record waits.
    assert (a.state, a.outcome, a.nominated, a.recorded) == ("Pending", "wait", None, False)
    assert a.message == "waiting for the sovereignty record (audit.required): 503 ServiceUnavailable"
    assert a.event == ("RecordUnavailable", a.message, True)
    assert (r.state, r.recorded) == ("Rejected", True)
    assert [f["workload"]["uid"] for f in failing.backlog] == ["u-r"]


def test_the_decision_events_text_gives_each_figure_and_says_n_a_for_what_was_not_known() -> None:
    from sovereignspec.core.decision import DecisionRecord
    from sovereignspec.operator.decision.plan import record_text

    r = DecisionRecord(
        "w", "t", "admitted", "speculative", 3, "maximises the GPU's token rate", node="h1", gpu_index=0,
        gpu_type="H100-SXM", alpha=0.8, speedup=2.345, tau=3.1, step_plain_ms=10.0, step_ms=12.5,
        tpot_ms=4.03, background_seqs=12.34, candidates=4,
    )  # fmt: skip
    text = record_text(r, "declared")
    said = (
        "S_real=2.35", "τ=3.10", "α=0.80 (declared)", "≈ 12.3 seqs", "step 10.00→12.50 ms", "TPOT 4.03 ms",
        "headroom=n/a", "aggregate=n/a", "(unconstrained n/a)", "candidates=4",
    )  # fmt: skip
    for part in said:
        assert part in text, (part, text)
    assert "None" not in text
    known = record_text(dataclasses.replace(r, unconstrained_gamma=5), "declared")
    assert "speculative γ*=3 (unconstrained 5) " in known, known  # a draft length: a whole number
