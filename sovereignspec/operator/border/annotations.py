"""Workload annotations: what users declare on their pod templates, validated at the border.

The grammar is strict on purpose. Numbers are ASCII decimals (no sign, exponent, `_`, `inf` or
non-ASCII digits) inside stated bounds; keywords are exact and lower-case; names match their
pattern whole (a trailing newline is not a name).

- Performance fields that are malformed turn speculation off for the workload (it still runs, in
  plain decode) and raise a Warning Event.
- Sovereignty fields fail closed: the workload is Rejected with a message naming the field. That
  includes a key that looks like a sovereignty key but is not one (`Jurisdiction`, `jurisdicton`),
  and a sovereignty key put where it is not read (on the Job or as a label instead of the pod
  template's annotations): guessing a trust boundary is worse than not running.
- The tenant comes from the namespace (see `Tenancy`); an annotation may restate it, never claim
  another. A jurisdiction annotation may only narrow what the namespace allows.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sovereignspec import engines, keys

# Kueue's key (a label, or an annotation under a feature gate) naming the Workload it built for a
# Pod's group: a StatefulSet's, a LeaderWorkerSet group's.
KUEUE_PREBUILT = "kueue.x-k8s.io/prebuilt-workload-name"
# The label a Pod carries for Kueue's pod integration to queue it (the operator's Pod cache holds
# only Pods that carry it: operator/runtime/informer.py).
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
PREFIX = keys.PREFIX
JURISDICTION_RE = re.compile(r"[a-z]{2}(-[a-z0-9]{1,16})?", re.ASCII)
TENANT_RE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?", re.ASCII)
DECIMAL_RE = re.compile(r"[0-9]{1,12}(\.[0-9]{1,12})?", re.ASCII)
INTEGER_RE = re.compile(r"[0-9]{1,12}", re.ASCII)
# What the caches keep of a template's annotations (operator/runtime/informer.py): our keys only, at most
# MAX_OUR_KEYS, each value at most MAX_OUR_VALUE bytes. Past either bound the cache keeps a
# marker, refused here by name: one tenant's flood of large annotations cannot grow our memory.
MAX_OUR_KEYS = 64
MAX_OUR_VALUE = 4096
OVERSIZED = "\x00oversized:"
TOO_MANY_KEYS = PREFIX + "\x00too-many-keys"


@dataclass(frozen=True)
class Field:
    key: str
    accepted: str
    sovereignty: bool = False


INPUTS = {
    "tenant": Field(
        "tenant", "the namespace's tenant (restating it is allowed, claiming another is not)", True
    ),
    "jurisdiction": Field(
        "jurisdiction",
        "an ISO 3166-1 alpha-2 code, optionally with a subdivision (eu, kr, us-east), "
        "within what the namespace allows",
        True,
    ),
    "exclusive-node": Field("exclusive-node", "true or false (lower case)", True),
    "model": Field("model", "a target model profile name"),
    "drafter": Field("drafter", "a drafter profile name, or none"),
    "acceptance-rate": Field("acceptance-rate", "a decimal number in [0, 1]"),
    "tpot-slo-ms": Field("tpot-slo-ms", "a positive decimal number of milliseconds, at most 60000"),
    "latency-class": Field("latency-class", "latency or throughput"),
    "max-num-seqs": Field("max-num-seqs", "an integer in 1..65536 (concurrent sequences)"),
    "context-length": Field("context-length", "an integer in 1..4194304 (typical tokens of context)"),
    "draft-checkpoint": Field(
        "draft-checkpoint", "a path or model id (letters, digits and ._/:@+=-, at most 512) the policy allows"
    ),
}
CHECKPOINT_RE = re.compile(r"[A-Za-z0-9._/:@+=-]{1,512}")
SOVEREIGNTY_KEYS = tuple(k for k, f in INPUTS.items() if f.sovereignty)

# What the controller writes into podSetUpdates. Reserved: a template that sets one of them is
# steering the engine around the decision (see controller.pod_set_annotations).
OUT_MODE = PREFIX + keys.MODE
OUT_BUDGET = PREFIX + keys.BUDGET
# Each engine's configuration, in the annotations its module names (`sovereignspec.engines`).
OUT_ENGINES = frozenset(PREFIX + key for key in engines.OUTPUTS)
OUT_GPU_TYPE = PREFIX + keys.GPU_TYPE
OUT_GPU_INDEX = PREFIX + "gpu-index"
OUT_SPEEDUP = PREFIX + "predicted-speedup"
OUT_TPOT = PREFIX + "predicted-tpot-ms"
OUT_DECIDED_AT = PREFIX + keys.DECIDED_AT
OUT_POLICY = PREFIX + "policy"
# Pods spread over several nodes: where each was counted, "host/gpu-index" comma-separated.
OUT_NODES = PREFIX + "nodes"
OUTPUTS = frozenset(
    {
        OUT_MODE,
        OUT_BUDGET,
        OUT_GPU_TYPE,
        OUT_GPU_INDEX,
        OUT_SPEEDUP,
        OUT_TPOT,
        OUT_DECIDED_AT,
        OUT_POLICY,
        OUT_NODES,
        *OUT_ENGINES,
    }
)
HOSTNAME = "kubernetes.io/hostname"
# Words that make an unknown key look like an attempt at a sovereignty key.
_SOVEREIGN_WORDS = ("tenant", "jurisdic", "exclusiv", "sovereign", "region", "country", "residen")


@dataclass(frozen=True)
class Tenancy:
    """What administrators say about a namespace: its tenant and where its work may run."""

    tenant: str
    jurisdictions: frozenset[str] | None = None  # None: anywhere
    source: str = "the namespace name"
    problem: str | None = None  # the admin sources contradict each other: fail closed


@dataclass(frozen=True)
class Problem:
    field: str
    value: str
    accepted: str
    sovereignty: bool
    where: str = "the pod template's annotations"
    pod_set: str = ""  # which of several pod sets (a LeaderWorkerSet's leader or workers)

    def __str__(self) -> str:
        said = f"annotation {PREFIX}{self.field}: got {_show(self.value)}; accepted: {self.accepted}"
        return f"pod set {self.pod_set}: {said}" if self.pod_set else said


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
    draft_checkpoint: str | None = None  # the policy decides whether it may be used (view)
    jurisdiction: str | None = None  # required (declared, or the namespace's only one)
    allowed_jurisdictions: frozenset[str] | None = None  # the namespace's list (None: anywhere)
    exclusive: bool = False
    problems: tuple[Problem, ...] = field(default_factory=tuple)
    warnings: tuple[str, ...] = field(default_factory=tuple)  # reported, nothing turned off

    @property
    def sovereignty_problems(self) -> list[Problem]:
        return [p for p in self.problems if p.sovereignty]

    @property
    def performance_problems(self) -> list[Problem]:
        return [p for p in self.problems if not p.sovereignty]


def parse(
    annotations: Mapping[str, Any] | None,
    tenancy: Tenancy | str,
    known_models: set[str],
    known_drafters: set[str],
    *,
    labels: Mapping[str, Any] | None = None,
    owner_annotations: Mapping[str, Any] | None = None,
    owner: str = "Job",
) -> Declared:
    """Read our annotations from a pod template; every problem is collected, none raised.

    `tenancy` is what the namespace's administrators say (a bare string: the tenant, anywhere);
    `labels` are the template's labels and `owner_annotations` the Job's (or Workload's) own
    annotations, where our keys are not read and so must not be."""
    if isinstance(tenancy, str):
        tenancy = Tenancy(tenancy)
    problems: list[Problem] = []
    warnings: list[str] = []
    raw = _our_keys(annotations, problems)
    _misplaced(labels, "the pod template's labels", problems, warnings)
    _misplaced(owner_annotations, f"the {owner}'s own annotations", problems, warnings)
    _unknown_keys(raw, problems, warnings)
    values = _sovereignty_values(raw, tenancy, problems)
    values.update(_serving_values(raw, known_models, known_drafters, problems))
    return Declared(tenant=tenancy.tenant, problems=tuple(problems), warnings=tuple(warnings), **values)


def _our_keys(annotations: Mapping[str, Any] | None, problems: list[Problem]) -> dict[str, str]:
    """Our keys without the prefix, as text; the informer's markers for too many or oversized
    values become problems (sovereignty ones: what they hid may have been a sovereignty key)."""
    raw: dict[str, str] = {}
    for k, v in (annotations or {}).items():
        if k == TOO_MANY_KEYS:
            accepted = f"at most {MAX_OUR_KEYS} {PREFIX} annotations on a pod template"
            problems.append(Problem("*", f"{v} keys", accepted, True))
        elif isinstance(k, str) and k.startswith(PREFIX):
            text = v if isinstance(v, str) else repr(v)
            if text.startswith(OVERSIZED):
                size = text[len(OVERSIZED) :]
                accepted = f"a value of at most {MAX_OUR_VALUE} bytes; refused whatever the key"
                problems.append(Problem(k[len(PREFIX) :], f"{size} bytes", accepted, True))
                continue
            raw[k[len(PREFIX) :]] = text
    return raw


def _unknown_keys(raw: Mapping[str, str], problems: list[Problem], warnings: list[str]) -> None:
    """A key we do not read is a warning, or a problem where it looks like a sovereignty key."""
    for key in sorted(raw):
        if key in INPUTS or PREFIX + key in OUTPUTS:
            continue
        guess = _closest(key)
        if _looks_sovereign(key):
            hint = f"did you mean {PREFIX}{guess}?" if guess else "not a key SovereignSpec reads"
            problems.append(
                Problem(key, raw[key], f"a known key ({hint}); sovereignty keys fail closed", True)
            )
        else:
            hint = f"; did you mean {PREFIX}{guess}?" if guess else ""
            warnings.append(f"unknown annotation {PREFIX}{key} ignored{hint}")


def _bad(problems: list[Problem], key: str, value: str, accepted: str | None = None) -> None:
    spec = INPUTS[key]
    problems.append(Problem(key, value, accepted or spec.accepted, spec.sovereignty))


def _sovereignty_values(raw: Mapping[str, str], tenancy: Tenancy, problems: list[Problem]) -> dict[str, Any]:
    """Tenant, jurisdiction and exclusivity, checked against what the namespace's administrators say."""
    values: dict[str, Any] = {}
    if tenancy.problem:
        problems.append(Problem("tenant", tenancy.tenant, tenancy.problem, True, "the namespace"))
    tenant = tenancy.tenant
    if "tenant" in raw and raw["tenant"] != tenant:
        accepted = f"{_show(tenant)} (namespace tenant, from {tenancy.source})"
        _bad(problems, "tenant", raw["tenant"], accepted)
    allowed = tenancy.jurisdictions
    values["allowed_jurisdictions"] = allowed
    if "jurisdiction" in raw:
        wanted = raw["jurisdiction"]
        if not JURISDICTION_RE.fullmatch(wanted):
            _bad(problems, "jurisdiction", wanted)
        elif allowed is not None and wanted not in allowed:
            _bad(problems, "jurisdiction", wanted, f"one the namespace allows: {', '.join(sorted(allowed))}")
        else:
            values["jurisdiction"] = wanted
    elif allowed is not None and len(allowed) == 1:
        values["jurisdiction"] = next(iter(allowed))
    if "exclusive-node" in raw:
        if raw["exclusive-node"] in ("true", "false"):
            values["exclusive"] = raw["exclusive-node"] == "true"
        else:
            _bad(problems, "exclusive-node", raw["exclusive-node"])
    return values


def _serving_values(
    raw: Mapping[str, str], known_models: set[str], known_drafters: set[str], problems: list[Problem]
) -> dict[str, Any]:
    """Model, drafter, acceptance, SLO, class, checkpoint and sizes: what prices the decision."""
    values: dict[str, Any] = {}
    if "model" in raw:
        if raw["model"] in known_models:
            values["model"] = raw["model"]
        else:
            _bad(problems, "model", raw["model"], "one of " + ", ".join(sorted(known_models)))
    if "drafter" in raw:
        if raw["drafter"] == "none":
            values["drafter"] = None
        elif raw["drafter"] in known_drafters:
            values["drafter"] = raw["drafter"]
        else:
            _bad(problems, "drafter", raw["drafter"], "none or one of " + ", ".join(sorted(known_drafters)))
    alpha = _number(raw, "acceptance-rate", problems, DECIMAL_RE, 0.0, 1.0)
    if alpha is not None:
        values["alpha"] = alpha
    slo = _number(raw, "tpot-slo-ms", problems, DECIMAL_RE, 0.0, 60000.0, open_low=True)
    if slo is not None:
        values["tpot_slo_s"] = slo / 1e3
    if "latency-class" in raw:
        if raw["latency-class"] in ("latency", "throughput"):
            values["latency_class"] = raw["latency-class"]
        else:
            _bad(problems, "latency-class", raw["latency-class"])
    if "draft-checkpoint" in raw:
        if CHECKPOINT_RE.fullmatch(raw["draft-checkpoint"]):
            values["draft_checkpoint"] = raw["draft-checkpoint"]
        else:
            _bad(problems, "draft-checkpoint", raw["draft-checkpoint"])
    for key, name, high in (("max-num-seqs", "seqs", 65536), ("context-length", "context", 4194304)):
        value = _number(raw, key, problems, INTEGER_RE, 1.0, float(high))
        if value is not None:
            values[name] = int(value)
    return values


# Declared fields every pod set of one workload must agree on (they describe one engine), with
# the key a user writes for each.
_SHARED = {
    "model": "model",
    "drafter": "drafter",
    "alpha": "acceptance-rate",
    "tpot_slo_s": "tpot-slo-ms",
    "latency_class": "latency-class",
    "seqs": "max-num-seqs",
    "context": "context-length",
    "draft_checkpoint": "draft-checkpoint",
}


def combine(parts: list[tuple[str, Declared]]) -> Declared:
    """One workload's declaration from each of its pod sets' (a LeaderWorkerSet group's leader and
    workers), each already held to the whole grammar by `parse`. Every problem of every pod set
    counts, named by its pod set. The strictest sovereignty wins: a jurisdiction any pod set
    declares binds them all, and two different ones are a contradiction (fail closed); one pod set
    asking for an exclusive node makes the workload exclusive. The performance fields describe one
    engine: pod sets that set one differently get plain decode, saying so."""
    if len(parts) == 1:
        return parts[0][1]
    named = [(name, _named(d, name)) for name, d in parts]
    first = named[0][1]
    problems = [p for _, d in named for p in d.problems]
    warnings = list(dict.fromkeys(f"pod set {name}: {w}" for name, d in named for w in d.warnings))
    declared = {name: d.jurisdiction for name, d in named if d.jurisdiction is not None}
    if len(set(declared.values())) > 1:
        shown = ", ".join(f"{n}={j}" for n, j in declared.items())
        problems.append(
            Problem(
                "jurisdiction",
                shown,
                "one jurisdiction for every pod set of the workload (its pods serve as one engine)",
                True,
                "the pod templates' annotations",
            )
        )
    values: dict[str, Any] = {}
    for attr, key in _SHARED.items():
        found = {name: getattr(d, attr) for name, d in named if getattr(d, attr) is not None}
        if len(set(found.values())) > 1:
            shown = ", ".join(f"{n}={v}" for n, v in found.items())
            problems.append(Problem(key, shown, "the same value on every pod set of the workload", False))
        values[attr] = next(iter(found.values()), None)
    return Declared(
        tenant=first.tenant,
        jurisdiction=next(iter(declared.values()), None),
        allowed_jurisdictions=first.allowed_jurisdictions,
        exclusive=any(d.exclusive for _, d in named),
        problems=tuple(dict.fromkeys(problems)),
        warnings=tuple(warnings),
        **values,
    )


_TEMPLATE_PLACES = ("the pod template's annotations", "the pod template's labels")


def _named(d: Declared, pod_set: str) -> Declared:
    """`d` with its template's problems named by their pod set (the namespace's and the owner's
    are the workload's, said once)."""
    return replace(
        d,
        problems=tuple(replace(p, pod_set=pod_set) if p.where in _TEMPLATE_PLACES else p for p in d.problems),
    )


def _number(
    raw: Mapping[str, str],
    key: str,
    problems: list[Problem],
    pattern: re.Pattern[str],
    low: float,
    high: float,
    open_low: bool = False,
) -> float | None:
    if key not in raw:
        return None
    text = raw[key]
    value = float(text) if pattern.fullmatch(text) else None
    if value is None or value > high or value < low or (open_low and value == low):
        spec = INPUTS[key]
        problems.append(Problem(key, text, spec.accepted, spec.sovereignty))
        return None
    return value


def _misplaced(
    found: Mapping[str, Any] | None, where: str, problems: list[Problem], warnings: list[str]
) -> None:
    """Our keys where they are not read: fail closed for sovereignty keys, warn for the rest."""
    for k in sorted(str(x) for x in (found or {})):
        if not k.startswith(PREFIX) or PREFIX + k[len(PREFIX) :] in OUTPUTS:
            continue
        key = k[len(PREFIX) :]
        value = str((found or {}).get(k, ""))
        if key in SOVEREIGNTY_KEYS or _looks_sovereign(key):
            problems.append(
                Problem(
                    key,
                    value,
                    f"found on {where}, where it is not read: put it on the pod template's annotations "
                    "(spec.template.metadata.annotations); sovereignty keys fail closed",
                    True,
                    where,
                )
            )
        elif key in INPUTS:
            warnings.append(
                f"{k} on {where} is not read; put it on the pod template's annotations "
                "(spec.template.metadata.annotations)"
            )


def _normal(key: str) -> str:
    return re.sub(r"[^a-z0-9]", "", key.lower())


@functools.lru_cache(maxsize=4096)
def _looks_sovereign(key: str) -> bool:
    n = _normal(key)
    return any(w in n for w in _SOVEREIGN_WORDS) or any(
        _distance(n, _normal(s)) <= 2 for s in SOVEREIGNTY_KEYS
    )


@functools.lru_cache(maxsize=4096)
def _closest(key: str) -> str | None:
    n = _normal(key)
    best = min(INPUTS, key=lambda k: _distance(n, _normal(k)))
    return best if _distance(n, _normal(best)) <= max(2, len(n) // 4) else None


def _distance(a: str, b: str) -> int:
    """Levenshtein distance (keys are short)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def _show(value: str) -> str:
    """A value as the user should see it: quoted, control characters visible, not too long."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "…'"
