"""The pool contract: what the study driver hands its configs to and takes their results from.

Four pools implement `Pool`: the local engine's `tuner.study.local.LocalPool` (compile processes, a GPU worker
process per GPU) and the Ray engine's `tuner.study.cluster.Pool` (compile tasks, a GPU actor per GPU), two transports
of one scheduling core (`tuner.study.scheduler.Scheduler`: the job records, the ready queue, the slots, the request,
the slowest run, the costs); the in-process replay's `tuner.study.replay.ReplayPool` (answers from a recording in
the driver's thread); and one study's share of a pool that several studies run over side by side
(`tuner.study.sidebyside.Share`). The driver (`tuner.study.driver`, `tuner.study.opening`,
`tuner.study.finalists`) uses only the members declared here and never asks which pool it has: what a pool lacks
(compile slots, workers to name, hangs, replaced workers) reads as the default set here.

The contract:

* `submit(number, params, budget_ms, screening)` queues a config under the driver's trial `number` (a finalist's
  is negative); `poll(timeout)` returns the (number, `Result`) of every config finished since the last call,
  waiting up to `timeout` for the first. At most `capacity` configs are worth having in flight; `in_flight` says
  how many are;
* `gpus` is each worker's info (`tuner.gpu.protocol.Evaluator.start`: at least "gpu", "gpu_index", "arch"), read
  once the workers are up (reading it waits for them); `arch` is what the pool compiles for; `measures` is False
  for a pool whose evaluators answer without running kernels (nothing is compiled, re-timed or cut off);
* `problem` is the problem the pool's configs run on: the driver replaces it once the workers report their GPU's
  facts;
* `cutoff_ms`, set by the driver, is the screening cut-off: a screening job is timed under the value in force when
  its evaluation starts (`request`);
* `ran_on`, `ran_by` and `built` hold, by trial number, the GPU index and the worker ({"host", "pid", "node"}) that
  answered a config and its (Source, Compiled); the driver takes (pops) them with the result;
* `spent()` is what the evaluations and compiles cost so far (`tuner.gpu.protocol.Spent`); `report()` the figures
  of the run the study's summary gives; `close()` stops what the pool started.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from tuner.core.result import Result
from tuner.gpu.protocol import EvaluateRequest, Spent, fresh_seed

__all__ = ["Job", "Pool", "Report"]


@dataclass
class Job:
    """One config on its way through a pool that evaluates: rendered, compiled, then measured."""

    number: int
    params: dict[str, Any]
    #: the resolved config (params and derived values)
    config: dict[str, Any]
    budget_ms: float = 25.0
    source: Any = None
    compiled: Any = None
    #: False for a finalist: verified again on a fresh input set, and timed with no cut-off
    screening: bool = True
    #: the problem it runs on, where a job is not of the pool's own problem (studies side by side)
    problem: Any = None
    #: the study's share of the pool that submitted it (`tuner.study.sidebyside.Share`): its cut-off applies, and
    #: what the job costs is counted there too
    owner: Any = None
    #: set for a job the local pool measures ahead of the driver (`tuner.study.local.LocalPool.prefetch`)
    speculation: Any = None


@dataclass
class Report:
    """What a pool did, as the study's summary gives it (`Pool.report`)."""

    #: the pool's start-up stages (seconds), by name
    startup: dict[str, Any]
    #: compile threads or tasks (None: the pool compiles nothing)
    compile_slots: int | None
    #: when the first evaluation began (perf_counter; None: not known)
    busy_since: float | None
    #: one entry per config that hung: trial, GPU, what it cost (s), its deadline and phase
    hangs: list[dict[str, Any]]
    #: the start-up (s) of each worker started in place of a lost one
    replacements_s: list[float]


class Pool(ABC):
    """The pool contract (module docstring), with the state and the rules every pool shares: the request each
    evaluation is sent (its seed and cut-off) and the slowest healthy run that every hang deadline allows for."""

    def __init__(self, problem: Any) -> None:
        self.problem = problem
        self.ran_on: dict[int, int] = {}
        self.ran_by: dict[int, dict[str, Any]] = {}
        self.built: dict[int, tuple[Any, Any]] = {}
        #: the screening cut-off the driver sets (`tuner.gpu.timing.benchmark`), applied to screening jobs
        self.cutoff_ms: float | None = None
        #: the seed of the fresh input set the finalists are verified on (one set: its reference is computed once)
        self.finalist_seed = fresh_seed()
        #: the slowest healthy run measured so far (p80, seconds) on any GPU: every GPU's hang deadline allows it
        self.slowest_s = 0.0
        self.startup: dict[str, Any] = {}
        self.compile_slots: int | None = None
        self.busy_since: float | None = None
        self.hangs: list[dict[str, Any]] = []
        self.replacements_s: list[float] = []

    # -- what the driver reads --------------------------------------------------------------------------------
    @property
    @abstractmethod
    def capacity(self) -> int: ...

    @property
    @abstractmethod
    def in_flight(self) -> int: ...

    @property
    @abstractmethod
    def gpus(self) -> list[dict[str, Any]]: ...

    @property
    @abstractmethod
    def arch(self) -> str: ...

    @property
    @abstractmethod
    def measures(self) -> bool: ...

    # -- what the driver does ---------------------------------------------------------------------------------
    @abstractmethod
    def submit(self, number: int, params: dict[str, Any], budget_ms: float = 25.0, screening: bool = True) -> None: ...

    @abstractmethod
    def poll(self, timeout: float = 0.05) -> list[tuple[int, Result]]: ...

    @abstractmethod
    def spent(self) -> Spent: ...

    @abstractmethod
    def close(self) -> None: ...

    def report(self) -> Report:
        """The run's figures for the study's summary; its lists are the pool's own (they grow while it runs)."""
        return Report(self.startup, self.compile_slots, self.busy_since, self.hangs, self.replacements_s)

    # -- what every pool that evaluates does alike ------------------------------------------------------------
    def request(self, job: Job, family: Any) -> EvaluateRequest:
        """What `job`'s evaluation is sent, made when it starts: a screening job is timed under the cut-off in
        force now (its share's, where a share submitted it) and checked against the evaluator's input sets; a
        finalist is verified again on the fresh input set no config has seen, with no cut-off."""
        cutoff_ms = (job.owner or self).cutoff_ms if job.screening else None
        return EvaluateRequest(
            job.compiled,
            family,
            job.config,
            (job.problem or self.problem).env,
            seed=None if job.screening else self.finalist_seed,
            budget_ms=job.budget_ms,
            cutoff_ms=cutoff_ms,
        )

    def note(self, result: Result) -> None:
        """Keep the slowest healthy run: a later config's hang deadline allows for it on every GPU."""
        if result.ok:
            self.slowest_s = max(self.slowest_s, result.p80_ms / 1e3)
