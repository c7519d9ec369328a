"""Loading and validating the YAML profiles into the core's specs (the border for `profiles/`).

A bad profile fails with a `ConfigError` naming the file, the field, the value and what is
accepted. Units in the files are the ones on datasheets (TFLOPS, TB/s, GB, W, ms, µs); the core gets SI.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sovereignspec.core.calibration import COEFFICIENTS
from sovereignspec.core.specs import DRAFTER_KINDS, DrafterSpec, EngineNames, GpuSpec, ModelSpec, ProfileSet
from sovereignspec.errors import ConfigError, describe

Positive = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]


class _Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, description="a non-empty name")
    source: str = Field(min_length=1, description="where the numbers come from")
    measured: bool = Field(description="true only for figures profiled on real hardware")


class HeldOut(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    data: str | list[str] = Field(description="the held-out measurements file(s)")
    rows: int = Field(ge=1, description="held-out measurements")
    rms_error_pct: float = Field(ge=0, description="root-mean-square relative error on them, %")
    max_error_pct: float = Field(ge=0, description="largest relative error on them, %")


Side = Annotated[float, Field(ge=0)] | None


class Calibration(BaseModel):
    """What `sovereignspec calibrate` fitted, against which data, how well, and what it pinned."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    data: str | list[str] = Field(description="the measurements file(s) (paths in the repository)")
    source: str = Field(min_length=1, description="where the measurements come from")
    model: str = Field(min_length=1, description="the target model measured")
    tensor_parallel: int = Field(ge=1, description="the tensor-parallel degree measured")
    rows: int = Field(ge=1, description="measurements fitted")
    rms_error_pct: float = Field(ge=0, description="root-mean-square relative error of the fit, %")
    max_error_pct: float = Field(ge=0, description="largest relative error of the fit, %")
    fixed_ms: float | None = Field(
        default=None, ge=0, description="the fitted fixed cost per step at the measured TP, ms"
    )
    scaled_from: str = Field(
        default="", description="for a GPU not measured: the calibrated GPU whose fit it borrows"
    )
    rms_error_pct_by_part: dict[Literal["step", "linear"], float] = Field(
        default_factory=dict, description="the fit's RMS error per kind of row, %"
    )
    held_out: HeldOut | None = Field(default=None, description="the fit's error on data it never saw")
    intervals: dict[str, tuple[Side, Side]] = Field(
        default_factory=dict,
        description="per fitted coefficient, its 95 % interval [low, high] (null: the data allow the bound)",
    )
    ridge_seqs: dict[str, dict[int, tuple[Side, Side, Side]]] = Field(
        default_factory=dict,
        description="per model and context, the ridge [low, estimate, high] in sequences (.inf: none)",
    )
    ridge_identified: bool = Field(default=False, description="whether the data pin every ridge")
    identified: list[str] = Field(default_factory=list, description="coefficients the data pin")
    not_identified: list[str] = Field(default_factory=list, description="coefficients the data leave open")
    at_bounds: list[str] = Field(default_factory=list, description="coefficients the fit pushed to a bound")
    measured_refused: list[str] = Field(default_factory=list, description="why measured is false")

    @field_validator("intervals")
    @classmethod
    def _known_coefficients(cls, v: dict[str, tuple[Side, Side]]) -> dict[str, tuple[Side, Side]]:
        unknown = sorted(set(v) - set(COEFFICIENTS))
        if unknown:
            raise ValueError(f"unknown coefficient(s) {unknown}; accepted: {', '.join(COEFFICIENTS)}")
        return v


class GpuProfile(_Profile):
    kind: Literal["gpu"]
    peak_tflops: float = Field(gt=0, description="dense bf16 TFLOP/s, > 0")
    memory_bandwidth_tbps: float = Field(gt=0, description="memory bandwidth in TB/s, > 0")
    memory_gb: float = Field(gt=0, description="memory in GB, > 0")
    idle_watts: float = Field(ge=0, description="idle power in W, >= 0")
    max_watts: float = Field(gt=0, description="max board power in W, > 0")
    compute_efficiency: float = Field(gt=0, le=1, description="fraction of peak reached, in (0, 1]")
    bandwidth_efficiency: float = Field(gt=0, le=1, description="fraction of bandwidth reached, in (0, 1]")
    step_overhead_ms: float = Field(ge=0, description="fixed cost per engine step in ms, >= 0")
    allreduce_us: float = Field(ge=0, description="latency of one small all-reduce in µs, >= 0")
    pipeline_hop_us: float = Field(
        default=30.0,
        ge=0,
        description="one pipeline stage handing its activations to the next node in µs, >= 0 (estimated)",
    )
    serial_fraction: float = Field(
        ge=0, le=1, description="share of per-token compute not hidden by weight streaming, in [0, 1]"
    )
    overlap: float = Field(ge=1, le=64, description="exponent of the smooth maximum, in [1, 64]")
    calibration: Calibration | None = Field(
        default=None, description="how the coefficients were fitted (sovereignspec calibrate)"
    )

    @model_validator(mode="after")
    def _measured_only_where_the_ridge_is_pinned(self) -> GpuProfile:
        if self.measured and (self.calibration is None or not self.calibration.ridge_identified):
            raise ValueError(
                "measured: true needs a calibration whose data pin the compute ridge "
                "(calibration.ridge_identified: true); accepted: measured: false otherwise"
            )
        if self.measured and self.calibration is not None and self.calibration.measured_refused:
            why = "; ".join(self.calibration.measured_refused)
            raise ValueError(
                f"measured: true, but its calibration says why not: {why}; accepted: measured: false"
            )
        return self

    def compute_efficiency_range(self) -> tuple[float, float]:
        """The 95 % interval of the compute efficiency the calibration found; an open side (or no
        calibration) is the coefficient itself: nothing to be cautious about that the data show."""
        if self.calibration is None or "compute_efficiency" not in self.calibration.intervals:
            return (self.compute_efficiency, self.compute_efficiency)
        low, high = self.calibration.intervals["compute_efficiency"]
        return (
            self.compute_efficiency if low is None else min(low, self.compute_efficiency),
            self.compute_efficiency if high is None else max(high, self.compute_efficiency),
        )

    def to_spec(self) -> GpuSpec:
        return GpuSpec(
            name=self.name,
            peak_flops=self.peak_tflops * 1e12,
            mem_bandwidth=self.memory_bandwidth_tbps * 1e12,
            mem_bytes=self.memory_gb * 1e9,
            idle_watts=self.idle_watts,
            max_watts=self.max_watts,
            compute_efficiency=self.compute_efficiency,
            bandwidth_efficiency=self.bandwidth_efficiency,
            step_overhead_s=self.step_overhead_ms * 1e-3,
            allreduce_s=self.allreduce_us * 1e-6,
            pipeline_hop_s=self.pipeline_hop_us * 1e-6,
            serial_fraction=self.serial_fraction,
            overlap=self.overlap,
            compute_efficiency_low=self.compute_efficiency_range()[0],
            compute_efficiency_high=self.compute_efficiency_range()[1],
        )


class ModelProfile(_Profile):
    kind: Literal["model"]
    params_billion: float = Field(gt=0, description="parameters in billions, > 0")
    layers: int = Field(gt=0, description="a positive integer")
    hidden: int = Field(gt=0, description="query heads x head dim, a positive integer")
    kv_heads: int = Field(gt=0, description="a positive integer")
    head_dim: int = Field(gt=0, description="a positive integer")
    bytes_per_param: float = Field(gt=0, description="bytes per weight, > 0 (2 for bf16)")
    kv_bytes_per_elem: float = Field(gt=0, description="bytes per KV element, > 0 (2 for bf16)")
    tensor_parallel: Literal[1, 2, 4, 8, 16] = Field(description="one of 1, 2, 4, 8, 16")

    def to_spec(self) -> ModelSpec:
        return ModelSpec(
            name=self.name,
            params=self.params_billion * 1e9,
            layers=self.layers,
            hidden=self.hidden,
            kv_heads=self.kv_heads,
            head_dim=self.head_dim,
            bytes_per_param=self.bytes_per_param,
            kv_bytes_per_elem=self.kv_bytes_per_elem,
            tensor_parallel=self.tensor_parallel,
        )


class EngineProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    vllm_method: str = Field(default="", description="vLLM speculative_config method, e.g. eagle3, ngram")
    sglang_algorithm: str = Field(default="", description="SGLang --speculative-algorithm, e.g. EAGLE3")
    methods: dict[str, str] = Field(
        default_factory=dict, description="any other engine's name for the method: engine name -> method"
    )
    draft_models: dict[str, str] = Field(default_factory=dict, description="target model -> draft checkpoint")

    def by_engine(self) -> dict[str, str]:
        """Engine name (`sovereignspec.engines`) -> its name for the method."""
        named = {"vllm": self.vllm_method, "sglang": self.sglang_algorithm}
        return {k: v for k, v in {**named, **self.methods}.items() if v}


class DrafterProfile(_Profile):
    kind: Literal["drafter"]
    drafter_kind: Literal[DRAFTER_KINDS] = Field(  # type: ignore[valid-type]
        description="one of " + ", ".join(DRAFTER_KINDS)
    )
    relative_cost: float = Field(
        ge=0, lt=1, description="a drafted token's cost relative to the GPU's batch-1 step, in [0, 1)"
    )
    relative_cost_by_target: dict[str, Annotated[float, Field(ge=0, lt=1)]] = Field(
        default_factory=dict, description="per-target overrides of relative_cost, each in [0, 1)"
    )
    spec_overhead: float = Field(
        ge=0, lt=1, description="per-step machinery cost relative to a target step, in [0, 1)"
    )
    targets: list[str] = Field(default_factory=list, description="target model names; empty means any")
    engines: EngineProfile = Field(default_factory=EngineProfile, description="engine names of the method")

    def to_spec(self) -> DrafterSpec:
        return DrafterSpec(
            name=self.name,
            kind=self.drafter_kind,
            relative_cost=self.relative_cost,
            spec_overhead=self.spec_overhead,
            targets=tuple(self.targets),
            relative_cost_by_target=dict(self.relative_cost_by_target),
            engines=EngineNames(self.engines.by_engine(), dict(self.engines.draft_models)),
        )


_KINDS: dict[str, type[GpuProfile] | type[ModelProfile] | type[DrafterProfile]] = {
    "gpus": GpuProfile,
    "models": ModelProfile,
    "drafters": DrafterProfile,
}


def default_profile_dir() -> Path:
    """`$SOVEREIGNSPEC_PROFILES`, else the profiles shipped inside the wheel, else the repository's."""
    env = os.environ.get("SOVEREIGNSPEC_PROFILES")
    if env:
        return Path(env)
    packaged = Path(__file__).parent / "_profiles"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "profiles"


def load_file(
    path: Path, schema: type[GpuProfile] | type[ModelProfile] | type[DrafterProfile]
) -> GpuProfile | ModelProfile | DrafterProfile:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of fields, got {type(data).__name__}")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe(exc, schema, where=str(path))) from exc


def _peek_kind(path: Path) -> object:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return data.get("kind") if isinstance(data, dict) else None


def load_profiles(directory: Path | str | None = None) -> ProfileSet:
    """Every profile under `directory` (gpus/, models/, drafters/, or flat files with their `kind`),
    validated; names must be unique within a kind."""
    root = Path(directory) if directory is not None else default_profile_dir()
    if not root.is_dir():
        raise ConfigError(f"profiles directory {root} does not exist")
    found: dict[str, dict[str, object]] = {k: {} for k in _KINDS}
    origin: dict[tuple[str, str], Path] = {}
    by_kind = {"gpu": "gpus", "model": "models", "drafter": "drafters"}
    files = [(folder, path) for folder in _KINDS for path in sorted((root / folder).glob("*.yaml"))]
    # A flat directory works too (a mounted ConfigMap): each file says its own `kind`.
    for path in sorted(root.glob("*.yaml")):
        kind = _peek_kind(path)
        if kind not in by_kind:
            raise ConfigError(f"{path}: field 'kind': got {kind!r}; accepted: gpu, model or drafter")
        files.append((by_kind[kind], path))
    for folder, path in files:
        profile = load_file(path, _KINDS[folder])
        key = (folder, profile.name)
        if key in origin:
            raise ConfigError(f"{path}: field 'name': {profile.name!r} is already defined in {origin[key]}")
        origin[key] = path
        found[folder][profile.name] = profile.to_spec()
    for folder, items in found.items():
        if not items:
            raise ConfigError(f"{root / folder}: no {folder} profiles found (expected *.yaml files)")
    profiles = ProfileSet(gpus=found["gpus"], models=found["models"], drafters=found["drafters"])  # type: ignore[arg-type]
    for drafter in profiles.drafters.values():
        for target in [*drafter.targets, *drafter.relative_cost_by_target]:
            if target not in profiles.models:
                raise ConfigError(
                    f"{origin[('drafters', drafter.name)]}: field 'targets': got {target!r}; "
                    f"accepted: one of the models {sorted(profiles.models)}"
                )
    return profiles


def resolve_name(kind: str, name: str, known: Mapping[str, object]) -> str:
    """Case-insensitive lookup; a clear error naming the accepted values otherwise."""
    for candidate in known:
        if candidate.lower() == name.lower():
            return candidate
    raise ConfigError(f"unknown {kind} {name!r}; accepted: {', '.join(sorted(known))}")
