"""Kernel Tuner's launch geometry for a declarative family: the grid from a problem size and its divisors, the
block from the config's ``block_size_x/y/z``.

A ``launch:`` block may say, instead of ``grid:``, what Kernel Tuner's ``tune_kernel`` is given::

    launch:
      problem_size: [width, height]                # 1 to 3 expressions (problem sizes, params, derived values)
      grid_div_x: [block_size_x, tile_size_x]      # their product divides problem_size's x
      grid_div_y: [block_size_y, tile_size_y]      # default: the dim's block_size_* where the config has it, else 1
      block: [block_size_x, block_size_y]          # optional: default block_size_x/y/z, else 256, 1, 1

so that grid = ceil(problem_size / grid_div) per dimension, as Kernel Tuner's ``get_grid_dimensions`` computes it
(an empty ``grid_div_x: []`` divides by 1), and block = (block_size_x, block_size_y, block_size_z) of the config, 256,
1 and 1 where it has no such value (``get_thread_block_dimensions``). Expressions go through `tuner.expr`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuner.expr import Expr, ExprError

BLOCK_NAMES = ("block_size_x", "block_size_y", "block_size_z")
BLOCK_DEFAULTS = (256, 1, 1)
GRID_DIV_KEYS = ("grid_div_x", "grid_div_y", "grid_div_z")
#: the launch keys of this form
KEYS = ("problem_size", *GRID_DIV_KEYS)


@dataclass(frozen=True)
class KtGrid:
    """grid = ceil(problem_size / product of grid_div) per dimension. `divisors` holds one tuple of expressions
    per dimension, or None: the default (the dimension's ``block_size_*`` where the config has it, else 1)."""

    problem_size: tuple[Expr, ...]
    divisors: tuple[tuple[Expr, ...] | None, tuple[Expr, ...] | None, tuple[Expr, ...] | None]

    def expressions(self) -> list[tuple[str, Expr]]:
        """(the launch key, expression) of every expression, for the space's name checks."""
        out = [("problem_size", e) for e in self.problem_size]
        for key, exprs in zip(GRID_DIV_KEYS, self.divisors, strict=True):
            out += [(key, e) for e in exprs or ()]
        return out

    def sizes(self, env: Mapping[str, Any]) -> tuple[int, int, int]:
        """The problem size, three dims (1 where not given)."""
        x, y, z = (*(int(e(env)) for e in self.problem_size), 1, 1, 1)[:3]
        return x, y, z

    def divisor(self, dim: int, env: Mapping[str, Any], config: Mapping[str, Any]) -> int:
        exprs = self.divisors[dim]
        if exprs is None:
            return int(config.get(BLOCK_NAMES[dim], 1))
        product = 1
        for expr in exprs:
            product *= int(expr(env))
        return product

    def __call__(self, env: Mapping[str, Any], config: Mapping[str, Any]) -> tuple[int, int, int]:
        """The grid for `env` (problem sizes and config) and `config` (params and derived values). ValueError for
        a divisor that is not positive."""
        sizes = self.sizes(env)
        grid = []
        for dim in range(3):
            div = self.divisor(dim, env, config)
            if div <= 0:
                raise ValueError(f"{GRID_DIV_KEYS[dim]} is {div}, not a positive integer")
            grid.append(-(-sizes[dim] // div))
        return grid[0], grid[1], grid[2]


def default_block(config: Mapping[str, Any]) -> tuple[int, int, int]:
    """(block_size_x, block_size_y, block_size_z) of `config`, 256, 1 and 1 where it has none."""
    x, y, z = (int(config.get(name, d)) for name, d in zip(BLOCK_NAMES, BLOCK_DEFAULTS, strict=True))
    return x, y, z


def from_launch(launch: Mapping[str, Any], fail) -> KtGrid:
    """The KtGrid of a ``launch:`` mapping that has ``problem_size``; `fail(message, *keys)` makes the SpaceError
    naming the space file and line."""

    def parse(item: Any, key: str) -> Expr:
        try:
            return Expr.parse(item)
        except ExprError as exc:
            raise fail(f"kernel: launch: {key}: {exc}", "kernel", "launch", key) from None

    size = launch["problem_size"]
    items = size if isinstance(size, list) else [size]
    if not 1 <= len(items) <= 3:
        raise fail(
            "kernel: launch: problem_size: expected 1 to 3 expressions (x, y, z)", "kernel", "launch", "problem_size"
        )
    divisors: list[tuple[Expr, ...] | None] = []
    for key in GRID_DIV_KEYS:
        spec = launch.get(key)
        divisors.append(
            None if spec is None else tuple(parse(i, key) for i in (spec if isinstance(spec, list) else [spec]))
        )
    return KtGrid(tuple(parse(i, "problem_size") for i in items), (divisors[0], divisors[1], divisors[2]))
