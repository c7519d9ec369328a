"""An OpenAI-compatible engine on loopback as the tests talk to it: its /metrics read back, and
greedy completions sent at a fixed concurrency (tests/engine: a `vllm serve` process; tests/pod_e2e:
the same engine in a Pod on the host's network)."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

SERVED = "llama-3.1-8b"  # the profile's model name: what the operator decides for and Prometheus keys
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return str(response.read().decode())


@dataclass
class EngineClient:
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> dict[str, float]:
        """Every sample, summed over label sets except `position` (kept as name{position="N"})."""
        out: dict[str, float] = {}
        for line in get(self.url + "/metrics").splitlines():
            m = SAMPLE.match(line)
            if not m:
                continue
            position = re.search(r'position="(\d+)"', m.group("labels") or "")
            key = m.group("name") + (f'{{position="{position.group(1)}"}}' if position else "")
            out[key] = out.get(key, 0.0) + float(m.group("value"))
        return out

    def complete(self, concurrency: int, tokens: int = 64, prompt_tokens: int = 16) -> dict[str, Any]:
        """`concurrency` greedy completions at once (ignore_eos: every one runs `tokens` steps, so
        the batch stays at `concurrency` until they all end together); the spec counters' change."""
        before = self.metrics()

        def one(i: int) -> int:
            # Word-level tokenizer: w<k> is token k + 3, all inside the vocabulary.
            prompt = " ".join(f"w{(i * 31 + j * 7) % 500}" for j in range(prompt_tokens))
            body = {
                "model": SERVED,
                "prompt": prompt,
                "max_tokens": tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            req = urllib.request.Request(
                self.url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=300) as response:
                return int(json.loads(response.read())["usage"]["completion_tokens"])

        with ThreadPoolExecutor(concurrency) as pool:
            produced = sum(pool.map(one, range(concurrency)))
        after = self.metrics()
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        drafts = delta.get("vllm:spec_decode_num_drafts_total", 0.0)
        drafted = delta.get("vllm:spec_decode_num_draft_tokens_total", 0.0)
        return {
            "tokens": produced,
            "drafts": drafts,
            "mean_draft_length": drafted / drafts if drafts else 0.0,
            "alpha_position0": delta.get(
                'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}', 0.0
            )
            / drafts
            if drafts
            else None,
            "accepted_per_drafted": delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) / drafted
            if drafted
            else None,
        }

    def scraped_by(self, query: Callable[[str], list[dict[str, Any]]], selector: str) -> bool:
        """Whether Prometheus's latest samples of this engine's spec-decode counters (its series
        matching `selector`) equal the engine's own values now: nothing it counted is unscraped."""
        mine = self.metrics()
        for name, extra in (
            ("vllm:spec_decode_num_drafts_total", ""),
            ("vllm:spec_decode_num_draft_tokens_total", ""),
            ("vllm:spec_decode_num_accepted_tokens_per_pos_total", ',position="0"'),
        ):
            seen = query(f"sum({name}{{{selector}{extra}}})")
            key = name + (f"{{{extra[1:]}}}" if extra else "")
            if not seen or float(seen[0]["value"][1]) != mine.get(key):
                return False
        return True
