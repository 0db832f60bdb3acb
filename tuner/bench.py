"""The in-process GPU evaluator: `Compiled` + family + config + problem → `Measurement` or a typed failure.

It runs inside a process that owns one GPU (a Ray actor, or the child of `tuner.worker.IsolatedEvaluator`)
and implements the timing protocol of DESIGN.md once, for every caller:

* correctness first: the inputs of one of the problem's pooled input sets, drawn again on the GPU from its seed
  (`tuner.verify`: two sets by default, taken in turn, each reference computed once and kept; an explicit seed
  is a fresh set whose reference is computed for it), outputs poisoned with NaN (all bytes 0xFF, a NaN in every
  IEEE float format), every launch of the config run, the outputs compared on the GPU with the reference:
  ``|out - ref| / max(|ref|, 1) <= tolerance`` element-wise, and any NaN fails; a reference that raises or
  answers the wrong shape or dtype is a `WrongResult` with ``details["phase"] = "reference"``, which stops a
  study (it is every config's reference);
* timing: one warm-up (the correctness launch serves as it), a first estimate from 3 repetitions, then enough
  repetitions for ``budget_ms`` of timed work (at least ``min_reps``) — unless the estimate is already above
  ``cutoff_ms`` (the study's screening: a config that far behind the best so far is not a contender, and its
  3-repetition median is figure enough to steer the search); before each repetition a read of a buffer twice
  the L2 size flushes L2 (`L2_FLUSH`), outside the timed region; one CUDA event pair per repetition around all
  the config's launches, on one stream; the repetitions are enqueued behind a stream hold, in batches
  (`LAUNCH_HOLD`), so that no timed region contains a wait for the host; the median and p20/p80 are reported;
* the ceiling: a device-to-device copy timed with the same protocol (`measure_ceiling`), once per GPU: the
  figure is kept in ``ceilings.json`` under the tuner cache dir, keyed by the GPU's UUID and name, the driver,
  the CuPy version and the flush (`ceiling_cache_key`), and reused while they hold (``tuner ceiling`` measures
  afresh);
* random inputs and the comparison run on `tuner.devicekernels` (compiled through our NVRTC cache), not on
  CuPy's JIT-compiled generators and ufuncs, so a fresh machine compiles nothing for them inside the worker.

`time_launches` is the only place in the package that records CUDA events.

Failures are decided by CUDA status codes (``CUDADriverError.status`` for driver calls: module load, launch;
``CUDARuntimeError.status`` for runtime calls: synchronize, memcpy), never by message text. A refused launch
is a `LaunchFailed` with ``details["sticky"] = False``; a fault that poisons the CUDA context (illegal
address, misaligned address, launch failure, ...) is a `LaunchFailed` with ``details["sticky"] = True`` and
marks the evaluator `poisoned`: its process must be replaced. Any other exception is a bug and propagates.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from cupy_backends.cuda.api import driver as _driver
from cupy_backends.cuda.api import runtime as _runtime

from tuner import families, verify
from tuner.deadline import Deadline, Hung, expected_seconds, wait_until_done
from tuner.evaluator import PHASES, fresh_seed
from tuner.expr import ceil_div
from tuner.gpufacts import GpuFacts
from tuner.kernels import bf16
from tuner.kernels.base import Family, Launch, ReferenceFailed
from tuner.result import LaunchFailed, Measurement, Result, TimedOut, WrongResult

__all__ = [
    "CUDA_ERRORS",
    "LAUNCH_STATUSES",
    "STICKY_STATUSES",
    "EvaluatorPoisoned",
    "GpuEvaluator",
    "OutputCheck",
    "Timing",
    "check_output",
    "gpu_evaluator",
    "classify_status",
    "cuda_failure",
    "measure_ceiling",
    "repetitions",
    "summarize",
    "time_launches",
]

GiB = 1 << 30
#: The exceptions CuPy raises for a failed CUDA call; both carry the CUDA status code as `.status`.
CUDA_ERRORS = (_driver.CUDADriverError, _runtime.CUDARuntimeError)

#: Status codes after which the CUDA context is unusable: every later call fails too, the process must go.
#: Driver (CUresult) and runtime (cudaError_t) use the same numbers for all of these (cuda.h, driver_types.h).
STICKY_STATUSES: dict[int, str] = {
    214: "ECC uncorrectable",
    226: "contained (hardware error)",
    700: "illegal address",
    702: "launch timeout",
    709: "context is destroyed",
    710: "device-side assert",
    714: "hardware stack error",
    715: "illegal instruction",
    716: "misaligned address",
    717: "invalid address space",
    718: "invalid program counter",
    719: "launch failed",
    721: "tensor memory leak",
    911: "external device",
    999: "unknown error",
}
#: Status codes of a refused launch (or a module that would not load): nothing ran, the context is fine.
LAUNCH_STATUSES: dict[int, str] = {
    1: "invalid value",
    2: "out of memory",
    98: "invalid device function",
    200: "invalid image",
    209: "no binary for this GPU",
    218: "invalid PTX",
    222: "unsupported PTX version",
    500: "entry point not found",
    701: "too many resources requested for launch",
    720: "cooperative launch too large",
}
_NOT_READY = 600  # cudaErrorNotReady: what cudaStreamQuery answers while work is pending

#: How the L2 is emptied before each timed launch (recorded with every measurement, in `versions`): a read of
#: twice the L2 (`tuner.devicekernels.ReadFlush`). A memset of the same size left the L2 full of dirty lines
#: whose write-back the next launch paid: on an H200, 8.5 us of a 38 us GEMV, 4 us of the same-bytes copy
#: (benchmarks/results/launch_gap-2026-12-01.md).
L2_FLUSH = "read 2x L2"

#: How the host's enqueue time is kept out of the timings (recorded with every measurement, in `versions`): the
#: repetitions are enqueued in batches behind a kernel that holds the stream until the whole batch is in
#: (`tuner.devicekernels.Hold`). Without it, a call whose host side takes longer than the GPU's flush and kernel
#: (a peer library's dispatch, or any call while the CPUs are busy) is timed with the GPU idle inside its event
#: pair, waiting for the launch.
LAUNCH_HOLD = "hold per batch of up to 16"
HOLD_BATCH = 16

# cuFuncGetAttribute / cuFuncSetAttribute attribute numbers (CUfunction_attribute), as CuPy exports them.
_ATTR_MAX_THREADS = _driver.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
_ATTR_SHARED = _driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
_ATTR_LOCAL = _driver.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
_ATTR_REGS = _driver.CU_FUNC_ATTRIBUTE_NUM_REGS
_ATTR_MAX_DYNAMIC_SMEM = _driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


class EvaluatorPoisoned(RuntimeError):
    """evaluate() was called on an evaluator whose CUDA context a sticky error has destroyed."""


# ------------------------------------------------------------------------------------------------------------
# status codes → failures


def classify_status(status: int | None) -> str | None:
    """``"sticky"`` (context lost), ``"launch"`` (launch refused, context fine) or None (not ours: a bug)."""
    if status in STICKY_STATUSES:
        return "sticky"
    if status in LAUNCH_STATUSES:
        return "launch"
    return None


def status_name(status: int) -> str:
    return STICKY_STATUSES.get(status) or LAUNCH_STATUSES.get(status) or "unclassified"


def cuda_failure(exc: BaseException, phase: str) -> LaunchFailed | None:
    """The LaunchFailed for a CUDA error raised while `phase` ran, or None when its status is not one we
    expect from a bad kernel (then the caller re-raises: it is a bug)."""
    status = getattr(exc, "status", None)
    if status is None:
        return None
    kind = classify_status(status)
    if kind is None:
        return None
    sticky = kind == "sticky"
    reason = f"{phase}: CUDA error {status} ({status_name(status)})"
    if sticky:
        reason += "; the CUDA context is lost and the worker must be replaced"
    return LaunchFailed(
        reason=reason, details={"status": int(status), "sticky": sticky, "phase": phase, "message": str(exc)}
    )


# ------------------------------------------------------------------------------------------------------------
# timing


@dataclass(frozen=True)
class Timing:
    """Per-call milliseconds over `repetitions` timed repetitions; `total_ms` sums every repetition timed on the
    way (the estimate's too): the GPU time the protocol spent on the call."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    repetitions: int
    total_ms: float = 0.0


def summarize(times_ms: list[float]) -> Timing:
    p20, median, p80 = np.percentile(np.asarray(times_ms, dtype=np.float64), [20, 50, 80])
    return Timing(
        median_ms=float(median),
        p20_ms=float(p20),
        p80_ms=float(p80),
        repetitions=len(times_ms),
        total_ms=float(np.sum(times_ms)),
    )


def repetitions(estimate_ms: float, budget_ms: float, min_reps: int = 10, max_reps: int = 10_000) -> int:
    """How many repetitions fill `budget_ms` of timed work, given one takes about `estimate_ms`; clamped to
    [min_reps, max_reps]."""
    if not math.isfinite(estimate_ms) or estimate_ms < 0:
        return min_reps
    if estimate_ms == 0:  # below the events' resolution
        return max(min_reps, max_reps)
    return int(min(max_reps, max(min_reps, round(budget_ms / estimate_ms))))


def enqueue_behind(hold, n: int, enqueue: Callable[[int], None]) -> list[int]:
    """Call ``enqueue(i)`` for i = 0 .. n-1 in order. Without a hold, in one go; with one
    (`tuner.devicekernels.Hold`), in batches of up to HOLD_BATCH, each between ``hold.hold()`` and
    ``hold.release()`` (released also when `enqueue` raises, so the stream is never left held); a batch the hold
    gave up on (``hold.gave_up()``: the host took longer than its timeout) halves the next one. Returns the
    batch sizes."""
    sizes: list[int] = []
    batch = HOLD_BATCH if hold is not None else n
    i = 0
    while i < n:
        size = min(batch, n - i)
        if hold is not None:
            hold.hold()
        try:
            for j in range(i, i + size):
                enqueue(j)
        finally:
            if hold is not None:
                hold.release()
        sizes.append(size)
        i += size
        if hold is not None and hold.gave_up():
            batch = max(1, batch // 2)
    return sizes


def time_launches(
    run: Callable[[], None],
    *,
    stream,
    reps: int,
    flush: Callable[[], None] | None = None,
    sync: Callable[[], None] | None = None,
    hold=None,
) -> list[float]:
    """Time `reps` calls of `run` (which enqueues its work on `stream`): for each, `flush` (outside the
    timed region), then a CUDA event pair around `run`. Everything is enqueued first and synchronized once at
    the end (`sync`, default ``stream.synchronize()``), so the host never waits between repetitions. With a
    `hold` (`tuner.devicekernels.Hold` on `stream`) the repetitions are enqueued behind it in batches
    (`enqueue_behind`), so that the GPU never waits for the host inside an event pair. Returns the
    per-repetition milliseconds. The only place in the package that records CUDA events."""
    import cupy

    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]

    def repetition(i: int) -> None:
        start, end = events[i]
        if flush is not None:
            flush()
        start.record(stream)
        run()
        end.record(stream)

    enqueue_behind(hold, reps, repetition)
    (sync or stream.synchronize)()
    if hold is not None:
        hold.gave_up()  # count a give-up of the last batch too
    return [cupy.cuda.get_elapsed_time(start, end) for start, end in events]


def benchmark(
    run: Callable[[], None],
    *,
    stream,
    budget_ms: float,
    min_reps: int = 10,
    max_reps: int = 10_000,
    flush: Callable[[], None] | None = None,
    sync: Callable[[], None] | None = None,
    cutoff_ms: float | None = None,
    warm: bool = False,
    hold=None,
) -> Timing:
    """The protocol around `time_launches`: one warm-up (skipped when `warm`: the caller has just run it), an
    estimate from 3 repetitions, then the budget, each behind `hold` when given (`LAUNCH_HOLD`). When the
    estimate's median exceeds `cutoff_ms`, the estimate is the result (3 repetitions) and the budget is not
    spent."""
    if not warm:
        run()
        (sync or stream.synchronize)()
    first = summarize(time_launches(run, stream=stream, reps=3, flush=flush, sync=sync, hold=hold))
    if cutoff_ms is not None and first.median_ms > cutoff_ms:
        return first
    estimate = first.median_ms
    reps = repetitions(estimate, budget_ms, min_reps, max_reps)
    timing = summarize(time_launches(run, stream=stream, reps=reps, flush=flush, sync=sync, hold=hold))
    return dataclasses.replace(timing, total_ms=timing.total_ms + first.total_ms)


def measure_ceiling(
    device_buffer_bytes: int = 2 * GiB,
    budget_ms: float = 50.0,
    min_reps: int = 10,
    stream=None,
    flush: Callable[[], None] | None = None,
) -> float:
    """TB/s of a device-to-device cudaMemcpyAsync of `device_buffer_bytes` (source and destination each that
    size), counted as read + write (2 × size), timed with the kernels' protocol on the current device."""
    import cupy

    stream = stream or cupy.cuda.Stream(non_blocking=True)
    timing = _time_copy(device_buffer_bytes, stream, budget_ms, min_reps, flush)
    cupy.get_default_memory_pool().free_all_blocks()  # give the copy's buffers back to the kernels
    return 2 * device_buffer_bytes / (timing.median_ms * 1e-3) / 1e12


def _time_copy(nbytes: int, stream, budget_ms: float, min_reps: int, flush) -> Timing:
    import cupy

    with stream:
        src = cupy.empty(nbytes, dtype=cupy.uint8)
        dst = cupy.empty(nbytes, dtype=cupy.uint8)
        src.data.memset_async(1, nbytes, stream)  # touch both: no first-use cost in the timing
        dst.data.memset_async(0, nbytes, stream)

        def run() -> None:
            _runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, _runtime.memcpyDeviceToDevice, stream.ptr)

        return benchmark(run, stream=stream, budget_ms=budget_ms, min_reps=min_reps, flush=flush)


# ------------------------------------------------------------------------------------------------------------
# correctness


@dataclass(frozen=True)
class OutputCheck:
    """One output compared with its reference. Errors: abs = |out - ref|, rel = |out - ref| / max(|ref|, 1),
    the figure the tolerance bounds; NaN elements count as mismatches and are left out of the maxima."""

    name: str
    elements: int
    mismatches: int
    nan_count: int
    max_abs_error: float
    max_rel_error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def describe(self) -> str:
        text = (
            f"{self.name}: {self.mismatches} of {self.elements} elements off (max abs error "
            f"{self.max_abs_error:.3g}, max rel error {self.max_rel_error:.3g}, "
            f"tolerance {self.tolerance:g}"
        )
        return text + (f", {self.nan_count} NaN)" if self.nan_count else ")")


def check_output(xp, name: str, out, ref, tolerance: float) -> OutputCheck:
    """Compare `out` with `ref` on `xp` (numpy or cupy: the data never leaves the device)."""
    o = out.astype(xp.float64)
    r = xp.asarray(ref).astype(xp.float64)
    if o.shape != r.shape:
        raise ValueError(f"output {name!r} has shape {o.shape} but its reference has {r.shape}")
    if o.size == 0:
        return OutputCheck(name, 0, 0, 0, 0.0, 0.0, tolerance)
    diff = xp.abs(o - r)
    rel = diff / xp.maximum(xp.abs(r), 1.0)
    finite = ~xp.isnan(rel)
    mismatches = int((~(rel <= tolerance)).sum())  # NaN compares False: a NaN is a mismatch
    nan_count = int(xp.isnan(o).sum())
    max_abs = float(xp.where(finite, diff, 0.0).max())
    max_rel = float(xp.where(finite, rel, 0.0).max())
    return OutputCheck(name, int(o.size), mismatches, nan_count, max_abs, max_rel, tolerance)


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


def _np_dtype(name: str):
    """The array dtype that stores `name`: bfloat16 travels as uint16 bits (tuner.kernels.bf16)."""
    if name == "bfloat16":
        return np.dtype(bf16.STORAGE)
    return np.dtype(name)


def _rounded(phases: dict[str, float]) -> dict[str, float]:
    return {name: round(seconds, 6) for name, seconds in phases.items()}


def _problem_dict(problem) -> dict[str, Any]:
    return dict(getattr(problem, "env", problem))


# ------------------------------------------------------------------------------------------------------------
# the evaluator


@dataclass
class _Loaded:
    module: Any
    functions: dict[str, Any]


#: Threads that compute host references ahead (`tuner.verify`): the pool's second set and the finalists' at once.
AHEAD_THREADS = 2


class GpuEvaluator:
    """Measures compiled configs on one GPU. One per process; see the module docstring for the protocol.

    Set-up happens on first use (`start`): the CUDA context, a stream, the L2 flush buffer (2× the L2 size),
    the copy ceiling, the GPU's name, clocks (static ones; NVML's current clocks too where nvidia-ml-py is
    installed) and the CuPy/NVRTC/CUDA versions. Loaded modules are kept in an LRU keyed by `Compiled.key`.

    Hangs: once `set_deadline` has given it a `tuner.deadline.Deadline`, every wait for the GPU polls instead
    of blocking; a wait that covers runs of the user's kernel gives up after the deadline's seconds for those
    runs (`tuner.deadline.hang_deadline_s`, the clock starting once they are enqueued), any other wait (inputs,
    a reference on the GPU) after the deadline's ceiling. `hang_timeout_s`, when set, bounds every wait alike
    instead. A wait given up is a `TimedOut` with ``details["sticky"] = True``, and the evaluator is
    poisoned: a hung kernel cannot be stopped from inside the process, which must be replaced. With neither, a
    hang blocks, and `tuner.worker.IsolatedEvaluator` or the Ray pool kill the process at their ceiling.

    Implements `tuner.evaluator.Evaluator`; its info carries the GPU's facts ("gpu_facts", read with
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
        self.device = device
        self.gpu_index = device if gpu_index is None else gpu_index
        self.ceiling_bytes = ceiling_bytes
        self.ceiling_budget_ms = ceiling_budget_ms
        self.hang_timeout_s = hang_timeout_s
        self.module_cache_size = module_cache_size
        self.max_reps = max_reps
        if ceiling not in ("cached", "measure"):
            raise ValueError(f"ceiling must be 'cached' or 'measure', not {ceiling!r}")
        #: "cached": reuse the ceiling measured earlier on this GPU (same UUID, driver, CuPy, buffer and budget;
        #: see `ceiling_cache_key`), measuring and storing it when there is none; "measure": always measure
        self.ceiling_mode = ceiling
        #: input sets kept per problem with their references (`tuner.verify`); 0: fresh inputs for every check
        self.input_sets = input_sets
        self.poisoned = False
        self.poisoned_by: LaunchFailed | TimedOut | None = None
        self.deadline: Deadline | None = None  # see `set_deadline`
        self._runs = 0  # runs of the user's kernel enqueued since the last wait (`_sync`)
        self._expected_s = 0.0  # one run's expected seconds, for the config being evaluated
        self._started = False
        self._modules: OrderedDict[str, _Loaded] = OrderedDict()
        self._reserved: int | None = None  # the seed a later check asks for (`reserve`)
        self._nvml_max_sm: int | None = None
        self._ahead: ThreadPoolExecutor | None = None  # computes host references ahead (`tuner.verify`)

    # -- set-up ----------------------------------------------------------------------------------------------
    def start(self) -> dict[str, Any]:
        """Create the context, flush buffer and stream, measure the ceiling (once); return `info`."""
        if not self._started:
            self._start()
            self._started = True
        return self._info()

    def _start(self) -> None:
        import cupy

        from tuner import devicekernels
        from tuner.build.compile import versions as compile_versions

        t0 = time.perf_counter()
        self._device = cupy.cuda.Device(self.device)
        self._arch = f"sm_{self._device.compute_capability}"
        # Our random-input kernels and the checks every shipped family uses compile (or come from the compile
        # cache) while the context, the flush buffer and the ceiling are set up: NVRTC releases the GIL.
        first = devicekernels.Built(devicekernels.FIRST_CHECKS, self._arch, uri="tuner_worker_kernels_first")
        self._device.use()
        props = _runtime.getDeviceProperties(self.device)
        name = props.get("name", b"")
        self._gpu_name = name.decode() if isinstance(name, bytes) else str(name)
        uuid = props.get("uuid", b"")
        self._gpu_uuid = uuid.hex() if isinstance(uuid, bytes) else str(uuid)
        self.facts = GpuFacts.from_device(self.device)
        self.l2_bytes = self.facts.l2_bytes
        self.sm_count = self.facts.sm_count
        self.smem_optin_bytes = self.facts.smem_per_block_max
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.flush_bytes = max(2 * self.l2_bytes, 8 << 20)
        with self.stream:
            self._flush_buf = cupy.empty(self.flush_bytes, dtype=cupy.uint8)
            self._flush_buf.data.memset_async(0, self.flush_bytes, self.stream)  # the read flush's zeros
            self._flush_sink = cupy.empty(1, dtype=cupy.uint32)
        self.versions = {
            **compile_versions(),
            "cuda_driver": _runtime.driverGetVersion(),
            "cuda_runtime": _runtime.runtimeGetVersion(),
            "l2_flush": L2_FLUSH,  # part of the ceiling's cache key too: a ceiling timed another way is stale
            "launch_hold": LAUNCH_HOLD,
        }
        self._static_clocks = self._read_static_clocks()
        self._nvml = self._open_nvml()
        t_context = time.perf_counter()
        # The flush is PTX the driver loads (no NVRTC): the ceiling is timed with it while our NVRTC module builds.
        self._read_flush = devicekernels.ReadFlush(self.stream)
        self.hold = devicekernels.Hold(self.stream)
        self._flush()
        key = ceiling_cache_key(
            self._gpu_uuid, self._gpu_name, self.versions, self.ceiling_bytes, self.ceiling_budget_ms
        )
        cached = read_cached_ceiling(key) if self.ceiling_mode == "cached" else None
        if cached is None:
            self._ceiling_tbps = measure_ceiling(
                self.ceiling_bytes, self.ceiling_budget_ms, stream=self.stream, flush=self._flush
            )
            store_ceiling(key, self._ceiling_tbps, self._gpu_name)
        else:
            self._ceiling_tbps = cached
        t_ceiling = time.perf_counter()
        built = first.result()
        if built is None or not built.ok:
            raise RuntimeError(f"the worker's own kernels did not compile: {getattr(built, 'reason', '?')}")
        # The checks of the other dtypes (a family of one's own may store int8 or float64) compile behind the
        # first trials; a check that needs one waits for them.
        later = devicekernels.Built(devicekernels.LATER_CHECKS, self._arch, uri="tuner_worker_kernels_rest")
        self._kernels = devicekernels.DeviceKernels(built, self.stream, devicekernels.FIRST_CHECKS, later)
        self._pool = verify.InputPool.for_device(_runtime.memGetInfo()[1], self.input_sets)
        if self._reserved is not None:
            self._pool.reserve(self._reserved)
        t_done = time.perf_counter()
        self.startup = {
            # monotonic clock stamps (system-wide on Linux): the driver turns them into seconds from its command
            "began_at": t0,
            "context_done_at": t_context,
            "ceiling_done_at": t_ceiling,
            "ready_at": t_done,
            "context_s": round(t_context - t0, 3),
            "ceiling_s": round(t_ceiling - t_context, 3),
            "ceiling_cached": cached is not None,
            "worker_kernels_wait_s": round(t_done - t_ceiling, 3),
            "worker_kernels_cached": bool(built.cached),
        }

    @property
    def gpu_name(self) -> str:
        self.start()
        return self._gpu_name

    @property
    def arch(self) -> str:
        """``sm_90`` on an H100/H200: what to compile for."""
        self.start()
        return self._arch

    @property
    def ceiling_tbps(self) -> float:
        """The device-to-device copy's TB/s, measured once at start."""
        self.start()
        return self._ceiling_tbps

    @property
    def info(self) -> dict[str, Any]:
        return self.start()

    def _info(self) -> dict[str, Any]:
        return {
            "gpu": self._gpu_name,
            "gpu_index": self.gpu_index,
            "arch": self._arch,
            "ceiling_tbps": self._ceiling_tbps,
            "l2_bytes": self.l2_bytes,
            "flush_bytes": self.flush_bytes,
            "sm_count": self.sm_count,
            "gpu_facts": self.facts.to_dict(),
            "clocks": self.clocks(),
            "versions": dict(self.versions),
            "pid": os.getpid(),
            "uuid": self._gpu_uuid,
            "startup": dict(self.startup),
        }

    def _flush(self) -> None:
        """Evict the L2 before a timed launch: read `flush_bytes` (twice the L2) of zeros (L2_FLUSH)."""
        self._read_flush(self._flush_buf, self._flush_sink)

    def _check(self, name: str, out, ref, tolerance: float) -> OutputCheck:
        """`check_output` on the device with our own kernel (no CuPy JIT); CuPy's path for dtypes it lacks."""
        import cupy

        ref = cupy.asarray(ref)
        counted = self._kernels.check(out, ref, tolerance) if out.size else None
        if counted is None:
            return check_output(cupy, name, out, ref, tolerance)
        mismatches, nans, max_abs, max_rel = counted
        return OutputCheck(name, int(out.size), mismatches, nans, max_abs, max_rel, tolerance)

    def _read_static_clocks(self) -> dict[str, Any]:
        clocks: dict[str, Any] = {}
        for key, attr in (
            ("sm_clock_max_mhz", "cudaDevAttrClockRate"),
            ("mem_clock_max_mhz", "cudaDevAttrMemoryClockRate"),
        ):
            try:
                clocks[key] = _runtime.deviceGetAttribute(getattr(_runtime, attr), self.device) // 1000
            except (AttributeError, _runtime.CUDARuntimeError):
                pass  # attribute dropped by this CUDA version: clocks are informative only
        return clocks

    def _open_nvml(self):
        """(pynvml, handle) for this GPU when nvidia-ml-py is installed and NVML answers; else None."""
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            return pynvml, pynvml.nvmlDeviceGetHandleByPciBusId(self._device.pci_bus_id)
        except Exception:  # optional telemetry (NVMLError, or a pynvml that wants bytes): never fatal
            return None

    def clocks(self) -> dict[str, Any]:
        """Static clocks, plus NVML's current SM/memory clocks where available (never fatal)."""
        clocks = dict(getattr(self, "_static_clocks", {}))
        nvml = getattr(self, "_nvml", None)
        if nvml is None:
            return clocks
        pynvml, handle = nvml
        try:
            clocks["sm_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
            clocks["mem_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)
            if self._nvml_max_sm is None:  # a fixed property of the board: read once (~1 ms a call)
                self._nvml_max_sm = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
            clocks["sm_clock_max_mhz"] = self._nvml_max_sm
        except Exception:  # optional telemetry: never fatal
            pass
        return clocks

    def close(self) -> None:
        """Unload the cached modules and drop references still being computed ahead; the CUDA context goes
        with the process."""
        self._modules.clear()
        if self._ahead is not None:
            self._ahead.shutdown(wait=False, cancel_futures=True)

    def reserve(self, seed: int) -> None:
        """A later `evaluate(seed=seed)` will come (the study's finalists): where the reference runs on the host,
        its input set is computed ahead, in the background, beside a problem's first set."""
        self._reserved = seed
        if self._started:
            self._pool.reserve(seed)

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
            self.stream.synchronize()
            return
        try:
            status = wait_until_done(
                functools.partial(_runtime.streamQuery, self.stream.ptr), limit, not_ready=_NOT_READY
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
    def evaluate(
        self,
        compiled,
        family: Family | str,
        config: dict[str, Any],
        problem,
        seed: int | None = None,
        budget_ms: float = 25.0,
        min_reps: int = 10,
        cutoff_ms: float | None = None,
    ) -> Result:
        """Check, then time one compiled config (`benchmark`'s protocol: `budget_ms`, `min_reps`, `cutoff_ms`).
        `family` is a Family or a registered family's name; `config` the resolved config (params + derived);
        `problem` a Problem or its env dict (sizes, dtype). Returns a Measurement, LaunchFailed, WrongResult or
        TimedOut; raises EvaluatorPoisoned once a sticky error has destroyed the context, and anything else that
        is a bug."""
        if self.poisoned:
            raise EvaluatorPoisoned(
                f"GPU {self.gpu_index}: CUDA context lost earlier "
                f"({self.poisoned_by.reason if self.poisoned_by else 'unknown'})"
            )
        if isinstance(family, str):
            family = families.get(family)
        problem = _problem_dict(problem)
        self.start()
        phase = ["load"]
        try:
            with self._device:
                return self._evaluate(compiled, family, config, problem, seed, budget_ms, min_reps, cutoff_ms, phase)
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

    def _evaluate(
        self, compiled, family: Family, config, problem, seed, budget_ms, min_reps, cutoff_ms, phase: list[str]
    ) -> Result:
        import cupy

        launches: list[Launch] = family.launches(compiled.entry, config, problem)
        if not launches:
            raise ValueError(f"{family.name}: launches() returned no launch")
        entries = list(dict.fromkeys(launch.entry for launch in launches))
        loaded = self._load(compiled, entries)
        # A run's expected time, for the deadline of the waits behind it: its bytes and one L2 flush (a timed
        # run follows one) over the copy ceiling, or the family's own estimate.
        flush_s = self.flush_bytes / (self._ceiling_tbps * 1e12) if self._ceiling_tbps else 0.0
        self._expected_s = expected_seconds(family, problem, config, self._ceiling_tbps) + flush_s
        self._runs = 0

        # -- resources and launch limits (no launch yet) --
        phase[0] = "launch configuration"
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
            a = attrs[launch.entry]
            threads = math.prod(launch.block)
            if threads > a["max_threads"]:
                status = 1 if threads > self.facts.max_threads_per_block else 701
                return LaunchFailed(
                    reason=f"{launch.entry}: {threads} threads per block, but the function allows at most "
                    f"{a['max_threads']} (registers or launch bounds)",
                    details={
                        "status": status,
                        "sticky": False,
                        "phase": phase[0],
                        "block_threads": threads,
                        "max_threads_per_block": a["max_threads"],
                    },
                )
            smem_total = a["smem_static"] + launch.smem_dynamic
            if smem_total > self.smem_optin_bytes:
                return LaunchFailed(
                    reason=f"{launch.entry}: {smem_total} bytes of shared memory per block "
                    f"({a['smem_static']} static + {launch.smem_dynamic} dynamic) exceed the device's "
                    f"{self.smem_optin_bytes}",
                    details={
                        "status": 1,
                        "sticky": False,
                        "phase": phase[0],
                        "smem_bytes": smem_total,
                        "smem_limit": self.smem_optin_bytes,
                    },
                )
            dynamic_by_entry[launch.entry] = max(dynamic_by_entry.get(launch.entry, 0), launch.smem_dynamic)
        for entry, dynamic in dynamic_by_entry.items():
            if dynamic and attrs[entry]["smem_static"] + dynamic > self.facts.smem_per_block:
                _driver.funcSetAttribute(loaded.functions[entry].ptr, _ATTR_MAX_DYNAMIC_SMEM, dynamic)
        main = next((launch for launch in launches if launch.entry == compiled.entry), launches[0])
        main_threads = math.prod(main.block)
        blocks_per_sm = _driver.occupancyMaxActiveBlocksPerMultiprocessor(
            loaded.functions[main.entry].ptr, main_threads, main.smem_dynamic
        )
        warps_per_sm = blocks_per_sm * ceil_div(main_threads, 32)

        # -- correctness --
        phase[0] = "correctness check"
        stream = self.stream
        phases = dict.fromkeys(PHASES, 0.0)
        outputs_spec = family.outputs(problem, config)
        key = verify.pool_key(family, problem, config)
        explicit = seed is not None  # an explicit seed: a fresh set, beside the pool's (shared by the finalists)
        self._settle_ahead(phases)
        pooled = self._pool.fresh(key, seed) if seed is not None else self._pool.draw(key)
        if pooled is not None and pooled.pending is not None:  # an explicit set computed ahead: wait for it
            self._settle(key, pooled, phases)
        if pooled is not None:
            seed = pooled.seed
        else:
            seed = fresh_seed()
        with stream:
            inputs = self._inputs(family, problem, seed, phases)
            # A checked name that is not an output is an input the kernel updates in place.
            checked_dtypes = {name: dtype for name, (_, dtype) in outputs_spec.items()}
            checked_dtypes.update(
                (name, np.dtype(inputs[name].dtype).name)
                for name in family.checked()
                if name not in outputs_spec and name in inputs
            )
            kept = pooled is not None and pooled.ready
            if not kept and not explicit and pooled is not None and family.reference_on_host():
                # The key's first set: the other sets' references (the pool's second, the finalists') start on
                # the host in the background now, so that all of them are ready about when this one is.
                for later in self._pool.ahead(key):
                    self._compute_ahead(family, problem, config, checked_dtypes, later, phases)
            try:
                reference = self._reference(family, inputs, problem, config, checked_dtypes, pooled, key, phases)
            except ReferenceFailed as exc:  # the user's reference: the same for every config, so the study stops
                return WrongResult(
                    reason=str(exc), details={"phase": "reference", "seed": seed, "phases_s": _rounded(phases)}
                )
            outputs = {name: cupy.empty(shape, dtype=_np_dtype(dtype)) for name, (shape, dtype) in outputs_spec.items()}
            arrays = {**inputs, **outputs}

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

            checks = self._checked_launch(family, problem, outputs_spec, arrays, outputs, reference, run, phase, phases)
            if kept and not all(check.ok for check in checks):
                checks = self._recheck(family, problem, config, key, pooled, checks, arrays, checked_dtypes, phases)
            elif kept and pooled is not None:
                pooled.confirmed = True  # matched on inputs drawn again: the set comes back from its seed
            del reference
        bad = [check for check in checks if not check.ok]
        if bad:
            worst = bad[0]
            return WrongResult(
                reason="; ".join(check.describe() for check in bad),
                details={
                    "output": worst.name,
                    "max_abs_error": worst.max_abs_error,
                    "max_rel_error": worst.max_rel_error,
                    "mismatches": worst.mismatches,
                    "elements": worst.elements,
                    "nan_count": worst.nan_count,
                    "tolerance": worst.tolerance,
                    "seed": seed,
                    "verification": "fresh input set" if explicit else self._pool.protocol(key),
                    "phases_s": _rounded(phases),
                },
            )

        # -- timing --
        phase[0] = "timing"
        given_up = self.hold.timeouts
        started = time.perf_counter()
        timing = benchmark(
            run,
            stream=stream,
            budget_ms=budget_ms,
            min_reps=min_reps,
            max_reps=self.max_reps,
            flush=self._flush,
            sync=self._sync,
            cutoff_ms=cutoff_ms,
            warm=True,  # the correctness launch above ran every launch of the config once
            hold=self.hold,
        )
        phases["timing"] = time.perf_counter() - started

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
            ceiling_tbps=self._ceiling_tbps,
            fraction_of_ceiling=tbps / self._ceiling_tbps,
            registers=max(attrs[launch.entry]["regs"] for launch in launches),
            smem_static_bytes=max(attrs[launch.entry]["smem_static"] for launch in launches),
            smem_dynamic_bytes=max(launch.smem_dynamic for launch in launches),
            spill_bytes=int(getattr(compiled, "spill_bytes", 0)),
            local_bytes=max(attrs[launch.entry]["local"] for launch in launches),
            blocks_per_sm=blocks_per_sm,
            warps_per_sm=warps_per_sm,
            max_abs_error=max(check.max_abs_error for check in checks),
            max_rel_error=max(check.max_rel_error for check in checks),
            gpu=self._gpu_name,
            gpu_index=self.gpu_index,
            clocks=self.clocks(),
            versions={
                **self.versions,
                "arch": compiled.arch,
                "verification": "fresh input set" if explicit else self._pool.protocol(key),
            },
            uri=compiled.uri,
            holds_given_up=self.hold.timeouts - given_up,
            threads_per_block=main_threads,
            # the checked launch ran the same work as one repetition: counted at the median
            gpu_ms=timing.total_ms + timing.median_ms,
            phases_s=_rounded(phases),
        )

    # -- the check's stages (see tuner.verify for the pool) -------------------------------------------------
    def _inputs(self, family: Family, problem, seed: int, phases: dict[str, float]) -> dict[str, Any]:
        """The input set of `seed`, drawn on the GPU by our generator (the same arrays for the same seed)."""
        import cupy

        started = time.perf_counter()
        inputs = family.inputs(cupy, problem, self._kernels.rng(seed))
        self._sync()
        phases["inputs"] += time.perf_counter() - started
        return inputs

    def _reference(self, family, inputs, problem, config, checked_dtypes, pooled, key, phases) -> dict[str, Any]:
        """The reference of this check: the pooled set's kept one, else computed (and kept, for a pooled set)."""
        import cupy

        started = time.perf_counter()
        try:
            if pooled is not None and pooled.ready:
                return pooled.reference()
            what = f"reference of {family.name}"
            try:
                expected = family.reference(cupy, inputs, problem, config=config)
            except (cupy.cuda.memory.OutOfMemoryError, MemoryError) as exc:
                raise ReferenceFailed(f"{what} ran out of memory: {exc}".splitlines()[0]) from None
            reference = verify.normalize_reference(expected, family, problem, config, checked_dtypes, what)
            if pooled is not None:
                self._pool.keep(key, pooled, reference)
            return reference
        finally:
            self._sync()
            phases["reference"] += time.perf_counter() - started

    def _compute_ahead(self, family, problem, config, checked_dtypes, later: verify.InputSet, phases) -> None:
        """Start computing `later`'s reference on the host in the background: its inputs drawn here (on the GPU,
        between configs) and copied to the host, the reference then run by a thread of host code only."""
        import cupy

        inputs = self._inputs(family, problem, later.seed, phases)
        started = time.perf_counter()
        host = {name: value.get() if isinstance(value, cupy.ndarray) else value for name, value in inputs.items()}
        del inputs
        phases["reference"] += time.perf_counter() - started
        if self._ahead is None:
            # A thread per set computed ahead (the pool's second and the finalists'): a NumPy reference runs on
            # one core, so both are ready one reference's time after the first, not two.
            self._ahead = ThreadPoolExecutor(AHEAD_THREADS, thread_name_prefix="tuner-reference")
        later.pending = self._ahead.submit(verify.host_reference, family, host, problem, config, checked_dtypes)
        later.finish = functools.partial(
            verify.normalize_reference,
            family=family,
            problem=problem,
            config=config,
            checked_dtypes=checked_dtypes,
            what=f"reference of {family.name}",
        )

    def _settle_ahead(self, phases) -> None:
        """Keep every reference computed ahead that is ready by now (uploaded between configs)."""
        for key, later in self._pool.pending():
            if later.pending.done():
                self._settle(key, later, phases)

    def _settle(self, key, later: verify.InputSet, phases) -> None:
        started = time.perf_counter()
        self._pool.settle(key, later)
        self._sync()
        phases["reference"] += time.perf_counter() - started

    def _checked_launch(
        self, family, problem, outputs_spec, arrays, outputs, reference, run, phase, phases
    ) -> list[OutputCheck]:
        """Poison the outputs, run every launch of the config once, compare with `reference`."""

        started = time.perf_counter()
        for array in outputs.values():
            if array.nbytes:
                array.data.memset_async(0xFF, array.nbytes, self.stream)  # NaN in every IEEE float format
        phase[0] = "launch"
        run()
        self._sync()
        phase[0] = "correctness check"
        phases["launch"] += time.perf_counter() - started
        return self._compare(family, problem, outputs_spec, arrays, reference, phases)

    def _compare(self, family, problem, outputs_spec, arrays, reference, phases) -> list[OutputCheck]:
        """Each checked output (or in-place input) of `arrays` against `reference`, within the family's tolerance."""
        import cupy

        started = time.perf_counter()
        tolerance = family.tolerance(problem)
        out_dtypes = {name: dtype for name, (_, dtype) in outputs_spec.items()}
        checks = [
            self._check(
                name,
                family.checked_value(cupy, name, arrays[name], out_dtypes.get(name)),
                reference[name],
                tolerance[name] if isinstance(tolerance, dict) else tolerance,
            )
            for name in (family.checked() or tuple(reference))
        ]
        phases["compare"] += time.perf_counter() - started
        return checks

    def _recheck(self, family, problem, config, key, pooled, checks, arrays, checked_dtypes, phases):
        """A mismatch against a kept reference: before the config is blamed, compare again with the reference
        restored from its host copy (a kernel of an earlier config may have written over the device copy) and,
        while no config has matched this set yet, with a reference computed afresh from the inputs the kernel
        read (drawn again from the seed where the kernel updates some in place). A fresh reference that the output
        matches means the family's inputs do not come back from their seed: its key leaves the pool."""
        import cupy

        outputs_spec = family.outputs(problem, config)

        def compare(reference) -> list[OutputCheck]:
            return self._compare(family, problem, outputs_spec, arrays, reference, phases)

        restored = pooled.restore()
        if restored is not None:
            checks = compare(restored)
            if all(check.ok for check in checks):
                return checks
        if pooled.confirmed:
            return checks
        in_place = [name for name in family.checked() if name not in family.outputs(problem, config)]
        # The inputs the kernel read, unless it updated some in place: then drawn again from the seed.
        fresh_inputs = (
            self._inputs(family, problem, pooled.seed, phases)
            if in_place
            else {name: arrays[name] for name in arrays if name not in family.outputs(problem, config)}
        )
        started = time.perf_counter()
        expected = family.reference(cupy, fresh_inputs, problem, config=config)
        reference = verify.normalize_reference(expected, family, problem, config, checked_dtypes)
        self._sync()
        phases["reference"] += time.perf_counter() - started
        again = compare(reference)
        if all(check.ok for check in again):
            self._pool.forget(key, "its inputs did not come back from their seed: drawn afresh for every check")
        return again


# ------------------------------------------------------------------------------------------------------------
# the ceiling, measured once per GPU


def ceiling_cache_key(uuid: str, name: str, versions: dict[str, Any], nbytes: int, budget_ms: float) -> str:
    """What a stored ceiling is valid for: this GPU (UUID and name), its driver, CuPy/NVRTC/CUDA runtime versions,
    and the copy's size and budget. A new driver or another GPU in the same slot measures again."""
    return "|".join(
        [
            uuid,
            name,
            str(versions.get("cuda_driver")),
            str(versions.get("cuda_runtime")),
            str(versions.get("cupy")),
            str(nbytes),
            f"{budget_ms:g}",
        ]
    )


def _ceiling_file():
    from tuner.build.compile import cache_dir

    return cache_dir() / "ceilings.json"


def read_cached_ceiling(key: str) -> float | None:
    """The ceiling stored under `key` (TB/s), or None."""
    import json

    try:
        entry = json.loads(_ceiling_file().read_text()).get(key)
    except (FileNotFoundError, json.JSONDecodeError, AttributeError):
        return None
    value = entry.get("ceiling_tbps") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def store_ceiling(key: str, tbps: float, gpu: str) -> None:
    """Add a measured ceiling to the cache file (atomically replaced; a lost race loses one entry, re-measured
    next time)."""
    import datetime as dt
    import json

    from tuner.build.files import atomic_write
    from tuner.errors import InputError

    path = _ceiling_file()
    try:
        table = json.loads(path.read_text())
        if not isinstance(table, dict):
            table = {}
    except (FileNotFoundError, json.JSONDecodeError):
        table = {}
    table[key] = {"ceiling_tbps": tbps, "gpu": gpu, "measured_at": dt.datetime.now(dt.UTC).isoformat()}
    try:
        atomic_write(path, json.dumps(table, indent=1), make_parents=True)
    except (OSError, InputError):  # a read-only cache dir: measured each time, nothing else changes
        pass


def gpu_evaluator(gpu_index: int) -> GpuEvaluator:
    """The evaluator a Ray actor builds on its GPU (`tuner.evaluator.EvaluatorFactory`): Ray shows the actor
    only its own GPU, device 0 inside; `gpu_index` is the cluster-wide index kept in records."""
    evaluator = GpuEvaluator(0, gpu_index=gpu_index)
    evaluator.start()
    return evaluator


# `tuner.bench(space, config)` is the API call `tuner.api.bench`; the module stays importable as ever.
from tuner.api import callable_module as _callable_module  # noqa: E402

_callable_module(__name__)
