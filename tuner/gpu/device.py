"""The GPU an evaluator owns: set up once per process, then described in every measurement it makes.

`Device` is an object of its own that `tuner.gpu.evaluator.GpuEvaluator` holds: built with the GPU's index and how
to get the ceiling, it owns (after `start`) the CUDA context, a stream, the L2 flush buffer (twice the L2), the
GPU's facts (`GpuFacts.from_device`), name, UUID and clocks (static ones; NVML's current clocks too where
nvidia-ml-py is installed), the copy ceiling (`tuner.gpu.ceiling`, cached per GPU), the CuPy/NVRTC/CUDA versions,
the stream hold (`tuner.gpu.timingkernels`) and the worker's own device kernels (`tuner.gpu.devicekernels`).
"""

from __future__ import annotations

import os
import time
from typing import Any

from tuner.core.cudalib import runtime as _runtime
from tuner.core.gpufacts import GpuFacts
from tuner.gpu.ceiling import GiB, ceiling_cache_key, measure_ceiling, read_cached_ceiling, store_ceiling
from tuner.gpu.timing import L2_FLUSH, LAUNCH_HOLD


class Device:
    """One GPU of this process, set up on first use (`start`, idempotent; every property starts it).

    Takes the CUDA device `index` (0 inside a Ray actor or a pinned worker), the cluster-wide `gpu_index` kept in
    records (default: `index`), the ceiling copy's size and budget, and `ceiling`: "cached" reuses the ceiling
    measured earlier on this GPU (same UUID, driver, CuPy, buffer and budget; see `ceiling_cache_key`), measuring
    and storing it when there is none; "measure" always measures. Gives, once started: `cuda` (the CuPy device, to
    enter), `stream`, `flush` (evict the L2), `hold` (the launch hold), `kernels` (our own device kernels), `facts`,
    `flush_bytes`, `smem_optin_bytes`, `versions`, `startup`, `clocks()`, and the `arch`, `gpu_name`,
    `ceiling_tbps` and `info` properties."""

    def __init__(
        self,
        index: int = 0,
        *,
        gpu_index: int | None = None,
        ceiling_bytes: int = 2 * GiB,
        # ~50 copies of 2 GiB (one takes ~1 ms on an H200): a steady median, measured once per GPU and cached
        ceiling_budget_ms: float = 50.0,
        ceiling: str = "cached",
    ):
        if ceiling not in ("cached", "measure"):
            raise ValueError(f"ceiling must be 'cached' or 'measure', not {ceiling!r}")
        self.index = index
        self.gpu_index = index if gpu_index is None else gpu_index
        self.ceiling_bytes = ceiling_bytes
        self.ceiling_budget_ms = ceiling_budget_ms
        self.ceiling_mode = ceiling
        self.started = False
        self._nvml_max_sm: int | None = None

    def start(self) -> dict[str, Any]:
        """Create the context, flush buffer and stream, measure the ceiling (once); return `info`."""
        self._ensure()
        return self._info()

    def _ensure(self) -> None:
        if not self.started:
            self._start()
            self.started = True

    def _start(self) -> None:
        import cupy

        from tuner.build.compile import versions as compile_versions
        from tuner.gpu import devicekernels, kernelsource, timingkernels

        t0 = time.perf_counter()
        self.cuda = cupy.cuda.Device(self.index)
        self._arch = f"sm_{self.cuda.compute_capability}"
        # Our random-input kernels and the checks every shipped family uses compile (or come from the compile
        # cache) while the context, the flush buffer and the ceiling are set up: NVRTC releases the GIL.
        first = kernelsource.Built(kernelsource.FIRST_CHECKS, self._arch, uri="tuner_worker_kernels_first")
        self.cuda.use()
        props = _runtime.getDeviceProperties(self.index)
        name = props.get("name", b"")
        self._gpu_name = name.decode() if isinstance(name, bytes) else str(name)
        uuid = props.get("uuid", b"")
        self._gpu_uuid = uuid.hex() if isinstance(uuid, bytes) else str(uuid)
        self.facts = GpuFacts.from_device(self.index)
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
        self._read_flush = timingkernels.ReadFlush(self.stream)
        self.hold = timingkernels.Hold(self.stream)
        self.flush()
        key = ceiling_cache_key(
            self._gpu_uuid, self._gpu_name, self.versions, self.ceiling_bytes, self.ceiling_budget_ms
        )
        cached = read_cached_ceiling(key) if self.ceiling_mode == "cached" else None
        if cached is None:
            self._ceiling_tbps = measure_ceiling(
                self.ceiling_bytes, self.ceiling_budget_ms, stream=self.stream, flush=self.flush
            )
            store_ceiling(key, self._ceiling_tbps, self._gpu_name)
        else:
            self._ceiling_tbps = cached
        t_ceiling = time.perf_counter()
        built = first.result()
        if built is None or not built.ok:
            raise RuntimeError(f"the worker's own kernels did not compile: {getattr(built, 'reason', '?')}")
        # The checks of the other dtypes (a declared kernel may store int8, fp16 or uint64) compile behind the
        # first trials; a check that needs one waits for them.
        later = kernelsource.Built(kernelsource.LATER_CHECKS, self._arch, uri="tuner_worker_kernels_rest", fills=False)
        self.kernels = devicekernels.DeviceKernels(built, kernelsource.FIRST_CHECKS, later)
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
        self._ensure()
        return self._gpu_name

    @property
    def arch(self) -> str:
        """``sm_90`` on an H100/H200: what to compile for."""
        self._ensure()
        return self._arch

    @property
    def ceiling_tbps(self) -> float:
        """The device-to-device copy's TB/s, measured once at start."""
        self._ensure()
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

    def flush(self) -> None:
        """Evict the L2 before a timed launch: read `flush_bytes` (twice the L2) of zeros (L2_FLUSH)."""
        self._read_flush(self._flush_buf, self._flush_sink)

    def _read_static_clocks(self) -> dict[str, Any]:
        clocks: dict[str, Any] = {}
        for key, attr in (
            ("sm_clock_max_mhz", "cudaDevAttrClockRate"),
            ("mem_clock_max_mhz", "cudaDevAttrMemoryClockRate"),
        ):
            try:
                clocks[key] = _runtime.deviceGetAttribute(getattr(_runtime, attr), self.index) // 1000
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
            return pynvml, pynvml.nvmlDeviceGetHandleByPciBusId(self.cuda.pci_bus_id)
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
