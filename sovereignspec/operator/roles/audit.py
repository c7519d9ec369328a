"""The sovereignty record's facts and its writer (the chain itself: `record.py`).

`decision_facts` and `binding_facts` turn a tick's written decisions and its bound GPU pods into
records (plain data; `binding_facts` remembers what it has recorded, so a binding is recorded once,
and again when its node's jurisdiction label changes). `AuditLog` appends them to the chain as
`AuditSegment` objects through the API: the embedded store, in the cluster itself. A write that
fails keeps its facts in a backlog, in order, written first the next time (nothing lost while the
process lives); a segment another replica wrote first (409) makes it read the head again and
write after it, so the chain never forks.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sovereignspec.core.sovereignty import DEFAULT_JURISDICTION_LABEL
from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.border.objects import PodView, controlling_owner
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.world import World, tenancy_of
from sovereignspec.operator.decision.plan import Write, held, shorten
from sovereignspec.operator.decision.violations import Ignored
from sovereignspec.operator.roles import record
from sovereignspec.operator.roles.record import Head, chain, head_of
from sovereignspec.operator.runtime import metrics
from sovereignspec.operator.runtime.writer import TRANSPORT_ERRORS, now_rfc3339

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "sovereignspec.io", "v1alpha1", "auditsegments"
SEGMENT_RECORDS = 200  # records per segment: a few hundred bytes each, far under an object's limit
RECORDED = ("placed", "retry", "rejected", "drift", "ignored")  # outcomes that are decisions (not "waiting")


def _owner(meta: Mapping[str, Any]) -> dict[str, str]:
    owner = controlling_owner(meta)
    return {"kind": owner[0], "name": owner[1]} if owner else {}


def workload_fields(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {"namespace": str(meta.get("namespace", "")), "name": str(meta.get("name", "")),
            "uid": str(meta.get("uid", "")), "owner": _owner(meta)}  # fmt: skip


def tenancy_fields(namespace: str, labels: Mapping[str, str] | None, policy: PolicySpec) -> dict[str, Any]:
    """A record's tenancy fields: the namespace's tenant, its allowed jurisdictions (None:
    anywhere) and where they came from."""
    t = tenancy_of(namespace, labels, policy)
    allowed = None if t.jurisdictions is None else sorted(t.jurisdictions)
    return {"tenant": t.tenant, "jurisdictions": allowed, "jurisdictionsFrom": t.source}


def _label(policy: PolicySpec) -> str:
    """The node label that names a node's jurisdiction under `policy`."""
    return policy.sovereignty.jurisdiction_label or DEFAULT_JURISDICTION_LABEL


def _node_labels(world: World) -> dict[str, Mapping[str, str]]:
    """Node labels by node name and by hostname label (decisions name nodes by hostname)."""
    out: dict[str, Mapping[str, str]] = {}
    for n in world.node_views:
        out[n.name] = n.labels
        if ann.HOSTNAME in n.labels:
            out.setdefault(n.labels[ann.HOSTNAME], n.labels)
    return out


def decision_facts(
    writes: Iterable[Write], world: World, default: PolicySpec, replica: str, at: str
) -> list[dict[str, Any]]:
    """One record per decision written: who, under which rule, where, in which mode."""
    nodes = _node_labels(world)
    out: list[dict[str, Any]] = []
    for w in writes:
        meta: Mapping[str, Any] = w.workload.get("metadata") or {}  # type: ignore[assignment]
        namespace = str(meta.get("namespace", ""))
        if w.recorded and w.written and w.written not in RECORDED:
            # Recorded ahead, then refused by the API (a conflict: the workload changed while it
            # was decided): the decision recorded never took effect; the next one will.
            out.append({"kind": "unwritten", "at": at, "replica": replica, "check": w.check,
                        "workload": workload_fields(meta), "reason": w.written})  # fmt: skip
        if w.outcome not in RECORDED or w.recorded:
            continue
        policy = world.policies.get(w.check, default)
        label = _label(policy)
        placed = list(w.placed)
        node = placed[0].rpartition("/")[0] if placed else None
        ref = world.policy_refs.get(w.check)
        out.append({
            "kind": "decision", "at": at, "replica": replica, "check": w.check,
            "policy": ref[0] if ref else None, "policyGeneration": ref[1] if ref else None,
            "workload": workload_fields(meta),
            **tenancy_fields(namespace, world.namespaces.get(namespace), policy),
            "state": w.state, "outcome": w.outcome, "mode": w.mode, "gamma": w.gamma,
            "node": node, "gpus": placed, "jurisdictionLabel": label,
            "nodeJurisdiction": (nodes.get(node) or {}).get(label) if node else None,
            "message": shorten(w.message, 300),
        })  # fmt: skip
    return out


def leader_fact(replica: str, term: str, sealed: int, named: int | None, at: str) -> dict[str, Any]:
    """A replica taking the Lease: who decides the records after it, from which hand-over on (the
    Lease's transitions, `term`), and how many pending workloads it sealed before deciding, of how
    many the Lease named as its predecessor's last batch (None: it named none; all were sealed)."""
    return {"kind": "leader", "at": at, "replica": replica, "term": term, "sealed": sealed, "named": named}


def ignored_fact(i: Ignored, replica: str, at: str) -> dict[str, Any]:
    """The record of a running workload whose engines did not keep its decision, when it is
    first found (the eviction, where the policy asks for one, is a decision record of its own)."""
    c = i.committed
    return {
        "kind": "ignored", "at": at, "replica": replica, "check": c.check,
        "workload": workload_fields(c.workload.get("metadata") or {}), "node": c.node,
        "mode": c.mode, "gamma": c.gamma, "allowed": i.allowed,
        "draftTokens": round(i.draft_tokens), "drafts": round(i.drafts),
        "message": shorten(i.message, 300),
    }  # fmt: skip


Seen = dict[tuple[str, str, str | None], dict[str, Any]]  # (pod uid, node, its label) -> who


def binding_facts(
    world: World,
    default: PolicySpec,
    replica: str,
    at: str,
    seen: Seen,
    errors: list[str] | None = None,
) -> list[dict[str, Any]]:
    """A record for every running GPU pod on a node, once per (pod, node, the node's jurisdiction
    label): its binding, and again when that label changes under it; and an `ended` record when
    a pod recorded leaves its node (finished, failed or deleted). `seen` is updated. A pod that
    cannot be read (a GPU quantity that is none) is named in `errors` and skipped alone, as the
    violations watch skips it (and is not taken for ended)."""
    nodes = _node_labels(world)
    label = _label(default)
    out, now, unread, pods = [], Seen(), set(), {}
    for pod in world.pod_views:
        namespace, node = pod.namespace, pod.node
        uid = pod.uid or f"{namespace}/{pod.name}"
        pods[uid] = pod
        if pod.gpu_error is not None:
            unread.add(uid)
            if errors is not None:
                errors.append(f"Pod {namespace}/{pod.name}: {pod.gpu_error}")
            continue
        if node is None or not pod.running or pod.gpus <= 0:
            continue
        juris = (nodes.get(node) or {}).get(label)
        key = (uid, node, juris)
        if key in seen:  # recorded already: most pods, most ticks
            now[key] = seen[key]
            continue
        now[key] = who = _who(pod)
        out.append({
            "kind": "binding", "at": at, "replica": replica, **who,
            **tenancy_fields(namespace, world.namespaces.get(namespace), default),
            "node": node, "jurisdictionLabel": label, "nodeJurisdiction": juris,
            "phase": pod.phase, "startedAt": pod.started_at,
        })  # fmt: skip
    placed = {(uid, node) for uid, node, _ in now}
    for (uid, node, juris), who in seen.items():
        if uid in unread:
            now[(uid, node, juris)] = who
        elif (uid, node) not in placed:
            placed.add((uid, node))  # once, whatever labels it was seen under
            out.append({"kind": "ended", "at": at, "replica": replica, **who, "node": node,
                        "nodeJurisdiction": juris, **_end(pods.get(uid))})  # fmt: skip
    seen.clear()
    seen.update(now)
    return out


def _who(pod: PodView) -> dict[str, Any]:
    """A pod and the workload that owns it, as a binding record names them."""
    owner = {"kind": pod.controller[0], "name": pod.controller[1]} if pod.controller else {}
    return {
        "pod": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
        "workload": {"namespace": pod.namespace, "name": owner.get("name", ""), "owner": owner},
    }


def _end(pod: PodView | None) -> dict[str, Any]:
    """How a pod left its node: its phase and its containers' last finish, or deleted (gone from
    the API: the time is when it was noticed)."""
    if pod is None:
        return {"phase": "Deleted"}
    return {"phase": pod.phase or "Unknown", "finishedAt": pod.finished_at}


def record_tick(
    audit: AuditLog,
    written: Sequence[Write],
    world: World,
    default: PolicySpec | None,
    seen: Seen,
) -> None:
    """A tick's written decisions and its GPU pods' bindings into the record (`default`: the policy
    the tick's watches use; None when no check of ours is active), then the record written. It
    fails alone: the failure is counted and logged, and the decisions go on."""
    try:
        if default is not None:
            at, errors = now_rfc3339(), list[str]()
            audit.add(decision_facts(written, world, default, audit.writer, at))
            audit.add(binding_facts(world, default, audit.writer, at, seen, errors))
            for text in errors:
                log.warning("the record skipped a pod that cannot be read: %s", text)
        audit.flush()
    except Exception:
        metrics.TICK_FAILURES.labels(part="record").inc()
        log.exception("recording this tick's decisions and bindings failed")


class SegmentTakenError(Exception):
    """Another writer wrote this segment first (the cluster's 409; a bucket's older version)."""


class StoreRefusedError(Exception):
    """The store refused a write or a read; the message says what it said."""


class Store(Protocol):
    """Where the segments are kept: the cluster (`ClusterStore`) or a bucket (`bucket.BucketStore`)."""

    def where(self) -> str: ...

    def read_segments(self) -> list[dict[str, Any]]: ...

    def create(self, index: int, spec: dict[str, Any]) -> None: ...


def read_segments(objects: Any) -> list[dict[str, Any]]:
    """Every AuditSegment as {"name", **spec}, through `objects` (a CustomObjectsApi): the writer's
    head after a start-up, and what `sovereignspec audit` reads."""
    found = cast(dict[str, Any], objects.list_cluster_custom_object(GROUP, VERSION, PLURAL))
    return [{"name": o["metadata"]["name"], **o["spec"]} for o in found["items"]]


def _refusal(exc: ApiException) -> str:
    """What the API server said (its Status message: an admission policy's own words), else the
    HTTP status."""
    try:
        said = json.loads(exc.body or "{}").get("message")
    except (ValueError, AttributeError):
        said = None
    return f"{exc.status} {exc.reason}: {said}" if said else f"{exc.status} {exc.reason}"


class ClusterStore:
    """Segments as cluster-scoped AuditSegment objects, segment N named audit-N (the embedded
    default: the API server refuses a second object of one name, so two writers cannot both
    write segment N)."""

    def __init__(self, objects: Any) -> None:
        self.objects = objects  # a CustomObjectsApi

    def where(self) -> str:
        return "this cluster (AuditSegment objects); no bucket is configured"

    def read_segments(self) -> list[dict[str, Any]]:
        return read_segments(self.objects)

    def create(self, index: int, spec: dict[str, Any]) -> None:
        name = f"audit-{index:012d}"
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AuditSegment", "metadata": {"name": name},
                "spec": spec}  # fmt: skip
        try:
            self.objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
        except ApiException as exc:
            if exc.status == 409:
                raise SegmentTakenError(name) from None
            raise


def bucket_store(settings: Any) -> Store | None:
    """The bucket `settings` name (operator Settings, or the audit CLI's arguments), or None."""
    if not settings.audit_bucket:
        return None
    from sovereignspec.operator.roles.bucket import BucketStore

    return BucketStore(
        settings.audit_endpoint, settings.audit_bucket, settings.audit_prefix, settings.audit_retention_days
    )


class AuditLog:
    """Appends records to the chain in its store (the cluster's AuditSegments, or a bucket)."""

    def __init__(self, api: client.ApiClient, writer: str, store: Store | None = None) -> None:
        self.store: Store = store or ClusterStore(client.CustomObjectsApi(api))
        self.writer = writer
        self.head: Head | None = None  # read from the API before the first write and after a 409
        self.backlog: list[dict[str, Any]] = []
        self.written = 0
        self.off: str | None = None  # why the record is not kept (its CRD is not installed)
        self.error: str | None = None  # why the last write failed
        self._opened: Seen | None = None  # the open bindings, from the first read of the head
        log.info("sovereignty record: kept in %s", self.store.where())

    def read_segments(self) -> list[dict[str, Any]]:
        return self.store.read_segments()

    def recall(self) -> Seen:
        """The bindings the record holds open (`record.open_bindings`), read when a replica first
        records: it goes on from where the last one left, across a failover or a restart. None
        can be read (the store down, the CRD missing): an empty start, said; running pods are then
        recorded as bound again, and a pod that ended meanwhile gets no `ended` record. One read of
        the segments serves this and the head, whichever is wanted first."""
        if self._opened is None:
            try:
                segments = self._read()
            except Exception as exc:  # the store's refusal, the API's, a transport error alike
                log.warning("the record's open bindings could not be read (%s: %s): starting from none",
                            type(exc).__name__, exc)  # fmt: skip
                return {}
            if self.head is None:
                with contextlib.suppress(ValueError):  # refused, and named, by the first write
                    self.head = head_of(segments)
        return self._opened or {}

    def _read(self) -> list[dict[str, Any]]:
        """Every segment; the first read also keeps the bindings they leave open, for `recall`
        (this replica has written none yet then)."""
        segments = self.read_segments()
        if self._opened is None:
            try:
                self._opened = record.open_bindings(record.records_of(segments))
            except (KeyError, TypeError, ValueError) as exc:  # named by `audit verify`
                log.warning("the record's open bindings could not be read (%s): starting from none", exc)
                self._opened = {}
        return segments

    def add(self, facts: Sequence[Mapping[str, Any]]) -> None:
        if self.off is None:
            self.backlog.extend(dict(f) for f in facts)

    def flush(self) -> bool:
        """Write the backlog, oldest first, in segments; False (and the rest kept, the reason in
        `error`) on a failure."""
        while self.backlog:
            batch = self.backlog[:SEGMENT_RECORDS]
            try:
                self._write(batch)
            except ApiException as exc:
                if exc.status in (403, 404):  # an operator newer than the chart it runs under
                    off = (
                        "the AuditSegment CRD is not installed (upgrade the chart)"
                        if exc.status == 404
                        else "the operator's role may not create AuditSegments (upgrade the chart's RBAC)"
                    )
                    if off != self.off:
                        log.error("the sovereignty record is off: %s", off)
                    self.off = self.error = off
                    metrics.AUDIT_OFF.set(1)
                    self.backlog.clear()
                    return False
                return self._failed(_refusal(exc))
            except StoreRefusedError as exc:
                return self._failed(str(exc))
            except TRANSPORT_ERRORS as exc:
                return self._failed(f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # anything else fails the write alone, said, records kept
                log.exception("writing the sovereignty record failed unexpectedly")
                return self._failed(f"{type(exc).__name__}: {exc}")
            del self.backlog[: len(batch)]
            if self.off is not None:  # a write went through: the store takes records again
                log.info("the sovereignty record is on again: %s no longer holds", self.off)
                self.off = None
                metrics.AUDIT_OFF.set(0)
        self.error = None
        metrics.AUDIT_BACKLOG.set(0)
        return True

    def _failed(self, reason: str) -> bool:
        log.warning(
            "the sovereignty record could not be written (%d records wait): %s", len(self.backlog), reason
        )
        self.error = reason
        metrics.AUDIT_BACKLOG.set(len(self.backlog))
        metrics.AUDIT_FAILURES.inc()
        return False

    def persist(self, facts: Sequence[Mapping[str, Any]]) -> int:
        """Write `facts` now, after the backlog, even while the record is off (it may be on again):
        how many of them (a prefix) are in the store. The rest stay last in the backlog."""
        ahead, written = len(self.backlog), self.written
        self.backlog.extend(dict(f) for f in facts)
        self.flush()
        return max(0, min(len(facts), self.written - written - ahead))

    def _write(self, batch: list[dict[str, Any]]) -> None:
        for attempt in range(3):
            if self.head is None:
                segments = self._read()
                try:
                    self.head = head_of(segments)
                except ValueError as exc:  # never a chain started again on top of a broken one
                    raise StoreRefusedError(
                        f"the record's head cannot be read: {exc} (`sovereignspec audit verify` names it)"
                    ) from None
            records, after = chain(self.head, batch)
            spec = {"index": self.head.segment, "first": self.head.seq, "count": len(records),
                    "writer": self.writer, "records": records}  # fmt: skip
            try:
                self.store.create(self.head.segment, spec)
            except SegmentTakenError as exc:
                if attempt == 2:
                    raise StoreRefusedError(f"segment {exc} was taken three times running") from None
                # Another replica wrote that segment (a leader that lost its Lease while paused):
                # read the chain's head again and write after it.
                log.warning("segment %s was written by another replica; appending after it", exc)
                self.head = None
                continue
            self.head = after
            self.written += len(records)
            metrics.AUDIT_RECORDS.inc(len(records))
            return


def ahead(audit: AuditLog, writes: list[Write], world: World, spec: PolicySpec) -> list[Write]:
    """audit.required: the decisions' records persisted before the decisions are written, so that
    a crash loses no record of a decision written. A placement whose record cannot be persisted
    is held (Retry, saying why, its record dropped: it is decided again); a Retry, Rejection or
    eviction, which runs nothing, is written anyway and its record waits in the backlog."""
    recordable = [w for w in writes if w.outcome in RECORDED]
    if not recordable:
        return writes
    facts = decision_facts(recordable, world, spec, audit.writer, now_rfc3339())
    done = audit.persist(facts)
    if done < len(recordable) and audit.off is not None:
        # Not installed or not permitted (the CRD or its RBAC missing: an operator newer than the
        # chart it runs under, or a rollback to one without them): said once, tried again every
        # tick, never a cluster that stops admitting because of an upgrade's order. A store that
        # exists and fails (or a bucket, configured by name) holds placements.
        return writes
    if done < len(recordable):  # the unpersisted are the backlog's last: placements leave it
        late = recordable[done:]
        if audit.backlog:  # empty when the record is off: nothing is kept then
            tail = audit.backlog[len(audit.backlog) - len(late) :]
            del audit.backlog[len(audit.backlog) - len(late) :]
            audit.backlog.extend(f for f, w in zip(tail, late, strict=True) if w.outcome != "placed")
        metrics.AUDIT_HELD.inc(sum(w.outcome == "placed" for w in late))
    why = audit.error or "unknown"
    late_ids = {id(w) for w in recordable[done:]}
    return [
        held(w, why, spec) if id(w) in late_ids and w.outcome == "placed"
        else replace(w, recorded=True) if w.outcome in RECORDED else w
        for w in writes
    ]  # fmt: skip
