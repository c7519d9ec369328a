"""Workload annotations: what users declare on their pod templates, validated at the border.

Performance fields that are malformed turn speculation off for the workload (it still runs, in
plain decode) and raise a Warning Event; sovereignty fields that are malformed fail closed: the
workload is Rejected with a message naming the field, because guessing a trust boundary is worse
than not running.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

PREFIX = "sovereignspec.io/"
JURISDICTION_RE = re.compile(r"^[a-z]{2}(-[a-z0-9]{1,16})?$")
TENANT_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Field:
    key: str
    accepted: str
    sovereignty: bool = False


INPUTS = {
    "tenant": Field(
        "tenant", "a DNS-1123 name (lowercase letters, digits, '-', '.'); default: the namespace", True
    ),
    "jurisdiction": Field(
        "jurisdiction", "an ISO 3166-1 alpha-2 code, optionally with a subdivision: eu, kr, us-east", True
    ),
    "exclusive-node": Field("exclusive-node", "true or false", True),
    "model": Field("model", "a target model profile name"),
    "drafter": Field("drafter", "a drafter profile name, or none"),
    "acceptance-rate": Field("acceptance-rate", "a number in [0, 1]"),
    "tpot-slo-ms": Field("tpot-slo-ms", "a positive number of milliseconds"),
    "latency-class": Field("latency-class", "latency or throughput"),
    "max-num-seqs": Field("max-num-seqs", "a positive integer (concurrent sequences)"),
    "context-length": Field("context-length", "a positive integer (typical tokens of context)"),
}

# What the controller writes into podSetUpdates (never read back as user input).
OUT_MODE = PREFIX + "mode"
OUT_BUDGET = PREFIX + "draft-budget"
OUT_BUDGET_BY_BATCH = PREFIX + "draft-budget-by-batch"
OUT_VLLM = PREFIX + "vllm-speculative-config"
OUT_SGLANG = PREFIX + "sglang-args"
OUT_GPU_TYPE = PREFIX + "gpu-type"
OUT_GPU_INDEX = PREFIX + "gpu-index"
OUT_SPEEDUP = PREFIX + "predicted-speedup"
OUT_TPOT = PREFIX + "predicted-tpot-ms"
OUT_DECIDED_AT = PREFIX + "decided-at"
OUT_POLICY = PREFIX + "policy"
HOSTNAME = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Problem:
    field: str
    value: str
    accepted: str
    sovereignty: bool

    def __str__(self) -> str:
        return f"annotation {PREFIX}{self.field}: got {self.value!r}; accepted: {self.accepted}"


@dataclass(frozen=True)
class Declared:
    tenant: str
    model: str | None = None
    drafter: str | None = None
    alpha: float | None = None
    tpot_slo_s: float | None = None
    latency_class: str | None = None
    seqs: int | None = None
    context: int | None = None
    jurisdiction: str | None = None
    exclusive: bool = False
    problems: tuple[Problem, ...] = field(default_factory=tuple)

    @property
    def sovereignty_problems(self) -> list[Problem]:
        return [p for p in self.problems if p.sovereignty]

    @property
    def performance_problems(self) -> list[Problem]:
        return [p for p in self.problems if not p.sovereignty]


def parse(
    annotations: dict[str, str] | None, namespace: str, known_models: set[str], known_drafters: set[str]
) -> Declared:
    """Read our annotations from a pod template; every problem is collected, none raised."""
    raw = {k[len(PREFIX) :]: v for k, v in (annotations or {}).items() if k.startswith(PREFIX)}
    problems: list[Problem] = []
    values: dict[str, Any] = {}

    def bad(key: str, value: str, accepted: str | None = None) -> None:
        spec = INPUTS[key]
        problems.append(Problem(key, value, accepted or spec.accepted, spec.sovereignty))

    tenant = raw.get("tenant", namespace)
    if not TENANT_RE.match(tenant):
        bad("tenant", tenant)
    if "jurisdiction" in raw:
        if JURISDICTION_RE.match(raw["jurisdiction"]):
            values["jurisdiction"] = raw["jurisdiction"]
        else:
            bad("jurisdiction", raw["jurisdiction"])
    if "exclusive-node" in raw:
        text = raw["exclusive-node"].strip().lower()
        if text in ("true", "false"):
            values["exclusive"] = text == "true"
        else:
            bad("exclusive-node", raw["exclusive-node"])
    if "model" in raw:
        if raw["model"] in known_models:
            values["model"] = raw["model"]
        else:
            bad("model", raw["model"], "one of " + ", ".join(sorted(known_models)))
    if "drafter" in raw:
        if raw["drafter"] == "none":
            values["drafter"] = None
        elif raw["drafter"] in known_drafters:
            values["drafter"] = raw["drafter"]
        else:
            bad("drafter", raw["drafter"], "none or one of " + ", ".join(sorted(known_drafters)))
    number = _number(raw, "acceptance-rate", problems, lambda x: 0.0 <= x <= 1.0)
    if number is not None:
        values["alpha"] = number
    slo = _number(raw, "tpot-slo-ms", problems, lambda x: x > 0.0)
    if slo is not None:
        values["tpot_slo_s"] = slo / 1e3
    if "latency-class" in raw:
        if raw["latency-class"] in ("latency", "throughput"):
            values["latency_class"] = raw["latency-class"]
        else:
            bad("latency-class", raw["latency-class"])
    for key, name in (("max-num-seqs", "seqs"), ("context-length", "context")):
        value = _number(raw, key, problems, lambda x: x >= 1 and float(x).is_integer())
        if value is not None:
            values[name] = int(value)
    return Declared(tenant=tenant, problems=tuple(problems), **values)


def _number(raw: dict[str, str], key: str, problems: list[Problem], ok: Any) -> float | None:
    if key not in raw:
        return None
    try:
        value = float(raw[key])
    except ValueError:
        value = float("nan")
    if math.isnan(value) or not ok(value):
        spec = INPUTS[key]
        problems.append(Problem(key, raw[key], spec.accepted, spec.sovereignty))
        return None
    return value
