"""The expression language (`tuner.expr.expression.Expr`): what a constraint or derived value may say, and what it
may not."""

from __future__ import annotations

import pytest

from tuner.expr import Expr, ExprError


def test_expressions_whitelist():
    env = {"a": 7, "b": 2}
    assert Expr.parse("a // b + a % b")(env) == 4
    assert Expr.parse("min(a, b) < max(a, b) and not abs(-a) == 3")(env) is True
    assert Expr.parse("ceil_div(a, b)")(env) == 4
    assert Expr.parse("a if a > b else b")(env) == 7
    assert Expr.parse("a in (1, 7)")(env) is True
    assert Expr.parse("a * b").names == {"a", "b"}
    for bad in ("a.b", "f(a)", "lambda: 1", "[x for x in a]", "__class__", "a[0]", "min(a, key=b)", "(a := 1)"):
        with pytest.raises(ExprError):
            Expr.parse(bad)
