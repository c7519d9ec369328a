"""The event loop and a GPU's batch physics: requests arrive (`arrivals`), queue at their
tenant's replicas (`routing`), are prefilled and decoded in continuous batches that every replica
on a GPU shares, and finish; speculation accepts drafted tokens by per-token Bernoulli trials, so
a step's accepted length is truncated-geometric. Placement goes through the policy, held to
`tenancy`'s sovereignty; the records it mutates are `state`'s.

Between two events a GPU's batch is constant, so its step time is too: the engine does not step
through every decode step. Each sequence knows, from its sampled draws, how many steps it needs
under its current γ; the GPU schedules one event at the earliest completion and, on any event,
advances every sequence by the whole steps that fit (the step in progress completes first).

Randomness comes from generators seeded by the scenario seed: per tenant for arrivals, lengths
and each request's α (so every policy serves the same requests), and one stream per run for the
per-token acceptance draws. Same scenario and seed, same result.
"""

from __future__ import annotations

import gc
import heapq
import math
from typing import TYPE_CHECKING

import numpy as np

from sovereignspec.core.roofline import tensor_parallel_for
from sovereignspec.core.scalar import tau as scalar_tau
from sovereignspec.core.sovereignty import NodeTenancy
from sovereignspec.core.specs import ProfileSet
from sovereignspec.sim import arrivals, tenancy
from sovereignspec.sim.routing import LeastBusy
from sovereignspec.sim.scenario import Scenario, Tenant
from sovereignspec.sim.state import Gpu, Replica, Request, Seq
from sovereignspec.sim.worlds import world_for

if TYPE_CHECKING:
    from sovereignspec.sim.policies import SimPolicy

GPU_EVENT, PLACE, SAMPLE = 1, 2, 3


class Simulator:
    def __init__(
        self,
        scenario: Scenario,
        profiles: ProfileSet,
        policy: SimPolicy,
        check: bool = False,
        world: str = "measured",
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
        self.world = world
        self._gammas_on_every_change = policy.dynamic and not policy.own_batch_only
        self.model = profiles.models[models.pop()]
        self.gpus: list[Gpu] = []
        for group in scenario.cluster:
            spec = profiles.gpus[group.gpu]
            tp = tensor_parallel_for(spec, self.model)
            if tp != 1:
                raise ValueError(
                    f"{self.model.name} needs TP={tp} on {group.gpu}; the simulator runs TP=1 models"
                )
            physics = world_for(world, spec, self.model)  # one per GPU type: it holds no state
            for n in range(group.nodes):
                node = f"{group.name}-{n}"
                for i in range(group.gpus_per_node):
                    g = Gpu(len(self.gpus), node, i, group.gpu, group.jurisdiction, physics)
                    g.watts = (spec.idle_watts, spec.max_watts)
                    self.gpus.append(g)
        self.replicas: list[Replica] = []
        self.routers: dict[int, LeastBusy] = {}  # per tenant: where its arrivals go
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
        # Set to a list to record, at each telemetry sample, every busy GPU's (type, time, batch,
        # mean context, decode step): what its engine's metrics would say (sim/learning.py).
        self.step_readings: list[tuple[str, float, float, float, float]] | None = None

    # -- setup -------------------------------------------------------------------------------

    def tenants(self) -> list[Tenant]:
        return list(self.scenario.tenants)

    def _push(self, t: float, kind: int, a: int, b: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, a, b))

    def _generate(self) -> None:
        """Every tenant's requests, and a placement event at each tenant's start."""
        # Arrivals are known up front: kept in time order beside the heap rather than in it, so
        # the heap holds only the few live GPU, placement and sampling events.
        self.requests, self._arrivals = arrivals.generate(self.scenario)
        for ti, t in enumerate(self.scenario.tenants):
            self._push(t.start_s, PLACE, ti)

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> Simulator:
        # Neither setting up nor the loop makes reference cycles (a collection after a run finds
        # nothing), so the cyclic collector would only rescan the millions of live requests.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._generate()
            period = self.scenario.telemetry.period_s
            for g in self.gpus:  # telemetry ran before the first workload: an idle reading
                g.samples.append((-self.scenario.telemetry.lag_s - period, 1.0))
            self._push(0.0, SAMPLE, 0)
            self._loop()
        finally:
            if collecting:
                gc.enable()
        return self

    def _loop(self) -> None:
        period = self.scenario.telemetry.period_s
        # The hot loop: names bound locally, an arrival handled in place.
        arrivals, events, gpus, routers = self._arrivals, self.events, self.gpus, self.routers
        settle, check, pop = self._settle, self.check, heapq.heappop
        nxt, total, processed = 0, len(arrivals), 0
        next_arrival = arrivals[0].arrival if total else math.inf
        while True:
            if events:
                head = events[0][0]
            elif nxt < total:
                head = math.inf
            else:
                break
            if next_arrival <= head:  # an arrival goes before any other event at the same instant
                req = arrivals[nxt]
                nxt += 1
                next_arrival = arrivals[nxt].arrival if nxt < total else math.inf
                self.now = t = req.arrival
                processed += 1
                router = routers.get(req.tenant)
                if router:  # else never placed: the request is not served (counted by metrics)
                    replica = router.take()
                    req.replica = replica.id
                    replica.queue.append(req)
                    g = gpus[replica.gpu]
                    g.waiting += 1
                    settle(g, t)
                if check:
                    self.assert_sovereignty()
                continue
            t, _, kind, a, b = pop(events)
            if t > self.drain_until:
                break
            self.now = t
            processed += 1
            if kind == GPU_EVENT:
                g = gpus[a]
                if b == g.version:
                    settle(g, t)
            elif kind == PLACE:
                self._place(a, t)
            elif kind == SAMPLE:
                readings = self.step_readings
                for g in gpus:
                    g.samples.append((t, self.true_headroom(g)))
                    if readings is not None and g.seqs and g.step > 0.0:
                        n = len(g.seqs)
                        readings.append((g.gpu_type, t, float(n), g.ctx_sum / n, g.step))
                if t + period <= self.scenario.duration_s:
                    self._push(t + period, SAMPLE, 0)
            if check:
                self.assert_sovereignty()
        self.processed = processed

    def _place(self, tenant: int, t: float) -> None:
        t_spec = self.scenario.tenants[tenant]
        placed = self.policy.place(
            self, tenant, t_spec.replicas - sum(r.tenant == tenant for r in self.replicas)
        )
        for index, (gpu_id, gamma, predicted) in enumerate(placed):
            drafter = self.profiles.drafters.get(t_spec.drafter) if t_spec.drafter else None
            g = self.gpus[gpu_id]
            draft = g.world.draft(drafter) if drafter else None
            declared = t_spec.declared_alpha if t_spec.declared_alpha is not None else t_spec.alpha.mean
            r = Replica(len(self.replicas), tenant, gpu_id, gamma, gamma, draft, alpha_est=declared)
            r.cap = t_spec.max_num_seqs
            r.predicted_tpot_s = predicted
            self.replicas.append(r)
            self.routers.setdefault(tenant, LeastBusy()).add(r)
            g.replicas.append(r.id)
            self.policy.adopt(self, r, index)
            if self.policy.dynamic and self.policy.own_batch_only:
                r.by_batch = [self.policy.gamma_at(self, g, r, n) for n in range(r.cap + 1)]
                r.armed = r.draft is not None and any(k > 0 for k in r.by_batch)
                g.regamma.add(r.id)  # its γ is decided at the GPU's next change, as for any policy
        missing = t_spec.replicas - sum(r.tenant == tenant for r in self.replicas)
        if missing and t + 30.0 < self.scenario.duration_s:
            self._push(t + 30.0, PLACE, tenant)  # retry, as Kueue requeues
        elif missing and not any(r.tenant == tenant for r in self.replicas):
            self.unplaced[tenant] = self.policy.last_reason.get(tenant, "no admissible GPU")

    # -- one GPU ---------------------------------------------------------------------------
    # Every change to a GPU's batch goes through `_settle`, so the step time and power it leaves
    # in `g.step` / `g.power` hold until the next one. This is the simulator's hot path (about
    # three calls per request). What a step costs is the world's (`sim.worlds`): measured data by
    # default, or the profiles' own model.

    def _settle(self, g: Gpu, t: float) -> None:
        """Advance `g` to `t` (finishing the step in progress), then admit, re-decide γ, reschedule."""
        step = g.step
        if step > 0 and g.seqs:
            k = math.ceil((t - g.t0) / step - 1e-9)
            if k > 0:  # whole steps completed: account energy, finish the sequences that ended
                g.busy_energy += g.power * k * step
                g.busy_time += k * step
                target = g.steps + k
                finishing = g.finishing
                if finishing and finishing[0][0] <= target:
                    seqs = g.seqs
                    while finishing and finishing[0][0] <= target:
                        at, rid, version = heapq.heappop(finishing)
                        seq = seqs.get(rid)
                        if seq is not None and seq.version == version:
                            self._finish(g, seq, g.t0 + (at - g.steps) * step)
                        else:  # superseded by a γ change
                            g.superseded -= 1
                g.steps = target
                g.t0 += k * step
        g.t0 = t if t > g.t0 else g.t0  # max(), without the call: this runs a few million times
        if g.waiting:
            self._admit(g)
        if g.regamma:  # flagged where batches changed (own_batch_only policies): read the tables
            replicas = self.replicas
            self._regamma(g, {rid: replicas[rid].by_batch[replicas[rid].active] for rid in g.regamma})
            g.regamma.clear()
        elif self._gammas_on_every_change:
            self._regamma(g, self.policy.gammas(self, g))
        self._schedule(g)

    def _finish(self, g: Gpu, s: Seq, when: float) -> None:
        req = s.req
        req.t_finish = when
        if s.draws is not None:
            req.drafts += s.steps_total
            req.first_accepted += int(np.count_nonzero(s.draws[: s.steps_total] > 1))
            req.speculated = True
        del g.seqs[req.id]
        g.n_tokens -= s.gamma + 1
        left = g.running[req.replica] - 1
        g.running[req.replica] = left
        replica = self.replicas[req.replica]
        replica.active -= 1
        if replica.by_batch and replica.by_batch[replica.active] != replica.current:
            g.regamma.add(req.replica)
        self.routers[replica.tenant].release(replica)
        g.ctx_sum -= req.prompt + req.output / 2
        if req.output > 1:
            tpot = (when - req.t_first) / (req.output - 1)
            m = replica.tpot_measured_s
            replica.tpot_measured_s = tpot if m is None else 0.9 * m + 0.1 * tpot
        if req.drafts:
            # What an engine's per-position counters give: the first drafted token's acceptance is α.
            replica.alpha_est = 0.9 * replica.alpha_est + 0.1 * req.first_accepted / req.drafts

    def _account(self, s: Seq, steps: int) -> None:
        if s.draws is not None and steps > 0:
            s.req.drafts += steps
            s.req.first_accepted += int(np.count_nonzero(s.draws[:steps] > 1))
            s.req.speculated = True

    def _admit(self, g: Gpu) -> None:
        admitted = []
        prompt = 0
        replicas = self.replicas
        for rid in g.replicas:
            r = replicas[rid]
            queue = r.queue
            if queue and r.active < r.cap:
                while queue and r.active < r.cap:
                    req = queue.popleft()
                    r.active += 1
                    g.waiting -= 1
                    prompt += req.prompt
                    admitted.append(req)
                if r.by_batch and r.by_batch[r.active] != r.current:
                    g.regamma.add(rid)
        if not admitted:
            return
        # A prefill step of the new prompts runs before the next decode step (no chunking).
        n_new = len(admitted)
        g.t0 += g.world.prefill(prompt, n_new)
        running, seqs, finishing, steps = g.running, g.seqs, g.finishing, g.steps
        for req in admitted:
            req.t_first = g.t0
            g.ctx_sum += req.prompt + req.output / 2
            seq = self._sample(req, replicas[req.replica].current, 0)
            # _start, for a sequence that is new on this GPU
            n = running.get(req.replica, 0)
            running[req.replica] = n + 1
            seq.start = steps
            seqs[req.id] = seq
            g.n_tokens += seq.gamma + 1
            heapq.heappush(finishing, (steps + seq.steps_total, req.id, 0))

    def _start(self, g: Gpu, seq: Seq) -> None:
        rid = seq.req.id
        old = g.seqs.get(rid)
        if old is not None:
            g.n_tokens -= old.gamma + 1
            seq.version = old.version + 1
            g.superseded += 1
        else:
            running = g.running.get(seq.req.replica, 0)
            g.running[seq.req.replica] = running + 1
        seq.start = g.steps
        g.seqs[rid] = seq
        g.n_tokens += seq.gamma + 1
        heapq.heappush(g.finishing, (seq.start + seq.steps_total, rid, seq.version))

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
        draws = _truncated_geometric(rng, a, gamma, size)
        cum = _running_sum(draws)
        steps = int(cum.searchsorted(remaining))  # the step that completes the request, from 0
        while steps == len(cum):  # rare: the first draws fell short
            more = _truncated_geometric(rng, a, gamma, size)
            draws = np.concatenate((draws, more))
            cum = np.concatenate((cum, cum[-1] + _running_sum(more)))
            steps = int(cum.searchsorted(remaining))
        return Seq(req, gamma, draws, cum, base, steps + 1)

    def _regamma(self, g: Gpu, wanted: dict[int, int]) -> None:
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
        finishing, seqs = g.finishing, g.seqs
        if g.superseded:  # drop superseded entries from the top, so it names the next finish
            while finishing and (
                (seq := seqs.get(finishing[0][1])) is None or seq.version != finishing[0][2]
            ):
                heapq.heappop(finishing)
                g.superseded -= 1
        if not seqs:
            g.step = 0.0
            return
        # step_time(g) and the power draw.
        s = len(seqs)
        ctx = g.ctx_sum / s
        n = g.n_tokens
        # The batch's steps run a noise draw off the expected step: one per GPU and batch change,
        # reproducible by the seed; policies (the oracle too) plan on the expected step.
        draw = (self.scenario.seed << 40) ^ (g.id << 32) ^ g.version
        g.step = step = self._step(g, n, s, ctx, None) * g.world.jitter(draw)
        idle, peak = g.watts
        busy = 1.0 - g.world.headroom(n, s, ctx, step)
        g.power = idle + (peak - idle) * busy
        self._seq += 1
        heapq.heappush(
            self.events, (g.t0 + (finishing[0][0] - g.steps) * step, self._seq, GPU_EVENT, g.id, g.version)
        )

    # -- the cost model on the live batch -----------------------------------------------------

    def _step(self, g: Gpu, n: float, s: int, ctx: float, gammas: dict[int, int] | None) -> float:
        """The verification step of `n` query tokens over `s` sequences, plus every drafting
        replica's drafting (replicas at `gammas`, default: as they run now)."""
        world = g.world
        verify = world.step(n, s, ctx)
        total, plain = verify, 0.0
        for rid, count in g.running.items():
            if not count:
                continue
            r = self.replicas[rid]
            gamma = r.current if gammas is None else gammas.get(rid, r.current)
            if r.draft is not None and (gamma > 0 or r.armed):
                if not plain and r.draft.needs_plain:
                    plain = world.step(s, s, ctx)
                total += r.draft.seconds(gamma, count, ctx, verify, plain, r.armed)
        return total

    def step_time(self, g: Gpu, gammas: dict[int, int] | None = None) -> float:
        """T_step of `g`'s batch, with replicas at `gammas` (default: as they run now)."""
        if not g.seqs:
            return 0.0
        s = len(g.seqs)
        n = g.n_tokens
        if gammas is not None:
            for rid, count in g.running.items():
                r = self.replicas[rid]
                n += count * (gammas.get(rid, r.current) - r.current)
        return self._step(g, n, s, g.ctx_sum / s, gammas)

    def true_headroom(self, g: Gpu) -> float:
        """What the GPU's telemetry reads now (the operator's conversion of it, in the profile world
        the model's own)."""
        if not g.seqs:
            return 1.0
        s = len(g.seqs)
        return g.world.headroom(float(g.n_tokens), float(s), g.ctx_sum / s, g.step)

    def reading(self, g: Gpu, t: float) -> float | None:
        """Headroom as a scheduler sees it at `t`: the latest sample at least `lag` old."""
        limit = t - self.scenario.telemetry.lag_s
        for when, value in reversed(g.samples):
            if when <= limit + 1e-9:
                return value
        return None

    # -- invariants ------------------------------------------------------------------------

    def tenancy(self, node: str) -> NodeTenancy:
        return tenancy.tenancy(self.scenario, self.gpus, self.replicas, node)

    def assert_sovereignty(self) -> None:
        tenancy.assert_sovereignty(self.scenario, self.gpus, self.replicas)

    def admissible(self, tenant: int) -> list[Gpu]:
        return tenancy.admissible(self.scenario, self.gpus, self.replicas, tenant)


_running_sum = np.add.accumulate  # = ndarray.cumsum, without its wrapper's cost (a call per request)


def _truncated_geometric(rng: np.random.Generator, a: float, gamma: int, size: int) -> np.ndarray:
    if a >= 1:
        return np.full(size, gamma + 1)
    draws = rng.geometric(1.0 - a, size)
    return np.minimum(draws, gamma + 1, out=draws)
