"""The search space's model: `SearchSpace` (params, constraints, derived values, problems, objectives) and the
walks over it, with what they share (`WALK_BUDGET`, `params_key`). `tuner.space.space` reads space files into
it, `tuner.space.configs` lists a space's valid configs; both import this module and it imports neither.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from tuner.core.errors import SpaceError
from tuner.core.shipped import shipped_dir
from tuner.expr import Expr
from tuner.kernels import base as kbase
from tuner.space.problem import Objective, Problem

if TYPE_CHECKING:
    import numpy as np

TOP_LEVEL_KEYS = (
    "kernel",
    "family",
    "template",
    "description",
    "problem",
    "params",
    "constraints",
    "derived",
    "objectives",
    "default",
    "compile_options",
    "configs",
)
#: partial configs a bounded walk visits before it gives up (≈ 1 s on one core)
WALK_BUDGET = 600_000
#: random Cartesian draws `sample` makes in a space too large to enumerate
SAMPLE_DRAWS = 100_000
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: The shipped spaces (`tuner.core.shipped`): an installed wheel finds them from any directory.
SPACES_DIR = shipped_dir("search_spaces")


def code_files() -> list[Path]:
    """The modules that read spaces and evaluate their expressions: what is cached of a space (its listing row,
    its valid set) is keyed on their bytes, so a changed reader counts again."""
    from tuner import expr
    from tuner.core import gpufacts
    from tuner.space import problem, reading, walk

    # the loader and the listed-configs form beside this module, by path: importing them here would be a cycle
    here = Path(__file__)
    readers = [here, here.with_name("space.py"), here.with_name("configs.py")]
    return [*readers, *(Path(m.__file__ or "") for m in (problem, reading, walk, expr, gpufacts))]


class WalkBudgetExceeded(Exception):
    """A bounded walk over a space visited `WALK_BUDGET` partial configs without finishing."""


def params_key(params: dict[str, Any]) -> str:
    """A canonical key for a config: the same params give the same key however they were typed or ordered."""
    return json.dumps({k: params[k] for k in sorted(params)}, sort_keys=True)


@dataclass
class SearchSpace:
    """A loaded, checked search space. Configs are dicts of param name → value (params only); `resolve` adds
    the derived values."""

    path: Path
    name: str
    kernel: str
    description: str
    problems: list[Problem]
    params: dict[str, tuple[Any, ...]]
    constraints: list[Expr]
    derived: dict[str, Expr]
    objectives: list[Objective]
    default: dict[str, Any]
    text: str = ""
    #: What `tuner.build.families.get` resolves to this space's family in any process (a name, or ``space:PATH``).
    family_ref: str = ""
    _plan: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def family(self) -> kbase.Family:
        from tuner import kernels

        return kernels.get(self.family_ref or self.kernel)

    # -- queries ------------------------------------------------------------------------------------------------
    def problem(self, name: str | None = None) -> Problem:
        if name is None:
            return self.problems[0]
        for p in self.problems:
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.problems)
        raise SpaceError(f"unknown problem {name!r} (known: {known})", str(self.path))

    @property
    def cartesian(self) -> int:
        n = 1
        for values in self.params.values():
            n *= len(values)
        return n

    def content_hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def resolve(self, config: dict[str, Any], problem: Problem | None = None) -> dict[str, Any]:
        """Params plus derived values, evaluated in dependency order (no validity check)."""
        env = {**(problem or self.problems[0]).expression_env, **config}
        for name in self._plan["derived_order"]:
            env[name] = self.derived[name](env)
        return {**config, **{n: env[n] for n in self._plan["derived_order"]}}

    def validate(self, config: dict[str, Any], problem: Problem | None = None) -> str | None:
        """None when the config is in the space and meets every constraint; else the reason it is not."""
        problem = problem or self.problems[0]
        for name in config:
            if name not in self.params:
                return f"unknown parameter {name!r}"
        for name, values in self.params.items():
            if name not in config:
                return f"missing parameter {name!r}"
            if config[name] not in values:
                return f"{name}={config[name]!r} is not one of {list(values)}"
        env = {**problem.expression_env, **config}
        try:
            for name in self._plan["derived_order"]:
                env[name] = self.derived[name](env)
            for constraint in self.constraints:
                if not constraint(env):
                    return f"constraint failed: {constraint.text}"
        except (ArithmeticError, TypeError, ValueError) as exc:
            return f"expression error: {type(exc).__name__}: {exc}"
        return None

    # -- enumeration ----------------------------------------------------------------------------------------------
    def enumerate(
        self, problem: Problem | None = None, budget: int | None = None, errors: list[str] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Yield every valid config (params only) lazily, in the order of the params' declared values.

        With `budget`, raise WalkBudgetExceeded after visiting that many partial configs. With `errors`, append
        a description of the first expression that failed to evaluate (a config it fails on is not valid).
        """
        problem = problem or self.problems[0]
        names = list(self.params)
        levels = self._plan["levels"]
        env: dict[str, Any] = dict(problem.expression_env)
        visited = 0

        def passes(steps) -> bool:
            for text, step in steps:
                try:
                    if not step(env):
                        return False
                except (ArithmeticError, TypeError, ValueError) as exc:
                    if errors is not None and not errors:
                        bound = ", ".join(f"{n}={env[n]!r}" for n in names if n in env)
                        errors.append(f"evaluating {text!r} fails: {exc}" + (f" (at {bound})" if bound else ""))
                    return False
            return True

        if not passes(levels[-1]):
            return

        def walk(i: int) -> Iterator[dict[str, Any]]:
            nonlocal visited
            if i == len(names):
                yield {n: env[n] for n in names}
                return
            name = names[i]
            for value in self.params[name]:
                visited += 1
                if budget is not None and visited > budget:
                    raise WalkBudgetExceeded
                env[name] = value
                if passes(levels[i]):
                    yield from walk(i + 1)
            env.pop(name, None)

        yield from walk(0)

    def valid_positions(self, problem: Problem | None = None, budget: int | None = None) -> np.ndarray:
        """Every valid config as a row of positions into the params' declared values (int16, one column per param):
        the configs `enumerate` yields, in its order. With `budget`, WalkBudgetExceeded as `enumerate` raises it
        (the same count of partial configs visited).

        A plain space is listed a level at a time over NumPy arrays (`Expr.over`): gemm.yaml's 268k valid configs
        in ~0.1 s instead of ~2 s config by config. An expression the arrays cannot evaluate exactly, and a
        subclass (which may narrow validity in `enumerate`), are listed config by config."""
        import numpy as np

        problem = problem or self.problems[0]
        listed = self._listed_over_arrays(problem, budget)
        if listed is not None:
            return listed
        pairs = [(name, {v: i for i, v in enumerate(values)}) for name, values in self.params.items()]
        flat = [pos[c[n]] for c in self.enumerate(problem, budget=budget) for n, pos in pairs]
        return np.array(flat, dtype=np.int16).reshape(-1, len(pairs))

    def _listed_over_arrays(self, problem: Problem, budget: int | None) -> np.ndarray | None:
        """`_positions_over_arrays`, or None where the arrays cannot list this space (see `valid_positions`)."""
        from tuner.expr.arrays import NotVectorizable

        if type(self) is not SearchSpace:
            return None
        try:
            return self._positions_over_arrays(problem, budget)
        except NotVectorizable:
            return None

    def _positions_over_arrays(self, problem: Problem, budget: int | None) -> np.ndarray:
        import numpy as np

        from tuner.expr.arrays import NotVectorizable, truth

        env: dict[str, Any] = dict(problem.expression_env)
        rows = np.zeros((1, 0), dtype=np.int16)  # the one empty prefix
        visited = 0

        def apply(level: int) -> None:
            # The level's steps run over all its rows and the rows are filtered once at the end (filtering every
            # array after each step cost more than the steps): a config a step rules out may still reach a later
            # step of the level, where its failure or value no longer matters.
            nonlocal rows, env
            keep: Any = True
            for name, expr in self._plan["steps"][level]:
                value, failed = expr.over(env)
                if name is not None:
                    env[name] = value
                    if isinstance(failed, np.ndarray):
                        keep = np.logical_and(keep, np.logical_not(failed))
                    elif failed:
                        keep = False
                elif isinstance(value, np.ndarray) or isinstance(failed, np.ndarray):
                    keep = np.logical_and(keep, np.logical_and(truth(value), np.logical_not(failed)))
                elif failed or not value:
                    keep = False
                if keep is False:
                    break
            if isinstance(keep, np.ndarray):
                if not keep.all():
                    rows = rows[keep]
                    env = {k: v[keep] if isinstance(v, np.ndarray) else v for k, v in env.items()}
            elif not keep:
                rows = rows[:0]
                env = {k: v[:0] if isinstance(v, np.ndarray) else v for k, v in env.items()}

        apply(-1)
        for level, (name, values) in enumerate(self.params.items()):
            if not len(rows):
                break
            column = np.array(values)
            if column.dtype.kind not in "biufU" or column.ndim != 1:
                raise NotVectorizable(f"values of {name} of mixed kinds")
            visited += len(rows) * len(values)
            if budget is not None and visited > budget:
                raise WalkBudgetExceeded
            n, k = len(rows), len(values)
            rows = np.hstack([np.repeat(rows, k, axis=0), np.tile(np.arange(k, dtype=np.int16), n)[:, None]])
            env = {key: np.repeat(v, k) if isinstance(v, np.ndarray) else v for key, v in env.items()}
            env[name] = np.tile(column, n)
            apply(level)
        return rows

    def configs_at(self, rows: np.ndarray) -> list[dict[str, Any]]:
        """The configs (params only, the space's param order) whose value positions are `rows`, as
        `valid_positions` gives them."""
        columns = list(self.params.items())
        return [{n: vs[i] for (n, vs), i in zip(columns, row, strict=True)} for row in rows.tolist()]

    def count_valid(self, problem: Problem | None = None) -> int:
        return len(self.valid_positions(problem))

    def count_valid_bounded(self, problem: Problem | None = None, budget: int = WALK_BUDGET) -> tuple[int, bool]:
        """(count, exact): the number of valid configs, or when the walk runs out of budget a lower bound."""
        try:
            listed = self._listed_over_arrays(problem or self.problems[0], budget)
        except WalkBudgetExceeded:  # over budget: the walk below counts what it reaches within it
            listed = None
        if listed is not None:
            return len(listed), True
        n = 0
        try:
            for _ in self.enumerate(problem, budget=budget):
                n += 1
        except WalkBudgetExceeded:
            return n, False
        return n, True

    def valid_configs(self, problem: Problem | None = None, budget: int = WALK_BUDGET) -> list[dict[str, Any]]:
        """Every valid config, or SpaceError when the space is too large to list within `budget`."""
        try:
            return self.configs_at(self.valid_positions(problem, budget=budget))
        except WalkBudgetExceeded:
            raise SpaceError(
                f"the space is too large to list its valid configs ({self.cartesian:,} Cartesian "
                f"configs; a walk of {budget:,} partial configs did not finish)",
                str(self.path),
            ) from None

    def sample(self, n: int, seed: int = 0, problem: Problem | None = None) -> list[dict[str, Any]]:
        """A seeded sample of n distinct valid configs (all of them when the space has fewer).

        A space that a bounded walk can list is sampled from the list. A larger one is never listed: Cartesian
        points are drawn at random (at most `SAMPLE_DRAWS` of them) and the valid ones kept, so the result may
        hold fewer than n configs; none at all is a SpaceError.
        """
        problem = problem or self.problems[0]
        try:
            valid = self.configs_at(self.valid_positions(problem, budget=WALK_BUDGET))
        except WalkBudgetExceeded:
            valid = None
        if valid is not None:
            return valid if n >= len(valid) else random.Random(seed).sample(valid, n)
        rng = random.Random(seed)
        found: dict[tuple, dict[str, Any]] = {}
        for _ in range(SAMPLE_DRAWS):
            config = {name: rng.choice(values) for name, values in self.params.items()}
            if self.validate(config, problem) is None:
                found.setdefault(tuple(config.values()), config)
                if len(found) == n:
                    break
        if not found:
            raise SpaceError(
                f"no valid config among {SAMPLE_DRAWS:,} random draws from {self.cartesian:,} "
                f"Cartesian configs (the constraints may rule out all of them)",
                str(self.path),
            )
        return list(found.values())

    # -- user-facing config parsing -------------------------------------------------------------------------------
    def config_from_assignments(self, assignments: list[str], problem: Problem | None = None) -> dict[str, Any]:
        """Turn ``["tile=32", "pad=1"]`` into a full config: the default config overridden by the assignments.
        A name is a parameter's, or its short name in the family's kernel URIs (``t=128`` for ``threads``), so
        that a config can be written back from its URI. Unknown names and values outside the space are
        SpaceErrors; so is a result that breaks a constraint."""
        config = dict(self.default)
        short = {v: k for k, v in self.family.uri_names.items() if k in self.params}
        for item in assignments:
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise SpaceError(f"--set expects NAME=VALUE, got {item!r}", str(self.path))
            key = key if key in self.params else short.get(key, key)
            if key not in self.params:
                raise SpaceError(f"--set {key}: unknown parameter (known: {', '.join(self.params)})", str(self.path))
            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                problem_text = getattr(exc, "problem", None) or type(exc).__name__
                raise SpaceError(f"--set {key}={raw}: not a YAML scalar ({problem_text})", str(self.path)) from None
            if isinstance(value, dict | list) or value not in self.params[key]:
                raise SpaceError(
                    f"--set {key}={raw}: value outside the space (allowed: {list(self.params[key])})", str(self.path)
                )
            config[key] = value
        reason = self.validate(config, problem)
        if reason is not None:
            raise SpaceError(f"config is not valid: {reason}", str(self.path))
        return config
