"""vLLM's own argument parser and configuration classes, asked about what SovereignSpec emits.

Run with the engine's Python: `python vllm_parse.py options` prints every option string of
`vllm serve` with the config field it sets; `python vllm_parse.py configs FILE` reads a JSON list of
{"model": DIR, "argv": [...]} and, for each, parses `serve MODEL ARGV...` with vLLM's parser, builds the
engine's whole configuration (its SpeculativeConfig included: the draft checkpoint is read) and
prints what vLLM made of the speculative part, or the error it raised.
"""

from __future__ import annotations

import json
import sys

from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser


def parser() -> FlexibleArgumentParser:
    return make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))


def options() -> None:
    out = []
    for action in parser()._actions:
        out.extend({"option": o, "dest": action.dest} for o in action.option_strings)
    print(json.dumps(out))


def configs(path: str) -> None:
    results = []
    with open(path) as f:
        cases = json.load(f)
    for case in cases:
        try:
            args = parser().parse_args(["--model", case["model"], *case["argv"]])
            config = EngineArgs.from_cli_args(args).create_engine_config()
            spec = config.speculative_config
            results.append(
                {
                    "ok": True,
                    "method": spec.method if spec else None,
                    "k": spec.num_speculative_tokens if spec else 0,
                    "table": [list(r) for r in spec.num_speculative_tokens_per_batch_size or []]
                    if spec
                    else [],
                }
            )
        except (Exception, SystemExit) as exc:  # what vLLM says is the result
            results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]})
    print(json.dumps(results))


if __name__ == "__main__":
    {"options": options, "configs": lambda: configs(sys.argv[2])}[sys.argv[1]]()
