"""Every term of the model at one point: a shared engine of `batch` sequences, all drafting γ tokens."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from sovereignspec.core.defaults import GAMMA_MAX, SELF_BENEFIT_MARGIN
from sovereignspec.core.optimiser import GammaChoice, SpecRequest, choose, gamma_table
from sovereignspec.core.roofline import Roofline, roofline_for, tensor_parallel_for
from sovereignspec.core.specs import DrafterSpec, GpuSpec, ModelSpec
from sovereignspec.core.speedup import homogeneous_speedup, speculation_terms, tau


def _roofline(roof: Roofline, batch: int, context: int, n_plain: float, n_spec: float) -> dict[str, float]:
    """The roofline's own terms at this batch: bytes, FLOPs, memory and compute times, and each
    step term for the plain and the verify step."""
    terms = {
        f"{kind}_{name}_ms": 1e3 * value
        for kind, n in (("plain", n_plain), ("verify", n_spec))
        for name, value in roof.step_terms(n, float(batch), float(context)).items()
    }
    return {
        "weight_bytes_per_rank": float(roof.weight_bytes),
        "kv_bytes_per_rank": float(batch * context * roof.kv_bytes_per_token),
        "flops_per_token_per_rank": float(roof.flops_per_token(context)),
        "memory_time_ms": 1e3 * float(roof.memory_time(batch, context)),
        "compute_time_plain_ms": 1e3 * float(roof.compute_time(n_plain, context)),
        "compute_time_verify_ms": 1e3 * float(roof.compute_time(n_spec, context)),
        "fixed_overhead_ms": 1e3 * float(roof.fixed_s),
        **terms,
    }


def _ridge(gpu: GpuSpec, roof: Roofline, ends: list[Roofline], context: int) -> dict[str, float]:
    """The compute efficiency's calibrated interval and the ridge (in sequences) at each end."""
    return {
        "compute_efficiency": gpu.compute_efficiency,
        "compute_efficiency_low": gpu.compute_range[0],
        "compute_efficiency_high": gpu.compute_range[1],
        "ridge_seqs": float(roof.seqs_for_headroom(0.0, context)),
        "ridge_seqs_low": float(ends[0].seqs_for_headroom(0.0, context)),
        "ridge_seqs_high": float(ends[1].seqs_for_headroom(0.0, context)),
    }


def _star(
    roof: Roofline,
    drafter: DrafterSpec,
    model: ModelSpec,
    batch: int,
    context: int,
    alpha: float,
    c: float,
    o: float,
    gamma_max: int,
    margin: float,
) -> GammaChoice:
    """γ* for this engine alone: no neighbours outside it, no telemetry error."""
    req = SpecRequest(
        alpha, float(batch), float(context), c, o, gamma_max if drafter.supports(model.name) else 0, margin
    )
    return choose(gamma_table(roof, req, np.zeros(1), np.full(1, np.inf)))


def predict(
    gpu: GpuSpec,
    model: ModelSpec,
    drafter: DrafterSpec,
    batch: int,
    context: int,
    alpha: float,
    gamma: int,
    gamma_max: int = GAMMA_MAX,
    margin: float = SELF_BENEFIT_MARGIN,
) -> dict[str, Any]:
    tp = tensor_parallel_for(gpu, model)
    roof = roofline_for(gpu, model, tp)
    c, o = drafter.cost_for(model.name), drafter.spec_overhead
    n_plain, n_spec = float(batch), float(batch * (gamma + 1))
    plain = float(roof.step_time(n_plain, batch, context))
    verify = float(roof.step_time(n_spec, batch, context))
    # A draft pass is priced against the batch-1 step (core/speedup.py), the machinery against this one.
    draft, overhead = (
        float(x) for x in speculation_terms(gamma, c, o, float(roof.step_time(1.0, 1.0, context)), plain)
    )
    spec = verify + draft + overhead
    t = float(tau(alpha, gamma))
    speedup = float(homogeneous_speedup(roof, batch, alpha, gamma, c, o, context))
    star = _star(roof, drafter, model, batch, context, alpha, c, o, gamma_max, margin)
    # The calibration's interval of compute efficiency, carried to the ridge and the speed-up.
    ends = [roofline_for(replace(gpu, compute_efficiency=ce), model, tp) for ce in gpu.compute_range]
    return {
        "gpu": gpu.name,
        "model": model.name,
        "drafter": drafter.name,
        "drafter_kind": drafter.kind,
        "drafter_supports_model": drafter.supports(model.name),
        "tensor_parallel": tp,
        "batch": batch,
        "context": context,
        "alpha": alpha,
        "gamma": gamma,
        "tau": t,
        **_roofline(roof, batch, context, n_plain, n_spec),
        "step_plain_ms": 1e3 * plain,
        "step_verify_ms": 1e3 * verify,
        "draft_ms": 1e3 * draft,
        "spec_overhead_ms": 1e3 * overhead,
        "step_spec_ms": 1e3 * spec,
        "headroom": float(roof.headroom(n_plain, batch, context)),
        "headroom_with_drafts": float(roof.headroom(n_spec, batch, context)),
        **_ridge(gpu, roof, ends, context),
        "tpot_plain_ms": 1e3 * plain,
        "tpot_spec_ms": 1e3 * spec / t,
        "tokens_per_s_plain": batch / plain,
        "tokens_per_s_spec": batch * t / spec,
        "speedup": speedup,
        "speedup_low_compute": float(homogeneous_speedup(ends[0], batch, alpha, gamma, c, o, context)),
        "speedup_high_compute": float(homogeneous_speedup(ends[1], batch, alpha, gamma, c, o, context)),
        "gamma_star": int(star.gamma[0]),
        "speedup_at_gamma_star": float(star.speedup[0]),
    }
