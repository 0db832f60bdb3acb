"""Which engine answers a study's configs: its evaluator factory and its pool.

The driver asks an `Engine` for a pool and never names an evaluator: a GPU study's pool runs
`tuner.gpu.evaluator.GpuEvaluator` in worker processes (the local engine, `tuner.study.local`) or Ray actors (the
ray engine, `tuner.study.cluster`); a replay's runs `tuner.study.replay.ReplayEvaluator` on logical GPUs in the same
pools, or answers in the driver's own process (``in_process``: `tuner.study.replay.ReplayPool`). Bad input is an
InputError, raised before any pool starts.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.errors import InputError
from tuner.gpu.protocol import EvaluatorFactory
from tuner.space import limits
from tuner.space import space as space_mod
from tuner.study.options import ENGINES, StudyOptions

#: a local replay's compile threads on any machine: its width steers a seeded sampler (16: our GPU hosts' cores)
REPLAY_COMPILE_SLOTS = 16


@dataclass
class Engine:
    """The evaluator factory of a study (`choose`) and the pool it runs in (`pool`)."""

    opts: StudyOptions
    evaluator: EvaluatorFactory
    #: GPUs Ray is told the machine has (a replay on a machine without GPUs); None: the real ones
    logical_gpus: int | None = None
    #: a replay's loaded recording, shared (read-only) by the local engine's evaluators: it loads in ~0.5 s
    recording: Any = None

    @classmethod
    def choose(
        cls, opts: StudyOptions, space: space_mod.SearchSpace, problem: space_mod.Problem
    ) -> tuple[Engine, space_mod.SearchSpace]:
        """The engine for `opts`, and the space it searches: a replay with ``replay_recorded_only`` searches the
        recorded configs alone. A recording that holds none of the space's configs is an InputError."""
        if not opts.replay:
            from tuner.gpu.evaluator import gpu_evaluator

            return cls(opts, gpu_evaluator), space
        from tuner.study.replay import ReplayEvaluator, later_knobs, recorded_configs

        recording = opts.recording
        assert recording is not None
        replay = ReplayEvaluator(recording, opts.replay_study)
        replay.later = later = later_knobs(space, replay.param_names)
        # Over the recording, not the space: a space may be far too large to enumerate.
        recorded = recorded_configs(space, replay.records)
        if not any(space.validate(c, problem) is None for c in recorded):
            raise InputError("replay file holds none of the space's configs", recording)
        factory = functools.partial(ReplayEvaluator, recording, opts.replay_study, opts.replay_delay_s, later=later)
        if opts.replay_recorded_only:
            from tuner.study.replay import recorded_subspace

            space = recorded_subspace(space, replay.records, problem)
        # a machine without GPUs: Ray gets logical ones
        return cls(opts, factory, logical_gpus=opts.gpus or 1, recording=replay), space

    def pool(self, space: space_mod.SearchSpace, problem: space_mod.Problem, new_storage: Callable[[], bool]):
        """The pool of `opts.engine` (see StudyOptions.engine), started; for the local engine the GPU workers
        start in the background and the first configs compile meanwhile (and, for a new study, `new_storage()`,
        are measured while the study opens its storage)."""
        opts = self.opts
        if opts.in_process:
            from tuner.study.replay import ReplayPool

            recording = opts.recording
            if not recording:
                raise InputError("an in-process study needs a replay recording")
            return ReplayPool(problem, recording, opts.replay_study, in_flight=opts.replay_in_flight)
        engine = opts.engine or ("ray" if opts.ray_address else "local")
        if engine not in ENGINES:
            raise InputError(f"--engine {engine}: unknown (choose from {', '.join(ENGINES)})")
        if engine == "local" and opts.ray_address:
            raise InputError("--engine local runs on this machine alone; drop --ray-address or use --engine ray")
        if engine == "ray":
            from tuner.study.cluster import Pool

            return Pool(
                space,
                problem,
                self.evaluator,
                gpus=opts.gpus,
                ray_address=opts.ray_address,
                timeout_s=opts.timeout,
                logical_gpus=self.logical_gpus,
            )
        return self._local_pool(space, problem, new_storage)

    def _local_pool(self, space: space_mod.SearchSpace, problem: space_mod.Problem, new_storage: Callable[[], bool]):
        from tuner.study.local import LocalPool, isolated_gpu_evaluator

        opts = self.opts
        if opts.replay:
            factory = functools.partial(_replay_copy, self.recording, opts.replay_delay_s)
            count = opts.gpus or 1
        else:
            factory = functools.partial(isolated_gpu_evaluator, timeout_s=opts.timeout)
            count = opts.gpus or limits.local_gpus() or 1
        # A replay without delay answers at once: answered in the driver's thread, in order (reproducible).
        pool = LocalPool(
            space,
            problem,
            factory,
            gpus=count,
            compile_slots=REPLAY_COMPILE_SLOTS if opts.replay else None,
            inline=bool(opts.replay) and not opts.replay_delay_s,
        )
        if not opts.replay:
            # Compile while the GPU worker starts: the first configs the study will submit — the space's default
            # for a search, the first configs of the listing for a grid (three per compile thread: all of a small
            # grid). Not the worker's own kernels: the worker builds them itself at its start, un-niced; a compile
            # here, in the pool's niced threads beside the configs, did not have them ready sooner (the worker
            # waited on its cache lock as long as building them itself:
            # benchmarks/results/startup-2026-12-01-read-flush.md) and took a compile thread from the configs.
            from tuner.gpufacts import DEFAULT_ARCH

            first = [dict(space.default)]
            if opts.sampler == "grid":
                walk = space.enumerate(problem, budget=space_mod.WALK_BUDGET)
                try:
                    first = list(itertools.islice(walk, min(3 * pool.compile_slots, opts.trials)))
                except space_mod.WalkBudgetExceeded:  # the grid itself refuses such a space, with its message
                    first = []
            # A new study also measures them while it opens its storage (a GPU that is up has nothing else to do);
            # a resumed one may have measured them already, so it only compiles.
            new = new_storage()
            for params in first:
                pool.prefetch(params, DEFAULT_ARCH, evaluate=new, budget_ms=opts.screen_budget_ms)
        return pool


def _replay_copy(recording, delay_s: float, gpu_index: int):
    """A replay evaluator for logical GPU `gpu_index` that shares `recording`'s loaded records (read-only)."""
    import copy

    evaluator = copy.copy(recording)
    evaluator.delay_s, evaluator.gpu_index = delay_s, gpu_index
    return evaluator
