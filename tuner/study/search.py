"""The sampler factory: the Optuna sampler of a name (`make_sampler`), its start-up draws and the budget check.

The study driver (`tuner.study.driver`) makes its sampler here. What the sampler sees of a space is in
`tuner.study.codec`, what it is told about failures in `tuner.study.failures`, and the valid set it proposes inside
(cached on disk, listed in the background) in `tuner.study.validset`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.core.errors import InputError
from tuner.space.limits import SAMPLERS

if TYPE_CHECKING:
    from optuna.samplers import BaseSampler


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
