"""`sovereignspec launch`: the serving container's entrypoint, between the decision and the engine.

    sovereignspec launch [--engine vllm|sglang] [--annotations FILE] -- vllm serve MODEL ...

Reads SovereignSpec's decision from the pod's annotations (a downward-API volume file), appends
the engine's own speculative arguments (nothing in plain mode), says in one line what it applied
and why, and replaces itself with the engine (exec: same PID, signals and exit code are the
engine's). A command that already sets a speculative argument is refused whatever the decision:
under a speculative one it would override the decision (which of the two wins would depend on the
engine's parser); under a plain one it would speculate on a GPU whose neighbours the plain
decision protects.

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
from typing import Any

# The keys the operator writes (sovereignspec/keys.py). `--install` replaces this import by that
# module's definitions, so the installed file needs nothing but the standard library.
from sovereignspec.keys import (  # inline: sovereignspec/keys.py
    BUDGET,
    DECIDED_AT,
    GPU_TYPE,
    MODE,
    PREFIX,
    SGLANG_ADAPTIVE,
    SGLANG_ARGS,
    VLLM_CONFIG,
    VLLM_PER_BATCH,
)

DEFAULT_ANNOTATIONS = "/etc/podinfo/annotations"
# Every spelling that sets speculation. vLLM 0.32 (vllm/engine/arg_utils.py): --speculative-config
# and its short -sc, the top-level --spec-method/--spec-model/--spec-tokens, the pre-0.7 flags; its
# parser also takes underscores for dashes, `--opt.key value` for one key of a JSON option, any
# unambiguous prefix (argparse's abbreviations) and the keys of a `--config` YAML file. SGLang: every
# --speculative-* flag, with the same argparse prefixes and its own `--config` file.
VLLM_SPECULATIVE = (
    "--speculative-config",
    "-sc",
    "--spec-method",
    "--spec-model",
    "--spec-tokens",
    "--speculative-model",
    "--num-speculative-tokens",
)
SGLANG_SPECULATIVE = ("--speculative-",)
VLLM_DATA_PARALLEL = ("--data-parallel-size", "-dp")
PER_BATCH = VLLM_PER_BATCH
MODES = ("speculative", "plain")
# What the operator writes (sovereignspec/engines/), and nothing else: a rewritten annotation
# cannot smuggle another engine argument or setting through the launcher.
VLLM_KEYS = ("method", "model", "num_speculative_tokens", PER_BATCH, "prompt_lookup_min", "prompt_lookup_max")
SGLANG_FLAGS = (
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    "--speculative-ngram-min-bfs-breadth",
    "--speculative-ngram-max-bfs-breadth",
)


def standalone() -> str:
    """This module as one file for an engine image: the import of `sovereignspec.keys` replaced
    by that module's definitions."""
    source = Path(__file__).read_text(encoding="utf-8")
    keys = (Path(__file__).parent / "keys.py").read_text(encoding="utf-8")
    definitions = keys.split('"""', 2)[2].strip()  # after its docstring
    start = source.index("from sovereignspec.keys import (")
    end = source.index(")", start) + 1
    return source[:start] + definitions + source[end:]


class LaunchError(Exception):
    pass


def log(text: str) -> None:
    print(f"sovereignspec launch: {text}", file=sys.stderr, flush=True)


# Go's strconv.Quote escapes (the kubelet writes each value with `%q`: pkg/fieldpath FormatMap).
_GO_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_GO_ESCAPES.update({"\\": "\\", '"': '"', "'": "'"})
_GO_HEX = {"x": 2, "u": 4, "U": 8}


def unquote_go(quoted: str) -> str:
    r"""The string a Go `%q` (strconv.Quote) wrote: escapes \a \b \f \n \r \t \v \\ \", \xNN (a byte),
    \NNN (octal byte), \uNNNN and \UNNNNNNNN; anything else printable as itself. ValueError otherwise."""
    if len(quoted) < 2 or quoted[0] != '"' or quoted[-1] != '"':
        raise ValueError("not a double-quoted string")
    body, out, i = quoted[1:-1], bytearray(), 0
    while i < len(body):
        c = body[i]
        if c == '"':
            raise ValueError(f"unescaped quote at {i}")
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        e = body[i + 1 : i + 2]
        if e in _GO_ESCAPES:
            out += _GO_ESCAPES[e].encode("utf-8")
            i += 2
        elif e in _GO_HEX:
            digits = body[i + 2 : i + 2 + _GO_HEX[e]]
            if len(digits) != _GO_HEX[e] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"bad \\{e} escape at {i}")
            value = int(digits, 16)
            if e == "x":
                out.append(value)
            else:
                out += chr(value).encode("utf-8", "surrogatepass")
            i += 2 + _GO_HEX[e]
        elif e and e in "01234567":
            digits = body[i + 1 : i + 4]
            if len(digits) != 3 or any(d not in "01234567" for d in digits) or int(digits, 8) > 255:
                raise ValueError(f"bad octal escape at {i}")
            out.append(int(digits, 8))
            i += 4
        else:
            raise ValueError(f"unknown escape {e!r} at {i}")
    return out.decode("utf-8", "replace")


def read_annotations(path: Path) -> dict[str, str]:
    """The downward API's annotations file: one `key="value"` per line, the value Go-quoted.

    A line that is not ours and cannot be read is skipped: whatever a neighbour's annotation holds,
    it does not stop the engine. One of ours that cannot be read is an error naming it."""
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except OSError as exc:
        raise LaunchError(
            f"cannot read the pod's annotations at {path} ({exc.strerror or exc}); mount them with a "
            "downwardAPI volume (fieldPath: metadata.annotations), or pass --annotations"
        ) from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.split("\n"), 1):  # %q escapes every other line break
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        try:
            parsed: str | None = unquote_go(value) if sep else None
        except ValueError:
            parsed = None
        if parsed is None:
            if key.startswith(PREFIX):
                raise LaunchError(f'{path} line {n}: annotation {key} is not key="value": {line[:120]!r}')
            continue
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


def option_name(word: str) -> str | None:
    """The option a command word names, as the engines' parsers read it: `--a_b.c=1` is `--a-b`,
    `-sc.x` is `-sc`; None for a value."""
    if not word.startswith("-") or word == "-" or word[1:2].isdigit():
        return None
    name = word.split("=", 1)[0].split(".", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def sets_speculation(name: str, engine: str) -> bool:
    """Whether option `name` (`option_name`) sets speculation in `engine`, abbreviations included."""
    if engine == "vllm":
        if name in VLLM_SPECULATIVE:
            return True
        spellings = [s for s in VLLM_SPECULATIVE if s.startswith("--")]
    else:
        if name.startswith(SGLANG_SPECULATIVE):
            return True
        spellings = list(SGLANG_SPECULATIVE)
    # A prefix short of "spec" means other options too (vLLM's --sparse-*, --num-gpu-*), which
    # argparse resolves to them or refuses as ambiguous.
    return name.startswith("--") and "spec" in name and any(s.startswith(name) for s in spellings)


def _option_value(command: list[str], names: tuple[str, ...]) -> tuple[str, str] | None:
    """(word, value) of the first of `names` in the command: `--x v` or `--x=v`."""
    for i, word in enumerate(command):
        name = option_name(word)
        if name in names:
            if "=" in word:
                return word, word.split("=", 1)[1]
            return word, command[i + 1] if i + 1 < len(command) else ""
    return None


def config_file_keys(path: Path) -> list[str]:
    """The top-level keys of an engine's `--config` file (YAML, or JSON, which YAML reads too), read
    without a YAML library: this launcher is one standard-library file."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise LaunchError(
            f"cannot read the engine's --config file {path} ({exc.strerror or exc}) to check that it "
            "sets no speculation"
        ) from None
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            return [str(k) for k in doc]
    keys = []
    for line in text.splitlines():
        if line[:1] in (" ", "\t", "-", "#") or ":" not in line:
            continue  # nested, a list item, a comment
        key = line.split(":", 1)[0].strip().strip("'\"")
        if key:
            keys.append(key)
    return keys


def _conflicts(command: list[str], engine: str) -> list[str]:
    found = []
    for word in command:
        name = option_name(word)
        if name is not None and sets_speculation(name, engine):
            found.append(word)
    config = _option_value(command, ("--config",))
    if config is not None:
        for key in config_file_keys(Path(config[1])):
            if sets_speculation("--" + key.replace("_", "-"), engine):
                found.append(f"{key} (in --config {config[1]})")
    return found


def _data_parallel(command: list[str]) -> int:
    found = _option_value(command, VLLM_DATA_PARALLEL)
    if found is None:
        return 1
    try:
        return int(found[1])
    except ValueError:
        raise LaunchError(f"{found[0]}: got {found[1]!r}; accepted: an integer >= 1") from None


def plan(
    notes: dict[str, str], engine: str, command: list[str], config_dir: Path, vllm_legacy: bool = False
) -> tuple[list[str], str, dict[str, str]]:
    """(command to run, the line to log, files to write) for this decision."""
    mode = notes.get(PREFIX + MODE)
    if mode is None:
        return command, "no SovereignSpec decision on this pod: running the command as given", {}
    if mode not in MODES:
        raise LaunchError(f"{PREFIX}{MODE} annotation: got {mode!r}; accepted: {', '.join(MODES)}")
    gamma = notes.get(PREFIX + BUDGET, "0")
    where = f"{notes.get(PREFIX + GPU_TYPE, '?')} ({notes.get(PREFIX + DECIDED_AT, '?')})"
    if mode != "speculative":
        return _plain(command, engine, f"plain decode decided on {where}")
    files: dict[str, str] = {}
    warning = ""
    if engine == "vllm":
        config = notes.get(PREFIX + VLLM_CONFIG)
        if not config:
            raise LaunchError(f"the decision is speculative but carries no {VLLM_CONFIG} annotation")
        conflicts = _conflicts(command, "vllm")
        if conflicts:
            raise LaunchError(_refusal(conflicts))
        doc = _vllm_config(config)
        ranks = _data_parallel(command)
        fixed = ""
        if vllm_legacy and PER_BATCH in doc:
            fixed = "vLLM < 0.24 reads no per-batch table"
        elif ranks > 1 and PER_BATCH in doc:
            # vLLM drops the table under data parallelism and runs num_speculative_tokens at every
            # batch (config/vllm.py _maybe_disable_dynamic_sd_for_data_parallel): the table's largest
            # K, which the decision never allowed at the declared batch.
            fixed = f"vLLM drops the per-batch table with data parallelism ({ranks} ranks)"
        if fixed:
            # The fixed γ decided at the declared batch, which holds at every batch up to it.
            doc.pop(PER_BATCH)
            if _int(gamma) <= 0:
                why = f"{fixed} and γ at the declared batch is 0"
                return _plain(command, engine, f"plain decode decided on {where} ({why})")
            doc["num_speculative_tokens"] = _int(gamma)
        extra = ["--speculative-config", json.dumps(doc, separators=(",", ":"), sort_keys=True)]
        table = f", {len(doc[PER_BATCH])} batch ranges" if PER_BATCH in doc else ""
        if fixed:
            table = f" (fixed: {fixed})"
    else:
        args = notes.get(PREFIX + SGLANG_ARGS)
        if not args and _int(gamma) <= 0:
            why = "SGLang runs this drafter at a fixed γ, which is 0 at the declared batch"
            return _plain(command, engine, f"plain decode decided on {where} ({why})")
        if not args:
            raise LaunchError(f"the decision is speculative but carries no {SGLANG_ARGS} annotation")
        conflicts = _conflicts(command, "sglang")
        if conflicts:
            raise LaunchError(_refusal(conflicts))
        extra = _sglang_args(args)
        adaptive = notes.get(PREFIX + SGLANG_ADAPTIVE)
        table = ""
        if adaptive and any(option_name(w) == "--enable-dp-attention" for w in command):
            # SGLang refuses its adaptive mode with DP attention (adaptive_spec_params.py:
            # adaptive_unsupported_reason): the table would not run, and the chain of
            # --speculative-num-steps is the table's largest γ. The fixed γ decided at the declared
            # batch instead, which holds at every batch up to it.
            steps = _int(gamma)
            why = "SGLang runs no adaptive table with --enable-dp-attention"
            if steps <= 0:
                why += " and γ at the declared batch is 0"
                return _plain(command, engine, f"plain decode decided on {where} ({why})")
            extra = _with_steps(extra, steps)
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
            table = f", adaptive over {_adaptive_ranges(adaptive)} batch ranges"
    light = " (0 at the declared batch: speculates only at lighter batches)" if _int(gamma) <= 0 else ""
    line = f"speculative γ={gamma}{light} decided on {where}{table}: appending {shlex.join(extra)}{warning}"
    return command + extra, line, files


def _plain(command: list[str], engine: str, decided: str) -> tuple[list[str], str, dict[str, str]]:
    """The command as given under a plain decision, unless it speculates on its own: a plain
    decision is the one that protects the GPU's neighbours, so the command may not undo it."""
    conflicts = _conflicts(command, engine)
    if conflicts:
        shown = ", ".join(sorted({c if " (in --config" in c else c.split("=", 1)[0] for c in conflicts}))
        raise LaunchError(
            f"{decided}, but the command sets {shown}, which would make the engine speculate against "
            "the decision; remove it, or declare what the workload needs and let SovereignSpec decide"
        )
    return command, f"{decided}: running the command as given", {}


def _vllm_config(text: str) -> dict[str, Any]:
    key = PREFIX + VLLM_CONFIG
    try:
        doc = json.loads(text)
    except ValueError:
        raise LaunchError(f"{key} annotation: not JSON: {text[:120]!r}; accepted: a JSON object") from None
    if not isinstance(doc, dict):
        raise LaunchError(
            f"{key} annotation: got {type(doc).__name__} {text[:60]!r}; accepted: a JSON object"
        )
    unknown = sorted(set(doc) - set(VLLM_KEYS))
    if unknown:
        raise LaunchError(f"{key} annotation: unknown key(s) {unknown}; accepted: {', '.join(VLLM_KEYS)}")
    k = doc.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise LaunchError(f"{key} annotation: num_speculative_tokens {k!r}; accepted: an integer >= 1")
    table = doc.get(PER_BATCH, [])
    if not isinstance(table, list) or not all(
        isinstance(r, list) and len(r) == 3 and all(type(x) is int for x in r) for r in table
    ):
        raise LaunchError(f"{key} annotation: {PER_BATCH} {table!r}; accepted: [[low, high, K], ...]")
    return doc


def _sglang_args(text: str) -> list[str]:
    key = PREFIX + SGLANG_ARGS
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise LaunchError(f"{key} annotation: {exc}: {text[:120]!r}") from None
    for word in words[0::2]:
        if word not in SGLANG_FLAGS:
            raise LaunchError(
                f"{key} annotation: {word!r} is not a speculative flag SovereignSpec writes; "
                f"accepted: {', '.join(SGLANG_FLAGS)}, each with a value"
            )
    if len(words) % 2:
        raise LaunchError(f"{key} annotation: {words[-1]} has no value: {text[:120]!r}")
    return words


def _with_steps(words: list[str], gamma: int) -> list[str]:
    """SGLang's flags with the draft chain set to `gamma` steps (`gamma` + 1 tokens verified)."""
    out = list(words)
    for i in range(0, len(out) - 1, 2):
        if out[i] == "--speculative-num-steps":
            out[i + 1] = str(gamma)
        elif out[i] == "--speculative-num-draft-tokens":
            out[i + 1] = str(gamma + 1)
    return out


def _adaptive_ranges(text: str) -> int:
    key = PREFIX + SGLANG_ADAPTIVE
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not all(isinstance(v, dict) for v in doc.values()):
        raise LaunchError(f"{key} annotation: {text[:120]!r}; accepted: a JSON object of batch ranges")
    return len(doc)


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise LaunchError(f"draft-budget annotation: got {text!r}; accepted: an integer >= 0") from None


def _refusal(conflicts: list[str]) -> str:
    shown = ", ".join(sorted({c if " (in --config" in c else c.split("=", 1)[0] for c in conflicts}))
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
        Path(args.install).write_text(standalone(), encoding="utf-8")
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
