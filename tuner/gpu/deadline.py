"""How long the GPU may run a config before it is taken for hung: one policy, used by every GPU worker.

A hung kernel (one thread spinning forever) is found by waiting for the GPU with a deadline. A fixed minute made
a space whose healthy configs run in 0.1 ms pay a minute per hang; the deadline here fits what is known of the
config instead (`hang_deadline_s`):

    deadline = min(ceiling_s, floor_s + runs * max(EXPECTED_SLACK * expected_s, SLOWEST_SLACK * slowest_s))

* `expected_s`: one run's expected GPU time: its bytes moved over the GPU's measured copy ceiling (plus the L2
  flush that precedes a timed run), or the family's own estimate where it has one (`expected_seconds`);
* `slowest_s`: the slowest healthy run measured so far in the study (0 before the first);
* `runs`: the runs of the config enqueued since the wait began (1 for the correctness check, the repetitions
  of a timing batch), so a finalist's long budget gets a longer deadline;
* `floor_s` (FLOOR_S): what a healthy config may take on top (a cold GPU's clocks, another process sharing the
  GPU, a first launch);
* `ceiling_s`: the user's ``--timeout``; never exceeded.

Only the GPU's execution of the user's kernel is under this deadline: the clock starts once the runs are
enqueued (`tuner.gpu.evaluator.GpuEvaluator._sync`), so the worker's start-up, a compile, loading the module (and a lazy
first load inside the launch call) and the reference are never taken for a hang. Those are bounded by the
ceiling alone (`tuner.gpu.worker.IsolatedEvaluator`, `tuner.study.cluster.Pool`).

Standard library only: the GPU worker's child imports it before CuPy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EXPECTED_SLACK",
    "FLOOR_S",
    "SLOWEST_SLACK",
    "Deadline",
    "Hung",
    "expected_seconds",
    "hang_deadline_s",
    "wait_until_done",
]

#: Seconds any config may take beyond its runs' allowance: above a worker's first launch and a cold GPU.
FLOOR_S = 1.0
#: A run may take this many times its expected time: a memory-bound config far from the copy ceiling
#: (scalar, strided or uncoalesced accesses, a tiny grid) is rarely 20x slower; 100x leaves room.
EXPECTED_SLACK = 100.0
#: A run may take this many times the slowest healthy run seen so far: early in a study few configs are known.
SLOWEST_SLACK = 10.0


def hang_deadline_s(
    expected_s: float, slowest_s: float, runs: int, *, floor_s: float = FLOOR_S, ceiling_s: float
) -> float:
    """Seconds the GPU may take to finish `runs` runs of one config before the config is taken for hung.

    Inputs: `expected_s` (one run's expected GPU seconds; 0 when unknown), `slowest_s` (the slowest healthy run
    measured so far in the study; 0 when none yet), `runs` (>= 0), `floor_s` and `ceiling_s` (the user's
    ``--timeout``). Returns ``min(ceiling_s, floor_s + runs * max(EXPECTED_SLACK * expected_s, SLOWEST_SLACK *
    slowest_s))``: never below `floor_s` unless the ceiling is, never above `ceiling_s`. A negative or non-finite
    estimate counts as unknown (0)."""
    per_run = max(EXPECTED_SLACK * _known(expected_s), SLOWEST_SLACK * _known(slowest_s))
    return min(ceiling_s, floor_s + max(0, runs) * per_run)


def _known(seconds: float) -> float:
    return seconds if seconds == seconds and 0.0 <= seconds < float("inf") else 0.0


@dataclass(frozen=True)
class Deadline:
    """What a GPU worker is told to bound its waits for a config's runs: the user's ceiling, the study's
    slowest healthy run so far, and the floor. Picklable: it crosses to the worker's process."""

    ceiling_s: float
    slowest_s: float = 0.0
    floor_s: float = FLOOR_S

    def seconds(self, expected_s: float, runs: int) -> float:
        """`hang_deadline_s` for `runs` runs of a config expected to take `expected_s` each."""
        return hang_deadline_s(expected_s, self.slowest_s, runs, floor_s=self.floor_s, ceiling_s=self.ceiling_s)

    def details(self, expected_s: float, runs: int) -> dict[str, Any]:
        """The deadline and what it came from, for a TimedOut's details."""
        return {
            "deadline_s": round(self.seconds(expected_s, runs), 6),
            "expected_s": expected_s,
            "slowest_s": self.slowest_s,
            "runs": runs,
            "floor_s": self.floor_s,
            "ceiling_s": self.ceiling_s,
        }

    def slower(self, seconds: float) -> Deadline:
        """This deadline once a healthy run of `seconds` has been measured (itself if that is no slower)."""
        if not seconds > self.slowest_s:
            return self
        return Deadline(ceiling_s=self.ceiling_s, slowest_s=seconds, floor_s=self.floor_s)


def expected_seconds(family: Any, problem: dict[str, Any], config: dict[str, Any], ceiling_tbps: float) -> float:
    """One run's expected GPU seconds: the family's ``expected_seconds(problem, config, ceiling_tbps)`` where it
    defines one (a compute-bound kernel knows better than its bytes), else its bytes moved over the copy ceiling
    (0 when neither is known)."""
    estimate = getattr(family, "expected_seconds", None)
    if callable(estimate):
        return _known(float(estimate(problem, config, ceiling_tbps)))
    if not ceiling_tbps or ceiling_tbps <= 0:
        return 0.0
    return _known(float(family.bytes_moved(problem)) / (ceiling_tbps * 1e12))


class Hung(Exception):
    """The GPU did not finish within `seconds` (`wait_until_done`); `runs`: the user's runs the wait covered."""

    def __init__(self, seconds: float, runs: int = 0):
        super().__init__(f"the GPU did not finish within {seconds:g} s")
        self.seconds, self.runs = seconds, runs


#: the longest pause between two polls of a wait: the GPU may sit idle that long after the work is done, before the
#: host enqueues the next (a config waits several times: its check, its estimate, its timed batches), and 5,000
#: polls a second of a stream's status cost the host next to nothing
POLL_MAX_S = 2e-4


def wait_until_done(
    query: Callable[[], int],
    seconds: float,
    *,
    not_ready: int,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Poll `query` (a stream's status: 0 done, `not_ready` while work is pending, anything else an error) until
    it answers something other than `not_ready`, and return that; raise `Hung` once `seconds` have passed
    since the call. Polls back off from 10 us to `POLL_MAX_S`, so a fast kernel is not made to wait and a hung
    one costs the host little."""
    deadline = clock() + seconds
    delay = 1e-5
    while True:
        status = query()
        if status != not_ready:
            return status
        if clock() > deadline:
            raise Hung(seconds)
        sleep(delay)
        delay = min(2 * delay, POLL_MAX_S)
