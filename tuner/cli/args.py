"""Argument types of the command line: each turns a flag's text into its value, or says in one line what is wrong."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def number(text: str, expected: str, ok: Callable[[float], bool], must: str) -> float:
    """A float flag's value; an ArgumentTypeError (argparse's one-line error, exit 2) unless `ok(value)`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {must}, got {text}")
    return value


def seconds(text: str) -> float:
    return number(text, "a number of seconds", lambda v: 0 <= v < float("inf"), "a finite number ≥ 0")


def positive_float(text: str) -> float:
    return number(text, "a positive number", lambda v: v > 0, "> 0")


def screen_cutoff(text: str) -> float | None:
    """--screen-cutoff: a factor above 1, or 0 / off for none."""
    if text.strip().lower() in ("0", "off", "none"):
        return None
    return number(
        text, "a factor above 1 or off", lambda v: v > 1, "above 1 or off (at 1 or below even a new best would be cut)"
    )


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {value}")
    return value
