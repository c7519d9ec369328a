"""The event loop: requests arrive, queue at their tenant's replicas, are prefilled and decoded in
continuous batches that every replica on a GPU shares, and finish; speculation accepts drafted
tokens by per-token Bernoulli trials, so a step's accepted length is truncated-geometric.

Between two events a GPU's batch is constant, so its step time is too: the engine does not step
through every decode step. Each sequence knows, from its sampled draws, how many steps it needs
under its current γ; the GPU schedules one event at the earliest completion and, on any event,
advances every sequence by the whole steps that fit (the step in progress completes first).

Randomness comes from generators seeded by the scenario seed: per tenant for arrivals, lengths
and each request's α (so every policy serves the same requests), and one stream per run for the
per-token acceptance draws. Same scenario and seed, same result.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np

from sovereignspec.core.roofline import tensor_parallel_for
from sovereignspec.core.scalar import Coeffs
from sovereignspec.core.scalar import tau as scalar_tau
from sovereignspec.core.sovereignty import DEFAULT_JURISDICTION_LABEL, NodeTenancy, Requirement, check_node
from sovereignspec.core.specs import ProfileSet
from sovereignspec.sim.scenario import Scenario, Tenant

if TYPE_CHECKING:
    from sovereignspec.sim.policies import SimPolicy

GPU_EVENT, PLACE, SAMPLE = 1, 2, 3


@dataclass(slots=True)
class Request:
    id: int
    tenant: int
    arrival: float
    prompt: int
    output: int
    alpha: float
    replica: int = -1
    t_first: float = math.nan
    t_finish: float = math.nan
    speculated: bool = False  # its own replica drafted while it decoded
    drafts: int = 0  # verification steps with drafts
    first_accepted: int = 0  # of those, steps whose first drafted token was accepted


@dataclass(slots=True)
class Seq:
    req: Request
    gamma: int
    draws: np.ndarray | None  # tokens emitted by each step under `gamma` (None: plain, one per step)
    cum: np.ndarray | None  # cumulative tokens after each step
    base: int  # tokens emitted before the current draws
    steps_total: int  # steps these draws need to finish the request
    start: int = 0  # the GPU's step counter when these draws began
    version: int = 0


@dataclass(slots=True)
class Replica:
    id: int
    tenant: int
    gpu: int
    gamma: int  # assigned at placement
    current: int  # in effect now
    cost: float
    overhead: float
    queue: deque[Request] = field(default_factory=deque)
    active: int = 0
    busy: int = 0  # active + queued: what arrivals are routed by
    alpha_est: float = 0.6
    switched_off: bool = False  # for acceptance-threshold policies
    predicted_tpot_s: float | None = None  # what the placing policy predicted (until TPOT is measured)


@dataclass(slots=True)
class Gpu:
    id: int
    node: str
    index: int
    gpu_type: str
    jurisdiction: str | None
    coeffs: Coeffs
    replicas: list[int] = field(default_factory=list)
    seqs: dict[int, Seq] = field(default_factory=dict)  # by request id
    finishing: list[tuple[int, int, int]] = field(default_factory=list)  # heap of (step, request, version)
    steps: int = 0  # decode steps run so far
    t0: float = 0.0  # start of the next step
    step: float = 0.0
    version: int = 0
    ctx_sum: float = 0.0
    n_tokens: int = 0  # query tokens per decode step: Σ (γ + 1) over running sequences
    running: dict[int, int] = field(default_factory=dict)  # replica -> running sequences
    waiting: int = 0  # requests queued at this GPU's replicas
    busy_energy: float = 0.0  # joules while decoding
    busy_time: float = 0.0
    samples: list[tuple[float, float]] = field(default_factory=list)  # (time, headroom)


class Simulator:
    def __init__(
        self, scenario: Scenario, profiles: ProfileSet, policy: SimPolicy, check: bool = False
    ) -> None:
        models = {t.model for t in scenario.tenants}
        if len(models) != 1:
            raise ValueError(
                f"the simulator co-batches one target model per cluster; scenario uses {sorted(models)}"
            )
        self.scenario = scenario
        self.profiles = profiles
        self.policy = policy
        self.check = check  # verify sovereignty after every event (tests)
        self.model = profiles.models[models.pop()]
        self.gpus: list[Gpu] = []
        for group in scenario.cluster:
            spec = profiles.gpus[group.gpu]
            tp = tensor_parallel_for(spec, self.model)
            if tp != 1:
                raise ValueError(
                    f"{self.model.name} needs TP={tp} on {group.gpu}; the simulator runs TP=1 models"
                )
            for n in range(group.nodes):
                node = f"{group.name}-{n}"
                for i in range(group.gpus_per_node):
                    coeffs = Coeffs.of(spec, self.model, 1)
                    self.gpus.append(Gpu(len(self.gpus), node, i, group.gpu, group.jurisdiction, coeffs))
        self.replicas: list[Replica] = []
        self.by_tenant: dict[int, list[Replica]] = {}
        self._watts = {name: (g.idle_watts, g.max_watts) for name, g in profiles.gpus.items()}
        self.requests: list[Request] = []
        self.unplaced: dict[int, str] = {}  # tenant -> why its replicas could not be placed
        self.events: list[tuple[float, int, int, int, int]] = []
        self._arrivals: list[Request] = []  # every request, in arrival order
        self._seq = 0
        self.now = 0.0
        self.processed = 0
        self.drain_until = 3 * scenario.duration_s
        # Acceptance draws come from one stream per run; arrivals, lengths and each request's α
        # come from per-tenant streams, so every policy serves exactly the same requests.
        self.acceptance_rng = np.random.default_rng([scenario.seed, 1_000_003])

    # -- setup -------------------------------------------------------------------------------

    def tenants(self) -> list[Tenant]:
        return list(self.scenario.tenants)

    def _push(self, t: float, kind: int, a: int, b: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, a, b))

    def _generate(self) -> None:
        """Every tenant's arrivals, lengths and per-request acceptance, from the scenario seed."""
        rid = 0
        for ti, t in enumerate(self.scenario.tenants):
            rng = np.random.default_rng([self.scenario.seed, ti])
            times: list[float] = []
            clock = t.start_s
            a = t.arrival
            while True:
                rate = a.rate_per_s
                if a.kind == "bursty":
                    cycle = a.on_s + a.off_s
                    # Same mean rate: bursts at factor×, the rest of the cycle at what remains.
                    high = min(a.burst_factor * rate, rate * cycle / a.on_s)
                    low = max(rate * cycle - high * a.on_s, 0.0) / a.off_s
                    rate = high if (clock % cycle) < a.on_s else low
                    if rate <= 0:
                        clock = (clock // cycle + 1) * cycle
                        continue
                clock += rng.exponential(1.0 / rate)
                if clock >= self.scenario.duration_s:
                    break
                times.append(clock)
            n = len(times)
            prompts = _lengths(rng, t.prompt_tokens.mean, t.prompt_tokens.sd, n)
            outputs = np.maximum(_lengths(rng, t.output_tokens.mean, t.output_tokens.sd, n), 2)
            alphas = (
                np.clip(rng.normal(t.alpha.mean, t.alpha.sd, n), 0.0, 0.999)
                if t.alpha.sd
                else np.full(n, t.alpha.mean)
            )
            for j in range(n):
                req = Request(rid, ti, times[j], int(prompts[j]), int(outputs[j]), float(alphas[j]))
                self.requests.append(req)
                rid += 1
            self._push(t.start_s, PLACE, ti)
        # Arrivals are known up front: kept in time order beside the heap rather than in it, so
        # the heap holds only the few live GPU, placement and sampling events. Ties: by request id.
        self._arrivals = sorted(self.requests, key=lambda r: (r.arrival, r.id))

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> Simulator:
        self._generate()
        period = self.scenario.telemetry.period_s
        for g in self.gpus:  # telemetry ran before the first workload: an idle reading
            g.samples.append((-self.scenario.telemetry.lag_s - period, 1.0))
        self._push(0.0, SAMPLE, 0)
        arrivals, events = self._arrivals, self.events
        nxt, total = 0, len(arrivals)
        while events or nxt < total:
            if nxt < total and (not events or arrivals[nxt].arrival <= events[0][0]):
                # An arrival goes before any other event at the same instant.
                req = arrivals[nxt]
                nxt += 1
                self.now = req.arrival
                self.processed += 1
                self._arrive(req)
                if self.check:
                    self.assert_sovereignty()
                continue
            t, _, kind, a, b = heapq.heappop(events)
            if t > self.drain_until:
                break
            self.now = t
            self.processed += 1
            if kind == GPU_EVENT:
                if b == self.gpus[a].version:
                    self._settle(self.gpus[a], t)
            elif kind == PLACE:
                self._place(a, t)
            elif kind == SAMPLE:
                for g in self.gpus:
                    g.samples.append((t, self.true_headroom(g)))
                if t + period <= self.scenario.duration_s:
                    self._push(t + period, SAMPLE, 0)
            if self.check:
                self.assert_sovereignty()
        return self

    def _arrive(self, req: Request) -> None:
        candidates = self.by_tenant.get(req.tenant)
        if not candidates:
            return  # never placed: the request is not served (counted by metrics)
        replica = min(candidates, key=_BUSY)  # the least busy replica; ties to the first placed
        req.replica = replica.id
        replica.busy += 1
        replica.queue.append(req)
        self.gpus[replica.gpu].waiting += 1
        self._settle(self.gpus[replica.gpu], self.now)

    def _place(self, tenant: int, t: float) -> None:
        t_spec = self.scenario.tenants[tenant]
        placed = self.policy.place(
            self, tenant, t_spec.replicas - sum(r.tenant == tenant for r in self.replicas)
        )
        for gpu_id, gamma, predicted in placed:
            drafter = self.profiles.drafters.get(t_spec.drafter) if t_spec.drafter else None
            cost = drafter.cost_for(self.model.name) if drafter else 0.0
            overhead = drafter.spec_overhead if drafter else 0.0
            declared = t_spec.declared_alpha if t_spec.declared_alpha is not None else t_spec.alpha.mean
            r = Replica(len(self.replicas), tenant, gpu_id, gamma, gamma, cost, overhead, alpha_est=declared)
            r.predicted_tpot_s = predicted
            self.replicas.append(r)
            self.by_tenant.setdefault(tenant, []).append(r)
            self.gpus[gpu_id].replicas.append(r.id)
        missing = t_spec.replicas - sum(r.tenant == tenant for r in self.replicas)
        if missing and t + 30.0 < self.scenario.duration_s:
            self._push(t + 30.0, PLACE, tenant)  # retry, as Kueue requeues
        elif missing and not any(r.tenant == tenant for r in self.replicas):
            self.unplaced[tenant] = self.policy.last_reason.get(tenant, "no admissible GPU")

    # -- one GPU ---------------------------------------------------------------------------

    def _settle(self, g: Gpu, t: float) -> None:
        """Advance `g` to `t` (finishing the step in progress), then admit, re-decide γ, reschedule."""
        if g.seqs and g.step > 0:
            k = max(0, math.ceil((t - g.t0) / g.step - 1e-9))
            if k:
                self._advance(g, k)
        g.t0 = max(g.t0, t)
        self._admit(g)
        self._regamma(g)
        self._schedule(g)

    def _advance(self, g: Gpu, k: int) -> None:
        g.busy_energy += self._power(g) * k * g.step
        g.busy_time += k * g.step
        target = g.steps + k
        while g.finishing and g.finishing[0][0] <= target:
            at, rid, version = heapq.heappop(g.finishing)
            seq = g.seqs.get(rid)
            if seq is None or seq.version != version:
                continue  # superseded by a γ change
            self._finish(g, seq, g.t0 + (at - g.steps) * g.step)
        g.steps = target
        g.t0 += k * g.step

    def _finish(self, g: Gpu, s: Seq, when: float) -> None:
        req = s.req
        req.t_finish = when
        self._account(s, s.steps_total)
        del g.seqs[req.id]
        g.n_tokens -= s.gamma + 1
        g.running[req.replica] -= 1
        replica = self.replicas[req.replica]
        replica.active -= 1
        replica.busy -= 1
        g.ctx_sum -= req.prompt + req.output / 2
        if req.drafts:
            # What vLLM's per-position counters give: the first drafted token's acceptance is α.
            replica.alpha_est = 0.9 * replica.alpha_est + 0.1 * req.first_accepted / req.drafts

    def _account(self, s: Seq, steps: int) -> None:
        if s.draws is not None and steps > 0:
            s.req.drafts += steps
            s.req.first_accepted += int(np.count_nonzero(s.draws[:steps] > 1))
            s.req.speculated = True

    def _admit(self, g: Gpu) -> None:
        if not g.waiting:
            return
        admitted = []
        for rid in g.replicas:
            r = self.replicas[rid]
            cap = self.scenario.tenants[r.tenant].max_num_seqs
            while r.queue and r.active < cap:
                req = r.queue.popleft()
                r.active += 1
                g.waiting -= 1
                admitted.append(req)
        if not admitted:
            return
        # A prefill step of the new prompts runs before the next decode step (no chunking).
        c = g.coeffs
        prompt = sum(q.prompt for q in admitted)
        ctx = prompt / len(admitted)
        g.t0 += max(c.memory(len(admitted), ctx), prompt * c.spt(ctx)) + c.fixed
        for req in admitted:
            req.t_first = g.t0
            g.ctx_sum += req.prompt + req.output / 2
            self._start(g, self._sample(req, self.replicas[req.replica].current, 0))

    def _start(self, g: Gpu, seq: Seq) -> None:
        old = g.seqs.get(seq.req.id)
        if old is not None:
            g.n_tokens -= old.gamma + 1
            seq.version = old.version + 1
        else:
            g.running[seq.req.replica] = g.running.get(seq.req.replica, 0) + 1
        seq.start = g.steps
        g.seqs[seq.req.id] = seq
        g.n_tokens += seq.gamma + 1
        heapq.heappush(g.finishing, (seq.start + seq.steps_total, seq.req.id, seq.version))

    def _sample(self, req: Request, gamma: int, base: int) -> Seq:
        """Draws for the rest of `req` under `gamma`: tokens per step = 1 + accepted drafts."""
        remaining = req.output - base
        if gamma == 0:  # one token per step: nothing to draw
            return Seq(req, 0, None, None, base, remaining)
        rng = self.acceptance_rng
        a = req.alpha
        size = int(remaining / scalar_tau(a, gamma)) + 8
        # Tokens per step = 1 + drafts accepted before the first rejection, capped at γ: a geometric
        # number of trials truncated at γ + 1.
        draws = np.minimum(rng.geometric(1.0 - a, size), gamma + 1) if a < 1 else np.full(size, gamma + 1)
        cum = np.cumsum(draws)
        while cum[-1] < remaining:  # rare: the first draws fell short
            more = np.minimum(rng.geometric(1.0 - a, size), gamma + 1) if a < 1 else np.full(size, gamma + 1)
            draws = np.concatenate((draws, more))
            cum = np.concatenate((cum, cum[-1] + np.cumsum(more)))
        return Seq(req, gamma, draws, cum, base, int(np.searchsorted(cum, remaining)) + 1)

    def _regamma(self, g: Gpu) -> None:
        if not self.policy.dynamic:
            return
        wanted = self.policy.gammas(self, g)
        changed = set()
        for rid, gamma in wanted.items():
            r = self.replicas[rid]
            if gamma != r.current:
                r.current = gamma
                changed.add(rid)
        if not changed:
            return
        for s in [s for s in g.seqs.values() if s.req.replica in changed]:
            done = g.steps - s.start
            self._account(s, done)
            base = s.base + (done if s.cum is None else int(s.cum[done - 1]) if done else 0)
            self._start(g, self._sample(s.req, self.replicas[s.req.replica].current, base))

    def _schedule(self, g: Gpu) -> None:
        g.version += 1
        while g.finishing and (
            (seq := g.seqs.get(g.finishing[0][1])) is None or seq.version != g.finishing[0][2]
        ):
            heapq.heappop(g.finishing)
        if not g.seqs:
            g.step = 0.0
            return
        g.step = self.step_time(g)
        self._push(g.t0 + (g.finishing[0][0] - g.steps) * g.step, GPU_EVENT, g.id, g.version)

    # -- the cost model on the live batch -----------------------------------------------------

    def step_time(self, g: Gpu, gammas: dict[int, int] | None = None) -> float:
        """T_step of `g`'s batch, with replicas at `gammas` (default: as they run now)."""
        if not g.seqs:
            return 0.0
        c = g.coeffs
        s = len(g.seqs)
        ctx = g.ctx_sum / s
        spt = c.spt(ctx)
        mem = c.memory(s, ctx) + c.fixed
        n = g.n_tokens
        drafting = 0.0
        for rid, count in g.running.items():
            if not count:
                continue
            r = self.replicas[rid]
            gamma = r.current if gammas is None else gammas.get(rid, r.current)
            if gammas is not None:
                n += count * (gamma - r.current)
            if gamma > 0:
                drafting += gamma * r.cost + r.overhead
        plain = max(mem, s * spt + c.fixed)
        return max(mem, n * spt + c.fixed) + drafting * plain

    def true_headroom(self, g: Gpu) -> float:
        if not g.seqs:
            return 1.0
        s = len(g.seqs)
        return g.coeffs.headroom(float(g.n_tokens), float(s), g.ctx_sum / s)

    def reading(self, g: Gpu, t: float) -> float | None:
        """Headroom as a scheduler sees it at `t`: the latest sample at least `lag` old."""
        limit = t - self.scenario.telemetry.lag_s
        for when, value in reversed(g.samples):
            if when <= limit + 1e-9:
                return value
        return None

    def _power(self, g: Gpu) -> float:
        idle, peak = self._watts[g.gpu_type]
        s = len(g.seqs)
        util = min(1.0, g.n_tokens * g.coeffs.spt(g.ctx_sum / s) / g.step) if g.step else 0.0
        return idle + (peak - idle) * util

    # -- invariants ------------------------------------------------------------------------

    def tenancy(self, node: str) -> NodeTenancy:
        labels = {}
        jur = next(g.jurisdiction for g in self.gpus if g.node == node)
        if jur:
            labels[DEFAULT_JURISDICTION_LABEL] = jur
        tenants, exclusive = set(), set()
        for r in self.replicas:
            if self.gpus[r.gpu].node == node:
                t = self.scenario.tenants[r.tenant]
                tenants.add(t.name)
                if t.exclusive:
                    exclusive.add(t.name)
        return NodeTenancy(node, labels, frozenset(tenants), frozenset(exclusive))

    def assert_sovereignty(self) -> None:
        """No replica outside its jurisdiction; no exclusive tenant sharing a node, either way."""
        # One pass over the replicas (this runs after every event in tests).
        on_node: dict[str, set[int]] = {}
        for r in self.replicas:
            on_node.setdefault(self.gpus[r.gpu].node, set()).add(r.tenant)
        tenants = self.scenario.tenants
        for r in self.replicas:
            t = tenants[r.tenant]
            g = self.gpus[r.gpu]
            if t.jurisdiction is not None and g.jurisdiction != t.jurisdiction:
                raise AssertionError(f"{t.name} placed in {g.jurisdiction}, requires {t.jurisdiction}")
            others = sorted(tenants[i].name for i in on_node[g.node] - {r.tenant})
            if t.exclusive and others:
                raise AssertionError(f"exclusive {t.name} shares {g.node} with {others}")
            holders = sorted(tenants[i].name for i in on_node[g.node] - {r.tenant} if tenants[i].exclusive)
            if holders:
                raise AssertionError(f"{t.name} on {g.node}, held exclusively by {holders}")

    def admissible(self, tenant: int) -> list[Gpu]:
        """GPUs a new replica of `tenant` may use now: sovereignty, then a free engine slot."""
        t = self.scenario.tenants[tenant]
        req = Requirement(t.name, t.jurisdiction, t.exclusive)
        ok_nodes = {n for n in {g.node for g in self.gpus} if check_node(req, self.tenancy(n)) is None}
        cap = self.scenario.replicas_per_gpu
        return [g for g in self.gpus if g.node in ok_nodes and len(g.replicas) < cap]


_BUSY = attrgetter("busy")


def _lengths(rng: np.random.Generator, mean: float, sd: float, n: int) -> np.ndarray:
    if sd <= 0:
        return np.full(n, max(1, round(mean)), dtype=np.int64)
    sigma2 = math.log(1.0 + (sd / mean) ** 2)
    mu = math.log(mean) - sigma2 / 2
    return np.maximum(np.round(rng.lognormal(mu, math.sqrt(sigma2), n)), 1).astype(np.int64)
