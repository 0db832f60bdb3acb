"""Studies of several problems side by side over one pool (`tuner.study.sidebyside`): replayed on CPU from the
complete H200 recordings of the decode ladder (benchmarks/data/grid/gemv_ladder_m*.db.gz, every valid config of
benchmarks/spaces/grid_gemv_ladder.yaml at M = 1, 2, 4 ...), and, for the local engine's pool, with real compile
processes (NVRTC) and a real GPU worker process answering from the transpose H200 recording."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import optuna
import pytest

# a sibling test module: a GPU worker process answering from a recording
from tests.study.test_shapes import _recorded_worker
from tuner.core.result import TrialAttr
from tuner.gpu import discovery
from tuner.space import space as space_mod
from tuner.space.space import params_key
from tuner.study import sidebyside
from tuner.study.options import StudyOptions
from tuner.study.shapes import neighbours, run_problems

ROOT = Path(__file__).resolve().parents[2]
LADDER = str(ROOT / "benchmarks" / "spaces" / "grid_gemv_ladder.yaml")
GRID = ROOT / "benchmarks" / "data" / "grid"
PROBLEMS = ("m1", "m2", "m4")
WIDTH = 7  # configs in flight over all three studies: 3 each at most


def _opts(tmp_path, **kw) -> StudyOptions:
    base = dict(
        kernel="gemv",
        space=LADDER,
        trials=16,
        seed=5,
        progress=False,
        storage=f"sqlite:///{tmp_path}/ladder.db",
        problems=",".join(PROBLEMS),
        replay=[str(GRID / f"gemv_ladder_{m}.db.gz") for m in PROBLEMS],
        in_process=True,
        replay_in_flight=WIDTH,
    )
    return StudyOptions(**{**base, **kw})


def _trials(storage: str, study: str):
    return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)


def test_side_by_side_each_study_keeps_its_share_of_the_configs_in_flight(tmp_path, monkeypatch):
    """The point of running side by side: each study has few configs in flight (its share of the pool's width),
    while the pool as a whole is kept as full as for one study."""
    peaks: dict[str, int] = {}
    totals: list[int] = []
    submit = sidebyside.Share.submit

    def counted(share, *args, **kw):
        submit(share, *args, **kw)
        peaks[share.problem.name] = max(peaks.get(share.problem.name, 0), share.outstanding)
        totals.append(share.backend.in_flight)

    monkeypatch.setattr(sidebyside.Share, "submit", counted)
    out = run_problems(_opts(tmp_path))
    assert out["side_by_side"] and [r["problem"] for r in out["problems"]] == list(PROBLEMS)
    assert all(r["trials"] == 16 for r in out["problems"])
    share = math.ceil(WIDTH / len(PROBLEMS))
    assert all(1 <= peak <= share for peak in peaks.values()) and set(peaks) == set(PROBLEMS), peaks
    assert max(totals) == WIDTH  # ... and together they fill the pool


def test_a_study_measures_its_neighbours_new_best_configs(tmp_path):
    opts = _opts(tmp_path)
    out = run_problems(opts)
    rows = {r["problem"]: r for r in out["problems"]}
    ladder = space_mod.load(LADDER)
    near = neighbours([ladder.problem(n) for n in PROBLEMS])
    taken_in_all = 0
    for name, row in rows.items():
        trials = _trials(opts.storage, row["study"])
        taken = [t for t in trials if TrialAttr.TAKEN_FROM in t.user_attrs]
        assert len(taken) == row["taken_from_other_problems"] <= sidebyside.TRANSFER_LIMIT
        for t in taken:
            source = t.user_attrs[TrialAttr.TAKEN_FROM]
            assert source in near[name]
            # the config was measured in the study it came from, and is measured here at this problem
            there = {params_key(s.params) for s in _trials(opts.storage, rows[source]["study"]) if s.values}
            assert params_key(t.params) in there and t.user_attrs["tbps"] > 0
        taken_in_all += len(taken)
    assert taken_in_all > 0


def test_a_seeded_side_by_side_replay_asks_the_same_configs_every_time(tmp_path):
    """One thread steps the studies in turn, and the replay answers first in, first out: a seed fixes every
    study's trials."""
    runs = []
    for i in range(2):
        opts = _opts(tmp_path, storage=f"sqlite:///{tmp_path}/run{i}.db")
        out = run_problems(opts)
        runs.append({r["problem"]: [t.params for t in _trials(opts.storage, r["study"])] for r in out["problems"]})
    assert runs[0] == runs[1]


def test_the_nearest_problems_are_the_neighbours():
    near = neighbours(space_mod.load(LADDER).problems)
    assert near["m1"] == ["m2", "m4"] and near["m8"] == ["m4", "m16"] and near["m64"] == ["m32", "m16"]


def test_one_at_a_time_is_chosen_where_a_pool_serves_one_problem(tmp_path):
    out = run_problems(_opts(tmp_path, one_at_a_time=True, trials=6))
    assert not out["side_by_side"] and all(r["taken_from_other_problems"] == 0 for r in out["problems"])


# ------------------------------------------------------------------------------------------------------------
# the local engine's pool, shared


def test_the_local_pool_compiles_and_answers_each_study_s_configs_at_its_own_problem():
    """Two problems' studies over one `LocalPool`: each config is rendered and compiled (NVRTC, in the compile
    processes) at its own study's sizes, answered by the GPU worker process under its study's own trial number,
    timed under its study's cut-off, and counted in its study's costs."""
    from tuner.study.local import LocalPool
    from tuner.study.sharing import shared_workers

    space = space_mod.load("transpose")
    big = space.problem()
    small = dataclasses.replace(big, name="n4096", sizes={"rows": 4096, "cols": 4096})
    config = next(iter(space.enumerate()))
    with shared_workers() as kept:
        pool = LocalPool(space, big, _recorded_worker, gpus=1, arch="sm_90", compile_slots=2, kept=kept)
        backend = sidebyside.LocalBackend(pool, studies=2)
        try:
            a, b = backend.share(space, big), backend.share(space, small)
            b.cutoff_ms = 1e-6
            a.submit(0, config)
            b.submit(0, config)
            assert backend.in_flight == 2 and a.in_flight == b.in_flight == 1
            got: dict[str, list] = {"a": [], "b": []}
            while not (got["a"] and got["b"]):
                got["a"] += a.poll(0.2)
                got["b"] += b.poll(0.2)
            assert [n for n, _ in got["a"]] == [0] == [n for n, _ in got["b"]]
            assert all(r.ok for _, r in got["a"] + got["b"]), got
            assert "ROWS = 16384" in a.built[0][0].text and "ROWS = 4096" in b.built[0][0].text
            spent = [a.spent(), b.spent()]
            assert all(x.compile_s > 0 and x.occupied_s > 0 for x in spent) and spent[0].compile_s != spent[1].compile_s
            assert a.in_flight == b.in_flight == backend.in_flight == 0
            assert a.ran_on == {0: 0} == b.ran_on
        finally:
            pool.close()


def test_a_share_s_width_grows_as_the_other_studies_end():
    class Pool:
        capacity = 19

    backend = sidebyside.LocalBackend(Pool(), studies=7)
    shares = [backend.share(None, None) for _ in range(7)]
    assert [s.capacity for s in shares] == [3] * 7  # ceil(19 / 7): a study made first does not take the pool
    shares[0].outstanding = 3
    for s in shares[1:6]:
        s.outstanding = 3
    assert shares[6].capacity == 1  # 18 of 19 in flight: one place left
    for s in shares[:5]:
        s.close()
    assert shares[6].capacity == 10  # two studies left: ceil(19 / 2), with 3 + 0 in flight of 19


@pytest.mark.parametrize("in_process", [True, False], ids=["in-process", "writer-processes"])
def test_a_study_that_fails_stops_the_others_and_the_command_resumes_them_all(tmp_path, monkeypatch, in_process):
    """A fault in one study (here: its loop raises) ends the command; what every study measured is in the
    database (written in this process, or by each study's writer process), and the same command then resumes all
    of them to their trials."""
    from tuner.study.driver import Driver

    collect = Driver._collect
    calls = {"n": 0}

    def faulty(driver, s):
        if driver.problem.name == "m2":
            calls["n"] += 1
            if calls["n"] == 6:
                raise RuntimeError("a fault in m2's study")
        return collect(driver, s)

    monkeypatch.setattr(Driver, "_collect", faulty)
    opts = _opts(tmp_path, in_process=in_process)
    with pytest.raises(RuntimeError, match="a fault in m2's study"):
        run_problems(opts)
    monkeypatch.setattr(Driver, "_collect", collect)
    kept = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(opts.storage)}
    assert len(kept) == 3 and all(n > 0 for n in kept.values()), kept
    out = run_problems(opts)
    assert all(r["trials"] == 16 and not r["complete_before_run"] for r in out["problems"])
    for row in out["problems"]:
        states = {t.state.name for t in _trials(opts.storage, row["study"])}
        assert "RUNNING" not in states and "WAITING" not in states


def test_side_by_side_over_the_local_engine_compiles_measures_and_retimes_each_problem(tmp_path, monkeypatch):
    """The GPU path of side by side: the local engine's pool (real NVRTC compiles in its compile processes) and a
    measuring evaluator standing in for the GPU (the transpose H200 recording, as tests/study/test_screen_cutoff.py
    uses it), two problems of one space: each study compiles at its own sizes, screens under its own cut-off,
    re-times its own finalists, and every study's trials go to the database through its writer process."""
    from tests.study.test_screen_cutoff import RECORDING, CutoffProbe
    from tuner.study import local

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    CutoffProbe.calls = []
    monkeypatch.setattr(local, "isolated_gpu_evaluator", lambda i, timeout_s=60.0, ahead=None: CutoffProbe(RECORDING))
    monkeypatch.setattr(discovery, "local_gpus", lambda: 1)  # the probe stands in for one GPU
    text = (ROOT / "search_spaces" / "transpose.yaml").read_text()
    two = text.replace(
        "problem: {name: n16384, rows: 16384, cols: 16384, dtype: float32}",
        "problem:\n- {name: n16384, rows: 16384, cols: 16384, dtype: float32}\n"
        "- {name: n8192, rows: 8192, cols: 8192, dtype: float32}",
    )
    assert two != text
    space_file = tmp_path / "transpose2.yaml"
    space_file.write_text(two)
    opts = StudyOptions(
        kernel="transpose",
        space=str(space_file),
        trials=12,
        seed=1,
        gpus=1,
        progress=False,
        finalists=2,
        storage=f"sqlite:///{tmp_path}/t2.db",
        problems="all",
    )
    out = run_problems(opts)
    assert out["side_by_side"] and [r["problem"] for r in out["problems"]] == ["n16384", "n8192"]
    for row in out["problems"]:
        summary = out["studies"][row["problem"]]
        assert row["trials"] == 12 and len(summary["finalists"]) == 2
        assert summary["phases_s"]["compile"] > 0  # this study's own compiles
        trials = _trials(opts.storage, row["study"])
        assert sum(1 for t in trials if t.values) >= 12
        # the source each measured trial ran (its artifact) was rendered at its own problem's sizes
        rows = row["sizes"]["rows"]
        sources = [t.user_attrs[TrialAttr.ARTIFACTS]["source"] for t in trials if TrialAttr.ARTIFACTS in t.user_attrs]
        assert len(sources) >= 12
        for artifact in sources:
            assert f"ROWS = {rows};" in (tmp_path / "t2.artifacts" / artifact).read_text()
    assert len(CutoffProbe.calls) == 2 * 12 + 2 * 2  # every screening config and every finalist, measured once
