"""The controller's own Prometheus metrics (served by `sovereignspec operator --metrics-port`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

DECISIONS = Counter(
    "sovereignspec_decisions_total", "Admission decisions written, by outcome and mode", ["outcome", "mode"]
)
GAMMA = Histogram("sovereignspec_draft_budget", "Draft budget γ* of admitted workloads", buckets=range(0, 33))
SPEEDUP = Histogram(
    "sovereignspec_predicted_speedup",
    "Predicted S_real of admitted workloads at their γ*",
    buckets=(0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0),
)
HEADROOM = Gauge(
    "sovereignspec_gpu_headroom", "Headroom per GPU as last read (-1: no fresh reading)", ["node", "gpu"]
)
PENDING = Gauge("sovereignspec_pending_workloads", "Workloads waiting for a SovereignSpec decision")
LEDGER = Gauge("sovereignspec_ledger_workloads", "Workloads placed by SovereignSpec and not finished")
CONFLICTS = Counter(
    "sovereignspec_api_conflicts_total", "Decisions dropped because the Workload changed meanwhile"
)
BAD_ANNOTATIONS = Counter("sovereignspec_bad_annotations_total", "Malformed workload annotations", ["field"])
TELEMETRY_UP = Gauge(
    "sovereignspec_telemetry_up", "1 if the last telemetry read returned GPU readings", ["source"]
)
TELEMETRY_ERRORS = Counter("sovereignspec_telemetry_errors_total", "Telemetry reads that failed", ["source"])
TICK_SECONDS = Histogram("sovereignspec_tick_seconds", "Duration of a decision tick")
EXCLUSIVE_WAITING = Counter(
    "sovereignspec_exclusive_waiting_total",
    "Retries of exclusive workloads that have waited past the patience bound (ExclusiveWaiting Events)",
)
TICK_FAILURES = Counter(
    "sovereignspec_failures_total",
    "Parts of a tick that failed alone (part: tick, policy, watch, object, write, event, learning, record)",
    ["part"],
)
TELEMETRY_REJECTED = Counter(
    "sovereignspec_telemetry_rejected_total",
    "Telemetry series or counters rejected at the border and treated as missing",
    ["source", "reason"],
)
DRIFT = Gauge(
    "sovereignspec_sovereignty_drift_workloads",
    "Running workloads whose node no longer satisfies their sovereignty requirement",
)
# Decisions age: speculative workloads already running, judged again at their GPU's reading now.
RUNNING_GAMMA = Gauge(
    "sovereignspec_running_gamma", "γ a running speculative workload was given", ["namespace", "workload"]
)
GAMMA_NOW = Gauge(
    "sovereignspec_gamma_now",
    "γ SovereignSpec would choose for a running workload on its GPU now (neighbours' SLOs not counted)",
    ["namespace", "workload"],
)
SPEEDUP_IN_FORCE = Gauge(
    "sovereignspec_speedup_in_force",
    "Predicted own S_real of the γ a workload runs, at its GPU's reading now",
    ["namespace", "workload"],
)
AGGREGATE_IN_FORCE = Gauge(
    "sovereignspec_aggregate_speedup_in_force",
    "Predicted aggregate speed-up of a workload's GPU at the γ it runs, now (< 1: a net loss)",
    ["namespace", "workload"],
)
NET_LOSS = Gauge(
    "sovereignspec_speculation_net_loss_workloads",
    "Running workloads whose speculation has become a net loss for their GPU at today's load",
)
# Every decision scored (scoring.py): the TPOT predicted at decision time against the engine's.
PREDICTION_ERROR = Gauge(
    "sovereignspec_prediction_error",
    "Median of measured / predicted TPOT - 1 over running decisions, per profile (+0.3: engines 30 % slower)",
    ["gpu_type", "model"],
)
LEARNED_POINTS = Gauge(
    "sovereignspec_learned_profile_points",
    "Plain-decode step readings in a LearnedProfile's window, per profile",
    ["gpu_type", "model"],
)
LEARNED_IN_FORCE = Gauge(
    "sovereignspec_learned_profile_in_force",
    "1 where decisions price a GPU type and model with the learned profile, 0 with the shipped one",
    ["gpu_type", "model"],
)
LEARNED_EXTRA_MARGIN = Gauge(
    "sovereignspec_learned_extra_margin",
    "What a shipped profile's observed error adds to the self-benefit margin, per profile",
    ["gpu_type", "model"],
)
PREDICTION_SCORED = Gauge(
    "sovereignspec_prediction_scored_workloads",
    "Running decisions with both a predicted and an engine-reported TPOT, per profile",
    ["gpu_type", "model"],
)
# What actually runs, against where it may (violations.py).
VIOLATIONS_TOTAL = Counter(
    "sovereignspec_sovereignty_violations_total",
    "GPU pods found running on a node outside their namespace's jurisdictions (once per pod and node)",
)
VIOLATIONS = Gauge(
    "sovereignspec_sovereignty_violating_pods",
    "GPU pods running now on a node outside their namespace's jurisdictions",
)
DECISIONS_IGNORED_TOTAL = Counter(
    "sovereignspec_decisions_ignored_total",
    "Running workloads decided plain whose engines drafted anyway (once per workload until it stops)",
)
DECISIONS_IGNORED = Gauge(
    "sovereignspec_decisions_ignored_workloads",
    "Running workloads decided plain whose engines draft now",
)
# The sovereignty record (audit.py).
AUDIT_RECORDS = Counter(
    "sovereignspec_audit_records_total",
    "Records of decisions and pod bindings written to the sovereignty record",
)
AUDIT_BACKLOG = Gauge(
    "sovereignspec_audit_backlog_records", "Records waiting to be written because the record's store failed"
)
AUDIT_FAILURES = Counter(
    "sovereignspec_audit_write_failures_total", "Writes of the sovereignty record that failed"
)
AUDIT_OFF = Gauge(
    "sovereignspec_audit_off",
    "1 while the sovereignty record is not kept: its CRD or the operator's RBAC for it is missing",
)
AUDIT_HELD = Counter(
    "sovereignspec_audit_held_decisions_total",
    "Placements held (Retry) because their record could not be persisted first (audit.required)",
)
# The watch-fed caches the ticks read from (informer.py).
CACHE_OBJECTS = Gauge("sovereignspec_cache_objects", "Objects in the watch-fed cache", ["resource"])
CACHE_LISTS = Counter(
    "sovereignspec_cache_lists_total",
    "Full LISTs of a resource: one at start-up, one more per watch that could not be resumed",
    ["resource"],
)
WATCH_ERRORS = Counter(
    "sovereignspec_watch_errors_total", "Watches that broke (each resumed, or listed again)", ["resource"]
)
DISPATCHES = Counter(
    "sovereignspec_dispatch_decisions_total",
    "Dispatcher role: decisions written, by outcome (nominate, wait, hold, reject, kept) and worker",
    ["outcome", "worker"],
)
LEADER = Gauge("sovereignspec_leader", "1 while this replica holds the leader Lease and decides")
LEADER_TRANSITIONS = Counter(
    "sovereignspec_leader_transitions_total", "Times this replica became the leader (0 or 1 per process)"
)
