"""The in-process GPU evaluator: `Compiled` + family + config + problem → `Measurement` or a typed failure.

It runs inside a process that owns one GPU (a Ray actor, or the child of `tuner.gpu.worker.IsolatedEvaluator`)
and applies the protocol of DESIGN.md once, for every caller:

* correctness first: the inputs of one of the problem's pooled input sets, drawn again on the GPU from its seed
  (`tuner.gpu.verify`: two sets by default, taken in turn, each reference computed once and kept; an explicit seed
  is a fresh set whose reference is computed for it), outputs poisoned with NaN (all bytes 0xFF, a NaN in every
  IEEE float format), every launch of the config run, the outputs compared on the GPU with the reference
  (`tuner.gpu.checks`); a reference that raises or answers the wrong shape or dtype is a `WrongResult` with
  ``details["phase"] = "reference"``, which stops a study (it is every config's reference);
* timing (`tuner.gpu.timing`): one warm-up (the correctness launch serves as it), a first estimate from 3
  repetitions, then enough repetitions for ``budget_ms`` of timed work (at least ``min_reps``) — unless the
  estimate is already above ``cutoff_ms`` (the study's screening: a config that far behind the best so far is not
  a contender, and its 3-repetition median is figure enough to steer the search);
* the ceiling (`tuner.gpu.ceiling`): a device-to-device copy timed with the same protocol, once per GPU, cached;
* random inputs and the comparison run on `tuner.gpu.devicekernels` (compiled from `tuner.gpu.kernelsource`
  through our NVRTC cache), not on CuPy's JIT-compiled generators and ufuncs, so a fresh machine compiles nothing
  for them inside the worker.

Failures are decided by CUDA status codes (`tuner.gpu.status`: ``CUDADriverError.status`` for driver calls:
module load, launch; ``CUDARuntimeError.status`` for runtime calls: synchronize, memcpy), never by message text.
A fault that poisons the CUDA context marks the evaluator `poisoned`: its process must be replaced. Any other
exception is a bug and propagates.
"""

from __future__ import annotations

import functools
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.build import families
from tuner.core.cudalib import driver as _driver
from tuner.core.cudalib import runtime as _runtime
from tuner.core.result import LaunchFailed, Measurement, Result, TimedOut, WrongResult
from tuner.expr.ops import ceil_div
from tuner.gpu import verify
from tuner.gpu.ceiling import GiB
from tuner.gpu.checks import Checked, Verification, rounded
from tuner.gpu.deadline import Deadline, Hung, expected_seconds, wait_until_done
from tuner.gpu.device import Device
from tuner.gpu.protocol import PHASES, EvaluateRequest, Evaluator
from tuner.gpu.status import CUDA_ERRORS, EvaluatorPoisoned, cuda_failure
from tuner.gpu.timing import benchmark
from tuner.kernels.base import Family, Launch

__all__ = ["GpuEvaluator", "gpu_evaluator"]


NOT_READY = 600  # cudaErrorNotReady: what cudaStreamQuery answers while work is pending


# cuFuncGetAttribute / cuFuncSetAttribute attribute numbers (CUfunction_attribute), as CuPy exports them.
_ATTR_MAX_THREADS = _driver.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
_ATTR_SHARED = _driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
_ATTR_LOCAL = _driver.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
_ATTR_REGS = _driver.CU_FUNC_ATTRIBUTE_NUM_REGS
_ATTR_MAX_DYNAMIC_SMEM = _driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


# ------------------------------------------------------------------------------------------------------------
# kernel arguments


def _scalar(value: Any):
    """A kernel scalar argument. Ints go as 64-bit: cuLaunchKernel copies as many bytes as the parameter
    has, so on a little-endian host one int64 serves an `int` and a `long long` parameter alike. Floats go as
    float32."""
    if isinstance(value, np.generic):
        return value
    if isinstance(value, bool):
        return np.int32(value)
    if isinstance(value, int):
        return np.int64(value)
    if isinstance(value, float):
        return np.float32(value)
    raise TypeError(f"kernel argument {value!r} is neither an array nor a number")


def _problem_dict(problem) -> dict[str, Any]:
    return dict(getattr(problem, "env", problem))


# ------------------------------------------------------------------------------------------------------------
# the evaluator


@dataclass
class _Loaded:
    module: Any
    functions: dict[str, Any]


@dataclass(frozen=True)
class _Resources:
    """What the driver reports of a config's functions, read before any launch."""

    attrs: dict[str, dict[str, int]]  # per entry: max_threads, regs, smem_static, local
    main_threads: int  # threads per block of the config's main launch
    blocks_per_sm: int  # of the main launch, resident at once
    warps_per_sm: int


class GpuEvaluator(Evaluator):
    """Measures compiled configs on one GPU. One per process; see the module docstring for the protocol.

    It holds two objects, each owning its state: `device` (`tuner.gpu.device.Device`: the CUDA context, a stream,
    the L2 flush buffer (2× the L2 size), the copy ceiling, the GPU's name, clocks and facts, the CuPy/NVRTC/CUDA
    versions, our device kernels) and `verification` (`tuner.gpu.checks.Verification`: the pools of input sets,
    their references, the correctness check of a config). Both are set up on first use (`start`). The evaluator
    itself owns the loaded modules (an LRU keyed by `Compiled.key`), the waits for the GPU and their deadline, and
    whether its context is poisoned.

    Hangs: once `set_deadline` has given it a `tuner.gpu.deadline.Deadline`, every wait for the GPU polls instead
    of blocking; a wait that covers runs of the user's kernel gives up after the deadline's seconds for those
    runs (`tuner.gpu.deadline.hang_deadline_s`, the clock starting once they are enqueued), any other wait (inputs,
    a reference on the GPU) after the deadline's ceiling. `hang_timeout_s`, when set, bounds every wait alike
    instead. A wait given up is a `TimedOut` with ``details["sticky"] = True``, and the evaluator is
    poisoned: a hung kernel cannot be stopped from inside the process, which must be replaced. With neither, a
    hang blocks, and `tuner.gpu.worker.IsolatedEvaluator` or the Ray pool kill the process at their ceiling.

    Implements `tuner.gpu.protocol.Evaluator`; its info carries the GPU's facts ("gpu_facts", read with
    cudaDeviceGetAttribute), which also set the launch limits checked before a launch.
    """

    measures = True

    def __init__(
        self,
        device: int = 0,
        *,
        gpu_index: int | None = None,
        ceiling_bytes: int = 2 * GiB,
        # ~50 copies of 2 GiB (one takes ~1 ms on an H200): a steady median, measured once per GPU and cached
        ceiling_budget_ms: float = 50.0,
        hang_timeout_s: float | None = None,
        module_cache_size: int = 256,
        max_reps: int = 10_000,
        ceiling: str = "cached",
        input_sets: int = verify.POOL_SIZE,
    ):
        """`device`: the CUDA device's index; `gpu_index`, `ceiling_bytes`, `ceiling_budget_ms` and `ceiling`
        ("cached" or "measure") as `Device` takes them; `input_sets`: kept per problem with their references
        (`tuner.gpu.verify`; 0: fresh inputs for every check)."""
        self.device = Device(
            device,
            gpu_index=gpu_index,
            ceiling_bytes=ceiling_bytes,
            ceiling_budget_ms=ceiling_budget_ms,
            ceiling=ceiling,
        )
        self.verification = Verification(self.device, input_sets, self._sync)
        self.hang_timeout_s = hang_timeout_s
        self.module_cache_size = module_cache_size
        self.max_reps = max_reps
        self.poisoned = False
        self.poisoned_by: LaunchFailed | TimedOut | None = None
        self.deadline: Deadline | None = None  # see `set_deadline`
        self._runs = 0  # runs of the user's kernel enqueued since the last wait (`_sync`)
        self._expected_s = 0.0  # one run's expected seconds, for the config being evaluated
        self._modules: OrderedDict[str, _Loaded] = OrderedDict()

    # -- set-up ----------------------------------------------------------------------------------------------

    def start(self) -> dict[str, Any]:
        """Set up the device (context, stream, flush buffer, ceiling) and the pools of input sets, once; return
        `info`."""
        info = self.device.start()
        self.verification.start()
        return info

    @property
    def info(self) -> dict[str, Any]:
        return self.start()

    @property
    def gpu_index(self) -> int:
        """The cluster-wide index its records name (the device's)."""
        return self.device.gpu_index

    @property
    def arch(self) -> str:
        """``sm_90`` on an H100/H200: what to compile for."""
        self.start()
        return self.device.arch

    @property
    def gpu_name(self) -> str:
        self.start()
        return self.device.gpu_name

    @property
    def ceiling_tbps(self) -> float:
        """The device-to-device copy's TB/s, measured once at start."""
        self.start()
        return self.device.ceiling_tbps

    def close(self) -> None:
        """Unload the cached modules and drop references still being computed ahead; the CUDA context goes
        with the process."""
        self._modules.clear()
        self.verification.close()

    def reserve(self, seed: int) -> None:
        """A later request with `seed` will come (the study's finalists): where the reference runs on the host,
        its input set is computed ahead, in the background, beside a problem's first set."""
        self.verification.reserve(seed)

    def set_deadline(self, deadline: Deadline | None) -> None:
        """Bound the waits of later evaluations by `deadline` (see the class docstring); None: unbounded."""
        self.deadline = deadline

    # -- waiting ---------------------------------------------------------------------------------------------
    def _wait_limit(self, runs: int) -> float | None:
        """Seconds a wait that covers `runs` runs of the user's kernel may take (None: unbounded)."""
        if self.deadline is None or self.hang_timeout_s is not None:  # a fixed bound asked for wins
            return self.hang_timeout_s
        if runs:
            return self.deadline.seconds(self._expected_s, runs)
        return self.deadline.ceiling_s  # our own work (inputs, a reference): not the user's kernel

    def _sync(self) -> None:
        """Wait for the stream, bounded by `_wait_limit` (polling; `Hung` past it)."""
        runs, self._runs = self._runs, 0
        limit = self._wait_limit(runs)
        if limit is None:
            self.device.stream.synchronize()
            return
        try:
            status = wait_until_done(
                functools.partial(_runtime.streamQuery, self.device.stream.ptr), limit, not_ready=NOT_READY
            )
        except Hung:
            raise Hung(limit, runs) from None
        if status != 0:
            raise _runtime.CUDARuntimeError(status)

    # -- modules ---------------------------------------------------------------------------------------------
    def _load(self, compiled, entries: list[str]) -> _Loaded:
        import hashlib

        import cupy

        key = compiled.key or hashlib.sha256(compiled.cubin).hexdigest()
        loaded = self._modules.get(key)
        if loaded is None:
            module = cupy.cuda.function.Module()
            module.load(compiled.cubin)
            loaded = _Loaded(module=module, functions={})
            self._modules[key] = loaded
            while len(self._modules) > self.module_cache_size:
                self._modules.popitem(last=False)  # the Module's destructor unloads it
        else:
            self._modules.move_to_end(key)
        for entry in entries:
            if entry not in loaded.functions:
                loaded.functions[entry] = loaded.module.get_function(entry)
        return loaded

    # -- evaluation ------------------------------------------------------------------------------------------
    def evaluate(self, request: EvaluateRequest) -> Result:
        """Check, then time one compiled config (`benchmark`'s protocol: the request's `budget_ms`, `min_reps`,
        `cutoff_ms`). Its `family` is a Family or a registered family's name; `config` the resolved config (params +
        derived); `problem` a Problem or its env dict (sizes, dtype). Returns a Measurement, LaunchFailed,
        WrongResult or TimedOut; raises EvaluatorPoisoned once a sticky error has destroyed the context, and
        anything else that is a bug."""
        if self.poisoned:
            raise EvaluatorPoisoned(
                f"GPU {self.gpu_index}: CUDA context lost earlier "
                f"({self.poisoned_by.reason if self.poisoned_by else 'unknown'})"
            )
        family = families.get(request.family) if isinstance(request.family, str) else request.family
        problem = _problem_dict(request.problem)
        self.start()
        phase = ["load"]
        try:
            # One stream for everything of this evaluation: CuPy's operations (allocations, uploads of a reference
            # computed ahead, a CuPy reference), our own kernels and the config's launches run on it in order.
            with self.device.cuda, self.device.stream:
                return self._evaluate(request, family, problem, phase)
        except CUDA_ERRORS as exc:
            failure = cuda_failure(exc, phase[0])
            if failure is None:
                raise
            if failure.details["sticky"]:
                self.poisoned, self.poisoned_by = True, failure
            return failure
        except MemoryError as exc:  # CuPy's OutOfMemoryError is one: the config's arrays do not fit
            return LaunchFailed(
                reason=f"{phase[0]}: out of GPU memory: {str(exc).splitlines()[0] if str(exc) else ''}",
                details={"status": 2, "sticky": False, "phase": phase[0], "message": str(exc)},
            )
        except Hung as hung:
            return self._hung(hung, phase[0])

    def _hung(self, hung: Hung, phase: str) -> TimedOut:
        """The TimedOut of a wait given up in `phase`; the evaluator is poisoned (the kernel never ends)."""
        details: dict[str, Any] = {"timeout_s": hung.seconds, "phase": phase, "sticky": True}
        if self.deadline is not None:
            details.update(self.deadline.details(self._expected_s, hung.runs))
        failure = TimedOut(
            reason=f"{phase}: the GPU did not finish within {hung.seconds:g} s (a hung kernel?); "
            "the worker must be replaced",
            details=details,
        )
        self.poisoned, self.poisoned_by = True, failure
        return failure

    def _evaluate(self, request: EvaluateRequest, family: Family, problem: dict[str, Any], phase: list[str]) -> Result:
        """One config through the protocol: its functions' resources and launch limits (no launch yet), the
        correctness check, the timing. `phase[0]` names the stage under way, for a failure raised in it."""
        compiled, config = request.compiled, request.config
        launches: list[Launch] = family.launches(compiled.entry, config, problem)
        if not launches:
            raise ValueError(f"{family.name}: launches() returned no launch")
        entries = list(dict.fromkeys(launch.entry for launch in launches))
        loaded = self._load(compiled, entries)
        # A run's expected time, for the deadline of the waits behind it: its bytes and one L2 flush (a timed
        # run follows one) over the copy ceiling, or the family's own estimate.
        flush_s = self.device.flush_bytes / (self.device.ceiling_tbps * 1e12) if self.device.ceiling_tbps else 0.0
        self._expected_s = expected_seconds(family, problem, config, self.device.ceiling_tbps) + flush_s
        self._runs = 0

        phase[0] = "launch configuration"
        resources = self._resources(compiled, loaded, launches, entries, phase[0])
        if isinstance(resources, LaunchFailed):
            return resources

        phase[0] = "correctness check"
        phases = dict.fromkeys(PHASES, 0.0)
        runner = functools.partial(self._runner, loaded, launches, problem=problem, config=config)
        checked = self.verification.check(request, family, problem, runner, phase, phases)
        if isinstance(checked, WrongResult):
            return checked

        phase[0] = "timing"
        given_up = self.device.hold.timeouts
        started = time.perf_counter()
        timing = benchmark(
            checked.run,
            stream=self.device.stream,
            budget_ms=request.budget_ms,
            min_reps=request.min_reps,
            max_reps=self.max_reps,
            flush=self.device.flush,
            sync=self._sync,
            cutoff_ms=request.cutoff_ms,
            warm=True,  # the correctness launch ran every launch of the config once
            hold=self.device.hold,
        )
        phases["timing"] = time.perf_counter() - started
        return self._measurement(compiled, family, problem, launches, resources, checked, timing, phases, given_up)

    # -- resources and launch limits (no launch yet) ---------------------------------------------------------
    def _resources(
        self, compiled, loaded: _Loaded, launches: list[Launch], entries: list[str], phase: str
    ) -> _Resources | LaunchFailed:
        """What the driver reports of each function (threads allowed, registers, static SMEM, local memory); a
        LaunchFailed for a launch beyond them or the device; the dynamic SMEM opted into where a launch needs
        more than the default allows; the occupancy of the config's main function."""
        attrs = {
            entry: {
                name: _driver.funcGetAttribute(attr, loaded.functions[entry].ptr)
                for name, attr in (
                    ("max_threads", _ATTR_MAX_THREADS),
                    ("regs", _ATTR_REGS),
                    ("smem_static", _ATTR_SHARED),
                    ("local", _ATTR_LOCAL),
                )
            }
            for entry in entries
        }
        dynamic_by_entry: dict[str, int] = {}
        for launch in launches:
            refused = self._refused(launch, attrs[launch.entry], phase)
            if refused is not None:
                return refused
            dynamic_by_entry[launch.entry] = max(dynamic_by_entry.get(launch.entry, 0), launch.smem_dynamic)
        for entry, dynamic in dynamic_by_entry.items():
            if dynamic and attrs[entry]["smem_static"] + dynamic > self.device.facts.smem_per_block:
                _driver.funcSetAttribute(loaded.functions[entry].ptr, _ATTR_MAX_DYNAMIC_SMEM, dynamic)
        main = next((launch for launch in launches if launch.entry == compiled.entry), launches[0])
        main_threads = math.prod(main.block)
        blocks_per_sm = _driver.occupancyMaxActiveBlocksPerMultiprocessor(
            loaded.functions[main.entry].ptr, main_threads, main.smem_dynamic
        )
        return _Resources(attrs, main_threads, blocks_per_sm, blocks_per_sm * ceil_div(main_threads, 32))

    def _refused(self, launch: Launch, attrs: dict[str, int], phase: str) -> LaunchFailed | None:
        """The LaunchFailed of a launch with more threads per block than its function allows, or more shared
        memory per block than the device has; None for a launch within both."""
        threads = math.prod(launch.block)
        if threads > attrs["max_threads"]:
            status = 1 if threads > self.device.facts.max_threads_per_block else 701
            return LaunchFailed(
                reason=f"{launch.entry}: {threads} threads per block, but the function allows at most "
                f"{attrs['max_threads']} (registers or launch bounds)",
                details={
                    "status": status,
                    "sticky": False,
                    "phase": phase,
                    "block_threads": threads,
                    "max_threads_per_block": attrs["max_threads"],
                },
            )
        smem_total = attrs["smem_static"] + launch.smem_dynamic
        if smem_total > self.device.smem_optin_bytes:
            return LaunchFailed(
                reason=f"{launch.entry}: {smem_total} bytes of shared memory per block "
                f"({attrs['smem_static']} static + {launch.smem_dynamic} dynamic) exceed the device's "
                f"{self.device.smem_optin_bytes}",
                details={
                    "status": 1,
                    "sticky": False,
                    "phase": phase,
                    "smem_bytes": smem_total,
                    "smem_limit": self.device.smem_optin_bytes,
                },
            )
        return None

    # -- the config's run --------------------------------------------------------------------------------------
    def _runner(
        self, loaded: _Loaded, launches: list[Launch], arrays: dict[str, Any], *, problem: dict[str, Any], config
    ) -> Callable[[], None]:
        """One run of the config: every launch, in order, on the stream, with its arguments bound now (an array
        by name, else a scalar from the problem or the config)."""
        stream = self.device.stream

        def argument(name: str):
            if name in arrays:
                return arrays[name]
            return _scalar(problem[name] if name in problem else config[name])

        calls = [
            (
                loaded.functions[launch.entry],
                tuple(launch.grid),
                tuple(launch.block),
                tuple(argument(name) for name in launch.args),
                launch.smem_dynamic,
            )
            for launch in launches
        ]

        def run() -> None:
            for function, grid, block, args, smem in calls:
                function(grid, block, args, shared_mem=smem, stream=stream)
            self._runs += 1  # the next wait covers this run: it is under the config's deadline

        return run

    # -- the measurement -------------------------------------------------------------------------------------
    def _measurement(
        self,
        compiled,
        family: Family,
        problem: dict[str, Any],
        launches: list[Launch],
        resources: _Resources,
        checked: Checked,
        timing,
        phases: dict[str, float],
        given_up: int,
    ) -> Measurement:
        """The Measurement of a config that passed its check and was timed, with every condition it names."""
        attrs = resources.attrs
        seconds = timing.median_ms * 1e-3
        bytes_moved = int(family.bytes_moved(problem))
        flops = int(family.flops(problem))
        tbps = bytes_moved / seconds / 1e12
        return Measurement(
            median_ms=timing.median_ms,
            p20_ms=timing.p20_ms,
            p80_ms=timing.p80_ms,
            repetitions=timing.repetitions,
            bytes_moved=bytes_moved,
            flops=flops,
            tbps=tbps,
            tflops=flops / seconds / 1e12,
            ceiling_tbps=self.device.ceiling_tbps,
            fraction_of_ceiling=tbps / self.device.ceiling_tbps,
            registers=max(attrs[launch.entry]["regs"] for launch in launches),
            smem_static_bytes=max(attrs[launch.entry]["smem_static"] for launch in launches),
            smem_dynamic_bytes=max(launch.smem_dynamic for launch in launches),
            spill_bytes=int(getattr(compiled, "spill_bytes", 0)),
            local_bytes=max(attrs[launch.entry]["local"] for launch in launches),
            blocks_per_sm=resources.blocks_per_sm,
            warps_per_sm=resources.warps_per_sm,
            max_abs_error=max(check.max_abs_error for check in checked.checks),
            max_rel_error=max(check.max_rel_error for check in checked.checks),
            gpu=self.device.gpu_name,
            gpu_index=self.gpu_index,
            clocks=self.device.clocks(),
            versions={**self.device.versions, "arch": compiled.arch, "verification": checked.verification},
            uri=compiled.uri,
            holds_given_up=self.device.hold.timeouts - given_up,
            threads_per_block=resources.main_threads,
            # the checked launch ran the same work as one repetition: counted at the median
            gpu_ms=timing.total_ms + timing.median_ms,
            phases_s=rounded(phases),
        )


# ------------------------------------------------------------------------------------------------------------
# the evaluator of a Ray actor


def gpu_evaluator(gpu_index: int) -> GpuEvaluator:
    """The evaluator a Ray actor builds on its GPU (`tuner.gpu.protocol.EvaluatorFactory`): Ray shows the actor
    only its own GPU, device 0 inside; `gpu_index` is the cluster-wide index kept in records."""
    evaluator = GpuEvaluator(0, gpu_index=gpu_index)
    evaluator.start()
    return evaluator
