"""The evaluator contract: one compiled config in, one `Result` out.

Four evaluators implement it with one signature, ``evaluate(request) -> Result``:
`tuner.gpu.evaluator.GpuEvaluator` (in-process, owns a GPU), `tuner.gpu.worker.IsolatedEvaluator` (the same in a
child process), the Ray actor of `tuner.study.cluster` (wraps any evaluator on one cluster GPU) and
`tuner.study.replay.ReplayEvaluator` (answers from a recorded study). The study driver and
`tuner.study.cluster.Pool` take any of them and never ask which.

The contract, for an `EvaluateRequest` (compiled, family, config, problem, seed, budget_ms, min_reps, cutoff_ms):

* `compiled` is the `tuner.build.compile.Compiled` of the config, or None for an evaluator whose `measures` is
  False (it answers without running anything, so nothing is compiled for it);
* `family` is a `Family` or a registered family's name; `config` the resolved config (params + derived);
  `problem` a `Problem` or its env dict;
* `seed` None checks against the evaluator's pool of input sets (`tuner.gpu.verify`: references computed once);
  an int is a fresh input set drawn from that seed, its reference computed for it (`fresh_seed` makes one: the
  study's finalists are verified so before they are reported);
* `budget_ms`, `min_reps` and `cutoff_ms` are the timing protocol's (`tuner.gpu.timing.benchmark`): a config whose
  3-repetition estimate exceeds `cutoff_ms` is reported from those 3 repetitions; an evaluator that does not
  time anything ignores them;
* it returns a `Measurement` or a typed `Failure` for anything the config did (refused launch, wrong
  result, hang, ...); it raises only for a bug in our own code or a lost evaluator.

The request is a value: it pickles (it crosses the isolated worker's pipe and Ray as it is), and an evaluator
that passes it on changes it with `dataclasses.replace`, never in place.

Every evaluator is an `Evaluator`: besides `measures`, `start`, `evaluate` and `close`, it may offer capabilities
a pool calls on any evaluator, each with a default that fits an evaluator in the caller's process (`pid` None,
`alive` and never `keepable`, not `poisoned`, no `arch` of its own; `reserve`, `set_deadline` and `note_healthy`
do nothing).

`start()` sets up once and returns the evaluator's info: at least "gpu" (a name), "gpu_index", "arch"
(what to compile for) and "ceiling_tbps" (None where nothing is measured), and where a GPU answered,
"gpu_facts" (`tuner.core.gpufacts.GpuFacts.to_dict`).

A pool sums what its evaluations cost in a `Spent` (GPU time, host stages, time occupied, compiles), from the
Results they return: what "GPU busy" and the study summary's time split read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.core.result import Result

if TYPE_CHECKING:  # the GPU worker's child imports this module before its CUDA context: no NumPy, no families
    from tuner.kernels.base import Family

__all__ = ["CHECK_PHASES", "PHASES", "EvaluateRequest", "Evaluator", "EvaluatorFactory", "Spent", "fresh_seed"]


def fresh_seed() -> int:
    """A seed no input set has had (63 random bits): a request with ``seed=fresh_seed()`` checks on a fresh set."""
    return int.from_bytes(os.urandom(8), "little") >> 1


@dataclass(frozen=True)
class EvaluateRequest:
    """One compiled config to evaluate on one problem, and how: what every evaluator's `evaluate` takes. The
    fields and what each evaluator does with them are the module docstring's contract."""

    #: the config's `tuner.build.compile.Compiled`; None for an evaluator whose `measures` is False
    compiled: Any
    #: a `Family` or a registered family's name (a reference `tuner.build.families.get` resolves)
    family: Family | str
    #: the resolved config: params and derived values
    config: dict[str, Any]
    #: a `tuner.space.problem.Problem` or its env dict (sizes, dtype)
    problem: Any
    #: None: the evaluator's pool of input sets; an int: a fresh input set drawn from that seed
    seed: int | None = None
    #: timed work to aim for (`tuner.gpu.timing.benchmark`)
    budget_ms: float = 25.0
    #: timed repetitions at the least
    min_reps: int = 10
    #: a 3-repetition estimate above this is reported as it is (screening); None: no cut-off
    cutoff_ms: float | None = None


class Evaluator:
    """What every evaluator offers; see the module docstring. `start` and `evaluate` are each evaluator's own; the
    optional capabilities have defaults, so a pool calls them on any evaluator: an evaluator in the caller's
    process is never lost nor kept for the next study, computes no input set ahead and bounds no wait by a
    deadline."""

    #: True when the evaluator runs the kernel: it needs the cubin, and re-timing a config means something.
    measures: bool = True
    #: True once a fault destroyed its CUDA context: the process it runs in must be replaced
    poisoned: bool = False

    def start(self) -> dict[str, Any]:
        """Set up once; the evaluator's info (module docstring)."""
        raise NotImplementedError

    def evaluate(self, request: EvaluateRequest) -> Result:
        """The config's Measurement or typed failure (module docstring)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what `start` set up (nothing, by default)."""

    @property
    def pid(self) -> int | None:
        """The process it evaluates in, where that is not the caller's (None: the caller's)."""
        return None

    @property
    def arch(self) -> str | None:
        """What to compile for, where the evaluator knows (None: the caller's default)."""
        return None

    def alive(self) -> bool:
        """False once the process it evaluates in is lost (`start` then starts another)."""
        return True

    def keepable(self) -> bool:
        """Whether a pool that closes keeps it for the next study (`tuner.study.sharing`): an evaluator whose
        process is costly to start, and is up and started."""
        return False

    def reserve(self, seed: int) -> None:
        """Compute the input set of `seed` (the finalists') ahead, where computing it takes time."""

    def set_deadline(self, deadline: Any) -> None:
        """Bound the next evaluation's waits by `deadline` (a `tuner.gpu.deadline.Deadline`), where it can."""

    def note_healthy(self, seconds: float) -> None:
        """The slowest healthy run so far on any GPU (seconds): a hang deadline allows for it."""

    def import_ahead(self, family: Family) -> None:
        """Start importing `family`'s reference modules where its checks will run, before the first config
        arrives (an isolated GPU worker does it in its child; an evaluator in this process imports at its first
        check, as does this default)."""


#: Builds an evaluator inside the process that owns GPU `gpu_index` (a Ray actor): picklable, called there.
EvaluatorFactory = Callable[[int], Evaluator]


#: The host stages of one evaluation, as `Measurement.phases_s` names them, in the order they run.
PHASES = ("inputs", "reference", "launch", "compare", "timing")
#: The stages that check a config's output: everything up to the timed repetitions.
CHECK_PHASES = ("inputs", "reference", "launch", "compare")


@dataclass
class Spent:
    """What a pool's evaluations and compiles cost, summed from what they returned and the time around them.

    `add` takes each Result an evaluator returned: its GPU time (a Measurement's `gpu_ms`, a failure's
    ``details["gpu_ms"]`` where the evaluator gives one) goes into `gpu_s` and counts in `gpu_timed`; a Measurement
    without it (an evaluator, or a recording, from before the field) counts in `gpu_untimed`, so a sum that misses
    some work says so. Its host stages (`Measurement.phases_s`, or a failure's ``details["phases_s"]``: a wrong
    result found by the check) add up by stage in `phases_s`. `occupied_s` is the wall the pool's workers spent
    inside ``evaluate`` (GPU work, host work and waiting alike); `compile_s` the wall of the pool's compiles,
    summed over its compile threads or tasks (`compiles` of them, cache hits included).
    """

    evaluated: int = 0
    gpu_s: float = 0.0
    gpu_timed: int = 0
    gpu_untimed: int = 0
    occupied_s: float = 0.0
    phases_s: dict[str, float] = field(default_factory=dict)
    compile_s: float = 0.0
    compiles: int = 0

    def add(self, result: Result, occupied_s: float = 0.0) -> None:
        """Count one result that came back from an evaluator, which was busy with it for `occupied_s`."""
        self.evaluated += 1
        self.occupied_s += occupied_s
        details = {} if result.ok else result.details
        gpu_ms = result.gpu_ms if result.ok else details.get("gpu_ms")
        phases = result.phases_s if result.ok else details.get("phases_s")
        if isinstance(gpu_ms, (int, float)) and gpu_ms > 0:
            self.gpu_s += gpu_ms / 1000.0
            self.gpu_timed += 1
        elif result.ok:
            self.gpu_untimed += 1
        for stage, seconds in (phases or {}).items():
            self.phases_s[stage] = self.phases_s.get(stage, 0.0) + float(seconds)

    def add_compile(self, seconds: float) -> None:
        self.compile_s += seconds
        self.compiles += 1

    def __add__(self, other: Spent) -> Spent:
        phases = dict(self.phases_s)
        for stage, seconds in other.phases_s.items():
            phases[stage] = phases.get(stage, 0.0) + seconds
        return Spent(
            evaluated=self.evaluated + other.evaluated,
            gpu_s=self.gpu_s + other.gpu_s,
            gpu_timed=self.gpu_timed + other.gpu_timed,
            gpu_untimed=self.gpu_untimed + other.gpu_untimed,
            occupied_s=self.occupied_s + other.occupied_s,
            phases_s=phases,
            compile_s=self.compile_s + other.compile_s,
            compiles=self.compiles + other.compiles,
        )

    def copy(self) -> Spent:
        return self + Spent()
