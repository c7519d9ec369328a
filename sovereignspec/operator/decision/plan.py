"""From a view to the writes of one tick: every decision as plain data, no I/O.

`plan` is the whole decision path after the API has been read: the core's placements, the check
entry we will apply, the podSetUpdates, the Events and the metrics each decision raises. The
controller only carries them out; the property tests run exactly this on generated clusters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sovereignspec.core.budget import engine_budget
from sovereignspec.core.cluster import Placement
from sovereignspec.core.decision import DecisionRecord
from sovereignspec.core.placement import Placer
from sovereignspec.core.specs import ProfileSet
from sovereignspec.engines import engine_config, handed_table
from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.workloads import EVENT_LIMIT, MESSAGE_LIMIT, pod_set_sizes
from sovereignspec.operator.decision.requests import PendingWorkload
from sovereignspec.operator.decision.view import View


@dataclass(frozen=True)
class EventNote:
    reason: str
    message: str
    warning: bool = False


@dataclass
class Write:
    """One admission-check entry to apply, and what to say about it."""

    key: str
    workload: dict[str, object]
    check: str
    entry: dict[str, object]  # the entry as we read it (for lastTransitionTime)
    state: str  # Ready | Retry | Rejected, or Pending while it waits (saying why)
    message: str
    pod_set_updates: list[dict[str, object]] | None = None
    requeue_after: int | None = None
    events: list[EventNote] = field(default_factory=list)
    outcome: str = ""  # placed | retry | rejected | drift | waiting
    mode: str = "none"
    gamma: int = 0
    speedup: float | None = None
    bad_fields: tuple[str, ...] = ()
    drift: str = ""  # for drift writes: the reason reported
    placed: tuple[str, ...] = ()  # "node/gpuN" per pod placed, for the sovereignty record
    recorded: bool = False  # its record is in the store (or its backlog) already: written ahead
    written: str = ""  # how its write ended (the controller's outcome: its own, conflict, error)


def shorten(text: str, limit: int) -> str:
    """At most `limit` characters, cut at a word boundary with an ellipsis, never mid-word."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space].rstrip(" ;,")
    return cut + "…"


# Retries after which an exclusive workload still waiting raises an ExclusiveWaiting Warning
# (with the default backoff, 15 s doubling: about 7.5 minutes).
EXCLUSIVE_PATIENCE = 5


def plan(policy_name: str, spec: PolicySpec, view: View, profiles: ProfileSet, stamp: str) -> list[Write]:
    """The writes for every pending workload of one policy group, in the core's tick order."""
    placer = Placer(profiles, view.cluster, spec.placer_settings())
    writes: list[Write] = []
    impossible: set[str] = set()
    for p in view.pending:
        if p.waiting is not None:
            if (p.entry.get("state"), p.entry.get("message")) != ("Pending", p.waiting):
                writes.append(
                    Write(p.key, p.workload, p.check, p.entry, "Pending", p.waiting, outcome="waiting")
                )
            impossible.add(p.key)
        elif p.request is None:
            why = f"rejected: {p.rejection or 'the workload cannot be read'}"
            writes.append(_rejected(p, why, ""))
        elif clash := forged(p, profiles):
            # Decided on any GPU, this template would be refused; where none is free it would
            # wait for one, only to be refused then. Refused now, before placement.
            writes.append(_rejected(p, _reserved_refusal(clash, len(p.pod_set_notes) > 1), ""))
            impossible.add(p.key)
    by_name = {p.key: p for p in view.pending if p.request is not None and p.key not in impossible}
    for placement in placer.tick(
        [p.request for p in by_name.values() if p.request is not None], explain=True
    ):
        writes.append(
            _decided(policy_name, spec, view, profiles, by_name[placement.workload], placement, stamp)
        )
    return writes


def _write(p: PendingWorkload, state: str, message: str, **rest: Any) -> Write:
    """`p`'s check entry set to `state`, the message cut to what the entry holds."""
    return Write(p.key, p.workload, p.check, p.entry, state, shorten(message, MESSAGE_LIMIT), **rest)


def _rejected(p: PendingWorkload, why: str, detail: str) -> Write:
    events = [EventNote("Rejected", shorten(why + detail, EVENT_LIMIT), True)]
    return _write(p, "Rejected", why, events=events, outcome="rejected")


def _backoff(entry: Mapping[str, object], spec: PolicySpec) -> tuple[int, int]:
    """The retries so far (Kueue's retryCount) and the seconds before the next: doubling, capped.
    A count that is not a whole number >= 0 counts as none; past 2^20 the cap is reached whatever
    the base (3,600 s at most: policy.py), so the doubling stops there (no huge powers)."""
    retries = entry.get("retryCount", 0)
    retries = retries if isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0 else 0
    return retries, _step(retries, spec)


def _step(n: int, spec: PolicySpec) -> int:
    return int(min(spec.retry.max_seconds, spec.retry.base_seconds * 2 ** min(n, 20)))


def _waited(retries: int, spec: PolicySpec) -> int:
    """Seconds waited over `retries` + 1 backoffs: every one past the 21st at the cap (Kueue's
    count is an int32: never a loop over it)."""
    first = min(retries + 1, 21)
    return sum(_step(n, spec) for n in range(first)) + (retries + 1 - first) * spec.retry.max_seconds


def held(w: Write, why: str, spec: PolicySpec) -> Write:
    """A placement that may not be written before its record is persisted (audit.required): Retry
    in its place, saying why, so that Kueue releases the quota and asks again after the backoff."""
    _, after = _backoff(w.entry, spec)
    message = f"retry in {after}s: waiting for the sovereignty record (audit.required): {why}"
    return Write(
        w.key,
        w.workload,
        w.check,
        w.entry,
        "Retry",
        shorten(message, MESSAGE_LIMIT),
        requeue_after=after,
        events=[EventNote("RecordUnavailable", shorten(message, EVENT_LIMIT), True)],
        outcome="retry",
    )


def _decided(
    policy_name: str,
    spec: PolicySpec,
    view: View,
    profiles: ProfileSet,
    p: PendingWorkload,
    placement: Placement,
    stamp: str,
) -> Write:
    record = placement.record
    if record.outcome == "placed":
        return _placed(policy_name, spec, view, profiles, p, record, stamp)
    if record.outcome == "retry":
        retries, after = _backoff(p.entry, spec)
        message = f"retry in {after}s: {record.reason}"
        events = [EventNote("Retry", shorten(message + _excluded_text(record), EVENT_LIMIT))]
        if p.request is not None and p.request.exclusive and retries + 1 >= EXCLUSIVE_PATIENCE:
            # Serving work does not finish: an exclusive workload that keeps waiting may wait for
            # good. Say so, with the administrator's levers.
            waited = _waited(retries, spec)
            lever = (
                f"an exclusive workload has waited {retries + 1} retries (~{waited // 60} min) for a node "
                "no other tenant uses; shared work holds the nodes it may use. Levers: "
                "placement.keepWholeNodesFree (empty nodes kept for exclusive tenants), Kueue "
                "priority and preemption for this queue, or more nodes in its flavor"
            )
            events.append(EventNote("ExclusiveWaiting", shorten(lever, EVENT_LIMIT), True))
        return _write(p, "Retry", message, requeue_after=after, events=events, outcome="retry")
    return _rejected(p, f"rejected: {record.reason}", _excluded_text(record))


def decision_notes(
    spec: PolicySpec,
    profiles: ProfileSet,
    p: PendingWorkload,
    record: DecisionRecord,
    policy_name: str,
    stamp: str,
    handoff_allowed: bool = True,
) -> dict[str, str]:
    """Every annotation a decision hands the pod, consistent with one another."""
    req = p.request
    assert req is not None and record.gpu_type is not None
    notes = {
        ann.OUT_MODE: record.mode,
        ann.OUT_BUDGET: str(record.gamma),
        ann.OUT_GPU_TYPE: record.gpu_type,
        ann.OUT_GPU_INDEX: str(record.gpu_index),
        ann.OUT_SPEEDUP: f"{record.speedup:.3f}" if record.speedup is not None else "",
        ann.OUT_TPOT: f"{record.tpot_ms:.3f}" if record.tpot_ms is not None else "",
        ann.OUT_DECIDED_AT: stamp,
        ann.OUT_POLICY: policy_name,
    }
    drafter = profiles.drafters.get(req.drafter) if req.drafter else None
    budget = engine_budget(profiles, spec.placer_settings(), req, record) if handoff_allowed else None
    table = budget.table if budget else None
    checkpoint = p.declared.draft_checkpoint or (
        spec.drafts.checkpoints.get(req.drafter, {}).get(req.model) if req.drafter else None
    )
    config = (
        engine_config(drafter, req.model, record.gamma, table, checkpoint) if drafter is not None else None
    )
    if budget is not None and budget.armed is not None:
        # Armed at its declared batch with K = 0 there: slower than plain by a draft pass and the
        # machinery; what it is handed says so.
        speedup, step = budget.armed
        notes[ann.OUT_SPEEDUP] = f"{speedup:.3f}"
        notes[ann.OUT_TPOT] = f"{step * 1e3:.3f}"
    if config is not None and config.speculative:
        notes[ann.OUT_MODE] = "speculative"
        notes.update({ann.PREFIX + key: value for key, value in config.notes.items()})
    # else a plain pod: nothing it is handed may say speculate.
    return notes


def reserved_in_template(template_notes: Mapping[str, str]) -> list[str]:
    return sorted(k for k in template_notes if k in ann.OUTPUTS)


def never_written(template_notes: Mapping[str, str], profiles: ProfileSet) -> dict[str, str]:
    """Our output keys the template sets to values no decision of ours could write beside them
    (a template with any of our keys gets a plain decision, `_placed`): a mode other than plain,
    a budget other than 0, any engine configuration or spread, an unknown GPU type or a GPU index
    that is not a number."""
    out: dict[str, str] = {}
    for key, value in template_notes.items():
        if (
            (key == ann.OUT_MODE and value != "plain")
            or (key == ann.OUT_BUDGET and value != "0")
            or key in ann.OUT_ENGINES
            or key == ann.OUT_NODES
            or (key == ann.OUT_GPU_TYPE and value not in profiles.gpus)
            or (key == ann.OUT_GPU_INDEX and not (value.isascii() and value.isdigit()))
        ):
            out[key] = value
    return out


def forged(p: PendingWorkload, profiles: ProfileSet) -> dict[str, dict[str, str]]:
    """Per pod set, our output keys its template sets to values no decision of ours writes. Any
    pod set counts: Kueue refuses podSetUpdates that conflict with one pod set's template and would
    start the others alone (a group half ungated)."""
    return {name: clash for name, notes in p.pod_set_notes if (clash := never_written(notes, profiles))}


def _reserved_refusal(clash: Mapping[str, Mapping[str, str]], several: bool) -> str:
    said = []
    count = 0
    for name, keys in sorted(clash.items()):
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(keys.items()))
        said.append(f"{f'pod set {name}: ' if several else ''}the pod template sets {shown}")
        count += len(keys)
    return (
        f"rejected: {'; '.join(said)}, which only SovereignSpec writes; remove "
        f"{'it' if count == 1 else 'them'} from spec.template.metadata.annotations"
    )


def _placed(
    policy_name: str,
    spec: PolicySpec,
    view: View,
    profiles: ProfileSet,
    p: PendingWorkload,
    record: DecisionRecord,
    stamp: str,
) -> Write:
    req = p.request
    assert req is not None and record.node is not None and record.gpu_type is not None
    reserved = _reserved_notes(policy_name, spec, profiles, p, record, stamp)
    if isinstance(reserved, Write):
        return reserved
    record, notes, reason, events = reserved
    selectors, where = _selectors(view, p, record, notes)
    updates: list[dict[str, object]] = [
        {"name": name, "annotations": dict(notes), "nodeSelector": dict(chosen)}
        for name, chosen in zip(p.pod_set_names, selectors, strict=True)
    ]
    if record.mode == "plain" and view.stale_reason and record.headroom is None:
        reason = f"{reason} ({view.stale_reason})"
    light = _light_note(record, notes)
    mode = "speculative" if record.gamma > 0 else "light-batch speculative" if light else "plain"
    message = f"{mode} γ={record.gamma} on {where}; α {req.alpha:.2f} ({p.alpha_source}); {reason}{light}"
    priced = profiles.pricing.get((record.gpu_type or "", req.model))
    if priced:  # what the engines taught about this GPU type and model, when they taught something
        message = f"{message}; priced with the {priced}"
    events = [
        EventNote(
            "SpeculativeDecode" if record.gamma > 0 or light else "PlainDecode",
            shorten(record_text(record, p.alpha_source) + light, EVENT_LIMIT),
        ),
        *events,
        *_placement_events(p, record),
    ]
    problems = p.declared.performance_problems
    return _write(
        p,
        "Ready",
        message,
        pod_set_updates=updates,
        events=events,
        outcome="placed",
        mode=record.mode,
        gamma=record.gamma,
        speedup=record.speedup,
        bad_fields=tuple(x.field for x in problems),
        placed=tuple(f"{n}/gpu{g}" for n, g, _ in record.pods or [(record.node, record.gpu_index, 0)] if n),
    )


def _reserved_notes(
    policy_name: str,
    spec: PolicySpec,
    profiles: ProfileSet,
    p: PendingWorkload,
    record: DecisionRecord,
    stamp: str,
) -> Write | tuple[DecisionRecord, dict[str, str], str, list[EventNote]]:
    """(record, notes, reason, events) of the decision as it can be handed over, or the refusal.
    Our keys land together and agree, or not at all. A template that already sets some of them
    gets a plain decision; if its values are not plain ones, Kueue could not merge ours and the
    engine would read the user's: that bypasses the decision, so it is refused."""
    reserved = sorted({k for _, set_notes in p.pod_set_notes for k in reserved_in_template(set_notes)})
    if not reserved:
        return record, decision_notes(spec, profiles, p, record, policy_name, stamp), record.reason, []
    record = _as_plain(record)
    notes = decision_notes(spec, profiles, p, record, policy_name, stamp, handoff_allowed=False)
    clash = {
        name: found
        for name, set_notes in p.pod_set_notes
        if (found := {k: v for k, v in set_notes.items() if k in ann.OUTPUTS and notes.get(k) != v})
    }
    if clash:
        return _rejected(p, _reserved_refusal(clash, len(p.pod_set_notes) > 1), "")
    reason = f"plain decode: the pod template sets {', '.join(reserved)} (written only by SovereignSpec)"
    return (
        record,
        notes,
        reason,
        [EventNote("ReservedAnnotation", reason + "; remove them from the template", True)],
    )


def _selectors(
    view: View, p: PendingWorkload, record: DecisionRecord, notes: dict[str, str]
) -> tuple[list[dict[str, str]], str]:
    """Each pod set's node selector and where the decision says it placed them; a spread over
    nodes also names every pod's node and GPU in the notes."""
    node = record.node or ""
    where = f"{record.node}/gpu{record.gpu_index} ({record.gpu_type})"
    selectors = [{ann.HOSTNAME: view.hostnames.get(node, node)}] * len(p.pod_set_names)
    if record.node_selector is None and record.pod_set_nodes is None:
        return selectors, where
    # Pods spread over nodes, counted per pod: pinned by labels, or each pod set by its node.
    notes[ann.OUT_NODES] = ",".join(f"{view.hostnames.get(n, n)}/{g}" for n, g, _ in record.pods)
    spread = ", ".join(f"{n}/gpu{g}" for n, g, _ in record.pods)
    where = f"{len(record.pods)} pods over {spread} ({record.gpu_type})"
    if record.pod_set_nodes is None:
        return [dict(record.node_selector or {})] * len(p.pod_set_names), where
    nodes = iter(record.pod_set_nodes)  # one per pod set with pods, in order
    selectors = []
    for count in _counts(p):
        pinned = next(nodes) if count else ""
        selectors.append({ann.HOSTNAME: view.hostnames.get(pinned, pinned)} if pinned else {})
    return selectors, where


def _light_note(record: DecisionRecord, notes: Mapping[str, str]) -> str:
    """What a γ = 0 decision that still hands the engine a per-batch table speculates, or ""."""
    if record.gamma != 0 or notes.get(ann.OUT_MODE) != "speculative":
        return ""
    table = handed_table({k.removeprefix(ann.PREFIX): v for k, v in notes.items()})
    below = max((hi for _, hi, k in table if k > 0), default=0)
    return (
        f"; speculates up to batch {below} (per-batch table {table}), K = 0 above: "
        f"{notes[ann.OUT_SPEEDUP]}x plain at the declared batch (a draft pass and the machinery)"
    )


def _placement_events(p: PendingWorkload, record: DecisionRecord) -> list[EventNote]:
    """The Events a placed decision adds beside its own: held-back speculation, excluded nodes,
    annotations that turned speculation off, unknown keys."""
    events: list[EventNote] = []
    if record.held_back:
        held = "; ".join(f"{gpu}: {why}" for gpu, why in sorted(record.held_back.items()))
        events.append(EventNote("NeighbourSLO", shorten(f"speculation held back on {held}", EVENT_LIMIT)))
    excluded = _excluded_text(record)
    if excluded:
        events.append(EventNote("ExcludedNodes", shorten(excluded.lstrip("; "), EVENT_LIMIT)))
    problems = p.declared.performance_problems
    if problems:
        text = "; ".join(str(x) for x in problems)
        said = shorten(f"{text}. Speculation is off: plain decode.", EVENT_LIMIT)
        events.append(EventNote("BadAnnotation", said, True))
    if p.declared.warnings:
        events.append(
            EventNote("UnknownAnnotation", shorten("; ".join(p.declared.warnings), EVENT_LIMIT), True)
        )
    return events


def _counts(p: PendingWorkload) -> list[int]:
    """Pods per pod set, in the order of `p.pod_set_names` (0 for a pod set without pods)."""
    return pod_set_sizes(p.workload)


def _as_plain(record: DecisionRecord) -> DecisionRecord:
    if record.gamma == 0:
        return record
    return replace(record, mode="plain", gamma=0, speedup=1.0)


def drift_writes(view: View, spec: PolicySpec, reported: Mapping[str, str]) -> list[Write]:
    """For each drifted workload not yet reported with the same reason: a Warning, and with
    `evictOnDrift` a Retry (Kueue evicts and requeues it; it is decided again from scratch). For a
    pod bound where it was not planned: a BoundElsewhere Warning, the workload left running."""
    out = []
    for d in [*view.drift, *view.bound_elsewhere]:
        c = d.committed
        sovereign = d.event == "SovereigntyDrift"
        said = f"sovereignty drift: {d.why}" if sovereign else d.why
        if reported.get(c.key) == d.why or said in str(c.entry.get("message", "")):
            continue  # reported already (in this process, or in the entry before a restart)
        evict = sovereign and spec.sovereignty.evict_on_drift
        message = said + ("; evicted to be placed again" if evict else "")
        entry = dict(c.entry)
        out.append(
            Write(
                c.key,
                dict(c.workload),
                c.check,
                entry,
                "Retry" if evict else "Ready",
                shorten(message if evict else f"{entry.get('message', '')} [{message}]", MESSAGE_LIMIT),
                pod_set_updates=None if evict else list(entry.get("podSetUpdates") or []),
                requeue_after=spec.retry.base_seconds if evict else None,
                events=[EventNote(d.event, shorten(message, EVENT_LIMIT), True)],
                outcome="drift",
                drift=d.why,
            )
        )
    return out


def record_text(record: DecisionRecord, alpha_source: str) -> str:
    """The decision record as one Event message (Events cap messages near 1 kB)."""
    r = record
    parts = [
        f"{r.mode} γ*={r.gamma} (unconstrained {_f(r.unconstrained_gamma, 0)}) "
        f"on {r.node}/gpu{r.gpu_index} {r.gpu_type}",
        f"S_real={_f(r.speedup)} aggregate={_f(r.aggregate_speedup)} τ={_f(r.tau)} "
        f"α={_f(r.alpha)} ({alpha_source})",
        f"headroom={_f(r.headroom)} judged at {_f(r.headroom_pessimistic)} ≈ {_f(r.background_seqs, 1)} seqs",
        f"step {_f(r.step_plain_ms, 2)}→{_f(r.step_ms, 2)} ms, TPOT {_f(r.tpot_ms, 2)} ms",
        f"neighbours: step×{_f(r.neighbour_step_ratio)} vs slack {_f(r.neighbour_slo_ratio)}"
        + (f" (binding: {r.binding_neighbour})" if r.binding_neighbour else ""),
        f"candidates={r.candidates}; {r.reason}",
    ]
    return "; ".join(parts)


def _excluded_text(record: DecisionRecord) -> str:
    if not record.excluded:
        return ""
    return "; excluded: " + "; ".join(f"{node}: {why}" for node, why in sorted(record.excluded.items()))


def _f(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"
