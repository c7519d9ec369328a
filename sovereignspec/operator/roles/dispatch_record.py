"""The MultiKueue dispatcher's part of the sovereignty record: its decisions (which workers it
nominated, each one's jurisdiction), the worker cluster that admitted each workload, and, with
`audit.required`, its nominations recorded before they are written (`ahead`), as the worker role
records its placements (`audit.ahead`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sovereignspec.operator.border.objects import MultiKueueStatus
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.roles.audit import AuditLog, tenancy_fields, workload_fields
from sovereignspec.operator.runtime import metrics

DISPATCHED = ("nominate", "kept", "reject", "reclose", "hold")  # outcomes that are decisions


@dataclass(frozen=True)
class Decision:
    wl: dict[str, Any]
    check: str
    entry: dict[str, Any]
    state: str
    message: str
    nominated: tuple[str, ...] | None  # written with the entry; None: the field is left alone
    event: tuple[str, str, bool] | None  # reason, message, warning
    outcome: str
    recorded: bool = False  # its record is in the store (or its backlog) already: audit.required

    def written(self) -> tuple[dict[str, Any], str, str, str, tuple[str, ...]]:
        """As `dispatch_facts` reads it: the workers it names, ours or those it kept."""
        nominated = self.nominated or MultiKueueStatus.of(self.wl).nominated
        return self.wl, self.check, self.state, self.outcome, nominated


def dispatch_facts(
    written: Iterable[tuple[Mapping[str, Any], str, str, str, tuple[str, ...] | None]],
    workers: Mapping[str, str | None],
    namespaces: Mapping[str, Mapping[str, str]],
    policy: PolicySpec,
    replica: str,
    at: str,
) -> list[dict[str, Any]]:
    """The MultiKueue dispatcher's decisions written, (workload, check, state, outcome, workers
    nominated): who, under which rule, to which workers and their jurisdictions."""
    out = []
    for wl, check, state, outcome, nominated in written:
        meta: Mapping[str, Any] = wl.get("metadata") or {}
        namespace = str(meta.get("namespace", ""))
        out.append({
            "kind": "dispatch", "at": at, "replica": replica, "check": check,
            "workload": workload_fields(meta), **tenancy_fields(namespace, namespaces.get(namespace), policy),
            "state": state, "outcome": outcome,
            "nominated": list(nominated or ()),
            "workerJurisdictions": {n: workers.get(n) for n in nominated or ()},
        })  # fmt: skip
    return out


def admission_facts(
    workloads: Iterable[Mapping[str, Any]],
    workers: Mapping[str, str | None],
    namespaces: Mapping[str, Mapping[str, str]],
    policy: PolicySpec,
    replica: str,
    at: str,
    seen: set[tuple[str, str]],
) -> list[dict[str, Any]]:
    """A record per manager Workload a worker admitted (MultiKueue's status.clusterName), once per
    (workload, worker): where it went, whoever nominated it, and that worker's jurisdiction."""
    out = []
    for wl in workloads:
        meta: Mapping[str, Any] = wl.get("metadata") or {}
        cluster = MultiKueueStatus.of(wl).cluster
        key = (str(meta.get("uid", "")), str(cluster))
        if cluster is None or key in seen:
            continue
        seen.add(key)
        namespace = str(meta.get("namespace", ""))
        out.append({
            "kind": "admission", "at": at, "replica": replica, "workload": workload_fields(meta),
            **tenancy_fields(namespace, namespaces.get(namespace), policy),
            "worker": cluster, "workerJurisdiction": workers.get(cluster),
        })  # fmt: skip
    return out


def unwritten_facts(refused: Iterable[tuple[Decision, str]], replica: str, at: str) -> list[dict[str, Any]]:
    """Decisions recorded ahead whose write the API server then refused (`reason`: a conflict, an
    error): they took no effect, and the next decision is recorded in its turn."""
    return [
        {"kind": "unwritten", "at": at, "replica": replica, "check": d.check,
         "workload": workload_fields(d.wl.get("metadata") or {}), "reason": reason}
        for d, reason in refused
    ]  # fmt: skip


def ahead(
    audit: AuditLog,
    decisions: Sequence[Decision],
    workers: Mapping[str, str | None],
    namespaces: Mapping[str, Mapping[str, str]],
    policy: PolicySpec,
    at: str,
) -> list[Decision]:
    """audit.required: the decisions' records persisted before they are written, so that a crash
    loses no record of a nomination MultiKueue acted on. A nomination whose record cannot be
    persisted is held (Pending, saying why: MultiKueue dispatches only a workload whose checks are
    Ready; its record dropped, for it is decided again); the other decisions nominate nothing and
    are written anyway, their records waiting in the backlog. A record that is not installed (its
    CRD or RBAC missing) holds nothing, as in the worker role."""
    recordable = [d for d in decisions if d.outcome in DISPATCHED]
    if not recordable:
        return list(decisions)
    facts = dispatch_facts([d.written() for d in recordable], workers, namespaces, policy, audit.writer, at)
    done = audit.persist(facts)
    if done < len(recordable) and audit.off is not None:
        return list(decisions)
    late = recordable[done:]
    if late and audit.backlog:  # the unpersisted are the backlog's last: nominations leave it
        tail = audit.backlog[len(audit.backlog) - len(late) :]
        del audit.backlog[len(audit.backlog) - len(late) :]
        audit.backlog.extend(f for f, d in zip(tail, late, strict=True) if d.outcome != "nominate")
    metrics.AUDIT_HELD.inc(sum(d.outcome == "nominate" for d in late))
    text = f"waiting for the sovereignty record (audit.required): {audit.error or 'unknown'}"
    late_ids = {id(d) for d in late}

    def held(d: Decision) -> Decision:
        event = ("RecordUnavailable", text, True)
        return replace(d, state="Pending", message=text, nominated=None, outcome="wait", event=event)

    return [
        held(d) if id(d) in late_ids and d.outcome == "nominate"
        else replace(d, recorded=True) if d.outcome in DISPATCHED  # in the store, or its backlog
        else d
        for d in decisions
    ]  # fmt: skip
