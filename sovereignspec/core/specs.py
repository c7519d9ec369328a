"""Hardware, model and drafter descriptions as the cost model sees them: SI units, no file formats.

The YAML profiles under `profiles/` are validated at the border (`sovereignspec.profiles`) and
converted into these frozen dataclasses; the core never sees a file or a unit suffix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DRAFTER_KINDS = ("eagle", "draft-model", "ngram", "medusa", "mtp")


@dataclass(frozen=True)
class GpuSpec:
    """One GPU type. Peak and bandwidth are datasheet figures; efficiencies turn them into practice."""

    name: str
    peak_flops: float  # dense bf16 FLOP/s
    mem_bandwidth: float  # bytes/s
    mem_bytes: float
    idle_watts: float
    max_watts: float
    compute_efficiency: float  # fraction of peak that decode GEMMs reach
    bandwidth_efficiency: float  # fraction of datasheet bandwidth that weight/KV streaming reaches
    step_overhead_s: float  # fixed cost of one engine step (launches, sampling, scheduling)
    allreduce_s: float  # latency of one small all-reduce between tensor-parallel ranks
    # One pipeline stage handing a step's activations to the next across nodes (an estimate, not
    # in the calibration data: a network hop plus a batch's hidden states at 400 Gb/s).
    pipeline_hop_s: float = 30e-6
    serial_fraction: float = 0.0  # κ: share of per-token compute that does not overlap weight streaming
    overlap: float = float("inf")  # p of the smooth maximum between streaming and compute
    # The calibration's 95 % interval of compute_efficiency (None: the point, nothing measured
    # around it); decisions near the ridge take its low end (`placement`).
    compute_efficiency_low: float | None = None
    compute_efficiency_high: float | None = None

    @property
    def compute_range(self) -> tuple[float, float]:
        """(low, high) compute efficiency: the calibration's interval, or the point."""
        point = self.compute_efficiency
        low, high = self.compute_efficiency_low, self.compute_efficiency_high
        return (point if low is None else low, point if high is None else high)

    @property
    def effective_flops(self) -> float:
        return self.peak_flops * self.compute_efficiency

    @property
    def effective_bandwidth(self) -> float:
        return self.mem_bandwidth * self.bandwidth_efficiency


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder-only target model and the tensor parallelism it usually runs at."""

    name: str
    params: float
    layers: int
    hidden: int  # query heads x head_dim
    kv_heads: int
    head_dim: int
    bytes_per_param: float
    kv_bytes_per_elem: float
    tensor_parallel: int
    # Split over this many pipeline stages, this spec being the largest (`roofline.pipeline_stage`).
    pipeline_stages: int = 1

    @property
    def kv_bytes_per_token(self) -> float:
        """KV cache bytes one token of context occupies, across all ranks."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_elem

    def flops_per_token(self, context: float) -> float:
        """FLOPs of one query token: weight GEMMs (2 per parameter) plus attention over `context`."""
        return 2.0 * self.params + 4.0 * self.layers * context * self.hidden


@dataclass(frozen=True)
class EngineNames:
    """How serving engines name this drafting method (engine name -> its name for the method), and
    the draft checkpoint per target model."""

    methods: dict[str, str] = field(default_factory=dict)
    draft_models: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DrafterSpec:
    """A drafting method. `relative_cost` is one drafted token's cost as a fraction of the GPU's batch-1
    step (a draft pass is small-batch work); `spec_overhead` is per step, of the plain step."""

    name: str
    kind: str
    relative_cost: float
    spec_overhead: float  # the speculation machinery's own per-step cost, as a fraction of a target step
    targets: tuple[str, ...] = ()  # target models it drafts for; empty = any
    relative_cost_by_target: dict[str, float] = field(default_factory=dict)
    engines: EngineNames = field(default_factory=EngineNames)

    def cost_for(self, model: str) -> float:
        return self.relative_cost_by_target.get(model, self.relative_cost)

    def supports(self, model: str) -> bool:
        return not self.targets or model in self.targets


@dataclass(frozen=True)
class ProfileSet:
    """Every GPU, model and drafter the cost model knows, by name."""

    gpus: dict[str, GpuSpec]
    models: dict[str, ModelSpec]
    drafters: dict[str, DrafterSpec]
    # What the engines taught (core.learning), per (GPU type, model): the GPU as decisions on that
    # model price it where a learned profile is in force, and the margin the shipped profile's
    # observed error adds to the self-benefit margin where it prices.
    learned: dict[tuple[str, str], GpuSpec] = field(default_factory=dict)
    extra_margin: dict[tuple[str, str], float] = field(default_factory=dict)
    pricing: dict[tuple[str, str], str] = field(default_factory=dict)  # why, for a check message

    def gpu_for(self, gpu_type: str, model: str) -> GpuSpec:
        """The GPU `gpu_type` as decisions on `model` price it (KeyError for an unknown type)."""
        return self.learned.get((gpu_type, model)) or self.gpus[gpu_type]

    def margin_for(self, gpu_type: str, model: str) -> float:
        """What decisions on `model` add to the self-benefit margin on `gpu_type` (never < 0)."""
        return max(self.extra_margin.get((gpu_type, model), 0.0), 0.0)
