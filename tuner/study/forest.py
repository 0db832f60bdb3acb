"""The default search: randomized trees over the whole enumerated valid set, as an Optuna sampler.

Once the driver hands it the valid set (`ValidSetSampler.attach`; scikit-learn's trees are then imported in a
background thread, `_import_trees_in_background`), each proposal is one unexplored valid config:

- the first `FOREST_STARTUP` (the space's default measured first among them) cover every value of every knob: of
  `COVER_CANDIDATES` uniform draws, the one whose values were tried least so far. A knob whose good value is rare
  (Kernel Tuner's pnpoly: every config near the optimum has ``use_method=0``) is seen several times before
  anything is modelled. With several configs in flight the start waits for `FOREST_STARTUP` results, not
  proposals: once that many are proposed, each proposal until their results are back is a neighbourhood move
  from the best result so far (below) rather than one more coverage draw;
- then, in turn: the trees' pick (`_best_expected`: extremely randomized trees learn log time, or -log
  throughput, from every evaluated config, a failure as the worst value so far, and rate every unexplored valid
  config, or beyond `ALL_CANDIDATES` a sample plus the best configs' near neighbours), and a neighbourhood move
  (`_neighbour`: one knob changed from a good config, what makes Kernel Tuner's pso and genetic algorithm strong
  late); one proposal in `EXPLORE_EVERY` is a coverage draw again, so a region the trees rate low early is still
  visited now and then. Once the best is stuck (no better result for `STALL_RESULTS` results after the start,
  or every one-knob neighbour of it explored), a move from the best changes two knobs by one step each
  (`_two_knob_step`): a best whose one-knob neighbours are all slower is left for the basin beside it, as in
  iterated local search.

Without a complete valid set (a space too large to list), with several objectives, or before the set is listed,
every call goes to TPE (`fallback`), the default before this one. The figures behind each choice: docs/search.md
and benchmarks/results/search/.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from optuna.samplers import BaseSampler

if TYPE_CHECKING:
    import numpy as np

#: proposals (the space's default included) drawn for coverage before the trees model
FOREST_STARTUP = 10
#: uniform draws scored for coverage per such proposal
COVER_CANDIDATES = 64
#: one proposal in this many after the start-up is a coverage draw
EXPLORE_EVERY = 16
#: how many spreads below its mean a config is rated (a lower confidence bound)
OPTIMISM = 1.0
#: trees in the forest
TREES = 16
#: up to this many unexplored configs are all scored; beyond it a sample of this size plus the best's neighbours
ALL_CANDIDATES = 4000
#: best configs whose one- and two-knob neighbours are always candidates
NEIGHBOUR_SOURCES = 10
#: results after the start without a better best, after which the moves from the best change two knobs, not one
STALL_RESULTS = 5


class ForestSampler(BaseSampler):
    """See the module docstring."""

    def __init__(self, fallback, seed: int | None, n_objectives: int):
        import numpy as np

        self.fallback, self.seed, self.n_objectives = fallback, seed, n_objectives
        self.rng = np.random.default_rng(seed)
        self._index: Any = None
        self._explored: Any = None
        self._codec: Any = None
        self._features: np.ndarray | None = None
        #: per knob, its column of rank in `_features`
        self._rank_column: list[int] = []
        self._row_cache: dict[int, int | None] = {}
        self._proposals = 0
        self._neighbour_turns = 0
        self._model_picks = 0
        #: row → neighbour moves made from it
        self._moves_from: dict[int, int] = {}
        #: row → the mean the trees predicted for it when it was proposed (what a config in flight is told as)
        self._expected: dict[int, float] = {}
        #: the background import of scikit-learn's trees, started by `attach`
        self._trees_imported: threading.Thread | None = None

    def __str__(self) -> str:
        return "ForestSampler"

    def attach(self, repair, explored, codec) -> None:
        """Propose inside `repair.index` (a complete valid set) from now on; `explored()` gives the keys of the
        configs measured, failed or in flight."""
        if not repair.complete or not len(repair.index) or self.n_objectives > 1:
            return
        import numpy as np

        self._index, self._explored, self._codec = repair.index, explored, codec
        self._trees_imported = _import_trees_in_background()
        # Knob values as features: a numeric knob's rank among its sorted values, another's declared position.
        columns: list[np.ndarray] = []
        self._rank_column = []
        for j, values in enumerate(repair.index.values):
            rank = np.arange(len(values))
            if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                rank = np.argsort(np.argsort(np.asarray(values, dtype=float), kind="stable"), kind="stable")
            self._rank_column.append(len(columns))
            columns.append(rank[repair.index.rows[:, j]])
            if (twos := _powers_of_two(values)) is not None:
                columns.append(twos[repair.index.rows[:, j]])
        self._features = np.stack(columns, axis=1).astype(np.float32)

    @property
    def modelling(self) -> bool:
        return self._index is not None

    # -- BaseSampler --------------------------------------------------------------------------------------------
    def infer_relative_search_space(self, study, trial) -> dict[str, Any]:
        if not self.modelling:
            return self.fallback.infer_relative_search_space(study, trial)
        return dict(self._codec.sampler_dists)

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        if not self.modelling:
            return self.fallback.sample_relative(study, trial, search_space)
        row = self._propose(study)
        if row is None:
            return {}
        return self._codec.encode(self._index.config(row))

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self.fallback.before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self.fallback.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        import numpy as np

        self.rng = np.random.default_rng()
        self.fallback.reseed_rng()

    # -- proposals ----------------------------------------------------------------------------------------------
    def _row(self, trial) -> int | None:
        from tuner.space.space import params_key

        if trial.number not in self._row_cache:
            if not trial.params:  # the trial being asked for: nothing sampled yet
                return None
            try:
                key = params_key(self._codec.decode(trial.params))
            except (KeyError, IndexError, TypeError):
                key = ""
            self._row_cache[trial.number] = self._index.row_of(key) if key else None
        return self._row_cache[trial.number]

    def _propose(self, study) -> int | None:
        import numpy as np
        from optuna.trial import TrialState

        free = np.ones(len(self._index), dtype=bool)
        for key in self._explored():
            if (r := self._index.row_of(key)) is not None:
                free[r] = False
        if not free.any():
            return None
        rows, ys, pending = [], [], []
        sign = -1.0 if study.direction.name == "MAXIMIZE" else 1.0
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)):
            if (r := self._row(t)) is None:
                continue
            if t.state == TrialState.RUNNING:
                pending.append(r)
            elif t.values:
                rows.append(r)
                ys.append(float(t.values[0]))
        y = np.asarray(ys)
        y = sign * (np.log(y) if len(y) and (y > 0).all() else y)
        if len(rows) < FOREST_STARTUP:  # configs in flight tell the trees nothing yet: the start waits for results
            if rows and len(rows) + len(pending) >= FOREST_STARTUP:
                # The start's draws are all proposed, their results not all back (several in flight): search
                # around the best result so far meanwhile rather than draw more.
                self._neighbour_turns = 0  # so this move starts from the best so far
                if (move := self._neighbour(free, np.asarray(rows), y)) is not None:
                    return move
            return self._cover(free, rows + pending)
        self._proposals += 1
        if self._proposals % EXPLORE_EVERY == 0:
            return self._cover(free, rows + pending)
        if self._proposals % 2:
            move = self._neighbour(free, np.asarray(rows), y)
            if move is not None:
                return move
        return self._best_expected(free, np.asarray(rows), y, pending)

    def _neighbour(self, free: np.ndarray, rows: np.ndarray, y: np.ndarray) -> int | None:
        """An unexplored config one knob away from a good one, on the knob least varied from it yet, the nearest
        value first: a coordinate search, which the trees alone miss where a knob's best value is good only beside
        the others' (a convolution without shared memory wants tall tiles). Every other such move starts from
        the best config of some value of some knob instead of the best so far (the one from which fewest moves
        were made, better first): a value whose first configs were poor still gets searched around. A move from
        the best once it is stuck (`STALL_RESULTS` results after both it and the start, none better, or no
        unexplored one-knob neighbour left) is `_two_knob_step` instead (one knob if no such step is left). `y`
        is in the order of the trials, so the best's position says how many results came after it."""
        import numpy as np

        index_rows = self._index.rows
        order = np.argsort(y, kind="stable")
        self._neighbour_turns += 1
        # Results since the best that count as a stall: the start's own draws do not (they search nothing).
        stalled = len(y) - max(int(order[0]) + 1, FOREST_STARTUP) >= STALL_RESULTS
        if self._neighbour_turns % 2 == 0:
            best_of_value: dict[int, float] = {}
            for j in range(index_rows.shape[1]):
                values = index_rows[rows, j]
                for v in np.unique(values):
                    at = order[np.flatnonzero(values[order] == v)[0]]
                    best_of_value.setdefault(int(rows[at]), float(y[at]))
            best_of_value.pop(int(rows[order[0]]), None)
            sources = sorted(best_of_value, key=lambda r: (self._moves_from.get(r, 0), best_of_value[r]))
        else:
            sources = rows[order[:NEIGHBOUR_SOURCES]].tolist()
        for source in sources:
            differ = index_rows != index_rows[source]
            one = differ.sum(axis=1) == 1
            options = np.flatnonzero(one & free)
            from_best = source == sources[0] and self._neighbour_turns % 2 == 1  # odd turns start at the best
            if from_best and (stalled or not len(options)):
                if (move := self._two_knob_step(source, free, differ)) is not None:
                    self._moves_from[source] = self._moves_from.get(source, 0) + 1
                    return move
            if not len(options):
                continue
            knob_of = np.argmax(differ[options], axis=1)
            tried = np.bincount(np.argmax(differ[np.flatnonzero(one & ~free)], axis=1), minlength=differ.shape[1])
            rank_of = np.asarray(self._rank_column)[knob_of]
            features = self._features
            assert features is not None
            steps = np.abs(features[options, rank_of] - features[source, rank_of])
            pick = np.lexsort((self.rng.random(len(options)), steps, tried[knob_of]))[0]
            self._moves_from[source] = self._moves_from.get(source, 0) + 1
            return int(options[pick])
        return None

    def _two_knob_step(self, source: int, free: np.ndarray, differ: np.ndarray) -> int | None:
        """An unexplored config two knobs from `source`, each moved to a neighbouring value (rank one apart), on the
        pair of knobs least often changed together from it yet, at random among equals; None if there is none.
        Where two knobs act together (GEMV's `k_warps` and `rows_per_warp` set the rows a block covers), the
        best's one-knob neighbours can all be slower than it while a config two steps away is faster: the trees,
        fitted mostly around the best, rate such a pair low (their pick among two-knob neighbours left more seeds
        stuck than this draw), so the pairs are taken in turn rather than by the trees."""
        import numpy as np

        features = self._features
        assert features is not None
        columns = np.asarray(self._rank_column)
        two = np.flatnonzero(differ.sum(axis=1) == 2)
        two = two[(np.abs(features[np.ix_(two, columns)] - features[source, columns]) <= 1).all(axis=1)]
        is_free = free[two]
        if not is_free.any():
            return None
        knobs = differ.shape[1]
        # each such config's pair of changed knobs as one number: first changed knob × knobs + last changed knob
        changed = differ[two]
        pair = np.argmax(changed, axis=1) * knobs + (knobs - 1 - np.argmax(changed[:, ::-1], axis=1))
        tried = np.bincount(pair[~is_free], minlength=knobs * knobs)
        options = two[is_free]
        pick = np.lexsort((self.rng.random(len(options)), tried[pair[is_free]]))[0]
        return int(options[pick])

    def _cover(self, free: np.ndarray, seen: list[int]) -> int:
        """Of `COVER_CANDIDATES` uniform draws among the free rows, the one whose knob values were tried least."""
        import numpy as np

        choices = np.flatnonzero(free)
        draws = choices[self.rng.integers(len(choices), size=min(COVER_CANDIDATES, len(choices)))]
        rows = self._index.rows
        score = np.zeros(len(draws))
        for j in range(rows.shape[1]):
            counts = np.bincount(rows[seen, j], minlength=len(self._index.values[j])) if seen else None
            if counts is not None:
                score += 1.0 / (1.0 + counts[rows[draws, j]])
        return int(draws[int(np.argmax(score))]) if seen else int(draws[0])

    def _candidates(self, free: np.ndarray, rows: np.ndarray, y: np.ndarray) -> np.ndarray:
        import numpy as np

        choices = np.flatnonzero(free)
        if len(choices) <= ALL_CANDIDATES:
            return choices
        sample = choices[self.rng.choice(len(choices), size=ALL_CANDIDATES, replace=False)]
        index_rows = self._index.rows
        near = []
        for r in rows[np.argsort(y)[:NEIGHBOUR_SOURCES]]:
            differ = (index_rows != index_rows[r]).sum(axis=1)
            near.append(np.flatnonzero((differ <= 2) & free))
        return np.unique(np.concatenate([sample, *near]))

    def _best_expected(self, free: np.ndarray, rows: np.ndarray, y: np.ndarray, pending: list[int]) -> int:
        """The free row the trees fitted to (rows, y) rate best: the lowest lower confidence bound, or, on every
        other pick while configs are in flight and twice the start-up's results are in, the lowest value of one
        tree drawn at random (Thompson sampling, so proposals made before their neighbours' results are back
        spread out). A config in flight is fitted at the mean predicted for it when it was proposed."""
        import numpy as np

        if self._trees_imported is not None:  # started at `attach`, usually done by now
            self._trees_imported.join()
        from sklearn.tree import ExtraTreeRegressor

        features = self._features
        assert features is not None
        believed = [r for r in pending if r in self._expected]
        x_fit = np.ascontiguousarray(features[np.concatenate([rows, believed]).astype(np.intp)])
        y_fit = np.concatenate([y, [self._expected[r] for r in believed]])
        # Each tree fitted alone without input checks: the forest class costs ~2 ms a tree in overhead.
        trees = [
            ExtraTreeRegressor(max_features=None, random_state=int(s)).fit(x_fit, y_fit, check_input=False)
            for s in self.rng.integers(2**31, size=TREES)
        ]
        candidates = self._candidates(free, rows, y)
        x = np.ascontiguousarray(features[candidates])
        per_tree = np.stack([tree.tree_.value[tree.tree_.apply(x), 0, 0] for tree in trees])
        mean, spread = per_tree.mean(axis=0), per_tree.std(axis=0)
        self._model_picks += 1
        # One tree's draw is mostly noise while the trees know few results: the bound is the better guess then.
        if pending and self._model_picks % 2 and len(rows) >= 2 * FOREST_STARTUP:
            pick = int(np.argmin(per_tree[int(self.rng.integers(len(per_tree)))]))
        else:
            pick = int(np.argmin(mean - OPTIMISM * spread))
        self._expected[int(candidates[pick])] = float(mean[pick])
        return int(candidates[pick])


def _import_sklearn_tree() -> None:
    try:
        import sklearn.tree  # noqa: F401
    except ImportError:  # reported where the trees are first fitted
        pass


def _import_trees_in_background() -> threading.Thread:
    """Import scikit-learn's trees in a daemon thread and return it (join it before the first fit).

    The import takes seconds (~2.4 s on a 2-core machine) and the first fit comes only after `FOREST_STARTUP`
    results, so it runs while the start's configs are measured instead of stalling the first fitted proposal.
    A study that ends first exits without waiting for it (a daemon thread)."""
    thread = threading.Thread(target=_import_sklearn_tree, name="import-sklearn-tree", daemon=True)
    thread.start()
    return thread


def _powers_of_two(values) -> np.ndarray | None:
    """Per value of an integer knob, the largest power of two dividing it (as its exponent): how a size aligns to
    warps, wavefronts and memory transactions, which its rank alone does not show (48 sits between 32 and 64).
    None for a knob of other values, or where every value is a power of two (the rank says it all)."""
    import numpy as np

    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        return None
    exponents = np.array([(v & -v).bit_length() - 1 for v in values])
    if all(v & (v - 1) == 0 for v in values):
        return None
    return exponents
