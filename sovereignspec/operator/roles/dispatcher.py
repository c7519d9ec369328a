"""The dispatcher role: SovereignSpec on a MultiKueue manager cluster.

Kueue's MultiKueue, with `multiKueue.dispatcherName` set to an external name, dispatches a
Workload only to the workers listed in its `status.nominatedClusterNames`, and only once every
admission check of the manager's ClusterQueue other than MultiKueue's own is Ready
(kueue v0.19.2: pkg/controller/admissionchecks/multikueue/workload.go). So a SovereignSpec check
on the manager's ClusterQueue is a gate: nothing is dispatched before it says Ready, and it says
Ready only together with a nomination it has judged, in one server-side apply to /status whose
body holds our check entry and `nominatedClusterNames`:

    tick = AdmissionChecks (ours: Active) → MultiKueueConfigs, MultiKueueClusters (labels, Active)
           → each worker's telemetry → for each Workload with QuotaReserved, our entry Pending and
           no clusterName: core.dispatch (sovereignty, then the model) → apply {entry, nominated}

Kueue clears `nominatedClusterNames` when a worker admits the Workload or it is evicted, through
its MutatingAdmissionPolicy `clear-nominated-cluster-names` (config/components/map; Kubernetes
1.36+), which rewrites the field in Kueue's own request whoever owns it. After an eviction Kueue
resets every check to Pending and we nominate again. We never write the field on a Workload that
has a clusterName, and never replace a nomination someone else wrote: one we may not stand behind
(across a boundary, an unknown worker) keeps our check Pending, so MultiKueue cannot dispatch it.
After our Ready the field is still watched: rewritten by another writer to a worker the workload
may not use, our check turns Retry (Kueue evicts the workload and removes its remote copies) and the
next reservation is nominated again. (Nothing stops the write itself: a ValidatingAdmissionPolicy
on workloads/status would, and is not shipped yet.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sovereignspec.core.cluster import WorkloadRequest
from sovereignspec.core.dispatch import (
    Dispatch,
    Dispatcher,
    Worker,
    WorkerGpu,
    admissible_nomination,
    dispatch_order,
)
from sovereignspec.core.specs import ProfileSet
from sovereignspec.operator.border.objects import (
    AdmissionCheckView,
    MultiKueueConfigView,
    MultiKueueStatus,
    labels_by_name,
)
from sovereignspec.operator.border.policy import GROUP, PLURAL, VERSION, PolicySpec
from sovereignspec.operator.border.worker_clusters import (
    WORKER_PROMETHEUS,
    connected,
    describe_worker,
)
from sovereignspec.operator.border.workloads import (
    UnreadableFieldError,
    condition,
    key_of,
    name_of,
    namespace_of,
    our_entry,
    requested_gpus,
)
from sovereignspec.operator.border.world import tenancy_of
from sovereignspec.operator.decision.requests import declared_request, learned_alpha
from sovereignspec.operator.decision.view import reading_headroom
from sovereignspec.operator.roles.audit import AuditLog, bucket_store
from sovereignspec.operator.roles.dispatch_record import (
    DISPATCHED,
    Decision,
    admission_facts,
    ahead,
    dispatch_facts,
    unwritten_facts,
)
from sovereignspec.operator.roles.role import Role, Settings, TickReport
from sovereignspec.operator.runtime import metrics
from sovereignspec.operator.runtime.identity import operator_identity
from sovereignspec.operator.runtime.informer import DispatchCache, rv_int
from sovereignspec.operator.runtime.telemetry_source import TelemetryCache
from sovereignspec.operator.runtime.writer import TRANSPORT_ERRORS, ConflictError, as_written, now_rfc3339
from sovereignspec.telemetry.snapshot import Snapshot

log = logging.getLogger(__name__)

MULTIKUEUE_CONTROLLER = "kueue.x-k8s.io/multikueue"
DISPATCHER_NAME = "sovereignspec.io/dispatcher"
_Pending = tuple[dict[str, Any], dict[str, Any], list[str]]  # (Workload, our entry, its workers)


def _dispatching(d: Decision) -> str | None:
    """A dispatch that names worker clusters, or admits: what a write landing late could do twice."""
    return key_of(d.wl) if d.nominated or d.state == "Ready" else None


def _decision(
    wl: dict[str, Any],
    entry: dict[str, Any],
    state: str,
    message: str,
    outcome: str,
    nominated: tuple[str, ...] | None = None,
    event: tuple[str, str, bool] | None = None,
) -> Decision:
    return Decision(wl, str(entry["name"]), entry, state, message, nominated, event, outcome)


class DispatchController(Role):
    """The dispatcher role: nominates worker clusters for the manager's MultiKueue workloads."""

    def __init__(
        self,
        api: client.ApiClient,
        profiles: ProfileSet,
        settings: Settings | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        settings = settings or Settings(DISPATCHER_NAME, "sovereignspec-dispatcher")
        super().__init__(
            api, profiles, settings, DispatchCache(api, f"/apis/{GROUP}/{VERSION}/{PLURAL}"), clock
        )
        self.cache: DispatchCache
        # The worker role's cache: each worker's Prometheus read with the policy's whole settings.
        self.worker_telemetry = TelemetryCache(self.settings.telemetry_cache_seconds, clock)
        self._acceptance: dict[str, Snapshot] = {}  # worker -> its last snapshot (α learned there)
        # The sovereignty record: which workers were nominated, and which one admitted.
        self.audit = AuditLog(api, self.settings.identity or operator_identity(), bucket_store(self.settings))
        self._admissions: set[tuple[str, str]] = set()  # (workload uid, worker) recorded

    # -- reading ---------------------------------------------------------------------------------

    def _configs_by_check(self) -> dict[str, list[str]]:
        """MultiKueue AdmissionCheck name -> the worker clusters its MultiKueueConfig lists."""
        cache = self.cache
        configs = {c.name: c for c in map(MultiKueueConfigView.of, cache.configs.items())}
        out: dict[str, list[str]] = {}
        for ac in map(AdmissionCheckView.of, cache.checks.items()):
            if ac.controller_name != MULTIKUEUE_CONTROLLER:
                continue
            cfg = configs.get(str((ac.parameters or {}).get("name", "")))
            out[ac.name] = list(cfg.clusters) if cfg is not None else []
        return out

    def _committed(self) -> dict[str, int]:
        """GPUs per worker of the manager's Workloads dispatched there and not finished: admitted
        there (clusterName) or nominated to it alone and waiting for its admission."""
        out: dict[str, int] = {}
        for wl in self.cache.workloads.items():
            if not condition(wl, "QuotaReserved") or condition(wl, "Finished"):
                continue
            where = MultiKueueStatus.of(wl).where
            if where is None:
                continue
            try:
                gpus = requested_gpus(wl)
            except (UnreadableFieldError, KeyError, TypeError, ValueError):
                continue
            out[where] = out.get(where, 0) + gpus
        return out

    def _workers(self, spec: PolicySpec) -> dict[str, Worker]:
        out: dict[str, Worker] = {}
        committed = self._committed()
        cache = self.cache
        for obj in cache.clusters.items():
            name = name_of(obj)
            desc, problem = describe_worker(obj)
            up, why = connected(obj)
            gpus: tuple[WorkerGpu, ...] = ()
            error: str | None = None
            gpu_type = desc.gpu_type
            if problem is None and desc.prometheus_url is None:
                error = f"no {WORKER_PROMETHEUS} annotation"
            elif problem is None and desc.prometheus_url is not None:
                # The policy's telemetry settings (window, client, engines' meanings) for every
                # worker's Prometheus.
                snap = self.worker_telemetry.get(spec, prometheus_url=desc.prometheus_url)
                error = snap.error if not snap.gpus else None
                gpus = self._gpus(snap, gpu_type, spec)
                self._acceptance[name] = snap
            out[name] = Worker(
                name,
                desc.jurisdiction,
                desc.tenant,
                up,
                why,
                problem,
                gpu_type,
                gpus,
                error,
                committed.get(name, 0),
            )
        return out

    def _gpus(self, snap: Snapshot, gpu_type: str | None, spec: PolicySpec) -> tuple[WorkerGpu, ...]:
        if gpu_type is None or gpu_type not in self.profiles.gpus:
            return ()
        efficiency = self.profiles.gpus[gpu_type].compute_efficiency
        now, staleness = self.clock(), spec.telemetry.staleness_seconds
        return tuple(
            WorkerGpu(node, index, reading_headroom(reading, efficiency, now, staleness))
            for (node, index), reading in sorted(snap.gpus.items())
        )

    # -- the tick ------------------------------------------------------------------------------

    def tick(self) -> TickReport:
        started = time.monotonic()
        report = TickReport()
        if not self.cache.synced():
            report.reevaluate_after = 0.5
            denied = self.cache.denied()
            if denied:
                report.failures.append(f"the API server refuses our reads: {'; '.join(denied)}")
            return report
        active, _known = self.reconcile_checks()
        if not active:
            return report
        cache = self.cache
        namespaces = labels_by_name(cache.namespaces.items())
        configs = self._configs_by_check()
        by_policy: dict[str, tuple[PolicySpec, set[str]]] = {}
        for check, (policy_name, spec) in active.items():
            by_policy.setdefault(policy_name, (spec, set()))[1].add(check)
        report.reevaluate_after = min(spec.reevaluation_seconds for spec, _ in by_policy.values())
        waiting = 0
        # As the worker role's `_place`: at most --tick-limit dispatched per policy and tick (a new
        # leader's first tick fewer), the rest in the next tick at once, which counts these against
        # their workers (`_committed`: each write is in the cache as soon as it lands).
        limit, self.first_batch = (
            min(self.settings.tick_limit, self.first_batch or self.settings.tick_limit),
            None,
        )
        for policy_name, (spec, checks) in sorted(by_policy.items()):
            try:
                waiting += self._dispatch(spec, checks, configs, namespaces, report, limit)
            except Exception as exc:
                report.failures.append(f"policy {policy_name}: {type(exc).__name__}: {exc}")
                metrics.TICK_FAILURES.labels(part="policy").inc()
                log.exception("dispatching for policy %s failed", policy_name)
        if waiting:
            report.reevaluate_after = min(report.reevaluate_after, 2.0)
        metrics.PENDING.set(waiting)
        metrics.TICK_SECONDS.observe(time.monotonic() - started)
        return report

    def _dispatch(
        self,
        spec: PolicySpec,
        checks: set[str],
        configs: dict[str, list[str]],
        namespaces: dict[str, dict[str, str]],
        report: TickReport,
        limit: int,
    ) -> int:
        """One policy's first `limit` workloads (in dispatch order) decided, recorded and written;
        returns how many wait."""
        self._acceptance = {}
        workers = self._workers(spec)
        decisions, later = self._decide(spec, checks, workers, configs, namespaces, limit)
        if later:
            report.more = True
            log.info("%d workload(s) left for the next tick (at most %d dispatched per tick)", later, limit)
        places = {n: w.jurisdiction for n, w in workers.items()}
        if self.settings.audit_required:
            # The records first (`ahead`: a nomination whose record fails is held), persisted beside
            # the first segment's announcement in the Lease, as the worker role does: both are owed
            # before anything is sent and neither needs the other. Otherwise recorded after the writes.
            def record(todo: list[Decision]) -> list[Decision]:
                return ahead(self.audit, todo, places, namespaces, spec, now_rfc3339())

            decisions, outcomes = self.send_recorded(decisions, _dispatching, self._write_one, record)
        else:
            outcomes = self.send(decisions, _dispatching, self._write_one)
        written, refused = [], []
        for d, outcome in zip(decisions, outcomes, strict=True):
            report.outcomes[outcome] += 1
            if outcome == "conflict":
                report.conflicts += 1
            elif outcome != "error":
                report.decided += 1
            if d.recorded and outcome not in DISPATCHED:  # recorded ahead, then refused
                refused.append((d, outcome))
            elif outcome in DISPATCHED and not d.recorded:
                written.append(d.written())
        self._record(written, refused, places, namespaces, spec)
        return sum(1 for d in decisions if d.outcome == "wait")

    def _record(
        self,
        written: list[tuple[dict[str, Any], str, str, str, tuple[str, ...]]],
        refused: list[tuple[Decision, str]],
        places: dict[str, str | None],
        namespaces: dict[str, dict[str, str]],
        spec: PolicySpec,
    ) -> None:
        """The dispatches written (but those recorded ahead), the ones recorded ahead and then
        refused by the API, and the admissions by worker clusters into the sovereignty record,
        then the record written; it fails alone (counted, logged)."""
        try:
            at, who = now_rfc3339(), self.audit.writer
            self.audit.add(unwritten_facts(refused, who, at))
            self.audit.add(dispatch_facts(written, places, namespaces, spec, who, at))
            items = self.cache.workloads.items()
            self.audit.add(admission_facts(items, places, namespaces, spec, who, at, self._admissions))
            self.audit.flush()
        except Exception:
            metrics.TICK_FAILURES.labels(part="record").inc()
            log.exception("recording this tick's dispatches failed")

    def _decide(
        self,
        spec: PolicySpec,
        checks: set[str],
        workers: dict[str, Worker],
        configs: dict[str, list[str]],
        namespaces: dict[str, dict[str, str]],
        limit: int | None = None,
    ) -> tuple[list[Decision], int]:
        """The decisions on the first `limit` workloads waiting for one, in dispatch order (and on
        those that cannot be read), and how many are left for the next tick. Nominations already
        Ready, judged again every tick, are not counted: they seldom write, and counted they could
        fill every tick's cut and leave the waiting ones to wait forever."""
        pending = self._pending(checks, configs)
        if not pending:
            return [], 0
        out: list[Decision] = []
        requests = self._requests(pending, spec, namespaces, out)
        # Latency-sensitive, high-acceptance work first: it takes the headroom (as in a worker).
        requests.sort(key=lambda t: (dispatch_order(t[3]), key_of(t[0])))
        waiting = [r for r in requests if r[1].get("state") != "Ready"]
        later = max(len(waiting) - limit, 0) if limit is not None else 0
        if later:
            cut = {id(r[0]) for r in waiting[len(waiting) - later :]}
            requests = [r for r in requests if id(r[0]) not in cut]
        policy = spec.placer_settings()
        dispatchers: dict[tuple[str, ...], Dispatcher] = {}
        for wl, entry, pool, request in requests:
            if not pool:
                out.append(self._wait(wl, entry, "no MultiKueue check of its ClusterQueue lists a worker"))
                continue
            nominated = list(MultiKueueStatus.of(wl).nominated)
            if entry.get("state") == "Ready":
                why = admissible_nomination(request, nominated, workers, policy.jurisdiction_label)
                if why is not None:
                    out.append(self._reclose(wl, entry, nominated, why))
                continue
            if nominated:  # someone else nominated: stand behind it, or hold it back
                why = admissible_nomination(request, nominated, workers, policy.jurisdiction_label)
                kept = f"keeps the nomination {', '.join(nominated)}"
                out.append(
                    _decision(wl, entry, "Ready", kept, "kept") if why is None else self._hold(wl, entry, why)
                )
                continue
            key = tuple(pool)
            if key not in dispatchers:
                listed = [workers[n] for n in pool if n in workers]
                dispatchers[key] = Dispatcher(self.profiles, listed, policy)
            d = dispatchers[key].dispatch(self._with_acceptance(request, spec), self.settings.nominate)
            out.append(self._from_dispatch(wl, entry, d))
        return out, later

    def _pending(self, checks: set[str], configs: dict[str, list[str]]) -> list[_Pending]:
        """Workloads with quota reserved whose check waits on us (or is Ready with a nomination,
        judged again in case another writer rewrote it), each with the workers it may go to."""
        pending: list[_Pending] = []
        for wl in self.cache.workloads.items():
            entry = our_entry(wl, checks)
            if entry is None or not condition(wl, "QuotaReserved"):
                continue
            mk = MultiKueueStatus.of(wl)
            if mk.cluster or condition(wl, "Finished"):
                continue
            if entry.get("state") != "Pending" and not (entry.get("state") == "Ready" and mk.nominated):
                continue
            k = key_of(wl)
            if k in self._conflicted and self._conflicted[k] == rv_int(wl):
                continue
            self._conflicted.pop(k, None)
            pool = sorted({c for name in mk.checks if name in configs for c in configs[name]})
            pending.append((wl, entry, pool))
        return pending

    def _requests(
        self,
        pending: list[_Pending],
        spec: PolicySpec,
        namespaces: dict[str, dict[str, str]],
        out: list[Decision],
    ) -> list[tuple[dict[str, Any], dict[str, Any], list[str], WorkloadRequest]]:
        """Each pending workload's request; one that cannot be read, or breaks its sovereignty
        inputs, is rejected into `out`."""
        requests = []
        for wl, entry, pool in pending:
            ns = namespace_of(wl)
            try:
                tenancy = tenancy_of(ns, namespaces.get(ns), spec)
                if tenancy.problem:
                    out.append(self._rejected(wl, entry, f"tenancy: {tenancy.problem}"))
                    continue
                declared, request, _ = declared_request(wl, spec, self.profiles, Snapshot(), None, tenancy)
            except (UnreadableFieldError, KeyError, TypeError, ValueError) as exc:
                out.append(self._rejected(wl, entry, f"the Workload cannot be read: {exc}"))
                continue
            if request is None:
                problems = "; ".join(str(p) for p in declared.sovereignty_problems)
                out.append(self._rejected(wl, entry, f"sovereignty input: {problems}"))
                continue
            requests.append((wl, entry, pool, request))
        return requests

    def _with_acceptance(self, request: WorkloadRequest, spec: PolicySpec) -> WorkloadRequest:
        # α learned where this namespace's engines already run, if any worker reports it.
        ns = request.name.split("/", 1)[0]
        for snap in self._acceptance.values():
            learned = learned_alpha(request.alpha, snap.acceptance.get((ns, request.model)), spec)
            if learned is not None:
                return replace(request, alpha=learned)
        return request

    def _from_dispatch(self, wl: dict[str, Any], entry: dict[str, Any], d: Dispatch) -> Decision:
        text = d.summary()
        if d.outcome == "nominate":
            return _decision(wl, entry, "Ready", text, "nominate", d.nominated, ("Dispatched", text, False))
        if d.outcome == "reject":
            return _decision(wl, entry, "Rejected", text, "reject", None, ("NoWorkerCluster", text, True))
        return self._wait(wl, entry, text)

    def _wait(self, wl: dict[str, Any], entry: dict[str, Any], why: str) -> Decision:
        return _decision(wl, entry, "Pending", f"waiting: {why}", "wait")

    def _hold(self, wl: dict[str, Any], entry: dict[str, Any], why: str) -> Decision:
        text = f"held back: {why}; SovereignSpec stays Pending so MultiKueue cannot dispatch it"
        return _decision(wl, entry, "Pending", text, "hold", None, ("NominationRefused", text, True))

    def _reclose(self, wl: dict[str, Any], entry: dict[str, Any], nominated: list[str], why: str) -> Decision:
        """After our Ready, the nomination now names a worker the workload may not use: another
        writer rewrote it. Retry: Kueue evicts the workload (its remote copies go, the field is
        cleared), and the next reservation is nominated again."""
        text = (
            f"the nomination was rewritten to {', '.join(nominated)} after SovereignSpec's Ready ({why}): "
            "Retry, so that Kueue evicts it and SovereignSpec nominates an admissible worker again"
        )
        return _decision(wl, entry, "Retry", text, "reclose", None, ("NominationRewritten", text, True))

    def _rejected(self, wl: dict[str, Any], entry: dict[str, Any], why: str) -> Decision:
        return _decision(wl, entry, "Rejected", why, "reject", None, ("NoWorkerCluster", why, True))

    # -- writing -------------------------------------------------------------------------------

    def _write_one(self, d: Decision) -> str:
        k = key_of(d.wl)
        if d.state == "Pending" and d.entry.get("message") == as_written(d.message):
            return "unchanged"  # a wait already said (as written: cut to the limit): no write, no Event
        try:
            written = self.writer.check_state(
                d.wl, d.check, d.state, d.message, d.entry,
                extra_status={"nominatedClusterNames": list(d.nominated)} if d.nominated else None,
            )  # fmt: skip
        except ConflictError:
            metrics.CONFLICTS.inc()
            self._conflicted[k] = rv_int(d.wl)
            return "conflict"
        except ApiException as exc:
            log.warning("writing the dispatch of %s failed: %s %s", k, exc.status, exc.reason)
            return "error"
        except TRANSPORT_ERRORS as exc:  # this workload's write alone; decided again next tick
            metrics.TICK_FAILURES.labels(part="write").inc()
            log.warning("writing the dispatch of %s failed: %s: %s", k, type(exc).__name__, exc)
            return "error"
        self.cache.workloads.put(written)
        metrics.DISPATCHES.labels(outcome=d.outcome, worker=(d.nominated or ("",))[0]).inc()
        if d.event is not None:
            reason, message, warning = d.event
            self.writer.event(d.wl, "Workload", reason, message, warning)
        log.info("%s: %s %s", k, d.state, d.message[:300])
        return d.outcome
