"""The worker's watches over what actually runs (`violations.py` finds; this tells): a GPU pod
outside its namespace's jurisdictions, a running workload whose engines do not keep its decision,
and one whose speculation has become a net loss for its GPU (told, never evicted). Each is counted
and told once while it lasts (a Warning Event, a log line, the metrics) and written to the
sovereignty record; an ignored decision is evicted to be decided again where
its policy says so (`watch.evictIgnored`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from sovereignspec.operator.border.policy import PolicySpec
from sovereignspec.operator.border.workloads import EVENT_LIMIT, MESSAGE_LIMIT
from sovereignspec.operator.border.world import World
from sovereignspec.operator.decision.ledger import Committed
from sovereignspec.operator.decision.plan import EventNote, Write, shorten
from sovereignspec.operator.decision.view import View
from sovereignspec.operator.decision.violations import Ignored, ignored, violations
from sovereignspec.operator.roles.audit import AuditLog, ignored_fact
from sovereignspec.operator.runtime import metrics
from sovereignspec.operator.runtime.writer import now_rfc3339

log = logging.getLogger(__name__)


class EventWriter(Protocol):
    def event(
        self, obj: dict[str, Any], kind: str, reason: str, message: str, warning: bool = False
    ) -> None: ...


class Watches:
    def __init__(self, writer: Callable[[], EventWriter], audit: AuditLog | None = None) -> None:
        self.writer = writer  # the role's writer, as it is when an Event is posted
        self.audit = audit
        self.violations: set[tuple[str, str]] = set()  # (pod, node) found outside its jurisdictions
        self.ignoring: set[str] = set()  # workloads whose engines do not keep their decision: told once
        self.evicted: set[str] = set()  # those whose eviction was written (the controller adds them)
        self.losing: set[str] = set()  # workloads told that their speculation is a net loss
        self._found: set[str] = set()  # this tick's, over the policies watched so far
        self._watched: set[str] = set()  # every running decision those policies hold

    def sovereignty(self, world: World, default: PolicySpec) -> None:
        """Every running GPU pod against its namespace's jurisdictions (`violations`): each one
        outside them is counted once, logged and told on the Pod (a Warning Event), and the gauge
        says how many run so now. Nothing is evicted: the pod may not be ours to stop. (Its binding
        record, written each tick, is what `audit verify` names.)"""
        errors: list[str] = []
        found = violations(world, default, errors)
        for text in errors:
            log.warning("skipped a pod that cannot be read: %s", text)
        now = {v.key for v in found}
        for v in found:
            if v.key in self.violations:
                continue
            self.violations.add(v.key)
            metrics.VIOLATIONS_TOTAL.inc()
            log.error("sovereignty violation: %s", v.message)
            try:
                self.writer().event(dict(v.obj), "Pod", "SovereigntyViolation", v.message, warning=True)
            except ApiException as exc:
                log.warning("could not post the violation Event of %s/%s: %s", v.namespace, v.pod, exc.reason)
        self.violations &= now
        metrics.VIOLATIONS.set(len(now))

    def aging(self, view: View) -> None:
        """Export what SovereignSpec would decide now for running speculative work, and tell a
        workload once (an Event) when its speculation has become a net loss, so that its operators
        can roll it. Never an eviction: a decision is not taken back for speed."""
        for gauge in (
            metrics.RUNNING_GAMMA,
            metrics.GAMMA_NOW,
            metrics.SPEEDUP_IN_FORCE,
            metrics.AGGREGATE_IN_FORCE,
        ):
            gauge.clear()
        losing = set()
        for a in view.aging:
            c = a.committed
            labels = {"namespace": c.namespace, "workload": c.key.split("/", 1)[-1]}
            metrics.RUNNING_GAMMA.labels(**labels).set(c.gamma)
            metrics.GAMMA_NOW.labels(**labels).set(a.gamma_now)
            metrics.SPEEDUP_IN_FORCE.labels(**labels).set(a.speedup_in_force)
            metrics.AGGREGATE_IN_FORCE.labels(**labels).set(a.aggregate_in_force)
            if a.aggregate_in_force >= 1.0:
                continue
            losing.add(c.key)
            message = (
                f"speculation is now a net loss for its GPU: γ={c.gamma} on {c.node}/gpu{c.gpu_index} at "
                f"headroom {a.headroom:.2f} gives this workload S_real={a.speedup_in_force:.2f} but the "
                f"GPU's aggregate token rate ×{a.aggregate_in_force:.2f} (SovereignSpec would choose "
                f"γ={a.gamma_now} now); restart the workload to be decided again. It is not evicted for "
                "speed."
            )
            self.warn_once(self.losing, c, "SpeculationNetLoss", message)
        self.losing &= losing  # a workload that recovers is told again if it loses again
        metrics.NET_LOSS.set(len(losing))

    def decisions(
        self,
        committed: Iterable[Committed],
        drafting: Mapping[tuple[str, str], float],
        drafts: Mapping[tuple[str, str], float] | None = None,
        since: float = 0.0,
        policy: PolicySpec | None = None,
        settle: bool = True,
    ) -> list[Write]:
        """Every running decision of one policy against its engines' draft counters over the
        window that began at `since` (`ignored`; that policy's telemetry): each one not kept is
        counted, told on the Workload (a Warning Event) and recorded once while it lasts. Where
        `policy` says `watch.evictIgnored`, the returned writes set its check to Retry: Kueue evicts
        it and it is decided again from scratch. Only a decision older than the window is evicted:
        a younger one's counts may be its predecessor's (the same Job's pods before an eviction),
        and a warning is all those may cost. `settle`: this was the last policy of the tick (see
        `settle`)."""
        committed = list(committed)
        found = ignored(committed, drafting, drafts)
        self._watched |= {c.key for c in committed}
        self._found |= {i.committed.key for i in found}
        evict: list[Write] = []
        for i in found:
            c = i.committed
            if c.key not in self.ignoring:
                metrics.DECISIONS_IGNORED_TOTAL.inc()
                if self.audit is not None:
                    self.audit.add([ignored_fact(i, self.audit.writer, now_rfc3339())])
            self.warn_once(self.ignoring, c, "DecisionIgnored", i.message)
            evicting = policy is not None and policy.watch.evict_ignored and c.key not in self.evicted
            if evicting and policy is not None and c.decided_at <= since:
                evict.append(eviction(i, policy))
        if settle:
            self.settle()
        return evict

    def settle(self, running: set[str] | None = None) -> None:
        """After the tick's `decisions`: those watched and no longer found, and those no longer
        running at all (`running`: every running decision's key), are forgotten (told again if
        they go wrong again); a policy not watched this tick (the tick ended before it) keeps its
        own. The gauge says how many are not kept now."""
        gone = self._watched - self._found
        keep = (lambda k: k not in gone) if running is None else (lambda k: k not in gone and k in running)
        self.ignoring = {k for k in self.ignoring if keep(k)}
        self.evicted = {k for k in self.evicted if keep(k)}
        metrics.DECISIONS_IGNORED.set(len(self.ignoring))
        self._found, self._watched = set(), set()

    def warn_once(self, told: set[str], c: Committed, reason: str, message: str) -> None:
        """A Warning Event on a running workload, once while `told` holds its key (the caller drops
        the keys that recovered, so a workload that goes wrong again is told again)."""
        if c.key in told:
            return
        told.add(c.key)
        log.warning("%s: %s", c.key, message)
        try:
            self.writer().event(dict(c.workload), "Workload", reason, message, warning=True)
        except ApiException as exc:
            log.warning("could not post the %s Event of %s: %s", reason, c.key, exc.reason)


def eviction(i: Ignored, spec: PolicySpec) -> Write:
    """The Retry that evicts a workload whose engines ignore its decision (as `evictOnDrift` does
    for drift): Kueue releases its quota and requeues it, and it is decided again."""
    c = i.committed
    message = f"decision ignored: {i.message} Evicted to be decided again (watch.evictIgnored)."
    return Write(
        c.key,
        dict(c.workload),
        c.check,
        dict(c.entry),
        "Retry",
        shorten(message, MESSAGE_LIMIT),
        requeue_after=spec.retry.base_seconds,
        events=[EventNote("DecisionIgnored", shorten(message, EVENT_LIMIT), True)],
        outcome="ignored",
        mode="plain" if i.allowed is None else "speculative",
        gamma=c.gamma,
    )
