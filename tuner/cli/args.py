"""Argument types of the command line: each turns a flag's text into its value, or says in one line what is wrong."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from tuner.study.values import POSITIVE, POSITIVE_INT, SECONDS, Kind


def flag_type(kind: Kind) -> Callable[[str], Any]:
    """`kind` (`tuner.study.values`) as an argparse type: the flag's value, or argparse's one-line error (exit 2) in the
    kind's words."""

    def read(text: str) -> Any:
        try:
            return kind.read(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return read


positive_int = flag_type(POSITIVE_INT)
positive_float = flag_type(POSITIVE)
seconds = flag_type(SECONDS)


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {value}")
    return value
