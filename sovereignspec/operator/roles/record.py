"""The sovereignty record: what was decided and where the work actually ran, as a hash chain.

Each record is a plain JSON object with a sequence number (`seq`, from 0, no gaps), the digest of
the record before it (`prev`; the first names `GENESIS`) and its own `digest`: SHA-256 over its
canonical JSON (sorted keys, no spaces, UTF-8) without the `digest` field. Editing a record breaks
its digest; deleting or re-ordering one breaks the next record's `prev` or the sequence. Records are
kept in segments (`AuditSegment` objects, `operator/roles/audit.py`), one per write, named by their index,
so two replicas can never both write the next one: the API server refuses the second name.

Two kinds, with the facts a regulator asks for:

- `decision`: the workload (namespace, name, UID, owner), its tenant and allowed jurisdictions with
  where they came from, the check and policy, the outcome (Ready/Retry/Rejected/drift), the node
  and its jurisdiction label at that moment, mode and γ, the replica that decided;
- `binding`: a GPU pod bound to a node, with the node's jurisdiction label when it was seen (and
  again whenever that label changes while the pod runs), its phase and owner.

No I/O, no clock: plain dicts in, plain dicts and findings out.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GENESIS = "0" * 64  # the `prev` of the first record
KINDS = ("decision", "binding")


def canonical(record: Mapping[str, Any]) -> bytes:
    """The bytes a digest is taken over: the record without `digest`, keys sorted, no spaces."""
    body = {k: v for k, v in record.items() if k != "digest"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def digest_of(record: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(record)).hexdigest()


@dataclass(frozen=True)
class Head:
    """Where the chain ends: the next record's sequence number, the last digest, the next segment."""

    seq: int = 0
    digest: str = GENESIS
    segment: int = 0


def _as_stored(value: Any) -> Any:
    """`value` as a store gives it back: a whole float as an integer. The API server re-encodes a
    custom object's JSON (800.0 comes back as 800), so a digest taken over 800.0 would never match
    the record read back."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _as_stored(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_stored(v) for v in value]
    return value


def chain(head: Head, facts: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], Head]:
    """`facts` as records following `head`, and the head after them."""
    out: list[dict[str, Any]] = []
    seq, prev = head.seq, head.digest
    for fact in facts:
        record = {**_as_stored(fact), "seq": seq, "prev": prev}
        record["digest"] = digest_of(record)
        out.append(record)
        seq, prev = seq + 1, record["digest"]
    return out, Head(seq, prev, head.segment + 1)


def head_of(segments: Sequence[Mapping[str, Any]]) -> Head:
    """The head after the last of `segments` ({"index", "records"}), as the writer resumes it: the
    next segment after the last one, the chain going on from the last record in any of them.
    ValueError, naming it, where the last record cannot be read (no sequence number or digest):
    the writer must not start the chain again on top of it."""
    if not segments:
        return Head()
    try:
        ordered = sorted(segments, key=lambda s: int(s["index"]))
    except (KeyError, TypeError, ValueError):
        raise ValueError("a segment has no index that is a number") from None
    for segment in reversed(ordered):
        records = list(segment.get("records") or [])
        if not records:
            continue  # an empty segment (written by hand): the chain goes on from the one before
        last = records[-1]
        seq, digest = last.get("seq") if isinstance(last, Mapping) else None, None
        if isinstance(last, Mapping) and isinstance(last.get("digest"), str):
            digest = str(last["digest"])
        if not isinstance(seq, int) or isinstance(seq, bool) or digest is None:
            name = segment.get("name", segment["index"])
            raise ValueError(f"the last record of segment {name} has no sequence number or digest")
        return Head(seq + 1, digest, int(ordered[-1]["index"]) + 1)
    return Head(segment=int(ordered[-1]["index"]) + 1)


@dataclass(frozen=True)
class Finding:
    """One way the record fails: where (segment and record) and what."""

    segment: str
    seq: int | None
    what: str

    def __str__(self) -> str:
        at = (
            f"record {self.seq} of segment {self.segment}"
            if self.seq is not None
            else f"segment {self.segment}"
        )
        return f"{at}: {self.what}"


def verify(segments: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Every break in the chain, from the first record: a segment missing from the sequence, a
    record whose digest is not its content's, one that does not follow the one before (`prev`),
    a sequence number out of place. An intact chain gives []."""
    found: list[Finding] = []
    ordered = sorted(segments, key=lambda s: int(s["index"]))
    prev, seq = GENESIS, 0
    for expected, segment in enumerate(ordered):
        name = str(segment.get("name", segment["index"]))
        if int(segment["index"]) != expected:
            found.append(
                Finding(name, None, f"segment {expected} is missing (the next present is {segment['index']})")
            )
        prev, seq = _walk(name, segment.get("records") or [], prev, seq, found)
    return found


def _walk(
    name: str, records: Iterable[Mapping[str, Any]], prev: str, seq: int, found: list[Finding]
) -> tuple[str, int]:
    """`records` checked as the chain's next, after the record of digest `prev` and number
    `seq` - 1; their breaks added to `found`; returns where the chain then stands."""
    for record in records:
        at = record.get("seq")
        if record.get("digest") != digest_of(record):
            found.append(Finding(name, at, "its digest is not its content's: edited after it was written"))
        if record.get("prev") != prev:
            found.append(
                Finding(name, at, "it does not follow the record before it (removed, reordered or forked)")
            )
        if at != seq:
            found.append(Finding(name, at, f"sequence number {at} where {seq} was due"))
        prev = str(record.get("digest"))
        seq = (at if isinstance(at, int) else seq) + 1
    return prev, seq


def verify_rewrite(first: Mapping[str, Any], later: Mapping[str, Any], version: str) -> list[Finding]:
    """A later version of a segment's object, which Object Lock keeps beside the first (the one
    readers take and `verify` checks). A replica that lost the race for that segment wrote a whole
    chain from the same record as the first version's writer did; a version that is not one was
    written over it: each record edited, removed, reordered or renumbered there is named, with
    the version. [] for a loser's segment, or for a forger's who recomputed every digest (then
    only the first version, which no one can change, stands)."""
    name = f"{first.get('name', first.get('index'))} (later version {version})"
    records = list(first.get("records") or [])
    if not records:  # nothing to start from: the first version itself is what verify judges
        return []
    prev, seq = records[0].get("prev"), records[0].get("seq")
    found: list[Finding] = []
    if not isinstance(prev, str) or not isinstance(seq, int):
        return found
    if later.get("index") != first.get("index"):
        found.append(Finding(name, None, f"it says it is segment {later.get('index')}"))
    _walk(name, later.get("records") or [], prev, seq, found)
    return found


def records_of(segments: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every record, in chain order."""
    ordered = sorted(segments, key=lambda s: int(s["index"]))
    return [dict(r) for s in ordered for r in (s.get("records") or [])]


def open_bindings(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str | None], dict[str, Any]]:
    """The bindings `records` (in chain order) leave open: (pod uid, node, the node's label) -> the
    pod and its workload, for every pod and node bound and not ended since (under the label of its
    latest binding record: a relabelled node is recorded again).
    What a replica that starts deciding carries on from: a pod that ended while none decided is
    then recorded as ended, and one still running is not recorded as bound again."""
    held: dict[tuple[str, str], tuple[str | None, dict[str, Any]]] = {}  # the latest label's binding
    for r in records:
        kind = r.get("kind")
        if kind not in ("binding", "ended"):
            continue
        pod = dict(r.get("pod") or {})
        uid = str(pod.get("uid") or f"{pod.get('namespace', '')}/{pod.get('name')}")
        where = (uid, str(r.get("node") or ""))
        if kind == "ended":
            held.pop(where, None)
            continue
        label = r.get("nodeJurisdiction")
        who = {"pod": pod, "workload": dict(r.get("workload") or {})}
        held[where] = (None if label is None else str(label), who)
    return {(uid, node, label): who for (uid, node), (label, who) in held.items()}


def outside(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Bindings on a node, and admissions by a worker cluster, whose jurisdiction is not one the
    namespace allowed."""
    out = []
    for r in records:
        allowed = r.get("jurisdictions")
        where = {"binding": "nodeJurisdiction", "admission": "workerJurisdiction"}.get(str(r.get("kind")))
        if where is not None and allowed is not None and r.get(where) not in allowed:
            out.append(dict(r))
    return out


def unrecorded(records: Iterable[Mapping[str, Any]], admitted: Iterable[str]) -> list[str]:
    """UIDs of admitted workloads (`admitted`) no decision record names."""
    seen = {r.get("workload", {}).get("uid") for r in records if r.get("kind") == "decision"}
    return sorted(uid for uid in admitted if uid not in seen)


def where(records: Iterable[Mapping[str, Any]], namespace: str, name: str) -> list[dict[str, Any]]:
    """The decisions on workload (or Job) `name` in `namespace` and the bindings of its pods; or
    a pod's own bindings by its name (a pod of no owner, which no decision concerns)."""
    out = []
    for r in records:
        w = r.get("workload") or {}
        names = (w.get("name"), (w.get("owner") or {}).get("name"), (r.get("pod") or {}).get("name"))
        if w.get("namespace") == namespace and name in names:
            out.append(dict(r))
    return out


EXPORT_FIELDS = (
    "seq", "at", "kind", "namespace", "workload", "owner", "uid", "pod", "tenant", "jurisdictions",
    "node", "nodeJurisdiction", "state", "mode", "gamma", "check", "replica", "digest",
)  # fmt: skip


def flat(record: Mapping[str, Any]) -> dict[str, str]:
    """One record as a CSV row (EXPORT_FIELDS)."""
    w = record.get("workload") or {}
    owner = w.get("owner") or {}
    row = {
        "seq": record.get("seq"),
        "at": record.get("at"),
        "kind": record.get("kind"),
        "namespace": w.get("namespace"),
        "workload": w.get("name"),
        "owner": f"{owner.get('kind', '')}/{owner.get('name', '')}" if owner else "",
        "uid": w.get("uid"),
        "pod": (record.get("pod") or {}).get("name", ""),
        "tenant": record.get("tenant"),
        "jurisdictions": " ".join(record.get("jurisdictions") or []),
        "node": record.get("node"),
        "nodeJurisdiction": record.get("nodeJurisdiction"),
        "state": record.get("state") or record.get("phase"),
        "mode": record.get("mode"),
        "gamma": record.get("gamma"),
        "check": record.get("check"),
        "replica": record.get("replica"),
        "digest": record.get("digest"),
    }
    return {k: "" if v is None else str(v) for k, v in row.items()}


def export(records: Iterable[Mapping[str, Any]], fmt: str) -> str:
    """`records` as JSON lines (each record whole, digests included) or CSV (EXPORT_FIELDS)."""
    if fmt == "jsonl":
        return "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records)
    buf = io.StringIO()
    out = csv.DictWriter(buf, EXPORT_FIELDS, lineterminator="\n")
    out.writeheader()
    for r in records:
        out.writerow(flat(r))
    return buf.getvalue()
