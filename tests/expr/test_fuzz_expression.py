"""Property-based fuzz of the expression compiler: whatever the input, the outcome is a compiled expression or an
`ExprError`, and evaluation fails only with the arithmetic/type errors a constraint may raise; all within bounded
time. Derandomized, so CI sees the same cases (the space loader's fuzz: tests/space/test_fuzz_space.py)."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.expr import Expr, ExprError

FUZZ = settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
NAMES = ["tile", "vec", "pad", "n", "rows", "block", "x"]

leaves = st.one_of(
    st.sampled_from(NAMES),
    st.integers(-(2**40), 2**40).map(str),
    st.sampled_from(
        [
            "True",
            "'s'",
            "1.5",
            "1e308",
            "-0",
            "(1,2)",
            "[3]",
            "f'{x}'",
            "x.real",
            "x[0]",
            "lambda: 1",
            "{1}",
            "{1: 2}",
            "__import__",
            "x if x else n",
            "min(x, 1)",
            "open('f')",
            "[i for i in x]",
            "x @ n",
            "~x",
        ]
    ),
)
OPERATORS = [
    "+",
    "-",
    "*",
    "/",
    "//",
    "%",
    "**",
    "<",
    "<=",
    "==",
    "!=",
    ">",
    ">=",
    " and ",
    " or ",
    " in ",
    " is ",
    "<<",
    "&",
]
expressions = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(OPERATORS), inner).map(lambda t: f"({t[0]}{t[1]}{t[2]})"),
        st.tuples(st.sampled_from(["-", "not ", "+"]), inner).map(lambda t: f"{t[0]}{t[1]}"),
        st.tuples(
            st.sampled_from(["min", "max", "abs", "ceil_div", "log2", "is_pow2", "eval"]),
            st.lists(inner, min_size=1, max_size=3),
        ).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
    ),
    max_leaves=40,
)


@FUZZ
@given(text=expressions, env=st.fixed_dictionaries({n: st.integers(-(2**64), 2**64) for n in NAMES}))
def test_random_expression_trees_compile_and_evaluate_within_bounds(text, env):
    started = time.perf_counter()
    try:
        expr = Expr.parse(text)
    except ExprError:
        return
    try:
        expr(env)
    except (ArithmeticError, TypeError, ValueError):
        pass
    assert time.perf_counter() - started < 2.0, text


@FUZZ
@given(depth=st.integers(1, 20_000), op=st.sampled_from(["-", "not ", "~", "+"]))
def test_deep_unary_chains_are_refused_not_crashed(depth, op):
    try:
        Expr.parse(op * depth + "1")
    except ExprError:
        pass
