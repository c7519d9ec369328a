"""What SovereignSpec emits and refuses, judged by the installed vLLM's own parser and configuration
classes (vLLM 0.32.0, CPU build) rather than by reading its source: every option of `vllm serve` that
sets speculation is refused by `sovereignspec launch` and no other is; every speculative config the
operator emits (each drafter, each mode, with and without a per-batch table) becomes the
SpeculativeConfig it means."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sovereignspec.core.handoff import handoff
from sovereignspec.engines import engine_config
from sovereignspec.engines import vllm as vllm_engine
from sovereignspec.launch import option_name, sets_speculation
from sovereignspec.profiles import load_profiles
from tests.engine.env import engine_env

HERE = Path(__file__).resolve().parent
SPECULATIVE_DESTS = {"speculative_config", "spec_method", "spec_model", "spec_tokens"}


def _run(engine_python: Path, cache: Path, *args: str) -> Any:
    proc = subprocess.run(
        [str(engine_python), str(HERE / "vllm_parse.py"), *args],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=engine_env(engine_python, cache),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def vllm_options(engine_python: Path, vllm_cache: Path) -> list[dict[str, str]]:
    return list(_run(engine_python, vllm_cache, "options"))


def test_launch_refuses_exactly_the_options_of_vllm_serve_that_set_speculation(vllm_options) -> None:
    wrong = [
        o
        for o in vllm_options
        if sets_speculation(option_name(o["option"]) or "", "vllm") != (o["dest"] in SPECULATIVE_DESTS)
    ]
    assert wrong == []
    assert {o["dest"] for o in vllm_options} >= SPECULATIVE_DESTS  # the aliases still exist in this vLLM


def test_every_prefix_argparse_resolves_to_a_speculative_option_is_refused_and_no_other(vllm_options) -> None:
    longs = [o for o in vllm_options if o["option"].startswith("--")]
    missed, refused = [], []
    for o in longs:
        for n in range(4, len(o["option"])):
            prefix = o["option"][:n]
            if [x["option"] for x in longs if x["option"].startswith(prefix)] != [o["option"]]:
                continue  # ambiguous or another option's: argparse refuses it or means the other
            speculative = o["dest"] in SPECULATIVE_DESTS
            if sets_speculation(prefix, "vllm") != speculative:
                (missed if speculative else refused).append(prefix)
    assert missed == [] and refused == []


def test_every_speculative_config_the_operator_emits_is_the_speculative_config_vllm_builds(
    engine_python: Path, vllm_cache: Path, tiny: Path, tmp_path: Path
) -> None:
    profiles = load_profiles()
    gpu = profiles.gpus["H100-SXM"]
    local = {"eagle3": str(tiny / "eagle3"), "llama-3.2-1b-draft": str(tiny / "identical"), "ngram": ""}
    cases, expected = [], []
    for name, checkpoint in local.items():
        drafter = profiles.drafters[name]
        # The model the drafter drafts for (the draft model is offered for the 70B target only).
        model = profiles.models["llama-3.1-8b" if drafter.supports("llama-3.1-8b") else drafter.targets[0]]
        for declared, gamma in ((8.0, 3), (256.0, 0), (1024.0, 0)):  # speculative; light batches only
            table = handoff(gpu, model, drafter, 0.7, 144.0, 8, 0.02, 1.0, float("inf"), (declared, gamma))
            for t in (table, None):
                if t is None and gamma == 0:
                    continue  # no table and γ 0: plain decode, nothing emitted
                # Hub ids are out of reach here: the local stand-in, as a policy's drafts.checkpoints.
                config = engine_config(drafter, model.name, gamma, t, checkpoint or None)
                doc = json.loads(config.get(vllm_engine.CONFIG))
                cases.append(
                    {"model": str(tiny / "target"), "argv": ["--speculative-config", json.dumps(doc)]}
                )
                expected.append((name, doc))
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    results = _run(engine_python, vllm_cache, "configs", str(path))
    assert len(results) == len(expected)
    for (name, doc), got in zip(expected, results, strict=True):
        assert got["ok"], (name, doc, got)
        assert got["k"] == doc["num_speculative_tokens"], (name, doc, got)
        assert got["table"] == doc.get("num_speculative_tokens_per_batch_size", []), (name, doc, got)
        assert got["method"] == doc["method"], (name, doc, got)
    print(f"{len(results)} emitted configs built by vLLM's own SpeculativeConfig")
