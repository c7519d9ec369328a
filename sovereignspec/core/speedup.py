"""Expected accepted tokens, realized speed-up and the cost of speculation in a shared step.

For a workload with acceptance rate α drafting γ tokens per step, the target verifies γ+1 query
tokens per sequence and accepts on average

    τ(α, γ) = (1 − α^(γ+1)) / (1 − α)        (γ + 1 at α = 1)

tokens per step (Leviathan et al., 2023). A GPU's step serves several workloads ("co-batched":
one engine serving several tenants, or engines sharing a card). For workloads i with b_i sequences
drafting γ_i tokens with a drafter of relative cost c_i and speculation overhead o_i:

    T_step(γ) = T(Σ b_i(γ_i+1), Σ b_i, L) + Σ_{γ_i>0} (γ_i·c_i·T(1, 1, L) + o_i·T(Σ b_i, Σ b_i, L))

The first term is the verification work every co-batched request waits for; the second is each
speculating workload's drafting and speculation machinery, steps of the shared loop that everyone
waits for. A drafted token costs c of the GPU's batch-1 step: a draft pass is a small head's
forward, whose time hardly grows with the batch (the SpecDecode-Bench fit's EAGLE-3 draft time: 2.1 ms at
batch 1, 2.2–3.0 ms at batch 64, while the plain step grows from 7 to 10–20 ms). The machinery's
bookkeeping is priced against the plain step of the GPU it runs on (the measured tax is relative:
6–22 % of a step). With everyone alike and at batch 1 this is the brief's
S_real = τ·T(n₀) / (T(n₀+Δ) + γ·c·T(n₀) + o_spec); at larger batches the brief's γ·c·T(n₀) would
price a draft pass like a full step of the batch, 2.6× the measured draft time at batch 64.

Workload i's speed-up is τ_i·T_plain / T_step, its time per output token T_step / τ_i, and the
GPU's aggregate speed-up is the token-weighted mean: (Σ b_i τ_i / Σ b_i) · T_plain / T_step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from sovereignspec.core.roofline import Roofline

Array = NDArray[np.float64]


NEAR_ONE = 1e-12  # |1 − α| below this: τ is its limit γ + 1 (the geometric sum divides by 1 − α)


def tau_geometric(alpha: Any, gamma: Any) -> Any:
    """τ(α, γ) = (1 − α^(γ+1)) / (1 − α) away from α = 1: the one formula, over floats (the scalar
    path, `scalar.tau`) or numpy arrays (`tau`) alike."""
    return (1.0 - alpha ** (gamma + 1.0)) / (1.0 - alpha)


def tau(alpha: ArrayLike, gamma: ArrayLike) -> Array:
    """Expected tokens per verification step, τ(α, γ); vectorised, exact at α = 1."""
    a = np.asarray(alpha, dtype=np.float64)
    g = np.asarray(gamma, dtype=np.float64)
    near_one = np.abs(1.0 - a) < NEAR_ONE
    with np.errstate(divide="ignore", invalid="ignore"):  # near 1 the geometric sum is discarded
        geometric = tau_geometric(a, g)
    return np.asarray(np.where(near_one, g + 1.0, geometric), dtype=np.float64)


def verify_tokens(background: Any, gamma: Any, seqs: Any) -> Any:
    """Query tokens of one verification step: n + (γ+1)·b, the background's n sequences (one token
    each) and γ drafts plus one for each of the workload's b. The one home of the count, over
    floats or numpy arrays alike (the optimiser, the scalar twin, the placer's bookkeeping)."""
    return background + (gamma + 1.0) * seqs


def speculation_terms(
    gamma: Any, draft_cost: Any, spec_overhead: Any, single: Any, plain: Any, armed: bool = False
) -> tuple[Any, Any]:
    """(drafting, machinery): what drafting `gamma` tokens adds to a step beyond verifying them.

    γ draft passes at c of the GPU's batch-1 step `single`, and the speculation machinery at o of
    its plain step `plain`, paid whenever γ > 0 (γ = 0 is plain decode: neither). The one home of
    speculation's price: the optimiser, the scalar twin, predict, calibration and the profile world
    all call it, over floats or numpy arrays alike.

    `armed`: the engine runs in speculative mode whatever γ, as it does on a row of a per-batch
    table that says K = 0. There γ = 0 still pays one draft pass and the machinery: the engine
    runs the drafter's first forward pass to keep its KV cache in sync and returns no drafts
    (the engine modules cite where), and the speculative step's machinery (rejection sampler,
    piecewise CUDA graphs) runs all the same; the 6-22 % tax the
    brief cites was measured at γ = 0. An engine whose adaptive mode takes 0 steps as an interval
    without speculation may skip that pass; that it does is not established for any engine here
    (engines/), so every K = 0 row is priced as paying it (the cautious reading)."""
    if armed:
        return np.maximum(gamma, 1.0) * (draft_cost * single), (gamma >= 0) * (spec_overhead * plain)
    return gamma * (draft_cost * single), (gamma > 0) * (spec_overhead * plain)


def speculative_step(
    verify: Any,
    single: Any,
    plain: Any,
    gamma: Any,
    draft_cost: Any,
    spec_overhead: Any,
    armed: bool = False,
) -> Any:
    """T_step = T(verify) + γ·c·T(1, 1, L) + o·T_plain·[γ > 0], from the verification step
    `verify` (T(n + (γ+1)·b, n + b, L) for a chain, more tokens for a tree), the batch-1 step and
    the plain step; `armed`: max(γ, 1) passes and the machinery at every γ (`speculation_terms`)."""
    drafting, machinery = speculation_terms(gamma, draft_cost, spec_overhead, single, plain, armed)
    return verify + drafting + machinery


def group_step_time(
    roof: Roofline,
    seqs: ArrayLike,
    gamma: ArrayLike,
    draft_cost: ArrayLike,
    spec_overhead: ArrayLike,
    context: ArrayLike,
) -> Array:
    """T_step for configurations `gamma` (shape (..., W)) of W co-batched workloads.

    `seqs`, `draft_cost` and `spec_overhead` have shape (W,); the result has shape (...).
    """
    b = np.asarray(seqs, dtype=np.float64)
    g = np.asarray(gamma, dtype=np.float64)
    n_tokens = (b * (g + 1.0)).sum(axis=-1)
    n_seqs = b.sum()
    verify = roof.step_time(n_tokens, n_seqs, context)
    plain = roof.step_time(n_seqs, n_seqs, context)
    single = roof.step_time(1.0, 1.0, context)
    drafting, machinery = speculation_terms(
        g, np.asarray(draft_cost), np.asarray(spec_overhead), single, plain[..., None]
    )
    return np.asarray(verify + drafting.sum(axis=-1) + machinery.sum(axis=-1), dtype=np.float64)


def group_outcome(
    roof: Roofline,
    seqs: ArrayLike,
    alpha: ArrayLike,
    gamma: ArrayLike,
    draft_cost: ArrayLike,
    spec_overhead: ArrayLike,
    context: ArrayLike,
) -> tuple[Array, Array, Array]:
    """(speed-up per workload, aggregate speed-up, T_step) for configurations `gamma` (..., W)."""
    b = np.asarray(seqs, dtype=np.float64)
    g = np.asarray(gamma, dtype=np.float64)
    taus = tau(alpha, g)
    plain = group_step_time(roof, b, np.zeros(b.shape), draft_cost, spec_overhead, context)
    step = group_step_time(roof, b, g, draft_cost, spec_overhead, context)
    ratio = plain / step
    speedups = taus * ratio[..., None]
    aggregate = (b * taus).sum(axis=-1) / b.sum() * ratio
    return speedups, np.asarray(aggregate, dtype=np.float64), step


def homogeneous_speedup(
    roof: Roofline,
    seqs: ArrayLike,
    alpha: ArrayLike,
    gamma: ArrayLike,
    draft_cost: ArrayLike,
    spec_overhead: ArrayLike,
    context: ArrayLike,
) -> Array:
    """S_real of a single shared engine where every one of `seqs` sequences drafts `gamma` tokens.

    τ·T(n₀) / (T(n₀ + γ·n₀) + γ·c·T(1) + o·T(n₀)): the brief's formula with a draft pass priced
    against the batch-1 step (module docstring). Broadcasts over all arguments.
    """
    s = np.asarray(seqs, dtype=np.float64)
    g = np.asarray(gamma, dtype=np.float64)
    plain = roof.step_time(s, s, context)
    single = roof.step_time(1.0, 1.0, context)
    verify = roof.step_time(verify_tokens(0.0, g, s), s, context)
    spec = speculative_step(verify, single, plain, g, np.asarray(draft_cost), np.asarray(spec_overhead))
    return np.asarray(tau(alpha, g) * plain / spec, dtype=np.float64)


def alpha_from_draft_acceptance(rate: float, gamma: float) -> float:
    """Per-token α from an engine's draft acceptance rate (accepted / drafted tokens) at draft
    length γ: under the chain model that rate is (τ(α, γ) − 1)/γ, increasing in α; inverted by
    bisection."""
    if gamma <= 0:
        return 0.0
    target = max(rate, 0.0) * gamma + 1.0  # above γ + 1 (a rate above 1) the bisection ends at 1
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if float(tau(mid, gamma)) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
