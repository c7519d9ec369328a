"""The simulator's state: requests, the sequences decoding them, replicas and GPUs (plain slotted
records, mutated by the loop in `loop`)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from sovereignspec.sim.worlds import Draft, World


@dataclass(slots=True)
class Request:
    id: int
    tenant: int
    arrival: float
    prompt: int
    output: int
    alpha: float
    replica: int = -1
    t_first: float = math.nan
    t_finish: float = math.nan
    speculated: bool = False  # its own replica drafted while it decoded
    drafts: int = 0  # verification steps with drafts
    first_accepted: int = 0  # of those, steps whose first drafted token was accepted


@dataclass(slots=True)
class Seq:
    req: Request
    gamma: int
    draws: np.ndarray | None  # tokens emitted by each step under `gamma` (None: plain, one per step)
    cum: np.ndarray | None  # cumulative tokens after each step
    base: int  # tokens emitted before the current draws
    steps_total: int  # steps these draws need to finish the request
    start: int = 0  # the GPU's step counter when these draws began
    version: int = 0


@dataclass(slots=True)
class Replica:
    id: int
    tenant: int
    gpu: int
    gamma: int  # assigned at placement
    current: int  # in effect now
    draft: Draft | None  # what its drafting costs in this world (None: no drafter)
    queue: deque[Request] = field(default_factory=deque)
    cap: int = 1  # the tenant's max-num-seqs
    by_batch: list[int] = field(default_factory=list)  # γ per batch size 0..cap (own_batch_only policies)
    armed: bool = False  # its engine runs a table with a K > 0: a draft pass even where K = 0
    active: int = 0
    busy: int = 0  # active + queued: what arrivals are routed by
    slot: int = 0  # its place among its tenant's replicas (placement order)
    alpha_est: float = 0.6
    switched_off: bool = False  # for acceptance-threshold policies
    predicted_tpot_s: float | None = None  # what the placing policy predicted (until TPOT is measured)
    # Its requests' TPOT as the engine's histogram shows it (prefill stalls and all), a running mean
    # over finished requests: what the operator reads from Prometheus. None until one finishes.
    tpot_measured_s: float | None = None


@dataclass(slots=True)
class Gpu:
    id: int
    node: str
    index: int
    gpu_type: str
    jurisdiction: str | None
    world: World
    replicas: list[int] = field(default_factory=list)
    seqs: dict[int, Seq] = field(default_factory=dict)  # by request id
    finishing: list[tuple[int, int, int]] = field(default_factory=list)  # heap of (step, request, version)
    superseded: int = 0  # entries in `finishing` left behind by a γ change
    steps: int = 0  # decode steps run so far
    t0: float = 0.0  # start of the next step
    step: float = 0.0
    watts: tuple[float, float] = (0.0, 0.0)  # idle, peak
    power: float = 0.0  # watts while the current step runs
    version: int = 0
    ctx_sum: float = 0.0
    n_tokens: int = 0  # query tokens per decode step: Σ (γ + 1) over running sequences
    running: dict[int, int] = field(default_factory=dict)  # replica -> running sequences
    waiting: int = 0  # requests queued at this GPU's replicas
    regamma: set[int] = field(default_factory=set)  # replicas whose batch now calls for another γ
    busy_energy: float = 0.0  # joules while decoding
    busy_time: float = 0.0
    samples: list[tuple[float, float]] = field(default_factory=list)  # (time, headroom)
