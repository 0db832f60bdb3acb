"""The study's pool on this machine without Ray: compile threads, one evaluator thread per GPU.

`LocalPool` is a transport of the scheduling core (`tuner.study.scheduler.Scheduler`: the job records, the ready
queue, the in-flight count, the request's seed and cut-off, the slowest run), as Ray's `tuner.study.cluster.Pool`
is, so the study driver runs unchanged over either; it keeps how a job reaches a GPU here and comes back. It is
what ``tuner study`` uses when no ``--ray-address`` is given (``--engine local``, the default):

* the evaluators come from the same `tuner.gpu.protocol.EvaluatorFactory` a Ray actor would call. For real GPUs
  that factory is `isolated_gpu_evaluator`: a `tuner.gpu.worker.IsolatedEvaluator` whose child process owns one GPU,
  so a kernel that hangs or poisons its CUDA context costs that child, never the driver (the child is killed
  and replaced, as a Ray actor would be). A replay evaluator answers in a thread of this process;
* every evaluator starts in a background thread as soon as the pool is made, so the GPU workers' CUDA set-up
  (context, flush buffer, ceiling) overlaps the driver's own start-up (storage, study, sampler); `wait_ready`
  joins them;
* compiles run in compile processes, one per core (`tuner.build.compilers`: NVRTC compiles one at a time per process,
  so threads of one process did not scale), fed by a thread pool of the same size, and `prefetch`
  starts a config's compile before the GPU worker is up (the first configs of a study: its default, or a grid's
  first configs). With ``evaluate=True`` the GPU also measures a prefetched config as soon as it is up and idle,
  while the driver is still opening the study; the driver's later `submit` of the same config (same source,
  arch, budget) takes that result instead of measuring again. The GPU's work is the same either way: a
  screening evaluation with the default budget, under the cut-off in force when it runs;
* one thread per GPU takes compiled configs from a shared queue and blocks in its evaluator, so a GPU never
  waits for the driver's loop; results come back through a queue that `poll` drains. The queue is the pool's,
  not a worker's: a worker holds only the config it runs, so when a hung or faulted worker is killed and
  replaced, only that config fails (`TimedOut` at its deadline, `tuner.gpu.deadline`); the configs queued behind
  it stay queued, and are taken by the other GPUs meanwhile or by the replacement once it is up (its start-up
  counts against no config's deadline). Every GPU's deadline allows for the slowest healthy run on any GPU;
* `spent` sums what the work cost (`tuner.gpu.protocol.Spent`): each evaluation's result (its GPU time and host
  stages) as the GPU thread gets it, speculative ones included (the GPU ran them, claimed or not), and the wall
  of each compile in its compile thread.
"""

from __future__ import annotations

import functools
import os
import queue
import socket
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tuner.build.compilers import CompileProcesses
from tuner.build.render import render
from tuner.core.result import LaunchFailed, Result, TimedOut
from tuner.gpu.clock import since_command
from tuner.gpu.protocol import Evaluator, EvaluatorFactory
from tuner.study.ahead import Ahead
from tuner.study.pool import Job
from tuner.study.scheduler import Scheduler
from tuner.study.sharing import Kept

__all__ = ["LocalPool", "host_cores", "isolated_gpu_evaluator"]


def host_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _keep(gpu_index: int, evaluator: Evaluator, kept: Kept | None) -> bool:
    """Keep a GPU worker whose process is up for the next study in `kept` (`tuner.study.sharing`); False without
    one, or for a worker that is not up (or an evaluator without a process of its own: a replay's is cheap to make
    again)."""
    if kept is None or not evaluator.keepable():
        return False
    return kept.keep(("gpu worker", gpu_index), evaluator, evaluator.close)


def isolated_gpu_evaluator(gpu_index: int, timeout_s: float = 60.0, ahead: Ahead | None = None) -> Evaluator:
    """The local engine's evaluator for GPU `gpu_index`: a GpuEvaluator in a child process (see tuner.gpu.worker):
    the one a study before this one kept (`tuner.study.sharing`), else the one its command started `ahead`
    (`tuner.study.ahead.Ahead.launch_gpu_workers`), if there is one."""
    from tuner.gpu.worker import IsolatedEvaluator

    kept = ahead.kept if ahead is not None else None
    launched = (kept.take(("gpu worker", gpu_index)) if kept else None) or (
        ahead.take_worker(gpu_index) if ahead else None
    )
    if launched is not None:
        launched.timeout_s = timeout_s
        return launched
    return IsolatedEvaluator(gpu=gpu_index, timeout_s=timeout_s)


def _compile_processes(slots: int, kept: Kept | None) -> CompileProcesses:
    """The compile processes a study before this one kept (`tuner.study.sharing`) if there are as many, else new
    ones."""
    processes = kept.take("compile processes") if kept is not None else None
    if processes is not None:
        if processes.slots == max(1, slots) and not processes.closed:
            return processes
        processes.close()
    return CompileProcesses(slots)


@dataclass
class _Speculation:
    """A prefetched config the GPU measures before the driver asks: `result` once measured, `claimed_by` the trial
    number whose `submit` takes it (delivered as soon as both are known), `dropped` when it cannot be used."""

    arch: str
    budget_ms: float
    config: dict[str, Any]
    result: Any = None
    gpu_index: int | None = None
    worker: dict[str, Any] | None = None
    claimed_by: int | None = None
    #: the study summary's record of this speculation's hang, if it hung (its trial filled in when claimed)
    hang: dict[str, Any] | None = None
    dropped: bool = False


class _Gpu:
    """One evaluator and the thread that feeds it; `info` is set once its start() returned."""

    def __init__(self, pool: LocalPool, index: int, evaluator: Evaluator):
        self.pool, self.index, self.evaluator = pool, index, evaluator
        self.info: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.started_s: float | None = None
        self.ready_at_s: float | None = None  # seconds from the command's start
        self.up = threading.Event()  # set once start() returned or raised
        self.thread = threading.Thread(target=self._main, name=f"tuner-gpu{index}", daemon=True)
        if pool.inline:
            self._start()
        else:
            self.thread.start()

    @property
    def arch(self) -> str | None:
        """What this GPU runs (its worker's info), once started."""
        return self.info.get("arch") if self.info else None

    def worker(self) -> dict[str, Any]:
        """Who answers on this GPU now: host, pid (the child's, for a GPU worker) and node ("local")."""
        return {"host": self.pool.host, "pid": self.evaluator.pid or os.getpid(), "node": "local"}

    def _start(self) -> bool:
        t0 = time.perf_counter()
        try:
            self.evaluator.import_ahead(self.pool.family)  # the reference's modules, as soon as the worker is up
            info = self.evaluator.start()
            self.info = {**info, "gpu_index": self.index, "measures": self.evaluator.measures, **self.worker()}
            # the finalists' input set may then be computed ahead (tuner.gpu.verify)
            self.evaluator.reserve(self.pool.finalist_seed)
        except BaseException as exc:  # reported by wait_ready, in the driver's thread
            self.error = exc
            return False
        finally:
            self.started_s = time.perf_counter() - t0
            self.ready_at_s = since_command(time.perf_counter())
            self.up.set()
        return True

    def _main(self) -> None:
        if not self._start():
            return
        while True:
            job = self.pool.ready.take()
            if job is None:
                return
            self.run(job)

    def _replace_lost(self, pool: LocalPool) -> None:
        """Start the replacement of a worker lost to a hang or a fault before the next config is handed to it, so
        that its start-up is timed apart (``pool.replacements_s``) and counted in no config's deadline."""
        if self.evaluator.alive():
            return
        started = time.perf_counter()
        self.evaluator.start()
        pool.replacements_s.append(round(time.perf_counter() - started, 3))

    def run(self, job: Job) -> None:
        """Evaluate one job and hand its result to the driver's queue (a speculative one: to its claimant, or keep
        it for the `submit` that claims it)."""
        pool = self.pool
        if job.speculation is not None and (pool.closing or job.speculation.arch != (pool.arch_requested or self.arch)):
            pool.speculated(job, None, self)  # compiled for another GPU (or closing): a submit compiles afresh
            return
        started = time.perf_counter()
        if pool.busy_since is None:
            pool.busy_since = started
        pool.startup.setdefault("first_measure_start_s", since_command(started))
        evaluating = started  # past the start of a replacement worker, if one is started first
        try:
            request = pool.evaluation(job)  # the family by reference: a user's is imported again in the child
            # the slowest healthy run on any GPU lengthens this one's hang deadline
            self.evaluator.note_healthy(pool.slowest_s)
            self._replace_lost(pool)
            evaluating = time.perf_counter()
            result = self.evaluator.evaluate(request)
        except Exception as exc:  # a lost worker or a bug in it: the trial fails, the study goes on
            result = LaunchFailed(
                reason=f"GPU worker raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            )
        pool.answered(result, time.perf_counter() - started, job.owner)
        if isinstance(result, TimedOut):  # what the hang cost this GPU, for the study's summary
            hang = pool.hang(job, result, self.index, time.perf_counter() - evaluating)
            if job.speculation is not None:  # its trial is filled in when a trial claims it (`LocalPool._deliver`)
                job.speculation.hang = hang
        pool.startup.setdefault("first_measure_s", round(time.perf_counter() - started, 3))
        if job.speculation is not None:
            pool.speculated(job, result, self)
            return
        pool.finish(job, result, self.index, self.worker())


class LocalPool(Scheduler):
    """Compile threads plus one evaluator per local GPU; see the module docstring."""

    def __init__(
        self,
        space,
        problem,
        evaluator: EvaluatorFactory,
        gpus: int = 1,
        arch: str | None = None,
        compile_slots: int | None = None,
        inline: bool = False,
        kept: Kept | None = None,
    ):
        """Starts `gpus` evaluators (``evaluator(i)`` for i in 0..gpus-1) in the background and returns at once.
        `arch` (what to compile for) defaults to the first evaluator's; `compile_slots` to this host's cores.
        `inline` (for evaluators that answer at once, such as a replay without delay): no threads; each `poll`
        answers the oldest queued config in the caller's thread, the evaluators taking turns, so a seeded study
        asks and tells in the same order on every run. `kept` (`tuner.study.sharing`): where a study before this
        one left its compile processes, and where this pool leaves its workers as it closes."""
        t0 = time.perf_counter()
        self.kept = kept
        super().__init__(space, problem, compile_slots or host_cores())
        self.inline = inline
        self.arch_requested = arch  # what to compile for, when the caller says (else the GPUs' own arch)
        self._compiler = ThreadPoolExecutor(self.compile_slots, thread_name_prefix="tuner-compile")
        self._prefetched: dict[tuple[str, str], Future] = {}
        self.host = socket.gethostname()
        self._turn = 0
        #: prefetched configs the GPU measures before the driver asks (`prefetch(..., evaluate=True)`), by
        #: (source text, arch); guarded by `_lock` (the GPU threads and the driver both change them)
        self._speculations: dict[tuple[str, str], _Speculation] = {}
        self._lock = threading.Lock()
        self.closing = False
        self._workers = [_Gpu(self, i, evaluator(i)) for i in range(gpus)]
        # The compile threads hand their compiles to processes (tuner.build.compilers: NVRTC compiles one at a time per
        # process); evaluators that do not measure compile nothing, so they get none.
        self._compilers = _compile_processes(self.compile_slots, kept) if self.measures_hint else None
        self.startup: dict[str, Any] = {
            "engine": "local",
            "pool_start_s": round(time.perf_counter() - t0, 3),
            "pool_made_s": since_command(t0),
        }
        self._t0 = t0
        self._ready = False
        self.started = time.perf_counter()

    # -- start-up ---------------------------------------------------------------------------------------------
    def wait_ready(self) -> None:
        """Block until every evaluator has started; raise the first start-up error (an InputError or the
        worker's own) after stopping the others."""
        if self._ready:
            return
        for worker in self._workers:
            worker.up.wait()
        failed = next((w.error for w in self._workers if w.error is not None), None)
        if failed is not None:
            self.close()
            raise failed
        self._ready = True
        self.startup["gpu_workers_s"] = round(time.perf_counter() - self._t0, 3)
        self.startup["gpu_worker_start_s"] = [round(w.started_s or 0.0, 3) for w in self._workers]
        self.startup["gpu_worker_ready_s"] = [w.ready_at_s for w in self._workers]
        self.started = time.perf_counter()

    @property
    def gpus(self) -> list[dict[str, Any]]:
        self.wait_ready()
        return [w.info for w in self._workers if w.info is not None]  # all of them, once wait_ready returned

    @property
    def measures(self) -> bool:
        return bool(self.gpus[0]["measures"])

    @property
    def arch(self) -> str:
        return self.arch_requested or str(self.gpus[0]["arch"])

    # -- work -------------------------------------------------------------------------------------------------
    @property
    def gpu_count(self) -> int:
        return len(self._workers)

    def prefetch(self, params: dict[str, Any], arch: str, evaluate: bool = False, budget_ms: float = 25.0) -> None:
        """Start compiling `params` for `arch` now (before the GPU worker says what its arch is); a later
        `submit` of the same source and arch takes this compile's result instead of starting another. With
        `evaluate`, a GPU also measures it (a screening job of `budget_ms`) once compiled and the GPU is idle, if
        the GPU's arch is `arch`; a later `submit` of the same source, arch and budget takes that result."""
        config = self.space.resolve(params, self.problem)
        source = render(self.family, params, config, self.problem.env)
        key = (source.text, arch)
        if key not in self._prefetched:
            self._prefetched[key] = self._compiler.submit(self._timed_compile, source, arch)
        if evaluate and self.measures_hint and key not in self._speculations:
            speculation = _Speculation(arch=arch, budget_ms=budget_ms, config=config)
            self._speculations[key] = speculation
            job = Job(number=-1, params=params, config=config, budget_ms=budget_ms, source=source)
            job.speculation = speculation
            self._prefetched[key].add_done_callback(functools.partial(self._compiled_ahead, job))

    def _compiled_ahead(self, job: Job, future: Future) -> None:
        """In a compile thread: queue a speculative job for the GPUs (after any job the driver has queued)."""
        try:
            result = future.result()
        except Exception:  # the driver's submit of this config meets the same error and reports it
            result = None
        if result is None or not result.ok:
            self.speculated(job, None, None)
            return
        self.startup.setdefault("first_compile_done_s", since_command(time.perf_counter()))
        job.compiled = result
        self.ready.put(job)

    def speculated(self, job: Job, result: Result | None, gpu: _Gpu | None) -> None:
        """A speculative job finished (`result`), or cannot be used (None): deliver it to the trial that claimed
        it, or keep it for the claim to come."""
        speculation = job.speculation
        assert speculation is not None
        with self._lock:
            if result is None:
                speculation.dropped = True
            else:
                speculation.result = result
                speculation.gpu_index = gpu.index if gpu is not None else None
                speculation.worker = gpu.worker() if gpu is not None else None
            claimant = speculation.claimed_by
        if claimant is not None:
            self._deliver(claimant, job, speculation)

    def _deliver(self, number: int, job: Job, speculation: _Speculation) -> None:
        """Hand a claimed speculation to trial `number`: its result, or (dropped) a fresh compile and evaluation."""
        if speculation.hang is not None:  # what its hang cost is this trial's, reported or not
            speculation.hang["trial"] = number
        if self.closing:  # the driver has stopped asking: nothing more to compile or report
            return
        if speculation.dropped:
            self._start_job(Job(number=number, params=job.params, config=job.config, budget_ms=job.budget_ms))
            return
        if speculation.gpu_index is not None:
            self.ran_on[number] = speculation.gpu_index
        if speculation.worker is not None:
            self.ran_by[number] = speculation.worker
        if job.compiled is not None:
            self.built[number] = (job.source, job.compiled)
        self.done.put((number, speculation.result))

    @property
    def measures_hint(self) -> bool:
        """Whether the evaluators measure (known before they start: a replay answers without running kernels)."""
        return all(w.evaluator.measures for w in self._workers)

    def _compile(self, job: Job) -> None:
        """Take the GPU's measure of a prefetched config (`prefetch` with ``evaluate``), else compile `job`."""
        key = (job.source.text, self.arch)
        speculation = self._speculations.get(key)
        # Claimed only if it was measured as this trial would be: the same budget and the same resolved config (the
        # launch geometry may depend on GPU facts that the study learnt from the worker after the prefetch).
        same = speculation is not None and speculation.budget_ms == job.budget_ms and speculation.config == job.config
        if speculation is not None and job.screening and same:
            del self._speculations[key]
            with self._lock:
                speculation.claimed_by = job.number
                settled = speculation.dropped or speculation.result is not None
            if settled:
                ahead = Job(number=-1, params=job.params, config=job.config, budget_ms=job.budget_ms, source=job.source)
                ahead.compiled = self._prefetched_result(key)
                self._deliver(job.number, ahead, speculation)
            # else the GPU thread delivers it when it finishes (built[] is filled from its job there)
            return
        self._start_job(job)

    def _prefetched_result(self, key: tuple[str, str]) -> Any:
        """The compile result of a prefetched key, if it is done (None otherwise)."""
        future = self._prefetched.get(key)
        return future.result() if future is not None and future.done() and future.exception() is None else None

    def _start_job(self, job: Job) -> None:
        """Compile `job` (or take its prefetched compile) and queue it for the GPUs."""
        if job.source is None:
            job.source = render(self.family, job.params, job.config, (job.problem or self.problem).env)
        future = self._prefetched.pop((job.source.text, self.arch), None)
        if future is None:
            future = self._compiler.submit(self._timed_compile, job.source, self.arch, job.owner)
        future.add_done_callback(functools.partial(self._compiled, job))

    def _compiled(self, job: Job, future: Future) -> None:
        """In a compile thread: hand a compiled config to the GPU threads, or its failure to the driver."""
        try:
            result = future.result()
        except Exception as exc:  # a bug in compiling, not a property of the config: surfaces in poll()
            self.done.put((job.number, exc))
            return
        self.startup.setdefault("first_compile_done_s", since_command(time.perf_counter()))
        self.compiled(job, result)

    def poll(self, timeout: float = 0.05) -> list[tuple[int, Result]]:
        """The configs finished since the last call; waits up to `timeout` for the first one. Inline, the oldest
        ready config is answered first, in this thread, by the GPUs in turn."""
        if not self.inline:
            return self.collect(timeout)
        try:
            job = self.ready.take(block=False)
        except queue.Empty:
            return []
        if job is None:  # close() ran
            return []
        self._workers[self._turn % len(self._workers)].run(job)
        self._turn += 1
        return self.collect()

    def _timed_compile(self, source, arch, owner=None):
        """In a compile thread: compile, and count its wall in `spent` (and in `owner`'s)."""
        started = time.perf_counter()
        try:
            if self._compilers is not None:
                return self._compilers.compile(source, arch)
            from tuner.build.compile import compile_source

            return compile_source(source, arch)
        finally:
            self.account_compile(time.perf_counter() - started, owner)

    def close(self) -> None:
        """Stop the GPU threads and their evaluators (a GPU worker's child exits)."""
        self.closing = True  # speculative jobs still queued are dropped, not measured
        for _ in self._workers:
            self.ready.put(None)
        self._compiler.shutdown(wait=False, cancel_futures=True)
        compilers = self._compilers
        if compilers is not None and not (
            self.kept and self.kept.keep("compile processes", compilers, compilers.close)
        ):
            compilers.close()
        for worker in self._workers:
            if worker.thread.is_alive():
                worker.thread.join(timeout=5.0)
            if not worker.thread.is_alive() and _keep(worker.index, worker.evaluator, self.kept):
                continue
            try:
                worker.evaluator.close()
            except Exception:  # closing a worker that never started
                pass
        self._workers = []
