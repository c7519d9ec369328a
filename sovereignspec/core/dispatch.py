"""Choosing worker clusters for MultiKueue: sovereignty first, then the same model as on a node.

On a MultiKueue manager, SovereignSpec nominates the worker cluster(s) a workload is dispatched
to. Each worker is seen as its administrators describe it (jurisdiction, the tenant it is
dedicated to, if any) and as its telemetry reads (per-GPU headroom of one GPU type). A workload:

1. loses every worker it may not run on (jurisdiction, a worker dedicated to another tenant, a
   worker whose own description is malformed: fail closed) and every worker that is not connected
   now; what is left is admissible;
2. is placed, without committing, on each admissible worker's GPUs by the node-level `Placer`
   (the same γ*, S_real, neighbour bound and TPOT as inside a worker);
3. goes to the best-ranked: predicted TPOT (where the headroom is), then headroom, then name;
   a worker whose telemetry is missing is ranked after every worker that has it, never excluded
   for it, and never makes a worker across a boundary admissible.

The result is one of: nominate (with the ranking and why), wait (no worker can take it now, but one
could: it reconnects, an administrator fixes its description), or reject (no worker can ever take
it: every exclusion is permanent).

Pure: plain data in, plain data out; the operator reads the API and writes the outcome.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from sovereignspec.core.cluster import ClusterView, GpuState, NodeState, PlacerSettings, WorkloadRequest
from sovereignspec.core.placement import Placer
from sovereignspec.core.sovereignty import Exclusion, NodeTenancy, check_node
from sovereignspec.core.specs import ProfileSet

DispatchOutcome = Literal["nominate", "wait", "reject"]


@dataclass(frozen=True)
class WorkerGpu:
    node: str
    index: int
    headroom: float | None  # None: no fresh reading for this GPU


@dataclass(frozen=True)
class Worker:
    """One MultiKueueCluster as the dispatcher sees it."""

    name: str
    jurisdiction: str | None = None  # None: in no jurisdiction (takes no jurisdiction-bound work)
    dedicated_tenant: str | None = None  # the one tenant it serves, if it is a tenant's own
    connected: bool = True  # MultiKueue's Active condition
    not_connected_reason: str = ""
    problem: str | None = None  # its description cannot be read: excluded, fail closed
    gpu_type: str | None = None  # the profile its GPUs are priced with
    gpus: tuple[WorkerGpu, ...] = ()
    telemetry_error: str | None = None  # why its telemetry could not be read, if it could not
    # GPUs of work already dispatched there (admitted or nominated, not finished): telemetry shows
    # a workload's load only once its engine runs, so the dispatcher keeps its own ledger.
    committed_gpus: int = 0

    @property
    def has_telemetry(self) -> bool:
        return self.telemetry_error is None and any(g.headroom is not None for g in self.gpus)


@dataclass(frozen=True)
class Ranked:
    worker: str
    tpot_ms: float | None  # predicted on its best GPU; None without telemetry
    speedup: float | None
    gamma: int
    headroom: float | None
    note: str  # one line: what the placement on this worker would be


@dataclass(frozen=True)
class Dispatch:
    workload: str
    outcome: DispatchOutcome
    nominated: tuple[str, ...]
    reason: str
    ranking: tuple[Ranked, ...] = ()
    excluded: Mapping[str, Exclusion] = field(default_factory=dict)

    def summary(self, limit: int = 6) -> str:
        """One line for the admission check's message and the Event."""
        parts = [self.reason]
        if self.ranking:
            shown = "; ".join(f"{r.worker}: {r.note}" for r in self.ranking[:limit])
            parts.append(f"ranked {shown}")
        if self.excluded:
            items = sorted(self.excluded.items())
            shown = "; ".join(f"{w}: {e.constraint}: {e.detail}" for w, e in items[:limit])
            more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
            parts.append(f"excluded {shown}{more}")
        return " | ".join(parts)


def check_worker(req: WorkloadRequest, worker: Worker, jurisdiction_label: str) -> Exclusion | None:
    """Why `worker` may never (permanent) or not now take `req`, or None if it may. Sovereignty
    is judged by the node-level rule, with the worker as the node."""
    if worker.problem is not None:
        # An administrator's mistake: not permanent (they can fix it), never admissible meanwhile.
        return Exclusion("worker-description", worker.problem, False)
    labels = {jurisdiction_label: worker.jurisdiction} if worker.jurisdiction is not None else {}
    exclusion = check_node(req.requirement, NodeTenancy(worker.name, labels), jurisdiction_label)
    if exclusion is not None:
        return Exclusion(
            exclusion.constraint, exclusion.detail.replace("node", "worker"), exclusion.permanent
        )
    if worker.dedicated_tenant is not None and worker.dedicated_tenant != req.tenant:
        return Exclusion("dedicated-worker", f"worker is dedicated to tenant {worker.dedicated_tenant}", True)
    if not worker.connected:
        return Exclusion(
            "not-connected", worker.not_connected_reason or "MultiKueue reports it inactive", False
        )
    return None


def _view(worker: Worker, jurisdiction_label: str) -> ClusterView:
    """The worker as one node per telemetry host, every GPU it reports free: the dispatcher sees
    load only through headroom (the worker's own Kueue and SovereignSpec keep its quota and nodes)."""
    labels = {jurisdiction_label: worker.jurisdiction} if worker.jurisdiction is not None else {}
    by_node: dict[str, int] = {}
    for g in worker.gpus:
        by_node[g.node] = max(by_node.get(g.node, 0), g.index + 1)
    nodes = []
    taken = worker.committed_gpus
    for n, count in sorted(by_node.items()):
        used = min(taken, count)
        taken -= used
        nodes.append(NodeState(n, labels, count - used, capacity=count))
    assert worker.gpu_type is not None
    gpus = [GpuState(g.node, g.index, worker.gpu_type, g.headroom) for g in worker.gpus]
    return ClusterView(nodes, gpus)


class Dispatcher:
    """Ranks workers for one tick's pending workloads; what it nominates is taken into account
    for the rest of the tick (the worker's GPUs carry that load), as the node-level Placer does."""

    def __init__(
        self, profiles: ProfileSet, workers: Iterable[Worker], policy: PlacerSettings | None = None
    ) -> None:
        self.profiles = profiles
        self.policy = policy or PlacerSettings()
        self.workers = sorted(workers, key=lambda w: w.name)
        self._placers: dict[str, Placer] = {}
        for w in self.workers:
            if w.has_telemetry and w.gpu_type in profiles.gpus:
                self._placers[w.name] = Placer(
                    profiles, _view(w, self.policy.jurisdiction_label), self.policy
                )

    def dispatch(self, req: WorkloadRequest, nominate: int = 1) -> Dispatch:
        label = self.policy.jurisdiction_label
        excluded: dict[str, Exclusion] = {}
        admissible: list[Worker] = []
        for w in self.workers:
            why = check_worker(req, w, label)
            if why is None:
                admissible.append(w)
            else:
                excluded[w.name] = why
        if not admissible:
            if not self.workers:
                return Dispatch(req.name, "wait", (), "no worker cluster is configured yet", (), excluded)
            if all(e.permanent for e in excluded.values()):
                return Dispatch(req.name, "reject", (), "no worker cluster can ever take it", (), excluded)
            return Dispatch(req.name, "wait", (), "no worker cluster can take it now", (), excluded)

        scored: list[tuple[tuple[float, ...], Ranked]] = []
        for w in admissible:
            ranked, key, why_not = self._score(req, w)
            if ranked is None:
                # A GPU type without a profile is an administrator's slip to fix (wait meanwhile);
                # a model that fits no GPU of the worker never will.
                unknown_type = w.gpu_type is not None and w.gpu_type not in self.profiles.gpus
                excluded[w.name] = Exclusion("no-gpu", why_not, not unknown_type)
                continue
            scored.append((key, ranked))
        if not scored:
            if all(e.permanent for e in excluded.values()):
                return Dispatch(req.name, "reject", (), "no worker cluster can ever take it", (), excluded)
            return Dispatch(req.name, "wait", (), "no worker cluster can take it now", (), excluded)
        scored.sort(key=lambda item: item[0])
        ranking = tuple(r for _, r in scored)
        chosen = tuple(r.worker for r in ranking[: max(1, nominate)])
        best = ranking[0]
        placer = self._placers.get(best.worker)
        if placer is not None:
            placer.place(req, commit=True, explain=False)  # later workloads this tick see its load
        reason = f"nominated {', '.join(chosen)}"
        if best.tpot_ms is None:
            reason += " (no admissible worker reports telemetry)"
        return Dispatch(req.name, "nominate", chosen, reason, ranking, excluded)

    def _score(self, req: WorkloadRequest, w: Worker) -> tuple[Ranked | None, tuple[float, ...], str]:
        """The worker's entry in the ranking and its sort key, or None and why it can never host."""
        placer = self._placers.get(w.name)
        if placer is None:
            if w.gpu_type is not None and w.gpu_type not in self.profiles.gpus:
                return None, (), f"its GPU type {w.gpu_type!r} has no profile"
            why = w.telemetry_error or "no GPU readings"
            return (
                Ranked(w.name, None, None, 0, None, f"no telemetry ({why}): ranked last"),
                (2.0, 0.0, 0.0),
                "",
            )
        r = placer.place(req, commit=False, explain=False).record
        if r.outcome == "rejected":
            return None, (), r.reason
        if r.outcome != "placed" or r.tpot_ms is None:
            return Ranked(w.name, None, None, 0, None, f"busy now ({r.reason})"), (1.0, 0.0, 0.0), ""
        headroom = r.headroom if r.headroom is not None else 0.0
        free = 1.0 - min(w.committed_gpus / max(len(w.gpus), 1), 1.0)
        mode = f"speculative γ={r.gamma}" if r.mode == "speculative" else "plain"
        speedup = f", S_real {r.speedup:.2f}" if r.speedup is not None and r.mode == "speculative" else ""
        note = (
            f"{mode}{speedup}, TPOT {r.tpot_ms:.1f} ms on {r.node}/gpu{r.gpu_index} (headroom {headroom:.2f})"
        )
        # Ties within the model's resolution go to headroom, then to the worker with more GPUs
        # not yet given away: quantize TPOT to 1 %.
        tpot_key = round(math.log(max(r.tpot_ms, 1e-6)) / math.log(1.01))
        key = (0.0, float(tpot_key), -round(headroom, 2), -round(free, 2))
        return Ranked(w.name, r.tpot_ms, r.speedup, r.gamma, r.headroom, note), key, ""


def dispatch_order(req: WorkloadRequest) -> tuple[bool, float]:
    """Sort key of a tick: latency-sensitive, high-acceptance work first (it takes the headroom)."""
    return (req.latency_class != "latency", -req.alpha)


def admissible_nomination(
    req: WorkloadRequest, nominated: Sequence[str], workers: Mapping[str, Worker], jurisdiction_label: str
) -> str | None:
    """Why a nomination someone else wrote may not stand (None: every worker in it may take `req`).
    An unknown worker, or one across a boundary, fails closed."""
    for name in nominated:
        w = workers.get(name)
        if w is None:
            return f"nominated worker {name!r} is not a MultiKueueCluster this dispatcher knows"
        why = check_worker(req, replace(w, connected=True), jurisdiction_label)
        if why is not None:
            return f"nominated worker {name}: {why.constraint}: {why.detail}"
    return None
