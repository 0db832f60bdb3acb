"""`tuner.study.prior.PriorSampler`: TPE modelling from another problem's trials, with real Optuna studies."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import IntDistribution

from tuner.study.prior import PriorSampler

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

DISTS = {"x": IntDistribution(0, 31)}


def _tpe(seed: int = 0):
    return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=5, constant_liar=True)


def _prior(best: int = 7, n: int = 32) -> list[tuple[dict, list[float]]]:
    """A neighbour's whole history over x = 0..31: the closer to `best`, the faster (TB/s)."""
    return [({"x": x}, [4.0 - 0.1 * abs(x - best)]) for x in range(n)]


def _study(sampler):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="maximize", sampler=sampler)


def _sampler(prior, seed: int = 0) -> PriorSampler:
    return PriorSampler(_tpe(seed), prior, DISTS, dict, failed=lambda t: "failure" in t.user_attrs)


def test_the_first_proposals_are_modelled_from_the_prior_not_drawn_at_random():
    near = []
    for seed in range(4):
        study = _study(_sampler(_prior(best=7), seed))
        for _ in range(6):  # TPE's 5 start-up draws would be uniform over 0..31 without the prior
            trial = study.ask(DISTS)
            near.append(abs(trial.params["x"] - 7) <= 3)
            study.tell(trial, 1.0)  # a poor value, so the prior keeps leading
    # uniform draws land within ±3 of 7 with probability 7/32; the prior's model puts most of them there
    assert sum(near) >= 0.75 * len(near)


def test_without_a_prior_the_same_asks_are_uniform_draws():
    near = []
    for seed in range(4):
        study = _study(_tpe(seed))
        for _ in range(5):
            trial = study.ask(DISTS)
            near.append(abs(trial.params["x"] - 7) <= 3)
            study.tell(trial, 1.0)
    assert sum(near) < 0.75 * len(near)


def test_the_prior_is_put_on_this_problems_scale_by_the_configs_measured_at_both():
    sampler = _sampler(_prior(best=7))
    study = _study(sampler)
    assert sampler.scale(study) == (1.0,)  # nothing measured at both yet
    for x, value in ((7, 2.0), (8, 1.95), (20, 9.0)):  # x = 7 and 8 are prior configs at half their value there
        trial = study.ask(DISTS)
        study.tell(trial, None, state=optuna.trial.TrialState.FAIL)  # an ask that failed is no scale point
        study.add_trial(optuna.trial.create_trial(params={"x": x}, distributions=DISTS, value=value))
    # 9.0 at x = 20 is 9.0 / 2.7: the median of the three ratios (0.5, 0.5, 3.33) is 0.5
    assert sampler.scale(study) == pytest.approx((0.5,))
    seen = sampler._view(study).get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    prior = [t for t in seen if t.number < 0]
    assert len(prior) == 32 and max(t.values[0] for t in prior) == pytest.approx(2.0)
    # a failure told with the worst values is not a scale point
    failed = optuna.trial.create_trial(params={"x": 9}, distributions=DISTS, value=0.0, user_attrs={"failure": "x"})
    study.add_trial(failed)
    assert sampler.scale(study) == pytest.approx((0.5,))


def test_the_prior_stays_out_of_the_study_and_its_numbers():
    sampler = _sampler(_prior())
    study = _study(sampler)
    for _ in range(3):
        trial = study.ask(DISTS)
        study.tell(trial, 3.0)
    numbers = [t.number for t in study.get_trials(deepcopy=False)]
    assert numbers == [0, 1, 2]  # the study holds its own trials only
    view = sampler._view(study).get_trials(deepcopy=False)
    assert [t.number for t in view] == list(range(-32, 0)) + [0, 1, 2]  # the prior is the oldest
