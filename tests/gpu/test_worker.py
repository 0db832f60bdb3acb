"""The isolated GPU worker (`tuner.gpu.worker.IsolatedEvaluator`) on the CPU: a fake evaluator in a real spawned
child hangs, dies, poisons itself or raises, and the same `IsolatedEvaluator` goes on with a fresh child each
time; the request that crosses its pipe is a value that pickles."""

from __future__ import annotations

import dataclasses
import os
import pickle
import time

import pytest

from tests import fakes
from tests.child_helpers import spy_retire
from tests.gpu.test_evaluate import Toy
from tuner.core.result import LaunchFailed, Measurement, TimedOut
from tuner.gpu.protocol import EvaluateRequest, Evaluator
from tuner.gpu.worker import IsolatedEvaluator, WorkerError


class FakeEvaluator(Evaluator):
    """Stands in for GpuEvaluator in the child; `config["mode"]` picks what goes wrong."""

    def __init__(self, fail_start: bool = False):
        if fail_start:
            raise RuntimeError("no GPU for you")
        self.poisoned = False
        self.ceiling_tbps = 4.2

    def start(self):
        return {"gpu": "fake", "arch": "sm_90", "ceiling_tbps": self.ceiling_tbps, "pid": os.getpid()}

    def evaluate(self, request):
        mode = request.config["mode"]
        if mode == "hang":
            time.sleep(3600)
        if mode == "die":
            os._exit(7)
        if mode == "sticky":
            self.poisoned = True
            return LaunchFailed(
                reason="launch: CUDA error 700 (illegal address)", details={"status": 700, "sticky": True}
            )
        if mode == "bug":
            raise ZeroDivisionError("a bug in the evaluator")
        family = request.family
        family_seen = family if isinstance(family, str) else type(family).__name__
        return fakes.measurement(uri=f"{family_seen}:{os.getpid()}")


def _gone(pid: int) -> bool:
    """The process has exited and been reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _isolated(**kwargs) -> IsolatedEvaluator:
    return IsolatedEvaluator(evaluator_factory=FakeEvaluator, start_timeout_s=60.0, **kwargs)


def _ok(evaluator, family="copy"):
    result = evaluator.evaluate(EvaluateRequest(None, family, {"mode": "ok"}, {"n": 1}))
    assert isinstance(result, Measurement), result
    return result


def test_an_evaluate_request_is_a_value_that_pickles():
    # what crosses the worker's pipe and Ray, as it is
    request = EvaluateRequest(None, Toy(), {"mode": "ok"}, {"n": 1}, seed=5, cutoff_ms=1.5)
    again = pickle.loads(pickle.dumps(request))
    assert (again.config, again.problem, again.seed, again.budget_ms, again.min_reps) == (
        {"mode": "ok"},
        {"n": 1},
        5,
        25.0,
        10,
    )
    assert again.cutoff_ms == 1.5 and type(again.family) is Toy
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.seed = 6  # type: ignore[misc]


def test_worker_answers_and_stays_alive_across_calls():
    with _isolated(timeout_s=30.0) as evaluator:
        assert evaluator.start()["gpu"] == "fake"
        first = _ok(evaluator)
        second = _ok(evaluator, family=Toy())  # an unregistered family crosses pickled
        assert first.uri == f"copy:{evaluator.pid}"  # a registered family crosses by name
        assert second.uri == f"Toy:{evaluator.pid}"
        assert evaluator.ceiling() == 4.2
        assert evaluator.restarts == 0
        pid = evaluator.pid
    assert _gone(pid)


def test_worker_hang_times_out_and_a_fresh_child_takes_over(monkeypatch):
    with _isolated(timeout_s=1.0) as evaluator:
        evaluator.start()
        hung_pid = evaluator.pid
        kills = spy_retire(monkeypatch)
        result = evaluator.evaluate(EvaluateRequest(None, "copy", {"mode": "hang"}, {"n": 1}))
        assert isinstance(result, TimedOut) and "1 s" in result.reason
        assert result.details["timeout_s"] == 1.0
        # cut at its 1 s bound: the child, an hour into its sleep, was killed rather than waited for
        assert kills == [True] and _gone(hung_pid)
        assert _ok(evaluator).uri.endswith(str(evaluator.pid)) and evaluator.pid != hung_pid
        assert evaluator.restarts == 1


def test_worker_death_is_a_launch_failure_and_a_fresh_child_takes_over():
    with _isolated(timeout_s=30.0) as evaluator:
        evaluator.start()
        dead_pid = evaluator.pid
        result = evaluator.evaluate(EvaluateRequest(None, "copy", {"mode": "die"}, {"n": 1}))
        assert isinstance(result, LaunchFailed) and result.reason.startswith("worker died")
        assert result.details["exitcode"] == 7
        _ok(evaluator)
        assert evaluator.pid != dead_pid


def test_sticky_failure_retires_the_child_and_the_next_call_succeeds():
    with _isolated(timeout_s=30.0) as evaluator:
        evaluator.start()
        poisoned_pid = evaluator.pid
        result = evaluator.evaluate(EvaluateRequest(None, "copy", {"mode": "sticky"}, {"n": 1}))
        assert isinstance(result, LaunchFailed) and result.details["sticky"] is True
        assert not evaluator.alive() and _gone(poisoned_pid)
        _ok(evaluator)
        assert evaluator.pid != poisoned_pid


def test_a_bug_in_the_child_raises_and_the_next_call_succeeds():
    with _isolated(timeout_s=30.0) as evaluator:
        with pytest.raises(WorkerError, match="ZeroDivisionError") as info:
            evaluator.evaluate(EvaluateRequest(None, "copy", {"mode": "bug"}, {"n": 1}))
        assert "Traceback" in info.value.remote
        _ok(evaluator)


def test_a_child_that_cannot_start_raises():
    evaluator = _isolated(timeout_s=30.0, evaluator_kwargs={"fail_start": True})
    with pytest.raises(WorkerError, match="no GPU for you"):
        evaluator.start()
    assert not evaluator.alive()
    evaluator.close()


def test_close_stops_the_child():
    evaluator = _isolated(timeout_s=30.0)
    evaluator.start()
    pid = evaluator.pid
    evaluator.close()
    assert _gone(pid) and not evaluator.alive() and evaluator.pid is None
