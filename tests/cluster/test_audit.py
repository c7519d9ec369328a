"""The sovereignty record on the real control plane (issue 46): the operator, as its own
least-privilege user, records every decision and every GPU pod's binding in AuditSegment objects;
`sovereignspec audit verify / where / export`, run as an administrator would, read them back; a
binding outside its namespace's jurisdictions and a record edited in the cluster are named."""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from localdev import controlplane
from tests.cluster.auditing import audit, mine
from tests.cluster.operator_env import (
    admitted_job,
    decided,
    event,
    make_pool,
    our_entry,
    submit,
    workload_of,
)
from tests.waiting import wait_until

CHAT = {"model": "llama-3.1-8b", "drafter": "eagle3", "acceptance_rate": 0.8, "latency_class": "latency"}
GROUP, VERSION, PLURAL = "sovereignspec.io", "v1alpha1", "auditsegments"


def test_decisions_and_bindings_are_recorded_and_the_audit_commands_read_them_back(env, namespace) -> None:
    core = client.CoreV1Api(env.api)
    core.patch_namespace(namespace, {"metadata": {"labels": {"sovereignspec.io/jurisdiction": "eu"}}})
    pool = make_pool(env, namespace, [("H100-SXM", "eu", 4, [0.95] * 4), ("H100-SXM", "kr", 4, [0.95] * 4)])
    eu_node, kr_node = list(pool.nodes)
    jobs = ["chat-a", "chat-b", "chat-c"]
    for job in jobs:
        submit(pool, job, **CHAT)
    uids = {}
    for job in jobs:
        wl = decided(pool, job)
        assert our_entry(pool, wl)["state"] == "Ready"
        uids[job] = wl["metadata"]["uid"]

    def recorded() -> str | None:
        done = audit("export", "--namespace", namespace, "--format", "jsonl")
        records = [json.loads(x) for x in done.stdout.splitlines()]
        seen = {r["workload"]["uid"] for r in records if r["kind"] == "decision"}
        return done.stdout if set(uids.values()) <= seen else None

    records = [
        json.loads(x)
        for x in wait_until(recorded, timeout=60, what="the decisions in the record").splitlines()
    ]
    for r in [r for r in records if r["kind"] == "decision"]:  # an `unwritten` one may follow a conflict
        assert r["tenant"] == namespace and r["jurisdictions"] == ["eu"] and r["nodeJurisdiction"] == "eu", (
            json.dumps(r)
        )
        assert r["node"] == eu_node and r["gpus"][0].startswith(f"{eu_node}/gpu") and r["replica"], r
    verified = audit("verify")
    assert mine(verified.stdout, namespace) == [], verified.stdout + verified.stderr
    where = audit("where", f"{namespace}/chat-b")
    assert where.returncode == 0 and f"on {eu_node} (eu)" in where.stdout, where.stdout
    csv_out = audit("export", "--namespace", namespace, "--format", "csv").stdout.splitlines()
    assert csv_out[0].startswith("seq,at,kind,namespace,workload,owner") and len(csv_out) == 1 + len(records)

    # A GPU pod bound by hand to the kr node (no queue name, no scheduler): its binding is recorded
    # and `verify` names it.
    pod = {
        "metadata": {"name": "rogue", "namespace": namespace},
        "spec": {"nodeName": kr_node, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip
    core.create_namespaced_pod(namespace, pod)

    def named() -> str | None:
        out = audit("verify")
        lines = [line for line in mine(out.stdout, namespace) if "rogue" in line]
        return lines[0] if out.returncode == 1 and lines else None

    line = wait_until(named, timeout=60, what="the rogue binding named by audit verify")
    assert f"pod {namespace}/rogue bound to node {kr_node} in kr, outside eu" in line, line
    where = audit("where", f"{namespace}/rogue")  # a pod of no owner: found by its own name
    assert where.returncode == 0 and f"pod rogue bound to {kr_node} (kr; allowed: eu)" in where.stdout, (
        where.stdout
    )

    # An administrator edits a record in place: `verify` names the record and its segment.
    objects = client.CustomObjectsApi(env.api)
    segments = objects.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    target = next(
        s for s in segments
        if any((r.get("workload") or {}).get("uid") == uids["chat-a"] for r in s["spec"]["records"])
    )  # fmt: skip
    original: list[dict[str, Any]] = target["spec"]["records"]
    edited = json.loads(json.dumps(original))
    index = next(i for i, r in enumerate(edited) if (r.get("workload") or {}).get("uid") == uids["chat-a"])
    edited[index]["node"] = kr_node
    name = target["metadata"]["name"]
    objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {"spec": {"records": edited}})
    try:
        out = audit("verify")
        seq = edited[index]["seq"]
        assert out.returncode == 1, out.stdout
        expected = (
            f"record {seq} of segment {name}: its digest is not its content's: edited after it was written"
        )
        assert expected in out.stdout, out.stdout
    finally:  # the cluster's one record, as it was, for whatever runs next
        objects.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, {"spec": {"records": original}})
        core.delete_namespaced_pod("rogue", namespace, grace_period_seconds=0)
    assert "edited after it was written" not in audit("verify").stdout

    # The rogue pod deleted: its end is recorded (once).
    def ended() -> list[dict[str, Any]] | None:
        out = audit("export", "--namespace", namespace, "--format", "jsonl").stdout.splitlines()
        found = [r for r in map(json.loads, out) if r["kind"] == "ended" and r["pod"]["name"] == "rogue"]
        return found or None

    (end,) = wait_until(ended, timeout=60, what="the rogue pod's end in the record")
    assert (end["node"], end["nodeJurisdiction"], end["phase"]) == (kr_node, "kr", "Deleted"), end

    # A GPU pod that finishes (its status written as a kubelet writes it: these nodes have none) is
    # recorded ended as it ended, with its containers' last finish, not as deleted: the operator's
    # cache keeps ended pods (a watch filtered by phase would see it only leave).
    done = {
        "metadata": {"name": "finishes", "namespace": namespace},
        "spec": {"nodeName": eu_node, "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }  # fmt: skip
    core.create_namespaced_pod(namespace, done)

    def recorded_of(kind: str, name: str) -> list[dict[str, Any]] | None:
        out = audit("export", "--namespace", namespace, "--format", "jsonl").stdout.splitlines()
        found = [r for r in map(json.loads, out) if r["kind"] == kind and r["pod"]["name"] == name]
        return found or None

    wait_until(lambda: recorded_of("binding", "finishes"), timeout=60, what="the finishing pod's binding")
    finished_at = "2026-12-07T12:00:05Z"
    terminated = {"exitCode": 0, "reason": "Completed", "startedAt": "2026-12-07T12:00:00Z",
                  "finishedAt": finished_at}  # fmt: skip
    status = {"name": "c", "image": "registry.k8s.io/pause:3.10", "imageID": "", "ready": False,
              "restartCount": 0, "state": {"terminated": terminated}}  # fmt: skip
    core.patch_namespaced_pod_status("finishes", namespace, {"status": {
        "phase": "Succeeded", "startTime": "2026-12-07T12:00:00Z", "containerStatuses": [status],
    }})  # fmt: skip
    (end,) = wait_until(lambda: recorded_of("ended", "finishes"), timeout=60, what="the finished pod's end")
    assert (end["node"], end["phase"], end.get("finishedAt")) == (eu_node, "Succeeded", finished_at), end
    core.delete_namespaced_pod("finishes", namespace, grace_period_seconds=0)


STORE_DOWN = "the record's store is down (a test's admission policy)"


def _store_refused(api: client.ApiClient) -> bool:
    """Whether creating an AuditSegment is refused now (a dry run: admission runs, nothing is kept)."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AuditSegment", "metadata": {"name": "audit-probe"},
            "spec": {"index": 0, "first": 0, "count": 0, "writer": "probe", "records": []}}  # fmt: skip
    try:
        client.CustomObjectsApi(api).create_cluster_custom_object(GROUP, VERSION, PLURAL, body, dry_run="All")
    except client.ApiException as exc:
        return STORE_DOWN in (exc.body or "")
    return False


def test_a_placement_waits_while_its_record_cannot_be_written_and_is_placed_and_recorded_after(
    env, namespace
) -> None:
    """audit.required (the default): the record of a placement is persisted before the placement is
    written. With the store refusing (a real admission policy refusing AuditSegments), the
    workload is not admitted: Retry, naming the refusal; once the store takes records again it is
    placed, and its decision is in the record."""
    name = f"audit-down-{namespace[-6:]}"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{"apiGroups": [GROUP], "apiVersions": [VERSION],
                                      "operations": ["CREATE"], "resources": [PLURAL]}]},
                 "validations": [{"expression": "false", "message": STORE_DOWN}]},
    }  # fmt: skip
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"]},
    }  # fmt: skip
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": [policy, binding]})
    applied = controlplane.kubectl("apply", "-f", "-", stdin=manifest)
    assert applied.returncode == 0, applied.stderr
    try:
        wait_until(lambda: _store_refused(env.api), timeout=30, what="the store refusing records")
        pool = make_pool(env, namespace, [("H100-SXM", "eu", 2, [0.95] * 2)])
        submit(pool, "held", **CHAT)
        entry = our_entry(pool, decided(pool, "held"))
        assert entry["state"] == "Retry" or entry["message"].endswith("Previously: Retry"), entry
        message = event(pool, "RecordUnavailable", timeout=30).message
        assert "waiting for the sovereignty record (audit.required)" in message, message
        assert STORE_DOWN in message, message
        batch = client.BatchV1Api(env.api)
        assert batch.read_namespaced_job("held", namespace).spec.suspend is True  # nothing ran
    finally:
        controlplane.kubectl("delete", "-f", "-", "--ignore-not-found", stdin=manifest)
    wait_until(lambda: not _store_refused(env.api), timeout=30, what="the store taking records again")
    admitted_job(pool, "held", timeout=180)  # after Kueue's requeue backoff
    uid = workload_of(pool, "held")["metadata"]["uid"]
    done = audit("export", "--namespace", namespace, "--format", "jsonl")
    decisions = [
        r for r in map(json.loads, done.stdout.splitlines())
        if r["kind"] == "decision" and r["workload"].get("uid") == uid
    ]  # fmt: skip
    assert [r["state"] for r in decisions][-1] == "Ready", decisions
