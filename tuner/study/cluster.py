"""Ray: compile tasks on CPUs, one GPU actor per GPU, replaced on fault.

`Pool` is the Ray engine's transport of the scheduling core (`tuner.study.scheduler.Scheduler`, which keeps the job
records, the ready queue, the in-flight count, the request's seed and cut-off and the slowest run, as it does for
the local engine's `tuner.study.local.LocalPool`): the study driver's ``submit(number, params)`` and ``poll()`` →
finished (number, Result). Behind it, each config is rendered in the driver (cheap, and templates live with the
driver), compiled in a Ray CPU task, then measured by a GPU actor that owns one GPU for its whole life (CUDA
context, L2 flush buffer and the copy ceiling are set up once); an actor is sent at most
`tuner.study.scheduler.QUEUE_DEPTH` jobs at a time, the one it runs included. An actor that faults (a sticky CUDA
error poisons its context), dies, or runs past the time limit is killed and replaced; its trial gets the typed
failure and the study goes on. Each evaluation carries a `tuner.gpu.deadline.Deadline` (the time limit as its
ceiling, the slowest healthy run so far), so an evaluator that bounds its waits by one
(`tuner.gpu.evaluator.GpuEvaluator`) reports a hung kernel as a sticky `TimedOut` at the config's deadline, not at
the limit; the jobs queued behind it on that actor go back to the queue, in order, and run on the next free actor.

Each actor wraps whatever `tuner.gpu.protocol.Evaluator` the caller's factory builds there:
`tuner.gpu.evaluator.GpuEvaluator` on a real GPU, or `tuner.study.replay.ReplayEvaluator` on a logical one
(``ray.init(num_gpus=N)`` on a machine without a GPU), so the same driver, Ray plumbing and fault handling are exercised
on CPUs. The pool never asks which: an evaluator whose `measures` is False gets no compile step (it needs no cubin).
`spent` sums what the work cost (`tuner.gpu.protocol.Spent`): each result as the driver collects it (so a replaced
actor's work still counts), each compile task's wall as the task measured it, and the time each live actor spent in
`evaluate`.
"""

from __future__ import annotations

import collections
import os
import time
from dataclasses import dataclass, field
from typing import Any

from tuner.core.errors import InputError
from tuner.core.result import Failure, LaunchFailed, Result, TimedOut
from tuner.gpu.deadline import Deadline
from tuner.gpu.protocol import EvaluateRequest, Evaluator, EvaluatorFactory, Spent
from tuner.study.pool import Job
from tuner.study.scheduler import Scheduler
from tuner.study.sharing import Kept


def init_ray(address: str | None, logical_gpus: int | None = None) -> dict[str, Any]:
    """Start Ray locally (default) or join a cluster. Returns the cluster's resources. Errors are InputErrors."""
    import ray

    if ray.is_initialized():
        return ray.cluster_resources()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True, "configure_logging": False}
    if address:
        _check_reachable(address)
        kwargs["address"] = address
    elif logical_gpus is not None:
        kwargs["num_gpus"] = logical_gpus
    try:
        ray.init(**kwargs)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"--ray-address {address or 'local'}: cannot start or join Ray: {first}") from None
    return ray.cluster_resources()


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on an address nothing listens at: Ray itself retries for minutes before it gives up."""
    import socket

    if address == "auto":
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--ray-address {address}: expected HOST:PORT (or ray://HOST:PORT, or auto)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise InputError(f"--ray-address {address}: unreachable ({exc.strerror or type(exc).__name__})") from None


def _compile_task(source, arch):
    """Compile on a cluster CPU; returns (the compile's result, its wall in seconds there)."""
    from tuner.build.compile import compile_source

    started = time.perf_counter()
    result = compile_source(source, arch)
    return result, time.perf_counter() - started


class _GpuActor(Evaluator):
    """Owns one (real or logical) GPU and the evaluator `factory` builds on it; an `Evaluator` itself, with the
    time spent in `evaluate` counted (`occupied`). Wrapped with ray.remote(num_gpus=1) by `Pool`."""

    def __init__(self, factory: EvaluatorFactory):
        import ray

        ids = ray.get_gpu_ids()
        # Ray shows the actor only its own GPU (device 0 inside); keep the cluster-wide index for records.
        self.gpu_index = int(ids[0]) if ids else 0
        self.evaluator: Evaluator = factory(self.gpu_index)
        self.measures = self.evaluator.measures
        self.occupied_s = 0.0

    def start(self) -> dict[str, Any]:
        import socket

        import ray

        return {
            **self.evaluator.start(),
            "gpu_index": self.gpu_index,
            "measures": self.measures,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "node": ray.get_runtime_context().get_node_id(),
        }

    def occupied(self) -> float:
        """Seconds this actor has spent inside `evaluate`."""
        return self.occupied_s

    def evaluate(self, request: EvaluateRequest, deadline: Deadline | None = None) -> Result:
        """The evaluator's answer to `request`, its waits bounded by `deadline` where it takes one."""
        if deadline is not None:
            self.evaluator.set_deadline(deadline)
        started = time.perf_counter()
        try:
            return self.evaluator.evaluate(request)
        finally:
            self.occupied_s += time.perf_counter() - started

    def close(self) -> None:
        self.evaluator.close()


@dataclass
class _Slot:
    actor: Any
    info: dict[str, Any]
    queue: collections.deque = field(default_factory=collections.deque)  # (ref, job)
    head_started: float = 0.0


class Pool(Scheduler):
    """Compile slots plus one GPU actor per GPU; see the module docstring."""

    def __init__(
        self,
        space,
        problem,
        evaluator: EvaluatorFactory,
        gpus: int | None = None,
        ray_address: str | None = None,
        arch: str | None = None,
        timeout_s: float = 60.0,
        compile_slots: int | None = None,
        logical_gpus: int | None = None,
        kept: Kept | None = None,
    ):
        """`evaluator(gpu_index)` builds each actor's evaluator (picklable: it runs in the actor); `arch`
        defaults to the first actor's; `logical_gpus` starts a local Ray with that many GPUs, for evaluators
        that need none; `kept` (`tuner.study.sharing`): where a study before this one left its actors, and where
        this pool leaves them as it closes."""
        import ray

        t0 = time.perf_counter()
        resources = init_ray(ray_address, logical_gpus)
        ray_init_s = round(time.perf_counter() - t0, 3)
        available = int(resources.get("GPU", 0))
        want = gpus or available
        if want < 1:
            raise InputError("no GPU visible to Ray (use --replay PATH to run without one)")
        if want > available:
            raise InputError(f"--gpus {want}: Ray sees only {available} GPU(s)")
        cpus = int(resources.get("CPU", 1))
        super().__init__(space, problem, compile_slots or max(1, cpus - want))
        self.timeout_s = timeout_s
        self.startup = {"engine": "ray", "ray_init_s": ray_init_s}
        self._compile_task = ray.remote(num_cpus=1, max_retries=0)(_compile_task)
        # num_cpus=0: an actor reserves a CPU by default, and 8 GPU actors must fit on a 2-core host.
        # Ray's typed overload of remote(**options) lists only task options; max_concurrency is an actor option
        # that Ray documents and accepts, hence the ignore.
        self._actor_cls = ray.remote(num_gpus=1, num_cpus=0, max_restarts=0, max_concurrency=1)(  # type: ignore[call-overload]
            _GpuActor
        )
        self._actor_args = (evaluator,)
        t1 = time.perf_counter()
        # A study before this one in the same command may have kept its actors in `kept` (`tuner.study.sharing`):
        # the same evaluator on as many GPUs.
        self.kept, self._kept_as = kept, ("ray actors", evaluator, want)
        self.slots = (kept.take(self._kept_as) if kept else None) or self._start_actors(want)
        self.startup["gpu_workers_s"] = round(time.perf_counter() - t1, 3)
        self._measures = bool(self.slots[0].info["measures"])
        self._arch = arch or str(self.slots[0].info["arch"])
        self.compiling: dict[Any, Job] = {}  # by the ref of its compile task
        self.started = time.perf_counter()

    # -- actors -----------------------------------------------------------------------------------------------
    def _start_actors(self, count: int) -> list[_Slot]:
        """Start `count` GPU actors at once (each sets up CUDA and measures its ceiling) and wait for all."""
        import ray

        actors = [self._actor_cls.remote(*self._actor_args) for _ in range(count)]
        infos = ray.get([a.start.remote() for a in actors])
        return [_Slot(actor=a, info=i) for a, i in zip(actors, infos, strict=True)]

    def _replace(self, slot: _Slot) -> None:
        """Kill a faulted or hung actor and put a fresh one in its place. The caller has taken the job it failed
        off the slot's queue; the jobs still queued never started and go back, in order, to the next free actor."""
        import ray

        ray.kill(slot.actor, no_restart=True)
        self.ready.requeue(job for _, job in slot.queue)
        fresh = self._start_actors(1)[0]
        slot.actor, slot.info, slot.queue, slot.head_started = fresh.actor, fresh.info, collections.deque(), 0.0
        self.replaced += 1

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return [s.info for s in self.slots]

    @property
    def measures(self) -> bool:
        return self._measures

    @property
    def arch(self) -> str:
        return self._arch

    # -- work ---------------------------------------------------------------------------------------------------
    @property
    def gpu_count(self) -> int:
        return len(self.slots)

    def _compile(self, job: Job) -> None:
        """Compile on a cluster CPU (a Ray task); `poll` files its outcome."""
        self.compiling[self._compile_task.remote(job.source, self.arch)] = job

    def poll(self, timeout: float = 0.05) -> list[tuple[int, Result]]:
        """Advance the pipeline; return the configs finished since the last call."""
        import ray

        self._dispatch()
        refs = list(self.compiling) + [s.queue[0][0] for s in self.slots if s.queue]
        if refs:
            # Wake on the first finished ref, then take whatever else is already done without waiting.
            done, pending = ray.wait(refs, num_returns=1, timeout=timeout)
            if done and pending:
                more, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
                done += more
            for ref in done:
                if ref in self.compiling:
                    job = self.compiling.pop(ref)
                    result, compile_s = ray.get(ref)
                    self.account_compile(compile_s)
                    self.compiled(job, result)
                else:
                    self._collect(ref)
        self._check_hangs()
        self._dispatch()
        return self.collect()

    def _collect(self, ref) -> None:
        import ray

        slot = next(s for s in self.slots if s.queue and s.queue[0][0] == ref)
        _, job = slot.queue.popleft()
        slot.head_started = time.perf_counter()
        gpu_index, worker = slot.info["gpu_index"], {k: slot.info.get(k) for k in ("host", "pid", "node")}
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            result = LaunchFailed(reason=f"GPU worker died ({type(exc).__name__}); replaced")
            self._replace(slot)
        else:
            if isinstance(result, Failure) and result.details.get("sticky"):
                # The CUDA context is poisoned (or a kernel never ends): everything after this would fail too.
                self._replace(slot)
        self.answered(result)
        self.finish(job, result, gpu_index, worker)

    def _check_hangs(self) -> None:
        now = time.perf_counter()
        for slot in self.slots:
            if slot.queue and now - slot.head_started > self.timeout_s:
                _, job = slot.queue.popleft()
                gpu_index = slot.info["gpu_index"]
                self._replace(slot)
                self.finish(
                    job, TimedOut(reason=f"no answer within {self.timeout_s:g} s; GPU worker replaced"), gpu_index
                )

    def _dispatch(self) -> None:
        """Send the ready jobs, in order, to the actors with an open slot, the least loaded first."""
        for slot in sorted(self.slots, key=lambda s: len(s.queue)):
            while len(self.ready) and self.open(len(slot.queue)):
                job = self.ready.take(block=False)
                assert job is not None, "only the local pool's close queues a stop"
                request = self.evaluation(job)
                deadline = Deadline(ceiling_s=self.timeout_s, slowest_s=self.slowest_s)
                ref = slot.actor.evaluate.remote(request, deadline=deadline)
                if not slot.queue:
                    slot.head_started = time.perf_counter()
                slot.queue.append((ref, job))

    def spent(self) -> Spent:
        """What the evaluations and compiles have cost so far. The time occupied is the live actors' own count:
        an actor that was replaced took its count with it."""
        import ray

        spent = super().spent()
        spent.occupied_s = sum(ray.get([s.actor.occupied.remote() for s in self.slots]))
        return spent

    def close(self) -> None:
        slots, self.slots = [_Slot(actor=s.actor, info=s.info) for s in self.slots], []
        if not (self.kept and self.kept.keep(self._kept_as, slots, lambda: _kill(slots))):
            _kill(slots)


def _kill(slots: list[_Slot]) -> None:
    import ray

    for slot in slots:
        ray.kill(slot.actor, no_restart=True)
