"""What a simulated GPU's step costs: the world the simulator runs, behind one small interface.

- `measured` (the default): `sim.truth`, built from measured data, not from the profiles the
  policies decide with. Policies are judged in a world they do not define.
- `profile`: the profiles' own model (`Coeffs`, the scalar twin of `Roofline.step_time`, and the
  drafters' relative costs). A policy judged here is judged under its own model; kept to show the
  difference the model's error makes, and for tests that need a world a policy predicts exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from sovereignspec.core.scalar import Coeffs
from sovereignspec.core.specs import DrafterSpec, GpuSpec, ModelSpec
from sovereignspec.core.speedup import speculation_terms
from sovereignspec.sim import truth

WORLDS = ("measured", "profile")

# Llama-3.2-1B (meta-llama/Llama-3.2-1B config.json), the shipped draft model, for the measured
# world's draft-model steps.
DRAFT_MODEL = ModelSpec("llama-3.2-1b", 1.24e9, 16, 2048, 8, 64, 2.0, 2.0, 1)


class Draft(Protocol):
    @property
    def needs_plain(self) -> bool: ...  # priced against the GPU's plain step (then computed)

    def seconds(
        self, gamma: int, seqs: float, ctx: float, verify_s: float, plain_s: float, armed: bool = False
    ) -> float: ...


class World(Protocol):
    def step(self, n_tokens: float, n_seqs: float, ctx: float) -> float: ...
    def jitter(self, draw: int) -> float: ...
    def prefill(self, tokens: float, n_new: int) -> float: ...
    def headroom(self, n_tokens: float, n_seqs: float, ctx: float, step_s: float) -> float: ...
    def draft(self, drafter: DrafterSpec) -> Draft: ...


@dataclass(frozen=True)
class _RelativeDraft:
    """The profile's drafting (core/speedup.py): a pass against the batch-1 step, the machinery
    against the GPU's plain step."""

    coeffs: Coeffs
    cost: float
    overhead: float
    needs_plain: bool = True

    def seconds(
        self, gamma: int, seqs: float, ctx: float, verify_s: float, plain_s: float, armed: bool = False
    ) -> float:
        drafting, machinery = speculation_terms(
            gamma, self.cost, self.overhead, self.coeffs.step(1.0, 1.0, ctx), plain_s, armed
        )
        return float(drafting + machinery)


@dataclass(frozen=True)
class ProfileWorld:
    coeffs: Coeffs
    model: str

    def step(self, n_tokens: float, n_seqs: float, ctx: float) -> float:
        return self.coeffs.step(n_tokens, n_seqs, ctx)

    def jitter(self, draw: int) -> float:
        return 1.0  # the model's own world runs exactly as the model says

    def prefill(self, tokens: float, n_new: int) -> float:
        return self.coeffs.step(tokens, n_new, tokens / n_new)

    def headroom(self, n_tokens: float, n_seqs: float, ctx: float, step_s: float) -> float:
        return self.coeffs.headroom(n_tokens, n_seqs, ctx)

    def draft(self, drafter: DrafterSpec) -> Draft:
        return _RelativeDraft(self.coeffs, drafter.cost_for(self.model), drafter.spec_overhead)


@dataclass(frozen=True)
class _MeasuredDraft:
    drafting: truth.Drafting
    needs_plain: bool = False

    def seconds(
        self, gamma: int, seqs: float, ctx: float, verify_s: float, plain_s: float, armed: bool = False
    ) -> float:
        return self.drafting.seconds(gamma, seqs, ctx, verify_s, armed)


@dataclass(frozen=True)
class MeasuredWorld:
    gpu: GpuSpec
    physics: truth.MeasuredGpu
    # The operator's reading of DCGM's tensor activity uses its profile's efficiency.
    profile_efficiency: float

    def step(self, n_tokens: float, n_seqs: float, ctx: float) -> float:
        return self.physics.step(n_tokens, n_seqs, ctx)

    def jitter(self, draw: int) -> float:
        return self.physics.jitter(draw)

    def prefill(self, tokens: float, n_new: int) -> float:
        return self.physics.prefill(tokens, n_new)

    def headroom(self, n_tokens: float, n_seqs: float, ctx: float, step_s: float) -> float:
        # headroom_from_tensor_activity, in floats: this runs once per batch change.
        used = self.physics.tensor_activity(n_tokens, ctx, step_s) / self.profile_efficiency
        return 1.0 - (used if used < 1.0 else 1.0)

    def draft(self, drafter: DrafterSpec) -> Draft:
        model = DRAFT_MODEL if drafter.kind == "draft-model" else None
        return _MeasuredDraft(truth.drafting_for(drafter, self.gpu, model))


def model_error(gpu: GpuSpec, model: ModelSpec) -> tuple[float, float, float]:
    """(RMS, largest, mean signed) relative error of the profile's step time against the measured
    world's, over plain and γ = 4 verification steps at batch 1-256 and context 256-4096."""
    roofline = ProfileWorld(Coeffs.of(gpu, model, 1), model.name)
    measured = truth.measured_gpu(gpu, model)
    errors = []
    for batch in (1, 4, 16, 64, 128, 256):
        for ctx in (256, 1024, 4096):
            for q in (1, 5):
                m = measured.step(batch * q, batch, ctx)
                errors.append(roofline.step(batch * q, batch, ctx) / m - 1.0)
    rms = math.sqrt(sum(e * e for e in errors) / len(errors))
    return rms, max(errors, key=abs), sum(errors) / len(errors)


def world_for(kind: str, gpu: GpuSpec, model: ModelSpec) -> World:
    if kind == "profile":
        return ProfileWorld(Coeffs.of(gpu, model, 1), model.name)
    if kind == "measured":
        return MeasuredWorld(gpu, truth.measured_gpu(gpu, model), gpu.compute_efficiency)
    raise ValueError(f"world: got {kind!r}; accepted: {', '.join(WORLDS)}")
