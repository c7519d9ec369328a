"""The operator's decisions, handed to a real vLLM (0.32, CPU build) exactly as a serving Pod hands
them: the decision's pod annotations in a downward-API file, `sovereignspec launch` appending the
engine's own arguments and exec'ing `vllm serve`. What the engine then does is read back from its own
counters, and through a real Prometheus running the shipped scrape job's relabelling, by the
operator's own reader. Step times on a shared 2-core CPU say nothing about a GPU: nothing here
judges speed, only that the engine runs what it was handed."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from kubernetes import client

from localdev.prometheus import LocalPrometheus
from sovereignspec.core.calibration import COEFFICIENTS
from sovereignspec.core.cluster import WorkloadRequest
from sovereignspec.operator.border import annotations as ann
from sovereignspec.operator.decision.ledger import Committed, handed
from sovereignspec.operator.decision.plan import Write, plan
from sovereignspec.operator.decision.view import build
from sovereignspec.operator.roles.controller import Controller
from sovereignspec.operator.runtime import metrics
from sovereignspec.profiles import load_profiles
from sovereignspec.telemetry.prometheus import PrometheusReader
from sovereignspec.telemetry.snapshot import Snapshot
from tests.engine.env import local_profiles
from tests.engine_client import SERVED
from tests.engine_keys import OUT_VLLM
from tests.scrape_job import discovered
from tests.unit.builders import CHECK, NOW, STAMP, chat, node, policy, snapshot, world
from tests.waiting import wait_until

IDLE = {("h1", i): 0.0 for i in range(4)}
BUSY = {("h1", i): 1.0 for i in range(4)}
PER_BATCH = "num_speculative_tokens_per_batch_size"
NAMESPACE = "team-a"
DRAFT = "llama-3.2-1b-draft"


def decision(
    profiles_dir: Path, drafter: str, snap: Snapshot, checkpoint: Path | None = None, name: str = "chat"
) -> Write:
    """The operator's decision for a chat server with `drafter` on an H100 whose telemetry is `snap`
    (the same path the worker runs: view, plan, pod set update), under a policy that serves the
    drafter's checkpoint from a local path (`drafts.checkpoints`)."""
    drafts = {"checkpoints": {drafter: {SERVED: str(checkpoint)}}} if checkpoint else {}
    spec = policy(drafts=drafts)
    profiles = load_profiles(profiles_dir)
    workload = chat(name, namespace=NAMESPACE).annotate(drafter=drafter).obj()
    view = build(world([workload], [node("h1")], spec), {CHECK}, spec, profiles, snap, NOW)
    (write,) = plan("default", spec, view, profiles, STAMP)
    assert write.state == "Ready", write.message
    return write


def decide(
    profiles_dir: Path, drafter: str, readings: dict[tuple[str, int], float], checkpoint: Path | None = None
) -> dict[str, str]:
    """The pod annotations of `decision`, for GPUs whose tensor activity is `readings`."""
    (update,) = decision(profiles_dir, drafter, snapshot(readings), checkpoint).pod_set_updates or []
    return dict(update["annotations"])


def scraped_traffic(served: Any, series: str, tokens: int) -> tuple[LocalPrometheus, dict[str, Any]]:
    """A Prometheus scraping `served` through the shipped relabelling, and one request of `tokens`
    made between two of its scrapes, its last scrape waited for; the caller closes the Prometheus.

    vLLM creates a series at its first observation: Prometheus's first sample of it would already
    hold part of the traffic, which increase() never sees. So traffic first (the series exist),
    then the scraping, as with an engine that has served for a while, then the measured traffic."""
    served.complete(1, tokens=32)
    prom = LocalPrometheus().start()
    try:
        prom.add_scrape_config(discovered([(served.target, NAMESPACE, "chat", True)]))
        # Scraped before the traffic (increase() needs a sample on each side of it), relabelled.
        wait_until(
            lambda: prom.query(f'{series}{{namespace="team-a"}}'), timeout=60, what="a relabelled scrape"
        )
        time.sleep(1.5)
        done = served.complete(1, tokens=tokens)
        selector = 'namespace="team-a"'
        wait_until(lambda: served.scraped_by(prom.query, selector), timeout=60, what="the run's last scrape")
    except BaseException:
        prom.close()
        raise
    return prom, done


def table_of(notes: dict[str, str]) -> list[list[int]]:
    return list(json.loads(notes[OUT_VLLM]).get(PER_BATCH) or [])


def k_at(table: list[list[int]], batch: int) -> int:
    return next(k for lo, hi, k in table if lo <= batch <= hi)


def test_a_plain_decision_runs_the_engine_with_no_speculation(serve, tmp_path: Path) -> None:
    notes = decide(local_profiles(tmp_path / "p"), "eagle3", BUSY)
    assert notes[ann.OUT_MODE] == "plain" and OUT_VLLM not in notes
    served = serve(notes)
    assert "plain decode decided on H100-SXM" in served.text()
    done = served.complete(4)
    assert done["tokens"] == 4 * 64 and done["drafts"] == 0
    assert "vllm:spec_decode_num_drafts_total" not in served.metrics()  # no speculative engine at all


def test_the_per_batch_table_of_a_speculative_decision_is_followed_at_each_concurrency(
    serve, tiny: Path, tmp_path: Path
) -> None:
    """A draft model identical to the target: every draft is accepted (α 1.0), and the mean draft
    length per drafting step at each concurrency is the table's K for that batch."""
    notes = decide(local_profiles(tmp_path / "p", (DRAFT,)), DRAFT, IDLE, tiny / "identical")
    table = table_of(notes)
    assert notes[ann.OUT_MODE] == "speculative" and len(table) > 1, notes
    served = serve(notes)
    assert "appending --speculative-config" in served.text()
    # Batch 1, and the top of each range the engine can reach (its --max-num-seqs is 64).
    concurrencies = sorted({1} | {min(hi, 64) for lo, hi, _ in table if lo <= 64})
    assert len({k_at(table, c) for c in concurrencies}) >= 2, table  # at least two of its Ks
    seen = {}
    for c in concurrencies:
        done = served.complete(c)
        seen[c] = done
        k = k_at(table, c)
        if k == 0:
            assert done["drafts"] == 0, (c, done)
            continue
        # All requests start and end together; the first step or two may run at a lighter batch.
        assert done["mean_draft_length"] == pytest.approx(k, abs=0.15), (c, k, done, table)
        assert done["accepted_per_drafted"] == pytest.approx(1.0, abs=1e-9), (c, done)
    print(f"table {table}; started in {served.started_s:.0f}s; per concurrency {seen}")


@pytest.mark.prometheus
def test_prometheus_through_the_shipped_relabelling_gives_the_reader_the_drafts_measured_alpha_and_tpot(
    serve, tiny: Path, tmp_path: Path
) -> None:
    """A perturbed draft: the reader's α is the engine's own first-position acceptance, below 1."""
    notes = decide(local_profiles(tmp_path / "p", (DRAFT,)), DRAFT, IDLE, tiny / "perturbed")
    served = serve(notes)
    prom, done = scraped_traffic(served, "vllm:spec_decode_num_drafts_total", tokens=256)
    try:
        measured = done["alpha_position0"]
        assert measured is not None and 0.3 < measured < 0.97, done
        reader = PrometheusReader(prom.url, window="5m")

        def learned() -> tuple[float, float] | None:
            got = reader.acceptance().get((NAMESPACE, SERVED))
            return (
                got
                if got is not None and got[1] >= 0.9 * done["drafts"] * done["mean_draft_length"]
                else None
            )

        alpha, drafted = wait_until(
            learned, timeout=60, what=f"the traffic in Prometheus ({reader.rejected})"
        )
        assert alpha == pytest.approx(measured, abs=0.03), (alpha, drafted, done)
        assert drafted > 0
        tpot = reader.tpot()[(NAMESPACE, "chat")]
        assert 0 < tpot < 5.0, tpot  # a p90 bucket bound of a real histogram; CPU speed is not judged
        # The operator's next decision in this namespace learns it (GPU readings stay synthetic).
        learned = reader.snapshot().acceptance
        observed = learned[(NAMESPACE, SERVED)][0]
        assert observed == pytest.approx(measured, abs=0.03)
        learned_snap = replace(snapshot(IDLE), acceptance=learned)
        message = decision(tmp_path / "p", DRAFT, learned_snap, tiny / "perturbed", name="next").message
        assert f"declared 0.80 blended with {observed:.2f} observed" in message, message
        print(
            f"α measured {measured:.3f}, read {alpha:.3f} over {drafted:.0f} draft tokens; "
            f"TPOT p90 {tpot:.4f}s"
        )
    finally:
        prom.close()


@pytest.mark.parametrize(("drafter", "checkpoint"), [("eagle3", "eagle3"), ("ngram", "")])
def test_each_drafters_decided_config_is_accepted_and_drafts(
    serve, tiny: Path, tmp_path: Path, drafter: str, checkpoint: str
) -> None:
    notes = decide(local_profiles(tmp_path / "p"), drafter, IDLE, tiny / checkpoint if checkpoint else None)
    config: dict[str, Any] = json.loads(notes[OUT_VLLM])
    assert config["method"] == {"eagle3": "eagle3", "ngram": "ngram"}[drafter]
    served = serve(notes)
    # ngram drafts only where the text repeats: a prompt of one repeated phrase gives it something.
    done = served.complete(2, tokens=96)
    assert done["tokens"] == 2 * 96
    if drafter == "eagle3":
        assert done["drafts"] > 0 and done["mean_draft_length"] == pytest.approx(
            k_at(table_of(notes), 2), abs=0.15
        )
    else:
        assert "vllm:spec_decode_num_drafts_total" in served.metrics()  # a speculative engine
    print(f"{drafter}: started in {served.started_s:.0f}s; {done}")


def test_the_profiler_and_calibrate_against_the_real_engine_report_what_the_data_identify(
    serve, tiny: Path, tmp_path: Path
) -> None:
    """`sovereignspec profile` drives the real engine (an ngram decision: drafts on few steps, so τ
    per step stays well under 1 + K) and `calibrate` fits an H100 profile to a CPU's step times: it
    writes the report and refuses `measured: true`, saying why. Nothing here is a GPU's number."""
    notes = decide(local_profiles(tmp_path / "p"), "ngram", IDLE)
    served = serve(notes)
    k = json.loads(notes[OUT_VLLM])["num_speculative_tokens"]
    csvs = []
    for name in ("fit", "held"):
        out = tmp_path / f"{name}.csv"
        proc = subprocess.run(
            [sys.executable, "-m", "sovereignspec.cli", "profile", "--url", served.url, "--model", SERVED,
             "--concurrency", "1,2,4", "--prompt-tokens", "16,128", "--output-tokens", "32", "--repeats", "1",
             "--prompt-ids", "3:512", "--out", str(out)],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        csvs.append(out)
    text = csvs[0].read_text()
    rows = list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))
    taus = [float(t) for t in re.findall(r"tau ([0-9.]+)", text)]
    assert len(rows) == len(taus) == 6, text
    for row, tau in zip(rows, taus, strict=True):
        assert 1.0 <= tau <= float(row["query_tokens"]) <= 1.0 + k, (
            row,
            tau,
        )  # per step: never over what was verified
    profile = tmp_path / "cpu.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "sovereignspec.cli", "calibrate", str(csvs[0]), "--held-out", str(csvs[1]),
         "--gpu", "H100-SXM", "--model", SERVED, "--out", str(profile)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = profile.read_text()
    doc = yaml.safe_load(text)
    record = doc["calibration"]
    assert doc["measured"] is False and record["measured_refused"], record
    assert set(record["identified"]) | set(record["not_identified"]) == set(COEFFICIENTS)
    assert "# The data identify:" in text and "# measured: false, because" in text
    header = [line for line in text.splitlines() if line.startswith("#")]
    print("\n".join(header[:4]))
    print(f"profiled τ per step {taus}, query tokens {[r['query_tokens'] for r in rows]}, K {k}")


# Each concurrency level is driven this long, and a step reading averages over it.
STEP_WINDOW_S = 12
LEVELS = (1, 2, 4, 8, 16, 32)


@pytest.mark.prometheus
def test_the_engines_plain_steps_teach_a_wrong_profile_and_the_next_decision_says_what_it_learned(
    serve, tmp_path: Path
) -> None:
    """A plain engine on this CPU, priced as an H100 serving an 8B model (deliberately wrong): its
    batch and time per output event, read through the shipped relabelling by the operator's reader,
    are the learner's readings. What is learned is identified only where the identification says so,
    and the next decision's check message names the profile that priced it and why."""
    from sovereignspec.core.learning import Point
    from sovereignspec.operator.decision.learning import Learner

    profiles_dir = local_profiles(tmp_path / "p")
    notes = decide(profiles_dir, "eagle3", BUSY)
    assert notes[ann.OUT_MODE] == "plain"
    served = serve(notes)
    served.complete(1, tokens=8)  # the engine's series exist before the first scrape
    prom = LocalPrometheus().start()
    try:
        prom.add_scrape_config(discovered([(served.target, NAMESPACE, "chat", True)]))
        wait_until(lambda: prom.query(f'vllm:num_requests_running{{namespace="{NAMESPACE}"}}'),
                   timeout=60, what="a relabelled scrape")  # fmt: skip
        reader = PrometheusReader(prom.url, step_window_s=STEP_WINDOW_S)
        profiles = load_profiles(profiles_dir)
        spec = policy()
        pending = build(
            world([chat().obj()], [node("h1")], spec), {CHECK}, spec, profiles, snapshot(IDLE), NOW
        )
        context = float(pending.pending[0].request.context)
        points, seen = [], []
        for _ in range(2):
            for c in LEVELS:
                start = time.monotonic()
                while time.monotonic() - start < STEP_WINDOW_S:
                    served.complete(c, tokens=48)
                time.sleep(2.5)  # the last scrape of this level
                batch, step_s = reader.steps()[(NAMESPACE, "chat")]
                seen.append((c, round(batch, 2), round(step_s * 1e3, 2)))
                points.append(Point(batch, context, step_s, float(len(points))))
        # The engine's batch, as its gauge reports it, follows the driven concurrency (a level's
        # window may hold the previous level's tail: the first and last steps run lighter).
        for c, batch, _ in seen:
            assert 0.5 * c <= batch <= 1.2 * c, seen
        learner = Learner(profiles, refit_s=0.0)
        (write,), messages = learner.step([], {("H100-SXM", "llama-3.1-8b"): points}, now=float(len(points)))
        status, learned = write.status, learner.learned[("H100-SXM", "llama-3.1-8b")]
        assert not messages and status["pointCount"] == 12 and learned.fitted is not None
        assert status["identified"] is learned.identified
        in_force = learner.in_force[("H100-SXM", "llama-3.1-8b")]
        # The next decision for that node, priced as the learner says.
        after = learner.profiles()
        view = build(
            world([chat("next").obj()], [node("h1")], spec), {CHECK}, spec, after, snapshot(IDLE), NOW
        )
        (next_write,) = plan("default", spec, view, after, STAMP)
        if in_force.learned:
            assert learned.identified and learned.beats_shipped
            assert "priced with the learned profile" in next_write.message, next_write.message
        else:
            assert f"margin widened by {in_force.extra_margin:.2f}" in next_write.message, next_write.message
            assert in_force.extra_margin > 0.0
        print(f"readings (concurrency, batch, step ms): {seen}; {in_force.why}; "
              f"fit RMS {learned.fitted.rms_error:.1%}")  # fmt: skip
    finally:
        prom.close()


def test_an_engine_started_by_hand_with_speculation_under_a_plain_decision_is_seen_ignoring_it(
    serve, tiny: Path, tmp_path: Path
) -> None:
    """The image's own entrypoint runs `vllm serve --speculative-config ...` where the decision was
    plain (a configuration no admission policy reads): its draft counters, scraped through the
    shipped relabelling, make the operator's watch tell the Workload and count it."""
    profiles_dir = local_profiles(tmp_path / "p", (DRAFT,))
    plain = decision(profiles_dir, DRAFT, snapshot(BUSY), tiny / "perturbed")
    (update,) = plain.pod_set_updates or []
    notes = dict(update["annotations"])
    assert notes[ann.OUT_MODE] == "plain", notes
    config = decide(profiles_dir, DRAFT, IDLE, tiny / "perturbed")[OUT_VLLM]  # what a speculative one hands
    served = serve(notes, "--speculative-config", config, by_hand=True)
    prom, done = scraped_traffic(served, "vllm:spec_decode_num_draft_tokens_total", tokens=128)
    try:
        assert done["drafts"] > 0, done
        reader = PrometheusReader(prom.url, window="5m")
        drafting = wait_until(lambda: reader.snapshot().drafting or None, timeout=60, what="its draft tokens")
        assert set(drafting) == {(NAMESPACE, "chat")} and drafting[(NAMESPACE, "chat")] > 0, drafting
        request = WorkloadRequest(f"{NAMESPACE}/chat", NAMESPACE, SERVED, DRAFT, 0.8)
        workload = {"metadata": {"name": "job-chat-1a2b3", "namespace": NAMESPACE, "uid": "u1"}}
        entry = {"name": CHECK, "state": "Ready", "podSetUpdates": plain.pod_set_updates}
        mode, largest = handed(notes)  # as the ledger reads the decision back
        running = Committed(f"{NAMESPACE}/chat", NAMESPACE, "chat", "h1", 0, 0, 1, request, 0.0, None, CHECK,
                            workload, entry, mode=mode, largest_budget=largest)  # fmt: skip
        controller = Controller(client.ApiClient(client.Configuration()), load_profiles())
        told: list[tuple[str, str, str]] = []
        controller.writer = SimpleNamespace(  # type: ignore[assignment]
            event=lambda obj, kind, reason, message, warning: told.append((kind, reason, message))
        )
        before = metrics.DECISIONS_IGNORED_TOTAL._value.get()
        controller.watches.decisions([running], drafting)
        assert [(kind, reason) for kind, reason, _ in told] == [("Workload", "DecisionIgnored")], told
        assert (
            "decided plain decode" in told[0][2]
            and metrics.DECISIONS_IGNORED_TOTAL._value.get() == before + 1
        )
        # And its record, waiting for the tick's flush to the chain.
        (fact,) = controller.audit.backlog
        assert fact["kind"] == "ignored" and fact["mode"] == "plain" and fact["draftTokens"] > 0, fact
        print(f"drafted {drafting[(NAMESPACE, 'chat')]:.0f} tokens under a plain decision: {told[0][2]}")
    finally:
        prom.close()
