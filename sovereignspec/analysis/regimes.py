"""The regime analysis of the source: speed-up against headroom, per policy, with co-batched tenants.

For each GPU, target model, drafter, mix, acceptance rate α and headroom h, one GPU carries:

- `homogeneous`: one shared engine whose every sequence is like the row's workload (same drafter,
  same α); the engine speculates with one γ for all, as an engine configured with speculation does.
  Its neighbours are the other workloads of that engine (units of the row's batch), with the row's
  TPOT SLO.
- `mixed`: the row's workload plus the neighbours in `MIXED_NEIGHBOURS` (other drafters or none,
  other acceptance rates, tight TPOT SLOs), which share the background load.

The background load is what the headroom reading maps to (`Roofline.seqs_for_headroom`); the row's
own sequences come on top, so h = 0 is at or past the compute ridge. Every SLO is stated as slack
over the tenant's TPOT with everyone running plain, so it means the same on every GPU.

Policies: `never`; `always-K` (every workload with a drafter speculates with K); `sovereignspec`
(decides per workload from what a scheduler observes: α as declared, headroom as telemetry reports
it with `headroom_error`, judged one `headroom_uncertainty` worse, as the optimiser does);
`sovereignspec-no-externality` (the same without the neighbours' SLO check); `oracle` (true α and
load, every combination of γ, the same SLOs). A policy's outcome is always evaluated with the true values.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from sovereignspec.core.defaults import GAMMA_MAX, HEADROOM_UNCERTAINTY, SELF_BENEFIT_MARGIN
from sovereignspec.core.optimiser import quantize
from sovereignspec.core.roofline import Roofline, roofline_for
from sovereignspec.core.specs import DrafterSpec, ProfileSet
from sovereignspec.core.speedup import group_outcome

POLICIES = (
    "never",
    "always-2",
    "always-4",
    "always-8",
    "sovereignspec",
    "sovereignspec-no-externality",
    "oracle",
)
MIXES = ("homogeneous", "mixed")
DEFAULT_HEADROOMS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)
DEFAULT_ALPHAS = (0.6, 0.7, 0.8, 0.9)
SLO_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Neighbour:
    name: str
    drafter: str | None
    alpha: float
    share: float  # of the background load
    slack: float  # SLO = TPOT with everyone plain x (1 + slack)


MIXED_NEIGHBOURS = (
    Neighbour("chat-ngram", "ngram", 0.5, 0.4, 0.10),
    Neighbour("batch-plain", None, 0.0, 0.3, 0.10),
    Neighbour("agent-eagle", "eagle3", 0.7, 0.3, 0.25),
)


@dataclass(frozen=True)
class RegimeSettings:
    headrooms: tuple[float, ...] = DEFAULT_HEADROOMS
    alphas: tuple[float, ...] = DEFAULT_ALPHAS
    context: float = 256.0
    seqs: float = 8.0  # the row's workload's concurrent sequences
    row_slack: float = 0.5  # the row's own SLO slack (and its clones' in the homogeneous mix)
    gamma_max: int = GAMMA_MAX
    margin: float = SELF_BENEFIT_MARGIN
    headroom_error: float = 0.05  # telemetry reads this much more headroom than is true
    headroom_uncertainty: float = HEADROOM_UNCERTAINTY  # what sovereignspec assumes the error may be
    alpha_error: float = 0.0  # declared α minus true α
    neighbours: tuple[Neighbour, ...] = MIXED_NEIGHBOURS


@dataclass(frozen=True)
class RegimeRow:
    gpu: str
    model: str
    drafter: str
    mix: str
    alpha: float
    headroom: float
    policy: str
    gamma: int  # the row's workload's γ
    speedup: float
    aggregate_speedup: float
    slo_violations: int
    load_seqs: float  # sequences on the GPU, the row's included
    headroom_observed: float


@dataclass(frozen=True)
class _Group:
    """Workloads on one GPU; index 0 is the row's workload."""

    names: tuple[str, ...]
    seqs: NDArray[np.float64]
    alpha: NDArray[np.float64]
    cost: NDArray[np.float64]
    overhead: NDArray[np.float64]
    can_speculate: NDArray[np.bool_]
    slo_ratio: NDArray[np.float64]  # SLO / TPOT with everyone plain
    units: NDArray[np.float64]  # how many tenants each entry stands for (homogeneous clones)


def _drafter_terms(drafter: DrafterSpec | None, model: str) -> tuple[float, float, bool]:
    if drafter is None or not drafter.supports(model):
        return 0.0, 0.0, False
    return drafter.cost_for(model), drafter.spec_overhead, True


def _group(
    profiles: ProfileSet,
    model: str,
    drafter: DrafterSpec,
    mix: str,
    alpha: float,
    background: float,
    settings: RegimeSettings,
) -> _Group:
    cost, overhead, _ = _drafter_terms(drafter, model)
    if mix == "homogeneous":
        # One engine, one γ: the row and its clones are a single entry of the whole batch.
        clones = background / settings.seqs
        return _Group(
            names=("row",),
            seqs=np.array([background + settings.seqs]),
            alpha=np.array([alpha]),
            cost=np.array([cost]),
            overhead=np.array([overhead]),
            can_speculate=np.array([True]),
            slo_ratio=np.array([1.0 + settings.row_slack]),
            units=np.array([clones]),
        )
    entries = [("row", settings.seqs, alpha, cost, overhead, True, settings.row_slack)]
    for n in settings.neighbours:
        d = profiles.drafters.get(n.drafter) if n.drafter else None
        c, o, ok = _drafter_terms(d, model)
        entries.append((n.name, n.share * background, n.alpha, c, o, ok, n.slack))
    entries = [e for e in entries if e[0] == "row" or e[1] > 0]
    return _Group(
        names=tuple(e[0] for e in entries),
        seqs=np.array([e[1] for e in entries], dtype=np.float64),
        alpha=np.array([e[2] for e in entries], dtype=np.float64),
        cost=np.array([e[3] for e in entries], dtype=np.float64),
        overhead=np.array([e[4] for e in entries], dtype=np.float64),
        can_speculate=np.array([e[5] for e in entries], dtype=np.bool_),
        slo_ratio=np.array([1.0 + e[6] for e in entries], dtype=np.float64),
        units=np.ones(len(entries), dtype=np.float64),
    )


def _evaluate(
    roof: Roofline, group: _Group, configs: NDArray[np.float64], alpha: NDArray[np.float64], context: float
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
    """(speed-ups (C, W), aggregate (C,), SLO met per workload (C, W)) for configurations (C, W)."""
    speedups, aggregate, _ = group_outcome(
        roof, group.seqs, alpha, configs, group.cost, group.overhead, context
    )
    # TPOT / TPOT_plain = 1 / speed-up; the SLO holds while that stays within SLO / TPOT_plain.
    slo_met = 1.0 / speedups <= group.slo_ratio * (1.0 + SLO_TOLERANCE)
    return speedups, aggregate, slo_met


def _configs(group: _Group, gamma_max: int) -> NDArray[np.float64]:
    """Every γ vector (lexicographic, smaller γ first) over the workloads that can speculate."""
    choices = [range(gamma_max + 1) if ok else range(1) for ok in group.can_speculate]
    return np.array(list(itertools.product(*choices)), dtype=np.float64)


def _oracle(roof: Roofline, group: _Group, settings: RegimeSettings) -> NDArray[np.float64]:
    configs = _configs(group, settings.gamma_max)
    _, aggregate, slo_met = _evaluate(roof, group, configs, group.alpha, settings.context)
    score = np.where(slo_met.all(axis=1), quantize(aggregate), -np.inf)
    return np.asarray(configs[int(np.argmax(score))], dtype=np.float64)


def _sovereignspec(
    roof: Roofline, judged: _Group, settings: RegimeSettings, externality: bool
) -> NDArray[np.float64]:
    """Per-workload decisions, the most valuable first: from everyone plain, repeatedly apply the
    single change of one workload's γ that raises the GPU's aggregate token rate most, among
    changes that keep every speculating workload's S_real ≥ 1 + margin and, with `externality`,
    every tenant within its SLO; all judged as `optimiser` judges them, with declared α at the
    load one telemetry uncertainty worse than reported. Stops when no change helps."""
    n = len(judged.names)
    steps = settings.gamma_max + 1
    movable = [i for i in range(n) if judged.can_speculate[i]]
    gamma = np.zeros(n)
    threshold = 1.0 + settings.margin
    _, plain_aggregate, _ = _evaluate(roof, judged, gamma[None, :], judged.alpha, settings.context)
    current = float(quantize(plain_aggregate)[0])
    for _ in range(n * steps):
        configs = np.repeat(gamma[None, :], steps * len(movable), axis=0)
        for k, i in enumerate(movable):
            configs[k * steps : (k + 1) * steps, i] = np.arange(steps)
        speedups, aggregate, slo_met = _evaluate(roof, judged, configs, judged.alpha, settings.context)
        feasible = ((configs == 0) | (speedups >= threshold)).all(axis=1)
        if externality:
            feasible &= slo_met.all(axis=1) | (configs == 0).all(axis=1)
        ranked = np.where(feasible, quantize(aggregate), -np.inf)
        best = int(np.argmax(ranked))  # first maximum: lowest workload index, then smallest γ
        if ranked[best] <= current:
            break
        gamma, current = configs[best].copy(), float(ranked[best])
    return gamma


def _with_load(group: _Group, background: float, settings: RegimeSettings, mix: str) -> _Group:
    """The same tenants at another background load (the scheduler's view of it)."""
    if mix == "homogeneous":
        seqs = np.array([background + settings.seqs])
    else:
        shares = {n.name: n.share for n in settings.neighbours}
        seqs = np.array(
            [settings.seqs if name == "row" else shares[name] * background for name in group.names]
        )
    return replace(group, seqs=seqs)


def _policy_gammas(
    policy: str, roof: Roofline, group: _Group, judged: _Group, settings: RegimeSettings
) -> NDArray[np.float64]:
    if policy == "never":
        return np.zeros(len(group.names))
    if policy.startswith("always-"):
        k = float(policy.split("-", 1)[1])
        return np.where(group.can_speculate, k, 0.0)
    if policy == "oracle":
        return _oracle(roof, group, settings)
    return _sovereignspec(roof, judged, settings, externality=policy == "sovereignspec")


def analyse_point(
    profiles: ProfileSet,
    gpu: str,
    model: str,
    drafter: str,
    mix: str,
    alpha: float,
    headroom: float,
    settings: RegimeSettings,
    policies: Sequence[str] = POLICIES,
) -> list[RegimeRow]:
    roof = roofline_for(profiles.gpus[gpu], profiles.models[model])
    d = profiles.drafters[drafter]
    true_bg = float(roof.seqs_for_headroom(headroom, settings.context))
    h_obs = min(1.0, max(0.0, headroom + settings.headroom_error))
    judged_bg = float(
        roof.seqs_for_headroom(max(0.0, h_obs - settings.headroom_uncertainty), settings.context)
    )
    group = _group(profiles, model, d, mix, alpha, true_bg, settings)
    declared = np.clip(group.alpha + settings.alpha_error * (group.alpha > 0), 0.0, 1.0)
    judged = replace(_with_load(group, judged_bg, settings, mix), alpha=declared)
    rows = []
    for policy in policies:
        gammas = _policy_gammas(policy, roof, group, judged, settings)
        speedups, aggregate, slo_met = _evaluate(roof, group, gammas[None, :], group.alpha, settings.context)
        if mix == "homogeneous":
            violations = round(float(group.units[0])) if not slo_met[0, 0] else 0
        else:
            violations = int((~slo_met[0, 1:]).sum())
        rows.append(
            RegimeRow(
                gpu=gpu,
                model=model,
                drafter=drafter,
                mix=mix,
                alpha=alpha,
                headroom=headroom,
                policy=policy,
                gamma=int(gammas[0]),
                speedup=float(speedups[0, 0]),
                aggregate_speedup=float(aggregate[0]),
                slo_violations=violations,
                load_seqs=float(group.seqs.sum()),
                headroom_observed=h_obs,
            )
        )
    return rows


def combinations(profiles: ProfileSet) -> Iterator[tuple[str, str, str]]:
    """(gpu, model, drafter) for every drafter that drafts for the model, in name order."""
    for gpu in sorted(profiles.gpus):
        for model in sorted(profiles.models):
            for drafter in sorted(profiles.drafters):
                if profiles.drafters[drafter].supports(model):
                    yield gpu, model, drafter


def analyse(
    profiles: ProfileSet,
    settings: RegimeSettings | None = None,
    gpus: Sequence[str] | None = None,
    models: Sequence[str] | None = None,
    drafters: Sequence[str] | None = None,
    mixes: Sequence[str] = MIXES,
    policies: Sequence[str] = POLICIES,
) -> list[RegimeRow]:
    settings = settings or RegimeSettings()
    rows: list[RegimeRow] = []
    for gpu, model, drafter in combinations(profiles):
        if (
            (gpus and gpu not in gpus)
            or (models and model not in models)
            or (drafters and drafter not in drafters)
        ):
            continue
        for mix in mixes:
            for alpha in settings.alphas:
                for h in settings.headrooms:
                    rows.extend(
                        analyse_point(profiles, gpu, model, drafter, mix, alpha, h, settings, policies)
                    )
    return rows
