"""An explicit list of valid configs: a space's ``configs:`` key.

Some spaces are known only as a set of configs, not as rules: a Kernel Tuner cache records which configs were
valid (its restrictions, evaluated), not the restrictions themselves. Such a space lists its valid configs as
data, one row of values per config in the order of ``params:``, inline or in a JSON file beside the space::

    params: {block_size_x: [32, 64, 128], tile: [1, 2, 4]}
    configs: [[32, 1], [32, 2], [64, 4]]           # inline, for a few thousand configs
    configs: vadd.configs.json                     # {"params": [block_size_x, tile], "configs": [[32, 1], ...]}

A listed space's valid configs are the listed ones that also meet ``constraints:`` (usually none). A file is data
and bounded like one: at most `MAX_CONFIGS` configs and `MAX_FILE_BYTES`, each value one of its param's values.
Every fault is a `SpaceError` naming the file it is in (the space, or the configs file) and what is wrong.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import SpaceError
from tuner.space.model import WALK_BUDGET, SearchSpace, WalkBudgetExceeded, params_key
from tuner.space.problem import Problem

if TYPE_CHECKING:
    import numpy as np

#: most configs a space may list: a Kernel Tuner cache of 100,000 configs fits with room, and a listing stays
#: within `tuner.space.space.WALK_BUDGET` (one visit per config), so every command may walk it whole
MAX_CONFIGS = 500_000
#: largest configs file: 500,000 rows of a dozen small values
MAX_FILE_BYTES = 64 << 20
#: the most configs `tuner import-kt` writes inline in the space (more go to a file beside it)
INLINE_CONFIGS = 2_000


@dataclasses.dataclass
class ListedSpace(SearchSpace):
    """A space whose valid configs are listed (see the module docstring): any other config is invalid, with a
    reason saying so, and enumeration yields the listed configs, in the order of the params' declared values."""

    listed: tuple[tuple[Any, ...], ...] = ()
    listed_set: frozenset[tuple[Any, ...]] = frozenset()
    configs_source: str = ""  # where the list came from: "inline" or the configs file's path
    configs_sha256: str = ""

    def content_hash(self) -> str:
        return hashlib.sha256((super().content_hash() + self.configs_sha256).encode()).hexdigest()

    def validate(self, config: dict[str, Any], problem: Problem | None = None) -> str | None:
        reason = super().validate(config, problem)
        if reason is None and tuple(config[n] for n in self.params) not in self.listed_set:
            return f"config is not one of the {len(self.listed):,} listed configs ({self.configs_source})"
        return reason

    def enumerate(
        self, problem: Problem | None = None, budget: int | None = None, errors: list[str] | None = None
    ) -> Iterator[dict[str, Any]]:
        names = list(self.params)
        for visited, row in enumerate(self.listed, 1):
            if budget is not None and visited > budget:
                raise WalkBudgetExceeded
            config = dict(zip(names, row, strict=True))
            if not self.constraints or SearchSpace.validate(self, config, problem) is None:
                yield config

    def valid_positions(self, problem: Problem | None = None, budget: int | None = None) -> np.ndarray:
        import numpy as np

        if self.constraints or (budget is not None and len(self.listed) > budget):
            return super().valid_positions(problem, budget)  # config by config, through `enumerate`
        index = [{v: i for i, v in enumerate(values)} for values in self.params.values()]
        flat = [index[i][v] for row in self.listed for i, v in enumerate(row)]
        return np.array(flat, dtype=np.int16).reshape(-1, len(index))

    def count_valid_bounded(self, problem: Problem | None = None, budget: int = WALK_BUDGET) -> tuple[int, bool]:
        if not self.constraints:
            return len(self.listed), True
        return super().count_valid_bounded(problem, budget)


def _read_file(spec: str, space_path: Path, fail) -> tuple[list[Any], str, str, Any]:
    """The rows of a configs file named relative to the space: (rows, its path, its sha256, the params it
    names or None)."""
    path = (space_path.parent / spec).resolve() if not Path(spec).is_absolute() else Path(spec)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise fail(f"configs file {spec} not found (looked at {path})", "configs") from None
    except OSError as exc:
        raise fail(f"configs file {spec}: cannot read: {exc.strerror}", "configs") from None
    where = str(path)
    if len(raw) > MAX_FILE_BYTES:
        raise SpaceError(f"larger than {MAX_FILE_BYTES >> 20} MiB: not a configs file", where)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpaceError(f"not a configs file: not JSON ({exc})".splitlines()[0], where) from None
    except RecursionError:
        raise SpaceError("not a configs file: nested too deeply", where) from None
    if not isinstance(data, dict) or not isinstance(data.get("configs"), list):
        raise SpaceError('not a configs file: expected {"params": [...], "configs": [[...], ...]}', where)
    return data["configs"], where, hashlib.sha256(raw).hexdigest(), data.get("params")


def listed(space: SearchSpace, spec: Any, fail) -> ListedSpace:
    """`space` with its valid configs listed by `spec` (the ``configs:`` value: a list of rows, or the name of a
    configs file beside the space). SpaceError for a malformed list, a value outside its param's values, a row
    of the wrong length, or more than `MAX_CONFIGS` configs."""
    names = list(space.params)
    if isinstance(spec, str):
        rows, where, digest, file_params = _read_file(spec, space.path, fail)
        if file_params is not None and list(file_params) != names:
            raise SpaceError(f"configs file names params {file_params}, the space {names}", where)

        def bad(message: str, i: int) -> SpaceError:
            return SpaceError(f"configs[{i}]: {message}", where)

    elif isinstance(spec, list):
        rows, where = spec, "inline"
        digest = hashlib.sha256(json.dumps(spec, default=str).encode()).hexdigest()

        def bad(message: str, i: int) -> SpaceError:
            return fail(f"configs[{i}]: {message}", "configs", i)

    else:
        raise fail("'configs' must be a list of rows of param values, or the name of a configs file", "configs")
    if not rows:
        raise fail("'configs' lists no config", "configs")
    if len(rows) > MAX_CONFIGS:
        raise fail(f"'configs' lists {len(rows):,} configs, more than the {MAX_CONFIGS:,} a space may", "configs")
    # each value as the param declares it (a file's 1.0 is the param's 1), so configs name values one way
    declared = [{(type(v) is bool, v): v for v in values} for values in space.params.values()]
    seen: set[tuple[Any, ...]] = set()
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(names):
            raise bad(f"expected a list of {len(names)} values ({', '.join(names)})", i)
        canonical = []
        for name, value, values in zip(names, row, declared, strict=True):
            found = None if isinstance(value, list | dict) else values.get((type(value) is bool, value))
            if found is None and (isinstance(value, list | dict) or (type(value) is bool, value) not in values):
                raise bad(f"{name}={value!r} is not one of {list(space.params[name])}", i)
            canonical.append(found)
        seen.add(tuple(canonical))
    order = [{v: k for k, v in enumerate(values)} for values in space.params.values()]
    ordered = tuple(sorted(seen, key=lambda row: tuple(order[k][v] for k, v in enumerate(row))))
    fields = {f.name: getattr(space, f.name) for f in dataclasses.fields(SearchSpace)}
    return ListedSpace(
        **fields, listed=ordered, listed_set=frozenset(ordered), configs_source=where, configs_sha256=digest
    )


def listed_subset(space: ListedSpace, keys: frozenset[str], problem: Problem | None = None) -> ListedSpace:
    """The listed configs of `space` whose params key (`tuner.space.space.params_key`) is in `keys` (a replay's
    recorded configs), each param's values cut to those they use, and the first of them the default when the
    space's default is not among them. SpaceError when none is."""
    names = list(space.params)
    rows = tuple(row for row in space.listed if params_key(dict(zip(names, row, strict=True))) in keys)
    rows = tuple(r for r in rows if space.validate(dict(zip(names, r, strict=True)), problem) is None)
    if not rows:
        raise SpaceError("the replay recording holds none of the space's listed configs", str(space.path))
    params = {
        n: tuple(v for v in values if any(r[i] == v for r in rows))
        for i, (n, values) in enumerate(space.params.items())
    }
    default = (
        space.default
        if tuple(space.default.get(n) for n in names) in set(rows)
        else dict(zip(names, rows[0], strict=True))
    )
    return dataclasses.replace(
        space,
        params=params,
        default=dict(default),
        listed=rows,
        listed_set=frozenset(rows),
        description=f"{space.description} [replayed: the {len(rows)} recorded configs]",
    )
