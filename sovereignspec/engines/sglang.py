"""SGLang (read against its main branch as of 2026-11).

Configuration: the algorithm flags; for EAGLE/EAGLE3 with top-k 1 its adaptive mode
(`--speculative-adaptive` plus a JSON file of per-batch `candidate_steps`, keyed by each range's
first batch size); NGRAM drafts a chain of γ tokens (BFS breadth 1), the shape the model prices.

Metrics: `spec_accept_length` (τ) and `spec_accept_rate` gauges, whose meaning changed with PR
#23530 (the policy's `sglangAcceptRate` says which a cluster runs); no token counters.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from sovereignspec.core.handoff import Table
from sovereignspec.core.speedup import alpha_from_draft_acceptance
from sovereignspec.engines.base import Key, Metrics, MetricsReader, Option
from sovereignspec.engines.sglang_launch import SGLANG_ADAPTIVE, SGLANG_ARGS

ARGS = SGLANG_ARGS  # the flags `launch` appends
ADAPTIVE = SGLANG_ADAPTIVE  # the file `launch` writes for --speculative-adaptive-config
# Its adaptive mode runs only these algorithms, and only with top-k 1
# (python/sglang/srt/speculative/adaptive_spec_params.py: adaptive_unsupported_reason).
ADAPTIVE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3"})
ACCEPT_LENGTH = "sglang:spec_accept_length"


class Sglang:
    name = "sglang"
    outputs: tuple[str, ...] = (ARGS, ADAPTIVE)
    takes_table = True  # in its adaptive mode only (ADAPTIVE_ALGORITHMS)
    batch_limit = "--max-running-requests"
    # Its spec_accept_rate gauge changed meaning with PR #23530 (merged 2026-04-23): accepted drafts
    # over proposed drafts, (τ-1)/γ. Before, (accepted + 1)/(proposed + 1) per step: τ/(γ+1).
    options: tuple[Option, ...] = (
        Option(
            field="sglangAcceptRate",
            key="accept_rate",
            accepted=("drafts", "tokens-with-bonus"),
            meaning="drafts (SGLang with PR #23530) or tokens-with-bonus (SGLang before it)",
        ),
    )
    metrics = Metrics(
        prefix="sglang:",
        tpot=(
            ("sglang:request_time_per_output_token_seconds",),
            ("sglang:time_per_output_token_seconds",),
            ("sglang:inter_token_latency_seconds",),
        ),
        running=("sglang:num_running_reqs",),
        kv_usage=("sglang:token_usage",),
        # No counter of draft tokens: its speculation is seen only through gauges of the accept
        # length and rate, which hold their last value, so whether it drafts now is not watched.
    )

    def configure(self, method: str, draft: str, gamma: int, top: int, table: Table | None) -> dict[str, str]:
        adaptive = ""
        steps = gamma  # a fixed γ unless the adaptive mode reads the table
        if table and method in ADAPTIVE_ALGORITHMS:
            adaptive = _json({str(lo): {"candidate_steps": _candidates(k)} for lo, _, k in table})
            steps = top
        flags = ""
        if steps > 0:
            words = [f"--speculative-algorithm {method}"]
            if draft:
                words.append(f"--speculative-draft-model-path {draft}")
            if method == "NGRAM":
                # A chain, not a tree: breadth 1 drafts γ tokens in a row.
                words += ["--speculative-ngram-min-bfs-breadth 1", "--speculative-ngram-max-bfs-breadth 1"]
            else:
                words += [f"--speculative-num-steps {steps}", "--speculative-eagle-topk 1"]
            words.append(f"--speculative-num-draft-tokens {steps + 1}")
            flags = " ".join(words)
        # "" flags under a speculative decision: this drafter runs at a fixed γ, 0 at the declared
        # batch (`launch` says so and starts the engine plain).
        return {ARGS: flags, **({ADAPTIVE: adaptive} if adaptive else {})}

    def handed_table(self, notes: Mapping[str, str]) -> Table | None:
        return None  # its adaptive file holds candidates per range, not the budget

    def acceptance(
        self, reader: MetricsReader, by: str, at: float, options: Mapping[str, str]
    ) -> dict[Key, tuple[float, float]]:
        """spec_accept_length is τ, the tokens a verification step yields (accepted drafts and the
        bonus token), the same in every version; spec_accept_rate gives γ, with the version's
        meaning (`options["accept_rate"]`): accepted drafts over proposed drafts, (τ-1)/γ, since
        SGLang's PR #23530 ("drafts"); τ/(γ+1) before it ("tokens-with-bonus"). τ at that γ inverts
        to the per-token α. Neither gauge alone is α. It reports no token counts: the prior's
        weight (-1)."""
        w = reader.window
        drafts_meaning = options.get("accept_rate", "drafts") == "drafts"
        length = {
            _key(labels): v
            for labels, v, _ in reader.query(f"avg by ({by}) (avg_over_time({ACCEPT_LENGTH}[{w}]))", at)
        }
        out: dict[Key, tuple[float, float]] = {}
        for labels, rate, _ in reader.query(
            f"avg by ({by}) (avg_over_time(sglang:spec_accept_rate[{w}]))", at
        ):
            key = _key(labels)
            tau_ = length.get(key)
            if tau_ is None:
                continue
            if not (0.0 <= rate <= 1.0 and tau_ >= 1.0 and math.isfinite(tau_)):  # also false for NaN
                reader.reject("out-of-range")
                continue
            if drafts_meaning:
                if tau_ - 1.0 < 1e-9 and rate == 0.0:
                    out[key] = (0.0, -1.0)  # no draft accepted, at whatever γ
                    continue
                gamma = round((tau_ - 1.0) / rate) if rate > 0 else 0
            else:
                gamma = round(tau_ / rate) - 1 if rate > 0 else 0
            if gamma < 1 or tau_ > gamma + 1 + 1e-6:
                reader.reject("inconsistent-counters")
                continue
            out[key] = (alpha_from_draft_acceptance((tau_ - 1.0) / gamma, gamma), -1.0)
        return out

    def step_tokens(
        self, before: Mapping[str, float], after: Mapping[str, float], tokens: int
    ) -> tuple[float, float] | None:
        """It exports τ but not γ: the verified tokens per step are its configured draft tokens,
        not in /metrics; τ counts as both (a lower bound on the query tokens)."""
        length = after.get(ACCEPT_LENGTH)
        return (length, length) if length and length > 1.0 else None


def _candidates(k: int) -> list[int]:
    """Steps to choose from at one batch range: up to K, a few (each one is a CUDA graph)."""
    return sorted({1, (k + 1) // 2, k}) if k > 0 else [0]


def _key(labels: dict[str, str]) -> Key:
    return (labels.get("namespace", ""), labels.get("model_name", ""))


def _json(doc: object) -> str:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


ENGINE = Sglang()
