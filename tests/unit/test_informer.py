"""The watch-fed cache's own rules, on events as the API server sends them (no server: the store's
logic only; tests/cluster/test_watch_cache.py runs it against a real one)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client

from sovereignspec.operator.border.cuts import strip_pod, strip_queued_pod, strip_statefulset
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.world import World
from sovereignspec.operator.decision.view import build
from sovereignspec.operator.runtime.informer import GoneError, Informer, _lines
from sovereignspec.profiles import load_profiles
from sovereignspec.telemetry.snapshot import Snapshot


def obj(name: str, rv: int, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}, **extra}


@pytest.fixture
def informer() -> Informer:
    woken: list[str] = []
    i = Informer(client.ApiClient(), "/apis/x/v1/things", "things", wake=lambda kind, _o: kind != "BOOKMARK")
    i.on_wake = lambda: woken.append("tick")
    i.woken = woken  # type: ignore[attr-defined]
    return i


def test_a_watch_event_older_than_our_own_write_does_not_replace_it(informer):
    informer.put(obj("a", 105, status={"admissionChecks": [{"name": "c", "state": "Ready"}]}))
    informer._event({"type": "MODIFIED", "object": obj("a", 100, status={"admissionChecks": []})})
    assert informer.get("ns/a")["metadata"]["resourceVersion"] == "105"
    informer._event({"type": "MODIFIED", "object": obj("a", 107)})
    assert informer.get("ns/a")["metadata"]["resourceVersion"] == "107"


def test_a_write_older_than_what_the_watch_brought_is_not_stored(informer):
    informer._event({"type": "ADDED", "object": obj("a", 110)})
    informer.put(obj("a", 108))
    assert informer.get("ns/a")["metadata"]["resourceVersion"] == "110"


def test_deleted_objects_leave_the_cache_and_wake_the_loop(informer):
    informer._event({"type": "ADDED", "object": obj("a", 1)})
    informer._event({"type": "DELETED", "object": obj("a", 2)})
    assert informer.get("ns/a") is None and informer.items() == []
    assert informer.woken == ["tick", "tick"]


def test_a_bookmark_moves_the_resume_point_and_wakes_nothing(informer):
    informer._event({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "900"}}})
    assert informer._rv == "900" and informer.woken == [] and informer.items() == []


def test_an_expired_resource_version_asks_for_a_list_and_other_errors_fail_the_watch(informer):
    with pytest.raises(GoneError):
        informer._event({"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}})
    with pytest.raises(ValueError, match="internal error"):
        informer._event({"type": "ERROR", "object": {"code": 500, "message": "internal error"}})


def test_managed_fields_are_not_kept(informer):
    body = obj("a", 3)
    body["metadata"]["managedFields"] = [{"manager": "kueue"}]
    informer._event({"type": "ADDED", "object": body})
    assert "managedFields" not in informer.get("ns/a")["metadata"]


class Chunks:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def stream(self, _amt: int, decode_content: bool = False) -> Any:
        return iter(self.chunks)


def test_watch_lines_are_split_across_chunk_boundaries():
    chunks = [b'{"type":"ADD', b'ED"}\n{"type":"MODIFIED"}\n{"ty', b'pe":"DELETED"}\n', b"\n"]
    assert list(_lines(Chunks(chunks))) == [
        b'{"type":"ADDED"}',
        b'{"type":"MODIFIED"}',
        b'{"type":"DELETED"}',
    ]


def test_a_stripped_pod_holds_the_ledger_as_the_whole_pod_does():
    """The Pods cache keeps only what the ledger reads; the view built from it is the same."""
    profiles = load_profiles(None)
    node = {
        "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "other-tenant",
            "uid": "u1",
            "resourceVersion": "5",
            "labels": {"app": "x"},
            "annotations": {"big": "x" * 1000},
            "ownerReferences": [{"kind": "Job", "name": "j"}],
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {
            "nodeName": "n1",
            "volumes": [{"name": "v"}],
            "containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.1"},
    }
    spec = PolicySpec()

    def free(pods: list[dict[str, Any]]) -> tuple[int, frozenset[str]]:
        world = World([], [node], {}, pods=pods)
        n = build(world, {"c"}, spec, profiles, Snapshot(fetched_at=0.0), 0.0).cluster.nodes[0]
        return n.free_gpus, n.tenants

    assert free([strip_pod(pod)]) == free([pod]) == (5, frozenset({"other-tenant"}))


FLOOD = "x" * 250 * 1024  # one tenant's 250 KiB annotation


def _flooded(w: dict[str, Any]) -> dict[str, Any]:
    """`w` with what a tenant can grow at will: foreign annotations, env, volumes, another check's
    podSetUpdates, on top of everything decisions read."""
    w["metadata"]["annotations"] = {"team.example.com/blob": FLOOD}
    w["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": FLOOD}}]
    tpl = w["spec"]["podSets"][0]["template"]
    tpl["metadata"]["annotations"]["team.example.com/blob"] = FLOOD
    tpl["metadata"]["labels"] = {"app": "chat"}
    tpl["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "h1"}
    tpl["spec"]["tolerations"] = [{"key": "gpu", "operator": "Exists"}]
    tpl["spec"]["volumes"] = [{"name": "v", "configMap": {"name": FLOOD[:200]}}]
    tpl["spec"]["containers"][0]["env"] = [{"name": "BLOB", "value": FLOOD}]
    w["status"]["admissionChecks"].append(
        {
            "name": "other-check",
            "state": "Ready",
            "podSetUpdates": [{"name": "main", "annotations": {"o": FLOOD}}],
        }
    )
    return w


def test_a_stripped_workload_is_decided_as_the_whole_one_and_holds_none_of_the_flood():
    from sovereignspec.operator.border.cuts import strip_workload
    from sovereignspec.operator.decision.plan import plan
    from tests.unit.builders import CHECK, NOW, STAMP, chat, node, policy, snapshot, world

    ready = chat("running").check(
        "Ready",
        podSetUpdates=[
            {
                "name": "main",
                "nodeSelector": {"kubernetes.io/hostname": "h1"},
                "annotations": {"sovereignspec.io/mode": "plain", "sovereignspec.io/gpu-index": "1"},
            }
        ],
    )
    raw = [
        _flooded(chat("a").obj()),
        _flooded(chat("b").annotate(model="x" * 5000).obj()),
        _flooded(ready.obj()),
    ]
    stripped = [strip_workload(json.loads(json.dumps(w))) for w in raw]
    assert all(len(json.dumps(w)) > 500_000 for w in raw)
    assert all(len(json.dumps(w)) < 4_000 for w in stripped)
    profiles, spec = load_profiles(None), policy()

    def decide(workloads: list[dict[str, Any]]) -> dict[str, tuple[str, str, Any]]:
        view = build(world(workloads, [node("h1")], spec), {CHECK}, spec, profiles, snapshot({}), NOW)
        writes = plan("default", spec, view, profiles, STAMP)
        return {w.key: (w.state, w.message, w.pod_set_updates) for w in writes}

    whole, kept = decide(raw), decide(stripped)
    assert {k: v[0] for k, v in kept.items()} == {"team-a/a": "Ready", "team-a/b": "Rejected"}
    message = kept["team-a/b"][1]
    assert "sovereignspec.io/model: got '5000 bytes'; accepted: a value of at most 4096 bytes" in message
    assert kept["team-a/a"] == whole["team-a/a"]  # the same decision, beside the running one


def test_a_template_with_more_of_our_keys_than_the_bound_is_refused_by_name():
    from sovereignspec.operator.border import annotations as ann
    from sovereignspec.operator.border.cuts import ours

    notes = {f"sovereignspec.io/k{i}": "v" for i in range(ann.MAX_OUR_KEYS + 6)}
    kept = ours({**notes, "other.io/x": "y"})
    assert len(kept) == ann.MAX_OUR_KEYS + 1 and kept[ann.TOO_MANY_KEYS] == str(ann.MAX_OUR_KEYS + 6)
    declared = ann.parse(kept, "team-a", {"llama-3.1-8b"}, {"eagle3"})
    (problem,) = [p for p in declared.problems if p.field == "*"]
    assert problem.sovereignty and "70 keys" in str(problem) and "at most 64" in str(problem)


def test_a_queued_pods_cached_metadata_holds_only_our_keys_bounded() -> None:
    from sovereignspec.operator.border import annotations as ann

    pod = {
        "metadata": {
            "name": "chat-1",
            "namespace": "team-a",
            "annotations": {ann.PREFIX + "model": "llama-3.1-8b", "big": "x" * 100_000},
            "labels": {"kueue.x-k8s.io/queue-name": "serving", ann.PREFIX + "drafter": "eagle3"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"containers": [{"name": "server", "image": "vllm"}]},
    }
    kept = strip_queued_pod(pod)
    assert kept["metadata"] == {
        "name": "chat-1",
        "namespace": "team-a",
        "annotations": {ann.PREFIX + "model": "llama-3.1-8b"},
        "labels": {ann.PREFIX + "drafter": "eagle3"},  # read only to say it is misplaced
    }
    assert "spec" not in kept


@pytest.mark.parametrize("where", ["labels", "annotations"])
def test_a_stripped_pod_keeps_the_workload_kueue_built_for_its_group(where: str) -> None:
    # Kueue names a group's Workload in a label, or in an annotation under a feature gate.
    from sovereignspec.operator.border import annotations as ann

    pod = {
        "metadata": {
            "name": "chat-0",
            "namespace": "team-a",
            where: {ann.KUEUE_PREBUILT: "lws-chat-0", "x": "y"},
        },
        "spec": {"nodeName": "n1", "containers": []},
    }
    assert strip_pod(pod)["metadata"]["labels"] == {ann.KUEUE_PREBUILT: "lws-chat-0"}


def test_a_statefulsets_cached_object_holds_only_our_keys_of_its_template_and_its_own_annotations() -> None:
    from sovereignspec.operator.border import annotations as ann
    from sovereignspec.operator.border.workloads import owner_metadata

    sts = {
        "metadata": {
            "name": "chat",
            "namespace": "team-a",
            "annotations": {ann.PREFIX + "jurisdiction": "kr", "big": "x" * 100_000},
            "labels": {"kueue.x-k8s.io/queue-name": "serving"},
        },
        "spec": {
            "replicas": 2,
            "template": {
                "metadata": {
                    "annotations": {ann.PREFIX + "model": "llama-3.1-8b", "big": "x" * 100_000},
                    "labels": {"app": "chat", ann.PREFIX + "drafter": "eagle3"},
                },
                "spec": {"containers": [{"name": "server", "image": "vllm"}]},
            },
        },
    }
    kept = strip_statefulset(sts)
    assert owner_metadata(kept) == {
        "annotations": {ann.PREFIX + "jurisdiction": "kr"},
        "labels": {},
        "template_annotations": {ann.PREFIX + "model": "llama-3.1-8b"},
        "template_labels": {ann.PREFIX + "drafter": "eagle3"},
    }


class _Raw:
    def __init__(self, status: int, body: bytes) -> None:
        self.status, self._body = status, body

    def read(self) -> bytes:
        return self._body

    def release_conn(self) -> None:
        pass


@pytest.mark.parametrize("optional", [True, False])
def test_a_resource_the_server_does_not_serve_is_an_empty_cache_in_sync_only_when_optional(
    informer, optional: bool
) -> None:
    # LeaderWorkerSets where the CRD is not installed: without `optional` every decision would
    # wait for a cache that can never be listed.
    informer.optional = optional
    informer._request = lambda *_a, **_k: _Raw(404, b'{"kind":"Status","code":404}')
    if optional:
        assert informer._relist() == "" and informer.synced.is_set() and informer.absent
        assert informer.items() == []
        informer._request = lambda *_a, **_k: _Raw(
            200, b'{"kind":"ThingList","metadata":{"resourceVersion":"7"},"items":[]}'
        )
        assert informer._relist() == "7" and not informer.absent  # the CRD came: listed as any
    else:
        with pytest.raises(client.ApiException):
            informer._relist()
        assert not informer.synced.is_set()


def test_a_queued_pod_keeps_which_deployment_it_belongs_to_and_nothing_else_of_its_owners() -> None:
    from sovereignspec.operator.border.workloads import deployment_of

    pod = {
        "metadata": {
            "name": "chat-7d9f8c6b5-x2k4q",
            "namespace": "team-a",
            "labels": {"pod-template-hash": "7d9f8c6b5", "app": "chat"},
            "ownerReferences": [
                {"kind": "ReplicaSet", "name": "chat-7d9f8c6b5", "uid": "u", "controller": True}
            ],
        }
    }
    kept = strip_queued_pod(pod)
    assert kept["metadata"]["ownerReferences"] == [{"kind": "ReplicaSet", "name": "chat-7d9f8c6b5"}]
    assert deployment_of(kept) == "chat"
    # A ReplicaSet of no Deployment (its name without the hash) and a bare Pod: none.
    pod["metadata"]["ownerReferences"][0]["name"] = "handmade"
    assert deployment_of(strip_queued_pod(pod)) is None
    assert deployment_of({"metadata": {"name": "bare"}}) is None


@pytest.mark.parametrize("forbidden_is_absent", [True, False])
def test_a_forbidden_optional_feature_is_an_empty_cache_only_where_it_may_be_so(
    informer, forbidden_is_absent: bool
) -> None:
    # LearnedProfiles under an older chart's ClusterRole: the operator decides on with the shipped
    # profiles (learning off, said once) instead of failing its health check over a feature.
    informer.optional = True
    informer.forbidden_is_absent = forbidden_is_absent
    informer._request = lambda *_a, **_k: _Raw(403, b'{"kind":"Status","code":403,"reason":"Forbidden"}')
    if forbidden_is_absent:
        assert informer._relist() == "" and informer.synced.is_set() and informer.absent
        assert informer.items() == [] and not informer.denied
    else:
        with pytest.raises(client.ApiException):
            informer._relist()


def test_stopping_a_watch_whose_connection_its_own_thread_just_closed_does_not_raise(informer):
    """The leader election stops its standby's watch the moment it takes the Lease; the watch's
    thread may have closed the connection an instant before (EBADF on shutdown). Raised, that
    ended the election's thread: a leader that never renewed, never saw its Lease taken."""

    class Closed:
        def shutdown(self) -> None:
            raise OSError(9, "Bad file descriptor")

    informer._open = Closed()
    assert informer.stop() is True
