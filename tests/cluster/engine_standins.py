"""Stand-ins for a vLLM and an SGLang server's /metrics, with only the labels the engines put on
their own series (model_name, engine), plus a forged `namespace` label that must not count."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from localdev.operator import _serve_text_format
from sovereignspec.core.speedup import tau

BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
FORGED = "someone-else"  # what a hostile engine claims as its namespace


class EngineStandIn:
    def __init__(self, kind: str, model: str, alpha: float, gamma: int, seconds_per_token: float) -> None:
        self.kind, self.model, self.alpha, self.gamma, self.seconds = (
            kind,
            model,
            alpha,
            gamma,
            seconds_per_token,
        )
        r = self.registry = CollectorRegistry()
        own = ["model_name", "engine", "namespace"]
        if kind == "vllm":
            self.drafts = Counter("vllm:spec_decode_num_drafts", "drafts", own, registry=r)
            self.drafted = Counter("vllm:spec_decode_num_draft_tokens", "draft tokens", own, registry=r)
            self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "accepted", own, registry=r)
            self.per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos", "per position", [*own, "position"], registry=r
            )
            self.tpot = Histogram(
                "vllm:request_time_per_output_token_seconds",
                "TPOT per request",
                own,
                buckets=BUCKETS,
                registry=r,
            )
        else:
            length = Gauge("sglang:spec_accept_length", "accept length", own, registry=r)
            rate = Gauge("sglang:spec_accept_rate", "accept rate", own, registry=r)
            t = float(tau(alpha, gamma))
            length.labels(model, "sglang", FORGED).set(t)
            rate.labels(model, "sglang", FORGED).set(
                (t - 1) / gamma
            )  # accepted drafts / proposed (PR #23530)
            self.tpot = Histogram(
                "sglang:request_time_per_output_token_seconds",
                "TPOT per request",
                own,
                buckets=BUCKETS,
                registry=r,
            )
            # One ITL sample per output event, which carries τ tokens under speculation: not a TPOT.
            self.itl = Histogram(
                "sglang:inter_token_latency_seconds", "ITL", own, buckets=BUCKETS, registry=r
            )
            self.event_seconds = seconds_per_token * t
        self.life_tokens = 0.0  # draft tokens counted since the last restart
        self.earlier_tokens = 0.0  # and before it
        self._lock = threading.Lock()
        self._server = _serve_text_format(self.registry, self._lock)
        self.port = self._server.server_address[1]
        self._stop = threading.Event()
        self._feeder = threading.Thread(target=self._feed, daemon=True)
        self._feeder.start()

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _feed(self) -> None:
        labels = (self.model, self.kind, FORGED)
        while not self._stop.wait(0.25):
            with self._lock:
                for _ in range(20):
                    self.tpot.labels(*labels).observe(self.seconds)
                if self.kind != "vllm":
                    for _ in range(20):
                        self.itl.labels(*labels).observe(self.event_seconds)
                    continue
                n = 250
                self.life_tokens += n * self.gamma
                self.drafts.labels(*labels).inc(n)
                self.drafted.labels(*labels).inc(n * self.gamma)
                for pos in range(self.gamma):
                    accepted = n * self.alpha ** (pos + 1)
                    self.per_pos.labels(*labels, str(pos)).inc(accepted)
                    self.accepted.labels(*labels).inc(accepted)

    def restart(self) -> None:
        """As an engine process restarted in place: every counter and histogram starts again from
        nothing on the same endpoint (Prometheus sees the values fall: a reset)."""
        with self._lock:
            self.earlier_tokens += self.life_tokens
            self.life_tokens = 0.0
            for metric in (
                getattr(self, n, None) for n in ("drafts", "drafted", "accepted", "per_pos", "tpot", "itl")
            ):
                if metric is not None:
                    metric.clear()

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
