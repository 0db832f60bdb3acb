"""The expression language of space files: constraints (``threads <= 1024``) and derived values (``threads: tile_m
* tile_n // (thread_m * thread_n)``), read as data, never run as code.

Takes an expression's text; gives an `Expr` that evaluates it config by config (`expression`), or over NumPy
arrays of configs at once (`arrays`), with bounded operators and functions (`ops`). A text that does not parse or
uses anything outside the whitelist is an `ExprError`. Below space/ and kernels/, which both declare expressions;
it imports nothing of the package but itself.
"""

from tuner.expr.expression import Expr, ExprError, parse_tree

__all__ = ["Expr", "ExprError", "parse_tree"]
