"""The plan of a walk over a space: each param bound as early as the constraints and derived values that read it
allow, so that a partial config that breaks a constraint is cut before its later params are tried.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner.expr import Expr
from tuner.space.problem import Problem


def plan(
    params: dict[str, tuple[Any, ...]],
    derived: dict[str, Expr],
    constraints: list[Expr],
    problems: Sequence[Problem],
    fail,
) -> dict[str, Any]:
    """Order derived values by dependency and attach each derived value and constraint to the first param
    level at which everything it reads is bound (level -1: problem symbols only)."""
    param_index = {name: i for i, name in enumerate(params)}
    problem_symbols = set.intersection(*(set(p.expression_env) for p in problems))
    known = set(param_index) | set(derived) | problem_symbols

    def check_names(expr: Expr, *keys) -> None:
        unknown = sorted(expr.names - known)
        if unknown:
            raise fail(f"{expr.text!r} names unknown symbol(s) {', '.join(unknown)}", *keys)

    for name, expr in derived.items():
        check_names(expr, "derived", name)
    for i, expr in enumerate(constraints):
        check_names(expr, "constraints", i)

    level: dict[str, int] = {name: i for name, i in param_index.items()}
    level.update({s: -1 for s in problem_symbols})
    order: list[str] = []
    visiting: list[str] = []

    def visit(name: str) -> int:
        if name in level:
            return level[name]
        if name in visiting:
            cycle = visiting[visiting.index(name) :] + [name]
            if len(cycle) == 2:
                raise fail(f"derived value {name!r} depends on itself", "derived", name)
            raise fail(f"derived values form a cycle: {' → '.join(cycle)}", "derived", cycle[0])
        visiting.append(name)
        expr = derived[name]
        level[name] = max((visit(n) for n in sorted(expr.names)), default=-1)
        visiting.pop()
        order.append(name)
        return level[name]

    for name in derived:
        visit(name)

    # steps per level: (the derived value's name, or None for a constraint, Expr), derived values first, in
    # dependency order; `SearchSpace.valid_positions` evaluates them over arrays
    steps: dict[int, list[tuple[str | None, Expr]]] = {i: [] for i in range(-1, len(params))}
    for name in order:
        steps[level[name]].append((name, derived[name]))
    for expr in constraints:
        steps[max((level[n] for n in expr.names), default=-1)].append((None, expr))
    # ... and `SearchSpace.enumerate` calls them config by config: (text for error messages, callable -> truth)
    levels = {lvl: [walk_step(name, expr) for name, expr in level_steps] for lvl, level_steps in steps.items()}
    return {"derived_order": order, "levels": levels, "steps": steps}


def walk_step(name: str | None, expr: Expr) -> tuple[str, Any]:
    if name is None:
        return expr.text, expr

    def set_derived(env):
        env[name] = expr(env)
        return True

    return f"{name}: {expr.text}", set_derived
