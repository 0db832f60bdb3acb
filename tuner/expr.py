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
import warnings
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
    _tree: ast.AST | None = field(default=None, repr=False, compare=False)
    _over: Callable[[Env], tuple[Any, Any]] | None = field(default=None, repr=False, compare=False)

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
            tree = parse_tree(source.strip())
        except SyntaxError as exc:
            raise ExprError(f"cannot parse {source!r}: {exc.msg}") from None
        except (RecursionError, MemoryError):
            raise ExprError(f"expression nests too deeply: {_short(source)}") from None
        _check_size(tree.body, source)
        names: set[str] = set()
        fn = _build(tree.body, names, source)
        return cls(text=source, names=frozenset(names), _fn=fn, _tree=tree.body)

    def __call__(self, env: Env) -> Any:
        assert self._fn is not None, "an Expr is made by Expr.parse"
        return self._fn(env)

    def over(self, env: Env) -> tuple[Any, Any]:
        """Evaluate for many configs at once: `env` maps each name to a NumPy array (one value per config, all of
        one length) or to a scalar that every config shares. Returns ``(values, failed)``: `failed` (a bool array,
        or a bool for all) marks the configs for which calling the expression raises an ArithmeticError,
        TypeError or ValueError — their values are meaningless. Raises `NotVectorizable` where the arrays could
        not reproduce the scalar evaluation exactly (powers, log2, strings in arithmetic, integers of 2**53
        and more, an infinite or NaN float); the caller then evaluates config by config."""
        if self._over is None:
            assert self._tree is not None, "an Expr is made by Expr.parse"
            self._over = _build_over(self._tree)
        return self._over(env)


def parse_tree(source: str) -> ast.Expression:
    """`source` parsed as one Python expression. SyntaxError where it does not parse, and also where Python's
    parser would warn (``1024and``: "invalid decimal literal"; an invalid escape): a warning is printed on stderr
    as ``<unknown>:1: SyntaxWarning``, naming no file, while an error reaches the caller, which names the space
    file, the line and the expression."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", SyntaxWarning)
        warnings.simplefilter("error", DeprecationWarning)
        return ast.parse(source, mode="eval")


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


# ---------------------------------------------------------------------------------------------------------------
# the same expressions over arrays: listing a space's valid set level by level instead of config by config


class NotVectorizable(Exception):
    """An expression, or a value it meets, that `Expr.over` does not evaluate exactly as a call would."""


#: integers over arrays stay below this in magnitude, operands and results, so that int64 arithmetic is exact
#: (Python's ints are unbounded, NumPy's wrap) and true division of two of them rounds as Python's does
ARRAY_INT_LIMIT = 1 << 53

_Over = Callable[[Env], tuple[Any, Any]]


def truth(x: Any) -> Any:
    """Python's truth of each value (an array of values: a bool array), or NotVectorizable for an array of another
    kind."""
    import numpy as np

    if not isinstance(x, np.ndarray):
        return bool(x)
    if x.dtype.kind == "b":
        return x
    if x.dtype.kind in "if":
        return x != 0
    if x.dtype.kind == "U":
        return x != ""
    raise NotVectorizable(f"truth of {x.dtype} values")


def _build_over(node: ast.AST) -> _Over:  # noqa: C901 - one branch per whitelisted construct, as `_build`
    """The array twin of `_build` for a tree `_build` accepted. Each closure returns (values, failed); an operation
    whose operands are all scalars runs Python's own operator, so only array operands follow NumPy's rules."""
    import numpy as np

    def is_array(x: Any) -> bool:
        return isinstance(x, np.ndarray)

    def numeric(x: Any) -> Any:
        """`x` as an operand of arithmetic or ordering, or NotVectorizable."""
        if is_array(x):
            if x.dtype.kind == "b":
                return x.astype(np.int64)
            if x.dtype.kind == "i":
                return x
            if x.dtype.kind == "f":
                return x
            raise NotVectorizable(f"arithmetic over {x.dtype} values")
        if isinstance(x, bool):
            return int(x)
        if isinstance(x, int):
            if abs(x) >= ARRAY_INT_LIMIT:
                raise NotVectorizable("integers too large for int64 arithmetic")
            return x
        if isinstance(x, float):
            return x
        raise NotVectorizable(f"arithmetic over {type(x).__name__} values")

    def magnitude(x: Any) -> int:
        if is_array(x):
            return int(np.abs(x).max()) if len(x) and x.dtype.kind in "iu" else 0
        return abs(x) if isinstance(x, int) else 0

    def exact(x: Any, y: Any, bound: int) -> None:
        """NotVectorizable unless int64 holds `bound` (a bound on the result's magnitude) and the operands."""
        if max(bound, magnitude(x), magnitude(y)) >= ARRAY_INT_LIMIT:
            raise NotVectorizable("integers too large for exact int64 arithmetic")

    def finite(v: Any) -> Any:
        if is_array(v) and v.dtype.kind == "f" and not np.isfinite(v).all():
            raise NotVectorizable("an infinite or NaN float")
        return v

    def scalar(op: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
        if any(isinstance(a, tuple) and any(is_array(i) for i in a) for a in args):
            raise NotVectorizable("a tuple of per-config values outside a membership test")
        try:
            return op(*args), False
        except (ArithmeticError, TypeError, ValueError):
            return None, True

    def nonzero_divisor(y: Any) -> tuple[Any, Any]:
        """(divisor safe to divide by, rows where it is zero)."""
        if not is_array(y):
            return y, False  # a scalar zero divisor with an array dividend: handled by the caller
        zero = y == 0
        return np.where(zero, 1, y), zero

    def evaluate_all(parts: list[_Over], env: Env) -> tuple[list[Any], Any]:
        """Every operand's values, and the configs for which any of them fails (a tuple's items, a call's
        arguments: Python evaluates them all)."""
        values, failed = [], False
        for part in parts:
            v, f = part(env)
            values.append(v)
            failed = failed | f
        return values, failed

    def where(cond: Any, a: Any, b: Any) -> Any:
        kinds = {(x.dtype.kind if is_array(x) else ("U" if isinstance(x, str) else "n")) for x in (a, b)}
        if kinds & {"U"} and kinds - {"U"}:
            raise NotVectorizable("a choice between strings and numbers")
        if kinds - {"U", "n", "b", "i", "f"}:
            raise NotVectorizable("a choice between values of another kind")
        return np.where(cond, a, b)

    def build(node: ast.AST) -> _Over:
        if isinstance(node, ast.Constant):
            value = node.value
            return lambda env: (value, False)
        if isinstance(node, ast.Name):
            name = node.id
            if name in ("True", "False"):
                flag = name == "True"
                return lambda env: (flag, False)

            def lookup(env: Env) -> tuple[Any, Any]:
                if name not in env:
                    raise NotVectorizable(f"unknown name {name!r}")
                return env[name], False

            return lookup
        if isinstance(node, ast.BinOp):
            return binop(node)
        if isinstance(node, ast.UnaryOp):
            operand = build(node.operand)
            kind = type(node.op)

            def unary(env: Env) -> tuple[Any, Any]:
                x, failed = operand(env)
                if failed is True:
                    return None, True
                if not is_array(x):
                    v, bad = scalar(_UNARY[kind], x)
                    return v, failed | bad
                if kind is ast.Not:
                    return ~truth(x), failed
                return (-numeric(x) if kind is ast.USub else numeric(x)), failed

            return unary
        if isinstance(node, ast.BoolOp):
            return boolop(node)
        if isinstance(node, ast.Compare):
            return compare(node)
        if isinstance(node, ast.IfExp):
            test, body, orelse = build(node.test), build(node.body), build(node.orelse)

            def choose(env: Env) -> tuple[Any, Any]:
                t, ft = test(env)
                if ft is True:
                    return None, True
                if not is_array(t):
                    v, fv = (body if t else orelse)(env)
                    return v, ft | fv
                t = truth(t)
                a, fa = body(env)
                b, fb = orelse(env)
                if fa is True or fb is True:
                    raise NotVectorizable("a branch that fails for every config")
                return where(t, a, b), ft | (t & fa) | (~t & fb)

            return choose
        if isinstance(node, ast.Tuple | ast.List):
            items = [build(e) for e in node.elts]

            def sequence(env: Env) -> tuple[Any, Any]:
                values, failed = evaluate_all(items, env)
                return (None, True) if failed is True else (tuple(values), failed)

            return sequence
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            return call(node.func.id, [build(a) for a in node.args])
        raise NotVectorizable(f"a {type(node).__name__} node")

    def binop(node: ast.BinOp) -> _Over:
        left, right = build(node.left), build(node.right)
        kind, op = type(node.op), _BINOPS[type(node.op)]

        def run(env: Env) -> tuple[Any, Any]:
            a, fa = left(env)
            b, fb = right(env)
            failed = fa | fb
            if failed is True:
                return None, True
            if not (is_array(a) or is_array(b)):
                v, bad = scalar(op, a, b)
                return v, failed | bad
            x, y = numeric(a), numeric(b)
            mx, my = magnitude(x), magnitude(y)
            exact(x, y, mx * my if kind is ast.Mult else mx + my)
            if kind in (ast.Div, ast.FloorDiv, ast.Mod):
                if not is_array(y) and y == 0:
                    return None, True
                y, zero = nonzero_divisor(y)
                failed = failed | zero
                v = np.true_divide(x, y) if kind is ast.Div else (x // y if kind is ast.FloorDiv else x % y)
            elif kind is ast.Add:
                v = x + y
            elif kind is ast.Sub:
                v = x - y
            elif kind is ast.Mult:
                v = x * y
            else:
                raise NotVectorizable(f"the {kind.__name__} operator over arrays")
            return finite(v), failed

        return run

    def boolop(node: ast.BoolOp) -> _Over:
        parts = [build(v) for v in node.values]
        is_and = isinstance(node.op, ast.And)

        def run(env: Env) -> tuple[Any, Any]:
            # Python stops at the first operand that decides: a later operand's failure counts only for the
            # configs that reach it, and the value is the deciding operand's.
            value, failed = parts[0](env)
            if failed is True:
                return None, True
            for part in parts[1:]:
                if failed is True:
                    return None, True
                go_on = truth(value) if is_and else ~truth(value) if is_array(value) else not truth(value)
                if go_on is False:
                    break
                v, fv = part(env)
                if go_on is True:
                    value, failed = v, failed | fv
                    continue
                if fv is True:
                    raise NotVectorizable("an operand that fails for every config")
                value, failed = where(go_on, v, value), failed | (go_on & fv)
            return value, failed

        return run

    def compare(node: ast.Compare) -> _Over:
        first = build(node.left)
        rest = [(type(o), _COMPARE[type(o)], build(c)) for o, c in zip(node.ops, node.comparators, strict=True)]

        def elementwise(kind: type, a: Any, b: Any) -> Any:
            if kind in (ast.In, ast.NotIn):
                if not isinstance(b, tuple):
                    raise NotVectorizable("membership in a per-config value")
                inside: Any = False  # Python's `in` over a tuple: equal to any item
                for item in b:
                    inside = inside | elementwise(ast.Eq, a, item)
                if not is_array(inside):
                    inside = np.full(len(a), inside) if is_array(a) else inside
                return inside if kind is ast.In else ~inside if is_array(inside) else not inside
            texts = [x for x in (a, b) if isinstance(x, str) or (is_array(x) and x.dtype.kind == "U")]
            if texts:
                if len(texts) != 2 or kind not in (ast.Eq, ast.NotEq):
                    raise NotVectorizable("ordering or mixing strings over arrays")
                return (a == b) if kind is ast.Eq else (a != b)
            x, y = numeric(a), numeric(b)
            exact(x, y, 0)
            return _COMPARE[kind](x, y)

        def run(env: Env) -> tuple[Any, Any]:
            # ``a < b < c`` is ``a < b and b < c``: a config whose first comparison is false never evaluates c
            left, failed = first(env)
            if failed is True:
                return None, True
            result: Any = True  # per config: every comparison so far held
            for kind, op, right_fn in rest:
                if result is False:
                    break
                right, fr = right_fn(env)
                if fr is True:
                    if result is True:
                        return None, True
                    raise NotVectorizable("a comparand that fails for every config")
                if is_array(left) or is_array(right):
                    c = elementwise(kind, left, right)
                else:
                    c, bad = scalar(op, left, right)
                    if bad:
                        if result is True:
                            return None, True
                        failed, c = failed | result, False
                    c = bool(c)
                failed = failed | (result & fr)
                result = result & c
                left = right
            return result, failed

        return run

    def call(name: str, args: list[_Over]) -> _Over:
        func = FUNCTIONS[name]

        def run(env: Env) -> tuple[Any, Any]:
            values, failed = evaluate_all(args, env)
            if failed is True:
                return None, True
            if not any(is_array(v) for v in values):
                v, bad = scalar(func, *values)
                return v, failed | bad
            if name in ("min", "max") and len(values) >= 2:
                xs = [numeric(v) for v in values]
                for x in xs:
                    exact(x, 0, 0)
                pick = np.minimum if name == "min" else np.maximum
                out = xs[0]
                for x in xs[1:]:
                    out = pick(out, x)
                return out, failed
            if name == "abs" and len(values) == 1:
                x = numeric(values[0])
                exact(x, 0, 0)
                return np.abs(x), failed
            if name == "ceil_div" and len(values) == 2:
                x, y = numeric(values[0]), numeric(values[1])
                exact(x, y, magnitude(x) + 1)
                if not is_array(y) and y == 0:
                    return None, True
                y, zero = nonzero_divisor(y)
                return finite(-(-x // y)), failed | zero
            if name == "is_pow2" and len(values) == 1 and is_array(values[0]):
                n = values[0]
                if n.dtype.kind == "f":
                    return np.zeros(len(n), dtype=bool), failed
                n = numeric(n)
                exact(n, 0, 0)
                return (n > 0) & ((n & (n - 1)) == 0), failed
            raise NotVectorizable(f"{name}() over arrays")

        return run

    return build(node)
