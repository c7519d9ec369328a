"""What the worker and the dispatcher roles share: settings, the tick's report, the writer and its
thread pool, the AdmissionCheck reconciler, the clock, and the workloads left alone after a
conflicting write. Each role's tick is its own (`controller.Controller`, `dispatcher`)."""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.workloads import condition, key_of, our_entry
from sovereignspec.operator.roles.checks import CheckReconciler
from sovereignspec.operator.runtime.informer import ClusterCache, DispatchCache
from sovereignspec.operator.runtime.writer import API_ERRORS, ConflictError, Writer

log = logging.getLogger(__name__)

# Placements per announcement (`Role.send`): their keys well inside the 256 KiB an object's
# annotations may hold, and one Lease write per this many decisions.
ANNOUNCE_KEYS = 256

# Rounds of sealing (`Role.seal`) before a new leader gives up for this tick and tries again.
SEAL_ROUNDS = 5


T = TypeVar("T")


def _segments(items: list[T], placing: Callable[[T], str | None]) -> Iterator[tuple[list[T], list[str]]]:
    """`items` in order, cut so that each piece holds at most ANNOUNCE_KEYS placements."""
    segment: list[T] = []
    keys: list[str] = []
    for item in items:
        key = placing(item)
        if key is not None and len(keys) == ANNOUNCE_KEYS:
            yield segment, keys
            segment, keys = [], []
        segment.append(item)
        if key is not None:
            keys.append(key)
    if segment:
        yield segment, keys


DECISION_REASONS = frozenset({"SpeculativeDecode", "PlainDecode"})


class Laps:
    """Where a tick's time goes: `lap(step)` adds the seconds since the last lap to `step`."""

    def __init__(self) -> None:
        self.mark = time.monotonic()
        self.spent: dict[str, float] = defaultdict(float)

    def __call__(self, step: str) -> None:
        now = time.monotonic()
        self.spent[step] += now - self.mark
        self.mark = now

    def text(self) -> str:
        return ", ".join(f"{step} {s:.2f}" for step, s in self.spent.items() if s >= 0.005)


@dataclass(frozen=True)
class Settings:
    controller_name: str = "sovereignspec.io/speculation"
    field_manager: str = "sovereignspec-controller"
    write_workers: int = 8
    tick_limit: int = 500  # workloads placed per tick (view.first_placements)
    telemetry_cache_seconds: float = 1.0
    # A cache that cannot be listed or watched for this long fails the tick (and, repeated, the
    # liveness probe); shorter gaps (an API server restart) only pause the decisions.
    unsynced_grace_seconds: float = 60.0
    nominate: int = 1  # dispatcher role: worker clusters nominated per workload (the best first)
    # Online calibration (operator/decision/learning.py): how often a profile is refitted, over how long.
    learn_refit_seconds: float = 60.0
    learn_window_seconds: float = 3600.0
    identity: str = ""  # this replica, as its Lease names it (the sovereignty record's writer)
    audit_required: bool = True  # a placement is written only once its record is persisted
    # The record's bucket (S3, Object Lock); none: AuditSegment objects in the cluster.
    audit_bucket: str = ""
    audit_endpoint: str = ""
    audit_prefix: str = "sovereignspec/audit/"
    audit_retention_days: int = 400


@dataclass
class TickReport:
    decided: int = 0
    conflicts: int = 0
    more: bool = False  # another policy group still has pending work: tick again now
    reevaluate_after: float = 10.0
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    failures: list[str] = field(default_factory=list)  # what failed alone this tick


class Role:
    def __init__(
        self,
        api: client.ApiClient,
        profiles: ProfileSet,
        settings: Settings,
        cache: ClusterCache | DispatchCache,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.profiles = profiles
        self.settings = settings
        self.cache = cache
        self.clock = clock  # wall time for decisions (telemetry ages, snapshots); tests may fix it
        self.writer = Writer(api, settings.field_manager)
        self.check_reconciler = CheckReconciler(
            cache.checks, cache.policies, self.writer, settings.controller_name, profiles
        )
        # The next tick's placements at most (`main._catch_up`: a new leader's first batch, small, so
        # that its first decision does not wait for its predecessor's whole backlog to be planned).
        self.first_batch: int | None = None
        self._pool = ThreadPoolExecutor(settings.write_workers, thread_name_prefix="sovereignspec-write")
        # Workloads whose write conflicted, at the resourceVersion that conflicted: not decided
        # again until the watch brings a newer one (re-deciding the same stale copy cannot succeed).
        self._conflicted: dict[str, int | None] = {}

    def tick(self) -> TickReport:
        raise NotImplementedError

    def reconcile_checks(self) -> tuple[dict[str, tuple[str, PolicySpec]], dict[str, PolicySpec]]:
        return self.check_reconciler.reconcile()

    def send(
        self, items: list[T], placing: Callable[[T], str | None], write: Callable[[T], str]
    ) -> list[str]:
        """Each item written (`write`, in the pool), its outcome in order, in segments of at most
        ANNOUNCE_KEYS placements (`placing`: the workload's key where the item gives it resources),
        each segment's placements announced before any of it is sent and the segment ended before
        the next is announced: a successor that takes the Lease seals what it names, and nothing
        else of ours can be on its way. A segment not announced is not sent ("error")."""
        return self._send(items, list(_segments(items, placing)), write)

    def send_recorded(
        self,
        items: list[T],
        placing: Callable[[T], str | None],
        write: Callable[[T], str],
        ahead: Callable[[list[T]], list[T]],
    ) -> tuple[list[T], list[str]]:
        """`send`, after `ahead` (audit.required: the records persisted, a placement whose record
        failed turned into a hold, every item kept in its place), which runs beside the first
        segment's announcement: both are owed before anything is sent and neither needs the other,
        so a tick's first decision waits for one of them, not both in turn. The announcement names
        the placements as they were before `ahead`; one held since is named and not sent, and a
        successor's seal of it changes nothing. Returns the items as sent and their outcomes."""
        segments = list(_segments(items, placing))
        keys = segments[0][1] if segments else []
        first = self._pool.submit(self.announce, keys) if keys else None
        try:
            recorded = ahead(items)
        finally:
            named = first.result() if first is not None else True
        if len(recorded) != len(items):
            raise ValueError(f"the record ahead kept {len(recorded)} of {len(items)} writes")
        return recorded, self._send(recorded, segments, write, named)

    def _send(
        self, items: list[T], segments: list[tuple[list[T], list[str]]], write: Callable[[T], str],
        first_named: bool | None = None,
    ) -> list[str]:  # fmt: skip
        """`items` written in the cuts `segments` made (of these items, or of what they were before
        the record ahead), each segment's keys announced first unless `first_named` says how the
        first one's announcement went."""
        outcomes: list[str] = []
        at = 0
        for i, (segment, keys) in enumerate(segments):
            part, at = items[at : at + len(segment)], at + len(segment)
            named = first_named if i == 0 and first_named is not None else not keys or self.announce(keys)
            if not named:
                outcomes += ["error"] * len(part)
                continue
            outcomes += list(self._pool.map(write, part))
        return outcomes

    def announce(self, keys: list[str]) -> bool:
        """A batch's keys announced before it is sent (`Writer.announce`); False: not announced (no
        longer leading, the Lease unreachable), and the batch must not be sent."""
        try:
            self.writer.announce(keys)
        except API_ERRORS as exc:
            log.warning("not sending %d decision(s): announcing them in the Lease failed: %s", len(keys), exc)
            return False
        return True

    def seal(self, term: str, only: frozenset[str] | None = None) -> int:
        """Before a new leader's first decision: make every decision a predecessor may still have
        on its way fail, or be read. A leader paused between its Lease check and its write (a
        SIGSTOP, a long GC, a frozen VM) sends that write whenever it resumes; the resourceVersion
        it carries guards only its own Workload, and its GPU may by then be given to another. So
        every workload a predecessor could be deciding (our entry Pending, quota reserved) gets a
        new resourceVersion first: our entry's message names this leader and its term, written
        guarded by the version read. A late write then conflicts; one that landed first makes the
        seal conflict instead, and the cache is caught up (and sealed again) until it holds it.
        `only`: the keys the Lease taken over named as on their way (`LeaderElector.announce`);
        None: unknown, every such workload. Returns the workloads sealed; raises RuntimeError if
        they keep changing (the caller seals again before deciding)."""
        _, known = self.reconcile_checks()
        message = f"to be decided by {term}"
        sealed = 0
        for _ in range(SEAL_ROUNDS):
            todo = []
            for wl in self.cache.workloads.items():
                if only is not None and key_of(wl) not in only:
                    continue
                entry = our_entry(wl, set(known))
                if (
                    entry is not None
                    and entry.get("state") == "Pending"
                    and entry.get("message") != message
                    and condition(wl, "QuotaReserved")
                ):
                    todo.append((wl, entry))
            if not todo:
                return sealed
            futures = [self._pool.submit(self._seal_one, wl, entry, message) for wl, entry in todo]
            done = [f.result() for f in futures]
            sealed += sum(done)
            if all(done):
                return sealed
            self.cache.workloads.catch_up()  # what a predecessor wrote meanwhile, before sealing again
        raise RuntimeError(f"workloads kept changing while {term} sealed them; sealing again")

    def _seal_one(self, wl: dict[str, Any], entry: dict[str, Any], message: str) -> bool:
        try:
            written = self.writer.check_state(wl, str(entry["name"]), "Pending", message, entry)
        except ConflictError:
            return False
        self.cache.workloads.put(written)
        return True

    def repost_events(self, committed: Iterable[Any]) -> None:
        """A decision's Event can be lost to a crash between the status write and the Event; after a
        start-up, post it again from the check entry (`ledger.Committed`) where the workload has
        none of ours."""
        committed = list(committed)
        if not committed:
            return
        try:
            events = self._list("/api/v1/events", [("fieldSelector", "source=sovereignspec")])
        except ApiException as exc:
            log.warning("could not list our Events to re-post lost ones: %s", exc.reason)
            return
        seen = {
            (e.get("involvedObject") or {}).get("uid") for e in events if e.get("reason") in DECISION_REASONS
        }
        for c in committed:
            uid = c.workload.get("metadata", {}).get("uid")
            if uid in seen or c.part:  # one Event per workload, its pods spread or not
                continue
            reason = "SpeculativeDecode" if c.gamma > 0 else "PlainDecode"
            message = f"(re-posted after a restart) {c.entry.get('message', '')}"
            self.writer.event(dict(c.workload), "Workload", reason, message)

    def _list(
        self, path: str, query: list[tuple[str, str]] | None = None, accept: str | None = None
    ) -> list[dict[str, Any]]:
        """A raw LIST (JSON, no model classes), for what is read once: our Events after start-up."""
        resp = self.api.call_api(
            *self.api.param_serialize(
                method="GET",
                resource_path=path,
                query_params=query or [],
                header_params={"Accept": accept or "application/json"},
                # The client's own auth path: a bearer token (ServiceAccount, OIDC) is sent only so.
                auth_settings=["BearerToken"],
            )
        )
        data = resp.read()
        if resp.status >= 400:
            raise ApiException(status=resp.status, reason=data.decode(errors="replace")[:300])
        doc = json.loads(data)
        kind = doc.get("kind", "").removesuffix("List")
        version = doc.get("apiVersion")
        for item in doc.get("items") or []:
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", version)
        return list(doc.get("items") or [])
