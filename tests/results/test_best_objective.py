"""The best config is the best for the study's first objective and its direction: a study replayed from a
Kernel Tuner cache, whose only objective is time, is ranked by its time (shortest first), a throughput study by
its throughput (highest first), in `tuner best`, `studies`, `pareto`, `trials`, `explain --worst` and the
driver's finalists. A figure a study does not have (a Kernel Tuner cache's bytes, registers, SMEM) is never
printed as 0."""

from __future__ import annotations

import json
import random
from pathlib import Path

import optuna
import pytest

from tuner.cli.main import main as cli_main
from tuner.results import export
from tuner.space.objective import Goal, figure, goal_of
from tuner.study.driver import Driver
from tuner.study.options import StudyOptions

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"
STUDY = "transpose-n16384_float32-NVIDIA_H200"


def write_kt_cache(path: Path, seed: int = 0) -> dict:
    """A Kernel Tuner 1.5 cache (``"objective": ["time"]``) of 4×4×3 configs with times from 10 to 44 ms, the
    fastest first in neither key nor insertion order, and some compile, runtime and invalid failures."""
    rng = random.Random(seed)
    keys = ["block_size_x", "tile", "unroll"]
    tune_params = {"block_size_x": [32, 64, 128, 256], "tile": [1, 2, 4, 8], "unroll": [0, 1, 2]}
    cache = {}
    for b in tune_params["block_size_x"]:
        for t in tune_params["tile"]:
            for u in tune_params["unroll"]:
                time_ms: float | str = round(rng.uniform(10.5, 44.0), 3)
                draw = rng.random()
                if draw < 0.08:
                    time_ms = "CompilationFailedConfig"
                elif draw < 0.12:
                    time_ms = "RuntimeFailedConfig"
                elif b == 256 and t == 8:
                    time_ms = "InvalidConfig"
                cache[f"{b},{t},{u}"] = {
                    "block_size_x": b,
                    "tile": t,
                    "unroll": u,
                    "time": time_ms,
                    "times": [time_ms] * 3 if isinstance(time_ms, float) else [],
                    "compile_time": 1.0,
                    "verification_time": 0,
                    "benchmark_time": 2.0,
                }
    cache["64,2,1"]["time"] = 10.13  # the fastest
    cache["64,2,1"]["times"] = [10.1, 10.13, 10.2]
    data = {
        "device_name": "NVIDIA H200",
        "kernel_name": "vadd",
        "problem_size": [1 << 24],
        "tune_params_keys": keys,
        "tune_params": tune_params,
        "objective": ["time"],
        "cache": cache,
    }
    path.write_text(json.dumps(data))
    return data


@pytest.fixture(scope="module")
def kt_study(tmp_path_factory):
    """A study replayed over every config of a generated Kernel Tuner cache: (db path, cache data)."""
    tmp = tmp_path_factory.mktemp("kt")
    cache = tmp / "vadd.json"
    data = write_kt_cache(cache)
    space = tmp / "vadd.yaml"
    assert cli_main(["import-kt", str(cache), "-o", str(space)]) == 0
    db = tmp / "kt.db"
    opts = StudyOptions(
        kernel="kt",
        space=str(space),
        trials=100,
        storage=f"sqlite:///{db}",
        seed=0,
        replay=str(cache),
        in_process=True,
        progress=False,
    )
    Driver(opts).run()
    return db, data


def _times(data: dict) -> list[float]:
    return [e["time"] for e in data["cache"].values() if isinstance(e["time"], float)]


def test_best_of_a_time_only_study_is_its_shortest_time(kt_study, capsys):
    db, data = kt_study
    assert min(_times(data)) == 10.13 and max(_times(data)) > 40
    assert cli_main(["best", str(db), "--json"]) == 0
    best = json.loads(capsys.readouterr().out)
    assert best["value"] == best["median_ms"] == 10.13
    assert best["objective"] == "time_ms" and best["direction"] == "minimize" and best["unit"] == "ms"
    assert best["params"] == {"block_size_x": 64, "tile": 2, "unroll": 1}
    # figures a Kernel Tuner cache does not have are None, not 0
    for key in ("throughput", "tbps", "fraction_of_ceiling", "registers", "smem_bytes", "occupancy"):
        assert best[key] is None, key
    assert cli_main(["best", str(db)]) == 0
    out = capsys.readouterr().out
    assert "10.13 ms" in out and "minimized" in out
    assert "0.000" not in out and " 0 registers" not in out and "tuner render" not in out


def test_studies_pareto_and_trials_rank_a_time_only_study_by_time(kt_study, capsys, tmp_path):
    db, data = kt_study
    assert cli_main(["studies", "--storage", str(db), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["best"] == 10.13 and row["unit"] == "ms" and row["direction"] == "minimize"
    assert cli_main(["studies", "--storage", str(db)]) == 0
    assert "10.13 ms" in capsys.readouterr().out
    assert cli_main(["pareto", str(db), "--out", str(tmp_path / "front.json")]) == 0
    out = capsys.readouterr().out
    assert "time (ms)" in out and "10.13" in out and "0.000" not in out
    front = json.loads((tmp_path / "front.json").read_text())
    assert front["trials"][0]["objective"] == 10.13 and front["trials"][0]["throughput"] is None
    study = export.open_study(str(db))
    ordered = [export.objective_value(study, t) for t in export.pareto_trials(study)]
    assert ordered == sorted(ordered)
    assert cli_main(["trials", str(db), "--out", str(tmp_path / "trials.csv")]) == 0
    printed = capsys.readouterr().out
    assert "best: trial" in printed and "time 10.13 ms (minimized)" in printed
    import pandas as pd

    frame = pd.read_csv(tmp_path / "trials.csv")
    done = frame[frame["state"] == "COMPLETE"]
    assert done["tbps"].isna().all() and done["registers"].isna().all() and done["median_ms"].min() == 10.13
    # a header needs launches a replay-only kernel does not have: one line, exit 2
    assert cli_main(["export", str(db), "--header", str(tmp_path / "vadd.h")]) == 2
    err = capsys.readouterr().err
    assert "no template" in err and len(err.strip().splitlines()) == 1


def test_the_dashboard_line_names_the_best_for_the_objective(kt_study):
    from tuner.results import dashboard, studies

    db, _ = kt_study
    (row,) = studies.list_studies(str(db))
    assert dashboard.best_line(row) == "best 10.13 ms (time_ms minimized); "
    assert dashboard.best_line(None) == ""


def test_explain_worst_of_a_time_only_study_is_its_longest_time(kt_study):
    from tuner.insight.explain import _pick

    db, data = kt_study
    study = export.open_study(str(db))
    measured = export.measured_trials(study)
    (worst,) = _pick(study, measured, [], best=False, worst=True, compare_pair=None)
    (best,) = _pick(study, measured, [], best=True, worst=False, compare_pair=None)
    by_number = {t.number: t for t in measured}
    assert by_number[worst].user_attrs["median_ms"] == max(_times(data))
    assert by_number[best].user_attrs["median_ms"] == min(_times(data))


def test_best_of_a_throughput_study_is_its_highest_throughput(tmp_path, capsys):
    copy = tmp_path / "t.db"
    copy.write_bytes(RECORDING.read_bytes())
    study = export.open_study(str(copy))
    assert export.goal(study) == Goal("throughput", "maximize", "TB/s")
    top = max(export.measured_trials(study), key=lambda t: t.user_attrs["tbps"])
    assert cli_main(["best", str(copy), "--json"]) == 0
    best = json.loads(capsys.readouterr().out)
    assert best["number"] == top.number  # its re-timed figure, where the study re-timed it, is reported
    assert best.get("screening_value", best["value"]) == pytest.approx(top.user_attrs["tbps"])
    assert best["direction"] == "maximize" and best["unit"] == "TB/s"
    assert cli_main(["studies", "--storage", str(copy), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["best"] == pytest.approx(best["value"]) and row["unit"] == "TB/s"


def test_a_space_that_minimizes_time_picks_the_shortest_time(tmp_path):
    """A study whose first objective is time_ms (minimize) over a family with a throughput: the best is the
    shortest time, and the driver's finalists are ordered by it."""
    space = tmp_path / "transpose_time.yaml"
    text = (ROOT / "search_spaces" / "transpose.yaml").read_text()
    head, _, _ = text.partition("objectives:")
    space.write_text(head + "objectives:\n  - time_ms: minimize\n")
    url = f"sqlite:///{tmp_path / 'time.db'}"
    opts = StudyOptions(
        kernel="transpose",
        space=str(space),
        trials=30,
        storage=url,
        seed=0,
        replay=str(RECORDING),
        in_process=True,
        progress=False,
    )
    summary = Driver(opts).run()
    study = export.open_study(url)
    assert study.metric_names == ["time_ms"]
    measured = export.measured_trials(study)
    shortest = min(measured, key=lambda t: t.user_attrs["median_ms"])
    assert export.best_trial(study).number == shortest.number
    finalists = study.user_attrs.get("finalists") or []
    times = [f["median_ms"] for f in finalists if "median_ms" in f]
    assert times == sorted(times)
    assert summary["best"]["median_ms"] == min([shortest.user_attrs["median_ms"], *times])


def test_goals_rank_and_missing_figures():
    time_goal = goal_of([("time_ms", "minimize")], "TB/s")
    assert time_goal.key == "median_ms" and time_goal.unit == "ms" and time_goal.better(1.0, 2.0)
    tput = goal_of(None, "TB/s")
    assert tput.key == "tbps" and tput.better(2.0, 1.0) and not tput.better(None, 1.0)
    # a family without a throughput (replay-only) is ranked by its time
    assert goal_of([("throughput", "maximize")], "ms").key == "median_ms"
    assert goal_of([("throughput", "maximize")], "ms").minimize
    assert figure({"tbps": 0.0}, "tbps") is None and figure({"registers": 0, "smem_bytes": 0}, "smem_bytes") is None
    assert figure({"registers": 32, "smem_bytes": 0}, "smem_bytes") == 0.0
    assert optuna.__version__  # the studies above are Optuna's own
