"""SGLang in its container: what `sovereignspec launch` appends for a speculative decision, and
every spelling that sets speculation on its own. Standard library only (`launch --install` writes
it into the one file it installs); the operator's side of SGLang is `engines/sglang.py`.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sovereignspec.keys import PREFIX  # inline: sovereignspec/keys.py
from sovereignspec.launchkit import (  # inline: sovereignspec/launchkit.py
    LaunchError,
    Spec,
    budget,
    option_name,
    prefix_of,
    refuse_conflicts,
)

if TYPE_CHECKING:
    from pathlib import Path

# The annotations the operator writes for SGLang (engines/sglang.py).
SGLANG_ARGS = "sglang-args"  # SGLang's --speculative-* flags
SGLANG_ADAPTIVE = "sglang-adaptive-config"  # the file behind --speculative-adaptive-config


class SglangLauncher:
    name = "sglang"
    options: tuple[tuple[str, str], ...] = ()
    # Every --speculative-* flag, with argparse's prefixes and its own `--config` file.
    speculative = ("--speculative-",)
    # What the operator writes, and nothing else: a rewritten annotation cannot smuggle another
    # engine argument through the launcher.
    flags = (
        "--speculative-algorithm",
        "--speculative-draft-model-path",
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
        "--speculative-ngram-min-bfs-breadth",
        "--speculative-ngram-max-bfs-breadth",
    )

    def detects(self, words: str) -> bool:
        return "sglang" in words

    def sets_speculation(self, name: str) -> bool:
        return name.startswith(self.speculative) or prefix_of(name, list(self.speculative))

    def plan(
        self,
        notes: Mapping[str, str],
        command: list[str],
        gamma: str,
        config_dir: Path,
        options: Mapping[str, bool],
    ) -> Spec:
        args = notes.get(PREFIX + SGLANG_ARGS)
        if not args and budget(gamma) <= 0:
            return "SGLang runs this drafter at a fixed γ, which is 0 at the declared batch"
        if not args:
            raise LaunchError(f"the decision is speculative but carries no {SGLANG_ARGS} annotation")
        refuse_conflicts(command, self.sets_speculation)
        extra = self._args(args)
        adaptive = notes.get(PREFIX + SGLANG_ADAPTIVE)
        table, warning, files = "", "", {}
        if adaptive and any(option_name(w) == "--enable-dp-attention" for w in command):
            # SGLang refuses its adaptive mode with DP attention (adaptive_spec_params.py:
            # adaptive_unsupported_reason): the table would not run, and the chain of
            # --speculative-num-steps is the table's largest γ. The fixed γ decided at the declared
            # batch instead, which holds at every batch up to it.
            why = "SGLang runs no adaptive table with --enable-dp-attention"
            if budget(gamma) <= 0:
                return why + " and γ at the declared batch is 0"
            extra = self._with_steps(extra, budget(gamma))
            adaptive = ""
            table = f" (fixed: {why})"
        if not any(option_name(w) == "--enable-metrics" for w in command):
            warning = (
                "; warning: SGLang exports no metrics without --enable-metrics: this engine's "
                "acceptance will not be learned and its neighbours' TPOT not measured"
            )
        if adaptive:
            path = config_dir / "sovereignspec-sglang-adaptive.json"
            files[str(path)] = adaptive
            extra += ["--speculative-adaptive", "--speculative-adaptive-config", str(path)]
            table = f", adaptive over {self._adaptive_ranges(adaptive)} batch ranges"
        return extra, table, warning, files

    def _args(self, text: str) -> list[str]:
        key = PREFIX + SGLANG_ARGS
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise LaunchError(f"{key} annotation: {exc}: {text[:120]!r}") from None
        for word in words[0::2]:
            if word not in self.flags:
                raise LaunchError(
                    f"{key} annotation: {word!r} is not a speculative flag SovereignSpec writes; "
                    f"accepted: {', '.join(self.flags)}, each with a value"
                )
        if len(words) % 2:
            raise LaunchError(f"{key} annotation: {words[-1]} has no value: {text[:120]!r}")
        return words

    @staticmethod
    def _with_steps(words: list[str], gamma: int) -> list[str]:
        """The flags with the draft chain set to `gamma` steps (`gamma` + 1 tokens verified)."""
        out = list(words)
        for i in range(0, len(out) - 1, 2):
            if out[i] == "--speculative-num-steps":
                out[i + 1] = str(gamma)
            elif out[i] == "--speculative-num-draft-tokens":
                out[i + 1] = str(gamma + 1)
        return out

    @staticmethod
    def _adaptive_ranges(text: str) -> int:
        key = PREFIX + SGLANG_ADAPTIVE
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
            raise LaunchError(f"{key} annotation: {text[:120]!r}; accepted: a JSON object of batch ranges")
        return len(doc)


SGLANG = SglangLauncher()
