"""One decision tick: read everything from the API, decide with the core, write our entries.

    tick = check AdmissionChecks (Active) → list Workloads, Nodes, ResourceFlavors → for each
           policy: telemetry snapshot → view (ledger + pending) → Placer.tick → writes + Events

Ticks run one at a time (the kopf handlers only wake the loop), so decisions are sequential and
every tick starts from what is already written to the API.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sovereignspec.core.decision import DecisionRecord
from sovereignspec.core.placement import Placement, Placer, Policy
from sovereignspec.core.specs import ProfileSet
from sovereignspec.engines import budget_by_batch, engine_config
from sovereignspec.operator import annotations as ann
from sovereignspec.operator import metrics
from sovereignspec.operator.policy import GROUP, KIND, PLURAL, VERSION, PolicySpec, parse_policy
from sovereignspec.operator.view import PendingWorkload, View, build
from sovereignspec.operator.writer import ConflictError, Writer, now_rfc3339
from sovereignspec.telemetry.dcgm import DcgmScraper
from sovereignspec.telemetry.prometheus import PrometheusReader
from sovereignspec.telemetry.snapshot import Snapshot

log = logging.getLogger(__name__)
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"


@dataclass(frozen=True)
class Settings:
    controller_name: str = "sovereignspec.io/speculation"
    field_manager: str = "sovereignspec-controller"
    write_workers: int = 8
    telemetry_cache_seconds: float = 1.0


@dataclass
class TickReport:
    decided: int = 0
    conflicts: int = 0
    more: bool = False  # another policy group still has pending work: tick again now
    reevaluate_after: float = 10.0
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class TelemetryCache:
    """One snapshot per telemetry configuration, reused for a second so that a burst of ticks does
    not hammer Prometheus."""

    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self._cache: dict[tuple[object, ...], Snapshot] = {}

    def get(self, spec: PolicySpec) -> Snapshot:
        t = spec.telemetry
        key = (t.source, t.prometheus_url, tuple(t.dcgm_endpoints), t.acceptance.window)
        cached = self._cache.get(key)
        if cached is not None and not cached.error and time.time() - cached.fetched_at < self.max_age:
            return cached  # failures are not cached: the next tick tries again
        if t.source == "prometheus" and t.prometheus_url:
            snap = PrometheusReader(t.prometheus_url, window=t.acceptance.window).snapshot()
        elif t.source == "dcgm-exporter" and t.dcgm_endpoints:
            snap = DcgmScraper(t.dcgm_endpoints).snapshot()
        elif t.source == "none":
            snap = Snapshot(fetched_at=time.time())
        else:
            snap = Snapshot(
                fetched_at=time.time(), error=f"telemetry source {t.source} has no endpoint configured"
            )
        self._cache[key] = snap
        metrics.TELEMETRY_UP.labels(source=t.source).set(0 if snap.error and not snap.gpus else 1)
        if snap.error:
            metrics.TELEMETRY_ERRORS.labels(source=t.source).inc()
        return snap


class Controller:
    def __init__(self, api: client.ApiClient, profiles: ProfileSet, settings: Settings | None = None) -> None:
        self.api = api
        self.profiles = profiles
        self.settings = settings or Settings()
        self.writer = Writer(api, self.settings.field_manager)
        self.custom = client.CustomObjectsApi(api)
        self.telemetry = TelemetryCache(self.settings.telemetry_cache_seconds)
        self._pool = ThreadPoolExecutor(self.settings.write_workers, thread_name_prefix="sovereignspec-write")

    # -- reading ---------------------------------------------------------------------------------

    def _list(self, path: str) -> list[dict[str, Any]]:
        """A raw LIST (JSON, no model classes: much faster and gentler on memory at scale)."""
        resp = self.api.call_api(*self.api.param_serialize(method="GET", resource_path=path))
        data = resp.read()
        if resp.status >= 400:
            raise ApiException(status=resp.status, reason=data.decode(errors="replace")[:300])
        doc = json.loads(data)
        kind = doc.get("kind", "").removesuffix("List")
        version = doc.get("apiVersion")
        for item in doc.get("items", []):
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", version)
        return list(doc.get("items", []))

    # -- admission checks ----------------------------------------------------------------------

    def reconcile_checks(self) -> dict[str, tuple[str, PolicySpec]]:
        """Keep Active right on every AdmissionCheck we own; return the active ones and their policy."""
        checks = self._list(f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/admissionchecks")
        policies = {p["metadata"]["name"]: p for p in self._list(f"/apis/{GROUP}/{VERSION}/{PLURAL}")}
        active: dict[str, tuple[str, PolicySpec]] = {}
        for ac in checks:
            if ac.get("spec", {}).get("controllerName") != self.settings.controller_name:
                continue
            name = ac["metadata"]["name"]
            ok, reason, message, resolved = self._resolve(ac, policies)
            if resolved is not None:
                active[name] = resolved
            current = next(
                (c for c in ac.get("status", {}).get("conditions", []) if c.get("type") == "Active"), None
            )
            want = "True" if ok else "False"
            if current is None or (current.get("status"), current.get("reason"), current.get("message")) != (
                want,
                reason,
                message,
            ):
                try:
                    self.writer.admission_check_active(name, ok, reason, message)
                except ApiException as exc:
                    log.warning("could not set Active on AdmissionCheck %s: %s", name, exc.reason)
                    continue
                if not ok:
                    self.writer.event(ac, "AdmissionCheck", reason, message, warning=True)
                log.info("AdmissionCheck %s Active=%s (%s)", name, want, message)
        return active

    def _resolve(
        self, ac: dict[str, Any], policies: dict[str, dict[str, Any]]
    ) -> tuple[bool, str, str, tuple[str, PolicySpec] | None]:
        params = ac.get("spec", {}).get("parameters")
        if not params:
            return False, "BadParametersRef", f"spec.parameters must name a {KIND} ({GROUP})", None
        if params.get("apiGroup") != GROUP or params.get("kind") != KIND:
            got = f"{params.get('apiGroup')}/{params.get('kind')}"
            return False, "BadParametersRef", f"spec.parameters: got {got}; accepted: {GROUP}/{KIND}", None
        name = params.get("name", "")
        if name not in policies:
            return False, "BadParametersRef", f"{KIND} {name!r} not found", None
        try:
            spec = parse_policy(name, policies[name].get("spec"))
        except ValueError as exc:
            return False, "InvalidParameters", str(exc), None
        unknown = sorted(set(spec.profiles.gpu_products.values()) - set(self.profiles.gpus))
        if unknown or spec.defaults.model not in self.profiles.models:
            bad = unknown or [spec.defaults.model]
            return False, "InvalidParameters", f"{KIND} {name}: unknown profile(s) {bad}", None
        return True, "Active", f"uses {KIND} {name}", (name, spec)

    # -- the tick ------------------------------------------------------------------------------

    def tick(self) -> TickReport:
        started = time.monotonic()
        report = TickReport()
        active = self.reconcile_checks()
        if not active:
            return report
        workloads = self._list(f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/workloads")
        nodes = self._list("/api/v1/nodes")
        flavors = {
            f["metadata"]["name"]: dict(f.get("spec", {}).get("nodeLabels") or {})
            for f in self._list(f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}/resourceflavors")
        }
        groups: dict[str, tuple[PolicySpec, set[str]]] = {}
        for check, (policy_name, spec) in sorted(active.items()):
            groups.setdefault(policy_name, (spec, set()))[1].add(check)
        report.reevaluate_after = min(spec.reevaluation_seconds for spec, _ in groups.values())
        now = time.time()
        for policy_name, (spec, checks) in sorted(groups.items()):
            snapshot = self.telemetry.get(spec)
            view = build(workloads, nodes, flavors, checks, spec, self.profiles, snapshot, now)
            self._observe(view)
            if not view.pending:
                continue
            if report.decided:  # the previous policy group wrote decisions this tick: re-read first
                report.more = True
                break
            self._decide(policy_name, spec, view, report)
        metrics.TICK_SECONDS.observe(time.monotonic() - started)
        return report

    def _observe(self, view: View) -> None:
        metrics.PENDING.set(len(view.pending))
        metrics.LEDGER.set(len(view.committed))
        for (node, gpu), h in view.gpu_headroom.items():
            metrics.HEADROOM.labels(node=node, gpu=str(gpu)).set(-1.0 if h is None else h)

    def _decide(self, policy_name: str, spec: PolicySpec, view: View, report: TickReport) -> None:
        placer = Placer(
            self.profiles,
            view.cluster,
            Policy(
                gamma_max=spec.gamma_max,
                margin=spec.self_benefit_margin,
                headroom_uncertainty=spec.telemetry.headroom_uncertainty,
                externality=spec.externality,
                jurisdiction_label=spec.sovereignty.jurisdiction_label,
            ),
        )
        by_name = {p.key: p for p in view.pending}
        jobs: list[tuple[PendingWorkload, Placement | None, str]] = []
        for p in view.pending:
            if p.request is None:
                problems = "; ".join(str(x) for x in p.declared.sovereignty_problems)
                jobs.append((p, None, f"rejected: {problems} (sovereignty fields fail closed)"))
        for placement in placer.tick(
            [p.request for p in view.pending if p.request is not None], explain=True
        ):
            jobs.append((by_name[placement.workload], placement, ""))
        futures = [self._pool.submit(self._write, policy_name, spec, view, p, pl, why) for p, pl, why in jobs]
        for f in futures:
            outcome = f.result()
            report.outcomes[outcome] += 1
            if outcome == "conflict":
                report.conflicts += 1
            else:
                report.decided += 1

    # -- writing one decision ------------------------------------------------------------------

    def _write(
        self,
        policy_name: str,
        spec: PolicySpec,
        view: View,
        p: PendingWorkload,
        placement: Placement | None,
        why: str,
    ) -> str:
        wl = p.workload
        try:
            if placement is None:
                self.writer.check_state(wl, p.check, "Rejected", why, p.entry)
                self.writer.event(wl, "Workload", "Rejected", why, warning=True)
                metrics.DECISIONS.labels(outcome="rejected", mode="none").inc()
                return "rejected"
            record = placement.record
            if record.outcome == "placed":
                return self._write_placed(policy_name, spec, view, p, record)
            if record.outcome == "retry":
                retries = int(p.entry.get("retryCount", 0) or 0)
                after = min(spec.retry.max_seconds, spec.retry.base_seconds * 2**retries)
                message = f"retry in {after}s: {record.reason}"
                self.writer.check_state(wl, p.check, "Retry", message, p.entry, requeue_after=after)
                self.writer.event(wl, "Workload", "Retry", message + _excluded_text(record))
                metrics.DECISIONS.labels(outcome="retry", mode="none").inc()
                return "retry"
            message = f"rejected: {record.reason}"
            self.writer.check_state(wl, p.check, "Rejected", message, p.entry)
            self.writer.event(wl, "Workload", "Rejected", message + _excluded_text(record), warning=True)
            metrics.DECISIONS.labels(outcome="rejected", mode="none").inc()
            return "rejected"
        except ConflictError:
            metrics.CONFLICTS.inc()
            log.info("workload %s changed while deciding; deciding again next tick", p.key)
            return "conflict"
        except ApiException as exc:
            log.warning("writing the decision for %s failed: %s %s", p.key, exc.status, exc.reason)
            return "error"

    def _write_placed(
        self, policy_name: str, spec: PolicySpec, view: View, p: PendingWorkload, record: DecisionRecord
    ) -> str:
        wl, req = p.workload, p.request
        assert req is not None and record.node is not None and record.gpu_type is not None
        notes = {
            ann.OUT_MODE: record.mode,
            ann.OUT_BUDGET: str(record.gamma),
            ann.OUT_GPU_TYPE: record.gpu_type,
            ann.OUT_GPU_INDEX: str(record.gpu_index),
            ann.OUT_SPEEDUP: f"{record.speedup:.3f}" if record.speedup is not None else "",
            ann.OUT_TPOT: f"{record.tpot_ms:.3f}" if record.tpot_ms is not None else "",
            ann.OUT_DECIDED_AT: now_rfc3339(),
            ann.OUT_POLICY: policy_name,
        }
        drafter = self.profiles.drafters.get(req.drafter) if req.drafter else None
        if drafter is not None and drafter.supports(req.model):
            vllm, sglang = engine_config(drafter, req.model, record.gamma)
            if record.gamma > 0:
                notes[ann.OUT_VLLM] = vllm
                notes[ann.OUT_SGLANG] = sglang
            table = budget_by_batch(
                self.profiles.gpus[record.gpu_type],
                self.profiles.models[req.model],
                drafter,
                req.alpha,
                float(req.context),
                spec.gamma_max,
                spec.self_benefit_margin,
            )
            notes[ann.OUT_BUDGET_BY_BATCH] = json.dumps(table, separators=(",", ":"))
        clashes = sorted(k for k, v in notes.items() if p.template_annotations.get(k, v) != v)
        for k in clashes:  # Kueue fails a workload whose podSetUpdates contradict its template
            notes.pop(k)
        updates = [
            {"name": name, "annotations": notes, "nodeSelector": {ann.HOSTNAME: record.node}}
            for name in p.pod_set_names
        ]
        reason = record.reason
        if record.mode == "plain" and view.stale_reason and record.headroom is None:
            reason = f"{reason} ({view.stale_reason})"
        message = (
            f"{record.mode} γ={record.gamma} on {record.node}/gpu{record.gpu_index} ({record.gpu_type}); "
            f"α {req.alpha:.2f} ({p.alpha_source}); {reason}"
        )
        self.writer.check_state(wl, p.check, "Ready", message, p.entry, pod_set_updates=updates)
        self.writer.event(
            wl,
            "Workload",
            "SpeculativeDecode" if record.gamma > 0 else "PlainDecode",
            _record_text(record, p),
        )
        if record.held_back:
            held = "; ".join(f"{gpu}: {why}" for gpu, why in sorted(record.held_back.items()))
            self.writer.event(wl, "Workload", "NeighbourSLO", f"speculation held back on {held}")
        excluded = _excluded_text(record)
        if excluded:
            self.writer.event(wl, "Workload", "ExcludedNodes", excluded.lstrip("; "))
        if p.declared.performance_problems:
            fields = ", ".join(x.field for x in p.declared.performance_problems)
            text = "; ".join(str(x) for x in p.declared.performance_problems)
            self.writer.event(
                wl, "Workload", "BadAnnotation", f"{text}. Speculation is off: plain decode.", True
            )
            for x in p.declared.performance_problems:
                metrics.BAD_ANNOTATIONS.labels(field=x.field).inc()
            log.warning("workload %s: bad annotations (%s): plain decode", p.key, fields)
        if clashes:
            self.writer.event(
                wl,
                "Workload",
                "AnnotationClash",
                f"template already sets {clashes}; left out of podSetUpdates",
                True,
            )
        metrics.DECISIONS.labels(outcome="placed", mode=record.mode).inc()
        metrics.GAMMA.observe(record.gamma)
        if record.speedup is not None:
            metrics.SPEEDUP.observe(record.speedup)
        return "placed"


def _record_text(record: DecisionRecord, p: PendingWorkload) -> str:
    """The decision record as one Event message (Events cap messages near 1 kB)."""
    r = record
    parts = [
        f"{r.mode} γ*={r.gamma} (unconstrained {r.unconstrained_gamma}) "
        f"on {r.node}/gpu{r.gpu_index} {r.gpu_type}",
        f"S_real={_f(r.speedup)} aggregate={_f(r.aggregate_speedup)} τ={_f(r.tau)} "
        f"α={_f(r.alpha)} ({p.alpha_source})",
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
