"""The worker's decision path without a cluster, table by table: which workloads a view holds
(`view.build`), what each decision writes (`plan.plan`: state, mode, message, Events, the pod's
notes), and the apply body that carries it (`writer.check_entry_apply`). The objects come from the
builders; the control-plane tests drive the same path through a real API server."""

from __future__ import annotations

import copy
import functools
import json
from typing import Any

import pytest

from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border.workloads import MESSAGE_LIMIT, owner_metadata
from sovereignspec.operator.decision.plan import Write, plan
from sovereignspec.operator.decision.view import View, build
from sovereignspec.operator.runtime.writer import KUEUE, check_entry_apply
from sovereignspec.profiles import load_profiles
from sovereignspec.telemetry.snapshot import Snapshot
from tests.engine_keys import OUT_SGLANG, OUT_VLLM
from tests.unit.builders import CHECK, NOW, STAMP, chat, node, policy, snapshot, world

IDLE = {("h1", i): 0.0 for i in range(4)}
BUSY = {("h1", i): 1.0 for i in range(4)}


@functools.cache
def profiles() -> ProfileSet:
    return load_profiles()


def _view(workloads: list[dict[str, Any]], nodes: list[dict[str, Any]], snap: Snapshot, **kw: Any) -> View:
    spec = policy()
    return build(world(workloads, nodes, spec, **kw), {CHECK}, spec, profiles(), snap, NOW)


def _decide(workloads: list[dict[str, Any]], nodes: list[dict[str, Any]], snap: Snapshot, **kw: Any) -> Write:
    spec = policy()
    (write,) = plan("default", spec, _view(workloads, nodes, snap, **kw), profiles(), STAMP)
    return write


def _cordoned() -> dict[str, Any]:
    n = node("h1")
    n["spec"] = {"unschedulable": True}
    return n


def _inactive(wl: dict[str, Any], active: bool) -> dict[str, Any]:
    wl["spec"]["active"] = active
    return wl


# -- which workloads a view holds ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("why", "workload", "pending"),
    [
        ("quota reserved and our entry Pending", chat().obj(), True),
        ("no quota reserved yet: Kueue has not asked", chat().without_quota().obj(), False),
        ("already decided (Ready)", chat().check("Ready").obj(), False),
        ("already rejected", chat().check("Rejected").obj(), False),
        ("deactivated (spec.active false): held out of admission", _inactive(chat().obj(), False), False),
        ("spec.active true, as Kueue defaults it", _inactive(chat().obj(), True), True),
    ],
)
def test_a_view_holds_exactly_the_workloads_kueue_is_waiting_on(
    why: str, workload: dict, pending: bool
) -> None:
    view = _view([workload], [node("h1")], snapshot(IDLE))
    assert (len(view.pending) == 1) is pending, why


@pytest.mark.parametrize(
    ("why", "snap", "headroom"),
    [
        ("an idle GPU reads all its compute spare", snapshot(IDLE), 1.0),
        ("a saturated one none", snapshot(BUSY), 0.0),
        ("a reading older than stalenessSeconds is no reading", snapshot(IDLE, observed_at=NOW - 3600), None),
        ("a GPU missing from telemetry has no reading", snapshot({}), None),
    ],
)
def test_a_view_reads_each_gpus_headroom_from_fresh_telemetry_only(
    why: str, snap: Snapshot, headroom: float | None
) -> None:
    view = _view([chat().obj()], [node("h1")], snap)
    assert view.gpu_headroom[("h1", 0)] == headroom, why


# -- what each decision writes --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("why", "workloads", "nodes", "snap", "state", "mode", "says", "events"),
    [
        (
            "an idle GPU and a good drafter: speculative, on a node",
            [chat().obj()], [node("h1")], snapshot(IDLE),
            "Ready", "speculative", "maximises the GPU's token rate", [("SpeculativeDecode", False)],
        ),
        (
            "a saturated GPU: plain decode at once, never a wait for speed",
            [chat().obj()], [node("h1")], snapshot(BUSY),
            "Ready", "plain", "(saturated): plain decode", [("PlainDecode", False)],
        ),
        (
            "stale telemetry: plain decode until it returns",
            [chat().obj()], [node("h1")], snapshot(IDLE, observed_at=NOW - 3600),
            "Ready", "plain", "no fresh telemetry", [("PlainDecode", False)],
        ),
        (
            "a malformed acceptance rate: plain, the field named, a warning Event",
            [chat().annotate(acceptance_rate="1.5").obj()], [node("h1")], snapshot(IDLE),
            "Ready", "plain", "acceptance-rate: got '1.5'; accepted: a decimal number in [0, 1]",
            [("PlainDecode", False), ("BadAnnotation", True)],
        ),
        (
            "an unknown key of ours: decided as without it, a warning Event naming the likely one",
            [chat().annotate(acceptance_rat="0.8").obj()], [node("h1")], snapshot(IDLE),
            "Ready", "speculative", "maximises the GPU's token rate",
            [("SpeculativeDecode", False), ("UnknownAnnotation", True)],
        ),
        (
            "no node in the namespace's jurisdiction: rejected, sovereignty fails closed",
            [chat().obj()], [node("h1", "kr")], snapshot(IDLE),
            "Rejected", "none", "no node of its flavor and node constraints in jurisdiction eu",
            [("Rejected", True)],
        ),
        (
            "an annotation reaching outside the namespace's jurisdiction: rejected",
            [chat().annotate(jurisdiction="kr").obj()], [node("h1")], snapshot(IDLE),
            "Rejected", "none", "accepted: one the namespace allows: eu", [("Rejected", True)],
        ),
        (
            "more GPUs than any node has: rejected for good, with the numbers",
            [chat().gpus("8").obj()], [node("h1")], snapshot(IDLE),
            "Rejected", "none", "needs 8 GPUs on one node; the largest node it may use has 4",
            [("Rejected", True)],
        ),
        (
            "every admissible node cordoned: Retry, not Rejected",
            [chat().obj()], [_cordoned()], snapshot(IDLE),
            "Retry", "none", "no admissible node with free GPUs now", [("Retry", False)],
        ),
    ],
)  # fmt: skip
def test_each_decision_writes_its_state_mode_reason_and_events(
    why: str,
    workloads: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    snap: Snapshot,
    state: str,
    mode: str,
    says: str,
    events: list[tuple[str, bool]],
) -> None:
    """Events are Warnings only where the user must act (a bad annotation, a rejection); a retry
    or a decision is Normal."""
    write = _decide(workloads, nodes, snap)
    assert (write.state, write.mode) == (state, mode), why
    assert says in write.message, write.message
    assert [(e.reason, e.warning) for e in write.events] == events
    assert len(write.message) <= MESSAGE_LIMIT
    assert "None" not in write.message, write.message  # nothing unknown printed as Python's None
    if state == "Ready":
        (update,) = write.pod_set_updates or []
        assert update["nodeSelector"] == {"kubernetes.io/hostname": "h1"}
        assert update["annotations"][ann.OUT_MODE] == mode
    else:
        assert write.pod_set_updates is None  # nothing reaches the pod unless it is admitted
        assert write.gamma == 0 and write.speedup is None  # nor any draft budget


@pytest.mark.parametrize(
    ("snap", "why"),
    [
        (Snapshot(fetched_at=NOW - 3600), "(telemetry last read 3600s ago (limit 60s))"),
        (
            Snapshot(fetched_at=NOW, error="Prometheus: connection refused"),
            "(Prometheus: connection refused)",
        ),
    ],
)
def test_a_plain_decision_for_want_of_telemetry_says_why_none_could_be_read(snap: Snapshot, why: str) -> None:
    write = _decide([chat().obj()], [node("h1")], snap)
    assert (write.state, write.mode) == ("Ready", "plain"), write.message
    assert write.message.startswith("plain γ=0 on h1/gpu0") and write.message.endswith(why), write.message


@pytest.mark.parametrize(
    ("notes", "gamma"),
    [({}, 4), ({"max_num_seqs": "256", "context_length": "144", "acceptance_rate": "0.7"}, 1)],
)
def test_a_speculative_decision_says_so_first_and_hands_its_predicted_tpot(
    notes: dict[str, str], gamma: int
) -> None:
    write = _decide([chat().annotate(**notes).obj()], [node("h1")], snapshot(IDLE))
    assert write.gamma == gamma and write.message.startswith(f"speculative γ={gamma} on h1/gpu0"), (
        write.message
    )
    (update,) = write.pod_set_updates or []
    assert float(update["annotations"][ann.OUT_TPOT]) > 0.0
    assert [e.reason for e in write.events] == ["SpeculativeDecode"]  # at γ* 1 too


def test_a_cluster_with_no_nodes_rejects_saying_why_and_excludes_nothing() -> None:
    write = _decide([chat().obj()], [], snapshot(IDLE))
    assert write.state == "Rejected" and "excluded" not in write.message, write.message
    assert write.message.startswith("rejected: no node matches its flavor's node labels")


def test_a_decision_on_a_gpu_type_the_engines_taught_says_which_profile_priced_it() -> None:
    """What `core.learning.with_learning` says about a (GPU type, model) reaches the message of a
    decision there, and only there."""
    import dataclasses

    why = "learned profile (the compute ridge is pinned; held-out error 3% against the shipped 21%)"
    taught = dataclasses.replace(profiles(), pricing={("H100-SXM", "llama-3.1-8b"): why})
    view = _view([chat().obj()], [node("h1")], snapshot(IDLE))
    (write,) = plan("default", policy(), view, taught, STAMP)
    assert write.message.endswith(f"; priced with the {why}"), write.message
    elsewhere = dataclasses.replace(profiles(), pricing={("A100-80G-SXM", "llama-3.1-8b"): why})
    (write,) = plan(
        "default", policy(), _view([chat().obj()], [node("h1")], snapshot(IDLE)), elsewhere, STAMP
    )
    assert "priced with" not in write.message, write.message


@pytest.mark.parametrize(
    ("retries", "after"),
    [
        (0, 15),
        (1, 30),
        (3, 120),
        (5, 480),
        (6, 600),
        (63, 600),
        (64, 600),
        (10**6, 600),
        (-1, 15),
        (True, 15),
    ],
)
def test_a_retry_backs_off_exponentially_from_the_entrys_retry_count_up_to_the_cap(
    retries: int, after: int
) -> None:
    write = _decide([chat().check("Pending", retryCount=retries).obj()], [_cordoned()], snapshot(IDLE))
    assert write.state == "Retry" and write.requeue_after == after
    assert write.message.startswith(f"retry in {after}s: ")


def test_a_first_retry_without_a_retry_count_waits_the_base_backoff() -> None:
    """Kueue 0.19.2 leaves retryCount out (omitempty) until the check first goes to Retry: none yet."""
    write = _decide([chat().check("Pending").obj()], [_cordoned()], snapshot(IDLE))
    assert write.state == "Retry" and write.requeue_after == 15, write.message


def test_a_speculative_decision_hands_the_engine_a_table_it_reads_and_a_plain_one_hands_it_nothing() -> None:
    notes = _decide([chat().obj()], [node("h1")], snapshot(IDLE)).pod_set_updates[0]["annotations"]  # type: ignore[index]
    vllm = json.loads(notes[OUT_VLLM])
    assert vllm["method"] == "eagle3" and vllm["num_speculative_tokens"] >= int(notes[ann.OUT_BUDGET]) > 0
    assert notes[ann.OUT_DECIDED_AT] == STAMP  # the tick's clock, not the wall's
    plain = _decide([chat().obj()], [node("h1")], snapshot(BUSY)).pod_set_updates[0]["annotations"]  # type: ignore[index]
    assert OUT_VLLM not in plain and OUT_SGLANG not in plain and plain[ann.OUT_BUDGET] == "0"


# -- the apply body ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("why", "previous", "state", "transition"),
    [
        ("a first decision stamps the transition", {"name": CHECK, "state": "Pending"}, "Ready", STAMP),
        (
            "a changed state stamps it anew",
            {"name": CHECK, "state": "Retry", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            "Ready",
            STAMP,
        ),
        (
            "an unchanged state keeps the time Kueue shows",
            {"name": CHECK, "state": "Retry", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            "Retry",
            "2026-01-01T00:00:00Z",
        ),
        ("no entry read at all", None, "Ready", STAMP),
    ],
)
def test_the_apply_body_holds_only_our_entry_guarded_by_the_version_decided_on(
    why: str, previous: dict[str, Any] | None, state: str, transition: str
) -> None:
    wl = chat().obj()
    wl["status"]["admissionChecks"].append({"name": "someone-elses", "state": "Pending"})
    path, body = check_entry_apply(wl, CHECK, state, "m" * 5000, previous, STAMP, [{"name": "main"}], 30)
    assert path == f"/apis/{KUEUE}/namespaces/team-a/workloads/chat/status"
    assert body["metadata"] == {"name": "chat", "namespace": "team-a", "resourceVersion": "7"}
    assert list(body["status"]) == ["admissionChecks"]  # no conditions, no other check: never theirs
    (entry,) = body["status"]["admissionChecks"]
    assert entry["name"] == CHECK and entry["state"] == state and entry["lastTransitionTime"] == transition, (
        why
    )
    assert len(entry["message"]) == MESSAGE_LIMIT
    assert entry["podSetUpdates"] == [{"name": "main"}] and entry["requeueAfterSeconds"] == 30


def test_the_dispatchers_nomination_rides_in_the_same_body() -> None:
    _, body = check_entry_apply(
        chat().obj(), CHECK, "Ready", "ok", None, STAMP, extra_status={"nominatedClusterNames": ["eu-1"]}
    )
    assert body["status"]["nominatedClusterNames"] == ["eu-1"]
    assert "podSetUpdates" not in body["status"]["admissionChecks"][0]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("mode", "turbo"),
        ("mode", "speculative"),
        ("draft_budget", "3"),
        ("vllm_speculative_config", "{}"),
        ("sglang_args", "--speculative-algorithm EAGLE3"),
        ("gpu_type", "B200"),
        ("gpu_index", "²"),
    ],
)
def test_a_template_setting_our_keys_to_values_no_decision_writes_is_rejected_before_placement(
    key: str, value: str
) -> None:
    # No GPU is free (the node is cordoned): without the check it would wait for one, only to be
    # refused when placed. It is refused now, naming the key and value.
    write = _decide([chat().annotate(**{key: value}).obj()], [_cordoned()], snapshot(IDLE))
    assert write.state == "Rejected", write.message
    assert f"{ann.PREFIX}{key.replace('_', '-')}={value!r}, which only SovereignSpec writes" in write.message
    assert write.message.startswith("rejected: the pod template sets "), write.message  # one pod set: unnamed


@pytest.mark.parametrize(
    ("key", "value"), [("mode", "plain"), ("draft_budget", "0"), ("gpu_type", "H100-SXM")]
)
def test_a_template_setting_our_keys_to_values_a_plain_decision_could_write_waits_as_any_other(
    key: str, value: str
) -> None:
    write = _decide([chat().annotate(**{key: value}).obj()], [_cordoned()], snapshot(IDLE))
    assert write.state == "Retry", write.message


def test_our_keys_set_plainly_in_a_template_are_placed_plain_or_refused_where_the_decision_differs() -> None:
    """Placed, our keys land together and agree, or not at all: a template's plain-looking GPU type
    that the placement matches gives a plain decision with a Warning; one it contradicts (the
    engine would read the user's) is refused, naming it."""
    agrees = _decide([chat().annotate(gpu_type="H100-SXM").obj()], [node("h1")], snapshot(IDLE))
    assert (agrees.state, agrees.mode) == ("Ready", "plain"), agrees.message
    assert [(e.reason, e.warning) for e in agrees.events] == [
        ("PlainDecode", False),
        ("ReservedAnnotation", True),
    ]
    clashes = _decide([chat().annotate(gpu_type="A100-80G-SXM").obj()], [node("h1")], snapshot(IDLE))
    assert clashes.state == "Rejected", clashes.message
    # one pod set: not named
    assert clashes.message.startswith("rejected: the pod template sets "), clashes.message
    assert f"{ann.OUT_GPU_TYPE}='A100-80G-SXM', which only SovereignSpec writes" in clashes.message


def test_a_plain_decision_that_arms_a_per_batch_table_says_up_to_which_batch_it_speculates() -> None:
    """γ* = 0 at a declared 512 sequences, but the engine is handed a table that speculates at
    lighter batches: the message names the largest batch still speculating and the armed cost."""
    wl = chat().annotate(max_num_seqs="512", context_length="144", acceptance_rate="0.7").obj()
    write = _decide([wl], [node("h1")], snapshot(IDLE))
    assert (write.state, write.gamma) == ("Ready", 0), write.message
    (update,) = write.pod_set_updates or []
    assert update["annotations"][ann.OUT_MODE] == "speculative"
    notes = update["annotations"]
    table = json.loads(notes[OUT_VLLM])["num_speculative_tokens_per_batch_size"]  # vLLM 0.32's key
    top = max(hi for _, hi, k in table if k > 0)
    assert top < 512 and "light-batch speculative γ=0 on h1/gpu0" in write.message
    assert f"speculates up to batch {top} (per-batch table {table})" in write.message, write.message


@pytest.mark.parametrize(
    ("why", "notes", "snap"),
    [
        ("a saturated GPU (γ* 0)", {}, snapshot(BUSY)),
        ("γ* 1 on an idle GPU", {"max_num_seqs": "256", "context_length": "144", "acceptance_rate": "0.7"},
         snapshot(IDLE)),
    ],
)  # fmt: skip
def test_our_keys_set_plainly_in_a_template_are_placed_plain_whatever_gamma_would_have_been(
    why: str, notes: dict[str, str], snap: Snapshot
) -> None:
    write = _decide([chat().annotate(gpu_type="H100-SXM", **notes).obj()], [node("h1")], snap)
    assert (write.state, write.mode, write.gamma) == ("Ready", "plain", 0), (why, write.message)
    (update,) = write.pod_set_updates or []
    assert update["annotations"][ann.OUT_BUDGET] == "0" and OUT_VLLM not in update["annotations"]
    assert update["annotations"][ann.OUT_SPEEDUP] == "1.000"  # plain decode is 1x plain


def test_an_event_note_is_immutable() -> None:
    from dataclasses import FrozenInstanceError

    from sovereignspec.operator.decision.plan import EventNote

    with pytest.raises(FrozenInstanceError):
        EventNote("Retry", "m").warning = True  # type: ignore[misc]


@pytest.mark.parametrize(
    ("retries", "warned", "minutes"),
    [(3, False, 0), (4, True, 465 // 60), (9, True, (945 + 4 * 600) // 60),
     (2**31 - 1, True, (945 + (2**31 - 6) * 600) // 60)],  # Kueue's largest count: no loop over it
)  # fmt: skip
def test_an_exclusive_workload_still_waiting_after_five_retries_names_the_levers(
    retries: int, warned: bool, minutes: int
) -> None:
    # Backoffs 15, 30, 60, 120, 240, 480 s, then 600 s each (the default policy's cap).
    # Another tenant runs on the only node: the exclusive workload can only wait.
    other = chat("other", namespace="team-b").check(
        "Ready",
        podSetUpdates=[{"name": "main", "nodeSelector": {"kubernetes.io/hostname": "h1"}, "annotations": {}}],
    )
    mine = chat().annotate(exclusive_node="true").check("Pending", retryCount=retries)
    namespaces = {"team-a": {"sovereignspec.io/jurisdiction": "eu"}, "team-b": {}}
    spec = policy()
    view = build(
        world([mine.obj(), other.obj()], [node("h1")], spec, namespaces),
        {CHECK},
        spec,
        profiles(),
        snapshot(IDLE),
        NOW,
    )
    (write,) = plan("default", spec, view, profiles(), STAMP)
    assert write.state == "Retry"
    notes = [e for e in write.events if e.reason == "ExclusiveWaiting"]
    assert bool(notes) is warned
    if warned:
        assert (
            notes[0].warning and "keepWholeNodesFree" in notes[0].message and "preemption" in notes[0].message
        )
        assert f"waited {retries + 1} retries (~{minutes} min)" in notes[0].message


def test_an_engine_armed_only_for_its_light_batches_is_handed_its_slowdown_at_the_declared_one() -> None:
    # 256 sequences of EAGLE-3 at α 0.6 saturate the H100 (plain at the declared batch); its light
    # batches pay enough to arm the engine with a table that says K = 0 from 129 up. There the engine
    # still runs a draft pass and the machinery: what the pod is handed and the message say so.
    heavy = chat().annotate(max_num_seqs="256", acceptance_rate="0.6", context_length="144")
    write = _decide([heavy.obj()], [node("h1")], snapshot(IDLE))
    notes = write.pod_set_updates[0]["annotations"]  # type: ignore[index]
    table = json.loads(notes[OUT_VLLM])["num_speculative_tokens_per_batch_size"]
    assert notes[ann.OUT_MODE] == "speculative" and notes[ann.OUT_BUDGET] == "0"
    assert table[0][2] > 0 and all(k == 0 for _, hi, k in table if hi >= 256)
    p = profiles()
    gpu, model, d = p.gpus["H100-SXM"], p.models["llama-3.1-8b"], p.drafters["eagle3"]
    from sovereignspec.core.roofline import roofline_for

    roof = roofline_for(gpu, model)
    plain = float(roof.step_time(256.0, 256.0, 144.0))  # idle: no one else's sequences
    armed = plain + d.cost_for(model.name) * float(roof.step_time(1.0, 1.0, 144.0)) + d.spec_overhead * plain
    assert float(notes[ann.OUT_SPEEDUP]) == pytest.approx(plain / armed, abs=6e-4)
    assert float(notes[ann.OUT_TPOT]) == pytest.approx(armed * 1e3, abs=6e-4)
    assert f"{float(notes[ann.OUT_SPEEDUP]):.3f}x plain at the declared batch" in write.message


# -- Pods admitted one by one (Kueue's pod integration: plain Pods, Deployments, StatefulSets) ----


def test_a_pods_workload_is_decided_from_the_pods_own_annotations() -> None:
    # Kueue copies a Pod's spec into its Workload and no metadata: our keys are on the Pod.
    wl, pod = chat("pod-chat-7d9f-abcde").as_pods_workload("chat-7d9f-abcde")
    owners = {("team-a", "Pod", "chat-7d9f-abcde"): pod}
    write = _decide([wl], [node("h1")], snapshot(IDLE), owners=owners)
    assert (write.state, write.mode) == ("Ready", "speculative"), write.message
    (update,) = write.pod_set_updates or []
    assert update["nodeSelector"] == {"kubernetes.io/hostname": "h1"}
    # The Pod not cached yet (its Workload's watch event came first): no keys to read, so it
    # waits, saying so, never decided from the policy's defaults (a jurisdiction would be missed).
    bare = _decide([wl], [node("h1")], snapshot(IDLE))
    assert (bare.state, bare.outcome) == ("Pending", "waiting"), bare.message
    assert bare.message.startswith("waiting for its Pod chat-7d9f-abcde to be read"), bare.message


def test_a_pods_keys_set_to_values_no_decision_writes_are_rejected_as_a_templates_are() -> None:
    wl, pod = chat("pod-x").as_pods_workload("x")
    pod["annotations"][ann.OUT_MODE] = "turbo"
    write = _decide([wl], [node("h1")], snapshot(IDLE), owners={("team-a", "Pod", "x"): pod})
    assert write.state == "Rejected", write.message


def _ready_on_h1(wl: dict[str, Any]) -> None:
    """Our check Ready on wl, its pods on h1 (GPU 0), as the ledger reads it."""
    wl["status"]["admissionChecks"][0].update(
        state="Ready",
        podSetUpdates=[{"name": "main", "nodeSelector": {"kubernetes.io/hostname": "h1"},
                        "annotations": {ann.OUT_GPU_INDEX: "0"}}],
    )  # fmt: skip


def _running_on_h1(gpus: str, **meta: Any) -> dict[str, Any]:
    """A Pod bound on h1 and running, with `meta` (name, namespace, owners, labels)."""
    return {
        "metadata": {"namespace": "team-a", **meta},
        "spec": {"nodeName": "h1", "containers": [{"resources": {"requests": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": "Running"},
    }


def test_a_running_pod_admitted_alone_is_counted_once_not_also_as_a_foreign_pod() -> None:
    # h1 has 4 GPUs; a Pod admitted alone holds 3 of them and runs there. A second workload of
    # 2 GPUs does not fit beside it: counted twice, the Pod would leave it 0 rather than 1 GPU.
    placed, pod = chat("pod-big").gpus("3").as_pods_workload("big")
    _ready_on_h1(placed)
    running = _running_on_h1("3", name="big", ownerReferences=[{"kind": "ReplicaSet"}])
    one = chat("one").obj()
    two = chat("two").gpus("2").obj()
    owners = {("team-a", "Pod", "big"): pod}
    fits = _decide([placed, one], [node("h1")], snapshot(IDLE), owners=owners, pods=[running])
    assert fits.state == "Ready", fits.message
    full = _decide([placed, two], [node("h1")], snapshot(IDLE), owners=owners, pods=[running])
    assert full.state == "Retry", full.message


@pytest.mark.parametrize(
    ("phase", "counted"), [("Running", True), ("Pending", True), ("Succeeded", False), ("Failed", False)]
)
def test_another_tenants_pod_holds_its_gpus_until_it_ends(phase: str, counted: bool) -> None:
    # The pods cache keeps ended pods (for the record): one that has ended frees its GPUs.
    other = _running_on_h1("3", name="theirs", namespace="team-b")
    other["status"]["phase"] = phase
    write = _decide([chat("one").gpus("2").obj()], [node("h1")], snapshot(IDLE), pods=[other])
    assert write.state == ("Retry" if counted else "Ready"), write.message


def test_a_bound_pod_whose_gpus_cannot_be_read_is_named_and_the_others_still_counted() -> None:
    bad = _running_on_h1("lots", name="bad", namespace="team-b")
    good = _running_on_h1("3", name="good", namespace="team-b")
    view = _view([chat("one").gpus("2").obj()], [node("h1")], snapshot(IDLE), pods=[bad, good])
    assert [e for e in view.errors if e.startswith("Pod ")] == [
        "Pod team-b/bad: UnreadableFieldError: spec.containers[0].resources.requests[nvidia.com/gpu]: "
        "got 'lots'; accepted: a Kubernetes quantity such as 1, 2, 1k"
    ]
    (write,) = plan("default", policy(), view, profiles(), STAMP)
    assert write.state == "Retry", write.message  # the good pod's 3 GPUs of h1's 4 are counted


def test_a_statefulsets_workload_is_decided_from_its_pod_templates_keys() -> None:
    # Kueue makes one Workload for all replicas of a StatefulSet and copies no pod metadata into
    # it: the keys are read from the StatefulSet's pod template, as its Pods will carry them.
    wl, sts = chat("statefulset-chat-1a2b3").as_statefulsets_workload("chat")
    owners = {("team-a", "StatefulSet", "chat"): owner_metadata(sts)}
    write = _decide([wl], [node("h1")], snapshot(IDLE), owners=owners)
    assert (write.state, write.mode) == ("Ready", "speculative"), write.message
    assert "declared" in write.message, write.message
    bare = _decide([wl], [node("h1")], snapshot(IDLE))
    assert (bare.state, bare.outcome) == ("Pending", "waiting"), bare.message
    assert "its StatefulSet chat to be read (its keys are read from it)" in bare.message, bare.message


def test_a_jurisdiction_on_a_statefulsets_own_annotations_fails_closed_naming_the_statefulset() -> None:
    wl, sts = chat("statefulset-chat-1a2b3").as_statefulsets_workload("chat")
    sts["metadata"]["annotations"] = {"sovereignspec.io/jurisdiction": "kr"}
    write = _decide(
        [wl], [node("h1")], snapshot(IDLE), owners={("team-a", "StatefulSet", "chat"): owner_metadata(sts)}
    )
    assert write.state == "Rejected", write.message
    assert "the StatefulSet's own annotations" in write.message, write.message


@pytest.mark.parametrize(
    ("meta", "counted_once"),
    [
        ({"ownerReferences": [{"kind": "StatefulSet", "name": "chat"}]}, True),
        (
            {
                "labels": {ann.KUEUE_PREBUILT: "statefulset-chat-1a2b3"},
                "ownerReferences": [{"kind": "StatefulSet", "name": "chat"}],
            },
            True,
        ),
        ({"name": "other-0", "ownerReferences": [{"kind": "StatefulSet", "name": "other"}]}, False),
    ],
)
def test_a_running_pod_of_a_statefulset_is_counted_once_by_its_owner(
    meta: dict[str, Any], counted_once: bool
) -> None:
    # The StatefulSet's Workload holds 3 GPUs of h1, where its Pod runs. Matched to the Workload
    # by its owner, the Pod is not counted again; a Pod of another StatefulSet is someone else's.
    placed, sts = chat("statefulset-chat-1a2b3").gpus("3").as_statefulsets_workload("chat")
    _ready_on_h1(placed)
    running = _running_on_h1("3", **({"name": "chat-0"} | meta))
    owners = {("team-a", "StatefulSet", "chat"): owner_metadata(sts)}
    one = _decide([placed, chat("one").obj()], [node("h1")], snapshot(IDLE), owners=owners, pods=[running])
    assert one.state == ("Ready" if counted_once else "Retry"), one.message


def test_a_running_pod_of_a_group_is_counted_once_by_the_workload_kueue_built_for_it() -> None:
    # A LeaderWorkerSet group's Workload is owned by the LeaderWorkerSet, its Pods by the
    # StatefulSets the LeaderWorkerSet controller makes: Kueue's prebuilt-workload label joins them.
    placed = chat("lws-chat-0").gpus("3").owned_by("LeaderWorkerSet", "chat").obj()
    _ready_on_h1(placed)
    running = _running_on_h1(
        "3",
        name="chat-0",
        labels={ann.KUEUE_PREBUILT: "lws-chat-0"},
        ownerReferences=[{"kind": "StatefulSet", "name": "chat"}],
    )
    fits = _decide([placed, chat("one").obj()], [node("h1")], snapshot(IDLE), pods=[running])
    assert fits.state == "Ready", fits.message
    running["metadata"]["labels"] = {}
    full = _decide([placed, chat("one").obj()], [node("h1")], snapshot(IDLE), pods=[running])
    assert full.state == "Retry", full.message


# -- pods over several nodes -----------------------------------------------------------------------

JURISDICTION = "node-restriction.kubernetes.io/jurisdiction"
FOUR_EU = [node(f"h{i}", "eu", gpus=8) for i in range(1, 5)] + [node("k1", "kr", gpus=8)]
IDLE_ALL = {(f"h{i}", g): 0.0 for i in range(1, 5) for g in range(8)} | {("k1", g): 0.0 for g in range(8)}


def test_a_job_whose_pods_no_node_holds_together_is_spread_and_pinned_by_its_jurisdiction() -> None:
    job = chat("wide").annotate(jurisdiction="eu").gpus("8").pods(4).obj()
    write = _decide([job], FOUR_EU, snapshot(IDLE_ALL))
    assert write.state == "Ready", write.message
    (update,) = write.pod_set_updates or []
    assert update["nodeSelector"] == {JURISDICTION: "eu"}
    assert sorted(update["annotations"][ann.OUT_NODES].split(",")) == ["h1/0", "h2/0", "h3/0", "h4/0"]
    assert "4 pods over h1/gpu0, h2/gpu0, h3/gpu0, h4/gpu0" in write.message, write.message
    # The ledger counts every pod where it was counted: nothing of eu is left for a newcomer.
    done = copy.deepcopy(job)
    done["status"]["admissionChecks"][0].update(state="Ready", podSetUpdates=write.pod_set_updates)
    newcomer = chat("next").annotate(jurisdiction="eu").obj()
    after = _decide([done, newcomer], FOUR_EU, snapshot(IDLE_ALL))
    assert after.state == "Retry", after.message
    assert _decide([newcomer], FOUR_EU, snapshot(IDLE_ALL)).state == "Ready"  # without the spread job


def test_a_template_that_sets_the_spread_it_wants_is_rejected_before_placement() -> None:
    job = chat("forge").annotate(nodes="h1/0,h2/0").obj()
    write = _decide([job], FOUR_EU, snapshot(IDLE_ALL))
    assert write.state == "Rejected" and ann.OUT_NODES in write.message, write.message


def test_a_spread_pod_the_scheduler_bound_beside_another_is_counted_not_hidden() -> None:
    # Planned on h1/0 and h2/0 (8 GPUs each, 16-GPU nodes), both pods were bound on h1. The h1 entry
    # accounts for one of them; the other is counted as its tenant's pod, so h1 is full and a
    # newcomer of 8 GPUs goes to h2.
    nodes = [node("h1", "eu", gpus=16), node("h2", "eu", gpus=16)]
    idle = {(h, g): 0.0 for h in ("h1", "h2") for g in range(16)}
    wide = chat("wide").owned_by("Job", "wide").gpus("8").pods(2).obj()
    wide["status"]["admissionChecks"][0].update(
        state="Ready",
        podSetUpdates=[{"name": "main", "nodeSelector": {JURISDICTION: "eu"},
                        "annotations": {ann.OUT_NODES: "h1/0,h2/0", ann.OUT_BUDGET: "0"}}],
    )  # fmt: skip
    bound = [
        {
            "metadata": {"name": f"wide-{i}", "namespace": "team-a", "ownerReferences": [{"kind": "Job"}]},
            "spec": {"nodeName": "h1", "containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}]},
            "status": {"phase": "Running"},
        }
        for i in range(2)
    ]  # fmt: skip
    for pod in bound:
        pod["metadata"]["ownerReferences"][0]["name"] = "wide"
    newcomer = chat("next").gpus("8").obj()
    write = _decide([wide, newcomer], nodes, snapshot(idle), pods=bound)
    assert write.state == "Ready" and " on h2/gpu" in write.message, write.message


def test_no_exclusive_claim_lands_where_a_spread_workloads_pods_may_be_bound() -> None:
    # A shared spread workload planned on h1 and h2, pinned by eu: its pods may be bound on h3 too.
    # Another tenant's exclusive workload must not take h3 (nor h1, h2); it waits.
    nodes = [node(f"h{i}", "eu", gpus=8) for i in (1, 2, 3)]
    idle = {(f"h{i}", g): 0.0 for i in (1, 2, 3) for g in range(8)}
    wide = chat("wide").gpus("8").pods(2).obj()
    wide["status"]["admissionChecks"][0].update(
        state="Ready",
        podSetUpdates=[{"name": "main", "nodeSelector": {JURISDICTION: "eu"},
                        "annotations": {ann.OUT_NODES: "h1/0,h2/0", ann.OUT_BUDGET: "0"}}],
    )  # fmt: skip
    bank = chat("vault", namespace="bank").annotate(exclusive_node="true").obj()
    namespaces = {
        "team-a": {"sovereignspec.io/jurisdiction": "eu"},
        "bank": {"sovereignspec.io/jurisdiction": "eu", "sovereignspec.io/tenant": "bank"},
    }
    write = _decide([wide, bank], nodes, snapshot(idle), namespaces=namespaces)
    assert write.state == "Retry", write.message
    alone = _decide([bank], nodes, snapshot(idle), namespaces=namespaces)
    assert alone.state == "Ready"  # without the spread workload it would have a node


# -- Kueue's Topology Aware Scheduling -------------------------------------------------------------

HOSTNAME = "kubernetes.io/hostname"


def test_a_workload_kueue_assigned_to_nodes_is_decided_there_without_a_selector_of_ours() -> None:
    # h1 is busy, h2 idle; Kueue's topology assignment put both pods on h1: decided there, counted
    # there (the planned pods written out), and no nodeSelector competing with Kueue's own.
    wl = chat("tas").gpus("1").pods(2).topology([HOSTNAME], (["h1"], 2)).obj()
    write = _decide([wl], [node("h1"), node("h2")], snapshot({("h1", 0): 0.5, ("h2", 0): 0.0}))
    assert write.state == "Ready", write.message
    (update,) = write.pod_set_updates or []
    assert update["nodeSelector"] == {}
    assert [p.split("/")[0] for p in update["annotations"][ann.OUT_NODES].split(",")] == ["h1", "h1"]
    assert "on Kueue's topology assignment" in write.message


def test_a_workload_kueue_assigned_across_its_jurisdiction_is_never_ready_and_names_the_node() -> None:
    wl = (
        chat("tas")
        .annotate(jurisdiction="eu")
        .gpus("1")
        .pods(2)
        .topology(["topology.kubernetes.io/zone", HOSTNAME], (["z1", "h1"], 1), (["z2", "k1"], 1))
        .obj()
    )
    nodes = [node("h1"), node("k1", "kr")]
    for n, zone in zip(nodes, ["z1", "z2"], strict=True):
        n["metadata"]["labels"]["topology.kubernetes.io/zone"] = zone
    write = _decide([wl], nodes, snapshot(IDLE))
    assert write.state == "Retry", write.message
    assert "Kueue's topology assignment puts pods on k1, which it may not use: jurisdiction" in write.message


def test_an_unreadable_topology_assignment_is_refused_naming_the_field() -> None:
    wl = chat("tas").gpus("1").topology([HOSTNAME], (["h1"], 1)).obj()
    wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]["slices"][0]["podCounts"] = {}
    write = _decide([wl], [node("h1")], snapshot(IDLE))
    assert write.state == "Rejected", write.message
    assert "topologyAssignment.slices[0].podCounts: got {}" in write.message


@pytest.mark.parametrize(
    ("kind", "owner", "joined_on"),
    [
        ("Job", "chat", "chat"),  # its pods' job_name
        ("Pod", "chat-7d9f-x2k4q", "chat-7d9f-x2k4q"),  # the Pod's own name
        ("StatefulSet", "chat", "wl-chat"),  # Kueue's prebuilt Workload, on every pod of the group
        ("LeaderWorkerSet", "chat", "wl-chat"),
    ],
)
def test_engine_metrics_are_joined_on_what_every_engine_pod_of_the_workload_carries(
    kind: str, owner: str, joined_on: str
) -> None:
    from sovereignspec.operator.border.workloads import job_name

    wl = chat("wl-chat").owned_by(kind, owner).obj()
    wl["metadata"]["ownerReferences"].append({"kind": "Pod", "name": "chat-0"})  # as Kueue adds them
    assert job_name(wl) == joined_on


def _wide_on(node_name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A Job of two 8-GPU pods planned on h1 and h2 (pinned by eu), one pod bound on `node_name`."""
    wide = chat("wide").annotate(jurisdiction="eu").owned_by("Job", "wide").gpus("8").pods(2).obj()
    wide["status"]["admissionChecks"][0].update(
        state="Ready",
        message="plain γ=0 on 2 pods over h1/gpu0, h2/gpu0",
        podSetUpdates=[{"name": "main", "nodeSelector": {JURISDICTION: "eu"},
                        "annotations": {ann.OUT_NODES: "h1/0,h2/0", ann.OUT_BUDGET: "0"}}],
    )  # fmt: skip
    pod = {
        "metadata": {
            "name": "wide-x",
            "namespace": "team-a",
            "ownerReferences": [{"kind": "Job", "name": "wide"}],
        },
        "spec": {"nodeName": node_name, "containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}]},
        "status": {"phase": "Running"},
    }
    return wide, [pod]


def test_a_pod_bound_where_it_was_not_planned_raises_one_warning_and_leaves_the_workload_running() -> None:
    # Planned on h1 and h2; the scheduler bound a pod on h3, which the jurisdiction label also
    # selects. The user is told once (BoundElsewhere), the workload stays Ready, the pod's GPUs
    # are counted on h3 meanwhile.
    from sovereignspec.operator.decision.plan import drift_writes

    nodes = [node(f"h{i}", "eu", gpus=8) for i in (1, 2, 3)]
    wide, pods = _wide_on("h3")
    view = _view([wide], nodes, snapshot({}), pods=pods)
    assert view.drift == []
    (warned,) = view.bound_elsewhere
    assert "its pod wide-x is bound on h3, not on a node it was planned on (h1, h2)" in warned.why
    (write,) = drift_writes(view, policy(), {})
    assert write.state == "Ready" and write.pod_set_updates
    assert [(e.reason, e.warning) for e in write.events] == [("BoundElsewhere", True)]
    assert drift_writes(view, policy(), {"team-a/wide": warned.why}) == []  # told once
    # The ledger learns the binding: the pod takes the planned spot no pod holds (h1's, the
    # first), so it counts on h3 alone; h1 is free again, h2 still holds the other pod's plan.
    free = {n.name: n.free_gpus for n in view.cluster.nodes}
    assert free == {"h1": 8, "h2": 0, "h3": 0}, free
    assert "its GPUs are counted there" in warned.why
    # Bound where planned: nothing to say.
    wide, pods = _wide_on("h1")
    assert _view([wide], nodes, snapshot({}), pods=pods).bound_elsewhere == []


def test_a_pod_bound_on_a_node_outside_its_jurisdiction_is_sovereignty_drift_not_a_mere_warning() -> None:
    nodes = [node("h1", "eu", gpus=8), node("h2", "eu", gpus=8), node("k1", "kr", gpus=8)]
    wide, pods = _wide_on("k1")
    view = _view([wide], nodes, snapshot({}), pods=pods)
    assert view.bound_elsewhere == []
    (drift,) = view.drift
    assert "its pod wide-x is bound on k1, which does not satisfy it: jurisdiction" in drift.why


@pytest.mark.parametrize("kind", ["Deployment", "LeaderWorkerSet"])
def test_a_jurisdiction_on_the_owner_itself_fails_closed_naming_the_owner(kind: str) -> None:
    # A Deployment's replica is a Pod admitted alone: the keys belong on the template (the Pod),
    # never on the Deployment; a LeaderWorkerSet's on its pod templates, never on it.
    if kind == "Deployment":
        wl, pod = chat("pod-chat-7d9f-x").as_pods_workload("chat-7d9f-x")
        pod["owner_annotations"] = {"sovereignspec.io/jurisdiction": "kr"}
        owners = {("team-a", "Pod", "chat-7d9f-x"): pod}
    else:
        wl = chat("lws-chat-0").owned_by("LeaderWorkerSet", "chat").obj()
        owners = {
            ("team-a", "LeaderWorkerSet", "chat"): {"annotations": {"sovereignspec.io/jurisdiction": "kr"}}
        }
    write = _decide([wl], [node("h1")], snapshot(IDLE), owners=owners)
    assert write.state == "Rejected", write.message
    assert f"the {kind}'s own annotations" in write.message, write.message


def test_an_assignment_slice_of_several_domains_names_each_domains_own_node() -> None:
    # Kueue compresses many domains into one slice: a common prefix and a root per domain, a count
    # per domain. Each domain is its own node: one pod on h1, two on h2.
    wl = chat("tas").gpus("1").pods(3).topology([HOSTNAME], (["h1"], 1)).obj()
    assignment = wl["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"]
    assignment["slices"] = [
        {
            "domainCount": 2,
            "valuesPerLevel": [{"individual": {"prefix": "h", "roots": ["1", "2"]}}],
            "podCounts": {"individual": [1, 2]},
        }
    ]
    write = _decide([wl], [node("h1"), node("h2")], snapshot({("h1", 0): 0.0, ("h2", 0): 0.0}))
    assert write.state == "Ready", write.message
    (update,) = write.pod_set_updates or []
    assert [p.split("/")[0] for p in update["annotations"][ann.OUT_NODES].split(",")] == ["h1", "h2", "h2"]


# -- where the draft checkpoint comes from ----------------------------------------------------------

LOCAL_HEAD = "/models/eagle3-llama-3.1-8b"


@pytest.mark.parametrize(
    ("why", "policy_drafts", "declared", "checkpoint", "problem"),
    [
        ("the profile's hub id by default", {}, None, "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", None),
        ("the policy's local copy replaces it", {"checkpoints": {"eagle3": {"llama-3.1-8b": LOCAL_HEAD}}},
         None, LOCAL_HEAD, None),
        ("the workload's own, under a prefix the policy allows", {"allowed": ["/models/"]},
         "/models/team-a/head", "/models/team-a/head", None),
        ("the workload's own, exactly as allowed", {"allowed": ["pvc://drafts/head-v2"]},
         "pvc://drafts/head-v2", "pvc://drafts/head-v2", None),
        ("one the policy does not allow: plain decode, named", {"allowed": ["/models/"]},
         "/tmp/mine", None, "one the policy allows: /models/"),
        ("no allowlist: a workload names none", {}, "/models/x", None,
         "none (the policy's drafts.allowed is empty)"),
        ("not a path or id", {"allowed": ["/models/"]}, "/models/a b", None, "letters, digits"),
        ("a path climbing out of an allowed directory", {"allowed": ["/models/"]}, "/models/../etc/x", None,
         "one the policy allows: /models/"),
    ],
)  # fmt: skip
def test_the_draft_checkpoint_is_the_policys_or_the_workloads_within_the_allowlist_else_plain_and_said(
    why: str, policy_drafts: dict[str, Any], declared: str | None, checkpoint: str | None, problem: str | None
) -> None:
    spec = policy(drafts=policy_drafts)
    workload = chat()
    if declared is not None:
        workload.annotate(draft_checkpoint=declared)
    view = build(world([workload.obj()], [node("h1")], spec), {CHECK}, spec, profiles(), snapshot(IDLE), NOW)
    (write,) = plan("default", spec, view, profiles(), STAMP)
    notes = (write.pod_set_updates or [{}])[0]["annotations"]
    if checkpoint is None:
        assert notes[ann.OUT_MODE] == "plain" and OUT_VLLM not in notes, why
        assert write.bad_fields == ("draft-checkpoint",), why
        bad = next(e for e in write.events if e.reason == "BadAnnotation")
        assert "sovereignspec.io/draft-checkpoint" in bad.message and problem in bad.message, bad.message
        return
    assert json.loads(notes[OUT_VLLM])["model"] == checkpoint, why
    assert f"--speculative-draft-model-path {checkpoint}" in notes[OUT_SGLANG], why


def test_an_ngram_drafter_loads_no_checkpoint_whatever_is_named() -> None:
    spec = policy(drafts={"allowed": ["/models/"], "checkpoints": {"ngram": {"llama-3.1-8b": "/models/x"}}})
    workload = chat().annotate(drafter="ngram", draft_checkpoint="/models/y").obj()
    view = build(world([workload], [node("h1")], spec), {CHECK}, spec, profiles(), snapshot(IDLE), NOW)
    (write,) = plan("default", spec, view, profiles(), STAMP)
    config = json.loads((write.pod_set_updates or [{}])[0]["annotations"][OUT_VLLM])
    assert config["method"] == "ngram" and "model" not in config
