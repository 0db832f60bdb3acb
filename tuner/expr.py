"""Safe expressions for constraints and derived values.

A space's constraints (``threads <= 1024``) and derived values (``threads: tile_m * tile_n // (thread_m *
thread_n)``) are data, not code. They are parsed with `ast`, checked against a whitelist of node types, and
turned into a tree of small closures; nothing ever reaches `eval` or `exec`. The closures are much faster than
re-walking the AST per config, which matters when a space has hundreds of thousands of Cartesian points.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Env = Mapping[str, Any]


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

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_COMPARE = {
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
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as exc:
            raise ExprError(f"cannot parse {source!r}: {exc.msg}") from None
        names: set[str] = set()
        fn = _build(tree.body, names, source)
        return cls(text=source, names=frozenset(names), _fn=fn)

    def __call__(self, env: Env) -> Any:
        return self._fn(env)


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
        op, operand = _UNARY[type(node.op)], _build(node.operand, names, source)
        return lambda env: op(operand(env))
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
        ast.Attribute: "attribute access",
        ast.Lambda: "lambda",
        ast.ListComp: "comprehension",
        ast.SetComp: "comprehension",
        ast.DictComp: "comprehension",
        ast.GeneratorExp: "comprehension",
        ast.Subscript: "subscript",
        ast.NamedExpr: "assignment",
        ast.Starred: "starred argument",
    }.get(type(node), type(node).__name__)
    raise ExprError(f"{construct} is not allowed in {source!r}")
