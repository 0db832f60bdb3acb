"""Studies over several problems in one command (`tuner.study.shapes`), replayed on CPU from complete H200
recordings: benchmarks/data/grid/gemv_m1.db.gz and gemv_m64.db.gz hold every valid config of the GEMV grid space
at M = 1 and at M = 64 (benchmarks/data/grid/README.md); benchmarks/spaces/grid_gemv_shapes.yaml is that space with
both problems (its W cache policy na, the m1 recording's: every one of its configs at either problem is recorded)."""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import optuna
import pytest

from tuner.core.errors import InputError
from tuner.gpu.protocol import Evaluator
from tuner.results import export
from tuner.results.tables import stored_best
from tuner.space import space as space_mod
from tuner.space.space import params_key
from tuner.study import shapes
from tuner.study.options import StudyOptions
from tuner.study.replay import load_recording
from tuner.study.shapes import FIRST_LIMIT, Source, first_configs, match_replays, problem_list

ROOT = Path(__file__).resolve().parents[2]
SPACE = str(ROOT / "benchmarks" / "spaces" / "grid_gemv_shapes.yaml")
GRID = ROOT / "benchmarks" / "data" / "grid"
REPLAYS = {"m1": str(GRID / "gemv_m1.db.gz"), "m64": str(GRID / "gemv_m64.db.gz")}
TRIALS = 12


def _opts(tmp_path, **kw) -> StudyOptions:
    base = dict(kernel="gemv", space=SPACE, trials=TRIALS, storage=f"sqlite:///{tmp_path}/shapes.db", seed=3)
    return StudyOptions(**{**base, "progress": False, **kw})


def run_problems(opts: StudyOptions, problems, replays=(), warm_start=None):
    """`tuner.study.shapes.run_problems` over `problems`, answered by `replays`, warm-started from `warm_start`."""
    return shapes.run_problems(
        dataclasses.replace(opts, problems=problems, replay=list(replays), warm_start=warm_start), stored_best
    )


def _trials(db: str, study: str):
    return optuna.load_study(study_name=study, storage=db).get_trials(deepcopy=False)


@pytest.fixture(scope="module")
def space():
    return space_mod.load(SPACE)


def test_one_at_a_time_every_problem_gets_its_own_study_and_learns_from_the_ones_before(tmp_path, space):
    opts = _opts(tmp_path, one_at_a_time=True, problems="all")
    out = run_problems(opts, "all", replays=[REPLAYS["m64"], REPLAYS["m1"]])  # matched by problem, not by order
    rows = {r["problem"]: r for r in out["problems"]}
    assert list(rows) == ["m1", "m64"]  # the space's order
    names = {study.study_name for study in optuna.get_all_study_summaries(opts.storage)}
    assert names == {r["study"] for r in rows.values()} and len(names) == 2
    for name, row in rows.items():
        assert row["trials"] == TRIALS and row["study"].startswith(f"gemv-{name}_bfloat16")
        recorded = load_recording(REPLAYS[name])[0]
        best = row["best"]
        # the best of each study is its recording's figure for that config at that problem
        assert best["tbps"] == pytest.approx(recorded[params_key(best["params"])][1]["tbps"])
    # m1 came first: nothing to learn from, so its first trial is the space's default
    assert rows["m1"]["first_from_other_problems"] == 0
    assert _trials(opts.storage, rows["m1"]["study"])[0].params == space.default
    # m64 measured m1's best configs first (those valid at M = 64), in the order m1 ranked them
    m1 = export.open_study(rows["m1"]["study"], opts.storage)
    ranked = [t.params for t in sorted(export.measured_trials(m1), key=lambda t: -t.user_attrs["tbps"])]
    expected = [p for p in ranked if space.validate(p, space.problem("m64")) is None][:3]
    assert rows["m64"]["first_from_other_problems"] == len(expected) > 0
    got = [t.params for t in _trials(opts.storage, rows["m64"]["study"])[: len(expected)]]
    assert got == expected


def test_the_command_resumes_as_a_whole(tmp_path):
    opts = _opts(tmp_path)
    first = run_problems(dataclasses.replace(opts, trials=6), ["m1"], replays=[REPLAYS["m1"]])
    assert [r["trials"] for r in first["problems"]] == [6]
    again = run_problems(opts, "m1,m64", replays=list(REPLAYS.values()))
    rows = {r["problem"]: r for r in again["problems"]}
    assert rows["m1"]["trials"] == TRIALS and rows["m64"]["trials"] == TRIALS
    done = run_problems(opts, "all", replays=list(REPLAYS.values()))
    assert all(r["complete_before_run"] for r in done["problems"])
    assert all(r["study"] == rows[r["problem"]]["study"] for r in done["problems"])  # the same studies
    # a finished study's row still shows its best (read from the database)
    assert [r["best"]["uri"] for r in done["problems"]] == [rows[p]["best"]["uri"] for p in ("m1", "m64")]


def test_warm_start_from_a_study_of_the_same_space_elsewhere(tmp_path, space):
    elsewhere = _opts(tmp_path, storage=f"sqlite:///{tmp_path}/other_gpu.db")
    run_problems(elsewhere, ["m64"], replays=[REPLAYS["m64"]])
    (source,) = export.open_studies(str(tmp_path / "other_gpu.db"))
    best3 = [t.params for t in sorted(export.measured_trials(source), key=lambda t: -t.user_attrs["tbps"])[:3]]
    out = run_problems(_opts(tmp_path), ["m64"], replays=[REPLAYS["m64"]], warm_start=str(tmp_path / "other_gpu.db"))
    (row,) = out["problems"]
    assert row["first_from_other_problems"] == 3
    assert [t.params for t in _trials(_opts(tmp_path).storage, row["study"])[:3]] == best3


def test_warm_start_from_another_space_says_which_knobs_differ(tmp_path):
    with pytest.raises(
        InputError, match=r"another space: knobs only there: order, pad, rows_per_thread, tile; knobs only here: mma"
    ):
        run_problems(
            _opts(tmp_path), ["m1"], replays=[REPLAYS["m1"]], warm_start=str(ROOT / "tests/data/transpose_h200.db")
        )
    assert not (tmp_path / "shapes.db").exists()  # refused before anything was written


LADDER = str(ROOT / "benchmarks" / "spaces" / "grid_gemv_ladder.yaml")


def test_the_ladder_recordings_are_complete_for_the_space_they_replay():
    """Every valid config of the ladder space at each M is in that M's recording (what makes a replay of the
    ladder complete: benchmarks/shapes.py --replay), and the manifest says so."""

    ladder = space_mod.load(LADDER)
    manifest = json.loads((GRID / "manifest.json").read_text())
    assert [p.name for p in ladder.problems] == ["m1", "m2", "m4", "m8", "m16", "m32", "m64"]
    for problem in ladder.problems:
        name = f"gemv_ladder_{problem.name}.db.gz"
        records, attrs = load_recording(str(GRID / name))[:2]
        assert attrs["problem"]["name"] == problem.name
        valid = {params_key(c) for c in ladder.valid_configs(problem)}
        assert valid <= set(records) and manifest[name]["complete"] and manifest[name]["valid"] == len(valid)


def test_a_neighbour_s_best_configs_start_the_next_shape_near_its_optimum(tmp_path):
    """On the ladder, M = 2's study measures M = 1's best configs first; recorded on the H200, M = 1's best
    configs run at 0.89 to 1.0 of M = 2's optimum, so the first three trials of M = 2 already hold 0.98 of it
    (after 8 trials at M = 1)."""
    opts = _opts(tmp_path, space=LADDER, trials=8, one_at_a_time=True, problems="all")
    replays = [str(GRID / f"gemv_ladder_{m}.db.gz") for m in ("m1", "m2")]
    out = run_problems(opts, "m1,m2", replays=replays)
    rows = {r["problem"]: r for r in out["problems"]}
    assert rows["m2"]["first_from_other_problems"] == 3
    m1 = export.open_study(rows["m1"]["study"], opts.storage)
    ranked = [t.params for t in sorted(export.measured_trials(m1), key=lambda t: -t.user_attrs["tbps"])][:3]
    first = _trials(opts.storage, rows["m2"]["study"])[:3]
    assert [t.params for t in first] == ranked
    records = load_recording(replays[1])[0]
    optimum = max(float(a["tbps"]) for _, a in records.values() if "tbps" in a)
    assert max(t.user_attrs["tbps"] for t in first) >= 0.98 * optimum > 0
    assert all(t.user_attrs["tbps"] == records[params_key(t.params)][1]["tbps"] for t in first)


def test_first_configs_come_from_the_nearest_problems_first(space):
    m1 = space.problem("m1")
    valid = list(space.valid_configs(m1))[:12]

    def source(name, m, configs):
        return Source(study=name, problem=name, sizes={"M": m, "N": 8192, "K": 8192}, configs=configs)

    far = source("m64", 64, valid[0:4])
    near = source("m2", 2, valid[4:8])
    mid = source("m8", 8, [valid[8], valid[4]])  # its second config is near's first: taken once
    chosen = first_configs(space, m1, [far, mid, near])
    assert chosen == [valid[4], valid[5], valid[6], valid[8], valid[0]]
    assert len(first_configs(space, m1, [far, mid, near], limit=2)) == 2 <= FIRST_LIMIT
    # a config that is not valid at this problem is skipped, not measured
    m64 = space.problem("m64")
    only_m1 = [c for c in valid if space.validate(c, m64) is not None]
    assert first_configs(space, m64, [source("m1", 1, only_m1)]) == []


def test_problems_the_space_does_not_have_are_one_line(space):
    with pytest.raises(InputError, match=r"no problem 'm3' \(its problems: m1, m64\)"):
        problem_list(space, "m1,m3")
    assert [p.name for p in problem_list(space, ["m64", "m1", "m64"])] == ["m64", "m1"]
    with pytest.raises(InputError, match="name problems, or all"):
        problem_list(space, "m1,")


def test_recordings_are_matched_to_their_problems(space):
    problems = problem_list(space, "all")
    assert match_replays(problems, [REPLAYS["m64"], REPLAYS["m1"]]) == REPLAYS
    with pytest.raises(InputError, match="two recordings of problem m1"):
        match_replays(problems, [REPLAYS["m1"], REPLAYS["m1"]])
    with pytest.raises(InputError, match="no recording of problem m64"):
        match_replays(problems, [REPLAYS["m1"]])
    with pytest.raises(InputError, match="a recording of problem 'n16384', not of m1, m64"):
        match_replays(problems, [str(ROOT / "tests/data/transpose_h200.db")])


def test_options_that_name_one_study_are_refused(tmp_path):
    with pytest.raises(InputError, match="--study-name names one study"):
        run_problems(_opts(tmp_path, study_name="x"), "all", replays=list(REPLAYS.values()))
    with pytest.raises(InputError, match="--problem or --problems"):
        run_problems(_opts(tmp_path, problem="m1"), "all", replays=list(REPLAYS.values()))


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_one_header_for_every_tuned_shape(tmp_path):
    opts = _opts(tmp_path)
    out = run_problems(opts, "all", replays=list(REPLAYS.values()))
    uris = {r["problem"]: r["best"]["uri"] for r in out["problems"]}
    header = tmp_path / "gemv_tuned.h"
    export.write_header(export.open_studies(str(tmp_path / "shapes.db")), str(header))
    text = header.read_text()
    assert "// Shapes tuned (2):" in text
    assert (
        "//   m1 (M=1 N=8192 K=8192, replay:gemv_m1.db.gz)\n//   m64 (M=64 N=8192 K=8192, replay:gemv_m64.db.gz)"
        in text
    )
    assert "a shape outside them gets" in text
    main = tmp_path / "pick.cpp"
    main.write_text(
        '#include <cstdio>\n#include "gemv_tuned.h"\nnamespace g = tuned::gemv;\n'
        "int main() {\n"
        '    std::printf("%s\\n", g::select(1, 8192, 8192)->uri);\n'
        '    std::printf("%s\\n", g::select(64, 8192, 8192)->uri);\n'
        '    std::printf("%s\\n", g::select(2, 8192, 8192)->uri);\n'  # untuned: nearest is M = 1
        '    std::printf("%s\\n", g::select(48, 8192, 8192)->uri);\n'  # untuned: nearest is M = 64
        "}\n"
    )
    exe = tmp_path / "pick"
    subprocess.run(["g++", "-std=c++17", "-o", str(exe), str(main)], check=True, capture_output=True, timeout=120)
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    assert lines == [uris["m1"], uris["m64"], uris["m1"], uris["m64"]]


# ------------------------------------------------------------------------------------------------------------
# one set of processes for all problems


class RecordedChild(Evaluator):
    """A GPU worker child's evaluator that answers from the transpose H200 recording (no GPU needed)."""

    def __init__(self):
        from tuner.study.replay import ReplayEvaluator

        self.inner = ReplayEvaluator(str(ROOT / "tests" / "data" / "transpose_h200.db"), None, 0.0)
        self.ceiling_tbps = None
        self.poisoned = False

    def start(self):
        return self.inner.start()

    def set_deadline(self, deadline) -> None:
        pass

    def evaluate(self, request):
        return self.inner.evaluate(request)


def _recorded_worker(gpu_index: int, kept=None):
    """As `tuner.study.local.isolated_gpu_evaluator`: the worker a study before left in `kept`, else a new one."""
    from tuner.gpu.worker import IsolatedEvaluator

    return (kept.take(("gpu worker", gpu_index)) if kept else None) or IsolatedEvaluator(
        gpu=gpu_index, timeout_s=30.0, start_timeout_s=120.0, evaluator_factory=RecordedChild
    )


def _measure_one(pool, number: int, params) -> None:
    getattr(pool, "wait_ready", lambda: None)()  # a Ray pool is ready once made
    pool.submit(number, params)
    results = {}
    while not results:
        results.update(pool.poll(0.2))
    assert results[number].ok, results


def test_studies_within_shared_workers_keep_one_gpu_worker_and_one_set_of_compilers():
    from tuner.study.local import LocalPool
    from tuner.study.sharing import shared_workers

    space = space_mod.load("transpose")
    configs = list(space.enumerate())[:2]
    with shared_workers() as kept:
        factory = functools.partial(_recorded_worker, kept=kept)
        first = LocalPool(space, space.problem(), factory, gpus=1, arch="sm_90", compile_slots=1, kept=kept)
        _measure_one(first, 0, configs[0])
        worker, compilers = first._workers[0].evaluator, first._compilers
        pid = worker.pid
        first.close()
        assert worker.alive() and compilers is not None and not compilers.closed  # kept for the next study
        second = LocalPool(space, space.problem(), factory, gpus=1, arch="sm_90", compile_slots=1, kept=kept)
        _measure_one(second, 0, configs[1])
        assert second._workers[0].evaluator is worker and worker.pid == pid and worker.restarts == 0
        assert second._compilers is compilers
        second.close()
    assert not worker.alive() and compilers.closed  # the last study's end stops them


# ------------------------------------------------------------------------------------------------------------
# the command and the API


def _cli(*argv: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from tuner.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _one_line_error(rc: int, err: str, fragment: str) -> None:
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("tuner: error: ") and fragment in lines[0], err


def test_the_command_runs_every_problem_and_prints_a_row_each(tmp_path, monkeypatch):

    monkeypatch.chdir(tmp_path)
    argv = ["study", "gemv", "--space", SPACE, "--problems", "all", "--trials", "6", "--seed", "1"]
    rc, out, err = _cli(*argv, "--replay", REPLAYS["m64"], "--replay", REPLAYS["m1"], "--json")
    assert rc == 0, err
    summary = json.loads(out)
    assert [r["problem"] for r in summary["problems"]] == ["m1", "m64"]
    assert all(r["trials"] == 6 for r in summary["problems"])
    assert sorted(summary["studies"]) == ["m1", "m64"]
    assert (tmp_path / "studies" / "gemv.db").is_file()
    # with progress: one table, a row per problem, and each problem's progress line named
    replays = ["--replay", REPLAYS["m1"], "--replay", REPLAYS["m64"]]
    rc, out, err = _cli(*argv[:-2], "--seed", "2", "--trials", "8", *replays)
    assert rc == 0, err
    # side by side: a bar per problem, each named by its problem
    assert re.search(r"^m1 .* 8/8 ", err, re.M) and re.search(r"^m64 .* 8/8 ", err, re.M), err
    assert "gemv: 2 problems in" in err
    assert re.search(r"│ m64 +│ M=64 N=8192 K=8192 │ +\d\.\d\d TB/s │ +0\.\d{3} │ +8 │", err), err
    # one after another: each bar says which of the problems it is
    rc, out, err = _cli(
        *argv[:-2], "--seed", "3", "--trials", "5", "--one-at-a-time", "--storage", "in_turn.db", *replays
    )
    assert rc == 0, err
    assert "m1 (1/2)" in err and "m64 (2/2)" in err and "gemv: 2 problems in" in err


def test_bad_problems_and_replays_are_one_line_and_write_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    base = ["study", "gemv", "--space", SPACE, "--trials", "4"]
    rc, _, err = _cli(*base, "--problems", "m1,m3", "--replay", REPLAYS["m1"], "--replay", REPLAYS["m64"])
    _one_line_error(rc, err, "no problem 'm3' (its problems: m1, m64)")
    rc, _, err = _cli(*base, "--replay", REPLAYS["m1"], "--replay", REPLAYS["m64"])
    _one_line_error(rc, err, "--replay is given once, or once per problem with --problems")
    rc, _, err = _cli(*base, "--problems", "all", "--replay", REPLAYS["m1"])
    _one_line_error(rc, err, "no recording of problem m64")
    rc, _, err = _cli(*base, "--one-at-a-time", "--replay", REPLAYS["m1"])
    _one_line_error(rc, err, "--one-at-a-time orders the studies of several problems: give it with --problems")
    transpose = str(ROOT / "tests" / "data" / "transpose_h200.db")
    rc, _, err = _cli(*base, "--problems", "m1", "--replay", REPLAYS["m1"], "--warm-start", transpose)
    _one_line_error(rc, err, "is of another space: knobs only there: order, pad, rows_per_thread, tile")
    assert not (tmp_path / "studies").exists() or not list((tmp_path / "studies").iterdir())


def test_the_api_returns_a_result_per_problem(tmp_path):
    import tuner

    result = tuner.study(
        SPACE, 6, problems="all", replay=list(REPLAYS.values()), storage=str(tmp_path / "s.db"), seed=4
    )
    assert isinstance(result, tuner.ProblemsResult) and list(result) == ["m1", "m64"] and len(result) == 2
    for name in result:
        best = result[name].best
        assert best["params"] and result[name].study.user_attrs["problem"]["name"] == name
    # a one-problem study started from another database's studies of the same space
    warm = tuner.study(
        SPACE,
        4,
        problem="m64",
        replay=REPLAYS["m64"],
        storage=str(tmp_path / "w.db"),
        warm_start=str(tmp_path / "s.db"),
    )
    first = warm.study.get_trials(deepcopy=False)[0].params
    assert first == result["m64"].best["params"]  # the same problem elsewhere is nearest of all


def test_studies_within_shared_workers_keep_their_ray_actors():
    import functools

    import ray

    from tuner.study.cluster import Pool
    from tuner.study.replay import ReplayEvaluator
    from tuner.study.sharing import shared_workers

    space = space_mod.load("transpose")
    configs = list(space.enumerate())[:2]
    factory = functools.partial(ReplayEvaluator, str(ROOT / "tests" / "data" / "transpose_h200.db"), None, 0.0)
    try:
        with shared_workers() as kept:
            first = Pool(space, space.problem(), factory, gpus=1, logical_gpus=1, kept=kept)
            _measure_one(first, 0, configs[0])
            pid = first.gpus[0]["pid"]
            first.close()
            second = Pool(space, space.problem(), factory, gpus=1, logical_gpus=1, kept=kept)
            assert second.gpus[0]["pid"] == pid  # the same actor, not a new one
            _measure_one(second, 1, configs[1])
            actor = second.slots[0].actor
            second.close()
        # stopped when the last study ended (ray.kill is asynchronous: a call may still be answered just after it)
        deadline = time.monotonic() + 60
        with pytest.raises(ray.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray.get(actor.start.remote(), timeout=30)
                time.sleep(0.5)
    finally:
        ray.shutdown()
