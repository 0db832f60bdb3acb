"""Safe expressions for constraints and derived values.

A space's constraints (``threads <= 1024``) and derived values (``threads: tile_m * tile_n // (thread_m *
thread_n)``) are data, not code. They are parsed with `ast`, checked against a whitelist of node types, and
turned into a tree of small closures; nothing ever reaches `eval` or `exec`. The closures are much faster than
re-walking the AST per config, which matters when a space has hundreds of thousands of Cartesian points.

Expressions are bounded, so a space file cannot hang or exhaust the process that reads it: the text is at most
`MAX_CHARS` characters, the tree at most `MAX_NODES` nodes and `MAX_DEPTH` levels deep (checked before the tree is
walked recursively), and the operators are bounded (`tuner.expr.ops`): ``**`` refuses exponents above `MAX_EXPONENT` and
results above `MAX_INT_BITS` bits, ``*`` refuses integers above `MAX_INT_BITS` bits and strings or tuples longer than
`MAX_SEQUENCE`, and ``%`` never formats strings. A refused operation raises `ExprLimit` (an ArithmeticError, so a
constraint that hits a limit rules its config out like any other arithmetic fault).
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tuner.expr.arrays import build_over
from tuner.expr.ops import BINOPS, COMPARE, FUNCTIONS, UNARY, Env

MAX_CHARS = 4096
MAX_NODES = 1000
MAX_DEPTH = 64


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
            self._over = build_over(self._tree)
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
    if isinstance(node, ast.BinOp) and type(node.op) in BINOPS:
        op, left, right = BINOPS[type(node.op)], _build(node.left, names, source), _build(node.right, names, source)
        return lambda env: op(left(env), right(env))
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        unary, operand = UNARY[type(node.op)], _build(node.operand, names, source)
        return lambda env: unary(operand(env))
    if isinstance(node, ast.BoolOp):
        parts = [_build(v, names, source) for v in node.values]
        if isinstance(node.op, ast.And):
            return lambda env: all(p(env) for p in parts)
        return lambda env: any(p(env) for p in parts)
    if isinstance(node, ast.Compare) and all(type(o) in COMPARE for o in node.ops):
        return _build_compare(node, names, source)
    if isinstance(node, ast.IfExp):
        test, body, orelse = (_build(n, names, source) for n in (node.test, node.body, node.orelse))
        return lambda env: body(env) if test(env) else orelse(env)
    if isinstance(node, ast.Tuple | ast.List):
        items = [_build(e, names, source) for e in node.elts]
        return lambda env: tuple(i(env) for i in items)
    if isinstance(node, ast.Call):
        return _build_call(node, names, source)
    raise _refusal(node, source)


def _build_compare(node: ast.Compare, names: set[str], source: str) -> Callable[[Env], Any]:
    """A chain ``a < b <= c``: each comparison in turn, stopping at the first that fails (as Python does)."""
    first = _build(node.left, names, source)
    ops = [COMPARE[type(o)] for o in node.ops]
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


def _build_call(node: ast.Call, names: set[str], source: str) -> Callable[[Env], Any]:
    """A call of a whitelisted function (`tuner.expr.ops.FUNCTIONS`) by name, with positional arguments only."""
    if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
        what = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
        allowed = ", ".join(sorted(FUNCTIONS))
        raise ExprError(f"call of {what!r} is not allowed in {source!r} (allowed: {allowed})")
    if node.keywords:
        raise ExprError(f"keyword arguments are not allowed in {source!r}")
    func = FUNCTIONS[node.func.id]
    args = [_build(a, names, source) for a in node.args]
    return lambda env: func(*(a(env) for a in args))


#: what a refused node is called in the error that names it
_CONSTRUCTS: dict[type, str] = {
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
}


def _refusal(node: ast.AST, source: str) -> ExprError:
    """The ExprError of a node outside the whitelist, naming its construct in words."""
    construct = _CONSTRUCTS.get(type(node))
    if construct is None and isinstance(node, ast.Compare):
        construct = "identity comparison (is, is not)"
    if construct is None:
        what = type(getattr(node, "op", None) or node).__name__
        construct = f"the {_OPERATOR_WORDS.get(what, what)} operator" if hasattr(node, "op") else f"a {what} node"
    verb = "are" if construct in _PLURALS else "is"
    return ExprError(f"{construct} {verb} not allowed in {_short(source)}")


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
