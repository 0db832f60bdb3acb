"""Studies of several problems of one space side by side, over one pool (``tuner study KERNEL --problems``).

A 30-trial study over the H200 host's whole pool (16 compile processes and a GPU queue: 19 configs in flight)
sends its first 19 proposals before any result is back, so most of its search is drawn blind. Run one after
another, the problems of a space each take the whole pool in turn; run side by side, they share it: each study
keeps only its share of the configs in flight (`Share.capacity`: the pool's width over the studies still
searching), so its sampler learns from most of its results before it proposes again, while the pool as a whole
stays as busy as for one study. As studies end, the others' shares grow.

One thread steps every study's driver in turn (`tuner.study.driver.Driver.steps`), so a seeded replay asks and tells
in the same order on every run. Each driver sees its `Share` as its pool; the shares pass their configs to one
backend, which answers them in the order it finishes them:

`LocalBackend`: the local engine's `tuner.study.local.LocalPool` (GPU workers and compile processes), each job
carrying its own problem and its share's screening cut-off. A replay's pool answers each problem from its own
recording (`ProblemReplays`), in the driver's thread and first in, first out across all studies, as the workers
of one pool would answer them.

Live transfer (`run_side_by_side`): when a study finds a new best config, the studies whose nearest problems
(`tuner.study.shapes.neighbours`, in log space of the sizes) include its problem measure that config next, up to
`TRANSFER_LIMIT` configs each (`tuner.study.driver.Driver.offer`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from tuner.core.result import Result
from tuner.gpu.protocol import EvaluateRequest, Evaluator, Spent
from tuner.study.pool import Pool, Report
from tuner.study.replay import ReplayEvaluator, gpu_label

__all__ = ["TRANSFER_LIMIT", "LocalBackend", "ProblemReplays", "Share", "run_side_by_side"]

#: the most configs another problem's study queues in a study while they run side by side
TRANSFER_LIMIT = 5


class Share(Pool):
    """One study's share of a backend's pool: the driver's pool (`tuner.study.pool.Pool`). Its trial numbers are its
    own; its `capacity` is its share of the backend's width (see the module docstring); its `problem` is the one
    its jobs run on (the study sets its GPU's facts on it as it opens) and its `cutoff_ms` the one they are timed
    under."""

    def __init__(self, backend: LocalBackend, problem):
        super().__init__(problem)
        self.backend = backend
        self.inbox: deque[tuple[int, Result]] = deque()
        self._costs = Spent()  # what this study's configs cost: the pool's GPU and compile threads add to it
        self._costs_lock = threading.Lock()
        self.outstanding = 0  # submitted, not yet polled
        self.closed = False

    # the pool's own figures: one pool, one set of GPUs for all the studies
    @property
    def gpus(self) -> list[dict[str, Any]]:
        return self.backend.gpus_of(self)

    @property
    def measures(self) -> bool:
        return self.backend.pool.measures

    @property
    def arch(self) -> str:
        return self.backend.pool.arch

    def report(self) -> Report:
        """The pool's figures, with the hangs of this study's configs alone (under this study's trial numbers)."""
        return dataclasses.replace(self.backend.pool.report(), hangs=self.backend.hangs_of(self))

    @property
    def in_flight(self) -> int:
        return self.outstanding

    @property
    def capacity(self) -> int:
        """Configs this study may have in flight: its even share of the backend's width among the studies still
        searching (at least one), and no more than the backend has free."""
        backend = self.backend
        # The studies not made yet count too: the first study made does not take the whole pool.
        active = max(1, backend.studies - sum(1 for s in backend.shares if s.closed))
        fair = max(1, math.ceil(backend.width / active))
        return min(fair, self.outstanding + max(0, backend.width - backend.in_flight))

    def submit(self, number: int, params: dict[str, Any], budget_ms: float = 25.0, screening: bool = True) -> None:
        self.outstanding += 1
        self.backend.submit(self, number, params, budget_ms, screening)

    def poll(self, timeout: float = 0.05) -> list[tuple[int, Result]]:
        """This study's results in; waits up to `timeout` for the backend's next result when it has none (another
        study's result goes to that study's inbox)."""
        if not self.inbox:
            self.backend.pump(timeout)
        out = list(self.inbox)
        self.inbox.clear()
        self.outstanding -= len(out)
        return out

    def spent(self) -> Spent:
        """What this study's configs have cost so far (a copy)."""
        with self._costs_lock:
            return self._costs.copy()

    def add(self, result: Result, occupied_s: float = 0.0) -> None:
        """In a GPU thread: count one of this study's results (`tuner.study.local.LocalPool.account`)."""
        with self._costs_lock:
            self._costs.add(result, occupied_s)

    def add_compile(self, elapsed_s: float) -> None:
        """In a compile thread: count one of this study's compiles."""
        with self._costs_lock:
            self._costs.add_compile(elapsed_s)

    def close(self) -> None:
        """This study is done with its share (the backend goes on for the others). A config still out (a study
        stopped by a fault) no longer holds a place in the pool's width."""
        self.closed = True
        self.outstanding = 0


class LocalBackend:
    """The local engine's pool (`tuner.study.local.LocalPool`) under several problems' studies: their shares, the
    pool's width, and each outstanding config's owner under a number of the backend's own."""

    def __init__(self, pool, studies: int, width: int | None = None, recordings: dict[str, str] | None = None) -> None:
        """`studies`: how many studies will share `pool` (`Share.capacity`); `width`: configs in flight over
        all of them (default: the pool's capacity); `recordings`: for replays, the recording of each problem
        (its study is named after it)."""
        self.pool = pool
        self.studies = studies
        self.width = width or pool.capacity
        self.labels = {name: gpu_label(path) for name, path in (recordings or {}).items()}
        self.shares: list[Share] = []
        self.owners: dict[int, tuple[Share, int]] = {}  # outstanding configs
        self.numbered: dict[int, tuple[Share, int]] = {}  # every config submitted (a hang is told by number)
        self.numbers = itertools.count()

    def share(self, space, problem) -> Share:
        """A new study's share (`tuner.study.opening.Prelude.pool`); `space` is the pool's already (one space file
        for every study)."""
        share = Share(self, problem)
        self.shares.append(share)
        return share

    @property
    def in_flight(self) -> int:
        return sum(s.outstanding for s in self.shares)

    def _own(self, share: Share, number: int) -> int:
        ours = next(self.numbers)
        self.owners[ours] = self.numbered[ours] = (share, number)
        return ours

    def gpus_of(self, share: Share) -> list[dict[str, Any]]:
        """The pool's GPUs, as `share`'s study sees them: a replayed problem's GPU names its own recording."""
        label = self.labels.get(share.problem.name)
        return [{**g, "gpu": label} if label else g for g in self.pool.gpus]

    def submit(self, share: Share, number: int, params: dict[str, Any], budget_ms: float, screening: bool) -> None:
        ours = self._own(share, number)
        self.pool.submit(ours, params, budget_ms, screening, problem=share.problem, owner=share)

    def pump(self, timeout: float) -> None:
        pool = self.pool
        for ours, result in pool.poll(timeout):
            share, number = self.owners.pop(ours)
            # Where it ran and what was built go with the result, under the study's own trial number.
            if ours in pool.ran_on:
                share.ran_on[number] = pool.ran_on.pop(ours)
            if ours in pool.ran_by:
                share.ran_by[number] = pool.ran_by.pop(ours)
            if ours in pool.built:
                built = pool.built.pop(ours)
                if number >= 0:  # a finalist's build is not kept (a screening trial's is its artifact)
                    share.built[number] = built
            share.inbox.append((number, result))

    def hangs_of(self, share: Share) -> list[dict[str, Any]]:
        mine = []
        for hang in self.pool.hangs:
            owner, number = self.numbered.get(hang.get("trial"), (None, None))
            if owner is share:
                mine.append({**hang, "trial": number})
        return mine

    def close(self) -> None:
        self.pool.close()


class ProblemReplays(Evaluator):
    """An evaluator that answers each problem's configs from that problem's recording (`ReplayEvaluator`), by
    the sizes the request names: the replay of several problems over one pool."""

    measures = False

    def __init__(self, problems: Sequence[Any], recordings: dict[str, str], study_name: str | None = None):
        self.evaluators = [
            (dict(p.sizes), ReplayEvaluator(recordings[p.name], study_name)) for p in problems if p.name in recordings
        ]

    def start(self) -> dict[str, Any]:
        return self.evaluators[0][1].start()

    def evaluate(self, request: EvaluateRequest):
        env = dict(request.problem)
        for sizes, evaluator in self.evaluators:
            if all(env.get(k) == v for k, v in sizes.items()):
                return evaluator.evaluate(request)
        raise ValueError(f"no recording of a problem of sizes {env}")

    def close(self) -> None:
        pass


def run_side_by_side(
    drivers: dict[str, Any], near: dict[str, list[str]]
) -> dict[str, tuple[dict[str, Any], float, int]]:
    """Step `drivers` (problem name → `tuner.study.driver.Driver` over a share of one backend) in turn until all
    have ended, passing each new best config to the studies of its neighbouring problems (module docstring).
    Returns problem name → (the study's summary, its wall from the start here, configs it took from others)."""
    learners = {name: [other for other in drivers if name in near.get(other, [])] for name in drivers}
    running = {name: driver.steps() for name, driver in drivers.items()}
    seen_best: dict[str, Any] = {}
    taken = dict.fromkeys(drivers, 0)
    done: dict[str, tuple[dict[str, Any], float, int]] = {}
    t0 = time.perf_counter()
    try:
        while running:
            for name in list(running):
                try:
                    next(running[name])
                except StopIteration:
                    del running[name]
                    done[name] = (drivers[name].summary, time.perf_counter() - t0, taken[name])
                    continue
                _pass_best(name, drivers, running, learners, seen_best, taken)
    finally:
        for steps in running.values():  # one study failed (or the command was stopped): the others stop too
            steps.close()
    return done


def _pass_best(name, drivers, running, learners, seen_best, taken) -> None:
    """Offer study `name`'s best config, when it is new, to the running studies that learn from it."""
    search = drivers[name].search
    best = search.stats.best if search is not None else None
    if best is None or seen_best.get(name) == best["trial"]:
        return
    seen_best[name] = best["trial"]
    for other in learners[name]:
        if other in running and taken[other] < TRANSFER_LIMIT and drivers[other].offer(best["params"], name):
            taken[other] += 1
