"""A sampler that models from another problem's trials besides the study's own: transfer between shapes.

A study of one problem of a space (``--problems all``, ``--warm-start``) may know the trials of a study of the same
space at a neighbouring problem (`tuner.study.shapes.prior_trials`). `PriorSampler` shows its base sampler (TPE)
those trials beside the study's own, so its model of where the good configs lie starts from the neighbour's whole
history — the good configs and the poor ones — instead of from nothing or from five configs.

The neighbour's values are another problem's: a GEMV at M = 64 moves as many bytes per second as one at M = 32
only roughly. They are put on this problem's scale by the configs measured at both (the first configs a study of
several problems measures are the neighbour's best, so the scale is known after a few results): each objective's
prior values are multiplied by the median ratio, this problem's value over the neighbour's, of those configs.

The prior is shown only once the neighbour's configs are known to hold up here: from the first config measured at
both on, and only while the first objective (a throughput) of those configs keeps at least `AGREE` of its value
there. A neighbour whose best configs fall short here wants other configs than this problem (GEMV at M = 8 wants
the tensor-core engines that M = 4 does without); a model built on its history keeps the search in its region,
and on the H200 it did (M = 16 reached 0.44 of its best known in 30 trials:
benchmarks/results/shapes-2026-12-04-prior-ungated.json). Until then, and without agreement, the base sampler
sees the study alone, as it would without a prior.

The prior trials are numbered below the study's own (-n … -1): they are the oldest, so TPE's default weights give
them less weight as the study's own trials accumulate (Optuna weighs the oldest of more than 25 trials down), and
they never collide with a trial number of the study. They live only in the view the base sampler is given
(`_PriorView`): never in the study, its storage or its record.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from tuner.space.space import params_key

__all__ = ["AGREE", "PriorSampler"]

#: the least share of the neighbour's throughput its configs must keep here (the median over those measured at both)
#: for the sampler to model from the neighbour's trials
AGREE = 0.9


class PriorSampler:
    """Wraps a sampler (`base`) so that it models from `prior` — (params, values) of another problem's measured
    trials, params as the study's sampler sees them (`tuner.study.search.Codec.encode`) — besides the study's own
    trials. `decode` turns a trial's sampler params back into a config (to find the configs measured at both);
    `failed(trial)` says whether one of the study's own COMPLETE trials is a failure told with the worst values
    (never a scale point). Implements the public methods of `optuna.samplers.BaseSampler`."""

    def __init__(self, base, prior: Sequence[tuple[dict[str, Any], list[float]]], distributions, decode, failed):
        import optuna
        from optuna.trial import TrialState

        self.base, self._decode, self._failed = base, decode, failed
        self._values = [list(map(float, values)) for _, values in prior]
        self._keys = {params_key(decode(params)): i for i, (params, _) in enumerate(prior)}
        self._trials = []
        for number, (params, values) in enumerate(prior, start=-len(prior)):
            trial = optuna.trial.create_trial(
                state=TrialState.COMPLETE,
                values=values,
                params=params,
                distributions={n: distributions[n] for n in params},
            )
            trial.number = number
            self._trials.append(trial)
        self._scaled: tuple[tuple[float, ...], list[Any]] | None = None  # (scale, the prior on it)
        #: the proposals modelled from the prior (`sample_relative` calls that were shown it)
        self.shown = 0

    def __str__(self) -> str:
        return f"PriorSampler({self.base}, {len(self._trials)} prior trials)"

    # -- the scale ----------------------------------------------------------------------------------------------
    def scale(self, study) -> tuple[float, ...] | None:
        """Per objective, the median ratio of this study's value to the prior's over the configs measured at both
        (1 for an objective without a positive pair); None while no config is measured at both."""
        from optuna.trial import TrialState

        ratios: list[list[float]] = [[] for _ in self._values[0]] if self._values else []
        pairs = 0
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            i = self._keys.get(params_key(self._decode(trial.params)))
            if i is None or self._failed(trial):
                continue
            pairs += 1
            for k, (own, there) in enumerate(zip(trial.values, self._values[i], strict=True)):
                if own > 0 and there > 0:
                    ratios[k].append(own / there)
        return tuple(statistics.median(r) if r else 1.0 for r in ratios) if pairs else None

    def _prior(self, study) -> list[Any]:
        """The prior trials on this study's scale (kept while the scale holds); none while no config is measured
        at both, or while the first objective keeps less than `AGREE` of its value."""
        import copy

        scale = self.scale(study)
        if scale is None or scale[0] < AGREE:
            return []
        if self._scaled is None or self._scaled[0] != scale:
            trials = []
            for trial, values in zip(self._trials, self._values, strict=True):
                scaled = copy.copy(trial)
                scaled.values = [v * s for v, s in zip(values, scale, strict=True)]
                trials.append(scaled)
            self._scaled = (scale, trials)
        return self._scaled[1]

    def _view(self, study):
        """The study as the base sees it: with the prior (a `_PriorView`) where it is shown, else the study."""
        prior = self._prior(study)
        return _PriorView(study, prior) if prior else study

    # -- BaseSampler --------------------------------------------------------------------------------------------
    def infer_relative_search_space(self, study, trial) -> dict[str, Any]:
        return self.base.infer_relative_search_space(self._view(study), trial)

    def sample_relative(self, study, trial, search_space) -> dict[str, Any]:
        view = self._view(study)
        self.shown += view is not study
        return self.base.sample_relative(view, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.base.sample_independent(self._view(study), trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()


class _PriorView:
    """The study as the base sampler sees it: the study itself (its storage, directions, the trial being asked),
    with the prior trials before its own wherever trials are listed."""

    def __init__(self, study, prior: list[Any]):
        self._study, self._prior = study, prior

    def __getattr__(self, name: str):
        return getattr(self._study, name)

    # Optuna's samplers list a study's trials with this private method (TPESampler, the group search space).
    def _get_trials(self, deepcopy: bool = True, states=None, use_cache: bool = False) -> list[Any]:
        own = self._study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache)  # noqa: SLF001
        return [t for t in self._prior if states is None or t.state in states] + own

    def get_trials(self, deepcopy: bool = True, states=None) -> list[Any]:
        return self._get_trials(deepcopy=deepcopy, states=states)

    @property
    def trials(self) -> list[Any]:
        return self.get_trials()
