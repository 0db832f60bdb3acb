"""`tuner.store.trialwriter` on real SQLite and real Optuna: the bulk path writes what `create_new_trial` writes, field
by field, and the study's writer process mirrors a replay study exactly."""

from __future__ import annotations

import datetime
import math
import os
import re
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner.store import trialwriter
from tuner.store.dbfiles import open_storage
from tuner.store.trialwriter import TrialWriter
from tuner.study.driver import Driver
from tuner.study.options import StudyOptions

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"

DISTRIBUTIONS = {
    "tile": CategoricalDistribution((16, 32, 64)),
    "layout": CategoricalDistribution(("row", "col", None)),
    "unroll": IntDistribution(1, 8),
    "block": IntDistribution(32, 1024, step=32),
    "warps": IntDistribution(1, 32, log=True),
    "alpha": FloatDistribution(0.0, 1.0),
    "lr": FloatDistribution(1e-5, 1e-1, log=True),
    "frac": FloatDistribution(0.0, 1.0, step=0.25),
}
PARAMS = {"tile": 32, "layout": None, "unroll": 3, "block": 256, "warps": 4, "alpha": 0.375, "lr": 3e-4, "frac": 0.75}
START = datetime.datetime(2026, 11, 30, 12, 0, 0, 123456)


def frozen(state: TrialState, values, n: int, **extra) -> FrozenTrial:
    user_attrs = {
        "tbps": 3.25 + n,
        "registers": 22,
        "uri": f"transpose_tile32_n{n}",
        "derived": {"threads": 256, "shape": [32, 8], "nested": {"ok": True, "none": None}},
        "versions": ["cupy 14", {"nvrtc": [13, 0]}],
        "empty": {},
        "flag": False,
    }
    return FrozenTrial(
        number=0,
        state=state,
        value=None,
        values=values,
        datetime_start=START + datetime.timedelta(seconds=n),
        datetime_complete=None
        if state == TrialState.RUNNING
        else START + datetime.timedelta(seconds=n, milliseconds=7),
        params=dict(PARAMS, unroll=1 + n % 8),
        distributions=DISTRIBUTIONS,
        user_attrs=user_attrs | extra.pop("user_attrs", {}),
        system_attrs={"constraints:space": 0.0, "fixed_params": {"tile": 32}},
        intermediate_values=extra.pop("intermediate_values", {}),
        trial_id=n,
    )


def varied(n_objectives: int) -> list[FrozenTrial]:
    """COMPLETE with finite and infinite values, FAIL and PRUNED without values, a RUNNING one, intermediate values
    with inf and nan."""

    def vals(*v: float) -> list[float]:
        return list(v[:n_objectives])

    return [
        frozen(TrialState.COMPLETE, vals(3.5, 22.0, 1088.0), 0),
        frozen(TrialState.COMPLETE, vals(math.inf, -math.inf, 0.0), 1),
        frozen(TrialState.FAIL, None, 2, user_attrs={"failure": "compile", "reason": 'ptxas: \u00b5 "quoted"\n'}),
        frozen(TrialState.PRUNED, None, 3, intermediate_values={0: 1.5, 1: math.inf, 2: -math.inf, 3: math.nan}),
        frozen(TrialState.COMPLETE, vals(-math.inf, 1e308, -0.0), 4, user_attrs={"big": 2**62, "x": -1e-300}),
        frozen(TrialState.RUNNING, None, 5),
        frozen(TrialState.COMPLETE, vals(0.1, 2.0, 3.0), 6),
    ]


def new_study(tmp_path: Path, name: str, n_objectives: int):
    url = f"sqlite:///{tmp_path}/{name}.db"
    storage = open_storage(url)
    directions = ["maximize", "minimize", "minimize"][:n_objectives]
    study = optuna.create_study(storage=storage, study_name="s", directions=directions)
    return url, storage, storage.get_study_id_from_name(study.study_name)


def fields(trial: FrozenTrial) -> dict:
    """Everything a trial holds, with nan made comparable."""
    return {
        "number": trial.number,
        "state": trial.state,
        "params": trial.params,
        "distributions": trial.distributions,
        "values": trial.values,
        "user_attrs": trial.user_attrs,
        "system_attrs": trial.system_attrs,
        "datetime_start": trial.datetime_start,
        "datetime_complete": trial.datetime_complete,
        "intermediate_values": {k: "nan" if math.isnan(v) else v for k, v in trial.intermediate_values.items()},
    }


def loaded(url: str) -> list[dict]:
    return [fields(t) for t in optuna.load_study(study_name="s", storage=url).get_trials(deepcopy=False)]


@pytest.mark.parametrize("n_objectives", [1, 3])
def test_bulk_writes_what_create_new_trial_writes(tmp_path, n_objectives):
    trials = varied(n_objectives)
    bulk_url, bulk_storage, bulk_id = new_study(tmp_path, "bulk", n_objectives)
    writer = TrialWriter(bulk_storage)
    assert writer.bulk
    ids = writer.write(bulk_id, trials)
    one_url, one_storage, one_id = new_study(tmp_path, "one", n_objectives)
    expected_ids = [one_storage.create_new_trial(one_id, template_trial=t) for t in trials]
    assert ids == expected_ids  # both fresh databases: the same ids in the same order
    got, expected = loaded(bulk_url), loaded(one_url)
    assert [t["number"] for t in got] == list(range(len(trials)))
    assert got == expected
    assert got[1]["values"][0] == math.inf and got[3]["intermediate_values"][3] == "nan"


def test_bulk_appends_after_existing_trials_and_continues_the_numbers(tmp_path):
    trials = varied(3)
    bulk_url, storage, study_id = new_study(tmp_path, "bulk", 3)
    one_url, one_storage, one_id = new_study(tmp_path, "one", 3)
    for t in trials[:2]:  # existing trials, written by Optuna
        storage.create_new_trial(study_id, template_trial=t)
        one_storage.create_new_trial(one_id, template_trial=t)
    writer = TrialWriter(storage)
    first = writer.write(study_id, trials[2:5])
    second = writer.write(study_id, trials[5:])
    for t in trials[2:]:
        one_storage.create_new_trial(one_id, template_trial=t)
    assert len(set(first + second)) == 5
    got = loaded(bulk_url)
    assert [t["number"] for t in got] == list(range(len(trials)))
    assert got == loaded(one_url)
    assert writer.write(study_id, []) == []


def test_bulk_refuses_an_incompatible_distribution_and_writes_nothing(tmp_path):
    url, storage, study_id = new_study(tmp_path, "bulk", 3)
    writer = TrialWriter(storage)
    writer.write(study_id, varied(3)[:1])
    changed = varied(3)[1]
    changed.distributions = dict(DISTRIBUTIONS, tile=IntDistribution(16, 64))
    with pytest.raises(ValueError):
        writer.write(study_id, [varied(3)[2], changed])
    assert len(loaded(url)) == 1


def test_fallback_when_the_guard_says_no_gives_the_same_rows(tmp_path, monkeypatch):
    trials = varied(3)
    bulk_url, bulk_storage, bulk_id = new_study(tmp_path, "bulk", 3)
    TrialWriter(bulk_storage).write(bulk_id, trials)
    monkeypatch.setattr(trialwriter, "TESTED_OPTUNA", frozenset())  # an Optuna release never tested
    calls = []
    real = optuna.storages.RDBStorage.create_new_trial
    monkeypatch.setattr(
        optuna.storages.RDBStorage,
        "create_new_trial",
        lambda self, study_id, template_trial=None: calls.append(1) or real(self, study_id, template_trial),
    )
    one_url, one_storage, one_id = new_study(tmp_path, "one", 3)
    writer = TrialWriter(one_storage)
    assert not writer.bulk
    writer.write(one_id, trials)
    assert len(calls) == len(trials)
    assert loaded(one_url) == loaded(bulk_url)


def test_the_guard_reads_the_schema_revision(tmp_path, monkeypatch):
    _, storage, _ = new_study(tmp_path, "bulk", 1)
    assert trialwriter.bulk_supported(storage)
    monkeypatch.setattr(type(storage), "get_current_version", lambda self: "v3.0.0.d")  # an older schema
    assert not trialwriter.bulk_supported(storage)
    assert not trialwriter.bulk_supported(optuna.storages.InMemoryStorage())


def test_the_writer_process_mirrors_a_replay_study_exactly(tmp_path):
    """A replay study through the writer process (not in process): the durable trials are the records the driver
    sent it, field by field, numbered as the driver numbered them."""
    url = f"sqlite:///{tmp_path}/w.db"
    opts = StudyOptions(
        kernel="transpose",
        space=str(ROOT / "search_spaces" / "transpose.yaml"),
        trials=40,
        storage=url,
        replay=str(RECORDING),
        seed=3,
        progress=False,
    )
    driver = Driver(opts)
    summary = driver.run()
    assert summary["writer"]["trials_written"] == len(driver.memory.get_all_trials(driver.fast_id))
    durable = optuna.load_study(study_name=None, storage=url).get_trials(deepcopy=False)
    sent = [driver.codec.record(driver._frozen(n)) for n in range(len(durable))]
    assert len(durable) >= 40
    assert [fields(t) for t in durable] == [fields(t) for t in sent]


def test_the_writer_process_writes_a_late_trial_running_then_completes_it(tmp_path):
    """A trial still running after `WRITER_HOLD_S` is written RUNNING, with the finished trials behind it in ask
    order, and completed by its finish; a finished trial is written in one go with its neighbours."""
    from tuner.store.writer import Mirror

    url, storage, study_id = new_study(tmp_path, "m", 3)
    trials = varied(3)
    running = frozen(TrialState.RUNNING, None, 0, user_attrs={"tbps": None})
    mirror = Mirror(url, study_id)
    mirror.start(0, running)
    mirror.start(1, trials[5])
    mirror.finish(1, trials[1])
    deadline = time.monotonic() + 30  # the spawned writer imports Optuna first, then holds trial 0 for a while
    while not optuna.load_study(study_name="s", storage=url).trials and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # a writer that wrote trial 0 alone would have written trial 1 by now
    # trial 0 is written RUNNING once held WRITER_HOLD_S, and trial 1 behind it, in the same pass
    assert [t.state for t in optuna.load_study(study_name="s", storage=url).trials] == [
        TrialState.RUNNING,
        TrialState.COMPLETE,
    ]
    mirror.finish(0, trials[0])
    mirror.start(2, trials[5])
    mirror.finish(2, trials[2])
    stats = mirror.close(timeout=30)
    assert stats["trials"] == 3
    got = loaded(url)
    assert [t["number"] for t in got] == [0, 1, 2]
    assert got[0]["state"] == TrialState.COMPLETE and got[0]["values"] == trials[0].values
    assert got[0]["user_attrs"] == trials[0].user_attrs and got[0]["system_attrs"] == trials[0].system_attrs
    assert got[1] == fields(trials[1]) | {"number": 1}
    assert got[2] == fields(trials[2]) | {"number": 2}


# ---------------------------------------------------------------------------------------------------------------
# completing trials written RUNNING


def running_and_finished(n_objectives: int) -> list[tuple[FrozenTrial, FrozenTrial]]:
    """(RUNNING record, finished record) pairs of the same trials: the RUNNING ones hold attributes that the finish
    overwrites (and one it leaves), and the one with intermediate values an intermediate value it overwrites."""
    finished = [t for t in varied(n_objectives) if t.state != TrialState.RUNNING]
    pairs = []
    for t in finished:
        n = t._trial_id  # frozen() numbers its trials through trial_id
        running = frozen(
            TrialState.RUNNING,
            None,
            n,
            user_attrs={"tbps": None, "uri": "pending", "queued_s": 1.5},
            intermediate_values={0: 9.0} if t.intermediate_values else {},
        )
        running.system_attrs = {"constraints:space": 1.0}
        pairs.append((running, t))
    return pairs


def complete_with_optuna(storage, trial_id: int, done: FrozenTrial) -> None:
    """What the writer did before `TrialWriter.finish`: Optuna's public calls, one attribute at a time."""
    for key, value in done.user_attrs.items():
        storage.set_trial_user_attr(trial_id, key, value)
    for key, value in done.system_attrs.items():
        storage.set_trial_system_attr(trial_id, key, value)
    for step, value in done.intermediate_values.items():
        storage.set_trial_intermediate_value(trial_id, step, value)
    storage.set_trial_state_values(trial_id, done.state, done.values)


def but_completion_time(url: str) -> list[dict]:
    """`loaded`, datetime_complete aside (Optuna's calls stamp the time they run)."""
    return [{k: v for k, v in t.items() if k != "datetime_complete"} for t in loaded(url)]


@pytest.mark.parametrize("n_objectives", [1, 3])
def test_bulk_finish_leaves_what_optunas_calls_leave(tmp_path, n_objectives):
    pairs = running_and_finished(n_objectives)
    bulk_url, bulk_storage, bulk_id = new_study(tmp_path, "bulk", n_objectives)
    writer = TrialWriter(bulk_storage)
    assert writer.bulk
    ids = writer.write(bulk_id, [running for running, _ in pairs])
    one_url, one_storage, one_id = new_study(tmp_path, "one", n_objectives)
    one_ids = [one_storage.create_new_trial(one_id, template_trial=running) for running, _ in pairs]
    assert ids == one_ids and but_completion_time(bulk_url) == but_completion_time(one_url)
    assert {t["state"] for t in loaded(bulk_url)} == {TrialState.RUNNING}
    # a value already there (an intermediate report's, say) is overwritten like an attribute
    bulk_storage.set_trial_state_values(ids[0], TrialState.RUNNING, [7.0] * n_objectives)
    one_storage.set_trial_state_values(one_ids[0], TrialState.RUNNING, [7.0] * n_objectives)

    before = datetime.datetime.now()
    for trial_id, (_, done) in zip(one_ids, pairs, strict=True):
        complete_with_optuna(one_storage, trial_id, done)
    writer.finish(bulk_id, [(trial_id, done) for trial_id, (_, done) in zip(ids, pairs, strict=True)])

    got, expected = but_completion_time(bulk_url), but_completion_time(one_url)
    assert got == expected
    assert [t["state"] for t in got] == [done.state for _, done in pairs]
    assert got[0]["values"] == pairs[0][1].values  # 7.0 overwritten
    assert got[1]["values"][0] == math.inf and got[2]["values"] is None  # inf; FAIL without values
    assert got[3]["intermediate_values"] == {0: 1.5, 1: math.inf, 2: -math.inf, 3: "nan"}  # 9.0 overwritten
    assert got[0]["user_attrs"]["queued_s"] == 1.5 and got[0]["user_attrs"]["uri"] == "transpose_tile32_n0"
    assert got[0]["system_attrs"]["constraints:space"] == 0.0
    # the bulk path records the time each trial was told; Optuna's calls, the time they ran
    assert [t["datetime_complete"] for t in loaded(bulk_url)] == [done.datetime_complete for _, done in pairs]
    assert all(t["datetime_complete"] >= before for t in loaded(one_url))


def test_bulk_finish_takes_a_fixed_number_of_statements_whatever_the_number_of_trials(tmp_path):
    """A read of the trials and their update, and per table at most a read, an insert and an update."""
    from sqlalchemy import event

    pairs = running_and_finished(3)
    url, storage, study_id = new_study(tmp_path, "bulk", 3)
    writer = TrialWriter(storage)
    ids = writer.write(study_id, [running for running, _ in pairs])
    statements = []
    event.listen(storage.engine, "before_cursor_execute", lambda *a: statements.append(1))
    writer.finish(study_id, [(ids[0], pairs[0][1])])
    one = len(statements)
    statements.clear()
    writer.finish(study_id, [(i, done) for i, (_, done) in zip(ids[1:], pairs[1:], strict=True)])
    assert one <= len(statements) <= 2 + 3 * 4  # Optuna's calls: ~3 per attribute, over 30 for one of these trials


def test_finishing_a_finished_trial_raises_and_writes_nothing(tmp_path):
    from optuna.exceptions import UpdateFinishedTrialError

    pairs = running_and_finished(3)
    url, storage, study_id = new_study(tmp_path, "bulk", 3)
    writer = TrialWriter(storage)
    ids = writer.write(study_id, [running for running, _ in pairs[:2]] + [pairs[2][1]])  # the third finished
    before = loaded(url)
    with pytest.raises(UpdateFinishedTrialError, match="Trial#2 has already finished"):
        writer.finish(study_id, [(ids[0], pairs[0][1]), (ids[2], pairs[2][1])])
    assert loaded(url) == before  # all or nothing: trial 0 is still RUNNING
    writer.finish(study_id, [(ids[0], pairs[0][1])])
    with pytest.raises(UpdateFinishedTrialError):  # and the one just completed
        writer.finish(study_id, [(ids[0], pairs[0][1])])
    with pytest.raises(UpdateFinishedTrialError):  # as Optuna's own calls refuse it
        complete_with_optuna(storage, ids[0], pairs[0][1])
    with pytest.raises(KeyError):
        writer.finish(study_id, [(max(ids) + 1, pairs[1][1])])
    with pytest.raises(ValueError, match="unfinished"):
        writer.finish(study_id, [(ids[1], pairs[1][0])])
    with pytest.raises(ValueError, match="twice"):
        writer.finish(study_id, [(ids[1], pairs[1][1]), (ids[1], pairs[1][1])])
    assert loaded(url)[1]["state"] == TrialState.RUNNING
    writer.finish(study_id, [])


def test_finish_falls_back_to_optunas_calls_when_the_guard_says_no(tmp_path, monkeypatch):
    from optuna.exceptions import UpdateFinishedTrialError

    pairs = running_and_finished(3)
    bulk_url, bulk_storage, bulk_id = new_study(tmp_path, "bulk", 3)
    bulk = TrialWriter(bulk_storage)
    ids = bulk.write(bulk_id, [running for running, _ in pairs])
    bulk.finish(bulk_id, [(i, done) for i, (_, done) in zip(ids, pairs, strict=True)])
    monkeypatch.setattr(trialwriter, "TESTED_OPTUNA", frozenset())  # an Optuna release never tested
    calls = []
    real = optuna.storages.RDBStorage.set_trial_state_values
    monkeypatch.setattr(
        optuna.storages.RDBStorage,
        "set_trial_state_values",
        lambda self, trial_id, state, values=None: calls.append(trial_id) or real(self, trial_id, state, values),
    )
    one_url, one_storage, one_id = new_study(tmp_path, "one", 3)
    writer = TrialWriter(one_storage)
    assert not writer.bulk
    one_ids = writer.write(one_id, [running for running, _ in pairs])
    writer.finish(one_id, [(i, done) for i, (_, done) in zip(one_ids, pairs, strict=True)])
    assert calls == one_ids
    assert but_completion_time(one_url) == but_completion_time(bulk_url)
    with pytest.raises(UpdateFinishedTrialError):
        writer.finish(one_id, [(one_ids[0], pairs[0][1])])


def _writer_with_short_hold(conn, url, parent, calls: str) -> None:
    """`_writer_main` (in the writer's process) holding trials 0.3 s, whose bulk writes take 2 s longer (messages sent
    meanwhile arrive in one pass), and which logs the number of trials of each `finish` call to `calls`."""
    from tuner.store import writer as study

    study.WRITER_HOLD_S = 0.3
    write, finish = TrialWriter.write, TrialWriter.finish

    def slow_write(self, study_id, trials):
        ids = write(self, study_id, trials)
        time.sleep(2.0)
        return ids

    def logged_finish(self, study_id, trials):
        with open(calls, "a") as log:
            log.write(f"{len(trials)}\n")
        return finish(self, study_id, trials)

    TrialWriter.write, TrialWriter.finish = slow_write, logged_finish
    study._writer_main(conn, url, parent)


def test_the_writer_process_completes_trials_held_past_the_hold_in_one_pass(tmp_path):
    """Trials still running after `WRITER_HOLD_S` are written RUNNING; their finishes, arriving together, are
    completed in one `finish` call, and the durable trials are then the records the driver sent."""
    from tuner.store.writer import Mirror

    url, storage, study_id = new_study(tmp_path, "m", 3)
    pairs = running_and_finished(3)
    calls = tmp_path / "calls.txt"
    mirror = Mirror(url, study_id, target=_writer_with_short_hold, extra=(str(calls),))  # the writer above
    for number, (running, _) in enumerate(pairs):
        mirror.start(number, running)
    deadline = time.monotonic() + 60  # the spawned writer imports Optuna first
    while len(optuna.load_study(study_name="s", storage=url).trials) < len(pairs) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [t.state for t in optuna.load_study(study_name="s", storage=url).trials] == [TrialState.RUNNING] * len(pairs)
    for number, (_, done) in enumerate(pairs):  # while the writer sleeps after its write
        mirror.finish(number, done)
    mirror.start(len(pairs), pairs[0][1])  # a trial finished before it is due: written in one go
    stats = mirror.close(timeout=60)
    assert stats["trials"] == len(pairs) + 1
    assert calls.read_text().split() == [str(len(pairs))]
    got = loaded(url)
    # the attribute only the RUNNING record held stays, as Optuna's calls leave it
    expected = [
        fields(done) | {"number": n, "user_attrs": {"queued_s": 1.5} | done.user_attrs}
        for n, (_, done) in enumerate(pairs)
    ]
    assert got == expected + [fields(pairs[0][1]) | {"number": len(pairs)}]


def test_the_driver_hears_at_once_of_a_writer_that_died(tmp_path):
    """`Mirror.check` (called at every turn of the driver's loop) raises as soon as the writer process is gone,
    instead of the study running on with nothing recorded; a live, bound writer passes."""
    import signal

    from tuner.store.writer import Mirror

    url, _, study_id = new_study(tmp_path, "w", 1)
    mirror = Mirror(url, study_id)
    mirror.check()  # alive: nothing to say
    os.kill(mirror.proc.pid, signal.SIGKILL)
    mirror.proc.join(30)
    with pytest.raises(RuntimeError, match="writer process exited with code -9"):
        mirror.check()


@pytest.mark.parametrize("missing", ["models", "_create_scoped_session", "TrialUserAttributeModel"])
def test_the_guard_takes_the_public_path_when_a_private_name_moved(tmp_path, monkeypatch, missing):
    """A later Optuna that moved what the bulk path imports sends every write through `create_new_trial`."""
    import optuna.storages._rdb as rdb
    import optuna.storages._rdb.storage as rdb_storage

    _, storage, _ = new_study(tmp_path, "bulk", 1)
    if missing == "models":
        monkeypatch.setitem(sys.modules, "optuna.storages._rdb.models", None)  # its import raises ImportError
        monkeypatch.delattr(rdb, "models")
    elif missing == "_create_scoped_session":
        monkeypatch.delattr(rdb_storage, "_create_scoped_session")
    else:
        monkeypatch.delattr(rdb.models, missing)
    assert not trialwriter.bulk_supported(storage)
    assert not TrialWriter(storage).bulk


def test_the_optuna_pin_is_the_tested_releases():
    """pyproject's Optuna bound admits exactly the releases of `TESTED_OPTUNA`, and the installed one is among
    them: a new Optuna release fails here until its models are checked and it joins both."""
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    low, high = re.search(r'"optuna>=(\d+\.\d+),<(\d+\.\d+)"', text).groups()
    (lo_major, lo_minor), (hi_major, hi_minor) = (map(int, v.split(".")) for v in (low, high))
    assert lo_major == hi_major, "the pin spans one major release"
    pinned = {(lo_major, minor) for minor in range(lo_minor, hi_minor)}
    assert pinned == set(trialwriter.TESTED_OPTUNA)
    assert trialwriter.optuna_release() in trialwriter.TESTED_OPTUNA
