"""SCENARIO.yaml, validated at the border (pydantic), into plain dataclasses for the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sovereignspec.core.defaults import GAMMA_LIMIT, GAMMA_MAX
from sovereignspec.errors import ConfigError, describe

SHIPPED = Path(__file__).parent / "scenarios"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Alpha(_M):
    mean: float = Field(ge=0, le=1, description="true mean acceptance rate in [0, 1]")
    sd: float = Field(0.05, ge=0, le=0.5, description="spread between requests, in [0, 0.5]")


class Arrival(_M):
    kind: Literal["poisson", "bursty"] = "poisson"
    rate_per_s: float = Field(gt=0, description="mean requests per second (over the whole run)")
    burst_factor: float = Field(4.0, ge=1, description="rate multiplier during a burst (bursty)")
    on_s: float = Field(10.0, gt=0, description="burst length in seconds (bursty)")
    off_s: float = Field(30.0, gt=0, description="quiet time between bursts in seconds (bursty)")


class Lengths(_M):
    mean: float = Field(gt=0, description="mean tokens")
    sd: float = Field(0.0, ge=0, description="standard deviation in tokens (log-normal)")


class Tenant(_M):
    name: str = Field(min_length=1)
    model: str = "llama-3.1-8b"
    drafter: str | None = None
    alpha: Alpha = Field(default_factory=lambda: Alpha(mean=0.6))
    declared_alpha: float | None = Field(None, ge=0, le=1, description="the prior the scheduler is told")
    arrival: Arrival
    prompt_tokens: Lengths = Field(default_factory=lambda: Lengths(mean=512, sd=128))
    output_tokens: Lengths = Field(default_factory=lambda: Lengths(mean=256, sd=64))
    tpot_slo_ms: float = Field(gt=0, description="time per output token objective, ms")
    ttft_slo_ms: float = Field(5000.0, gt=0, description="time to first token objective, ms")
    latency_class: Literal["latency", "throughput"] = "latency"
    replicas: int = Field(1, ge=1, le=256)
    max_num_seqs: int = Field(16, ge=1, le=1024, description="concurrent sequences per replica")
    jurisdiction: str | None = None
    exclusive: bool = False
    start_s: float = Field(0.0, ge=0, description="when its replicas are placed")


class NodeGroup(_M):
    name: str = Field(min_length=1)
    gpu: str
    nodes: int = Field(1, ge=1, le=1024)
    gpus_per_node: int = Field(8, ge=1, le=16)
    jurisdiction: str | None = None


class Telemetry(_M):
    period_s: float = Field(5.0, gt=0, description="sampling period of GPU headroom")
    lag_s: float = Field(5.0, ge=0, description="age of a reading when it is used")


class Scenario(_M):
    name: str = Field(min_length=1)
    description: str = ""
    duration_s: float = Field(gt=0, le=86400, description="arrivals stop after this; the run then drains")
    seed: int = 1
    gamma_max: int = Field(GAMMA_MAX, ge=0, le=GAMMA_LIMIT)
    replicas_per_gpu: int = Field(4, ge=1, le=64, description="engines one GPU can host (time-slicing)")
    telemetry: Telemetry = Field(default_factory=Telemetry)
    cluster: list[NodeGroup] = Field(min_length=1)
    tenants: list[Tenant] = Field(min_length=1)

    @field_validator("cluster", "tenants")
    @classmethod
    def _unique_names(cls, items: list[NodeGroup] | list[Tenant]) -> list[NodeGroup] | list[Tenant]:
        # Results are reported by tenant and nodes are named after their group: names must differ.
        names = [i.name for i in items]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"names must be unique; repeated: {', '.join(repeated)}")
        return items


def load(path: str | Path) -> Scenario:
    p = Path(path)
    if not p.exists() and (SHIPPED / p.name).exists():
        p = SHIPPED / p.name
    if not p.exists() and (SHIPPED / f"{p.name}.yaml").exists():
        p = SHIPPED / f"{p.name}.yaml"
    if not p.exists():
        shipped = ", ".join(sorted(x.stem for x in SHIPPED.glob("*.yaml")))
        raise ConfigError(f"scenario {path}: no such file; shipped scenarios: {shipped}")
    try:
        data = yaml.safe_load(p.read_text())
        return Scenario.model_validate(data)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML: {exc}") from exc
    except ValidationError as exc:
        raise ConfigError(describe(exc, Scenario, where=str(p))) from exc


def scaled(scenario: Scenario, load: float) -> Scenario:
    """The same scenario with every tenant's arrival rate multiplied by `load`."""
    tenants = [
        t.model_copy(
            update={"arrival": t.arrival.model_copy(update={"rate_per_s": t.arrival.rate_per_s * load})}
        )
        for t in scenario.tenants
    ]
    return scenario.model_copy(update={"tenants": tenants})
