"""vLLM in its container: what `sovereignspec launch` appends for a speculative decision, and every
spelling that sets speculation on its own. Standard library only (`launch --install` writes it
into the one file it installs); the operator's side of vLLM is `engines/vllm.py`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sovereignspec.keys import PREFIX  # inline: sovereignspec/keys.py
from sovereignspec.launchkit import (  # inline: sovereignspec/launchkit.py
    LaunchError,
    Spec,
    budget,
    option_value,
    prefix_of,
    refuse_conflicts,
)

if TYPE_CHECKING:
    from pathlib import Path

# The annotations the operator writes for vLLM (engines/vllm.py).
VLLM_CONFIG = "vllm-speculative-config"  # vLLM's --speculative-config JSON
VLLM_PER_BATCH = "num_speculative_tokens_per_batch_size"  # its per-batch table's field


class VllmLauncher:
    name = "vllm"
    options: tuple[tuple[str, str], ...] = (("--vllm-legacy", f"vLLM < 0.24: leave out {VLLM_PER_BATCH}"),)
    # Every spelling that sets speculation. vLLM 0.32 (vllm/engine/arg_utils.py): --speculative-config
    # and its short -sc, the top-level --spec-method/--spec-model/--spec-tokens, the pre-0.7 flags;
    # its parser also takes underscores for dashes, `--opt.key value` for one key of a JSON option,
    # any unambiguous prefix (argparse's abbreviations) and the keys of a `--config` YAML file.
    speculative = (
        "--speculative-config",
        "-sc",
        "--spec-method",
        "--spec-model",
        "--spec-tokens",
        "--speculative-model",
        "--num-speculative-tokens",
    )
    data_parallel = ("--data-parallel-size", "-dp")
    # What the operator writes, and nothing else: a rewritten annotation cannot smuggle another
    # engine argument or setting through the launcher.
    keys = (
        "method",
        "model",
        "num_speculative_tokens",
        VLLM_PER_BATCH,
        "prompt_lookup_min",
        "prompt_lookup_max",
    )

    def detects(self, words: str) -> bool:
        return "vllm" in words

    def sets_speculation(self, name: str) -> bool:
        return name in self.speculative or prefix_of(
            name, [s for s in self.speculative if s.startswith("--")]
        )

    def plan(
        self,
        notes: Mapping[str, str],
        command: list[str],
        gamma: str,
        config_dir: Path,
        options: Mapping[str, bool],
    ) -> Spec:
        config = notes.get(PREFIX + VLLM_CONFIG)
        if not config:
            raise LaunchError(f"the decision is speculative but carries no {VLLM_CONFIG} annotation")
        refuse_conflicts(command, self.sets_speculation)
        doc = self._config(config)
        ranks = self._data_parallel(command)
        fixed = ""
        if options.get("vllm_legacy") and VLLM_PER_BATCH in doc:
            fixed = "vLLM < 0.24 reads no per-batch table"
        elif ranks > 1 and VLLM_PER_BATCH in doc:
            # vLLM drops the table under data parallelism and runs num_speculative_tokens at every
            # batch (config/vllm.py _maybe_disable_dynamic_sd_for_data_parallel): the table's largest
            # K, which the decision never allowed at the declared batch.
            fixed = f"vLLM drops the per-batch table with data parallelism ({ranks} ranks)"
        if fixed:
            # The fixed γ decided at the declared batch, which holds at every batch up to it.
            doc.pop(VLLM_PER_BATCH)
            if budget(gamma) <= 0:
                return f"{fixed} and γ at the declared batch is 0"
            doc["num_speculative_tokens"] = budget(gamma)
        extra = ["--speculative-config", json.dumps(doc, separators=(",", ":"), sort_keys=True)]
        table = f", {len(doc[VLLM_PER_BATCH])} batch ranges" if VLLM_PER_BATCH in doc else ""
        return extra, f" (fixed: {fixed})" if fixed else table, "", {}

    def _data_parallel(self, command: list[str]) -> int:
        found = option_value(command, self.data_parallel)
        if found is None:
            return 1
        try:
            return int(found[1])
        except ValueError:
            raise LaunchError(f"{found[0]}: got {found[1]!r}; accepted: an integer >= 1") from None

    def _config(self, text: str) -> dict[str, Any]:
        key = PREFIX + VLLM_CONFIG
        try:
            doc = json.loads(text)
        except ValueError:
            raise LaunchError(
                f"{key} annotation: not JSON: {text[:120]!r}; accepted: a JSON object"
            ) from None
        if not isinstance(doc, dict):
            raise LaunchError(
                f"{key} annotation: got {type(doc).__name__} {text[:60]!r}; accepted: a JSON object"
            )
        unknown = sorted(set(doc) - set(self.keys))
        if unknown:
            raise LaunchError(f"{key} annotation: unknown key(s) {unknown}; accepted: {', '.join(self.keys)}")
        k = doc.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise LaunchError(f"{key} annotation: num_speculative_tokens {k!r}; accepted: an integer >= 1")
        table = doc.get(VLLM_PER_BATCH, [])
        if not isinstance(table, list) or not all(
            isinstance(r, list) and len(r) == 3 and all(type(x) is int for x in r) for r in table
        ):
            raise LaunchError(
                f"{key} annotation: {VLLM_PER_BATCH} {table!r}; accepted: [[low, high, K], ...]"
            )
        return doc


VLLM = VllmLauncher()
