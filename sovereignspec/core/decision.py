"""The decision record: every term behind one placement, so a user can see why.

The operator writes a summary of it into the admission check's message and the whole of it into a
Kubernetes Event; the CLI prints it. It is plain data (JSON-ready through `to_dict`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Outcome = Literal["placed", "retry", "rejected"]
Mode = Literal["speculative", "plain"]


# Not frozen: a tick builds one per pending workload, and a frozen dataclass's __init__ costs four
# times as much (object.__setattr__ per field). Nothing changes a record once made (`replace`).
@dataclass(slots=True)
class DecisionRecord:
    workload: str
    tenant: str
    outcome: Outcome
    mode: Mode
    gamma: int
    reason: str
    node: str | None = None
    gpu_index: int | None = None
    gpu_type: str | None = None
    alpha: float | None = None  # as the scheduler used it
    headroom: float | None = None  # observed reading, less what placements declare; None: no telemetry
    headroom_measured: float | None = None  # the reading alone
    headroom_pessimistic: float | None = None
    background_seqs: float | None = None  # the load the reading maps to
    tau: float | None = None
    step_plain_ms: float | None = None
    step_ms: float | None = None
    step_before_ms: float | None = None  # the GPU's step before the workload joins
    speedup: float | None = None  # own S_real at γ*
    aggregate_speedup: float | None = None
    tpot_ms: float | None = None
    unconstrained_gamma: int | None = None
    binding_neighbour: str | None = None
    neighbour_step_ratio: float | None = None  # T_step(γ*) / T_before
    neighbour_slo_ratio: float | None = None  # q = min slo/tpot over neighbours
    # The compute ridge on that GPU at the workload's context, in plain sequences, at the low end,
    # the estimate and the high end of the calibrated compute efficiency; inf: memory-bound at any load.
    ridge_seqs: tuple[float, float, float] | None = None
    candidates: int = 0
    excluded: dict[str, str] = field(default_factory=dict)  # node -> constraint: detail
    # candidate GPUs where speculation would have paid but a neighbour's SLO said no: gpu -> why
    held_back: dict[str, str] = field(default_factory=dict)
    # A workload whose pods span nodes: (node, GPU index, γ there) per pod, and the node labels that
    # pin them (every node those labels select is one the workload may use); empty on one node.
    pods: tuple[tuple[str, int, int], ...] = ()
    node_selector: dict[str, str] | None = None
    # Pods spread with each pod set on one node: that node per pod set, in order (each pinned by
    # hostname, nothing else held); None: pinned by `node_selector`, or on one node.
    pod_set_nodes: tuple[str, ...] | None = None

    @property
    def step_limit_s(self) -> float:
        """The longest shared step the neighbours' TPOT SLOs allow, seconds (inf without any)."""
        q, before = self.neighbour_slo_ratio, self.step_before_ms
        if q is None or before is None or not math.isfinite(q):
            return math.inf
        return q * before / 1e3

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)

        # JSON has no infinity; a GPU with no neighbours has no SLO bound, a context no ridge.
        def finite(v: Any) -> Any:
            if isinstance(v, float) and not math.isfinite(v):
                return None
            return [finite(x) for x in v] if isinstance(v, (tuple, list)) else v

        return {k: finite(v) for k, v in data.items()}

    def summary(self) -> str:
        """One line for the admission check's message (Kueue caps messages; keep it short)."""
        if self.outcome != "placed":
            return f"{self.outcome}: {self.reason}"
        where = f"{self.node}/gpu{self.gpu_index} ({self.gpu_type})"
        if self.mode == "speculative":
            return (
                f"speculative γ={self.gamma} on {where}: predicted S_real {self.speedup:.2f}, "
                f"TPOT {self.tpot_ms:.1f} ms{self._ridge()}; {self.reason}"
            )
        return f"plain on {where}{self._ridge()}: {self.reason}"

    def _ridge(self) -> str:
        """The ridge with its interval, where the load could reach it."""
        if self.ridge_seqs is None or not math.isfinite(self.ridge_seqs[1]):
            return ""
        low, estimate, high = self.ridge_seqs
        span = "" if low == high else f" [{low:.0f}-{'∞' if math.isinf(high) else f'{high:.0f}'}]"
        return f", compute ridge {estimate:.0f}{span} seqs"
