"""The worker role's tick: read the watch-fed caches, decide with the core, write our entries.

    tick = check AdmissionCheck (Active) → Workloads, Nodes, ResourceFlavors, Namespaces, bound
           GPU Pods and Jobs' metadata from the caches (informer.py; no LIST after start-up) →
           for each policy: telemetry snapshot → view (cluster-wide ledger + pending) → plan →
           writes + Events

Ticks run one at a time (the watches only wake the loop), so decisions are sequential. Every
write is guarded by the resourceVersion it was decided on, and its response goes into the cache,
so every tick starts from at least what this controller has written: a stale cache can cost a
conflict (the workload is then left until the watch brings a newer version) and never a second
placement on a GPU already given away. A policy group, a telemetry source or an object that
fails, fails alone: the tick goes on with the rest and says what failed.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sovereignspec.core.running import LedgerMemo
from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.border import kinds
from sovereignspec.operator.border.objects import PolicyObject, flavors_of, labels_by_name
from sovereignspec.operator.border.policy import GROUP, PLURAL, VERSION, PolicySpec
from sovereignspec.operator.border.workloads import (
    KEYS_ON_OWNER,
    condition,
    deployment_of,
    key_of,
    named,
    our_entry,
    owner_key,
    owner_metadata,
    owner_of,
)
from sovereignspec.operator.border.world import World
from sovereignspec.operator.decision.learning import Learner, readings
from sovereignspec.operator.decision.plan import EventNote, Write, drift_writes, plan
from sovereignspec.operator.decision.scoring import score
from sovereignspec.operator.decision.view import View, build, first_placements
from sovereignspec.operator.roles.audit import RECORDED, AuditLog, Seen, ahead, bucket_store, record_tick
from sovereignspec.operator.roles.role import Laps, Role, Settings, TickReport
from sovereignspec.operator.roles.watches import Watches
from sovereignspec.operator.runtime import metrics
from sovereignspec.operator.runtime.identity import operator_identity
from sovereignspec.operator.runtime.informer import ClusterCache, rv_int
from sovereignspec.operator.runtime.telemetry_source import TelemetryCache
from sovereignspec.operator.runtime.writer import TRANSPORT_ERRORS, WRITE_ERRORS, ConflictError, now_rfc3339
from sovereignspec.telemetry.snapshot import Snapshot

log = logging.getLogger(__name__)
SLOW_TICK_S = 2.0  # a tick longer than this logs where its time went
Groups = dict[str, tuple[PolicySpec, set[str]]]  # policy name -> its spec and the checks using it


def _placing(w: Write) -> str | None:
    return key_of(w.workload) if w.state == "Ready" else None


class Controller(Role):
    """The worker role: places the workloads our checks gate on this cluster's GPUs."""

    def __init__(
        self,
        api: client.ApiClient,
        profiles: ProfileSet,
        settings: Settings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            api,
            profiles,
            settings or Settings(),
            ClusterCache(api, f"/apis/{GROUP}/{VERSION}/{PLURAL}"),
            clock,
        )
        self.cache: ClusterCache
        self.telemetry = TelemetryCache(self.settings.telemetry_cache_seconds, clock)
        self._drift_reported: dict[str, str] = {}
        self._off_reported: set[str] = set()  # workloads told that their profile mispredicts them
        self._events_checked = False  # decisions' Events re-posted once after start-up
        # What the engines taught: the profiles decisions price with. Fits on a thread of their own.
        self._steps_read_at = -math.inf
        self.learner = Learner(
            profiles,
            window_s=self.settings.learn_window_seconds,
            refit_s=self.settings.learn_refit_seconds,
            executor=ThreadPoolExecutor(1, thread_name_prefix="sovereignspec-learn"),
        )
        self._unsynced_since: float | None = None
        self._ledger_memo: LedgerMemo = {}  # GPUs' implied load, from one tick to the next
        # The sovereignty record: this tick's decisions and bindings, appended to the chain.
        self.audit = AuditLog(api, self.settings.identity or operator_identity(), bucket_store(self.settings))
        # What runs, against where it may run and how it was decided.
        self.watches = Watches(lambda: self.writer, self.audit)
        # The bindings the record holds open, read when this replica first records (`AuditLog.recall`).
        self._bindings_seen: Seen | None = None
        self._written: list[Write] = []  # this tick's decisions written, for the record
        self.lap = Laps()  # where this tick's time went, logged when it is slow

    # -- the tick ------------------------------------------------------------------------------

    def read_world(self, known: dict[str, PolicySpec]) -> World:
        c = self.cache
        workloads = c.workloads.items()
        nodes = c.nodes.items()
        flavors, tolerations = flavors_of(c.flavors.items())
        namespaces = labels_by_name(c.namespaces.items())
        pods = c.pods.items()
        # The owners' metadata: a Job's (a user's keys may sit on it by mistake) for the waiting
        # workloads; a Pod's or a StatefulSet's (where their keys are) for every workload they own,
        # the ledger's too.
        wanted = {
            owner_key(wl, "")
            for wl in workloads
            if named(wl)
            and (
                owner_of(wl)[0] in KEYS_ON_OWNER
                or (
                    (our_entry(wl, set(known)) or {}).get("state") == "Pending"
                    and condition(wl, "QuotaReserved")
                )
            )
        }
        owners: dict[tuple[str, str, str], dict[str, dict[str, str]]] = {}
        for namespace, kind, name in wanted:
            registered = kinds.BY_NAME.get(kind)
            source = c.owners(registered) if registered is not None else None
            found = source.get(f"{namespace}/{name}") if source is not None else None
            if found:
                owners[(namespace, kind, name)] = owner_metadata(found)
                has_parent = registered is not None and registered.parent is not None
                deployment = deployment_of(found) if has_parent else None
                parent = c.deployments.get(f"{namespace}/{deployment}") if deployment else None
                if parent:  # a replica's Deployment: where its keys are misplaced
                    owners[(namespace, kind, name)]["owner_annotations"] = owner_metadata(parent)[
                        "annotations"
                    ]
                elif deployment:  # not cached yet: decided once it is (workloads.owner_missing)
                    owners[(namespace, kind, name)]["missing"] = {kinds.DEPLOYMENT.name: deployment}
        return World(workloads, nodes, flavors, namespaces, pods, owners, known, tolerations)

    def tick(self) -> TickReport:
        started, self.lap = time.monotonic(), Laps()
        report = TickReport()
        if not self.cache.synced():  # never decide from a cache that is not listed and watching
            self._not_synced(started, report)
            return report
        self._unsynced_since = None
        active, known = self.reconcile_checks()
        if not known:
            return report
        world = replace(self.read_world(known), policy_refs=self._policy_refs(active))
        self.lap("world")
        groups: Groups = {}
        for check, (policy_name, spec) in sorted(active.items()):
            groups.setdefault(policy_name, (spec, set()))[1].add(check)
        if groups:
            report.reevaluate_after = min(spec.reevaluation_seconds for spec, _ in groups.values())
        now = self.clock()
        pending_total = 0
        first: View | None = None  # the ledger, and so its aging, is the same in every group's view
        profiles = self.learner.profiles()  # the shipped profiles, with what the engines taught
        for policy_name, (spec, checks) in sorted(groups.items()):
            try:
                snapshot = self.telemetry.get(spec)
                self.lap("telemetry")
                view = build(world, checks, spec, profiles, snapshot, now, self._ledger_memo)
                self.lap("view")
                self._observe(view, spec, checks)
                pending_total += len(view.pending)
                self._carry_out(
                    drift_writes(_only(view, checks), spec, self._drift_reported), report, world, spec
                )
                self._watch_decisions(view, checks, snapshot, report, world, spec)
                if first is None:
                    first, runs = view, (snapshot.tpot, spec)
                view = self._without_conflicted(view)
                if any(p.waiting for p in view.pending):  # its owner is on its way: look again soon
                    report.reevaluate_after = min(report.reevaluate_after, 1.0)
                if not view.pending:
                    continue
                if report.decided:  # the previous policy group wrote decisions this tick: re-read first
                    report.more = True
                    break
                if self._place(policy_name, spec, view, profiles, report, world):
                    break
            except Exception as exc:  # one policy group fails alone; the others are still decided
                report.failures.append(f"policy {policy_name}: {type(exc).__name__}: {exc}")
                metrics.TICK_FAILURES.labels(part="policy").inc()
                log.exception("deciding for policy %s failed; the other policies go on", policy_name)
        if first is not None:  # after the writes: none of it changes this tick's placements
            self._what_runs(first, *runs, {c: s for c, (_, s) in active.items()}, world, now, report)
        self._after(first, world, groups)
        metrics.PENDING.set(pending_total)
        metrics.TICK_SECONDS.observe(took := time.monotonic() - started)
        if took > SLOW_TICK_S:  # where the time went, for whoever wonders why decisions lag
            log.info("a slow tick: %.1f s (%s), %d decided", took, self.lap.text(), report.decided)
        return report

    def _what_runs(self, view: View, tpot: dict[tuple[str, str], float], spec: PolicySpec,
                   policies: dict[str, PolicySpec], world: World, now: float,
                   report: TickReport) -> None:  # fmt: skip
        """What runs, read from the first group's view once this tick's decisions are written (a
        new leader's first decision waits on none of it): aging, scoring against the engines, pods
        against their jurisdictions, online calibration (which prices the next tick)."""
        try:
            self.watches.aging(view)
            self._score(view, tpot, policies, spec)
            self.watches.sovereignty(world, spec)
            self._learn(view, spec, now)
        except Exception as exc:  # the decisions are written; what failed here is said and retried
            report.failures.append(f"what runs: {type(exc).__name__}: {exc}")
            metrics.TICK_FAILURES.labels(part="watch").inc()
            log.exception("watching what runs failed; this tick's decisions are written")
        self.lap("what runs")

    def _after(self, first: View | None, world: World, groups: Groups) -> None:
        """After the tick's decisions: lost Events re-posted (once, after a start), the watches
        settled on what runs, the tick recorded."""
        if first is not None and not self._events_checked:  # after this tick's decisions, not before
            self._events_checked = True
            self.repost_events(first.committed)
        self.lap("events")
        self.watches.settle(None if first is None else {c.key for c in first.committed})
        self._record(world, groups)
        self.lap("record")

    def _place(self, policy_name: str, spec: PolicySpec, view: View, profiles: ProfileSet,
               report: TickReport, world: World) -> bool:  # fmt: skip
        """The first `--tick-limit` of the group's pending workloads placed and written; True if
        some are left: the next tick comes at once, from a ledger that holds these."""
        self.lap("pending")
        limit, self.first_batch = min(self.settings.tick_limit, self.first_batch or math.inf), None
        view, later = first_placements(view, int(limit))
        self._carry_out(plan(policy_name, spec, view, profiles, now_rfc3339()), report, world, spec, "plan")
        if later:
            report.more = True
            cap = "--tick-limit" if limit == self.settings.tick_limit else "a new leader's first batch"
            log.info("%d workload(s) of policy %s left for the next tick (%s)", later, policy_name, cap)
        return later > 0

    def _policy_refs(self, active: dict[str, tuple[str, PolicySpec]]) -> dict[str, tuple[str, int | None]]:
        """Each active check's SpeculationPolicy and its generation now, for the record."""
        generations = {p.name: p.generation for p in map(PolicyObject.of, self.cache.policies.items())}
        return {check: (name, generations.get(name)) for check, (name, _) in active.items()}

    def _record(self, world: World, groups: Groups) -> None:
        """This tick's written decisions and the GPU pods' bindings (and changes of their nodes'
        jurisdiction labels) into the sovereignty record, then the record written: what cannot
        be written now waits, in order, for the next tick."""
        written, self._written = self._written, []
        default = min(groups.items())[1][0] if groups else None  # the first group's, as the watches'
        if self._bindings_seen is None:
            self._bindings_seen = self.audit.recall()
        record_tick(self.audit, written, world, default, self._bindings_seen)

    def _not_synced(self, started: float, report: TickReport) -> None:
        """No decisions until the caches are listed and watching; refusals and a long wait said."""
        waiting = ", ".join(self.cache.not_synced())
        if self._unsynced_since is None:
            self._unsynced_since = started
            log.info("no decisions until the caches are listed and watching: %s", waiting)
        report.reevaluate_after = 0.5
        denied = self.cache.denied()
        if denied:  # refused by the API server (RBAC, credentials): say so at once
            report.failures.append(f"the API server refuses our reads: {'; '.join(denied)}")
        elif started - self._unsynced_since > self.settings.unsynced_grace_seconds:
            report.failures.append(f"caches not in sync for {started - self._unsynced_since:.0f}s: {waiting}")

    def _without_conflicted(self, view: View) -> View:
        """Leave out workloads whose write conflicted until the watch brings a newer version."""
        if not self._conflicted:
            return view
        pending = []
        for p in view.pending:
            if p.key in self._conflicted and self._conflicted[p.key] == rv_int(p.workload):
                continue
            self._conflicted.pop(p.key, None)
            pending.append(p)
        return replace(view, pending=pending)

    def _observe(self, view: View, spec: PolicySpec, checks: set[str]) -> None:
        metrics.LEDGER.set(len(view.committed))
        for (node, gpu), h in view.gpu_headroom.items():
            metrics.HEADROOM.labels(node=node, gpu=str(gpu)).set(-1.0 if h is None else h)
        for text in view.errors:
            log.warning("skipped an object that cannot be read: %s", text)
        if view.errors:
            metrics.TICK_FAILURES.labels(part="object").inc(len(view.errors))
        drifted = _only(view, checks).drift
        metrics.DRIFT.set(len(view.drift))
        for d in drifted:
            log.warning("sovereignty drift: %s: %s", d.committed.key, d.why)

    def _score(
        self,
        view: View,
        measured: dict[tuple[str, str], float],
        policies: dict[str, PolicySpec],
        default: PolicySpec,
    ) -> None:
        """Score every running decision: the TPOT predicted when it was decided against what its
        engine reports (`scoring`), exported per profile, and a Warning Event, once per workload
        until it is back within its policy's bound, where a profile prices its GPU wrongly. The
        decision stands: a model's error is the administrator's to fix (profile + calibrate)."""
        types = {(g.node, g.index): g.gpu_type for g in view.cluster.gpus}
        scored, profiles = score(view.committed, measured, types)
        metrics.PREDICTION_ERROR.clear()
        metrics.PREDICTION_SCORED.clear()
        self.learner.scores = {(p.gpu_type, p.model): (p.median_error, p.workloads) for p in profiles}
        for p in profiles:
            metrics.PREDICTION_ERROR.labels(gpu_type=p.gpu_type, model=p.model).set(p.median_error)
            metrics.PREDICTION_SCORED.labels(gpu_type=p.gpu_type, model=p.model).set(p.workloads)
        off = set()
        for s in scored:
            c = s.committed
            bound = policies.get(c.check, default).telemetry.prediction_error_bound
            if abs(s.error) <= bound:
                continue
            off.add(c.key)
            message = (
                f"its engine reports TPOT {s.measured_s * 1e3:.1f} ms where the {s.gpu_type} profile "
                f"predicted {s.predicted_s * 1e3:.1f} ms for {c.request.model} when it was decided "
                f"({s.error:+.0%}, beyond the policy's {bound:.0%}): decisions on {s.gpu_type} for this "
                "model are priced by a profile this far off (measure it: sovereignspec profile, then "
                "calibrate). The decision stands."
            )
            self.watches.warn_once(self._off_reported, c, "PredictionOffProfile", message)
        self._off_reported &= off  # told again if it leaves the bound again

    def _learn(self, view: View, spec: PolicySpec, now: float) -> None:
        """Online calibration (operator/decision/learning.py): the plain engines' readings (read from
        Prometheus once per refit interval), the LearnedProfiles' specs, a refit where one is due,
        and its status written. What it learns prices the next tick's decisions. A write that
        fails is tried at the next refit; a spec or status refused is logged (once while it
        lasts) and steers nothing."""
        if self.cache.learned.absent:  # no LearnedProfile CRD, or a role that may not read them
            return
        new = {}
        if now - self._steps_read_at >= self.learner.refit_s:
            self._steps_read_at = now
            types = {(g.node, g.index): g.gpu_type for g in view.cluster.gpus}
            new = readings(view.committed, types, self.telemetry.steps(spec), now)
        writes, messages = self.learner.step(self.cache.learned.items(), new, now)
        for text in messages:
            log.warning("online calibration: %s", text)
        for w in writes:
            f = self.learner.in_force[w.key]
            labels = {"gpu_type": w.key[0], "model": w.key[1]}
            metrics.LEARNED_POINTS.labels(**labels).set(w.status["pointCount"])
            metrics.LEARNED_IN_FORCE.labels(**labels).set(1 if f.learned else 0)
            metrics.LEARNED_EXTRA_MARGIN.labels(**labels).set(f.extra_margin)
            log.info("learned profile %s: %s", w.name, f.why)
            try:
                self.writer.learned_profile(w.name, w.key[0], w.key[1], w.create, w.status)
            except WRITE_ERRORS as exc:
                # Not in force until it is on record: an administrator cannot pin or freeze what
                # they cannot see. Tried again at the next tick.
                self.learner.fitted_at.pop(w.key, None)
                self.learner.in_force.pop(w.key, None)
                self.learner.uses.pop(w.key, None)
                metrics.TICK_FAILURES.labels(part="learning").inc()
                log.warning("could not write LearnedProfile %s: %s", w.name, exc)

    def _watch_decisions(
        self, view: View, checks: set[str], snapshot: Snapshot, report: TickReport, world: World,
        spec: PolicySpec,
    ) -> None:  # fmt: skip
        """This policy's running decisions against its engines' counters (watches.py), read through
        its own telemetry; the evictions it asks for, written."""
        mine, s = [c for c in view.committed if c.check in checks], snapshot
        evict = self.watches.decisions(mine, s.drafting, s.drafts, s.drafting_since, spec, settle=False)
        self._carry_out(evict, report, world, spec)
        self.watches.evicted |= {w.key for w in evict if w.written == "ignored"}

    def _carry_out(
        self, writes: list[Write], report: TickReport, world: World, spec: PolicySpec, step: str = "watches"
    ) -> None:
        self.lap(step)

        def record(todo: list[Write]) -> list[Write]:
            done = ahead(self.audit, todo, world, spec)
            self.lap("record ahead")
            return done

        # Only a placement can give a GPU twice if it lands late (`Role.send`); any other write
        # lands on a workload unchanged since, as if sent earlier, or conflicts.
        if self.settings.audit_required:  # the records first; otherwise recorded after the tick
            writes, outcomes = self.send_recorded(writes, _placing, self._write, record)
        else:
            outcomes = self.send(writes, _placing, self._write)
        self.lap("writes")
        for w, outcome in zip(writes, outcomes, strict=True):
            w.written = outcome
            if outcome in RECORDED or w.recorded:  # recorded ahead and not written: said so
                self._written.append(w)
            report.outcomes[outcome] += 1
            if outcome == "conflict":
                report.conflicts += 1
            elif outcome not in ("error", "waiting"):
                report.decided += 1

    # -- writing one decision ------------------------------------------------------------------

    def _write(self, w: Write) -> str:
        wl = w.workload
        try:
            written = self.writer.check_state(
                wl,
                w.check,
                w.state,
                w.message,
                w.entry,
                pod_set_updates=w.pod_set_updates,
                requeue_after=w.requeue_after,
            )
        except ConflictError:
            metrics.CONFLICTS.inc()
            self._conflicted[w.key] = rv_int(wl)
            log.info("workload %s changed while deciding; deciding again from its next version", w.key)
            return "conflict"
        except ApiException as exc:
            log.warning("writing the decision for %s failed: %s %s", w.key, exc.status, exc.reason)
            return "error"
        except TRANSPORT_ERRORS as exc:  # this workload's write alone; decided again next tick
            metrics.TICK_FAILURES.labels(part="write").inc()
            log.warning("writing the decision for %s failed: %s: %s", w.key, type(exc).__name__, exc)
            return "error"
        self.cache.workloads.put(written)  # the next tick's ledger holds this decision
        if w.outcome == "waiting":
            log.info("workload %s: %s", w.key, w.message)
            return "waiting"
        if w.outcome not in ("drift", "ignored"):  # the ignored are counted by the watch (watches.py)
            self._count(w)  # once written, before its Events: they tell of it, they are not it
        for note in w.events:
            self._event(wl, note)
            if note.reason == "ExclusiveWaiting":
                metrics.EXCLUSIVE_WAITING.inc()
        if w.outcome == "drift":
            self._drift_reported[w.key] = w.drift
        return w.outcome

    def _count(self, w: Write) -> None:
        metrics.DECISIONS.labels(outcome=w.outcome, mode=w.mode).inc()
        if w.outcome == "placed":
            metrics.GAMMA.observe(w.gamma)
            if w.speedup is not None:
                metrics.SPEEDUP.observe(w.speedup)
        for name in w.bad_fields:
            metrics.BAD_ANNOTATIONS.labels(field=name).inc()
        if w.bad_fields:
            log.warning("workload %s: bad annotations (%s): plain decode", w.key, ", ".join(w.bad_fields))

    def _event(self, wl: dict[str, Any], note: EventNote) -> None:
        self.writer.event(wl, "Workload", note.reason, note.message, note.warning)


def _only(view: View, checks: set[str]) -> View:
    """The view with only the drift of this policy group's checks."""
    return replace(
        view,
        drift=[d for d in view.drift if d.committed.check in checks],
        bound_elsewhere=[d for d in view.bound_elsewhere if d.committed.check in checks],
    )
