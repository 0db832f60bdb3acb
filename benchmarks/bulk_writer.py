"""Milliseconds per trial written into a fresh SQLite study: Optuna's `create_new_trial` per trial against
`tuner.store.trialwriter.TrialWriter.write` in batches, for real trials (those of tests/data/transpose_h200.db, ~27 user
attrs each), with the SQL statements each path issues; then per trial completed from RUNNING (as the study's
writer completes a trial whose result came after its hold): Optuna's per-attribute calls against
`TrialWriter.finish` in batches. CPU only.

    PYTHONPATH=$PWD python benchmarks/bulk_writer.py [--trials 100] [--finish 50] [--repeats 3]

Writes JSON to $OUT/bulk_writer.json when OUT is set; prints a table."""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState
from sqlalchemy import event

from tuner.store.dbfiles import open_storage
from tuner.store.trialwriter import TrialWriter

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


def running(trial):
    """`trial` as the study's writer first records it, when its config goes out: params and start, no results."""
    out = copy.copy(trial)
    out.state, out.values, out.datetime_complete = TrialState.RUNNING, None, None
    out.user_attrs, out.intermediate_values = {}, {}
    return out


def run_finish(trials, directions, batch: int | None) -> dict[str, float]:
    """`trials` written RUNNING into a fresh database (not timed), then completed: batch None = Optuna's
    per-attribute calls per trial (the writer's fallback), else `TrialWriter.finish` in batches."""
    with tempfile.TemporaryDirectory() as folder:
        storage, study_id, statements = fresh(folder, "f", directions)
        writer = TrialWriter(storage)
        assert writer.bulk
        ids = writer.write(study_id, [running(t) for t in trials])
        pairs = list(zip(ids, trials, strict=True))
        statements[0] = 0
        started = time.perf_counter()
        if batch is None:
            writer.bulk = False
            for pair in pairs:
                writer.finish(study_id, [pair])
        else:
            for i in range(0, len(pairs), batch):
                writer.finish(study_id, pairs[i : i + batch])
        seconds = time.perf_counter() - started
        storage.engine.dispose()
    return {"ms_per_trial": 1000 * seconds / len(trials), "statements_per_trial": statements[0] / len(trials)}


def table(title: str, rows: list[dict]) -> None:
    print(title)
    print(f"{'path':<18} {'ms/trial':>9} {'statements/trial':>17}")
    for row in rows:
        print(f"{row['path']:<18} {row['ms_per_trial']:>9.2f} {row['statements_per_trial']:>17.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--finish", type=int, default=50, help="trials completed from RUNNING")
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
    finishing = source.get_trials()[: args.finish]
    finish_rows = []
    for label, batch in [("per attribute", None), ("bulk, 1 a call", 1), ("bulk, 10 a call", 10), ("bulk, all", 0)]:
        size = None if batch is None else batch or len(finishing)
        runs = [run_finish(finishing, source.directions, size) for _ in range(args.repeats)]
        best = min(runs, key=lambda r: r["ms_per_trial"])
        finish_rows.append({"path": label, **{k: round(v, 2) for k, v in best.items()}})
    out = {
        "trials": len(trials),
        "user_attrs_per_trial": round(attrs, 1),
        "repeats": args.repeats,
        "rows": rows,
        "finished_trials": len(finishing),
        "finish_rows": finish_rows,
    }
    table(f"{len(trials)} trials of {RECORDING.name}, {attrs:.1f} user attrs each; best of {args.repeats}", rows)
    table(f"\n{len(finishing)} of them written RUNNING, then completed; best of {args.repeats}", finish_rows)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bulk_writer.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
