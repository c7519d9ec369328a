"""`sovereignspec launch`: the serving container's entrypoint, between the decision and the engine.

    sovereignspec launch [--engine vllm|sglang] [--annotations FILE] -- vllm serve MODEL ...

Reads SovereignSpec's decision from the pod's annotations (a downward-API volume file), appends
the engine's own speculative arguments (nothing in plain mode), says in one line what it applied
and why, and replaces itself with the engine (exec: same PID, signals and exit code are the
engine's). A command that already sets a speculative argument is refused: it would override the
decision, and which of the two wins would depend on the engine's parser.

Standard library only, so that `sovereignspec launch --install PATH` can drop this one file into
an engine image that has Python but not this package (an init container does it; see README).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

PREFIX = "sovereignspec.io/"
DEFAULT_ANNOTATIONS = "/etc/podinfo/annotations"
# vLLM: --speculative-config (and its older spellings); SGLang: every --speculative-* flag.
VLLM_SPECULATIVE = (
    "--speculative-config",
    "--speculative_config",
    "--speculative-model",
    "--num-speculative-tokens",
)
SGLANG_SPECULATIVE = ("--speculative-", "--speculative_")
PER_BATCH = "num_speculative_tokens_per_batch_size"


class LaunchError(Exception):
    pass


def log(text: str) -> None:
    print(f"sovereignspec launch: {text}", file=sys.stderr, flush=True)


def read_annotations(path: Path) -> dict[str, str]:
    """The downward API's annotations file: one `key="value"` per line, the value a quoted string."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise LaunchError(
            f"cannot read the pod's annotations at {path} ({exc.strerror or exc}); mount them with a "
            "downwardAPI volume (fieldPath: metadata.annotations), or pass --annotations"
        ) from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        try:
            parsed = json.loads(value) if sep else None
        except ValueError:
            parsed = None
        if not isinstance(parsed, str):
            raise LaunchError(f'{path} line {n} is not key="value": {line[:120]!r}')
        out[key] = parsed
    return out


def engine_of(command: list[str]) -> str | None:
    """vllm or sglang, from the command's words (`vllm serve`, `python -m sglang.launch_server`)."""
    words = " ".join(Path(w).name if i == 0 else w for i, w in enumerate(command))
    if "sglang" in words:
        return "sglang"
    if "vllm" in words:
        return "vllm"
    return None


def _conflicts(command: list[str], prefixes: tuple[str, ...]) -> list[str]:
    return [w for w in command if w.startswith(prefixes)]


def plan(
    notes: dict[str, str], engine: str, command: list[str], config_dir: Path, vllm_legacy: bool = False
) -> tuple[list[str], str, dict[str, str]]:
    """(command to run, the line to log, files to write) for this decision."""
    mode = notes.get(PREFIX + "mode")
    if mode is None:
        return command, "no SovereignSpec decision on this pod: running the command as given", {}
    gamma = notes.get(PREFIX + "draft-budget", "0")
    where = f"{notes.get(PREFIX + 'gpu-type', '?')} ({notes.get(PREFIX + 'decided-at', '?')})"
    if mode != "speculative":
        return command, f"plain decode decided on {where}: running the command as given", {}
    files: dict[str, str] = {}
    if engine == "vllm":
        config = notes.get(PREFIX + "vllm-speculative-config")
        if not config:
            raise LaunchError("the decision is speculative but carries no vllm-speculative-config annotation")
        conflicts = _conflicts(command, VLLM_SPECULATIVE)
        if conflicts:
            raise LaunchError(_refusal(conflicts))
        doc = json.loads(config)
        if vllm_legacy and PER_BATCH in doc:
            # No per-batch table before vLLM 0.24: the fixed γ decided at the declared batch.
            doc.pop(PER_BATCH)
            if _int(gamma) <= 0:
                why = "vLLM < 0.24 reads no per-batch table and γ at the declared batch is 0"
                return command, f"plain decode decided on {where} ({why}): running the command as given", {}
            doc["num_speculative_tokens"] = _int(gamma)
        extra = ["--speculative-config", json.dumps(doc, separators=(",", ":"), sort_keys=True)]
        table = f", {len(doc[PER_BATCH])} batch ranges" if PER_BATCH in doc else ""
    else:
        args = notes.get(PREFIX + "sglang-args")
        if not args and _int(gamma) <= 0:
            why = "SGLang runs this drafter at a fixed γ, which is 0 at the declared batch"
            return command, f"plain decode decided on {where} ({why}): running the command as given", {}
        if not args:
            raise LaunchError("the decision is speculative but carries no sglang-args annotation")
        conflicts = _conflicts(command, SGLANG_SPECULATIVE)
        if conflicts:
            raise LaunchError(_refusal(conflicts))
        extra = shlex.split(args)
        adaptive = notes.get(PREFIX + "sglang-adaptive-config")
        table = ""
        if adaptive:
            path = config_dir / "sovereignspec-sglang-adaptive.json"
            files[str(path)] = adaptive
            extra += ["--speculative-adaptive", "--speculative-adaptive-config", str(path)]
            table = f", adaptive over {len(json.loads(adaptive))} batch ranges"
    light = " (0 at the declared batch: speculates only at lighter batches)" if _int(gamma) <= 0 else ""
    line = f"speculative γ={gamma}{light} decided on {where}{table}: appending {shlex.join(extra)}"
    return command + extra, line, files


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise LaunchError(f"draft-budget annotation: got {text!r}; accepted: an integer >= 0") from None


def _refusal(conflicts: list[str]) -> str:
    shown = ", ".join(sorted({c.split("=", 1)[0] for c in conflicts}))
    return (
        f"the command already sets {shown}, which would override SovereignSpec's decision; remove it "
        "(the decision's configuration is appended here), or run the engine without `sovereignspec launch`"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sovereignspec launch", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("vllm", "sglang"), help="default: from the command")
    parser.add_argument("--annotations", default=DEFAULT_ANNOTATIONS, help="downward-API annotations file")
    parser.add_argument(
        "--config-dir", default=None, help="where to write engine config files (default: $TMPDIR)"
    )
    parser.add_argument("--vllm-legacy", action="store_true", help=f"vLLM < 0.24: leave out {PER_BATCH}")
    parser.add_argument("--install", metavar="PATH", help="write this launcher (one file) to PATH and exit")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the engine's command line")
    args = parser.parse_args(argv)
    if args.install:
        Path(args.install).write_text(Path(__file__).read_text(encoding="utf-8"), encoding="utf-8")
        Path(args.install).chmod(0o755)
        log(f"installed at {args.install}")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        if not command:
            raise LaunchError(
                "no engine command given: sovereignspec launch [options] -- vllm serve MODEL ..."
            )
        engine = args.engine or engine_of(command)
        if engine is None:
            raise LaunchError(
                f"cannot tell the engine from {command[0]!r}: pass --engine vllm or --engine sglang"
            )
        notes = read_annotations(Path(args.annotations))
        config_dir = Path(args.config_dir or tempfile.gettempdir())
        final, line, files = plan(notes, engine, command, config_dir, args.vllm_legacy)
        for path, text in files.items():
            Path(path).write_text(text, encoding="utf-8")
    except (LaunchError, ValueError, OSError) as exc:
        log(f"error: {exc}")
        return 2
    log(line)
    try:
        os.execvp(final[0], final)
    except OSError as exc:
        log(f"error: cannot run {final[0]!r}: {exc.strerror or exc}")
        return 127
    return 0  # pragma: no cover (exec does not return)


if __name__ == "__main__":
    sys.exit(main())
