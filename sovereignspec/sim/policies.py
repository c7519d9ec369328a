"""Speculation policies behind one interface: where a tenant's replicas go, and which γ each
replica runs, re-decided whenever its GPU's batch changes.

- never — spread placement; γ = 0.
- always-K — spread; K for every replica with a drafter.
- vllm-table — spread; a static [batch range → K] table on the replica's own batch (vLLM's
  dynamic speculative decoding).
- smartspec — spread; per replica, the K maximising its own goodput on the live batch, with
  acceptance learned online; no neighbours' SLOs (SmartSpec / TurboSpec).
- trt-threshold — spread; K = 4 until rolling acceptance falls under 0.5, then off for good
  (TensorRT-LLM).
- sovereignspec — SovereignSpec's core (`Placer`) from lagged telemetry and declared α; each replica
  then runs exactly what the operator hands its engine: the per-batch table (`core.handoff.handoff`,
  judged at the GPU's load and neighbours' bound at placement), read at its live batch.
- sovereignspec-no-externality — the same without the neighbours' SLO check.
- oracle — the core with true α, the unlagged reading and no uncertainty; then, per GPU, the γ of
  every replica maximising the GPU's goodput (token rate of the replicas within their TPOT SLO, then
  all tokens) on the world's true step times and α, re-decided on every change.

"spread" places each replica on the admissible GPU with the least declared load (sovereignty is
enforced for every policy; no policy may break it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from sovereignspec.core.cluster import ClusterView, GpuState, NodeState, PlacerSettings, WorkloadRequest
from sovereignspec.core.defaults import HEADROOM_UNCERTAINTY
from sovereignspec.core.handoff import handoff
from sovereignspec.core.placement import Placer
from sovereignspec.core.running import neighbour_bound, with_ledger_load
from sovereignspec.core.sovereignty import DEFAULT_JURISDICTION_LABEL
from sovereignspec.core.speedup import tau

if TYPE_CHECKING:
    from sovereignspec.core.sovereignty import NodeTenancy
    from sovereignspec.core.specs import ModelSpec, ProfileSet
    from sovereignspec.sim.scenario import Scenario
    from sovereignspec.sim.state import Gpu, Replica


class SimView(Protocol):
    """What a policy sees of the simulation (the `Simulator` is one): the scenario, the cluster's
    GPUs and replicas, the clock, telemetry as read, sovereignty, and the step-time oracle. Read
    only, by type: a policy returns its choices; the engine applies them."""

    @property
    def scenario(self) -> Scenario: ...
    @property
    def profiles(self) -> ProfileSet: ...
    @property
    def model(self) -> ModelSpec: ...
    @property
    def gpus(self) -> Sequence[Gpu]: ...
    @property
    def replicas(self) -> Sequence[Replica]: ...
    @property
    def now(self) -> float: ...
    @property
    def world(self) -> str: ...
    def admissible(self, tenant: int) -> list[Gpu]: ...
    def tenancy(self, node: str) -> NodeTenancy: ...
    def reading(self, g: Gpu, t: float) -> float | None: ...
    def true_headroom(self, g: Gpu) -> float: ...
    def step_time(self, g: Gpu, gammas: dict[int, int] | None = None) -> float: ...


VLLM_TABLE = ((1, 4, 5), (5, 16, 3), (17, 64, 1), (65, 10**9, 0))
# A request's TPOT spreads around its steps' (batches change, prefills interleave): the oracle,
# which sees steps, keeps this room under every SLO.
ORACLE_TPOT_SPREAD = 0.1


class SimPolicy:
    name = "never"
    dynamic = False  # re-decides γ as batches change (else γ stays as placed)
    # γ of a replica depends only on that replica and its own batch size: the engine then reads
    # it from a table of `gamma_at` for every batch size instead of asking `gammas` on each change.
    own_batch_only = False

    def __init__(self) -> None:
        self.last_reason: dict[int, str] = {}

    def initial_gamma(self, sim: SimView, tenant: int) -> int:
        return 0

    def place(self, sim: SimView, tenant: int, count: int) -> list[tuple[int, int, float | None]]:
        """Spread: the admissible GPU with the least declared load, one replica at a time.
        Returns (GPU, γ, predicted TPOT or None) per placed replica."""
        out: list[tuple[int, int, float | None]] = []
        extra: dict[int, int] = {}
        t = sim.scenario.tenants[tenant]
        for _ in range(max(count, 0)):
            cap = sim.scenario.replicas_per_gpu
            options = [g for g in sim.admissible(tenant) if len(g.replicas) + extra.get(g.id, 0) < cap]
            if not options:
                self.last_reason[tenant] = "no admissible GPU with a free engine slot"
                break

            def load(g: Gpu) -> int:
                declared = sum(sim.scenario.tenants[sim.replicas[r].tenant].max_num_seqs for r in g.replicas)
                return declared + extra.get(g.id, 0) * t.max_num_seqs

            best = min(options, key=lambda g: (load(g), g.id))
            extra[best.id] = extra.get(best.id, 0) + 1
            out.append((best.id, self.initial_gamma(sim, tenant), None))
        return out

    def gammas(self, sim: SimView, g: Gpu) -> dict[int, int]:
        return {rid: self.gamma_at(sim, g, sim.replicas[rid], sim.replicas[rid].active) for rid in g.replicas}

    def gamma_at(self, sim: SimView, g: Gpu, r: Replica, batch: int) -> int:
        """γ for replica `r` running `batch` sequences (policies with `own_batch_only`)."""
        return r.gamma

    def adopt(self, sim: SimView, r: Replica, index: int) -> None:
        """Replica `r`, the `index`-th that the last `place` returned, is now in the simulation."""


class Never(SimPolicy):
    name = "never"


class AlwaysK(SimPolicy):
    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k
        self.name = f"always-{k}"

    def initial_gamma(self, sim: SimView, tenant: int) -> int:
        return self.k if sim.scenario.tenants[tenant].drafter else 0


class VllmTable(SimPolicy):
    name = "vllm-table"
    dynamic = True
    own_batch_only = True

    def gamma_at(self, sim: SimView, g: Gpu, r: Replica, batch: int) -> int:
        has = sim.scenario.tenants[r.tenant].drafter
        return next(k for lo, hi, k in VLLM_TABLE if lo <= max(batch, 1) <= hi) if has else 0


class TrtThreshold(SimPolicy):
    name = "trt-threshold"
    dynamic = True
    k, threshold = 4, 0.5

    def gammas(self, sim: SimView, g: Gpu) -> dict[int, int]:
        out = {}
        for rid in g.replicas:
            r = sim.replicas[rid]
            if r.alpha_est < self.threshold:
                r.switched_off = True
            has = sim.scenario.tenants[r.tenant].drafter
            out[rid] = self.k if has and not r.switched_off else 0
        return out


class SmartSpec(SimPolicy):
    """Per engine: the K that maximises the engine's own goodput on the live batch."""

    name = "smartspec"
    dynamic = True

    def __init__(self) -> None:
        super().__init__()
        self._memo: dict[tuple[object, ...], dict[int, int]] = {}

    def gammas(self, sim: SimView, g: Gpu) -> dict[int, int]:
        out = {rid: sim.replicas[rid].current for rid in g.replicas}
        key = (
            g.id,
            tuple(sorted(g.running.items())),
            round(g.ctx_sum / max(len(g.seqs), 1), -1),
            tuple(round(sim.replicas[rid].alpha_est, 2) for rid in g.replicas),
            tuple(out.values()),
        )
        if key in self._memo:
            return self._memo[key]
        for rid in g.replicas:
            r = sim.replicas[rid]
            if not sim.scenario.tenants[r.tenant].drafter or r.active == 0:
                out[rid] = 0
                continue
            best, best_rate = 0, -1.0
            for k in range(sim.scenario.gamma_max + 1):
                trial = {**out, rid: k}
                step = sim.step_time(g, trial)
                rate = float(tau(r.alpha_est, k)) / step if step else 0.0
                if rate > best_rate * (1 + 1e-9):
                    best, best_rate = k, rate
            out[rid] = best
        self._memo[key] = out
        return out


class SovereignSpec(SimPolicy):
    """The core's placement and γ*, plus the per-batch table handed to the engine."""

    name = "sovereignspec"
    dynamic = True
    own_batch_only = True
    externality = True
    know_truth = False

    def __init__(self) -> None:
        super().__init__()
        self._tables: dict[int, list[list[int]]] = {}  # by replica: its engine's hand-off
        self._pending: dict[int, list[list[int]]] = {}  # by GPU, for replicas being placed now

    def _alpha(self, sim: SimView, tenant: int) -> float:
        t = sim.scenario.tenants[tenant]
        if self.know_truth or t.declared_alpha is None:
            return t.alpha.mean
        return t.declared_alpha

    def _request(self, sim: SimView, tenant: int, name: str) -> WorkloadRequest:
        t = sim.scenario.tenants[tenant]
        return WorkloadRequest(
            name=name,
            tenant=t.name,
            model=sim.model.name,
            drafter=t.drafter,
            alpha=self._alpha(sim, tenant),
            seqs=t.max_num_seqs,
            context=int(t.prompt_tokens.mean + t.output_tokens.mean / 2),
            latency_class=t.latency_class,
            tpot_slo_s=t.tpot_slo_ms / 1e3,
            jurisdiction=t.jurisdiction,
            exclusive=t.exclusive,
        )

    def _view(self, sim: SimView, pending: list[tuple[Gpu, WorkloadRequest, int]]) -> ClusterView:
        """The cluster as the operator would rebuild it: telemetry (lagged), the ledger of placed
        replicas (and those placed earlier in this call), their tenancy and free engine slots."""
        cap = sim.scenario.replicas_per_gpu
        used = {g.id: len(g.replicas) for g in sim.gpus}
        for g, _, _ in pending:
            used[g.id] += 1
        nodes, gpus = [], []
        for node in sorted({g.node for g in sim.gpus}):
            tenancy = sim.tenancy(node)
            mine = [w for g, w, _ in pending if g.node == node]
            free = sum(cap - used[g.id] for g in sim.gpus if g.node == node and used[g.id] < cap)
            nodes.append(
                NodeState(
                    node,
                    tenancy.labels,
                    free,
                    tenancy.tenants | {w.tenant for w in mine},
                    tenancy.exclusive_tenants | {w.tenant for w in mine if w.exclusive},
                )
            )
        for g in sim.gpus:
            if used[g.id] >= cap:
                continue
            headroom = sim.true_headroom(g) if self.know_truth else sim.reading(g, sim.now)
            # As the operator reads it: the engine's measured TPOT (the world's, not the policy's
            # model of it), else the prediction made when it was placed.
            ratio, binding = neighbour_bound(
                (
                    sim.scenario.tenants[sim.replicas[rid].tenant].name,
                    sim.scenario.tenants[sim.replicas[rid].tenant].tpot_slo_ms / 1e3,
                    sim.replicas[rid].tpot_measured_s or sim.replicas[rid].predicted_tpot_s,
                )
                for rid in g.replicas
            )
            gpus.append(GpuState(g.node, g.index, g.gpu_type, headroom, ratio, binding))
        placed = [
            (self._request(sim, r.tenant, f"r{r.id}"), sim.gpus[r.gpu].node, sim.gpus[r.gpu].index, r.gamma)
            for r in sim.replicas
        ] + [(w, g.node, g.index, gamma) for g, w, gamma in pending]
        return with_ledger_load(ClusterView(nodes, gpus), placed, self._priced(sim))

    def _profiles(self, sim: SimView) -> ProfileSet:
        """What the core places with. Knowing the truth, nothing is uncertain: no interval around a
        GPU's compute efficiency, so no decision near the ridge is made cautious."""
        if not self.know_truth:
            return sim.profiles
        gpus = {
            name: replace(g, compute_efficiency_low=None, compute_efficiency_high=None)
            for name, g in sim.profiles.gpus.items()
        }
        return replace(sim.profiles, gpus=gpus)

    def _priced(self, sim: SimView) -> ProfileSet:
        """What its engines' tables and the ledger's load are priced with: the profiles (a
        learning policy's own, `SovereignSpecLearned`)."""
        return sim.profiles

    def place(self, sim: SimView, tenant: int, count: int) -> list[tuple[int, int, float | None]]:
        policy = PlacerSettings(
            gamma_max=sim.scenario.gamma_max,
            headroom_uncertainty=0.0 if self.know_truth else HEADROOM_UNCERTAINTY,
            externality=self.externality,
            jurisdiction_label=DEFAULT_JURISDICTION_LABEL,
        )
        by_position = {(g.node, g.index): g for g in sim.gpus}
        pending: list[tuple[Gpu, WorkloadRequest, int]] = []
        predicted: list[float | None] = []
        t = sim.scenario.tenants[tenant]
        drafter = sim.profiles.drafters[t.drafter] if t.drafter else None
        tables: list[list[list[int]]] = []
        for k in range(max(count, 0)):
            # One replica per view, so each sees the previous ones on their GPUs and in their slots.
            request = self._request(sim, tenant, f"new{k}")
            p = Placer(self._profiles(sim), self._view(sim, pending), policy).place(request, explain=False)
            if p.outcome != "placed" or p.node is None or p.gpu_index is None:
                self.last_reason[tenant] = p.record.reason
                break
            g = by_position[(p.node, p.gpu_index)]
            rec = p.record
            table = None
            if rec.headroom is not None:  # telemetry was read
                table = handoff(
                    self._priced(sim).gpu_for(g.gpu_type, sim.model.name),
                    sim.model,
                    drafter,
                    request.alpha,
                    float(request.context),
                    policy.gamma_max,
                    policy.margin + self._profiles(sim).margin_for(g.gpu_type, sim.model.name),
                    rec.headroom,
                    rec.step_limit_s if self.externality else math.inf,
                    (float(request.seqs), p.gamma),
                    rec.headroom_measured,
                )
            pending.append((g, request, p.gamma))
            tables.append(table or [[1, 10**9, 0]])
            predicted.append(rec.tpot_ms / 1e3 if rec.tpot_ms else None)
        self._queued = tables
        return [(g.id, gamma, tpot) for (g, _, gamma), tpot in zip(pending, predicted, strict=True)]

    def adopt(self, sim: SimView, r: Replica, index: int) -> None:
        """Replica `r`, the `index`-th of the last `place` call, starts: it keeps its hand-off."""
        self._tables[r.id] = self._queued[index]

    def gamma_at(self, sim: SimView, g: Gpu, r: Replica, batch: int) -> int:
        table = self._tables.get(r.id, [[1, 10**9, 0]])
        batch = max(batch, 1)
        return next((k for lo, hi, k in table if batch <= hi), table[-1][2])


class SovereignSpecNoExternality(SovereignSpec):
    name = "sovereignspec-no-externality"
    externality = False


class Oracle(SovereignSpec):
    """True α and load: places with the core, then searches every replica's γ on every change."""

    name = "oracle"
    know_truth = True
    own_batch_only = False  # searches every replica's γ together, on the whole batch

    def __init__(self) -> None:
        super().__init__()
        self._memo: dict[tuple[object, ...], dict[int, int]] = {}

    def gammas(self, sim: SimView, g: Gpu) -> dict[int, int]:
        current = {rid: sim.replicas[rid].current for rid in g.replicas}
        live = [rid for rid in g.replicas if sim.replicas[rid].active]
        if not live:
            return current
        # The search depends only on the batch: who runs how many sequences, at what context.
        key = (g.id, tuple(sorted(g.running.items())), round(g.ctx_sum / max(len(g.seqs), 1), -1))
        if key in self._memo:
            return {**current, **self._memo[key]}
        for _ in range(2):  # coordinate ascent, twice over
            for rid in live:
                if not sim.scenario.tenants[sim.replicas[rid].tenant].drafter:
                    current[rid] = 0
                    continue
                best, best_score = current[rid], None
                for k in range(sim.scenario.gamma_max + 1):
                    score = self._score(sim, g, {**current, rid: k}, live)
                    if best_score is None or score > best_score:
                        best, best_score = k, score
                current[rid] = best
        self._memo[key] = {rid: current[rid] for rid in live}
        return current

    def _score(
        self, sim: SimView, g: Gpu, gammas: dict[int, int], live: list[int]
    ) -> tuple[int, float, float]:
        """(replicas within their TPOT SLO, goodput, tokens per second): no neighbour pushed past
        its SLO first, then the token rate of those within it, then every token."""
        step = sim.step_time(g, gammas)
        rate = good = 0.0
        met = 0
        for rid in live:
            r = sim.replicas[rid]
            t = sim.scenario.tenants[r.tenant]
            tokens = float(tau(t.alpha.mean, gammas[rid]))
            rate += r.active * tokens / step
            if step / tokens * (1.0 + ORACLE_TPOT_SPREAD) <= t.tpot_slo_ms / 1e3:
                met += 1
                good += r.active * tokens / step
        return met, good, rate


class SovereignSpecOff(SovereignSpec):
    """SovereignSpec deciding with profiles 30 % off (`sim.learning.off_profiles`), never learning."""

    name = "sovereignspec-off30"

    def __init__(self) -> None:
        super().__init__()
        self._mine: ProfileSet | None = None

    def _start(self, sim: SimView) -> ProfileSet:
        from sovereignspec.sim.learning import off_profiles

        return off_profiles(sim.profiles)

    def _profiles(self, sim: SimView) -> ProfileSet:
        if self._mine is None:
            self._mine = self._start(sim)
        return self._mine

    def _priced(self, sim: SimView) -> ProfileSet:
        return self._profiles(sim)


class SovereignSpecLearned(SovereignSpecOff):
    """SovereignSpec starting from profiles 30 % off, after learning each GPU type from a plain
    pilot run of the same scenario in the same world (`sim.learning`), as the operator does."""

    name = "sovereignspec-learned"

    def _start(self, sim: SimView) -> ProfileSet:
        from sovereignspec.sim.learning import learned_profiles, off_profiles

        learned, self.in_force = learned_profiles(sim.scenario, sim.profiles, off_profiles(sim.profiles),
                                                  sim.world)  # fmt: skip
        return learned


POLICIES: dict[str, type[SimPolicy] | tuple[type[SimPolicy], int]] = {
    "never": Never,
    "always-2": (AlwaysK, 2),
    "always-4": (AlwaysK, 4),
    "vllm-table": VllmTable,
    "smartspec": SmartSpec,
    "trt-threshold": TrtThreshold,
    "sovereignspec-no-externality": SovereignSpecNoExternality,
    "sovereignspec": SovereignSpec,
    "oracle": Oracle,
}


# Starting from profiles 30 % off, without and with online calibration (`simulate --learning`).
LEARNING: dict[str, type[SimPolicy] | tuple[type[SimPolicy], int]] = {
    "sovereignspec-off30": SovereignSpecOff,
    "sovereignspec-learned": SovereignSpecLearned,
}


def make(name: str) -> SimPolicy:
    entry = POLICIES.get(name) or LEARNING[name]
    if isinstance(entry, tuple):
        cls, k = entry
        return cls(k)  # type: ignore[call-arg]
    return entry()
