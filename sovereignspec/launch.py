"""`sovereignspec launch`: the serving container's entrypoint, between the decision and the engine.

    sovereignspec launch [--engine ENGINE] [--annotations FILE] -- ENGINE COMMAND ...

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
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

# The keys the operator writes (sovereignspec/keys.py), the engines it can start and what they
# share. `--install` replaces each import marked `inline` by that module's definitions (and theirs
# in turn), so the installed file needs nothing but the standard library.
from sovereignspec.engines.launchers import LAUNCHERS  # inline: sovereignspec/engines/launchers.py
from sovereignspec.keys import BUDGET, DECIDED_AT, GPU_TYPE, MODE, PREFIX  # inline: sovereignspec/keys.py
from sovereignspec.launchkit import (  # inline: sovereignspec/launchkit.py
    Launcher,
    LaunchError,
    budget,
    config_file_keys,
    conflicts,
    option_name,
    shown,
)

__all__ = ["LaunchError", "config_file_keys", "option_name"]  # read from here by tests and tools
DEFAULT_ANNOTATIONS = "/etc/podinfo/annotations"
MODES = ("speculative", "plain")
_INLINE = re.compile(
    r"^from \S+ import (?:\(  # inline: (?P<a>[\w/.]+)\n[^)]*\)|[^\n]*  # inline: (?P<b>[\w/.]+))[^\n]*\n",
    re.M,
)
_ROOT = Path(__file__).resolve().parent.parent


def standalone() -> str:
    """This module as one file for an engine image: each import marked `inline` replaced by that
    module's definitions (after its docstring; its own inlined imports first, each module once)."""
    done: set[str] = set()

    def expand(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            path = match.group("a") or match.group("b")
            if path in done:
                return ""
            done.add(path)
            body = (_ROOT / path).read_text(encoding="utf-8")
            body = body.split('"""', 2)[2] if body.lstrip().startswith('"""') else body
            body = body.replace("from __future__ import annotations\n", "")
            return f"# -- {path} --\n{expand(body).strip()}\n\n"

        return _INLINE.sub(one, text)

    return expand(Path(__file__).read_text(encoding="utf-8"))


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


def launcher(name: str) -> Launcher:
    return next(e for e in LAUNCHERS if e.name == name)


def engine_of(command: list[str]) -> str | None:
    """The engine a command starts, from its words (each launcher's `detects`)."""
    words = " ".join(Path(w).name if i == 0 else w for i, w in enumerate(command))
    return next((e.name for e in LAUNCHERS if e.detects(words)), None)


def sets_speculation(name: str, engine: str) -> bool:
    """Whether option `name` (`option_name`) sets speculation in `engine`, abbreviations included."""
    return launcher(engine).sets_speculation(name)


def plan(
    notes: dict[str, str],
    engine: str,
    command: list[str],
    config_dir: Path,
    options: Mapping[str, bool] | None = None,
) -> tuple[list[str], str, dict[str, str]]:
    """(command to run, the line to log, files to write) for this decision; `options`: the
    engine's own (`Launcher.options`)."""
    mode = notes.get(PREFIX + MODE)
    if mode is None:
        return command, "no SovereignSpec decision on this pod: running the command as given", {}
    if mode not in MODES:
        raise LaunchError(f"{PREFIX}{MODE} annotation: got {mode!r}; accepted: {', '.join(MODES)}")
    gamma = notes.get(PREFIX + BUDGET, "0")
    where = f"{notes.get(PREFIX + GPU_TYPE, '?')} ({notes.get(PREFIX + DECIDED_AT, '?')})"
    if mode != "speculative":
        return _plain(command, engine, f"plain decode decided on {where}")
    spec = launcher(engine).plan(notes, command, gamma, config_dir, options or {})
    if isinstance(spec, str):  # what the engine cannot run of the decision leaves it plain
        return _plain(command, engine, f"plain decode decided on {where} ({spec})")
    extra, table, warning, files = spec
    light = " (0 at the declared batch: speculates only at lighter batches)" if budget(gamma) <= 0 else ""
    line = f"speculative γ={gamma}{light} decided on {where}{table}: appending {shlex.join(extra)}{warning}"
    return command + extra, line, files


def _plain(command: list[str], engine: str, decided: str) -> tuple[list[str], str, dict[str, str]]:
    """The command as given under a plain decision, unless it speculates on its own: a plain
    decision is the one that protects the GPU's neighbours, so the command may not undo it."""
    found = conflicts(command, launcher(engine).sets_speculation)
    if found:
        raise LaunchError(
            f"{decided}, but the command sets {shown(found)}, which would make the engine speculate against "
            "the decision; remove it, or declare what the workload needs and let SovereignSpec decide"
        )
    return command, f"{decided}: running the command as given", {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sovereignspec launch", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=[e.name for e in LAUNCHERS], help="default: from the command")
    parser.add_argument("--annotations", default=DEFAULT_ANNOTATIONS, help="downward-API annotations file")
    parser.add_argument(
        "--config-dir", default=None, help="where to write engine config files (default: $TMPDIR)"
    )
    for known in LAUNCHERS:
        for flag, said in known.options:
            parser.add_argument(flag, action="store_true", help=said)
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
            raise LaunchError("no engine command given: sovereignspec launch [options] -- ENGINE COMMAND ...")
        engine = args.engine or engine_of(command)
        if engine is None:
            raise LaunchError(
                f"cannot tell the engine from {command[0]!r}: pass --engine "
                + " or --engine ".join(e.name for e in LAUNCHERS)
            )
        notes = read_annotations(Path(args.annotations))
        config_dir = Path(args.config_dir or tempfile.gettempdir())
        dests = (flag[2:].replace("-", "_") for e in LAUNCHERS for flag, _ in e.options)
        chosen = {name: bool(getattr(args, name)) for name in dests}
        final, line, files = plan(notes, engine, command, config_dir, chosen)
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
