"""The scheduling core under the local and Ray pools (`tuner.study.scheduler`), with a transport of the test's own: the
job records, the ready queue, the slots, the in-flight count and what an answer leaves. No compile, no GPU, no
thread: the transports' own tests (tests/test_local.py, tests/test_study.py, tests/test_ray_cluster.py) run it for
real."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import pytest

from tests import fakes
from tuner.core.result import CompileFailed, TimedOut
from tuner.space import space as space_mod
from tuner.study.pool import Job
from tuner.study.scheduler import QUEUE_DEPTH, Ready, Scheduler

ROOT = Path(__file__).resolve().parents[2]
SPACE = ROOT / "search_spaces" / "transpose.yaml"


class _Transport(Scheduler):
    """Two GPUs that never run anything; compiles are kept for the test to finish."""

    def __init__(self, space, measures: bool):
        super().__init__(space, space.problem(None), compile_slots=3)
        self._measures = measures
        self.compiling: list[Job] = []

    @property
    def gpu_count(self) -> int:
        return 2

    def _compile(self, job: Job) -> None:
        self.compiling.append(job)

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return [{"gpu": "test", "gpu_index": i, "arch": "sm_90"} for i in range(2)]

    @property
    def arch(self) -> str:
        return "sm_90"

    @property
    def measures(self) -> bool:
        return self._measures

    def poll(self, timeout: float = 0.05):
        return self.collect()

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def space():
    return space_mod.load(SPACE)


def test_the_ready_queue_is_first_in_first_out_and_a_lost_workers_jobs_go_back_in_front():
    ready = Ready()
    jobs = [Job(number=i, params={}, config={}) for i in range(5)]
    for job in jobs[:3]:
        ready.put(job)
    taken = [ready.take(), ready.take()]
    ready.requeue(taken)  # sent to a worker that was lost: they run first, in their order
    ready.put(jobs[3])
    assert [ready.take(block=False).number for _ in range(len(ready))] == [0, 1, 2, 3]
    assert ready.empty()
    with pytest.raises(queue.Empty):
        ready.take(block=False)


def test_a_job_is_recorded_compiled_answered_and_counted_until_collected(space):
    pool = _Transport(space, measures=True)
    assert pool.capacity == 3 + 2 * (QUEUE_DEPTH + 1)
    assert pool.open(QUEUE_DEPTH - 1) and not pool.open(QUEUE_DEPTH)
    pool.submit(0, dict(space.default))
    pool.submit(1, dict(space.default), screening=False)
    first, finalist = pool.compiling
    assert first.source is not None and first.config and first.problem is pool.problem
    assert pool.in_flight == 2 and pool.ready.empty()
    pool.cutoff_ms = 4.0
    pool.compiled(first, type("Built", (), {"ok": True})())
    assert 0 in pool.built and pool.ready.take(block=False) is first
    request = pool.evaluation(first)
    assert request.cutoff_ms == 4.0 and request.seed is None  # screening: the cut-off in force, the pooled sets
    assert pool.evaluation(finalist).seed == pool.finalist_seed and pool.evaluation(finalist).cutoff_ms is None
    pool.answered(fakes.measurement(2.0), occupied_s=0.5)
    pool.finish(first, fakes.measurement(2.0), 1, {"host": "h", "pid": 7, "node": "local"})
    failed = CompileFailed(reason="no")
    pool.compiled(finalist, failed)  # the compile's failure is the trial's result
    assert pool.in_flight == 2  # until the driver collects them
    assert [number for number, _ in pool.poll()] == [0, 1]
    assert pool.in_flight == 0 and pool.ran_on == {0: 1} and pool.ran_by[0]["pid"] == 7
    assert pool.slowest_s == pytest.approx(2e-3) and pool.spent().evaluated == 1


def test_an_evaluator_that_does_not_measure_gets_no_compile_and_a_hang_is_recorded(space):
    pool = _Transport(space, measures=False)
    pool.submit(5, dict(space.default))
    assert not pool.compiling and len(pool.ready) == 1
    job = pool.ready.take()
    hung = TimedOut(reason="hung", details={"deadline_s": 1.5, "phase": "launch"})
    record = pool.hang(job, hung, 0, 1.23456)
    assert record == {"trial": 5, "gpu_index": 0, "cost_s": 1.235, "deadline_s": 1.5, "phase": "launch"}
    assert pool.report().hangs == [record]
