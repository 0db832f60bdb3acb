"""Levers of the default search tried on one recording: the study driver in process over a replay, one patch each.

Same harness as benchmarks/search.py (`search.one_run`'s options; the recorded subset searched), with one lever
changed per variant in each worker: TPE's settings, the driver's options, or a patch of the repair or of how
failures are told. Prints mean/10th percentile of the fraction of the optimum at 25, 50, 100, 200, 400 evaluated
configs (those within the trials) against uniform random sampling of the valid set (exact), and writes JSON.

    python benchmarks/experiments/search_levers_kt.py benchmarks/data/kt/stencil_like.json.gz
        default,worst-failures 20 1 200 o.json

Arguments: a recording (as search.py takes it), variants (keys of VARIANTS), seeds, configs in flight, trials,
output JSON path. Two worker processes.
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/search.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import search as S  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "uniform-repair": {"opts": {"repair": False}},  # an unmeasurable proposal → a uniform draw, not the nearest
    "startup20": {"tpe": {"n_startup_trials": 20}},
    "candidates24": {"tpe": {"n_ei_candidates": 24}},  # Optuna's 24 candidates with several in flight too
    "candidates48": {"tpe": {"n_ei_candidates": 48}},
    "wide50": {"patch": "wide", "until": 50},  # 128 candidates in flight for the first 50 configs, not 100
    "wide25": {"patch": "wide", "until": 25},
    "wide15": {"patch": "wide", "until": 15},
    "independent": {"tpe": {"multivariate": False, "group": False}},
    "categorical": {"opts": {"ordered": False}},
    "nowrap": {"opts": {"inside_valid_set": False}},  # the driver screens and repairs every proposal
    "dup-uniform": {"patch": "dup"},  # a repeat → a uniform draw; a constraint break → the nearest
    "mix25": {"patch": "mix", "eps": 0.25},  # a quarter of the proposals drawn uniformly
    "mix50": {"patch": "mix", "eps": 0.5},
    "fail-skip": {"patch": "failskip"},  # every failure told FAIL (TPE skips it)
    "worst-failures": {"patch": "worst"},  # every failure told as the worst value, infeasible (before 2026-12-03)
}


def _apply_patch(variant: dict[str, Any]) -> None:
    from optuna.trial import TrialState

    from tuner.space.space import params_key
    from tuner.study import driver, opening, repair, validset

    kind = variant.get("patch")
    if kind == "dup":
        nearest = repair.Repair.nearest

        def dup_uniform(self, params, exclude):
            if params and params_key(params) in exclude:
                return self.draw(exclude)
            return nearest(self, params, exclude)

        repair.Repair.nearest = dup_uniform  # type: ignore[method-assign]
    elif kind == "failskip":

        def tell_failure(self, fast, trial, kind):
            return self._tell_sampler(fast, trial, state=TrialState.FAIL)

        driver.Driver._tell_failure = tell_failure  # type: ignore[method-assign]
    elif kind == "wide":
        driver.TPE_WIDE_UNTIL = variant["until"]  # type: ignore[misc]
    elif kind == "worst":
        driver.tells_failures_as_worst = opening.tells_failures_as_worst = lambda *args: True
    elif kind == "mix":
        import numpy as np

        sample_relative, eps = validset.ValidSetSampler.sample_relative, variant["eps"]

        def mixed(self, study, trial, search_space):
            if self.attached:
                if not hasattr(self, "_mix_rng"):
                    self._mix_rng = np.random.default_rng(12345 + self.base._rng.rng.randint(1 << 30))
                if self._mix_rng.random() < eps:
                    self._base_space.pop(trial.number, None)
                    chosen = self._repair.draw(set(self._explored()))
                    if chosen is not None:
                        return self.codec.encode(chosen)
            return sample_relative(self, study, trial, search_space)

        validset.ValidSetSampler.sample_relative = mixed  # type: ignore[method-assign]


def job(args: tuple[Any, ...]) -> tuple[str, int, list[tuple[str, float | None]]]:
    variant_name, recording, space, kernel, seed, in_flight, trials = args
    import optuna

    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    from tuner.study import driver, opening, search
    from tuner.study.options import StudyOptions

    variant = VARIANTS[variant_name]
    _apply_patch(variant)
    make_sampler = search.make_sampler

    def make(name, s, n, in_flight=1):
        if name == "tpe" and variant.get("tpe"):
            kw = dict(
                seed=s,
                multivariate=True,
                group=True,
                n_startup_trials=search.TPE_STARTUP,
                n_ei_candidates=24 if in_flight <= 1 else search.TPE_CANDIDATES_IN_FLIGHT,
                constant_liar=True,
            )
            return optuna.samplers.TPESampler(**{**kw, **variant["tpe"]})
        return make_sampler(name, s, n, in_flight)

    opening.make_sampler = driver.make_sampler = make  # type: ignore[assignment]
    opts = dict(
        kernel=kernel,
        space=space,
        trials=trials,
        storage=":memory:",
        sampler="tpe",
        seed=seed,
        replay=recording,
        in_process=True,
        replay_in_flight=in_flight,
        replay_recorded_only=True,
        progress=False,
    )
    opts.update(variant.get("opts", {}))
    d = driver.Driver(StudyOptions(**opts))  # type: ignore[arg-type]
    summary = d.run()
    study = optuna.load_study(study_name=summary["study"], storage=d.opening.storage)
    sequence: list[tuple[str, float | None]] = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if "screened" in t.user_attrs:
            sequence.append((t.user_attrs["screened"], None))
        elif t.state.name == "COMPLETE":
            sequence.append(("measured", float(t.user_attrs["median_ms"])))
        else:
            sequence.append(("failed", None))
    return variant_name, seed, sequence


def main() -> int:
    item, variants, seeds, in_flight, trials, out = sys.argv[1:7]
    name, recording, space = S.resolve(item, Path(tempfile.mkdtemp()))
    truth = S.ground_truth(recording, space)
    budgets = [b for b in (25, 50, 100, 200, 400) if b <= int(trials)]
    uniform = {b: round(S.uniform_expectation(truth["times"], b), 4) for b in budgets}
    jobs = [
        (v, recording, space, truth["kernel"], s, int(in_flight), int(trials))
        for v in variants.split(",")
        for s in range(int(seeds))
    ]
    with ProcessPoolExecutor(2) as ex:
        runs = list(ex.map(job, jobs))
    report: dict[str, Any] = {"space": name, "k": int(in_flight), "seeds": int(seeds), "uniform": uniform}
    report["variants"] = {}
    print(name, "k =", in_flight, "uniform", uniform)
    for v in variants.split(","):
        curves = [S.curves(seq, truth["t_opt_ms"])[0] for vv, _, seq in runs if vv == v]
        mean = {b: round(sum(S.at(c, b) for c in curves) / len(curves), 4) for b in budgets}
        p10 = {b: round(S.percentile([S.at(c, b) for c in curves], 10), 3) for b in budgets}
        report["variants"][v] = {"mean": mean, "p10": p10}
        print(f"{v:16s}", " ".join(f"{mean[b]:.3f}/{p10[b]:.2f}" for b in budgets))
    Path(out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
