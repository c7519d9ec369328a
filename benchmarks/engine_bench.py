"""`make bench-engine`: speculative decoding's realized speed-up, measured on a real engine.

vLLM's CPU build (hack/engine-env.sh) runs the same scheduler, speculative decoding and metrics as
on a GPU, and a CPU is a real roofline machine: weights stream from memory at its bandwidth while
its cores do the FLOPs, with a compute ridge at some batch. With a target large enough for both to
matter (random weights, benchmarks/engine_models.py: the later layers identities in function, a
draft of its first layers that the target always agrees with, and a perturbed one that it does not)
the transition the model predicts can be measured here.

For each drafter (the exact draft, the perturbed draft, ngram) a speculative engine runs beside a
plain one on the same target; at each batch level, plain and speculative runs alternate (their
order swapped every repeat) on the same prompts, every request generating the same number of
tokens (ignore_eos), so that the batch holds at its level while they decode. A request's time per
output token is its decode time (first token to last) over its tokens after the first; a run's is
the median of its requests'. S_real at a level is plain over speculative TPOT of each repeat's pair:
the median and the spread over repeats. τ (tokens per verification step) and α come from the
engine's own spec-decode counters over the level's runs.

The model's prediction beside it is learned the way the operator may learn it from plain traffic:
the step-time coefficients (`core.calibration.fit`) fitted to the plain engine's step times alone,
against this host's measured bandwidth and peak FLOP/s (numpy, `host_spec`); α from the acceptance
counters; the drafter's relative cost from its size (layers), none for ngram. The speculative runs
are held out: what the model is judged on.

Prints the table and writes it, with the raw runs, to `--out` (JSON and Markdown). Timings on a
shared machine vary: the spread is printed; no figure here is asserted by a test.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localdev.engine import engine_env, install, stop
from localdev.ports import free_port
from sovereignspec.core.calibration import Measurement, fit
from sovereignspec.core.roofline import roofline_for
from sovereignspec.core.specs import GpuSpec, ModelSpec
from sovereignspec.core.speedup import alpha_from_draft_acceptance, group_step_time, homogeneous_speedup, tau

HERE = Path(__file__).resolve().parent
SERVED = "bench"
PROMPT_TOKENS = 16
START_TIMEOUT = 600.0
SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def host_spec(seconds: float = 2.0) -> tuple[float, float]:
    """(peak FLOP/s, memory bandwidth in bytes/s) of this host as numpy reaches them: the best of
    repeated fp32 matrix products, and of copies of an array far larger than any cache (read and
    written: twice its bytes). The fit's efficiencies are fractions of these."""
    a = np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32)
    flops, deadline = 0.0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        a @ a
        flops = max(flops, 2 * 2048**3 / (time.perf_counter() - t0))
    src = np.ones(64 * 2**20, dtype=np.float32)  # 256 MiB
    dst = np.empty_like(src)
    bandwidth = 0.0
    for _ in range(6):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        bandwidth = max(bandwidth, 2 * src.nbytes / (time.perf_counter() - t0))
    return flops, bandwidth


def metrics(port: int) -> dict[str, float]:
    """The engine's samples, summed over label sets."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m:
            out[m.group("name")] = out.get(m.group("name"), 0.0) + float(m.group("value"))
    return out


@dataclass
class Engine:
    """One `vllm serve` of the target on loopback."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    started_s: float = 0.0

    def close(self) -> None:
        stop(self.proc)


def serve(
    python: Path, models: Path, name: str, spec: dict[str, Any] | None, work: Path, eager: bool, seqs: int
) -> Engine:
    port = free_port()
    log = work / f"vllm-{name}.log"
    command = [str(python.parent / "vllm"), "serve", str(models / "target"), "--served-model-name", SERVED,
               "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024",
               "--max-num-seqs", str(seqs), "--seed", "0", "--dtype", "float32"]  # fmt: skip
    if eager:
        command.append("--enforce-eager")
    if spec is not None:
        command += ["--speculative-config", json.dumps(spec)]
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=engine_env(python, work / "vllm-cache")
        )
    engine = Engine(name, port, proc, log)
    while time.monotonic() < t0 + START_TIMEOUT:
        if proc.poll() is not None:
            raise RuntimeError(f"engine {name} exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
            engine.started_s = time.monotonic() - t0
            return engine
        except OSError:
            time.sleep(1.0)
    engine.close()
    raise RuntimeError(f"engine {name} did not serve within {START_TIMEOUT:.0f}s:\n{log.read_text()[-4000:]}")


def prompt(i: int) -> str:
    """The i-th request's prompt (word-level tokens inside the vocabulary): the same for every engine."""
    return " ".join(f"w{(i * 31 + j * 7) % 500}" for j in range(PROMPT_TOKENS))


def _stream(
    port: int, i: int, tokens: int, out: list[tuple[float, float]], barrier: threading.Barrier
) -> None:
    body = json.dumps({"model": SERVED, "prompt": prompt(i), "max_tokens": tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True})  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    barrier.wait()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    first = last = 0.0
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        if b'"text":""' in line.replace(b" ", b""):
            continue
        last = time.perf_counter()
        first = first or last
    conn.close()
    out.append((first, last))


def run_batch(port: int, batch: int, tokens: int) -> dict[str, Any]:
    """`batch` streamed greedy requests at once; their decode TPOT and the spec counters' change."""
    before = metrics(port)
    times: list[tuple[float, float]] = []
    barrier = threading.Barrier(batch)
    threads = [threading.Thread(target=_stream, args=(port, i, tokens, times, barrier)) for i in range(batch)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = metrics(port)
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    tpots = [(last - first) / (tokens - 1) for first, last in times if last > first]
    return {
        "batch": batch,
        "tpot_s": statistics.median(tpots) if tpots else float("nan"),
        "tpots_s": tpots,
        "wall_s": wall,
        "drafts": delta.get("vllm:spec_decode_num_drafts_total", 0.0),
        "drafted": delta.get("vllm:spec_decode_num_draft_tokens_total", 0.0),
        "accepted": delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0),
    }


@dataclass
class Level:
    batch: int
    plain: list[float] = field(default_factory=list)  # TPOT per repeat
    spec: list[float] = field(default_factory=list)
    drafts: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0

    @property
    def ratios(self) -> list[float]:
        return [p / s for p, s in zip(self.plain, self.spec, strict=True)]

    @property
    def alpha(self) -> float | None:
        """Per-token α under the chain model, from accepted per drafted token at the mean draft length."""
        if not self.drafts or not self.drafted:
            return None
        return alpha_from_draft_acceptance(self.accepted / self.drafted, self.drafted / self.drafts)

    @property
    def tau(self) -> float | None:
        """Tokens per drafting step: 1 + accepted drafts per draft."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None


def sweep(plain: Engine, spec: Engine, levels: list[int], tokens: int, repeats: int) -> list[Level]:
    out = []
    for b in levels:
        level = Level(b)
        run_batch(plain.port, b, 8)  # the level's shapes seen once by each before timing
        run_batch(spec.port, b, 8)
        for r in range(repeats):
            order = (plain, spec) if r % 2 == 0 else (spec, plain)
            for engine in order:
                got = run_batch(engine.port, b, tokens)
                if engine is plain:
                    level.plain.append(got["tpot_s"])
                else:
                    level.spec.append(got["tpot_s"])
                    level.drafts += got["drafts"]
                    level.drafted += got["drafted"]
                    level.accepted += got["accepted"]
        s = level.ratios
        print(f"  {spec.name:>9} batch {b:>3}: plain {1e3 * statistics.median(level.plain):7.1f} ms/token, "
              f"speculative {1e3 * statistics.median(level.spec):7.1f} ms/token, S_real "
              f"{statistics.median(s):.2f} [{min(s):.2f}-{max(s):.2f}], "
              f"tau {level.tau or 0:.2f}", flush=True)  # fmt: skip
        out.append(level)
    return out


@dataclass
class Shared:
    """The neighbour's TPOTs (per request) at one level of the other engine, beside a plain and
    beside a speculative other, and the others' own."""

    batch: int
    beside_plain: list[float] = field(default_factory=list)
    beside_spec: list[float] = field(default_factory=list)
    other_plain: list[float] = field(default_factory=list)
    other_spec: list[float] = field(default_factory=list)

    @property
    def increase(self) -> float:
        """How much longer the neighbour's tokens take beside speculation than beside plain decode."""
        return statistics.median(self.beside_spec) / statistics.median(self.beside_plain) - 1.0


def p99(xs: list[float]) -> float:
    return float(np.percentile(xs, 99)) if xs else float("nan")


def jain(xs: list[float]) -> float:
    """Jain's fairness index: 1 when every party is slowed alike, 1/n when one takes everything."""
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def _keep_busy(port: int, batch: int, tokens: int, stop: threading.Event, out: list[float]) -> None:
    """Batches of `batch` requests one after another until `stop`: a steady load at that batch."""
    while not stop.is_set():
        out.append(run_batch(port, batch, tokens)["tpot_s"])


def externality(
    neighbour: Engine,
    plain: Engine,
    spec: Engine,
    levels: list[int],
    neighbour_batch: int,
    tokens: int,
    repeats: int,
) -> tuple[float, list[Shared]]:
    """Two engines sharing the machine: the neighbour decodes `neighbour_batch` requests while the
    other engine keeps a steady load at a batch (each level), plain and then speculating (the order
    swapped every repeat): batch after batch from before the neighbour's run starts until after it
    ends, so that the whole run shares the machine with it. Returns the neighbour's TPOT alone and
    each level's shared runs."""
    alone = [run_batch(neighbour.port, neighbour_batch, tokens)["tpot_s"] for _ in range(repeats)]
    out = []
    for b in levels:
        level = Shared(b)
        for r in range(repeats):
            for other in (plain, spec) if r % 2 == 0 else (spec, plain):
                stop, theirs = threading.Event(), list[float]()
                worker = threading.Thread(target=_keep_busy, args=(other.port, b, tokens, stop, theirs))
                worker.start()
                time.sleep(2.0)  # past the other's first prefill: its decode is what the neighbour meets
                mine = run_batch(neighbour.port, neighbour_batch, tokens)
                stop.set()
                worker.join()
                if other is plain:
                    level.beside_plain += mine["tpots_s"]
                    level.other_plain += theirs
                else:
                    level.beside_spec += mine["tpots_s"]
                    level.other_spec += theirs
        print(f"  neighbour at batch {neighbour_batch} beside batch {b:>3}: "
              f"{1e3 * statistics.median(level.beside_plain):7.1f} ms/token beside plain, "
              f"{1e3 * statistics.median(level.beside_spec):7.1f} beside speculation "
              f"({100 * level.increase:+.0f} %)", flush=True)  # fmt: skip
        out.append(level)
    return statistics.median(alone), out


def target_spec(shapes: dict[str, Any]) -> ModelSpec:
    """The target as the model reads it: every parameter streamed per step (embeddings, whose rows
    a step gathers, are few at this vocabulary), fp32 weights and KV cache."""
    hidden, heads = shapes["hidden"], shapes["heads"]
    return ModelSpec(name="bench-target", params=float(shapes["target_params"]), layers=shapes["layers"],
                     hidden=hidden, kv_heads=heads, head_dim=hidden // heads, bytes_per_param=4.0,
                     kv_bytes_per_elem=4.0, tensor_parallel=1)  # fmt: skip


def predict(
    host: tuple[float, float], shapes: dict[str, Any], plain_points: list[tuple[int, float]], context: float
) -> tuple[Any, Any, Any]:
    """(fit, roofline, gpu spec) learned from the plain engine's (batch, TPOT) runs alone."""
    flops, bandwidth = host
    gpu = GpuSpec(name="this-host-cpu", peak_flops=flops, mem_bandwidth=bandwidth, mem_bytes=16e9,
                  idle_watts=0.0, max_watts=0.0, compute_efficiency=0.5, bandwidth_efficiency=0.8,
                  step_overhead_s=1e-3, allreduce_s=0.0)  # fmt: skip
    model = target_spec(shapes)
    rows = [Measurement(batch=b, context=context, query_tokens=1.0, step_s=t) for b, t in plain_points]
    fitted = fit(gpu, model, 1, rows)
    learned = fitted.apply(gpu)
    return fitted, roofline_for(learned, model, 1), learned


def plot(doc: dict[str, Any], path: Path) -> None:
    """S_real measured (median, the repeats' spread as a bar) and predicted against the batch, one
    panel per drafter, from one run's JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drafters = list(dict.fromkeys(r["drafter"] for r in doc["rows"]))
    fig, axes = plt.subplots(1, len(drafters), figsize=(4.0 * len(drafters), 3.4), squeeze=False, sharey=True)
    for ax, name in zip(axes[0], drafters, strict=True):
        rows = [r for r in doc["rows"] if r["drafter"] == name]
        b = [r["batch"] for r in rows]
        s = [r["s_real"] for r in rows]
        spread = [[x - r["s_min"] for x, r in zip(s, rows, strict=True)],
                  [r["s_max"] - x for x, r in zip(s, rows, strict=True)]]  # fmt: skip
        ax.errorbar(b, s, yerr=spread, fmt="o-", capsize=3, label="measured (median, spread)")
        ax.plot(b, [r["s_predicted"] for r in rows], "s--", label="model learned from plain runs")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        alphas = [r["alpha"] for r in rows if r["alpha"] is not None]
        ax.set_title(f"{name} (α {min(alphas):.2f}–{max(alphas):.2f}, γ {doc['gamma']})")
        ax.set_xlabel("batch (concurrent requests)")
    axes[0][0].set_ylabel("S_real = plain / speculative TPOT")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("vLLM 0.32 CPU build, 104 M fp32 target, 2 cores: speculation pays below the ridge only")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--levels", default="1,2,4,8,16,32")
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gamma", type=int, default=3, help="draft tokens per step")
    ap.add_argument("--drafters", default="draft,perturbed,ngram")
    ap.add_argument("--neighbour-batch", type=int, default=4, help="0: no externality runs")
    ap.add_argument("--neighbour-levels", default="1,4,16")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--draft-layers", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=2816)
    ap.add_argument("--noise", type=float, default=0.05, help="the perturbed draft's (α about 0.7)")
    ap.add_argument("--compile", action="store_true", help="let vLLM compile its graphs (slower start)")
    ap.add_argument("--out", type=Path, default=Path("out/bench-engine"))
    ap.add_argument(
        "--replot", type=Path, help="only draw the figure of a run's bench-engine.json into --out"
    )
    args = ap.parse_args(argv)
    if args.replot:
        args.out.mkdir(parents=True, exist_ok=True)
        plot(json.loads(args.replot.read_text()), args.out / "bench-engine.png")
        print(f"written: {args.out / 'bench-engine.png'}")
        return 0
    levels = [int(x) for x in args.levels.split(",")]
    near = [int(x) for x in args.neighbour_levels.split(",")] if args.neighbour_batch else []
    args.out.mkdir(parents=True, exist_ok=True)

    print("bench-engine: a real vLLM (CPU build) on this host", flush=True)
    host = host_spec()
    print(f"host: numpy fp32 matmul {host[0] / 1e9:.1f} GFLOP/s, copy {host[1] / 1e9:.1f} GB/s; "
          "energy per token: not measured, this VM exposes no energy counter (no NVML, no RAPL "
          "powercap)", flush=True)  # fmt: skip
    python = install()
    work = Path(tempfile.mkdtemp(prefix="sovereignspec-bench-engine-"))
    models = work / "models"
    built = subprocess.run(
        [str(python), "-P", str(HERE / "engine_models.py"), str(models), "--layers", str(args.layers),
         "--draft-layers", str(args.draft_layers), "--hidden", str(args.hidden),
         "--intermediate", str(args.intermediate), "--noise", str(args.noise)],
        capture_output=True, text=True, timeout=900, check=True,
    )  # fmt: skip
    shapes = json.loads(built.stdout.strip().splitlines()[-1])
    print(f"target: {shapes['target_params'] / 1e6:.0f} M params fp32 ({shapes['layers']} layers, the last "
          f"{shapes['layers'] - shapes['draft_layers']} identities in function), draft "
          f"{shapes['draft_params'] / 1e6:.0f} M ({shapes['draft_layers']} layer); γ {args.gamma}, "
          f"{args.tokens} tokens per request, {args.repeats} repeats", flush=True)  # fmt: skip
    seqs = max([*levels, *near, args.neighbour_batch])
    specs: dict[str, dict[str, Any]] = {
        "draft": {"method": "draft_model", "model": str(models / "draft"),
                  "num_speculative_tokens": args.gamma},
        "perturbed": {"method": "draft_model", "model": str(models / "perturbed"),
                      "num_speculative_tokens": args.gamma},
        "ngram": {"method": "ngram", "num_speculative_tokens": args.gamma, "prompt_lookup_min": 2,
                  "prompt_lookup_max": 5},
    }  # fmt: skip
    eager = not args.compile
    results: dict[str, list[Level]] = {}
    shared: list[Shared] = []
    alone = float("nan")
    engines: list[Engine] = []
    try:
        plain = serve(python, models, "plain", None, work, eager, seqs)
        engines.append(plain)
        print(f"plain engine serving after {plain.started_s:.0f} s", flush=True)
        for name in args.drafters.split(","):
            spec = serve(python, models, name, specs[name], work, eager, seqs)
            engines.append(spec)
            print(f"{name} engine serving after {spec.started_s:.0f} s", flush=True)
            results[name] = sweep(plain, spec, levels, args.tokens, args.repeats)
            if name == "draft" and near:
                neighbour = serve(python, models, "neighbour", None, work, eager, seqs)
                engines.append(neighbour)
                print(f"externality: a neighbour engine (plain, batch {args.neighbour_batch}) beside "
                      f"the plain and the {name} engine", flush=True)  # fmt: skip
                alone, shared = externality(neighbour, plain, spec, near, args.neighbour_batch, args.tokens,
                                            args.repeats)  # fmt: skip
                neighbour.close()
            spec.close()
    finally:
        for engine in engines:
            engine.close()

    # The model, learned from the plain runs only: every repeat of every drafter's plain runs.
    context = PROMPT_TOKENS + args.tokens / 2
    points = [(x.batch, t) for lv in results.values() for x in lv for t in x.plain]
    fitted, roof, learned = predict(host, shapes, points, context)
    relative = shapes["draft_layer_params"] / shapes["target_layer_params"]
    cost = {"draft": relative, "perturbed": relative, "ngram": 0.0}
    ridge = learned.effective_flops / learned.effective_bandwidth
    print(f"\nlearned from the plain runs alone: bandwidth {learned.effective_bandwidth / 1e9:.1f} GB/s "
          f"({fitted.bandwidth_efficiency:.2f} of the copy's), compute {learned.effective_flops / 1e9:.1f} "
          f"GFLOP/s ({fitted.compute_efficiency:.2f} of the matmul's), fixed {1e3 * fitted.fixed_s:.1f} "
          f"ms/step, κ {fitted.serial_fraction:.2f}, p {fitted.overlap:.1f}; fit RMS "
          f"{100 * fitted.rms_error:.1f} %; ridge {ridge:.1f} FLOP/byte (fp32: batch "
          f"~{ridge * 4 / 2:.0f})", flush=True)  # fmt: skip

    rows: list[dict[str, Any]] = []
    lines = ["| drafter | batch | plain ms/token | speculative ms/token | S_real measured [spread] | τ "
             "| α | S predicted | error | faster (model / measured) |", "|" + "---|" * 10]  # fmt: skip
    for name, lv in results.items():
        for x in lv:
            measured = statistics.median(x.ratios)
            alpha = x.alpha if x.alpha is not None else 0.0
            predicted = float(homogeneous_speedup(roof, x.batch, alpha, args.gamma, cost[name], 0.0, context))
            error = predicted / measured - 1.0
            choice = (
                "speculative" if predicted > 1.0 else "plain",
                "speculative" if measured > 1.0 else "plain",
            )
            rows.append({"drafter": name, "batch": x.batch, "plain_tpot_s": x.plain, "spec_tpot_s": x.spec,
                         "s_real": measured, "s_min": min(x.ratios), "s_max": max(x.ratios), "tau": x.tau,
                         "alpha": x.alpha, "tau_model": float(tau(alpha, args.gamma)),
                         "s_predicted": predicted, "error": error, "choice": choice})  # fmt: skip
            lines.append(
                f"| {name} | {x.batch} | {1e3 * statistics.median(x.plain):.1f} | "
                f"{1e3 * statistics.median(x.spec):.1f} | {measured:.2f} "
                f"[{min(x.ratios):.2f}–{max(x.ratios):.2f}] | {x.tau or 0:.2f} | {alpha:.2f} | "
                f"{predicted:.2f} | {100 * error:+.0f} % | {choice[0]} / {choice[1]} |"
            )  # fmt: skip
    table = "\n".join(lines)
    print("\n" + table)
    errors = [abs(r["error"]) for r in rows]
    agree = sum(r["choice"][0] == r["choice"][1] or abs(r["s_real"] - 1.0) <= 0.05 for r in rows)
    print(f"\nprediction error |S_predicted / S_real - 1|: median {100 * statistics.median(errors):.0f} %, "
          f"max {100 * max(errors):.0f} %; the faster choice agrees (or the two are within 5 %) at "
          f"{agree}/{len(rows)} levels", flush=True)  # fmt: skip

    externalities = []
    if shared:
        ext = ["| other's batch | neighbour ms/token beside plain | beside speculation | increase measured "
               "| increase predicted | neighbour P99 beside plain / speculation | fairness (Jain) |",
               "|" + "---|" * 7]  # fmt: skip
        nb = args.neighbour_batch
        for sh in shared:
            seqs_ = np.array([nb, sh.batch], dtype=np.float64)
            costs, overheads = np.array([0.0, relative]), np.zeros(2)
            with_spec = group_step_time(roof, seqs_, np.array([0.0, args.gamma]), costs, overheads, context)
            without = group_step_time(roof, seqs_, np.zeros(2), costs, overheads, context)
            predicted = float(with_spec / without) - 1.0
            # Each engine's slowdown beside speculation against its own pace beside plain decode.
            slow = [statistics.median(sh.beside_spec) / alone,
                    statistics.median(sh.other_spec) / statistics.median(sh.other_plain)]  # fmt: skip
            fairness = jain(slow)
            externalities.append({"batch": sh.batch, "neighbour_batch": nb, "alone_s": alone,
                                  "beside_plain_s": sh.beside_plain, "beside_spec_s": sh.beside_spec,
                                  "other_plain_s": sh.other_plain, "other_spec_s": sh.other_spec,
                                  "increase": sh.increase, "increase_predicted": predicted,
                                  "jain": fairness})  # fmt: skip
            ext.append(
                f"| {sh.batch} | {1e3 * statistics.median(sh.beside_plain):.1f} | "
                f"{1e3 * statistics.median(sh.beside_spec):.1f} | {100 * sh.increase:+.0f} % | "
                f"{100 * predicted:+.0f} % | {1e3 * p99(sh.beside_plain):.1f} / "
                f"{1e3 * p99(sh.beside_spec):.1f} | {fairness:.2f} |"
            )  # fmt: skip
        ext_table = "\n".join(ext)
        print(f"\nexternality: the neighbour alone at batch {nb}: {1e3 * alone:.1f} ms/token\n" + ext_table)
        table += f"\n\nNeighbour (plain, batch {nb}) alone: {1e3 * alone:.1f} ms/token.\n\n" + ext_table
    doc = {"host": {"peak_flops": host[0], "bandwidth": host[1]}, "shapes": shapes, "levels": levels,
           "tokens": args.tokens, "repeats": args.repeats, "gamma": args.gamma, "context": context,
           "fit": {"bandwidth_efficiency": fitted.bandwidth_efficiency,
                   "compute_efficiency": fitted.compute_efficiency, "fixed_s": fitted.fixed_s,
                   "serial_fraction": fitted.serial_fraction, "overlap": fitted.overlap,
                   "rms_error": fitted.rms_error, "ridge_flop_per_byte": ridge},
           "rows": rows, "externality": externalities}  # fmt: skip
    (args.out / "bench-engine.json").write_text(json.dumps(doc, indent=1))
    (args.out / "bench-engine.md").write_text(table + "\n")
    plot(doc, args.out / "bench-engine.png")
    shutil.rmtree(work, ignore_errors=True)
    print(f"written: {args.out / 'bench-engine.json'}, .md, .png; every engine "
          f"stopped, the models ({work}) removed")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
