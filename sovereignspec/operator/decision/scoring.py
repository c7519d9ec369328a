"""Every decision scored: the TPOT a workload was predicted when it was decided (our
`predicted-tpot-ms` annotation, written beside the decision) against the TPOT its engine reports
now, per running workload and per profile (GPU type, target model).

The error is signed and relative, measured / predicted − 1: +0.30 is an engine 30 % slower than the
profile said, which is the direction that costs neighbours. A profile whose errors leave the
policy's bound prices its GPU wrongly; the controller says so (metrics, a Warning Event per
workload). Nothing here changes a decision.

No I/O: plain data in, plain data out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from statistics import median

from sovereignspec.operator.decision.ledger import Committed


@dataclass(frozen=True)
class Scored:
    """One running workload's prediction against its engine's report."""

    committed: Committed
    gpu_type: str
    predicted_s: float
    measured_s: float

    @property
    def error(self) -> float:
        return self.measured_s / self.predicted_s - 1.0

    @property
    def profile(self) -> tuple[str, str]:
        return self.gpu_type, self.committed.request.model


@dataclass(frozen=True)
class ProfileScore:
    gpu_type: str
    model: str
    workloads: int
    median_error: float
    worst_error: float  # the error furthest from 0, with its sign


def score(
    committed: Iterable[Committed],
    measured: Mapping[tuple[str, str], float],
    gpu_types: Mapping[tuple[str, int], str],
) -> tuple[list[Scored], list[ProfileScore]]:
    """Each workload of the ledger that has both a prediction and an engine's TPOT (`measured`:
    (namespace, job) -> seconds), once (a spread workload by its first pod's GPU), and the
    profiles' scores over them, by (GPU type, model)."""
    scored: list[Scored] = []
    seen: set[str] = set()
    for c in committed:
        if c.key in seen:
            continue
        predicted = c.predicted_tpot_s
        now = measured.get((c.namespace, c.job))
        gpu_type = gpu_types.get((c.node, c.gpu_index))
        # A prediction or a reading that is no positive number scores nothing (never a division by it).
        if predicted is None or not predicted > 0.0 or now is None or not now > 0.0 or gpu_type is None:
            continue
        seen.add(c.key)
        scored.append(Scored(c, gpu_type, predicted, now))
    by_profile: dict[tuple[str, str], list[float]] = {}
    for s in scored:
        by_profile.setdefault(s.profile, []).append(s.error)
    profiles = [
        ProfileScore(gpu, model, len(errors), median(errors), max(errors, key=abs))
        for (gpu, model), errors in sorted(by_profile.items())
    ]
    return scored, profiles
