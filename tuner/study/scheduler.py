"""The scheduling core of the pools that compile and evaluate on GPUs: what the local and Ray transports share.

`Scheduler` is a `tuner.study.pool.Pool` that keeps every rule of a pool that sends configs to GPUs, so that a
transport (`tuner.study.local.LocalPool`: threads and worker processes on this machine; `tuner.study.cluster.Pool`:
Ray tasks and actors) keeps only how a job reaches a GPU and how its result comes back. The core gives:

* the job records: `submit` turns the driver's (number, params) into a `Job` (its config resolved for its problem,
  its source rendered; no compile for evaluators that do not measure), `compiled` files a compile's outcome (the
  trial's build kept, then the job made ready; or the compile's failure as the trial's result), `finish` an
  evaluation's (the GPU and worker that answered, the result queued for the driver), `hang` what a hung config cost;
* what runs next: `ready`, one first-in-first-out queue of the jobs ready to run, shared by every GPU (a job taken
  back from a lost worker goes to its front: it was sent first);
* which slot is free: a GPU is sent at most `QUEUE_DEPTH` jobs at a time, the one it runs included (`open`), and
  `capacity`, the configs worth having in flight, is the compile slots plus ``QUEUE_DEPTH + 1`` per GPU (the rest
  wait in `ready`, so a GPU never waits for the driver); `in_flight` counts the jobs submitted and not yet
  returned by `collect`;
* each evaluation's request, its seed and its cut-off (`evaluation`, over `Pool.request`), and what an answer
  leaves (`answered`): its cost, and the slowest healthy run that every later hang deadline allows for;
* what the work cost (`account`, `account_compile`, `spent`), safe to call from any thread.

A transport implements `gpu_count` (its GPUs) and `_compile(job)` (start compiling ``job.source`` for `arch`, then
call `compiled` with the result, from any thread, and `account_compile` with its wall); it takes the jobs of `ready`
to its GPUs its own way (the local pool's GPU threads take them as they come free; Ray's `poll` sends them to the
actors with an `open` slot), sends each `evaluation(job)`, and hands each answer to `answered` and `finish`. Its
`poll` returns `collect`'s results; `done` is the queue they come through (a transport may put an exception there: a
bug in compiling, raised by `collect`). Besides `Pool`'s members it gives `gpus`, `arch`, `measures` and `close`.
"""

from __future__ import annotations

import collections
import queue
import threading
from abc import abstractmethod
from collections.abc import Iterable
from typing import Any

from tuner.build.render import render
from tuner.core.result import Result, TimedOut
from tuner.gpu.protocol import EvaluateRequest, Spent
from tuner.study.pool import Job, Pool

__all__ = ["QUEUE_DEPTH", "Ready", "Scheduler"]

#: Jobs queued for a GPU beyond the one it runs: hides the driver's round trip between two configs.
QUEUE_DEPTH = 2


class Ready:
    """The jobs ready to run, first in, first out, shared by every GPU of a pool. Thread-safe: a GPU thread may
    wait in `take`; None put in it tells one waiting thread to stop."""

    def __init__(self) -> None:
        self._jobs: collections.deque[Job | None] = collections.deque()
        self._changed = threading.Condition()

    def put(self, job: Job | None) -> None:
        with self._changed:
            self._jobs.append(job)
            self._changed.notify()

    def requeue(self, jobs: Iterable[Job]) -> None:
        """Put `jobs` back in front, in their order: they were taken first (from a worker that was lost)."""
        with self._changed:
            self._jobs.extendleft(reversed(list(jobs)))
            self._changed.notify_all()

    def take(self, block: bool = True) -> Job | None:
        """The next job (None: stop), waiting for one if `block`; `queue.Empty` when there is none and not."""
        with self._changed:
            while not self._jobs:
                if not block:
                    raise queue.Empty
                self._changed.wait()
            return self._jobs.popleft()

    def empty(self) -> bool:
        return not self._jobs

    def __len__(self) -> int:
        return len(self._jobs)


class Scheduler(Pool):
    """The core of a pool that compiles and evaluates on GPUs (module docstring); a transport subclasses it."""

    def __init__(self, space, problem, compile_slots: int) -> None:
        """`space` is the study's loaded space (its family renders and its configs resolve), `problem` the pool's
        own problem, `compile_slots` how many compiles may run at once."""
        super().__init__(problem)
        self.space = space
        self.family = space.family  # shipped, entry-point or the space's own (declarative or a file of the user's)
        self.compile_slots: int = compile_slots
        self.ready = Ready()
        #: finished configs, in the order they finished; an exception in place of a Result is a bug in compiling
        self.done: queue.SimpleQueue[tuple[int, Result | BaseException]] = queue.SimpleQueue()
        self.replaced = 0
        self._queued = 0  # submitted and not yet returned by `collect`
        #: what the evaluations and compiles cost so far (see `spent`); GPU and compile threads add to it
        self._spent = Spent()
        self._spent_lock = threading.Lock()

    # -- what a transport implements --------------------------------------------------------------------------
    @property
    @abstractmethod
    def gpu_count(self) -> int:
        """The GPUs (workers, actors) the pool evaluates on."""

    @abstractmethod
    def _compile(self, job: Job) -> None:
        """Start compiling ``job.source`` for `arch`; its result goes to `compiled` (from any thread)."""

    # -- what the driver reads --------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Configs in flight that keep every compile slot and every GPU busy."""
        return self.compile_slots + self.gpu_count * (QUEUE_DEPTH + 1)

    @property
    def in_flight(self) -> int:
        return self._queued

    @staticmethod
    def open(queued: int) -> bool:
        """Whether a GPU with `queued` jobs sent to it (the one it runs included) takes one more."""
        return queued < QUEUE_DEPTH

    # -- the job records --------------------------------------------------------------------------------------
    def submit(
        self,
        number: int,
        params: dict[str, Any],
        budget_ms: float = 25.0,
        screening: bool = True,
        problem: Any = None,
        owner: Any = None,
    ) -> None:
        """Queue a config; `budget_ms` of timed work on the GPU (screening default; finalists get more). A
        screening job is timed under the pool's `cutoff_ms` as it stands when its evaluation starts. `problem`
        and `owner` (a `tuner.study.sidebyside` share, whose `cutoff_ms` then applies and which is told what the
        job costs) are given for a job of another problem of the space than the pool's own."""
        problem = problem or self.problem
        config = self.space.resolve(params, problem)
        job = Job(
            number=number,
            params=params,
            config=config,
            budget_ms=budget_ms,
            screening=screening,
            problem=problem,
            owner=owner,
        )
        self._queued += 1
        if not self.measures:  # it answers without running the kernel: nothing to compile
            self.ready.put(job)
            return
        job.source = render(self.family, params, config, problem.env)
        self._compile(job)

    def compiled(self, job: Job, result: Any) -> None:
        """A compile's outcome: the job's build kept (a screening trial's is its artifact) and the job ready to
        run; or the compile's failure as the trial's result."""
        if result.ok:
            job.compiled = result
            if job.number >= 0:
                self.built[job.number] = (job.source, result)
            self.ready.put(job)
        else:
            self.done.put((job.number, result))

    def evaluation(self, job: Job) -> EvaluateRequest:
        """What `job`'s evaluator is sent as it starts (`Pool.request`). The family travels by reference (a
        user's family is imported again where it runs); the cut-off is read now, not at submit: results that
        came in while the job waited count."""
        return self.request(job, self.space.family_ref or self.family)

    def finish(self, job: Job, result: Result, gpu_index: int, worker: dict[str, Any] | None = None) -> None:
        """`job` answered `result` on GPU `gpu_index`, by `worker` ({"host", "pid", "node"}) where known: recorded
        for the driver, and the result queued for `collect`."""
        self.ran_on[job.number] = gpu_index
        if worker is not None:
            self.ran_by[job.number] = worker
        self.done.put((job.number, result))

    def hang(self, job: Job, result: TimedOut, gpu_index: int, cost_s: float) -> dict[str, Any]:
        """Record what a hung config cost its GPU, for the study's summary; the record is returned (a speculative
        job's trial is filled in when a trial claims it: None till then)."""
        record = {
            "trial": job.number if job.speculation is None else None,
            "gpu_index": gpu_index,
            "cost_s": round(cost_s, 3),
            "deadline_s": result.details.get("deadline_s", result.details.get("timeout_s")),
            "phase": result.details.get("phase"),
        }
        self.hangs.append(record)
        return record

    def collect(self, timeout: float | None = None) -> list[tuple[int, Result]]:
        """The results finished since the last call, in the order they finished; waits up to `timeout` for the
        first (None: not at all). An exception in their place (a bug in compiling) is raised."""
        got = []
        try:
            got.append(self.done.get_nowait() if timeout is None else self.done.get(timeout=timeout))
            while True:
                got.append(self.done.get_nowait())
        except queue.Empty:
            pass
        self._queued -= len(got)
        out: list[tuple[int, Result]] = []
        for number, result in got:
            if isinstance(result, BaseException):
                raise result
            out.append((number, result))
        return out

    # -- what the work cost -----------------------------------------------------------------------------------
    def answered(self, result: Result, occupied_s: float = 0.0, owner: Any = None) -> None:
        """An evaluator answered `result` after `occupied_s` of work: counted (`account`), and a healthy run's
        time kept if it is the slowest yet (`Pool.note`: every later hang deadline allows for it)."""
        self.account(result, occupied_s, owner)
        self.note(result)

    def account(self, result: Result, occupied_s: float = 0.0, owner: Any = None) -> None:
        """Count a result its evaluator returned after `occupied_s` of work (in `owner`'s costs too)."""
        with self._spent_lock:
            self._spent.add(result, occupied_s)
        if owner is not None:
            owner.add(result, occupied_s)

    def account_compile(self, elapsed_s: float, owner: Any = None) -> None:
        """Count a compile's wall (in `owner`'s costs too)."""
        with self._spent_lock:
            self._spent.add_compile(elapsed_s)
        if owner is not None:
            owner.add_compile(elapsed_s)

    def spent(self) -> Spent:
        """What the pool's evaluations and compiles have cost so far (a copy: the threads go on adding)."""
        with self._spent_lock:
            return self._spent.copy()
