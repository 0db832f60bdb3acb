"""`tuner.trialwriter` on real SQLite and real Optuna: the bulk path writes what `create_new_trial` writes, field
by field, and the study's writer process mirrors a replay study exactly."""

from __future__ import annotations

import datetime
import math
import time
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from tuner import trialwriter
from tuner.study import Driver, StudyOptions, open_storage
from tuner.trialwriter import TrialWriter

ROOT = Path(__file__).resolve().parent.parent
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
        space=str(ROOT / "tuner" / "search_spaces" / "transpose.yaml"),
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
    from tuner.study import _Mirror

    url, storage, study_id = new_study(tmp_path, "m", 3)
    trials = varied(3)
    running = frozen(TrialState.RUNNING, None, 0, user_attrs={"tbps": None})
    mirror = _Mirror(url, study_id)
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
