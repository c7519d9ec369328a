"""What `sovereignspec launch` needs from every engine's launcher, and the helpers they share:
reading a command line as the engines' parsers do. Standard library only, like the launcher, into
whose one installed file `launch --install` writes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # no file system here at import: the engine modules import this one
    from pathlib import Path


class LaunchError(Exception):
    pass


# What a speculative decision adds: (arguments, what the log says of the table, a warning, files to
# write); or, as text, why the engine runs it as plain decode.
Spec = tuple[list[str], str, str, dict[str, str]] | str


class Launcher(Protocol):
    """One engine as its container's entrypoint sees it."""

    name: str  # as `--engine` takes it
    # (flag, help) of store-true options `launch` offers for this engine; the launcher reads each
    # from `options` under the flag's name without dashes, dashes as underscores.
    options: tuple[tuple[str, str], ...]

    def detects(self, words: str) -> bool:
        """Whether the command's words (the program's base name first) start this engine."""
        ...

    def sets_speculation(self, name: str) -> bool:
        """Whether option `name` (`option_name`) sets speculation in this engine, abbreviations
        included."""
        ...

    def plan(
        self,
        notes: Mapping[str, str],
        command: list[str],
        gamma: str,
        config_dir: Path,
        options: Mapping[str, bool],
    ) -> Spec:
        """What a speculative decision (`notes`, γ `gamma` at the declared batch) adds to `command`."""
        ...


def option_name(word: str) -> str | None:
    """The option a command word names, as the engines' parsers read it: `--a_b.c=1` is `--a-b`,
    `-sc.x` is `-sc`; None for a value."""
    if not word.startswith("-") or word == "-" or word[1:2].isdigit():
        return None
    name = word.split("=", 1)[0].split(".", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def prefix_of(name: str, spellings: list[str]) -> bool:
    """Whether `name` is an abbreviation argparse would resolve to one of `spellings`. A prefix
    short of "spec" means other options too (--sparse-*, --num-gpu-*), which argparse resolves to
    them or refuses as ambiguous."""
    return name.startswith("--") and "spec" in name and any(s.startswith(name) for s in spellings)


def option_value(command: list[str], names: tuple[str, ...]) -> tuple[str, str] | None:
    """(word, value) of the first of `names` in the command: `--x v` or `--x=v`."""
    for i, word in enumerate(command):
        name = option_name(word)
        if name in names:
            if "=" in word:
                return word, word.split("=", 1)[1]
            return word, command[i + 1] if i + 1 < len(command) else ""
    return None


def config_file_keys(path: str | Path) -> list[str]:
    """The top-level keys of an engine's `--config` file (YAML, or JSON, which YAML reads too), read
    without a YAML library: this launcher is one standard-library file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
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


def conflicts(command: list[str], sets_speculation: Callable[[str], bool]) -> list[str]:
    """The command's words (and `--config` file keys) that set speculation."""
    found = []
    for word in command:
        name = option_name(word)
        if name is not None and sets_speculation(name):
            found.append(word)
    config = option_value(command, ("--config",))
    if config is not None:
        for key in config_file_keys(config[1]):
            if sets_speculation("--" + key.replace("_", "-")):
                found.append(f"{key} (in --config {config[1]})")
    return found


def shown(found: list[str]) -> str:
    """The options `conflicts` found, each once, as a user reads them."""
    return ", ".join(sorted({c if " (in --config" in c else c.split("=", 1)[0] for c in found}))


def refuse_conflicts(command: list[str], sets_speculation: Callable[[str], bool]) -> None:
    """A speculative decision's configuration is appended: a command that sets its own would
    override it (which of the two wins depends on the engine's parser)."""
    found = conflicts(command, sets_speculation)
    if found:
        raise LaunchError(
            f"the command already sets {shown(found)}, which would override SovereignSpec's decision; "
            "remove it (the decision's configuration is appended here), or run the engine without "
            "`sovereignspec launch`"
        )


def budget(text: str) -> int:
    """The draft budget annotation's γ."""
    try:
        return int(text)
    except ValueError:
        raise LaunchError(f"draft-budget annotation: got {text!r}; accepted: an integer >= 0") from None
