"""Argument types for the command line: each error names the argument, the value and what is
accepted."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """Errors as one usage line and one message, exit code 2, no traceback."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def bounded_float(name: str, low: float | None, high: float | None) -> Callable[[str], float]:
    accepted = (
        f"a number in [{low}, {high}]" if low is not None and high is not None else f"a number >= {low}"
    )

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"got {text!r}; accepted: {accepted}") from None
        if (low is not None and value < low) or (high is not None and value > high) or math.isnan(value):
            raise argparse.ArgumentTypeError(f"got {text!r}; accepted: {accepted}")
        return value

    return parse


def bounded_int(name: str, low: int, high: int | None) -> Callable[[str], int]:
    accepted = f"an integer in {low}..{high}" if high is not None else f"an integer >= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"got {text!r}; accepted: {accepted}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"got {text!r}; accepted: {accepted}")
        return value

    return parse


def float_list(name: str, low: float, high: float) -> Callable[[str], tuple[float, ...]]:
    one = bounded_float(name, low, high)

    def parse(text: str) -> tuple[float, ...]:
        values = tuple(one(part) for part in text.split(",") if part.strip())
        if not values:
            raise argparse.ArgumentTypeError(
                f"got {text!r}; accepted: comma-separated numbers in [{low}, {high}]"
            )
        return values

    return parse


def id_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    try:
        ids = (int(low), int(high))
    except ValueError:
        ids = (-1, -1)
    if not sep or ids[0] < 0 or ids[1] <= ids[0]:
        raise argparse.ArgumentTypeError(f"--prompt-ids: got {text!r}; accepted: LOW:HIGH, 0 <= LOW < HIGH")
    return ids


def int_list(name: str, low: int, high: int) -> Callable[[str], tuple[int, ...]]:
    one = bounded_int(name, low, high)

    def parse(text: str) -> tuple[int, ...]:
        values = tuple(one(part.strip()) for part in text.split(",") if part.strip())
        if not values:
            raise argparse.ArgumentTypeError(
                f"got {text!r}; accepted: comma-separated integers in {low}..{high}"
            )
        return values

    return parse
