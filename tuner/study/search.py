"""What the sampler sees of a space, and what it is told about failures.

Two things the study driver (`tuner.study.driver`) needs from here:

- `Codec`: the Optuna distributions of a space's params. A param whose values are all numbers (tile sizes,
  vector widths, thread counts) is *ordered*: the sampler sees an ``IntDistribution`` over the index of the value
  in ascending order, so TPE, GP and CMA-ES can use the order (a categorical distribution hides it: CMA-ES then
  falls back to random on every param). Strings and booleans stay categorical. The durable study keeps the real
  values under a ``CategoricalDistribution`` of the space's declared values, exactly as studies were recorded
  before, so the dashboard, exports and replay of older recordings see real values; `Codec.record` converts a
  sampler-side trial into that form and `Codec.sampler_trial` converts a stored trial back.
- `worst_values`: how a failed config is told to the sampler. Optuna's samplers skip FAIL trials (GP skips
  PRUNED ones too), so a sampler told only "failed" proposes the same config again and again. A failure is
  told COMPLETE with the worst value of each objective measured so far and constraint 1.0 (infeasible), which
  every sampler learns from; the durable record keeps its true state (PRUNED for a constraint violation, FAIL
  for a kernel failure) and its `failure` attr. TPE proposing inside the valid set is told only constraint
  violations so (`tells_failures_as_worst`).
- `ValidIndex`: the valid configs of a space for one problem on one GPU, as rows of value indices, which the
  driver's repair of unmeasurable proposals searches. Listing a large space takes seconds (gemm.yaml: 268k valid
  configs of 960k), so the index is kept on disk under the tuner cache dir, keyed by what validity depends on
  (`index_key`).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import threading
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.errors import InputError
from tuner.result import INTERRUPTED, TrialAttr
from tuner.space.limits import SAMPLERS

if TYPE_CHECKING:
    import numpy as np
    from optuna.samplers import BaseSampler

    from tuner.space.problem import Problem
    from tuner.space.space import SearchSpace

CONSTRAINT_KEY = "space"
#: user attr that marks a trial whose sampler-side state differs from its recorded one
FAILURE_ATTR = "failure"


def is_ordered(values: tuple[Any, ...]) -> bool:
    """True when every value is a real number (booleans are not): such a param gets an ordered distribution."""
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


class Codec:
    """Maps a space's params between real values (storage, templates) and the sampler's distributions."""

    def __init__(self, params: dict[str, tuple[Any, ...]], ordered: bool = True):
        from optuna.distributions import CategoricalDistribution, IntDistribution

        self.params = params
        #: name → values in the sampler's index order (ascending for ordered params)
        self.order: dict[str, list[Any]] = {}
        self.sampler_dists: dict[str, Any] = {}
        self.record_dists = {name: CategoricalDistribution(list(values)) for name, values in params.items()}
        for name, values in params.items():
            if ordered and is_ordered(values):
                self.order[name] = sorted(values)
                self.sampler_dists[name] = IntDistribution(0, len(values) - 1)
            else:
                self.sampler_dists[name] = CategoricalDistribution(list(values))
        self._index = {name: {v: i for i, v in enumerate(vs)} for name, vs in self.order.items()}

    # -- params -------------------------------------------------------------------------------------------------
    def decode(self, sampled: dict[str, Any]) -> dict[str, Any]:
        """Sampler-side params → real values."""
        return {n: self.order[n][v] if n in self.order else v for n, v in sampled.items()}

    def encode(self, params: dict[str, Any]) -> dict[str, Any]:
        """Real values → sampler-side params (for `enqueue_trial`). A value outside the space raises KeyError."""
        return {n: self._index[n][v] if n in self._index else v for n, v in params.items()}

    # -- trials -------------------------------------------------------------------------------------------------
    def record(self, frozen):
        """A sampler-side FrozenTrial as the durable study records it: real values, categorical distributions,
        and a failure's true state (PRUNED for a constraint violation, FAIL otherwise) with no values."""
        from optuna.trial import TrialState

        out = copy.copy(frozen)
        out.params = self.decode(frozen.params)
        out.distributions = {n: self.record_dists[n] for n in frozen.params}
        kind = frozen.user_attrs.get(FAILURE_ATTR)
        if kind is not None and frozen.state == TrialState.COMPLETE:
            out.state = TrialState.PRUNED if kind == "invalid" else TrialState.FAIL
            out.values = None
        return out

    def sampler_trial(self, frozen, worst: list[float] | None):
        """A stored FrozenTrial as the sampler should see it (params as indices); a recorded failure becomes
        COMPLETE with `worst` (when known) so the sampler learns from it, as in a live study."""
        import optuna
        from optuna.trial import TrialState

        if any(n not in self.params or v not in self.params[n] for n, v in frozen.params.items()):
            return None  # a value the space no longer has: the sampler cannot represent it
        state, values = frozen.state, frozen.values
        failed = FAILURE_ATTR in frozen.user_attrs and state in (TrialState.FAIL, TrialState.PRUNED)
        if failed and frozen.user_attrs[FAILURE_ATTR] != "interrupted" and worst is not None:
            state, values = TrialState.COMPLETE, list(worst)
        if state == TrialState.RUNNING or state == TrialState.WAITING:
            return None
        return optuna.trial.create_trial(
            state=state,
            values=values if state == TrialState.COMPLETE else None,
            params=self.encode(frozen.params),
            distributions=dict(self.sampler_dists)
            if not frozen.params
            else {n: self.sampler_dists[n] for n in frozen.params},
            user_attrs=dict(frozen.user_attrs),
            system_attrs=dict(frozen.system_attrs),
        )


def tells_failures_as_worst(sampler: str, inside_valid_set: bool, kind: str) -> bool:
    """Whether a failure of kind `kind` is told to the sampler `sampler` as COMPLETE with the worst values so far
    (infeasible, see `worst_values`), or left out of what it models (told FAIL: Optuna's samplers skip it).

    TPE inside the valid set leaves a failed evaluation (compile, launch, wrong result, timeout) out. It needs no
    failure to keep away from a config: `ValidSetSampler` never proposes an explored one again. And TPE counts
    every infeasible trial among its bad configs, so a region that holds the optimum next to many failures (a
    resource limit: shared-memory staging whose large tiles fail to compile) looks bad and is left for good; on
    such a space (benchmarks/data/kt/stencil_like, 22% of its configs failing) TPE fell below uniform random
    sampling of the valid set at every budget. A constraint violation (``invalid``) is still told: it says where
    the valid set ends, which no later proposal should cross."""
    return kind == "invalid" or not (sampler == "tpe" and inside_valid_set)


def worst_values(values: list[list[float]], directions: Sequence[str]) -> list[float] | None:
    """Per objective, the worst value among `values` (the measured trials so far); None when there are none."""
    if not values:
        return None
    out = []
    for i, direction in enumerate(directions):
        column = [v[i] for v in values]
        out.append(min(column) if direction == "maximize" else max(column))
    return out


# ---------------------------------------------------------------------------------------------------------------
# the valid set, cached

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
    from tuner.errors import InputError
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


# ---------------------------------------------------------------------------------------------------------------
# the sampler


#: TPE's uniform start-up draws before it models (see make_sampler)
TPE_STARTUP = 5


#: TPE's candidates per proposal (Optuna's n_ei_candidates) with several configs in flight (see make_sampler) ...
TPE_CANDIDATES_IN_FLIGHT = 128


#: ... until this many configs are evaluated; then 24 again (the driver's `_narrow_sampler`): wide any longer left
#: a few seeds of the imported stencil-like cache stuck in a poor basin, below uniform random from 200 configs on
TPE_WIDE_UNTIL = 15


#: draws a model-based sampler makes before its model proposes anything (Optuna's GP and NSGA-II defaults: 10
#: start-up trials, a first generation of 50); the default's start-up covers the space and is a search itself
STARTUP_DRAWS = {"tpe": TPE_STARTUP, "gp": 10, "nsga2": 50}


def check_budget(name: str, trials: int) -> None:
    """InputError when `trials` is smaller than the start-up draws of the sampler `name`: its model would never
    propose a config, and the study would be a random search under another name."""
    startup = STARTUP_DRAWS.get(name)
    if startup is not None and trials < startup:
        raise InputError(
            f"--sampler {name} draws its first {startup} configs at random, more than --trials {trials}: its model "
            "would never run (raise --trials, or use the default sampler or --sampler random)"
        )


def make_sampler(name: str, seed: int | None, n_objectives: int, in_flight: int = 1) -> BaseSampler:
    """The Optuna sampler `name` (one of SAMPLERS) for a study that keeps `in_flight` configs outstanding;
    InputError for an unknown one or a missing extra."""
    import optuna

    # Optuna 5 samplers read each trial's constraints (trial.set_constraint) themselves.
    if name == "tpe":
        # 5 start-up draws (Optuna's default is 10): drawn inside the valid set, TPE learns from evaluated configs
        # only, and on the GEMM recording it then reaches 0.98 of the optimum sooner. Configs in flight are told to
        # TPE as bad ones (constant_liar, Optuna 5's default), which costs it early on; more candidates per
        # proposal win that back, so with several in flight it scores `TPE_CANDIDATES_IN_FLIGHT` of them until
        # `TPE_WIDE_UNTIL` configs are evaluated: the gain is early, and their sampler time would starve the GPU
        # later. The figures: docs/search.md and benchmarks/results/search/grid-inflight-candidates-2026-12-01.md.
        candidates = 24 if in_flight <= 1 else TPE_CANDIDATES_IN_FLIGHT
        return optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            group=True,
            n_startup_trials=TPE_STARTUP,
            n_ei_candidates=candidates,
            constant_liar=True,
        )
    if name == "forest":
        from tuner.study.forest import ForestSampler

        fallback = make_sampler("tpe", seed, n_objectives, in_flight)
        return ForestSampler(fallback, seed, n_objectives)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        try:
            return optuna.samplers.GPSampler(seed=seed)
        except ImportError as exc:
            raise InputError(f"--sampler gp needs {exc.name} (pip install torch scipy)") from None
    if name == "cmaes":
        if n_objectives > 1:
            raise InputError("--sampler cmaes handles one objective only; set one objective in the space")
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise InputError("--sampler cmaes needs the cmaes package (pip install cmaes)") from None
        return optuna.samplers.CmaEsSampler(seed=seed)
    raise InputError(f"--sampler {name}: unknown (choose from {', '.join(SAMPLERS)})")


# ---------------------------------------------------------------------------------------------------------------
# failures


def evaluation_failed(trial) -> bool:
    """A recorded trial whose evaluation failed (compile, launch, wrong result, timeout, or an invalid answer of
    the evaluator), as opposed to an interrupted one."""
    kind = trial.user_attrs.get(TrialAttr.FAILURE)
    return trial.state.name in ("FAIL", "PRUNED") and kind is not None and kind != INTERRUPTED
