"""Space expressions over arrays: a space's valid set listed level by level instead of config by config.

`tuner.expr.Expr.over` evaluates a checked expression with NumPy arrays for some of its names. An operation whose
operands are all scalars runs Python's own operator, so only array operands follow NumPy's rules; where NumPy's
result could differ from Python's (integers beyond int64's exact range, a NaN, a tuple of per-config values
outside a membership test), `NotVectorizable` says so and the caller walks config by config instead.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from tuner.expr.ops import BINOPS, COMPARE, FUNCTIONS, UNARY, Env


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


# -- values: what an operand is, and whether NumPy computes it exactly as Python would ----------------------------


def _is_array(x: Any) -> bool:
    import numpy as np

    return isinstance(x, np.ndarray)


def _numeric(x: Any) -> Any:
    """`x` as an operand of arithmetic or ordering, or NotVectorizable."""
    import numpy as np

    if _is_array(x):
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


def _magnitude(x: Any) -> int:
    import numpy as np

    if _is_array(x):
        return int(np.abs(x).max()) if len(x) and x.dtype.kind in "iu" else 0
    return abs(x) if isinstance(x, int) else 0


def _exact(x: Any, y: Any, bound: int) -> None:
    """NotVectorizable unless int64 holds `bound` (a bound on the result's magnitude) and the operands."""
    if max(bound, _magnitude(x), _magnitude(y)) >= ARRAY_INT_LIMIT:
        raise NotVectorizable("integers too large for exact int64 arithmetic")


def _finite(v: Any) -> Any:
    import numpy as np

    if _is_array(v) and v.dtype.kind == "f" and not np.isfinite(v).all():
        raise NotVectorizable("an infinite or NaN float")
    return v


def _scalar(op: Callable[..., Any], *args: Any) -> tuple[Any, Any]:
    """Python's own operator over scalar operands: (its value, False), or (None, True) where it fails."""
    if any(isinstance(a, tuple) and any(_is_array(i) for i in a) for a in args):
        raise NotVectorizable("a tuple of per-config values outside a membership test")
    try:
        return op(*args), False
    except (ArithmeticError, TypeError, ValueError):
        return None, True


def _nonzero_divisor(y: Any) -> tuple[Any, Any]:
    """(divisor safe to divide by, rows where it is zero)."""
    import numpy as np

    if not _is_array(y):
        return y, False  # a scalar zero divisor with an array dividend: handled by the caller
    zero = y == 0
    return np.where(zero, 1, y), zero


def _evaluate_all(parts: list[_Over], env: Env) -> tuple[list[Any], Any]:
    """Every operand's values, and the configs for which any of them fails (a tuple's items, a call's
    arguments: Python evaluates them all)."""
    values, failed = [], False
    for part in parts:
        v, f = part(env)
        values.append(v)
        failed = failed | f
    return values, failed


def _where(cond: Any, a: Any, b: Any) -> Any:
    """`a` where `cond` holds, else `b`, for values of kinds NumPy chooses between as Python would."""
    import numpy as np

    kinds = {(x.dtype.kind if _is_array(x) else ("U" if isinstance(x, str) else "n")) for x in (a, b)}
    if kinds & {"U"} and kinds - {"U"}:
        raise NotVectorizable("a choice between strings and numbers")
    if kinds - {"U", "n", "b", "i", "f"}:
        raise NotVectorizable("a choice between values of another kind")
    return np.where(cond, a, b)


# -- the tree: one builder per whitelisted construct ---------------------------------------------------------------


def build_over(node: ast.AST) -> _Over:
    """The array twin of `tuner.expr.expression._build` for a tree `_build` accepted. Each closure returns
    (values, failed); an operation whose operands are all scalars runs Python's own operator, so only array operands
    follow NumPy's rules."""
    if isinstance(node, ast.Constant):
        value = node.value
        return lambda env: (value, False)
    if isinstance(node, ast.Name):
        return _over_name(node.id)
    if isinstance(node, ast.BinOp):
        return _over_binop(node)
    if isinstance(node, ast.UnaryOp):
        return _over_unary(node)
    if isinstance(node, ast.BoolOp):
        return _over_boolop(node)
    if isinstance(node, ast.Compare):
        return _over_compare(node)
    if isinstance(node, ast.IfExp):
        return _over_ifexp(node)
    if isinstance(node, ast.Tuple | ast.List):
        items = [build_over(e) for e in node.elts]

        def sequence(env: Env) -> tuple[Any, Any]:
            values, failed = _evaluate_all(items, env)
            return (None, True) if failed is True else (tuple(values), failed)

        return sequence
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return _over_call(node.func.id, [build_over(a) for a in node.args])
    raise NotVectorizable(f"a {type(node).__name__} node")


def _over_name(name: str) -> _Over:
    if name in ("True", "False"):
        flag = name == "True"
        return lambda env: (flag, False)

    def lookup(env: Env) -> tuple[Any, Any]:
        if name not in env:
            raise NotVectorizable(f"unknown name {name!r}")
        return env[name], False

    return lookup


def _over_unary(node: ast.UnaryOp) -> _Over:
    operand = build_over(node.operand)
    kind = type(node.op)

    def unary(env: Env) -> tuple[Any, Any]:
        x, failed = operand(env)
        if failed is True:
            return None, True
        if not _is_array(x):
            v, bad = _scalar(UNARY[kind], x)
            return v, failed | bad
        if kind is ast.Not:
            return ~truth(x), failed
        return (-_numeric(x) if kind is ast.USub else _numeric(x)), failed

    return unary


def _over_ifexp(node: ast.IfExp) -> _Over:
    test, body, orelse = build_over(node.test), build_over(node.body), build_over(node.orelse)

    def choose(env: Env) -> tuple[Any, Any]:
        t, ft = test(env)
        if ft is True:
            return None, True
        if not _is_array(t):
            v, fv = (body if t else orelse)(env)
            return v, ft | fv
        t = truth(t)
        a, fa = body(env)
        b, fb = orelse(env)
        if fa is True or fb is True:
            raise NotVectorizable("a branch that fails for every config")
        return _where(t, a, b), ft | (t & fa) | (~t & fb)

    return choose


def _over_binop(node: ast.BinOp) -> _Over:
    import numpy as np

    left, right = build_over(node.left), build_over(node.right)
    kind, op = type(node.op), BINOPS[type(node.op)]

    def run(env: Env) -> tuple[Any, Any]:
        a, fa = left(env)
        b, fb = right(env)
        failed = fa | fb
        if failed is True:
            return None, True
        if not (_is_array(a) or _is_array(b)):
            v, bad = _scalar(op, a, b)
            return v, failed | bad
        x, y = _numeric(a), _numeric(b)
        mx, my = _magnitude(x), _magnitude(y)
        _exact(x, y, mx * my if kind is ast.Mult else mx + my)
        if kind in (ast.Div, ast.FloorDiv, ast.Mod):
            if not _is_array(y) and y == 0:
                return None, True
            y, zero = _nonzero_divisor(y)
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
        return _finite(v), failed

    return run


def _over_boolop(node: ast.BoolOp) -> _Over:
    parts = [build_over(v) for v in node.values]
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
            go_on = truth(value) if is_and else ~truth(value) if _is_array(value) else not truth(value)
            if go_on is False:
                break
            v, fv = part(env)
            if go_on is True:
                value, failed = v, failed | fv
                continue
            if fv is True:
                raise NotVectorizable("an operand that fails for every config")
            value, failed = _where(go_on, v, value), failed | (go_on & fv)
        return value, failed

    return run


def _compare_arrays(kind: type, a: Any, b: Any) -> Any:
    """One comparison of `kind` over per-config values (an operand, or an item of the tuple it is tested against,
    is an array): per config, as Python compares each."""
    import numpy as np

    if kind in (ast.In, ast.NotIn):
        if not isinstance(b, tuple):
            raise NotVectorizable("membership in a per-config value")
        inside: Any = False  # Python's `in` over a tuple: equal to any item
        for item in b:
            inside = inside | _compare_arrays(ast.Eq, a, item)
        if not _is_array(inside):
            inside = np.full(len(a), inside) if _is_array(a) else inside
        return inside if kind is ast.In else ~inside if _is_array(inside) else not inside
    texts = [x for x in (a, b) if isinstance(x, str) or (_is_array(x) and x.dtype.kind == "U")]
    if texts:
        if len(texts) != 2 or kind not in (ast.Eq, ast.NotEq):
            raise NotVectorizable("ordering or mixing strings over arrays")
        return (a == b) if kind is ast.Eq else (a != b)
    x, y = _numeric(a), _numeric(b)
    _exact(x, y, 0)
    return COMPARE[kind](x, y)


def _over_compare(node: ast.Compare) -> _Over:
    first = build_over(node.left)
    rest = [(type(o), COMPARE[type(o)], build_over(c)) for o, c in zip(node.ops, node.comparators, strict=True)]

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
            if _is_array(left) or _is_array(right):
                c = _compare_arrays(kind, left, right)
            else:
                c, bad = _scalar(op, left, right)
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


def _over_call(name: str, args: list[_Over]) -> _Over:
    func = FUNCTIONS[name]

    def run(env: Env) -> tuple[Any, Any]:
        values, failed = _evaluate_all(args, env)
        if failed is True:
            return None, True
        if not any(_is_array(v) for v in values):
            v, bad = _scalar(func, *values)
            return v, failed | bad
        return _call_over_arrays(name, values, failed)

    return run


def _call_over_arrays(name: str, values: list[Any], failed: Any) -> tuple[Any, Any]:
    """A whitelisted function where an argument is an array: the ones NumPy computes exactly as Python does."""
    import numpy as np

    if name in ("min", "max") and len(values) >= 2:
        xs = [_numeric(v) for v in values]
        for x in xs:
            _exact(x, 0, 0)
        pick = np.minimum if name == "min" else np.maximum
        out = xs[0]
        for x in xs[1:]:
            out = pick(out, x)
        return out, failed
    if name == "abs" and len(values) == 1:
        x = _numeric(values[0])
        _exact(x, 0, 0)
        return np.abs(x), failed
    if name == "ceil_div" and len(values) == 2:
        x, y = _numeric(values[0]), _numeric(values[1])
        _exact(x, y, _magnitude(x) + 1)
        if not _is_array(y) and y == 0:
            return None, True
        y, zero = _nonzero_divisor(y)
        return _finite(-(-x // y)), failed | zero
    if name == "is_pow2" and len(values) == 1 and _is_array(values[0]):
        n = values[0]
        if n.dtype.kind == "f":
            return np.zeros(len(n), dtype=bool), failed
        n = _numeric(n)
        _exact(n, 0, 0)
        return (n > 0) & ((n & (n - 1)) == 0), failed
    raise NotVectorizable(f"{name}() over arrays")
