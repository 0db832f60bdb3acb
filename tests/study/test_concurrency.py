"""Several drivers at once: one new database, one study name, a driver killed alone (real Ray on CPUs, answers
replayed from tests/data/transpose_h200.db)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tuner.core.errors import InputError
from tuner.space.space import params_key
from tuner.store import lease

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"


def study_cmd(url: str, trials: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tuner",
        "study",
        "transpose",
        "--trials",
        str(trials),
        "--replay",
        str(RECORDING),
        "--storage",
        url,
        "--json",
        *extra,
    ]


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def check_invariants(study: optuna.Study, trials: int) -> None:
    counted = [
        t for t in study.trials if t.user_attrs.get("failure") != "interrupted" and "screened" not in t.user_attrs
    ]
    assert len(counted) == trials
    assert not [t for t in study.trials if t.state.name == "RUNNING"]
    measured = [
        params_key(t.params) for t in study.trials if t.state.name == "COMPLETE" and "duplicate_of" not in t.user_attrs
    ]
    assert len(measured) == len(set(measured)), "a config was measured twice"
    by_number = {t.number: t for t in study.trials}
    for t in study.trials:
        if "duplicate_of" in t.user_attrs:
            assert by_number[t.user_attrs["duplicate_of"]].params == t.params


def test_two_studies_create_one_new_database_at_once(tmp_path):
    url = f"sqlite:///{tmp_path}/new.db"
    procs = [start(study_cmd(url, 15, "--study-name", f"s{i}", "--seed", str(i))) for i in range(2)]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    for i in range(2):
        check_invariants(optuna.load_study(study_name=f"s{i}", storage=url), 15)


def test_two_drivers_on_one_study_name_one_runs_one_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path}/one.db"
    procs = [
        start(study_cmd(url, 40, "--study-name", "shared", "--seed", str(i), "--replay-delay", "0.05"))
        for i in range(2)
    ]
    results = [(p, *p.communicate(timeout=300)) for p in procs]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes == [0, 2], [err[-2000:] for _, _, err in results]
    refused = next(err for p, _, err in results if p.returncode == 2).strip().splitlines()
    assert len(refused) == 1 and "is being run by pid" in refused[0] and "--takeover" in refused[0]
    check_invariants(optuna.load_study(study_name="shared", storage=url), 40)
    # the lease is released at the end: the same command runs again (and resumes)
    again = subprocess.run(
        study_cmd(url, 45, "--study-name", "shared"), cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr[-2000:]
    check_invariants(optuna.load_study(study_name="shared", storage=url), 45)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_kill_9_of_the_driver_alone_leaves_no_orphan(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    proc = start(study_cmd(url, 40, "--replay-delay", "0.3"))
    db = tmp_path / "k.db"
    deadline = time.time() + 180
    seen = 0
    while time.time() < deadline and seen < 3:
        time.sleep(0.5)
        if db.exists():
            try:
                study = optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url)
                seen = sum(1 for t in study.trials if t.state.name == "COMPLETE")
            except Exception:  # the schema is being created
                seen = 0
    assert seen >= 3, "the study did not get going"
    children = _children(proc.pid)
    writer = [c for c in children if "tuner-writer" in Path(f"/proc/{c}/cmdline").read_text()]
    tracker = [c for c in children if "resource_tracker" in Path(f"/proc/{c}/cmdline").read_text()]
    assert writer and not tracker  # the writer's pipe holds no semaphore: no tracker process to orphan either
    os.kill(proc.pid, signal.SIGKILL)  # the driver alone, not its process group
    proc.wait()
    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(c) for c in children):
        time.sleep(0.25)
    assert not [c for c in writer if _alive(c)], "the writer outlived the driver"
    again = subprocess.run(study_cmd(url, 40), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    check_invariants(optuna.load_study(study_name=optuna.get_all_study_names(url)[0], storage=url), 40)
    assert not [c for c in children if _alive(c)]


def test_lease_names_a_live_holder_and_takes_over_a_dead_one(tmp_path):
    url = f"sqlite:///{tmp_path}/l.db"
    held = lease.acquire(url, "s")
    with pytest.raises(InputError, match=r"is being run by pid \d+ on .* --takeover"):
        lease.acquire(url, "s")
    taken = lease.acquire(url, "s", takeover=True)
    assert taken.took_over["token"] == held.token
    held.release()  # no longer ours: releases nothing
    with pytest.raises(InputError):
        lease.acquire(url, "s")
    taken.release()

    dead = subprocess.Popen(["true"])
    dead.wait()
    import sqlalchemy as sa

    table = lease._table()
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            table.insert().values(
                study_name="s", host=os.uname().nodename, pid=dead.pid, started=time.time() - 5, token="old"
            )
        )
    engine.dispose()
    again = lease.acquire(url, "s")  # same host, holder gone: taken over without --takeover
    assert again.took_over["pid"] == dead.pid
    again.release()
