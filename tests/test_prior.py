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


def _value(x: int) -> float:
    """This problem's throughput at x: the neighbour's, a little lower (it agrees with the prior)."""
    return 0.95 * (4.0 - 0.1 * abs(x - 7))


def _asks(sampler, seed_config: dict, seed_value: float, asks: int = 5, value=_value) -> list[int]:
    """The x of `asks` proposals after one config measured here (`seed_config` at `seed_value`), each told
    `value(x)`."""
    study = _study(sampler)
    study.add_trial(optuna.trial.create_trial(params=seed_config, distributions=DISTS, value=seed_value))
    xs = []
    for _ in range(asks):  # fewer than TPE's 5 start-up trials: without a prior these are uniform draws
        trial = study.ask(DISTS)
        xs.append(trial.params["x"])
        study.tell(trial, value(trial.params["x"]))
    return xs


def test_once_a_neighbours_config_holds_up_here_the_proposals_are_modelled_from_its_trials():
    near, sampler = [], None
    for seed in range(4):
        sampler = _sampler(_prior(best=7), seed)
        near += [abs(x - 7) <= 3 for x in _asks(sampler, {"x": 7}, _value(7))]
        assert sampler.shown >= 4
    # uniform draws land within ±3 of 7 with probability 7/32; the prior's model puts at least half of them there
    assert sum(near) >= 0.5 * len(near)


def test_a_neighbour_whose_configs_fall_short_here_is_not_shown():
    near = []
    for seed in range(4):
        sampler = _sampler(_prior(best=7), seed)
        # the neighbour's best keeps a quarter of its value here: another problem, its model would mislead
        near += [abs(x - 7) <= 3 for x in _asks(sampler, {"x": 7}, 1.0, asks=3, value=lambda x: _value(x) / 4)]
        assert sampler.shown == 0
    assert sum(near) < 0.5 * len(near)


def test_without_a_prior_the_same_asks_are_uniform_draws():
    near = []
    for seed in range(4):
        near += [abs(x - 7) <= 3 for x in _asks(_tpe(seed), {"x": 7}, _value(7))]
    assert sum(near) < 0.5 * len(near)


def test_the_prior_is_put_on_this_problems_scale_by_the_configs_measured_at_both():
    sampler = _sampler(_prior(best=7))
    study = _study(sampler)
    assert sampler.scale(study) is None and sampler._view(study) is study  # nothing measured at both: not shown
    for x, value in ((7, 3.8), (8, 3.705), (20, 9.0)):  # x = 7 and 8 are prior configs at 0.95 of their value
        trial = study.ask(DISTS)
        study.tell(trial, None, state=optuna.trial.TrialState.FAIL)  # an ask that failed is no scale point
        study.add_trial(optuna.trial.create_trial(params={"x": x}, distributions=DISTS, value=value))
    # 9.0 at x = 20 is 9.0 / 2.7: the median of the three ratios (0.95, 0.95, 3.33) is 0.95
    assert sampler.scale(study) == pytest.approx((0.95,))
    seen = sampler._view(study).get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    prior = [t for t in seen if t.number < 0]
    assert len(prior) == 32 and max(t.values[0] for t in prior) == pytest.approx(3.8)
    # a failure told with the worst values is not a scale point
    failed = optuna.trial.create_trial(params={"x": 9}, distributions=DISTS, value=0.0, user_attrs={"failure": "x"})
    study.add_trial(failed)
    assert sampler.scale(study) == pytest.approx((0.95,))


def test_the_prior_stays_out_of_the_study_and_its_numbers():
    sampler = _sampler(_prior())
    study = _study(sampler)
    for _ in range(3):
        trial = study.ask(DISTS)
        study.tell(trial, _value(trial.params["x"]))
    numbers = [t.number for t in study.get_trials(deepcopy=False)]
    assert numbers == [0, 1, 2]  # the study holds its own trials only
    view = sampler._view(study).get_trials(deepcopy=False)
    assert [t.number for t in view] == list(range(-32, 0)) + [0, 1, 2]  # the prior is the oldest
