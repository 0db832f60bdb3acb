"""`tuner best` on a study the driver recorded on an H200 (tests/data/transpose_h200_tpe40.db): the reported figure
is the end-of-study re-timing of the fastest finalist, not a screening figure."""

from __future__ import annotations

from pathlib import Path

import optuna

from tuner.results import export

DB = Path(__file__).resolve().parents[1] / "data" / "transpose_h200_tpe40.db"


def test_best_reports_the_retimed_fastest_finalist():
    study = export.open_study(str(DB))
    finalists = study.user_attrs["finalists"]
    assert finalists and all("tbps" in f for f in finalists)
    assert [f["tbps"] for f in finalists] == sorted((f["tbps"] for f in finalists), reverse=True)
    best = export.best_summary(study)
    assert best["number"] == finalists[0]["trial"]
    assert best["tbps"] == finalists[0]["tbps"] and best["median_ms"] == finalists[0]["median_ms"]
    assert best["timing"].startswith("re-timed") and "screening_tbps" in best
    trial = next(t for t in study.trials if t.number == best["number"])
    assert best["screening_tbps"] == trial.user_attrs["tbps"]
    assert best["gpu"] == "NVIDIA H200"


def test_without_finalists_best_is_the_fastest_screened_trial(tmp_path):
    copy = tmp_path / "copy.db"
    copy.write_bytes(DB.read_bytes())
    url = f"sqlite:///{copy}"
    name = optuna.get_all_study_summaries(url)[0].study_name
    optuna.load_study(study_name=name, storage=url).set_user_attr("finalists", [])
    study = export.open_study(str(copy))
    best = export.best_summary(study)
    fastest = max(export.measured_trials(study), key=lambda t: t.user_attrs["tbps"])
    assert best["number"] == fastest.number and best["timing"] == "screening"
