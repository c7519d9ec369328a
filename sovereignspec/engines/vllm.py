"""vLLM (>= 0.24; read against 0.32 and 0.33).

Configuration: one `--speculative-config` JSON with the method, the draft checkpoint,
`num_speculative_tokens` and `num_speculative_tokens_per_batch_size`, the per-batch table its
scheduler reads (inclusive `[first batch, last batch, K]` ranges starting at batch 1; K is clamped
to `num_speculative_tokens` at run time and the last range's K holds for larger batches). Older
vLLM rejects the unknown key: `sovereignspec launch --vllm-legacy` drops it.

At K = 0 of its table it stays armed: vLLM 0.32 (`v1/spec_decode/llm_base_proposer.py`, "Dynamic SD
decided K=0") runs the drafter's first forward pass to keep its KV cache in sync and returns no
drafts, so a K = 0 row pays a draft pass and the machinery (`core.speedup`'s `armed`).

Metrics (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py): the v1 engine's
`spec_decode_num_*` counters, per draft position too; per-request TPOT histograms.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import cast

from sovereignspec.core.handoff import Table
from sovereignspec.core.speedup import alpha_from_draft_acceptance
from sovereignspec.engines.base import Key, Metrics, MetricsReader, Option
from sovereignspec.engines.vllm_launch import VLLM_CONFIG, VLLM_PER_BATCH

CONFIG = VLLM_CONFIG  # the annotation `launch` turns into --speculative-config
PER_BATCH = VLLM_PER_BATCH
SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


class Vllm:
    name = "vllm"
    outputs: tuple[str, ...] = (CONFIG,)
    takes_table = True
    batch_limit = "--max-num-seqs"
    options: tuple[Option, ...] = ()  # its counters mean the same in every version read
    metrics = Metrics(
        prefix="vllm:",
        tpot=(
            ("vllm:request_time_per_output_token_seconds",),
            ("vllm:time_per_output_token_seconds",),
            ("vllm:inter_token_latency_seconds",),
        ),
        running=("vllm:num_requests_running",),
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        drafted=("vllm:spec_decode_num_draft_tokens_total",),
        drafts=("vllm:spec_decode_num_drafts_total",),
    )

    def configure(self, method: str, draft: str, gamma: int, top: int, table: Table | None) -> dict[str, str]:
        doc: dict[str, object] = {"method": method, "num_speculative_tokens": top}
        if draft:
            doc["model"] = draft
        if method == "ngram":
            doc.update({"prompt_lookup_min": 2, "prompt_lookup_max": 5})
        if table and len(table) > 1:
            doc[PER_BATCH] = table
        return {CONFIG: json.dumps(doc, separators=(",", ":"), sort_keys=True)}

    def handed_table(self, notes: Mapping[str, str]) -> Table | None:
        text = notes.get(CONFIG)
        return cast(Table, json.loads(text).get(PER_BATCH) or []) if text else None

    def acceptance(
        self, reader: MetricsReader, by: str, at: float, options: Mapping[str, str]
    ) -> dict[Key, tuple[float, float]]:
        """α is the first draft position's acceptance (accepted_tokens_per_pos{position="0"} /
        drafts) when the per-position counter is there; otherwise it is recovered from accepted /
        drafted tokens at the mean draft length drafted / drafts. Weighted by the draft tokens."""
        bad: set[Key] = set()

        def totals(metric: str, extra: str = "") -> dict[Key, float]:
            out: dict[Key, float] = {}
            for labels, value, _ in reader.query(
                f"sum by ({by}) (increase({metric}{extra}[{reader.window}]))", at
            ):
                key = (labels.get("namespace", ""), labels.get("model_name", ""))
                if not math.isfinite(value) or value < 0 or key in out:
                    bad.add(key)
                out[key] = value
            return out

        drafts = totals("vllm:spec_decode_num_drafts_total")
        draft_tokens = totals("vllm:spec_decode_num_draft_tokens_total")
        accepted = totals("vllm:spec_decode_num_accepted_tokens_total")
        first = totals("vllm:spec_decode_num_accepted_tokens_per_pos_total", '{position="0"}')
        out: dict[Key, tuple[float, float]] = {}
        for key, tokens in draft_tokens.items():
            n = drafts.get(key, 0.0)
            if key in bad or tokens <= 0 or n <= 0:
                continue
            # Counters that contradict each other are not evidence: more accepted than drafted,
            # more first-position acceptances than drafts, fewer draft tokens than drafts.
            slack = 1.0 + 1e-6  # increase() extrapolates each counter on its own
            if (
                accepted.get(key, 0.0) > tokens * slack
                or first.get(key, 0.0) > n * slack
                or tokens < n / slack
            ):
                reader.reject("inconsistent-counters")
                continue
            if key in first:
                out[key] = (min(first[key] / n, 1.0), tokens)
            elif key in accepted:
                out[key] = (alpha_from_draft_acceptance(accepted[key] / tokens, round(tokens / n)), tokens)
        if bad:
            reader.reject("invalid-counters", len(bad))
        return out

    def step_tokens(
        self, before: Mapping[str, float], after: Mapping[str, float], tokens: int
    ) -> tuple[float, float] | None:
        """Per step, not per draft: vLLM counts a draft only on the steps that drafted (ngram drafts
        where the text repeats), and a step that did not draft still verified one token and yielded
        one. Each step of a sequence yields one token plus the drafts it accepted, so the point's
        sequence-steps are its tokens less the accepted drafts (chunks are no count of them: a
        lagging client gets several steps merged into one)."""
        drafts, drafted, accepted = (
            after.get(n + "_total", 0.0) - before.get(n + "_total", 0.0) for n in SPEC_COUNTERS
        )
        if drafts > 0 and drafted >= 0 and 0 <= accepted <= drafted and tokens - accepted >= drafts:
            steps = tokens - accepted
            return 1.0 + drafted / steps, tokens / steps
        return None


ENGINE = Vllm()
