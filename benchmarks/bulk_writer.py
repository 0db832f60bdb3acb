"""Milliseconds per trial written into a fresh SQLite study: Optuna's `create_new_trial` per trial against
`tuner.trialwriter.TrialWriter` in batches, for real trials (those of tests/data/transpose_h200.db, ~27 user
attrs each), with the SQL statements each path issues. CPU only.

    PYTHONPATH=$PWD python benchmarks/bulk_writer.py [--trials 100] [--repeats 3]

Writes JSON to $OUT/bulk_writer.json when OUT is set; prints a table."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import optuna
from sqlalchemy import event

from tuner.study import open_storage
from tuner.trialwriter import TrialWriter

RECORDING = Path(__file__).resolve().parent.parent / "tests" / "data" / "transpose_h200.db"


def fresh(folder: str, name: str, directions):
    storage = open_storage(f"sqlite:///{folder}/{name}.db")
    study = optuna.create_study(storage=storage, study_name="s", directions=directions)
    statements = [0]
    event.listen(storage.engine, "before_cursor_execute", lambda *a: statements.__setitem__(0, statements[0] + 1))
    return storage, storage.get_study_id_from_name(study.study_name), statements


def run(trials, directions, batch: int | None) -> dict[str, float]:
    """One pass into a fresh database: batch None = create_new_trial per trial, else TrialWriter in batches."""
    with tempfile.TemporaryDirectory() as folder:
        storage, study_id, statements = fresh(folder, "w", directions)
        writer = TrialWriter(storage)
        assert writer.bulk
        started = time.perf_counter()
        if batch is None:
            for t in trials:
                storage.create_new_trial(study_id, template_trial=t)
        else:
            for i in range(0, len(trials), batch):
                writer.write(study_id, trials[i : i + batch])
        seconds = time.perf_counter() - started
        storage.engine.dispose()
    return {"ms_per_trial": 1000 * seconds / len(trials), "statements_per_trial": statements[0] / len(trials)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///file:{RECORDING}?mode=ro&uri=true"
    source = optuna.load_study(study_name=None, storage=url)
    trials = source.get_trials()[: args.trials]
    attrs = statistics.mean(len(t.user_attrs) for t in trials)
    rows = []
    for label, batch in [("create_new_trial", None), ("bulk, 1 a call", 1), ("bulk, 10 a call", 10), ("bulk, all", 0)]:
        size = None if batch is None else batch or len(trials)
        runs = [run(trials, source.directions, size) for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r["ms_per_trial"])
        rows.append({"path": label, **{k: round(v, 2) for k, v in best.items()}})
    out = {"trials": len(trials), "user_attrs_per_trial": round(attrs, 1), "repeats": args.repeats, "rows": rows}
    print(f"{len(trials)} trials of {RECORDING.name}, {attrs:.1f} user attrs each; best of {args.repeats}")
    print(f"{'path':<18} {'ms/trial':>9} {'statements/trial':>17}")
    for row in rows:
        print(f"{row['path']:<18} {row['ms_per_trial']:>9.2f} {row['statements_per_trial']:>17.1f}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bulk_writer.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
