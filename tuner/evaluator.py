"""The evaluator contract: one compiled config in, one `Result` out.

Four evaluators implement it with one signature: `tuner.bench.GpuEvaluator` (in-process, owns a GPU),
`tuner.worker.IsolatedEvaluator` (the same in a child process), the Ray actor of `tuner.cluster` (wraps any
evaluator on one cluster GPU) and `tuner.replay.ReplayEvaluator` (answers from a recorded study). The study
driver and `tuner.cluster.Pool` take any of them and never ask which.

The contract, for ``evaluate(compiled, family, config, problem, seed, budget_ms, min_reps, cutoff_ms)``:

* `compiled` is the `tuner.compile.Compiled` of the config, or None for an evaluator whose `measures` is
  False (it answers without running anything, so nothing is compiled for it);
* `family` is a `Family` or a registered family's name; `config` the resolved config (params + derived);
  `problem` a `Problem` or its env dict;
* `seed` None checks against the evaluator's pool of input sets (`tuner.verify`: references computed once);
  an int is a fresh input set drawn from that seed, its reference computed for it (`fresh_seed` makes one: the
  study's finalists are verified so before they are reported);
* `budget_ms`, `min_reps` and `cutoff_ms` are the timing protocol's (`tuner.bench.benchmark`): a config whose
  3-repetition estimate exceeds `cutoff_ms` is reported from those 3 repetitions; an evaluator that does not
  time anything ignores them;
* it returns a `Measurement` or a typed `Failure` for anything the config did (refused launch, wrong
  result, hang, ...); it raises only for a bug in our own code or a lost evaluator.

`start()` sets up once and returns the evaluator's info: at least "gpu" (a name), "gpu_index", "arch"
(what to compile for) and "ceiling_tbps" (None where nothing is measured), and where a GPU answered,
"gpu_facts" (`tuner.gpu.GpuFacts.to_dict`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from tuner.kernels.base import Family
from tuner.result import Result

__all__ = ["Evaluator", "EvaluatorFactory", "fresh_seed"]


def fresh_seed() -> int:
    """A seed no input set has had (63 random bits): `evaluate(seed=fresh_seed())` checks on a fresh set."""
    return int.from_bytes(os.urandom(8), "little") >> 1


@runtime_checkable
class Evaluator(Protocol):
    """What every evaluator offers; see the module docstring."""

    #: True when the evaluator runs the kernel: it needs the cubin, and re-timing a config means something.
    measures: bool

    def start(self) -> dict[str, Any]: ...

    def evaluate(
        self,
        compiled: Any,
        family: Family | str,
        config: dict[str, Any],
        problem: Any,
        seed: int | None = None,
        budget_ms: float = 25.0,
        min_reps: int = 10,
        cutoff_ms: float | None = None,
    ) -> Result: ...

    def close(self) -> None: ...


#: Builds an evaluator inside the process that owns GPU `gpu_index` (a Ray actor): picklable, called there.
EvaluatorFactory = Callable[[int], Evaluator]
