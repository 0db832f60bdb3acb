"""Search spaces: YAML → `SearchSpace`.

A space file names a kernel family, the problem(s) it runs on, the knobs and their values, the constraints that
rule configs out before any work, derived values the template needs, and the study's objectives::

    kernel: transpose
    problem: {name: n16384, rows: 16384, cols: 16384, dtype: float32}
    params:
      tile: [32, 64]
      rows_per_thread: {pow2: [1, 16]}
    derived:
      threads: tile * tile // (rows_per_thread * tile)
    constraints:
      - threads <= 1024
    objectives:
      - throughput: maximize

``template:`` gives the family a template beside the space, and ``compile_options:`` NVRTC options of its own
(``[-DTILE=4, --use_fast_math, -I include]``: a known list, `tuner.kernels.compile_options`).

Every fault is a `SpaceError` naming the file and, where YAML knows it, the line. Enumeration is lazy and
backtracks: a constraint is checked as soon as the params it reads are bound, so a space with a million
Cartesian points and ten thousand valid ones is walked in well under a second.

A space file is data and is bounded like data: string values are identifiers (they name a variant; they are never
text pasted into CUDA), a range holds at most `MAX_RANGE` values, keys may not repeat, and every walk over the
space that a command makes on its own (looking for a first valid config, counting, sampling) visits at most
`WALK_BUDGET` partial configs, so an unsatisfiable space of 10^15 configs is an error in seconds, not a hang.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tuner.core.errors import SpaceError
from tuner.kernels import plain
from tuner.space.model import (  # noqa: F401 - the space's model, named from here by most callers
    PACKAGE_ROOT,
    SAMPLE_DRAWS,
    SPACES_DIR,
    TOP_LEVEL_KEYS,
    WALK_BUDGET,
    SearchSpace,
    WalkBudgetExceeded,
    code_files,
    params_key,
)
from tuner.space.problem import Objective, Problem  # noqa: F401
from tuner.space.reading import (
    _load_exprs,
    _load_objectives,
    _load_params,
    _load_problems,
    constraint_list,
    read_document,
)
from tuner.space.walk import plan

# ---------------------------------------------------------------------------------------------------------------
# Loading


def resolve_path(space: str | Path) -> Path:
    """A path to a YAML file, or the name of a shipped space (``gemm`` → the shipped gemm.yaml). A path that does
    not exist but reads ``search_spaces/NAME.yaml`` (how commands and recorded studies name the shipped spaces)
    is the shipped space NAME, so such commands work from any directory."""
    path = Path(space)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists() and path.parent.name == "search_spaces" and (SPACES_DIR / path.name).is_file():
            return SPACES_DIR / path.name
        return path
    shipped = SPACES_DIR / f"{space}.yaml"
    return shipped if shipped.exists() else path


def shipped_spaces() -> list[Path]:
    return sorted(SPACES_DIR.glob("*.yaml"))


def load(space: str | Path) -> SearchSpace:
    """Load and check a space file. Raises SpaceError (file:line: fault) on anything wrong."""
    path = resolve_path(space)
    where = str(path)
    text, data, lines = read_document(path)
    if not isinstance(data, dict):
        raise SpaceError("expected a mapping at the top level", where, 1)

    def fail(message: str, *keys: Any) -> SpaceError:
        return SpaceError(message, where, lines.line(*keys))

    for key in data:
        if key not in TOP_LEVEL_KEYS:
            raise fail(f"unknown top-level key {key!r} (allowed: {', '.join(TOP_LEVEL_KEYS)})", key)
    for key in ("kernel", "problem", "params"):
        if key not in data and not (key == "kernel" and "family" in data):
            raise SpaceError(f"missing top-level key {key!r}", where)

    from tuner.kernels import custom  # late import: kernels import space-free modules only

    family = custom.space_family(data, path, fail)  # a user's family module runs here, by their choice
    kernel = family.name

    problems = _load_problems(data["problem"], family, fail)
    params = _load_params(data["params"], fail)
    derived = _load_exprs(data.get("derived") or {}, "derived", fail)
    if not isinstance(derived, dict):
        raise fail("'derived' must be a mapping of name: expression", "derived")
    constraints = _load_exprs(constraint_list(data.get("constraints")), "constraints", fail)
    if not isinstance(constraints, list):
        raise fail("'constraints' must be a list of expressions (or one)", "constraints")
    for name in derived:
        if name in params:
            raise fail(f"derived value {name!r} has the name of a parameter", "derived", name)
        if any(name in p.expression_env for p in problems) or name in ("ctype", "entry"):
            raise fail(f"derived value {name!r} has the name of a problem symbol", "derived", name)
    if plain.is_plain(family.template):  # each param and derived value becomes a #define
        plain.check_define_names(params, derived, fail)
    objectives = _load_objectives(data.get("objectives"), fail)

    loaded = SearchSpace(
        path=path,
        name=path.stem,
        kernel=kernel,
        description=str(data.get("description", "")).strip(),
        problems=problems,
        params=params,
        constraints=constraints,
        derived=derived,
        objectives=objectives,
        default={},
        text=text,
        family_ref=family.ref or family.name,
    )
    loaded._plan = plan(params, derived, constraints, problems, fail)  # noqa: SLF001 - the loader builds its space
    if "configs" in data:  # an explicit list of valid configs (tuner.space.configs)
        from tuner.space import configs

        loaded = configs.listed(loaded, data["configs"], fail)

    _set_default(loaded, data.get("default"), fail)
    if hasattr(family, "validate_space"):  # a declarative family's expressions against this space's names
        family.validate_space(loaded, fail)
    return loaded


def _set_default(loaded: SearchSpace, default: Any, fail) -> None:
    """The space's default config: the file's ``default:`` (checked), else the first valid config of its first
    problem. Every problem must have a valid config, found within `WALK_BUDGET` partial configs."""
    if default is not None:
        if not isinstance(default, dict):
            raise fail("'default' must be a mapping of param: value", "default")
        reason = loaded.validate({**{n: v[0] for n, v in loaded.params.items()}, **default})
        if any(name not in loaded.params for name in default) or reason is not None:
            raise fail(f"default config is not valid: {reason}", "default")
        loaded.default = {**{n: v[0] for n, v in loaded.params.items()}, **default}
    for problem in loaded.problems:
        if loaded.default and loaded.validate(loaded.default, problem) is None:
            continue
        errors: list[str] = []
        try:
            first = next(loaded.enumerate(problem, budget=WALK_BUDGET, errors=errors), None)
        except WalkBudgetExceeded:
            hint = f"; {errors[0]}" if errors else ""
            raise SpaceError(
                f"no valid config for problem {problem.name!r} found among the first {WALK_BUDGET:,} "
                f"partial configs of {loaded.cartesian:,} Cartesian ones{hint} (if valid configs "
                f"exist, name one under 'default:')",
                str(loaded.path),
            ) from None
        if first is None:
            if errors:
                raise SpaceError(f"no valid configs for problem {problem.name!r}: {errors[0]}", str(loaded.path))
            raise SpaceError(
                f"no valid configs for problem {problem.name!r}: the constraints rule out all "
                f"{loaded.cartesian:,} Cartesian configs",
                str(loaded.path),
            )
        if default is None and not loaded.default:
            loaded.default = first
