"""The study driver on CPUs: real Ray (logical GPUs), real Optuna, real SQLite, answers replayed from a study
recorded on an H200 (tests/data/transpose_h200.db, see tests/data/README.md)."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest

from tuner.space.space import params_key
from tuner.study.replay import ReplayEvaluator

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"
SPACE = ROOT / "search_spaces" / "transpose.yaml"


def tuner(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def load(url: str) -> optuna.Study:
    summaries = optuna.get_all_study_summaries(url)
    assert len(summaries) == 1
    return optuna.load_study(study_name=summaries[0].study_name, storage=url)


def test_recording_is_a_real_h200_grid_over_the_transpose_space():
    replay = ReplayEvaluator(RECORDING)
    from tuner.space import space as space_mod

    space = space_mod.load(SPACE)
    assert replay.covers(space.enumerate()) == space.count_valid()
    gpus = {attrs.get("gpu") for state, attrs in replay.records.values() if state == "COMPLETE"}
    assert gpus == {"NVIDIA H200"}


@pytest.mark.parametrize("engine", ["local", "ray"])
def test_replay_study_over_two_logical_gpus(tmp_path, engine):
    url = f"sqlite:///{tmp_path}/t.db"
    # The transpose space narrowed to two paddings and the row order (78 valid configs of its 468): the study runs
    # until every one is evaluated, a sixth of the trials the whole space would take.
    narrowed = tmp_path / "transpose.yaml"
    narrowed.write_text(
        SPACE.read_text().replace("pad: [0, 1, 2, 4]", "pad: [1, 2]").replace("order: [row, col, diag]", "order: [row]")
    )
    proc = tuner(
        "study",
        "transpose",
        "--space",
        str(narrowed),
        "--trials",
        "100",
        "--replay",
        str(RECORDING),
        "--gpus",
        "2",
        "--storage",
        url,
        "--seed",
        "1",
        "--json",
        "--engine",
        engine,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    study = load(url)
    # Only evaluated configs count towards --trials, so 100 asked for on a space of 78 valid configs ends
    # when every one is evaluated; proposals are drawn inside the valid set, so none is screened (answered
    # without evaluation: tests/study/test_search.py pins that path).
    evaluated = [t for t in study.trials if "screened" not in t.user_attrs]
    assert summary["trials"] == 78 == len(evaluated) == len(study.trials)
    assert not summary["screened_this_run"]
    assert summary["startup"]["engine"] == engine
    # Nothing ran on a GPU here: the workers' busy share is reported, no GPU time nor stages the recording holds.
    assert summary["workers_busy_fraction"] is not None
    assert summary["gpu_busy_fraction"] is None and summary["gpu_s"] is None and summary["phases_s"] is None
    states = Counter(t.state.name for t in study.trials)
    assert states["RUNNING"] == 0 and states["COMPLETE"] > 0
    assert {g["gpu_index"] for g in summary["gpus"]} == {0, 1}
    # Each answered trial names the worker that answered it; both workers answered.
    workers = {
        (t.user_attrs["worker"]["node"], t.user_attrs["worker_gpu_index"])
        for t in study.trials
        if "worker" in t.user_attrs
    }
    assert len(workers) == 2
    assert study.metric_names == ["throughput"]  # the default search; --objectives all searches all three

    # Constraint violations are PRUNED with an Optuna constraint, before any work.
    for t in study.trials:
        if t.state.name == "PRUNED":
            assert t.constraints == {"space": 1.0} and t.user_attrs["failure"] == "invalid"
    # Duplicates are answered from the first trial of that config and never measured again.
    measured = [
        params_key(t.params) for t in study.trials if t.state.name == "COMPLETE" and "duplicate_of" not in t.user_attrs
    ]
    assert len(measured) == len(set(measured))
    # Every measured figure is the recorded one.
    replay = ReplayEvaluator(RECORDING)
    for t in study.trials:
        if t.state.name == "COMPLETE":
            state, attrs = replay.records[params_key(t.params)]
            assert t.user_attrs["tbps"] == attrs["tbps"] and t.user_attrs["median_ms"] == attrs["median_ms"]
    assert summary["best"]["tbps"] == max(t.user_attrs["tbps"] for t in study.trials if t.state.name == "COMPLETE")


def test_grid_sampler_evaluates_every_valid_config_once(tmp_path):
    url = f"sqlite:///{tmp_path}/g.db"
    proc = tuner(
        "study",
        "transpose",
        "--trials",
        "100000",
        "--sampler",
        "grid",
        "--replay",
        str(RECORDING),
        "--storage",
        url,
        "--json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = load(url)
    from tuner.space import space as space_mod

    valid = {params_key(c) for c in space_mod.load(SPACE).enumerate()}
    assert [params_key(t.params) for t in study.trials if True].__len__() == len(valid)
    assert {params_key(t.params) for t in study.trials} == valid


def test_interrupted_grid_resumes_to_exactly_the_valid_set(tmp_path):
    """A grid cut by a kill leaves RUNNING rows; resumed, each valid config is evaluated exactly once more and the
    study ends (the interrupted configs were once queued twice, never counted, and random proposals ran on)."""
    import sqlite3

    from tuner.space import space as space_mod

    # The row order and two paddings alone (78 of the 468 valid configs): what is checked (each valid config once
    # more, the study ends) does not depend on the grid's size.
    narrow = tmp_path / "transpose.yaml"
    narrow.write_text(
        SPACE.read_text().replace("order: [row, col, diag]", "order: [row]").replace("pad: [0, 1, 2, 4]", "pad: [1, 2]")
    )
    url = f"sqlite:///{tmp_path}/g.db"
    first = ["study", "transpose", "--space", str(narrow), "--sampler", "grid", "--replay", str(RECORDING)]
    first += ["--storage", url, "--json"]
    assert tuner(*first, "--trials", "40", "--in-process").returncode == 0
    conn = sqlite3.connect(tmp_path / "g.db")  # as a kill -9 leaves it: the last trials still RUNNING
    conn.execute("UPDATE trials SET state = 'RUNNING' WHERE number >= 30")
    conn.commit()
    conn.close()
    proc = tuner(*first, "--trials", "100000", "--in-process")
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = load(url)
    valid = {params_key(c) for c in space_mod.load(narrow).enumerate()}
    assert len(valid) == 78
    counted = [t for t in study.trials if t.user_attrs.get("failure") != "interrupted"]
    assert sorted(params_key(t.params) for t in counted) == sorted(valid)
    assert len(study.trials) == len(valid) + 10


def test_kill_9_and_resume(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    args = [
        sys.executable,
        "-m",
        "tuner",
        "study",
        "transpose",
        "--trials",
        "60",
        "--replay",
        str(RECORDING),
        "--storage",
        url,
        "--seed",
        "3",
        "--json",
        "--replay-delay",
        "0.3",
    ]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    db = tmp_path / "k.db"
    deadline = time.time() + 300
    seen = 0
    while time.time() < deadline and seen < 8:
        time.sleep(1.0)
        if db.exists():
            try:
                study = load(url)
                seen = sum(1 for t in study.trials if t.state.name == "COMPLETE")
            except Exception:
                seen = 0
    assert seen >= 8, "the study did not get going"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started, as a crash would
    proc.wait()
    before = load(url)
    kept = {t.number: t for t in before.trials if t.state.name == "COMPLETE"}
    assert kept

    again = subprocess.run(args[:-2], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    after = load(url)
    for number, t in kept.items():
        assert after.trials[number].state.name == "COMPLETE" and after.trials[number].values == t.values
    interrupted = [t for t in after.trials if t.user_attrs.get("failure") == "interrupted"]
    assert all(t.state.name == "FAIL" for t in interrupted)
    counted = [
        t for t in after.trials if t.user_attrs.get("failure") != "interrupted" and "screened" not in t.user_attrs
    ]
    assert len(counted) == 60 and not [t for t in after.trials if t.state.name == "RUNNING"]
    measured = [
        params_key(t.params) for t in after.trials if t.state.name == "COMPLETE" and "duplicate_of" not in t.user_attrs
    ]
    assert len(measured) == len(set(measured)), "a config was benchmarked twice"
    interrupted_keys = {params_key(t.params) for t in interrupted}
    finished_keys = {params_key(t.params) for t in counted}
    assert interrupted_keys <= finished_keys, "interrupted configs are re-enqueued and finished"


def test_changed_space_is_refused_under_the_same_study_name(tmp_path):
    url = f"sqlite:///{tmp_path}/c.db"
    assert (
        tuner("study", "transpose", "--trials", "5", "--replay", str(RECORDING), "--storage", url, "--json").returncode
        == 0
    )
    changed = tmp_path / "transpose.yaml"
    changed.write_text(SPACE.read_text() + "\n# a comment changes the content hash\n")
    before = len(load(url).trials)  # 5 evaluated configs, and any proposals answered without evaluation
    proc = tuner(
        "study",
        "transpose",
        "--space",
        str(changed),
        "--trials",
        "10",
        "--replay",
        str(RECORDING),
        "--storage",
        url,
        "--study-name",
        load(url).study_name,
    )
    assert proc.returncode == 2 and "different space file" in proc.stderr
    assert len(load(url).trials) == before


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("study", "fft", "--trials", "5"), "unknown kernel 'fft'"),
        (("study", "gemm", "--space", "search_spaces/transpose.yaml", "--trials", "5"), "not 'gemm'"),
        (("study", "transpose", "--trials", "0"), "--trials"),
        (("study", "transpose", "--space", "nope.yaml", "--trials", "5"), "no such space file"),
        (("study", "transpose", "--trials", "5", "--storage", "notadb://x"), "cannot open"),
        (("study", "transpose", "--trials", "5", "--replay", "tests/data/absent.db"), "replay file not found"),
        (("study", "transpose", "--trials", "5", "--replay", "pyproject.toml"), "cannot read as a study database"),
    ],
)
def test_bad_study_input_is_one_line_exit_2(args, fragment):
    proc = tuner(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_gpus_beyond_what_ray_sees_and_unreachable_cluster(tmp_path):
    url = f"sqlite:///{tmp_path}/x.db"
    proc = tuner("study", "transpose", "--trials", "5", "--storage", url)  # no GPU here, no replay
    assert proc.returncode == 2 and "the local engine runs on this machine's GPUs" in proc.stderr, proc.stderr
    proc = tuner("study", "transpose", "--trials", "5", "--storage", url, "--ray-address", "127.0.0.1:1")
    assert proc.returncode == 2 and "--ray-address 127.0.0.1:1" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_gpu_actor_killed_mid_trial_is_replaced(tmp_path):
    """Kill the worker process under a running trial: the trial fails with the reason, a fresh worker takes the
    next config."""
    import ray

    from tuner.space import space as space_mod
    from tuner.study.cluster import Pool

    space = space_mod.load(SPACE)
    configs = list(space.enumerate())[:3]
    pool = Pool(
        space, space.problem(), functools.partial(ReplayEvaluator, RECORDING, None, 3.0), gpus=1, logical_gpus=1
    )
    try:
        victim = pool.gpus[0]["pid"]
        pool.submit(0, configs[0])
        pool.poll(0.5)
        os.kill(victim, signal.SIGKILL)
        results = []
        deadline = time.time() + 60
        while not results and time.time() < deadline:
            results = pool.poll(0.5)
        assert results[0][0] == 0 and results[0][1].kind == "launch_failed" and "died" in results[0][1].reason
        assert pool.gpus[0]["pid"] != victim and pool.replaced == 1
        pool.submit(1, configs[1])
        results = []
        while not results and time.time() < deadline + 30:
            results = pool.poll(0.5)
        assert results[0][0] == 1 and results[0][1].ok
    finally:
        pool.close()
        ray.shutdown()


def test_hung_worker_times_out_and_is_replaced(tmp_path):
    import ray

    from tuner.space import space as space_mod
    from tuner.study.cluster import Pool

    space = space_mod.load(SPACE)
    pool = Pool(
        space,
        space.problem(),
        functools.partial(ReplayEvaluator, RECORDING, None, 30.0),
        gpus=1,
        timeout_s=2.0,
        logical_gpus=1,
    )
    try:
        pool.submit(0, next(space.enumerate()))
        started = time.time()
        results = []
        while not results and time.time() - started < 60:
            results = pool.poll(0.2)
        assert results[0][1].kind == "timed_out" and time.time() - started < 20
        assert pool.replaced == 1
    finally:
        pool.close()
        ray.shutdown()


def test_a_new_study_database_is_created_by_the_writer_not_the_driver(tmp_path):
    """The driver of a new study never opens its database (no SQLAlchemy in its process): the writer process
    creates it, with the study's attributes, takes the lease for the driver and releases it at the end."""
    env = {**os.environ, "TUNER_CACHE_DIR": str(tmp_path / "cache")}

    def run(db: Path) -> list[str]:
        code = (
            "import sys, tuner.api as api\n"
            f"r = api.study({str(SPACE)!r}, 12, replay={str(RECORDING)!r}, storage='sqlite:///{db}', seed=0)\n"
            "print(r.summary['trials'], 'sqlalchemy' in sys.modules)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.split()

    # The first run reads the replay recording through SQLAlchemy and caches it as JSON; the second, on another
    # new database, needs SQLAlchemy for nothing in the driver's process.
    assert run(tmp_path / "first.db")[0] == "12"
    db = tmp_path / "new.db"
    assert run(db) == ["12", "False"]
    (study,) = optuna.get_all_study_summaries(f"sqlite:///{db}")
    loaded = optuna.load_study(study_name=study.study_name, storage=f"sqlite:///{db}")
    assert len(loaded.trials) == 12 and loaded.user_attrs["kernel"] == "transpose"
    assert loaded.metric_names == ["throughput"]
    import sqlite3

    with sqlite3.connect(db) as conn:
        assert conn.execute("select count(*) from tuner_leases").fetchone() == (0,)


@pytest.mark.parametrize(
    "url",
    ["sqlite:///rel/a.db", "sqlite:////abs/b.db", "sqlite:///c%20d.db", "sqlite:///file:e.db?mode=ro&uri=true"],
)
def test_the_fast_storage_path_reads_urls_as_sqlalchemy_does(url):
    from sqlalchemy.engine import make_url

    from tuner.store.artifacts import artifact_dir_for
    from tuner.store.dbfiles import plain_sqlite_file, sqlite_path

    fast = plain_sqlite_file(url)
    assert fast is None or fast == Path(make_url(url).database)
    assert sqlite_path(url) is not None and artifact_dir_for(url) is not None


def test_replayed_rows_name_the_recording_they_come_from(tmp_path):
    """A replay's trials hold the recorded figures, but their GPU says they were replayed, and from which
    recording: a trials table of a replay never passes for a measurement of this run."""
    import csv

    import tuner
    from tuner.cli.main import main

    url = f"sqlite:///{tmp_path}/r.db"
    result = tuner.study(SPACE, trials=6, replay=RECORDING, storage=url, seed=2, in_process=True)
    assert result.summary["study"].endswith("replay_transpose_h200.db")
    assert main(["trials", str(tmp_path / "r.db"), "--out", str(tmp_path / "t.csv")]) == 0
    rows = list(csv.DictReader((tmp_path / "t.csv").open()))
    measured = [r for r in rows if r["state"] == "COMPLETE"]
    assert measured and {r["gpu"] for r in measured} == {"NVIDIA H200 (replay of transpose_h200.db)"}
    replay = ReplayEvaluator(RECORDING)
    for t in load(url).trials:
        if t.state.name == "COMPLETE":  # every figure but the GPU's name is the recorded one
            recorded = replay.records[params_key(t.params)][1]
            assert t.user_attrs["tbps"] == recorded["tbps"] and recorded["gpu"] == "NVIDIA H200"

    # a replay of that replay keeps naming the recording that measured the rows
    again = f"sqlite:///{tmp_path}/again.db"
    tuner.study(SPACE, trials=3, replay=tmp_path / "r.db", storage=again, seed=2, in_process=True)
    gpus = {t.user_attrs["gpu"] for t in load(again).trials if t.state.name == "COMPLETE"}
    assert gpus == {"NVIDIA H200 (replay of transpose_h200.db)"}
