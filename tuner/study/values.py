"""The kinds of value a setting takes (a positive integer, a finite number of seconds ≥ 0, a factor above 1 or off),
each written once for both faces: `read` turns a flag's text into its value (the command line), `check` takes a
keyword's value as it is (the Python API). Either says what is wrong in one line, as a ValueError; the command line
prints it as argparse's one-line error (exit 2, `tuner.cli.args.flag_type`), the API as an `InputError` naming the
keyword.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Number:
    """A number a setting takes: `ok` says which. The command line says `expected` of a text that is no number and
    `must` of a number out of range; the API says `wanted` of any value that will not do."""

    #: what the text should have been, e.g. "a positive number"
    expected: str
    ok: Callable[[float], bool]
    #: the range, e.g. "> 0"
    must: str
    #: the one line the API gives for a wrong value, e.g. "a positive number of milliseconds"
    wanted: str
    integer: bool = False
    #: flag words (case and spaces aside) that turn the setting off, i.e. None; the API takes None itself
    off: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return "int" if self.integer else "float"

    def read(self, text: str) -> Any:
        if self.off and text.strip().lower() in self.off:
            return None
        try:
            value = int(text) if self.integer else float(text)
        except ValueError:
            raise ValueError(f"expected {self.expected}, got {text!r}") from None
        if not self.ok(value):
            raise ValueError(f"must be {self.must}, got {value if self.integer else text}")
        return value

    def check(self, value: Any) -> Any:
        if value is None and self.off:
            return None
        numeric = numbers.Integral if self.integer else numbers.Real
        if isinstance(value, bool) or not isinstance(value, numeric) or not self.ok(float(value)):
            raise ValueError(self.wanted)
        return value

    def wanting(self, wanted: str) -> Number:
        """This kind, with the API's words for a setting of it (its unit, say)."""
        return replace(self, wanted=wanted)


@dataclass(frozen=True)
class Integer:
    """Any integer (a seed); a text that is none gets argparse's own words for ``type=int``."""

    name = "int"

    def read(self, text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"invalid int value: {text!r}") from None

    def check(self, value: Any) -> Any:
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise ValueError("an integer, or None")
        return value


Kind = Number | Integer

POSITIVE_INT = Number("a positive integer", lambda v: v >= 1, "≥ 1", "a positive integer", integer=True)
POSITIVE = Number("a positive number", lambda v: v > 0, "> 0", "a positive number")
SECONDS = Number(
    "a number of seconds", lambda v: 0 <= v < math.inf, "a finite number ≥ 0", "a finite number of seconds ≥ 0"
)
INTEGER = Integer()
