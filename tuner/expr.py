"""Safe expressions for constraints and derived values.

A space's constraints (``threads <= 1024``) and derived values (``threads: tile_m * tile_n // (thread_m *
thread_n)``) are data, not code. They are parsed with `ast`, checked against a whitelist of node types, and
turned into a tree of small closures; nothing ever reaches `eval` or `exec`. The closures are much faster than
re-walking the AST per config, which matters when a space has hundreds of thousands of Cartesian points.

Expressions are bounded, so a space file cannot hang or exhaust the process that reads it: the text is at most
`MAX_CHARS` characters, the tree at most `MAX_NODES` nodes and `MAX_DEPTH` levels deep (checked before the tree is
walked recursively), ``**`` refuses exponents above `MAX_EXPONENT` and results above `MAX_INT_BITS` bits, ``*``
refuses integers above `MAX_INT_BITS` bits and strings or tuples longer than `MAX_SEQUENCE`, and ``%`` never
formats strings. A refused operation raises `ExprLimit` (an ArithmeticError, so a constraint that hits a limit
rules its config out like any other arithmetic fault).
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Env = Mapping[str, Any]

MAX_CHARS = 4096
MAX_NODES = 1000
MAX_DEPTH = 64
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

_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: _mod,
    ast.Pow: _pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Not: operator.not_,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


class ExprError(ValueError):
    """An expression that does not parse or uses a construct outside the whitelist."""


@dataclass
class Expr:
    """A parsed, whitelisted expression. `names` are the free symbols it reads (functions excluded)."""

    text: str
    names: frozenset[str] = field(default_factory=frozenset)
    _fn: Callable[[Env], Any] | None = None

    @classmethod
    def parse(cls, text: Any) -> Expr:
        if isinstance(text, bool) or not isinstance(text, str | int | float):
            raise ExprError(f"expected an expression string, got {type(text).__name__} {text!r}")
        source = str(text)
        if len(source) > MAX_CHARS:
            raise ExprError(
                f"expression of {len(source)} characters is longer than the limit of {MAX_CHARS}: {source[:40]!r}..."
            )
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as exc:
            raise ExprError(f"cannot parse {source!r}: {exc.msg}") from None
        except (RecursionError, MemoryError):
            raise ExprError(f"expression nests too deeply: {_short(source)}") from None
        _check_size(tree.body, source)
        names: set[str] = set()
        fn = _build(tree.body, names, source)
        return cls(text=source, names=frozenset(names), _fn=fn)

    def __call__(self, env: Env) -> Any:
        assert self._fn is not None, "an Expr is made by Expr.parse"
        return self._fn(env)


def _short(source: str) -> str:
    return repr(source) if len(source) <= 60 else f"{source[:40]!r}... ({len(source)} characters)"


def _check_size(root: ast.AST, source: str) -> None:
    """Refuse trees over MAX_NODES nodes or MAX_DEPTH levels, walking iteratively (no Python recursion)."""
    stack, nodes = [(root, 1)], 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise ExprError(f"expression has more than {MAX_NODES} terms: {_short(source)}")
        if depth > MAX_DEPTH:
            raise ExprError(f"expression nests more than {MAX_DEPTH} levels deep: {_short(source)}")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _build(node: ast.AST, names: set[str], source: str) -> Callable[[Env], Any]:
    """Translate one whitelisted node into a closure; anything else raises ExprError naming the construct."""
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, int | float | str | bool):
            raise ExprError(f"constant {node.value!r} is not allowed in {source!r}")
        value = node.value
        return lambda env: value
    if isinstance(node, ast.Name):
        name = node.id
        if name.startswith("__"):
            raise ExprError(f"dunder name {name!r} is not allowed in {source!r}")
        if name in ("True", "False"):
            value = name == "True"
            return lambda env: value
        names.add(name)
        return lambda env: env[name]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        op, left, right = _BINOPS[type(node.op)], _build(node.left, names, source), _build(node.right, names, source)
        return lambda env: op(left(env), right(env))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        unary, operand = _UNARY[type(node.op)], _build(node.operand, names, source)
        return lambda env: unary(operand(env))
    if isinstance(node, ast.BoolOp):
        parts = [_build(v, names, source) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda env: all(p(env) for p in parts)
        return lambda env: any(p(env) for p in parts)
    if isinstance(node, ast.Compare) and all(type(o) in _COMPARE for o in node.ops):
        first = _build(node.left, names, source)
        ops = [_COMPARE[type(o)] for o in node.ops]
        rest = [_build(c, names, source) for c in node.comparators]

        def compare(env):
            left = first(env)
            for op, right_fn in zip(ops, rest, strict=True):
                right = right_fn(env)
                if not op(left, right):
                    return False
                left = right
            return True

        return compare
    if isinstance(node, ast.IfExp):
        test, body, orelse = (_build(n, names, source) for n in (node.test, node.body, node.orelse))
        return lambda env: body(env) if test(env) else orelse(env)
    if isinstance(node, ast.Tuple | ast.List):
        items = [_build(e, names, source) for e in node.elts]
        return lambda env: tuple(i(env) for i in items)
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            what = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            allowed = ", ".join(sorted(FUNCTIONS))
            raise ExprError(f"call of {what!r} is not allowed in {source!r} (allowed: {allowed})")
        if node.keywords:
            raise ExprError(f"keyword arguments are not allowed in {source!r}")
        func = FUNCTIONS[node.func.id]
        args = [_build(a, names, source) for a in node.args]
        return lambda env: func(*(a(env) for a in args))
    construct = {
        ast.JoinedStr: "f-strings",
        ast.FormattedValue: "f-strings",
        ast.Set: "set literals",
        ast.Dict: "dict literals",
        ast.Slice: "slices",
        ast.Await: "await",
        ast.Yield: "yield",
        ast.YieldFrom: "yield",
        ast.Attribute: "attribute access",
        ast.Lambda: "lambda",
        ast.ListComp: "comprehension",
        ast.SetComp: "comprehension",
        ast.DictComp: "comprehension",
        ast.GeneratorExp: "comprehension",
        ast.Subscript: "subscript",
        ast.NamedExpr: "assignment",
        ast.Starred: "starred argument",
    }.get(type(node))
    if construct is None and isinstance(node, ast.Compare):
        construct = "identity comparison (is, is not)"
    if construct is None:
        what = type(getattr(node, "op", None) or node).__name__
        construct = f"the {_OPERATOR_WORDS.get(what, what)} operator" if hasattr(node, "op") else f"a {what} node"
    verb = "are" if construct in _PLURALS else "is"
    raise ExprError(f"{construct} {verb} not allowed in {_short(source)}")


_PLURALS = {"f-strings", "set literals", "dict literals", "slices"}
_OPERATOR_WORDS = {
    "MatMult": "@",
    "LShift": "<<",
    "RShift": ">>",
    "BitOr": "|",
    "BitAnd": "&",
    "BitXor": "^",
    "Invert": "~",
}
