"""Leader election on a coordination.k8s.io Lease: of the operator's replicas only the holder decides.

The protocol is client-go's (`tools/leaderelection`), so that `kubectl get lease` reads as it does
for Kueue or kube-scheduler: the holder renews every `retry_period`; a candidate takes the Lease only
when it has seen the same record unchanged for the record's `leaseDurationSeconds` on its own clock
(never the holder's clock: the two may disagree); the holder stops writing once it has failed to
renew for `renew_deadline` (< lease duration). Every write of the operator goes through `fence()`,
which refuses it (NotLeaderError) once this process can no longer be sure it holds the Lease, bounds
its lifetime by what is left of the claim, and counts those in flight so that a graceful hand-over
(`release`) waits for them, and never hands over while one is still on its way. None of that can
stop a write a paused process (SIGSTOP, a long GC, a frozen VM) sends after its check: each write is
therefore guarded by the resourceVersion it was decided on, and a new leader, before its first
decision, rewrites every workload a predecessor could still be deciding (`Role.seal`), so that such
a late write fails, or landed before and is read (docs/architecture.md).

Which workloads those are is in the Lease itself (`announce`): before a batch of decisions is
sent, its keys are written into the Lease's `DECIDING` annotation, guarded by the Lease's
resourceVersion. A takeover is a write guarded by the same version, so once a successor holds the
Lease no announcement of its predecessor can land, and a predecessor whose announcement fails sends
nothing of that batch. The successor therefore seals only what the Lease it took names (`inherited`),
not every pending workload: one write per batch of decisions buys a takeover whose cost does not
grow with the backlog.

A standby also watches the Lease (`observe`): it sees each renewal when it is written rather than
at its next read, up to a retry period later, so the lease's duration runs from the renewal it last
saw and a takeover after a loss comes that much sooner. Its rounds still read the Lease before any
take; the watch only makes the clock they judge by start on time.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sovereignspec.operator.runtime import metrics
from sovereignspec.operator.runtime.informer import Informer
from sovereignspec.operator.runtime.writer import API_ERRORS, NotLeaderError

log = logging.getLogger(__name__)

LEASES = "coordination.k8s.io/v1"
# The keys of the batch of decisions the holder sends now (JSON list), written before the batch.
DECIDING = "sovereignspec.io/deciding"


def inherited_from(lease: dict[str, Any] | None) -> frozenset[str] | None:
    """What a Lease taken over says its holder may still have on its way: the keys it announced
    last (no Lease: nothing; a Lease without the annotation, or one unreadable: None, unknown, as a
    predecessor of an older version leaves it, and every pending workload must be sealed)."""
    if lease is None:
        return frozenset()
    text = ((lease.get("metadata") or {}).get("annotations") or {}).get(DECIDING)
    if text is None:
        return None
    try:
        keys = json.loads(text)
    except ValueError:
        return None
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        return None
    return frozenset(keys)


# How long after a lease runs out (on a candidate's clock) the candidate tries to take it: enough
# that its clock's reading is past the lease's end when it checks.
EXPIRY_MARGIN = 0.01


@dataclass(frozen=True)
class LeaseRecord:
    """The Lease's spec as client-go writes it."""

    holder: str
    duration_s: int
    acquire_time: str
    renew_time: str
    transitions: int = 0

    @classmethod
    def of(cls, lease: dict[str, Any] | None) -> LeaseRecord | None:
        if lease is None:
            return None
        spec = lease.get("spec") or {}
        duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration_s=duration if isinstance(duration, int) else 0,
            acquire_time=str(spec.get("acquireTime") or ""),
            renew_time=str(spec.get("renewTime") or ""),
            transitions=transitions if isinstance(transitions, int) else 0,
        )

    def spec(self) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_s,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


def claim(
    current: LeaseRecord | None, unchanged_for: float, me: str, now: str, duration_s: int
) -> LeaseRecord | None:
    """The record that holds the Lease for `me`, or None while another holder's lease still runs.

    `unchanged_for`: seconds, on this process's clock, since it first saw `current` as it is. A
    holder's lease runs for its own `leaseDurationSeconds` from then; an empty holder (a lease
    handed over) or our own record can be taken at once.
    """
    if current is None:
        return LeaseRecord(me, duration_s, now, now, 0)
    if current.holder == me:
        return replace(current, duration_s=duration_s, renew_time=now)
    if current.holder and unchanged_for < max(current.duration_s, 1):
        return None
    return LeaseRecord(me, duration_s, now, now, current.transitions + 1)


def micro_time(wall: float) -> str:
    """A MicroTime as the API server stores it."""
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        # client-go's own rule: a holder must give up before a candidate may take over, and get
        # more than one try (with jitter) to renew before it gives up.
        if not lease_duration > renew_deadline > retry_period * 1.2 > 0:
            raise ValueError(
                f"leader election: need lease duration > renew deadline > 1.2 x retry period > 0; got "
                f"{lease_duration:g} s, {renew_deadline:g} s, {retry_period:g} s"
            )
        self.api = api
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration, self.renew_deadline, self.retry_period = (
            lease_duration,
            renew_deadline,
            retry_period,
        )
        self._monotonic, self._wall = monotonic, wall
        self.on_started_leading: Callable[[], None] = lambda: None
        self.on_stopped_leading: Callable[[], None] = lambda: None
        self._cond = threading.Condition()
        self._leader = False
        self._closed = False  # released or lost: this process never leads again
        self._renewed = float("-inf")  # monotonic time our last successful claim was sent
        self._inflight = 0
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Every write of the Lease (renewal, announcement, hand-over) under one lock, each guarded by
        # the version the last one returned: the announcement in force is always in the Lease.
        self._lease_lock = threading.Lock()
        self._version: str | None = None
        self._announced: list[str] = []
        # What the Lease we took named as on its way (`inherited_from`), set when we first lead.
        self.inherited: frozenset[str] | None = None
        self._watch: Informer | None = None  # a standby's watch of the Lease (`observe`)

    @property
    def path(self) -> str:
        return f"/apis/{LEASES}/namespaces/{self.namespace}/leases"

    # -- who leads ---------------------------------------------------------------------------------

    def _leading_locked(self) -> bool:
        return self._leader and not self._closed and self._monotonic() < self._renewed + self.renew_deadline

    def leading(self) -> bool:
        with self._cond:
            return self._leading_locked()

    def term(self) -> str:
        """Who leads, and since which hand-over: the identity and the Lease's transitions, which
        every takeover increments (a new leader's first writes carry it: `Role.seal`)."""
        with self._cond:
            transitions = self._observed.transitions if self._observed is not None else 0
        return f"{self.identity} (term {transitions})"

    @contextmanager
    def fence(self) -> Iterator[float]:
        """Around every write: refused unless this process surely holds the Lease now. Yields the
        seconds left before this process must stop writing: the write's whole lifetime, client and
        server side, is bounded by it (`Writer`), so no write of ours outlives our claim by more
        than the server's rounding, well inside the margin before a candidate may take over."""
        with self._cond:
            if not self._leading_locked():
                raise NotLeaderError(f"{self.identity} does not hold Lease {self.namespace}/{self.name}")
            self._inflight += 1
            left = self._renewed + self.renew_deadline - self._monotonic()
        try:
            yield left
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    # -- one round -----------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        resp = self.api.call_api(
            *self.api.param_serialize(
                method=method,
                resource_path=path,
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                body=body,
                auth_settings=["BearerToken"],  # a ServiceAccount token is sent only so
            ),
            # Shorter than the renew deadline: a hung request must not outlive our claim.
            _request_timeout=(2.0, max(self.renew_deadline / 2, 1.0)),
        )
        data = resp.read()
        try:
            doc = json.loads(data) if data else {}
        except ValueError:
            doc = {}
        return resp.status, doc if isinstance(doc, dict) else {}

    def _lease(
        self, record: LeaseRecord, resource_version: str | None = None, deciding: list[str] | None = None
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "annotations": {DECIDING: json.dumps(deciding or [])},
        }
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        return {"apiVersion": LEASES, "kind": "Lease", "metadata": meta, "spec": record.spec()}

    def _write(
        self, record: LeaseRecord, read: dict[str, Any], deciding: list[str] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Replace the Lease as `read` with `record`, guarded by the version read."""
        body = self._lease(record, read["metadata"]["resourceVersion"], deciding)
        return self._call("PUT", f"{self.path}/{self.name}", body)

    def announce(self, keys: list[str]) -> None:
        """Before a batch of decisions is sent: its keys into the Lease (`DECIDING`), guarded by the
        version of our last write of it, with our renewal. Raises NotLeaderError, and the batch must
        not be sent, unless that write landed: then no successor held the Lease before it, and one
        that takes it after reads these keys (`inherited`) and seals them first."""
        with self._lease_lock:
            with self._cond:
                if not self._leading_locked() or self._observed is None or self._version is None:
                    raise NotLeaderError(f"{self.identity} does not hold Lease {self.namespace}/{self.name}")
                record = replace(self._observed, renew_time=micro_time(self._wall()))
            sent = self._monotonic()
            body = self._lease(record, self._version, keys)
            status, written = self._call("PUT", f"{self.path}/{self.name}", body)
            if status == 409:
                raise NotLeaderError(f"Lease {self.namespace}/{self.name} changed under {self.identity}")
            if status >= 400:
                raise ApiException(status=status, reason=str(written.get("message", ""))[:300])
            self._version, self._announced = written["metadata"]["resourceVersion"], list(keys)
            with self._cond:
                self._observed, self._observed_at = record, sent
                self._renewed = sent

    def try_acquire_or_renew(self) -> bool:
        """One round: read the Lease, and take or renew it if it is ours to take."""
        with self._lease_lock:
            return self._acquire_or_renew()

    def _acquire_or_renew(self) -> bool:
        sent = self._monotonic()
        status, lease = self._call("GET", f"{self.path}/{self.name}")
        # A record is observed when its answer is here (client-go's observedTime), not when asked:
        # an answer that took long cannot make another's lease look older than it is.
        seen = self._monotonic()
        if status == 404:
            found = None
        elif status >= 400:
            raise ApiException(status=status, reason=str(lease.get("message", ""))[:300])
        else:
            found = lease
        current = LeaseRecord.of(found)
        with self._cond:  # the watch (`observe`) may have seen this record first, and sooner
            if current != self._observed:
                self._observed, self._observed_at = current, seen
            unchanged_for = seen - self._observed_at
        want = claim(current, unchanged_for, self.identity, micro_time(self._wall()),
                     round(self.lease_duration))  # fmt: skip
        if want is None:
            return False
        # A renewal keeps our announcement in force; a takeover starts with none of its own.
        deciding = self._announced if self._leader else []
        if found is None:
            status, written = self._call("POST", self.path, self._lease(want, deciding=deciding))
        else:
            # Guarded by the version read: of two candidates that saw the same expired record, one wins.
            status, written = self._write(want, found, deciding)
        if status == 409:
            return False
        if status >= 400:
            raise ApiException(status=status, reason=str(written.get("message", ""))[:300])
        self._version = (written.get("metadata") or {}).get("resourceVersion")
        with self._cond:
            if not self._leader:  # taking it: what the Lease says its last holder had on its way
                self.inherited = inherited_from(found)
            self._observed, self._observed_at = want, sent
            self._renewed = sent
        return True

    def observe(self, kind: str, lease: dict[str, Any]) -> bool:
        """A change of the Lease as the watch delivers it: a record not seen before is seen now,
        as a round's read would see it, only sooner. Never moves what a round saw back in time: the
        moment stamped is now, after the change was written. Returns False (no tick to wake)."""
        current = LeaseRecord.of(None if kind == "DELETED" else lease)
        with self._cond:
            if not self._leader and current != self._observed:
                self._observed, self._observed_at = current, self._monotonic()
        return False

    # -- running -----------------------------------------------------------------------------------

    def start(self) -> LeaderElector:
        # Only its own Lease: the field selector is what lets the Role name it (`list` and `watch`
        # on one resourceName). A Role without them (an older chart) costs the head start, said once.
        # Started first, so that a first round that leads at once stops it (`run`).
        query = [("fieldSelector", f"metadata.name={self.name}")]
        self._watch = Informer(
            self.api, self.path, "lease", query=query, wake=self.observe, forbidden_is_absent=True
        ).start()
        self._thread = threading.Thread(target=self.run, name="leader-election", daemon=True)
        self._thread.start()
        return self

    def _unwatch(self) -> None:
        """The standby's watch stopped. Never raises: it runs in the election's thread between
        taking (or losing) the Lease and saying so, and that thread must live to renew it."""
        if self._watch is not None:
            try:
                self._watch.stop()
            except Exception:
                log.exception("leader election: stopping the Lease's watch failed; the election goes on")

    def run(self) -> None:
        """Try every retry period (jittered); lead from the first success; stop for good on a loss."""
        log.info("leader election: %s competes for Lease %s/%s", self.identity, self.namespace, self.name)
        while not self._stop.is_set():
            try:
                ok = self.try_acquire_or_renew()
            except API_ERRORS as exc:
                ok = False
                log.warning("leader election: Lease %s/%s: %s", self.namespace, self.name, exc)
            with self._cond:
                if self._closed:
                    return
                started = ok and not self._leader
                taken = self._observed is not None and self._observed.holder not in ("", self.identity)
                lost = (
                    self._leader
                    and not ok
                    and (taken or self._monotonic() >= self._renewed + self.renew_deadline)
                )
                if started:
                    self._leader = True
                if lost:
                    self._leader, self._closed = False, True
            if started:
                self._unwatch()  # a leader learns of the Lease from its own writes
                log.info("leader election: %s leads now", self.identity)
                metrics.LEADER.set(1)
                metrics.LEADER_TRANSITIONS.inc()
                self.on_started_leading()
            if lost:
                self._unwatch()
                metrics.LEADER.set(0)
                holder = self._observed.holder if self._observed else ""
                log.error(
                    "leader election: %s lost Lease %s/%s (%s); stopping",
                    self.identity,
                    self.namespace,
                    self.name,
                    f"now held by {holder}" if taken else f"not renewed for {self.renew_deadline:g} s",
                )
                self.on_stopped_leading()
                return
            self._stop.wait(self.next_try())

    def next_try(self) -> float:
        """Seconds to the next round: a retry period, jittered; for a candidate no later than the
        moment the lease it sees runs out on its clock, so that a standby takes over then rather
        than up to a retry period after it (a failover's time is the lease's, not the lease's and
        a poll's). Never sooner than that moment: the lease is not taken early."""
        wait = self.retry_period * random.uniform(1.0, 1.2)
        with self._cond:
            seen = self._observed
            if self._leader or seen is None or seen.holder in ("", self.identity):
                return wait
            left = self._observed_at + max(seen.duration_s, 1) - self._monotonic()
        # Already run out: this round could not take it (another did, or the API failed): wait.
        return min(wait, left + EXPIRY_MARGIN) if left > 0 else wait

    def release(self, wait: float = 10.0) -> bool:
        """Stop leading for good: refuse new writes, let those in flight end (up to `wait` s), then
        hand the Lease over at once (an empty holder) rather than make the next leader wait out its
        duration. True if it was handed over."""
        self._stop.set()
        self._unwatch()
        with self._cond:
            self._closed = True
            ended = self._cond.wait_for(lambda: self._inflight == 0, timeout=wait)
            held, self._leader = self._leader, False
            inflight = self._inflight
        metrics.LEADER.set(0)
        if not held:
            return False
        if not ended:
            # A write still on its way could land after a successor took over at once: let the
            # Lease run out instead (the successor then waits its duration, past our writes' bound).
            log.warning(
                "leader election: %d write(s) still in flight after %g s; Lease %s/%s not handed over",
                inflight,
                wait,
                self.namespace,
                self.name,
            )
            return False
        try:
            status, lease = self._call("GET", f"{self.path}/{self.name}")
            current = LeaseRecord.of(lease if status < 400 else None)
            if current is None or current.holder != self.identity:
                return False
            now = micro_time(self._wall())
            handed = LeaseRecord("", 1, now, now, current.transitions)
            with self._lease_lock:  # our writes have ended: nothing on its way to announce
                status, _ = self._write(handed, lease, [])
        except API_ERRORS as exc:
            log.warning(
                "leader election: could not hand Lease %s/%s over: %s", self.namespace, self.name, exc
            )
            return False
        if status < 400:
            log.info("leader election: %s handed Lease %s/%s over", self.identity, self.namespace, self.name)
        return status < 400
