"""The hang deadline on CPUs: the policy (`tuner.gpu.deadline`), how the GPU evaluator applies it to its waits, and
what the isolated worker and the local pool do with a config that hangs: it fails at its deadline, not at the
ceiling, its worker is replaced, the configs queued behind it run, and the replacement's start-up is charged to
no config. The children here run a stand-in evaluator that waits for a "GPU" that never finishes, under the
deadline it was told, as `tuner.gpu.evaluator.GpuEvaluator` does on a real one (`tests/gpu/test_faults_gpu.py`)."""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path

import pytest

from tests import fakes
from tests.child_helpers import spy_retire
from tuner.core.result import Measurement, TimedOut
from tuner.gpu.deadline import (
    EXPECTED_SLACK,
    FLOOR_S,
    POLL_MAX_S,
    SLOWEST_SLACK,
    Deadline,
    Hung,
    expected_seconds,
    hang_deadline_s,
    wait_until_done,
)
from tuner.gpu.evaluator import GpuEvaluator
from tuner.gpu.protocol import EvaluateRequest, Evaluator
from tuner.gpu.worker import IsolatedEvaluator
from tuner.space import space as space_mod
from tuner.study.local import LocalPool
from tuner.study.replay import ReplayEvaluator

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"
SPACE = ROOT / "search_spaces" / "transpose.yaml"
NOT_READY = 600

# ------------------------------------------------------------------------------------------------------------
# the policy


def test_a_fast_config_gets_the_floor():
    # 0.1 ms healthy configs: the floor is what a hang costs, not a minute
    assert hang_deadline_s(1e-4, 1e-4, 1, ceiling_s=60.0) == pytest.approx(FLOOR_S + EXPECTED_SLACK * 1e-4)
    assert hang_deadline_s(0.0, 0.0, 1, ceiling_s=60.0) == FLOOR_S


def test_the_deadline_grows_with_the_runs_and_the_slower_of_expected_and_slowest():
    assert hang_deadline_s(1e-3, 0.0, 10, floor_s=1.0, ceiling_s=600.0) == pytest.approx(
        1.0 + 10 * EXPECTED_SLACK * 1e-3
    )
    slow = hang_deadline_s(1e-3, 0.5, 10, floor_s=1.0, ceiling_s=600.0)
    assert slow == pytest.approx(1.0 + 10 * SLOWEST_SLACK * 0.5)
    assert hang_deadline_s(1e-3, 0.5, 20, floor_s=1.0, ceiling_s=600.0) > slow


def test_the_ceiling_is_never_exceeded_and_wins_over_the_floor():
    assert hang_deadline_s(10.0, 10.0, 1000, ceiling_s=60.0) == 60.0
    assert hang_deadline_s(0.0, 0.0, 1, floor_s=1.0, ceiling_s=0.5) == 0.5


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_an_unknown_estimate_counts_as_none(bad):
    assert hang_deadline_s(bad, bad, 5, floor_s=1.0, ceiling_s=60.0) == 1.0
    assert hang_deadline_s(0.01, 0.0, -3, floor_s=1.0, ceiling_s=60.0) == 1.0  # no runs: the floor


def test_a_deadline_learns_a_slower_healthy_run_only():
    deadline = Deadline(ceiling_s=60.0, slowest_s=0.2)
    assert deadline.slower(0.1) is deadline
    assert deadline.slower(0.3) == Deadline(ceiling_s=60.0, slowest_s=0.3)
    details = deadline.details(1e-3, 2)
    assert details["deadline_s"] == pytest.approx(deadline.seconds(1e-3, 2))
    assert details["runs"] == 2 and details["ceiling_s"] == 60.0 and details["floor_s"] == FLOOR_S


class _Bytes:
    def bytes_moved(self, problem):
        return problem["n"] * 8


class _Estimated(_Bytes):
    def expected_seconds(self, problem, config, ceiling_tbps):
        return 0.25


def test_expected_time_is_bytes_over_the_ceiling_or_the_familys_estimate():
    assert expected_seconds(_Bytes(), {"n": 1 << 20}, {}, 4.0) == pytest.approx((1 << 23) / 4e12)
    assert expected_seconds(_Bytes(), {"n": 1 << 20}, {}, 0.0) == 0.0  # no ceiling measured
    assert expected_seconds(_Estimated(), {"n": 1}, {}, 4.0) == 0.25


def test_waiting_returns_the_first_answer_and_gives_up_past_the_deadline():
    answers = iter([NOT_READY, NOT_READY, 0])
    assert wait_until_done(lambda: next(answers), 1.0, not_ready=NOT_READY) == 0
    assert wait_until_done(lambda: 700, 1.0, not_ready=NOT_READY) == 700  # an error: the caller raises it
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    with pytest.raises(Hung) as info:
        wait_until_done(lambda: NOT_READY, 0.5, not_ready=NOT_READY, clock=lambda: now[0], sleep=sleep)
    assert info.value.seconds == 0.5 and 0.5 < now[0] < 0.502
    assert slept[0] == 1e-5 and max(slept) == POLL_MAX_S  # backs off from 10 us to 0.2 ms


# ------------------------------------------------------------------------------------------------------------
# the GPU evaluator's waits (no CUDA touched)


def test_only_waits_behind_the_users_runs_are_under_the_tight_deadline():
    evaluator = GpuEvaluator()
    assert evaluator._wait_limit(1) is None  # no deadline told: a hang blocks, the parent kills at its ceiling
    deadline = Deadline(ceiling_s=60.0, slowest_s=0.01)
    evaluator.set_deadline(deadline)
    evaluator._expected_s = 1e-4
    assert evaluator._wait_limit(0) == 60.0  # inputs, a reference: our own work, bounded by the ceiling only
    assert evaluator._wait_limit(1) == deadline.seconds(1e-4, 1) < 2.0
    assert evaluator._wait_limit(50) == deadline.seconds(1e-4, 50)
    assert GpuEvaluator(hang_timeout_s=2.0)._wait_limit(1) == 2.0  # a fixed bound asked for


def test_a_wait_given_up_is_a_sticky_timeout_that_poisons_the_evaluator():
    evaluator = GpuEvaluator()
    evaluator.set_deadline(Deadline(ceiling_s=60.0))
    evaluator._expected_s = 1e-4
    failure = evaluator._hung(Hung(1.01, runs=1), "launch")
    assert isinstance(failure, TimedOut) and failure.details["sticky"] is True
    assert failure.details["phase"] == "launch" and failure.details["runs"] == 1
    assert failure.details["deadline_s"] == pytest.approx(1.01) and "1.01 s" in failure.reason
    assert evaluator.poisoned and evaluator.poisoned_by is failure


# ------------------------------------------------------------------------------------------------------------
# the isolated worker: a stand-in evaluator in a real child


def _spin(deadline: Deadline | None, expected_s: float = 0.0) -> TimedOut:
    """What GpuEvaluator does with a kernel that never ends: wait for it under the deadline, then give up."""
    assert deadline is not None, "the child was told no deadline"
    seconds = deadline.seconds(expected_s, 1)
    try:
        wait_until_done(lambda: NOT_READY, seconds, not_ready=NOT_READY)
    except Hung:
        pass
    return TimedOut(
        reason=f"launch: the GPU did not finish within {seconds:g} s",
        details={"sticky": True, "phase": "launch", **deadline.details(expected_s, 1)},
    )


class DeadlineChild(Evaluator):
    """The child's evaluator: ``config["mode"]`` "ok" answers a Measurement of ``config["p80_ms"]`` whose uri names
    the deadline it was told; "spin" hangs under that deadline. `start_s`: how long every start takes."""

    def __init__(self, start_s: float = 0.0):
        self.start_s = start_s
        self.poisoned = False
        self.deadline: Deadline | None = None
        self.ceiling_tbps = 4.0

    def start(self):
        time.sleep(self.start_s)
        return {"gpu": "fake", "arch": "sm_90", "ceiling_tbps": self.ceiling_tbps, "pid": os.getpid()}

    def set_deadline(self, deadline: Deadline) -> None:
        self.deadline = deadline

    def evaluate(self, request):
        config = request.config
        if config["mode"] == "spin":
            self.poisoned = True
            return _spin(self.deadline)
        told = self.deadline
        return fakes.measurement(
            config.get("p80_ms", 1.0), f"{told.ceiling_s}:{told.slowest_s}:{told.floor_s}" if told else "none"
        )


def _request(config: dict) -> EvaluateRequest:
    return EvaluateRequest(None, "copy", config, {"n": 1})


def _isolated(**kwargs) -> IsolatedEvaluator:
    kwargs.setdefault("evaluator_factory", DeadlineChild)
    return IsolatedEvaluator(start_timeout_s=60.0, **kwargs)


def test_the_child_is_told_the_deadline_and_the_slowest_healthy_run_so_far():
    with _isolated(timeout_s=30.0, floor_s=0.5) as evaluator:
        first = evaluator.evaluate(_request({"mode": "ok", "p80_ms": 40.0}))
        assert first.uri == "30.0:0.0:0.5"
        second = evaluator.evaluate(_request({"mode": "ok", "p80_ms": 1.0}))
        assert second.uri == "30.0:0.04:0.5"  # the first run's p80, in seconds
        evaluator.note_healthy(0.1)  # another GPU's slower run
        assert evaluator.evaluate(_request({"mode": "ok"}), timeout_s=5.0).uri == "5.0:0.1:0.5"


def test_a_hang_fails_at_its_deadline_and_the_replacement_hears_the_deadline(monkeypatch):
    with _isolated(timeout_s=30.0, floor_s=0.5) as evaluator:
        evaluator.evaluate(_request({"mode": "ok", "p80_ms": 2.0}))
        hung_pid = evaluator.pid
        kills = spy_retire(monkeypatch)
        result = evaluator.evaluate(_request({"mode": "spin"}))
        assert isinstance(result, TimedOut) and result.details["sticky"] is True
        assert result.details["deadline_s"] == pytest.approx(0.5 + SLOWEST_SLACK * 0.002)
        # the child's own deadline ended it, not the parent's 30 s ceiling (whose TimedOut names its timeout_s)
        assert "timeout_s" not in result.details and "within 30 s" not in result.reason
        assert kills == [True] and not evaluator.alive()  # killed at once: its kernel would never have ended
        after = evaluator.evaluate(_request({"mode": "ok"}))
        assert after.uri == "30.0:0.002:0.5" and evaluator.pid != hung_pid and evaluator.restarts == 1


def test_the_replacements_start_up_is_charged_to_no_deadline():
    # every start takes 3 s, longer than the whole 2 s ceiling: the config after a hang still answers
    with _isolated(timeout_s=2.0, floor_s=0.3, evaluator_kwargs={"start_s": 3.0}) as evaluator:
        assert isinstance(evaluator.evaluate(_request({"mode": "spin"})), TimedOut)
        assert isinstance(evaluator.evaluate(_request({"mode": "ok"})), Measurement)
        assert evaluator.restarts == 1


# ------------------------------------------------------------------------------------------------------------
# the local pool: a hang among queued configs


class SpinningReplay(Evaluator):
    """The child's evaluator for the pool: answers from the H200 recording, except that configs matching one of
    `hang` (params) spin under the deadline as a hung kernel would. Every start takes `start_s`."""

    def __init__(self, hang: list[dict], start_s: float = 0.0):
        self.inner = ReplayEvaluator(RECORDING, None, 0.0)
        self.hang, self.start_s = hang, start_s
        self.ceiling_tbps = None
        self.poisoned = False
        self.deadline: Deadline | None = None

    def start(self):
        time.sleep(self.start_s)
        return self.inner.start()

    def set_deadline(self, deadline: Deadline) -> None:
        self.deadline = deadline

    def evaluate(self, request):
        if any(all(request.config.get(k) == v for k, v in params.items()) for params in self.hang):
            self.poisoned = True
            return _spin(self.deadline)
        return self.inner.evaluate(request)


@contextlib.contextmanager
def _spinning_pool(space, hang: list[dict], gpus: int, timeout_s: float, start_s: float):
    def factory(gpu_index: int):
        return IsolatedEvaluator(
            gpu=gpu_index,
            timeout_s=timeout_s,
            start_timeout_s=120.0,
            evaluator_factory=SpinningReplay,
            evaluator_kwargs={"hang": hang, "start_s": start_s},
            floor_s=0.3,
        )

    pool = LocalPool(space, space.problem(), factory, gpus=gpus, arch="sm_90")
    try:
        yield pool
    finally:
        pool.close()


def _drain(pool: LocalPool, want: int, limit_s: float = 180.0) -> dict[int, object]:
    results: dict[int, object] = {}
    deadline = time.time() + limit_s
    while len(results) < want and time.time() < deadline:
        results.update(pool.poll(0.2))
    assert len(results) == want, results
    return results


def test_configs_queued_behind_a_hang_run_and_only_the_hung_ones_fail(tmp_path, monkeypatch):
    """Five configs on one GPU (and a sixth after them), the first and the fourth hang. The ceiling (1.5 s) is
    shorter than a worker's start (2 s): a start-up charged to the config after a hang would make it time out too."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    space = space_mod.load(SPACE)
    configs = list(space.enumerate())[:6]
    hang = [configs[0], configs[3]]
    with _spinning_pool(space, hang, gpus=1, timeout_s=1.5, start_s=2.0) as pool:
        pool.wait_ready()
        for number, params in enumerate(configs[:5]):
            pool.submit(number, params)
        results = _drain(pool, 5)
        # Configs run in the order their compiles finish, so a hang may come last; a replacement is started
        # before the next config, so one more config, after all five, makes both replacements start.
        pool.submit(5, configs[5])
        results.update(_drain(pool, 1))
        assert {n for n, r in results.items() if not r.ok} == {0, 3}, results
        assert all(results[n].kind == "timed_out" for n in (0, 3))
        assert all(results[n].details["deadline_s"] < 1.5 for n in (0, 3))
        worker = pool._workers[0].evaluator
        assert worker.restarts == 2
        assert worker.slowest_s > 0  # the healthy runs measured so far lengthen the deadlines after them
        assert pool.slowest_s == max(results[n].p80_ms for n in (1, 2, 4, 5)) / 1e3
        # what each hang cost, for the study's summary (in the order the configs' compiles finished: not always 0, 3)
        assert sorted(hang["trial"] for hang in pool.hangs) == [0, 3]
        assert all(hang["cost_s"] < 1.5 and hang["phase"] == "launch" for hang in pool.hangs)
        assert len(pool.replacements_s) == 2 and min(pool.replacements_s) >= 2.0  # timed apart from any config


def test_a_hang_measured_ahead_of_the_driver_is_charged_to_the_trial_that_claims_it(tmp_path, monkeypatch):
    """A config prefetched with evaluate=True runs before any trial takes it (its job's number is -1): its hang
    is recorded under the trial that submits it, not under -1."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    space = space_mod.load(SPACE)
    (params,) = list(space.enumerate())[:1]
    with _spinning_pool(space, [params], gpus=1, timeout_s=1.5, start_s=0.5) as pool:
        pool.wait_ready()
        pool.prefetch(params, "sm_90", evaluate=True)
        deadline = time.time() + 60
        while not pool.hangs and time.time() < deadline:  # measured (and hung) before the driver asks for it
            time.sleep(0.05)
        assert [hang["trial"] for hang in pool.hangs] == [None]
        pool.submit(7, params)
        results = _drain(pool, 1)
        assert results[7].kind == "timed_out"
        assert [hang["trial"] for hang in pool.hangs] == [7]
