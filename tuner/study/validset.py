"""The valid set of a space: its on-disk cache (`ValidIndex`, `valid_index`), its background builder
(`IndexBuild`), and the sampler wrapper that proposes inside it (`ValidSetSampler`).

`ValidIndex`: the valid configs of a space for one problem on one GPU, as rows of value indices, which the driver's
repair of unmeasurable proposals searches. Listing a large space takes seconds (gemm.yaml: 268k valid configs of
960k), so the index is kept on disk under the tuner cache dir, keyed by what validity depends on (`index_key`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import threading
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from tuner.space.problem import Problem
    from tuner.space.space import SearchSpace
    from tuner.study.codec import Codec

#: bump when the file format or the meaning of a row changes
INDEX_VERSION = "1"


class ValidIndex:
    """The valid configs of a space for one problem, each a row of indices into the params' declared values
    (columns in the space's param order), in `SearchSpace.enumerate`'s order. `complete` is False when the
    space is too large to list within `space.WALK_BUDGET` (then there are no rows, and the sampler alone finds
    valid configs)."""

    def __init__(self, space: SearchSpace, rows: np.ndarray, complete: bool):
        import numpy as np

        self.names = list(space.params)
        self.values = [space.params[n] for n in self.names]
        self.rows, self.complete = rows, complete
        #: per param, value → index in its declared values
        self.position = [{v: i for i, v in enumerate(vs)} for vs in self.values]
        # A row's code in mixed radix (the lengths of the params' value lists), sorted: membership by bisection.
        self._radix = np.cumprod([1] + [len(vs) for vs in self.values[:0:-1]], dtype=np.int64)[::-1]
        codes = rows.astype(np.int64) @ self._radix if len(rows) else np.zeros(0, dtype=np.int64)
        self._order = np.argsort(codes, kind="stable")
        self._sorted = codes[self._order]
        self._rows_of: dict[str, int | None] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def config(self, row: int) -> dict[str, Any]:
        """The config (real values, the space's param order) of row `row`."""
        return {n: vs[i] for n, vs, i in zip(self.names, self.values, self.rows[row].tolist(), strict=True)}

    def point(self, params: dict[str, Any]) -> list[int]:
        """`params` as value indices (KeyError for a value outside the space)."""
        return [pos[params[n]] for n, pos in zip(self.names, self.position, strict=True)]

    def row_of(self, key: str) -> int | None:
        """The row of the config whose `space.params_key` is `key`, or None when it is not valid."""
        if key not in self._rows_of:
            import numpy as np

            try:
                params = json.loads(key)
                code = int(np.dot(self.point(params), self._radix)) if len(params) == len(self.names) else -1
            except (KeyError, TypeError, ValueError):
                code = -1
            at = int(np.searchsorted(self._sorted, code))
            found = at < len(self._sorted) and self._sorted[at] == code
            self._rows_of[key] = int(self._order[at]) if found else None
        return self._rows_of[key]


def index_key(space: SearchSpace, problem: Problem, budget: int) -> str:
    """What a space's valid set depends on: the space file's text and its params' values (as loaded), the
    problem's sizes and dtype with the GPU facts expressions see (`Problem.expression_env`), the walk's budget, and
    the code that reads and evaluates spaces. Any change is a miss."""
    from tuner.space import space as space_mod

    blob = hashlib.sha256(INDEX_VERSION.encode())
    for path in space_mod.code_files():
        blob.update(path.read_bytes())
    blob.update(space.text.encode())
    facts = {"env": problem.expression_env, "budget": budget, "params": {n: list(v) for n, v in space.params.items()}}
    blob.update(json.dumps(facts, sort_keys=True, default=repr).encode())
    return blob.hexdigest()


def _index_path(key: str) -> Path:
    from tuner.build.compile import cache_dir

    return cache_dir() / "valid" / f"{key}.npz"


def _read_index(space: SearchSpace, path: Path) -> ValidIndex | None:
    """The index stored at `path`, or None when there is none or it is not a whole, well-formed index of this
    space (a damaged file is rebuilt, never trusted)."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            rows, complete = data["rows"], bool(data["complete"])
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile):
        return None
    lengths = np.array([len(v) for v in space.params.values()])
    if rows.dtype != np.int16 or rows.ndim != 2 or rows.shape[1] != len(lengths):
        return None
    if len(rows) and (rows.min() < 0 or (rows.max(axis=0) >= lengths).any()):
        return None
    return ValidIndex(space, rows, complete)


def _build_index(space: SearchSpace, problem: Problem, budget: int) -> ValidIndex:
    import numpy as np

    from tuner.space import space as space_mod

    try:
        rows, complete = space.valid_positions(problem, budget=budget), True
    except space_mod.WalkBudgetExceeded:
        rows, complete = np.zeros((0, len(space.params)), dtype=np.int16), False
    return ValidIndex(space, rows, complete)


def valid_index(space: SearchSpace, problem: Problem, budget: int | None = None) -> ValidIndex:
    """The valid set of `space` for `problem`, from the tuner cache dir when it was listed before; else listed
    now and stored (an atomic write under a per-key lock, so two processes list it once). A cache that cannot
    be written is skipped; a subclass of `SearchSpace` (which may narrow validity beyond its text) is listed
    every time."""
    import numpy as np

    from tuner.build.files import atomic_write, locked
    from tuner.core.errors import InputError
    from tuner.space import space as space_mod

    budget = space_mod.WALK_BUDGET if budget is None else budget
    if type(space) is not space_mod.SearchSpace:  # a subclass (a replay's recorded subset) decides validity itself
        return _build_index(space, problem, budget)
    path = _index_path(index_key(space, problem, budget))
    if (hit := _read_index(space, path)) is not None:
        return hit
    try:
        lock = locked(path.with_suffix(".lock"))
        lock.__enter__()  # a second process waits here, then finds the first's index
    except InputError:  # a cache dir that cannot be written: list the space, keep nothing
        return _build_index(space, problem, budget)
    try:
        if (hit := _read_index(space, path)) is not None:
            return hit
        index = _build_index(space, problem, budget)
        buffer = io.BytesIO()
        np.savez(buffer, rows=index.rows, complete=np.array(index.complete))
        with contextlib.suppress(InputError):
            atomic_write(path, buffer.getvalue(), make_parents=True)
        return index
    finally:
        lock.__exit__(None, None, None)


class IndexBuild:
    """`valid_index`, started at once in a thread beside the driver's set-up; `result` takes it when the study loop
    needs it. Listing a space not listed before on this machine is a level-at-a-time walk over NumPy arrays
    (`SearchSpace.valid_positions`: gemm.yaml in ~0.1 s), which it then stores in the tuner cache dir."""

    def __init__(self, space: SearchSpace, problem: Problem):
        self.space, self.problem = space, problem
        self._result: ValidIndex | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="valid-index", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = valid_index(self.space, self.problem)
        except BaseException as exc:  # re-raised in the caller's thread by `result`
            self._error = exc

    def done(self) -> bool:
        """Whether the listing has finished (`result` would not wait)."""
        return not self._thread.is_alive()

    def result(self) -> ValidIndex:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


# ---------------------------------------------------------------------------------------------------------------
# proposals inside the valid set


class ValidSetSampler:
    """An Optuna sampler that proposes only valid configs not yet explored, around any base sampler.

    Until `attach` hands it the valid set (a fresh machine lists it in the background) it is the base sampler,
    and the driver screens and repairs what the base proposes. Attached:

    - when the base proposes a whole config (TPE after its start-up trials, NSGA-II's children, GP, CMA-ES), a
      valid, unexplored proposal is taken as it is; otherwise the base is asked again (its RNG moves on) up to
      `retries` times, then the nearest unexplored valid config of the last proposal is taken (the driver's
      repair, `nearest`). By default there is no retry: on the recorded spaces two retries doubled TPE's time
      per proposal and found nothing sooner;
    - when the base proposes nothing (TPE's start-up trials, the random sampler, NSGA-II's first generation),
      a uniform draw among the unexplored valid configs (`draw`): random search is then uniform sampling without
      replacement over the valid set;
    - its relative search space is the whole space from the first trial on, so even proposals made while
      nothing has completed are drawn inside the valid set.

    Screened proposals never reach the study, so the base learns only from evaluated configs (and failures,
    told as `tells_failures_as_worst` says). The contract of `repair`: ``contains(key)``,
    ``nearest(params, exclude)`` and
    ``draw(exclude)`` (real-valued configs, None when nothing is left); `explored()` gives the keys
    (`space.params_key`) of the configs measured, failed or in flight. It implements the public methods of
    `optuna.samplers.BaseSampler` and calls only those of the base (duck-typed: importing this module does not
    import Optuna).
    """

    def __init__(self, base, codec: Codec, retries: int = 0):
        self.base, self.codec, self.retries = base, codec, retries
        self._repair: Any = None
        self._explored: Any = None
        self._single = {n: d.to_external_repr(0) for n, d in codec.sampler_dists.items() if d.single()}
        self._varied = set(codec.sampler_dists) - set(self._single)
        #: trial number → the base's own relative search space (inferred once per trial)
        self._base_space: dict[int, dict[str, Any]] = {}

    def attach(self, repair, explored) -> None:
        """Start proposing inside the valid set of `repair` (a complete one), skipping `explored()`."""
        self._repair, self._explored = repair, explored
        if hasattr(self.base, "attach"):  # a base that models the valid set itself (`ForestSampler`)
            self.base.attach(repair, explored, self.codec)

    @property
    def attached(self) -> bool:
        return self._repair is not None

    def __str__(self) -> str:
        return f"ValidSetSampler({self.base})"

    # -- BaseSampler --------------------------------------------------------------------------------------------
    def infer_relative_search_space(self, study, trial) -> dict[str, Any]:
        base_space = self.base.infer_relative_search_space(study, trial)
        if not self.attached:
            return base_space
        self._base_space = {trial.number: base_space}
        # Every param is sampled here (a whole valid config), so every param must be in the relative space.
        return dict(self.codec.sampler_dists)

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        from tuner.space.space import params_key

        if not self.attached:
            return self.base.sample_relative(study, trial, search_space)
        base_space = self._base_space.pop(trial.number, None)
        if base_space is None:
            base_space = self.base.infer_relative_search_space(study, trial)
        exclude = set(self._explored())
        proposal: dict[str, Any] = {}
        for _ in range(1 + self.retries):
            sampled = self.base.sample_relative(study, trial, base_space) if base_space else {}
            if not self._varied <= set(sampled):
                break  # the base proposes nothing whole (start-up, random): drawn uniformly below
            # A param of one value is never in a base's relative space (Optuna suggests it directly).
            sampled = {**self._single, **sampled}
            proposal = self.codec.decode(sampled)
            key = params_key(proposal)
            if key not in exclude and self._repair.contains(key):
                return sampled
        chosen = self._repair.nearest(proposal, exclude) if proposal else self._repair.draw(exclude)
        if chosen is None:  # nothing unexplored is left: the driver's screen answers the base's proposal
            return self.base.sample_relative(study, trial, base_space) if base_space else {}
        return self.codec.encode(chosen)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()
