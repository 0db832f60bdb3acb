"""Which engine answers a study's configs: its evaluator factory and its pool.

The driver asks an `Engine` (`Engine.of` its options) what it needs to know before a pool starts and then for a
pool (`tuner.study.pool.Pool`), and never names an evaluator nor asks whether it replays: a GPU study's pool runs
`tuner.gpu.evaluator.GpuEvaluator` in worker processes (the local engine, `tuner.study.local`) or Ray actors (the
ray engine, `tuner.study.cluster`); a replay's (`ReplayEngine`) runs `tuner.study.replay.ReplayEvaluator` on logical
GPUs in the same pools, or answers in the driver's own process (``in_process``: `tuner.study.replay.ReplayPool`).
Bad input is an InputError, raised before any pool starts.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.core.errors import InputError
from tuner.gpu import discovery
from tuner.gpu.protocol import EvaluatorFactory
from tuner.space import space as space_mod
from tuner.study.ahead import Ahead
from tuner.study.options import StudyOptions, engine_of
from tuner.study.pool import Pool
from tuner.study.sharing import Kept

#: a local replay's compile threads on any machine: its width steers a seeded sampler (16: our GPU hosts' cores)
REPLAY_COMPILE_SLOTS = 16


@dataclass
class Engine:
    """A study on GPUs (this machine's or a Ray cluster's): what it refuses before anything starts, the space it
    searches (`searched`), its evaluator factory and the pool it runs in (`pool`). `ReplayEngine` answers from a
    recording instead."""

    opts: StudyOptions
    #: what the command started ahead of the study: the local engine's pool takes its GPU workers
    ahead: Ahead | None = None
    #: builds each GPU's evaluator (set by `searched`)
    evaluator: EvaluatorFactory | None = None
    #: GPUs Ray is told the machine has (a replay on a machine without GPUs); None: the real ones
    logical_gpus: int | None = None

    @staticmethod
    def of(opts: StudyOptions, ahead: Ahead | None = None) -> Engine:
        """The engine `opts` ask for: a replay's with a recording (``--replay``), else the GPUs' (whose local pool
        takes the GPU workers started `ahead`). Nothing is checked or read yet."""
        return ReplayEngine(opts, ahead) if opts.replay else Engine(opts, ahead)

    @property
    def kept(self) -> Kept | None:
        """Where the pool keeps its workers for the next study of the command, and takes the last one's
        (`tuner.study.sharing`); None for a study on its own."""
        return self.ahead.kept if self.ahead is not None else None

    def check_kernel(self, space: space_mod.SearchSpace, problem: space_mod.Problem) -> None:
        """Refuse a kernel this engine cannot run: on a GPU, a family needs a template, and a declarative family a
        reference. The reference itself is not run here: the worker's first check runs it (once per input set,
        where the data is) and a fault there stops the study; running it on the host too, at full size, would
        cost seconds and GBs at LLM sizes."""
        from tuner.kernels.custom import check_reference

        if not space.family.template:
            raise InputError(
                f"kernel {space.kernel!r} has no template: this space can only be replayed (--replay CACHE)",
                str(space.path),
            )
        check_reference(space, problem, required=True, run=False)

    def searched(self, space: space_mod.SearchSpace, problem: space_mod.Problem) -> space_mod.SearchSpace:
        """The space the study searches (the one given, on a GPU), with this engine's evaluator set."""
        from tuner.gpu.evaluator import gpu_evaluator

        self.evaluator = gpu_evaluator
        return space

    def gpu_before_start(self) -> str | None:
        """The GPU a worker will report, where it is known before one starts: this machine's model
        (`tuner.space.discovery.local_gpu_model`); None for a Ray cluster's (known once a worker there reports)."""
        return None if self.opts.ray_address else discovery.local_gpu_model()

    def check_gpus(self) -> None:
        """Refuse a GPU count that cannot be met, before any worker or Ray starts."""
        opts = self.opts
        discovery.gpus(opts.gpus, False, opts.ray_address, engine_of(opts))

    def pool(self, space: space_mod.SearchSpace, problem: space_mod.Problem, new_storage: Callable[[], bool]) -> Pool:
        """The pool of `opts.engine` (see StudyOptions.engine), started; for the local engine the GPU workers
        start in the background and the first configs compile meanwhile (and, for a new study, `new_storage()`,
        are measured while the study opens its storage)."""
        opts = self.opts
        if opts.in_process:
            raise InputError("an in-process study needs a replay recording")
        if engine_of(opts) == "ray":  # the engine's name and its address checked with the options
            from tuner.study.cluster import Pool as RayPool

            assert self.evaluator is not None, "searched() sets the evaluator"
            return RayPool(
                space,
                problem,
                self.evaluator,
                gpus=opts.gpus,
                ray_address=opts.ray_address,
                timeout_s=opts.timeout,
                logical_gpus=self.logical_gpus,
                kept=self.kept,
            )
        return self._local_pool(space, problem, new_storage)

    def _local_pool(self, space: space_mod.SearchSpace, problem: space_mod.Problem, new_storage: Callable[[], bool]):
        from tuner.core.gpufacts import DEFAULT_ARCH
        from tuner.study.local import LocalPool, isolated_gpu_evaluator

        opts = self.opts
        factory = functools.partial(isolated_gpu_evaluator, timeout_s=opts.timeout, ahead=self.ahead)
        pool = LocalPool(space, problem, factory, gpus=opts.gpus or discovery.local_gpus() or 1, kept=self.kept)
        # Compile while the GPU worker starts: the first configs the study will submit — the space's default
        # for a search, the first configs of the listing for a grid (three per compile thread: all of a small
        # grid). Not the worker's own kernels: the worker builds them itself at its start, un-niced; a compile
        # here, in the pool's niced threads beside the configs, did not have them ready sooner (the worker
        # waited on its cache lock as long as building them itself:
        # benchmarks/results/startup-2026-12-01-read-flush.md) and took a compile thread from the configs.
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


@dataclass
class ReplayEngine(Engine):
    """A study answered from a recording (``--replay``) instead of a GPU: on logical GPUs of the local or Ray
    engine's pool, or in the driver's own process (``in_process``)."""

    #: the loaded recording, shared (read-only) by the local engine's evaluators: it loads in ~0.5 s
    recording: Any = None

    def check_kernel(self, space: space_mod.SearchSpace, problem: space_mod.Problem) -> None:
        """A replay needs no template; a user's reference is run here, on the host, since no worker will run it."""
        from tuner.kernels.custom import check_reference

        check_reference(space, problem, required=False, run=True)

    def searched(self, space: space_mod.SearchSpace, problem: space_mod.Problem) -> space_mod.SearchSpace:
        """The space the study searches: the recorded configs alone with ``replay_recorded_only``. A recording
        that holds none of the space's configs is an InputError."""
        from tuner.study.replay import ReplayEvaluator, later_knobs, recorded_configs

        opts = self.opts
        recording = opts.recording
        assert recording is not None
        replay = ReplayEvaluator(recording, opts.replay_study)
        replay.later = later = later_knobs(space, replay.param_names)
        # Over the recording, not the space: a space may be far too large to enumerate.
        recorded = recorded_configs(space, replay.records)
        if not any(space.validate(c, problem) is None for c in recorded):
            raise InputError("replay file holds none of the space's configs", recording)
        self.evaluator = functools.partial(
            ReplayEvaluator, recording, opts.replay_study, opts.replay_delay_s, later=later
        )
        if opts.replay_recorded_only:
            from tuner.study.replay import recorded_subspace

            space = recorded_subspace(space, replay.records, problem)
        # a machine without GPUs: Ray gets logical ones
        self.logical_gpus, self.recording = opts.gpus or 1, replay
        return space

    def gpu_before_start(self) -> str | None:
        """What the replay reports as its GPU: the recording (`tuner.study.replay.gpu_label`)."""
        from tuner.study.replay import gpu_label

        return gpu_label(self.opts.recording or "")

    def check_gpus(self) -> None:
        """Refuse more logical GPUs than this machine can run replay workers for."""
        opts = self.opts
        discovery.gpus(opts.gpus, True, opts.ray_address, engine_of(opts))

    def pool(self, space: space_mod.SearchSpace, problem: space_mod.Problem, new_storage: Callable[[], bool]) -> Pool:
        """An in-process replay's pool answers in the driver's thread; otherwise the engine's, as on GPUs."""
        opts = self.opts
        if opts.in_process:
            from tuner.study.replay import ReplayPool

            assert opts.recording
            return ReplayPool(problem, opts.recording, opts.replay_study, in_flight=opts.replay_in_flight)
        return super().pool(space, problem, new_storage)

    def _local_pool(self, space: space_mod.SearchSpace, problem: space_mod.Problem, new_storage: Callable[[], bool]):
        from tuner.study.local import LocalPool

        opts = self.opts
        factory = functools.partial(_replay_copy, self.recording, opts.replay_delay_s)
        # A replay without delay answers at once: answered in the driver's thread, in order (reproducible).
        return LocalPool(
            space,
            problem,
            factory,
            gpus=opts.gpus or 1,
            compile_slots=REPLAY_COMPILE_SLOTS,
            inline=not opts.replay_delay_s,
            kept=self.kept,
        )


def _replay_copy(recording, delay_s: float, gpu_index: int):
    """A replay evaluator for logical GPU `gpu_index` that shares `recording`'s loaded records (read-only)."""
    import copy

    evaluator = copy.copy(recording)
    evaluator.delay_s, evaluator.gpu_index = delay_s, gpu_index
    return evaluator
