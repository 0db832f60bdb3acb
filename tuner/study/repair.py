"""The repair of proposals that cannot be measured: a config of the valid set, unexplored, instead.

A sampler proposes configs that break a constraint, or were measured (or failed) already. Such a proposal is
answered without evaluation, and the driver measures a replacement: the nearest unexplored valid config (or, for
random search, a uniform draw), from the space's valid set (`tuner.study.validset.valid_index`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tuner.space.space import params_key
from tuner.study.validset import ValidIndex

if TYPE_CHECKING:
    pass


class Repair:
    """The config to measure after a proposal that cannot be measured.

    In a sparse space (GEMV: 1% of the Cartesian product is valid) a sampler proposes many configs that break a
    constraint, and once it converges it proposes configs already measured (or known to fail). Each such
    proposal is still told to the sampler (so it learns where the feasible, unexplored region is), and the next
    trial measures the valid config closest to the proposal: fewest steps along each param's ordered list of
    values (L1 over value indices), ties broken by a seeded draw, configs already measured, failed or in flight
    skipped. With `nearest` False, a uniform draw among those configs instead. The valid set is
    `tuner.study.validset.ValidIndex` (a space too large to list within `space.WALK_BUDGET` gets no repair).
    """

    def __init__(self, index: ValidIndex, seed: int | None, nearest: bool = True):
        import numpy as np

        self.rng = np.random.default_rng(seed)
        self.use_nearest = nearest
        self.index = index
        #: whether the index is the whole valid set (else the space is too large to list, and the sampler alone
        #: finds valid configs)
        self.complete = index.complete
        # Value indices, one contiguous column per param: "nearest" counts steps along each param's declared
        # values, summed column by column (a few ms over GEMM's 268k configs, where a row-wise sum takes 13).
        self.columns = [np.ascontiguousarray(index.rows[:, j]) for j in range(index.rows.shape[1])]

    def size(self) -> int:
        return len(self.index)

    def contains(self, key: str) -> bool:
        return self.index.row_of(key) is not None

    def draw(self, exclude: set[str]) -> dict[str, Any] | None:
        """A uniform draw among the valid configs not in `exclude` (keys), or None when none is left."""
        count = len(self.index)
        if not count:
            return None
        # A few rejection draws first: cheap while most of the set is unexplored (GEMM: 268k configs).
        for _ in range(16):
            row = int(self.rng.integers(count))
            config = self.index.config(row)
            if params_key(config) not in exclude:
                return config
        return self._pick(self.rng.random(count), exclude)

    def nearest(self, params: dict[str, Any], exclude: set[str]) -> dict[str, Any] | None:
        import numpy as np

        count = len(self.index)
        if self.use_nearest:
            steps = np.zeros(count, dtype=np.int32)
            for column, at in zip(self.columns, self.index.point(params), strict=True):
                steps += np.abs(column - np.int16(at))
            distance = steps.astype(np.float64)
            distance += self.rng.random(count) * 0.5  # seeded tie-break below one step
        else:
            distance = self.rng.random(count)
        if not count:
            return None
        return self._pick(distance, exclude)

    def _pick(self, distance, exclude: set[str]) -> dict[str, Any] | None:
        """The config of least `distance` (one per row) whose key is not in `exclude`."""
        import numpy as np

        count = len(self.index)
        rows = {r for r in map(self.index.row_of, exclude) if r is not None}
        if len(exclude) < count // 2:
            k = min(4 * len(exclude) + 64, count)
            # The k nearest in order, without sorting the whole set (hundreds of thousands of rows in GEMM).
            head = np.argpartition(distance, k - 1)[:k] if k < count else np.arange(count)
            for i in head[np.argsort(distance[head])].tolist():
                if i not in rows:
                    return self.index.config(i)
        free = np.ones(count, dtype=bool)
        free[list(rows)] = False
        if not free.any():
            return None
        distance[~free] = np.inf
        return self.index.config(int(np.argmin(distance)))
