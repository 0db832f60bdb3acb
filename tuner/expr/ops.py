"""The operators and functions a space expression may use, each bounded so that a space file cannot hang or
exhaust the process that reads it.

``**`` refuses exponents above `MAX_EXPONENT` and results above `MAX_INT_BITS` bits, ``*`` refuses integers above
`MAX_INT_BITS` bits and strings or tuples longer than `MAX_SEQUENCE`, and ``%`` never formats strings. A refused
operation raises `ExprLimit` (an ArithmeticError, so a constraint that hits a limit rules its config out like any
other arithmetic fault). `tuner.expr` evaluates expressions config by config with these tables;
`tuner.expr.arrays` over NumPy arrays with the same ones.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from typing import Any

Env = Mapping[str, Any]


MAX_EXPONENT = 64


MAX_INT_BITS = 4096


MAX_SEQUENCE = 4096


class ExprLimit(ArithmeticError):
    """An operation whose result would exceed an expression bound (too large a power, integer or string)."""


def _pow(base, exponent):
    if isinstance(exponent, int) and not isinstance(exponent, bool) and isinstance(base, int):
        if exponent > MAX_EXPONENT and base not in (0, 1, -1):
            raise ExprLimit(f"exponent {exponent} is above the limit of {MAX_EXPONENT}")
        if exponent > 0 and abs(base).bit_length() * exponent > MAX_INT_BITS:
            raise ExprLimit(f"{base}**{exponent} has more than {MAX_INT_BITS} bits")
    return operator.pow(base, exponent)


def _mul(a, b):
    if isinstance(a, str | tuple) or isinstance(b, str | tuple):
        count, seq = (b, a) if isinstance(a, str | tuple) else (a, b)
        if isinstance(count, int) and count * len(seq) > MAX_SEQUENCE:
            raise ExprLimit(f"a repeated string or tuple longer than {MAX_SEQUENCE} items")
        return a * b
    result = a * b
    if isinstance(result, int) and result.bit_length() > MAX_INT_BITS:
        raise ExprLimit(f"a product with more than {MAX_INT_BITS} bits")
    return result


def _mod(a, b):
    if isinstance(a, str):
        raise TypeError("string formatting with % is not allowed")
    return operator.mod(a, b)


def ceil_div(a, b):
    """Integer division rounding up (also what templates' launch geometry uses)."""
    return -(-a // b)


def _is_pow2(n):
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


def _log2(n):
    return int(math.log2(n)) if _is_pow2(n) else math.log2(n)


#: The only functions an expression may call.
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "min": min,
    "max": max,
    "abs": abs,
    "ceil_div": ceil_div,
    "is_pow2": _is_pow2,
    "log2": _log2,
}


BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: _mod,
    ast.Pow: _pow,
}


UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}


COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
