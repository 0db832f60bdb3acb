"""What a study must pass before its first config (tuner/study/preflight.py), run as a user runs it: a storage that
cannot be written, a name that could not open the study again, a study that holds its trials already, a home
that cannot be written, a machine without a GPU. Each refusal is one line naming the storage (or the name) and
the fault, exit code 2, and leaves no file behind; the names `tuner studies` prints open with every command."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner.core.errors import InputError
from tuner.store import probe, schema
from tuner.study import preflight

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"
#: the name a replay of RECORDING gives its study by default (it ends in ".db", like a path)
REPLAY_NAME = "transpose-n16384_float32-replay_transpose_h200.db"
ROOT_USER = os.geteuid() == 0


def tuner(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def tuner_here(*args: str, cwd: Path, monkeypatch: pytest.MonkeyPatch) -> subprocess.CompletedProcess:
    """`tuner ARGS` run by the command line's own `main` in this process (what a subprocess would print, without
    the 1-2 s of a fresh interpreter's imports: for tests that run many read-only commands)."""
    import contextlib
    import io

    from tuner.cli import main as cli_main

    monkeypatch.chdir(cwd)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main.main(list(args))
    return subprocess.CompletedProcess(["tuner", *args], rc, out.getvalue(), err.getvalue())


def replay_study(cwd: Path, *args: str, trials: int = 3) -> subprocess.CompletedProcess:
    return tuner("study", "transpose", "--trials", str(trials), "--replay", str(RECORDING), *args, cwd=cwd)


def files_in(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def one_line_refusal(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """The single stderr line of a refused command (exit code 2, no traceback, nothing on stdout)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def copy_recording(path: Path) -> Path:
    path.write_bytes(RECORDING.read_bytes())
    return path


# ---------------------------------------------------------------------------------------------------------------
# storage that cannot be written: refused before the first config, in one line, nothing written


@pytest.mark.parametrize(
    ("storage", "fragments"),
    [
        ("sqlite:////proc/x.db", ("--storage /proc/x.db", "cannot create the database", "folder /proc")),
        ("/proc/x.db", ("--storage /proc/x.db", "cannot create the database")),
        ("sqlite:///file:{d}/ro.db?mode=ro&uri=true", ("--storage", "ro.db", "opens the database read-only")),
    ],
    ids=["proc-url", "proc-path", "read-only-url"],
)
def test_storage_that_cannot_be_written_is_refused_before_any_trial(tmp_path, storage, fragments):
    copy_recording(tmp_path / "ro.db")
    before = files_in(tmp_path)
    proc = tuner(
        "study",
        "transpose",
        "--trials",
        "20",
        "--replay",
        str(RECORDING),
        "--replay-delay",
        "0.5",
        "--storage",
        storage.format(d=tmp_path),
        cwd=tmp_path,
    )
    one_line_refusal(proc, *fragments)  # one line: the study never started (no "trials go to", no progress)
    assert files_in(tmp_path) == before, "a file was written"


def test_default_storage_in_a_read_only_working_directory_names_itself_not_a_flag(tmp_path):
    # /sys takes no new file, for root too: the default storage, studies/transpose.db, cannot be created there.
    proc = tuner("study", "transpose", "--trials", "3", "--replay", str(RECORDING), cwd=Path("/sys"))
    line = one_line_refusal(proc, "studies/transpose.db (the default storage, under /sys", "cannot be written")
    assert not line.startswith("tuner: error: --storage"), line


@pytest.mark.skipif(ROOT_USER, reason="root writes through file and folder permissions")
@pytest.mark.parametrize("what", ["file", "folder"])
def test_read_only_file_or_folder_is_called_read_only(tmp_path, what):
    folder = tmp_path / "ro"
    folder.mkdir()
    db = copy_recording(folder / "s.db")
    (db if what == "file" else folder).chmod(0o444 if what == "file" else 0o555)
    try:
        before = files_in(folder)
        proc = replay_study(tmp_path, "--storage", str(db))
        one_line_refusal(proc, str(db), "read-only" if what == "file" else "cannot be written")
        assert files_in(folder) == before
    finally:
        folder.chmod(0o755)
        db.chmod(0o644)


def test_the_api_runs_the_same_checks(tmp_path, monkeypatch):
    import tuner

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="/proc/x.db: cannot create the database"):
        tuner.study("transpose", 3, replay=RECORDING, storage="sqlite:////proc/x.db")
    with pytest.raises(InputError, match="holds a path separator"):
        tuner.study("transpose", 3, replay=RECORDING, study_name="../../etc/x")
    assert list(tmp_path.iterdir()) == []


def test_a_writable_database_passes_the_probe_unchanged(tmp_path):
    db = copy_recording(tmp_path / "s.db")
    before = files_in(tmp_path)
    assert probe.check_storage(f"sqlite:///{db}") == db
    assert files_in(tmp_path) == before  # the probe's write was rolled back, its folder's probe file removed
    with sqlite3.connect(db) as conn:
        names = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    assert "tuner_write_probe" not in names


def test_a_database_another_process_is_writing_is_writable(tmp_path, monkeypatch):
    db = copy_recording(tmp_path / "s.db")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # a writer's lock, as the study's writer holds during a commit
    opened: list[tuple[str, float]] = []
    connect = sqlite3.connect

    def counted(database, *args, **kwargs):
        opened.append((str(database), kwargs.get("timeout", 5.0)))  # 5 s: sqlite3's default busy timeout
        return connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", counted)
    try:
        assert probe.check_storage(f"sqlite:///{db}?timeout=1") == db
        # one write probe, bounded by its own busy timeout: the writer's lock is not waited out nor retried
        assert [timeout for uri, timeout in opened if "mode=rw" in uri] == [1.0]
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_server_url_is_connected_to(tmp_path):
    # No database server here: the probe of a non-file URL is what runs for one (connect, a transaction); a
    # SQLite URL whose file cannot be opened stands in for a server that refuses.
    with pytest.raises(InputError, match="--storage .*: cannot connect"):
        probe._probe_server(f"sqlite:///{tmp_path}/none/x.db", "--storage x")
    probe._probe_server(f"sqlite:///{copy_recording(tmp_path / 's.db')}", "--storage s.db")


# ---------------------------------------------------------------------------------------------------------------
# a read-only database is read-only, not "another driver"


@pytest.mark.parametrize("content", ["optuna", "empty"])
def test_lease_on_a_read_only_database_says_read_only(tmp_path, content, monkeypatch):
    from tuner.store import lease

    db = tmp_path / "ro.db"
    if content == "optuna":
        copy_recording(db)
    else:
        sqlite3.connect(db).close()  # no tables: the lease's table would have to be created
    waits: list[float] = []
    # the lease's clock, whose sleep is what a claim's retry after a busy database does
    clock = SimpleNamespace(time=time.time, localtime=time.localtime, strftime=time.strftime, sleep=waits.append)
    monkeypatch.setattr(lease, "time", clock)
    with pytest.raises(InputError) as caught:
        lease.acquire(f"sqlite:///file:{db}?mode=ro&uri=true", "ro")
    assert "read-only database" in str(caught.value) and "another driver" not in str(caught.value)
    assert waits == []  # not retried as if busy


# ---------------------------------------------------------------------------------------------------------------
# names that open what they name


def test_every_listed_name_opens_with_every_command(tmp_path, monkeypatch):
    assert replay_study(tmp_path, "--in-process").returncode == 0  # the default name, in the default storage
    # a plain path as --storage, and a name that looks like a file
    proc = replay_study(tmp_path, "--in-process", "--storage", "studies/transpose.db", "--study-name", "my run.db")
    assert proc.returncode == 0, proc.stderr
    listed = tuner("studies", "--json", cwd=tmp_path)
    rows = json.loads(listed.stdout)
    assert {r["name"] for r in rows} == {REPLAY_NAME, "my run.db"}
    for row in rows:
        storages = [[], ["--storage", "studies/transpose.db"], ["--storage", "sqlite:///studies/transpose.db"]]
        for storage in storages:
            name = row["name"]
            for command in (
                ["best", name, "--json"],
                ["pareto", name],
                ["trials", name, "--out", str(tmp_path / "t.csv")],
                ["export", name, "--header", str(tmp_path / "t.h")],
            ):
                proc = tuner_here(*command, *storage, cwd=tmp_path, monkeypatch=monkeypatch)
                assert proc.returncode == 0, (command, storage, proc.stderr)
            # explain needs Nsight Compute to profile; it must get as far as the study's trials
            monkeypatch.setenv("TUNER_NCU", str(tmp_path / "no-ncu"))
            proc = tuner_here("explain", name, *storage, cwd=tmp_path, monkeypatch=monkeypatch)
            monkeypatch.delenv("TUNER_NCU")
            assert "no such database" not in proc.stderr and "unknown study" not in proc.stderr, proc.stderr
            assert "not both" not in proc.stderr, proc.stderr


def test_dashboard_opens_a_listed_name(tmp_path, monkeypatch):
    from tuner.results import dashboard

    assert replay_study(tmp_path, "--in-process").returncode == 0
    monkeypatch.chdir(tmp_path)
    for storage in (None, "studies/transpose.db"):
        prepared = dashboard.prepare(REPLAY_NAME, storage, attach=False)
        assert prepared.url.endswith("studies/transpose.db")


def test_a_missing_database_path_is_still_called_missing(tmp_path):
    assert replay_study(tmp_path, "--in-process").returncode == 0
    one_line_refusal(tuner("best", "nope.db", cwd=tmp_path), "no such database", "nope.db")
    one_line_refusal(
        tuner("best", "studies/transpose.db", "--storage", "studies/transpose.db", cwd=tmp_path), "not both"
    )


# ---------------------------------------------------------------------------------------------------------------
# a study that holds its trials already


def test_a_complete_study_says_so_and_starts_nothing(tmp_path):
    assert replay_study(tmp_path, "--storage", "s.db").returncode == 0
    before = files_in(tmp_path)
    proc = replay_study(tmp_path, "--storage", "s.db", "--replay-delay", "0.5")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        f"study {REPLAY_NAME} is complete: 3 of 3 trials in s.db; nothing to run (a larger --trials adds more)"
    ]
    assert "no result came back" not in proc.stdout + proc.stderr
    assert files_in(tmp_path) == before, "a complete study was written to"
    summary = json.loads(replay_study(tmp_path, "--storage", "s.db", "--replay-delay", "0.5", "--json").stdout)
    assert summary["complete_before_run"] and summary["trials"] == 3
    assert summary["gpus"] == [] and summary["measured_this_run"] == 0  # no pool started, nothing replayed
    # fewer trials asked for than it holds: complete too
    assert "is complete: 3 trials (--trials 2)" in replay_study(tmp_path, "--storage", "s.db", trials=2).stderr


def test_a_complete_study_of_a_gpu_is_complete_without_one(tmp_path):
    # The same space's study, named: a rerun on the GPU engine (none here) finds it complete before it would
    # need a GPU worker, or say that there is no GPU.
    assert replay_study(tmp_path, "--storage", "s.db", "--study-name", "mine").returncode == 0
    proc = tuner("study", "transpose", "--trials", "3", "--storage", "s.db", "--study-name", "mine", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stderr.strip()
        == "study mine is complete: 3 of 3 trials in s.db; nothing to run (a larger --trials adds more)"
    )
    assert preflight.maybe_complete(str(tmp_path / "s.db"), "transpose", 3, "mine")
    assert not preflight.maybe_complete(str(tmp_path / "s.db"), "transpose", 4, "mine")


def test_a_complete_study_found_once_the_study_is_open(tmp_path, monkeypatch):
    """Where the name waits for a worker's GPU (no GPU model before start, a cluster's), the driver stops right
    after opening the study: the pool and the writer are stopped, nothing is measured or written."""
    import tuner
    from tuner.study.opening import Opening

    monkeypatch.chdir(tmp_path)
    tuner.study("transpose", 3, replay=RECORDING, storage="s.db", in_process=True)
    before = files_in(tmp_path)
    monkeypatch.setattr(Opening, "_name_before_start", lambda self: None)
    summary = tuner.study("transpose", 3, replay=RECORDING, storage="s.db", replay_delay=0.2).summary
    assert summary["complete_before_run"] and summary["study"] == REPLAY_NAME and summary["trials"] == 3
    # the lease was taken and dropped, and this process's storage keeps SQLite's WAL files open: no other change
    assert {k for k, v in files_in(tmp_path).items() if before.get(k) != v} <= {"s.db", "s.db-wal", "s.db-shm"}
    import optuna

    assert len(optuna.load_study(study_name=REPLAY_NAME, storage="sqlite:///s.db").trials) == 3


def test_a_resume_that_would_be_refused_is_refused_before_start(tmp_path):
    assert replay_study(tmp_path, "--storage", "s.db").returncode == 0
    proc = replay_study(tmp_path, "--storage", "s.db", "--objectives", "all")
    one_line_refusal(proc, "s.db", f"study '{REPLAY_NAME}' searched")


def test_counted_trials_follow_the_drivers_rule(tmp_path):
    """The SQL count (read before anything starts) agrees with the driver's `counts` over a study with
    screened proposals, an interrupted trial and failures."""
    import optuna
    from optuna.distributions import IntDistribution

    from tuner.store.schema import SCREENED, counts
    from tuner.study.driver import run_study
    from tuner.study.options import StudyOptions

    url = f"sqlite:///{tmp_path}/s.db"
    opts = StudyOptions(
        kernel="transpose",
        space="transpose",
        trials=12,
        storage=url,
        replay=str(RECORDING),
        in_process=True,
        inside_valid_set=False,  # proposals are screened by the driver: duplicates and invalid ones are recorded
        sampler="random",
        seed=3,
        progress=False,
    )
    summary = run_study(opts)
    study = optuna.load_study(study_name=summary["study"], storage=url)
    dist = {"x": IntDistribution(0, 9)}
    for state, attrs in (
        ("FAIL", {"failure": "interrupted"}),
        ("FAIL", {"failure": "compile"}),
        ("PRUNED", {SCREENED: "invalid"}),
        ("RUNNING", {}),
    ):
        study.add_trial(
            optuna.trial.create_trial(
                params={"x": 1},
                distributions=dist,
                state=getattr(optuna.trial.TrialState, state),
                user_attrs=attrs,
                value=None,
            )
        )
    trials = study.get_trials(deepcopy=False)
    assert any(SCREENED in t.user_attrs for t in trials)
    counted, attrs = schema.counted_trials(tmp_path / "s.db", summary["study"])
    assert counted == sum(1 for t in trials if counts(t)) == 13
    assert attrs["kernel"] == "transpose"
    assert schema.counted_trials(tmp_path / "s.db", "absent") is None


# ---------------------------------------------------------------------------------------------------------------
# a home that cannot be written


def no_home(tmp_path: Path) -> dict[str, str]:
    """An environment whose home (under /proc: no one can create it, root included) holds both caches."""
    env = {k: v for k, v in os.environ.items() if k not in ("TUNER_CACHE_DIR", "XDG_CACHE_HOME", "CUPY_CACHE_DIR")}
    return {**env, "HOME": "/proc/no-home", "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": str(ROOT)}


def run_without_env(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    (cwd / "tmp").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env
    )


def test_an_unwritable_home_moves_both_caches_to_the_temporary_folder(tmp_path):
    env = no_home(tmp_path)
    proc = run_without_env(["check", "transpose", "--sample", "2"], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "cannot be written" in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    fallback = tmp_path / "tmp" / f"tuner-{os.getuid()}"
    assert "/proc/no-home/.cache/tuner and /proc/no-home/.cupy/kernel_cache cannot be written" in lines[0]
    assert f"{fallback}/tuner and {fallback}/cupy" in lines[0]
    assert any((fallback / "tuner").rglob("*.cubin")), "the compiles were not cached in the fallback"


def test_an_unwritable_home_does_not_stop_a_replay_study(tmp_path):
    env = no_home(tmp_path)
    proc = run_without_env(["study", "transpose", "--trials", "2", "--replay", str(RECORDING), "--json"], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["trials"] == 2
    notes = [line for line in proc.stderr.splitlines() if "cannot be written" in line]
    assert len(notes) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_an_unwritable_cupy_cache_dir_is_replaced_too(tmp_path):
    env = {**no_home(tmp_path), "HOME": str(tmp_path), "CUPY_CACHE_DIR": "/proc/cupy"}
    proc = run_without_env(["check", "copy", "--sample", "1"], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("cannot be written") == 1 and "/proc/cupy" in proc.stderr
    assert "set CUPY_CACHE_DIR to choose" in proc.stderr


def test_the_temporary_cache_folder_is_this_users_alone(tmp_path, monkeypatch):
    from tuner.build import cachedirs

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    shared = tmp_path / f"tuner-{os.getuid()}"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # writable by anyone: a cache there could be filled by another user
    chosen = cachedirs._private_temp_root()
    assert chosen != shared and chosen.parent == tmp_path and not chosen.stat().st_mode & 0o077
    shared.chmod(0o700)
    assert cachedirs._private_temp_root() == shared


# ---------------------------------------------------------------------------------------------------------------
# no GPU, in words


def test_hidden_gpus_are_named_for_the_engine_in_use(tmp_path):
    hidden = {"CUDA_VISIBLE_DEVICES": ""}
    line = one_line_refusal(tuner("study", "transpose", "--trials", "2", cwd=tmp_path, env=hidden))
    assert "the local engine runs on this machine's GPUs" in line and "CUDA_VISIBLE_DEVICES='' hides" in line
    assert "Ray" not in line
    line = one_line_refusal(tuner("study", "transpose", "--trials", "2", "--engine", "ray", cwd=tmp_path, env=hidden))
    assert "the Ray cluster this study would start here has no GPU" in line
    line = one_line_refusal(tuner("bench", "transpose", cwd=tmp_path, env=hidden))
    assert "GPU 0: nothing to measure on: CUDA_VISIBLE_DEVICES='' hides every GPU" in line


def test_bench_without_a_driver_says_so_in_words(tmp_path):
    from tuner.gpu import discovery

    if discovery.local_gpus() != 0:
        pytest.skip("this machine has a GPU")
    line = one_line_refusal(tuner("bench", "transpose", cwd=tmp_path))
    assert "cudaError" not in line and "nothing to measure on" in line, line
    assert "NVIDIA driver" in line, line
