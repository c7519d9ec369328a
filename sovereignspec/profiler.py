"""`sovereignspec profile --url http://ENGINE:8000 --model M`: measure step times of a running engine.

Drives an OpenAI-compatible engine (one of sovereignspec/engines/) with `concurrency` simultaneous streaming
completions of a fixed prompt length (token-id prompts, `ignore_eos`, exactly `output_tokens`
tokens each), at every point of a grid of concurrencies and prompt lengths, and writes the CSV that
`sovereignspec calibrate` reads: one row per point with the batch the engine reported running,
the mean context over the decode, the query tokens per sequence and the step time.

Every stream connects first and all send together, so that a point's requests join one batch. An
engine streams one chunk per request per step, so the step time is the interval between a request's
chunks, timed only while every request of the point is decoding (a robust slope per request, the
median over the requests); a point whose requests never all decoded at once is run again with a
longer decode, then refused, rather than filed as a batch it was not.

An engine that speculates verifies γ+1 query tokens per sequence and emits τ
tokens per step: its speculative counters (each engine's module reads its own) give both, and its TPOT is
step/τ. A plain engine has one query token and one token per step.

Everything runs from the standard library (threads and http.client), bounded by `max_seconds`.
"""

from __future__ import annotations

import http.client
import json
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from sovereignspec import engines
from sovereignspec.errors import ConfigError

# Token ids for prompts: common ids in every Llama-family vocabulary, away from the special ones.
PROMPT_IDS = (1000, 20000)


@dataclass(frozen=True)
class Point:
    """One measured point: what `calibrate` needs, and what it was measured from."""

    concurrency: int
    prompt_tokens: int
    batch: float  # the engine's running requests (the most it reported), or the concurrency
    context: float  # mean context over the decode
    query_tokens: float  # per sequence per step
    step_ms: float
    tpot_ms: float
    tokens_per_step: float  # τ (1 for a plain engine)
    kv_usage: float | None
    requests: int  # requests that completed


@dataclass
class Engine:
    """An engine endpoint: how to reach it and what it says about itself."""

    base: str
    host: str
    port: int
    timeout: float
    served_model: str = ""
    kind: str = "unknown"  # a registered engine's name, or unknown (from /metrics)
    has_metrics: bool = False
    scheme: str = "http"
    prompt_ids: tuple[int, int] = PROMPT_IDS  # [low, high) token ids the prompts are drawn from
    _families: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def at(url: str, timeout: float) -> Engine:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"--url: got {url!r}; accepted: http://HOST:PORT of an OpenAI-compatible engine"
            )
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return Engine(
            f"{parts.scheme}://{parts.hostname}:{port}", parts.hostname, port, timeout, scheme=parts.scheme
        )

    def connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=timeout or self.timeout)

    def get(self, path: str) -> tuple[int, bytes]:
        conn = self.connection()
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def probe(self, served_model: str | None) -> None:
        """Check that this is an engine: /v1/models lists a model; /metrics is read if present."""
        try:
            status, body = self.get("/v1/models")
        except OSError as exc:
            raise ConfigError(f"{self.base}: cannot connect: {exc}") from exc
        try:
            listed = [m["id"] for m in json.loads(body)["data"]] if status == 200 else []
        except (ValueError, KeyError, TypeError):
            listed = []
        if status != 200 or not listed:
            raise ConfigError(
                f"{self.base}: not an OpenAI-compatible engine: GET /v1/models answered {status} "
                f"{body[:80]!r}; accepted: a server of {' or '.join(e.name for e in engines.ENGINES)} "
                "(its API port, e.g. :8000)"
            )
        if served_model and served_model not in listed:
            raise ConfigError(f"--served-model: got {served_model!r}; accepted: one of {listed}")
        self.served_model = served_model or listed[0]
        metrics = self.metrics()
        self.has_metrics = metrics is not None
        if metrics:
            names = " ".join(metrics)
            self.kind = engines.kind_of(names)

    def metrics(self) -> dict[str, float] | None:
        """Every sample of /metrics summed over labels (name → value), or None without /metrics."""
        try:
            status, body = self.get("/metrics")
        except OSError:
            return None
        if status != 200:
            return None
        out: dict[str, float] = {}
        try:
            for family in text_string_to_metric_families(body.decode("utf-8", "replace")):
                for sample in family.samples:
                    out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
        except ValueError:
            return None
        return out


def _first(metrics: dict[str, float], names: Sequence[str], suffix: str = "") -> float | None:
    return next((metrics[n + suffix] for n in names if n + suffix in metrics), None)


class NotTogetherError(ConfigError):
    """A point's requests never all decoded in one batch (so its step is not that batch's)."""


@dataclass
class _Stream:
    arrivals: list[float] = field(default_factory=list)  # times of the chunks that carry tokens


def _stream_one(
    engine: Engine,
    prompt: list[int],
    tokens: int,
    out: _Stream,
    errors: list[str],
    start: threading.Barrier,
) -> None:
    """One streaming completion, recording when each token-carrying chunk arrives. The connection
    is opened first and the request sent only when every stream of the point is connected: threads
    and connections take a while to start, and requests trickling in would decode in smaller
    batches (at high concurrency, the first would finish before the last had joined)."""
    body = json.dumps(
        {
            "model": engine.served_model,
            "prompt": prompt,
            "max_tokens": tokens,
            "min_tokens": tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
        }
    )
    conn = engine.connection()
    try:
        try:
            conn.connect()
        except OSError as exc:
            errors.insert(0, f"connect: {exc}")
            start.abort()  # the others must not wait for a stream that will never start
            return
        try:
            start.wait()
        except threading.BrokenBarrierError:
            errors.append(f"not every stream connected within {engine.timeout:g} s")
            return
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            errors.append(f"POST /v1/completions answered {resp.status}: {resp.read()[:120]!r}")
            return
        _read_stream(resp, out, errors)
    except OSError as exc:
        errors.append(f"stream: {exc}")
    finally:
        conn.close()


def _read_stream(resp: Any, out: _Stream, errors: list[str]) -> None:
    """The server-sent events of one completion: when each chunk with tokens arrived; an error the
    engine put in the stream ends it."""
    while line := resp.readline():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        now = time.perf_counter()
        try:
            chunk = json.loads(data)
        except ValueError:
            continue
        if isinstance(chunk, dict) and chunk.get("error"):
            # An engine refuses some requests mid-stream with HTTP 200 (a token id out of the
            # vocabulary, for one): its own words are the error.
            error = chunk["error"]
            text = error.get("message", error) if isinstance(error, dict) else error
            errors.insert(0, f"the engine answered in the stream: {str(text)[:300]}")
            return
        if chunk.get("choices"):
            out.arrivals.append(now)


def measure(
    engine: Engine, concurrency: int, prompt_tokens: int, output_tokens: int, rng: random.Random
) -> Point:
    """One point: `concurrency` streams at once, the engine's gauges sampled while they decode."""
    before = engine.metrics() if engine.has_metrics else None
    streams = [_Stream() for _ in range(concurrency)]
    errors: list[str] = []
    start = threading.Barrier(concurrency, timeout=engine.timeout)
    threads = [
        threading.Thread(
            target=_stream_one,
            args=(
                engine,
                [rng.randrange(*engine.prompt_ids) for _ in range(prompt_tokens)],
                output_tokens,
                st,
                errors,
                start,
            ),
            daemon=True,
        )
        for st in streams
    ]
    for t in threads:
        t.start()
    running, kv = _sample_gauges(engine, threads)
    if errors:
        raise ConfigError(f"{engine.base}: {errors[0]} ({len(errors)} of {concurrency} requests failed)")
    full = [st.arrivals for st in streams if len(st.arrivals) >= 3]
    step = _step_seconds(engine.base, full, concurrency, prompt_tokens, output_tokens)
    after = engine.metrics() if engine.has_metrics else None
    query, tau = _speculation(before, after, concurrency * output_tokens)
    return Point(
        concurrency=concurrency,
        prompt_tokens=prompt_tokens,
        # The steps are timed while the whole point decodes, so the batch holds every request of the
        # point, plus any other traffic the engine reported (profile an engine of its own). A gauge
        # sampled every 50 ms can miss a short decode altogether (the real engine in the tests read 0).
        batch=max(max(running, default=0.0), float(concurrency)),
        context=prompt_tokens + output_tokens / 2,
        query_tokens=query,
        step_ms=1e3 * step,
        tpot_ms=1e3 * step / tau,
        tokens_per_step=tau,
        kv_usage=max(kv) if kv else None,
        requests=len(full),
    )


def _sample_gauges(engine: Engine, threads: list[threading.Thread]) -> tuple[list[float], list[float]]:
    """The engine's running requests and KV usage, sampled while the point's streams decode."""
    running: list[float] = []
    kv: list[float] = []
    while any(t.is_alive() for t in threads):
        if engine.has_metrics and (m := engine.metrics()):
            if (r := _first(m, engines.gauges("running"))) is not None:
                running.append(r)
            if (u := _first(m, engines.gauges("kv_usage"))) is not None:
                kv.append(u)
        time.sleep(0.05)  # 20 samples a second: enough to catch the full batch, light on the engine
    return running, kv


def _step_seconds(
    base: str, full: list[list[float]], concurrency: int, prompt_tokens: int, output_tokens: int
) -> float:
    """The step, from each request's chunk arrival times (`full`: those with at least 3 chunks).
    An engine streams one chunk per request per step (τ tokens in it when it speculates); the steps
    are timed only while every request of the point is decoding, so that stragglers joining late
    and early finishers do not mix smaller batches in."""
    if len(full) < concurrency:
        raise ConfigError(
            f"{base}: {concurrency - len(full)} of {concurrency} requests streamed fewer than 3 chunks"
        )
    lo, hi = max(a[1] for a in full), min(a[-1] for a in full)
    limits = " or ".join(f"{e.name}'s {e.batch_limit}" for e in engines.ENGINES)
    steps = []
    for a in full:
        inside = [t for t in a if lo <= t <= hi]
        if len(inside) < 3:
            # No common window: the batch this request decoded in was never the point's. A number
            # from it would be a smaller batch's step filed under this one.
            raise NotTogetherError(
                f"{base}: at concurrency {concurrency}, prompt {prompt_tokens}: the requests "
                f"never all decoded together (the first finished before the last had joined: the engine "
                f"caps its batch, e.g. {limits}, or the decode is too short); accepted: a "
                f"concurrency within the engine's batch limit, or more --output-tokens ({output_tokens} here)"
            )
        # The median of the slopes across half the window: a chunk that arrives late (the engine's
        # or this host's scheduler) shifts one slope in a dozen, not the end point of the only one.
        half = len(inside) // 2
        steps.append(
            statistics.median((inside[i + half] - inside[i]) / half for i in range(len(inside) - half))
        )
    return statistics.median(steps)


def _measure_together(
    engine: Engine,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    rng: random.Random,
    progress: TextIO,
) -> Point:
    """`measure`, with the decode doubled (twice at most) when the requests did not all join before
    the first finished: a busy client or engine host staggers their start."""
    for attempt in range(2):
        try:
            return measure(engine, concurrency, prompt_tokens, output_tokens << attempt, rng)
        except NotTogetherError:
            print(
                f"\nprofile: concurrency {concurrency}, prompt {prompt_tokens}: the requests did not all "
                f"decode together; again with {output_tokens << (attempt + 1)} output tokens",
                file=progress,
            )
    return measure(engine, concurrency, prompt_tokens, output_tokens << 2, rng)


def _speculation(
    before: dict[str, float] | None, after: dict[str, float] | None, tokens: int
) -> tuple[float, float]:
    """(query tokens per sequence per step, tokens per step) over the point, from the engine's
    speculative counters and the `tokens` the point's sequences produced; (1, 1) for an engine
    that does not speculate.

    Each engine's module reads its own counters (`Engine.step_tokens`)."""
    if not before or not after:
        return 1.0, 1.0
    return engines.step_tokens(before, after, tokens)


def run(
    engine: Engine,
    concurrency: Sequence[int],
    prompt_tokens: Sequence[int],
    output_tokens: int,
    max_seconds: float,
    repeats: int = 1,
    progress: TextIO = sys.stderr,
    clock: Callable[[], float] = time.monotonic,
    seed: int = 0,
) -> list[Point]:
    """Every point of the grid, shortest prompts and smallest batches first, until the budget ends."""
    grid = [(c, p) for p in sorted(prompt_tokens) for c in sorted(concurrency)]
    start = clock()
    rng = random.Random(seed)
    points: list[Point] = []
    for i, (c, p) in enumerate(grid, start=1):
        if clock() - start > max_seconds:
            print(
                f"\nprofile: time budget of {max_seconds:.0f} s spent; {len(grid) - i + 1} points skipped",
                file=progress,
            )
            break
        # Each point `repeats` times, the median kept: a hiccup of the host spoils one run, not the point.
        runs = sorted(
            (_measure_together(engine, c, p, output_tokens, rng, progress) for _ in range(repeats)),
            key=lambda x: x.step_ms,
        )
        point = runs[len(runs) // 2]
        points.append(point)
        done = int(30 * i / len(grid))
        print(
            f"\r[{'#' * done}{'.' * (30 - done)}] {i}/{len(grid)}  batch {point.batch:g}  prompt {p}  "
            f"step {point.step_ms:.2f} ms",
            end="",
            file=progress,
            flush=True,
        )
    print(file=progress)
    return points


def render_csv(points: Sequence[Point], engine: Engine, model: str, now: str) -> str:
    lines = [
        f"# source: sovereignspec profile of {engine.base} ({engine.kind} engine serving "
        f"{engine.served_model!r} as {model}) on {now}",
        "# rows: one per point of concurrency x prompt length; batch = the engine's running requests,",
        "#   context = prompt + half the output, step_ms = the interval between a request's streamed chunks"
        " (one per step) while all of the point decode",
        "# measured: "
        + "; ".join(
            f"c{p.concurrency}/p{p.prompt_tokens}: tpot {p.tpot_ms:.3f} ms, tau {p.tokens_per_step:.3f}"
            + (f", kv {p.kv_usage:.3f}" if p.kv_usage is not None else "")
            for p in points
        ),
        "batch,context,query_tokens,step_ms",
    ]
    lines += [f"{p.batch:g},{p.context:g},{p.query_tokens:.4g},{p.step_ms:.4f}" for p in points]
    return "\n".join(lines) + "\n"


def summary(points: Sequence[Point]) -> dict[str, Any]:
    return {"points": len(points), "requests": sum(p.requests for p in points)}
