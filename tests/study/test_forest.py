"""The default search (`tuner.study.forest`) on CPUs, and the sampler choices refused before anything runs.

Studies run the real driver in process over an imported Kernel Tuner cache (benchmarks/data/kt/pnpoly_like:
4 knobs, 4,092 configs, every config near the optimum with one value of its 3-valued ``use_method``)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest

from tuner.cli.main import main as cli_main
from tuner.space import space as space_mod
from tuner.space.space import params_key
from tuner.store import kt
from tuner.study import forest
from tuner.study.driver import Driver
from tuner.study.options import StudyOptions
from tuner.study.replay import load_records
from tuner.study.search import STARTUP_DRAWS, make_sampler

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "benchmarks" / "data" / "kt" / "pnpoly_like.json.gz"
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"


@pytest.fixture(scope="module")
def space_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("forest") / "pnpoly.yaml"
    kt.write_space(kt.read_cache(CACHE), str(CACHE), out)
    return out


def _study(space_file: Path, trials: int, seed: int = 0, **kw):
    opts = StudyOptions(
        kernel="kt",
        space=str(space_file),
        trials=trials,
        storage=":memory:",
        seed=seed,
        replay=str(CACHE),
        in_process=True,
        progress=False,
        **kw,
    )
    driver = Driver(opts)
    summary = driver.run()
    study = optuna.load_study(study_name=summary["study"], storage=driver.opening.storage)
    return summary, sorted(study.trials, key=lambda t: t.number)


def test_the_default_sampler_is_the_forest():
    assert StudyOptions(kernel="transpose", space="transpose", trials=1).sampler == "forest"
    assert isinstance(make_sampler("forest", 0, 1), forest.ForestSampler)


def test_forest_proposes_only_unexplored_valid_configs_and_starts_at_the_middle(space_file):
    space = space_mod.load(str(space_file))
    summary, trials = _study(space_file, 60)
    keys = [params_key(t.params) for t in trials]
    assert len(keys) == len(set(keys)) == 60 and not summary["screened_this_run"]
    assert all(space.validate(t.params) is None for t in trials)
    # The imported space's default is the middle of each knob's values, not the smallest of each.
    middle = {n: sorted(v)[(len(v) - 1) // 2] if len(v) > 2 else v for n, v in space.params.items()}
    first = trials[0].params
    assert first == space.default
    assert all(first[n] != min(v) for n, v in space.params.items() if len(v) > 2), (first, middle)


def test_forest_start_covers_every_value_of_the_small_knobs(space_file):
    space = space_mod.load(str(space_file))
    _, trials = _study(space_file, forest.FOREST_STARTUP, seed=3)
    for name, values in space.params.items():
        if len(values) <= forest.FOREST_STARTUP // 2:
            seen = Counter(t.params[name] for t in trials)
            assert set(seen) == set(values), (name, seen)


def test_forest_is_reproducible_and_beats_its_own_start(space_file):
    a = [t.params for t in _study(space_file, 40, seed=5)[1]]
    b = [t.params for t in _study(space_file, 40, seed=5)[1]]
    assert a == b
    _, trials = _study(space_file, 60, seed=5)
    times = [t.values[0] for t in trials if t.state.name == "COMPLETE"]
    start = min(times[: forest.FOREST_STARTUP])
    assert min(times) < start


def test_forest_with_several_configs_in_flight_proposes_each_config_once(space_file):
    summary, trials = _study(space_file, 48, seed=1, replay_in_flight=8)
    keys = [params_key(t.params) for t in trials if "screened" not in t.user_attrs]
    assert len(keys) == len(set(keys)) == summary["trials"] == 48


def test_forest_in_flight_searches_around_the_best_while_the_start_is_out(space_file):
    """With 8 in flight, once the start's draws are all proposed and their results not yet back, each proposal
    is one knob away from an earlier config (a neighbourhood move from the best result), not another draw."""
    _, trials = _study(space_file, 24, seed=2, replay_in_flight=8)
    names = list(trials[0].params)
    # Proposals 8 and 9 are made with 1 and 2 results back (8 + 2 < 10: still the start); from 10 on, 3 or more.
    for t in trials[forest.FOREST_STARTUP : forest.FOREST_STARTUP + 7]:
        distances = [sum(t.params[n] != e.params[n] for n in names) for e in trials[: t.number]]
        assert min(distances) == 1, (t.number, t.params)


@pytest.mark.parametrize("in_flight", [1, 8])
def test_forest_leaves_a_best_whose_one_knob_neighbours_are_all_slower(in_flight):
    """GEMV M=64 (benchmarks/data/grid/gemv_m64.db.gz, 696 configs): seed 1 reaches a config at 0.935 of the
    optimum whose one-knob neighbours are all slower, two knobs (`k_warps`, `rows_per_warp`) from the optimum.
    One knob at a time it stays there to 100 configs, one at a time and with 8 in flight; the two-knob steps
    from a stuck best (`ForestSampler._two_knob_step`) reach the optimum first."""
    recording = ROOT / "benchmarks" / "data" / "grid" / "gemv_m64.db.gz"
    opts = StudyOptions(
        kernel="gemv",
        space=str(ROOT / "benchmarks" / "spaces" / "grid_gemv_m64.yaml"),
        trials=100,
        storage=":memory:",
        seed=1,
        replay=str(recording),
        in_process=True,
        replay_in_flight=in_flight,
        replay_recorded_only=True,
        progress=False,
        objectives="first",
        ordered=True,
    )
    driver = Driver(opts)
    summary = driver.run()
    study = optuna.load_study(study_name=summary["study"], storage=driver.opening.storage)
    best = min(float(t.user_attrs["median_ms"]) for t in study.trials if t.state.name == "COMPLETE")
    optimum = min(float(a["median_ms"]) for state, a in load_records(str(recording)).values() if state == "COMPLETE")
    assert best == optimum, optimum / best


def test_forest_imports_the_trees_in_the_background_once_attached(space_file):
    sampler = make_sampler("forest", 0, 1)
    assert sampler._trees_imported is None  # nothing started before the valid set is attached
    thread = forest._import_trees_in_background()
    assert thread.daemon
    thread.join(timeout=60)
    assert not thread.is_alive()
    import sys

    assert "sklearn.tree" in sys.modules


def test_forest_with_several_objectives_is_tpe(tmp_path):
    sampler = make_sampler("forest", 0, 3)
    assert isinstance(sampler.fallback, optuna.samplers.TPESampler)
    opts = StudyOptions(
        kernel="transpose",
        space="transpose",
        trials=12,
        storage=":memory:",
        seed=0,
        replay=str(RECORDING),
        in_process=True,
        progress=False,
        objectives="all",
    )
    summary = Driver(opts).run()
    assert summary["trials"] == 12


def test_forest_proposal_time_is_small(space_file):
    """Per proposal well under a measurement's time on 4,092 configs (the CI machine is slow: a loose bound)."""
    started = time.perf_counter()
    summary, _ = _study(space_file, 40)
    assert summary["sampler_ms_per_proposal"] < 200, summary["sampler_ms_per_proposal"]
    assert time.perf_counter() - started < 60


# -- refused before anything runs --------------------------------------------------------------------------------


def _refused(argv: list[str], fragment: str, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    rc = cli_main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert fragment in err[0], err[0]
    assert not list(tmp_path.iterdir()), "nothing may be written"


def test_an_unknown_sampler_is_one_line(tmp_path, monkeypatch, capsys):
    argv = ["study", "transpose", "--replay", str(RECORDING), "--trials", "20", "--sampler", "anneal"]
    _refused(argv, "anneal", tmp_path, monkeypatch, capsys)


def test_a_single_objective_sampler_with_several_objectives_is_one_line(tmp_path, monkeypatch, capsys):
    argv = ["study", "transpose", "--replay", str(RECORDING), "--trials", "20", "--sampler", "cmaes"]
    _refused([*argv, "--objectives", "all"], "handles one objective only", tmp_path, monkeypatch, capsys)


@pytest.mark.parametrize("sampler", sorted(STARTUP_DRAWS))
def test_a_budget_below_the_start_up_draws_is_one_line(sampler, tmp_path, monkeypatch, capsys):
    trials = str(STARTUP_DRAWS[sampler] - 1)
    argv = ["study", "transpose", "--replay", str(RECORDING), "--trials", trials, "--sampler", sampler]
    _refused(argv, f"first {STARTUP_DRAWS[sampler]} configs at random", tmp_path, monkeypatch, capsys)


def test_the_default_takes_any_budget(space_file):
    summary, _ = _study(space_file, 2)
    assert summary["trials"] == 2


def test_every_sampler_is_documented():
    """docs/search.md gives each sampler one line on when to use it."""
    from tuner.space.limits import SAMPLERS

    text = (ROOT / "docs" / "search.md").read_text()
    for name in SAMPLERS:
        assert f"`{name}`" in text, name
    assert json.dumps(sorted(SAMPLERS))  # the names are plain strings
