"""The ceiling: a device-to-device copy timed with the kernels' protocol, once per GPU, and cached.

The figure is kept in ``ceilings.json`` under the tuner cache dir, keyed by the GPU's UUID and name, the driver,
the CuPy version and the copy's size and budget (`ceiling_cache_key`), and reused while they hold (``tuner
ceiling`` measures afresh).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuner.core.cudalib import runtime as _runtime
from tuner.gpu.timing import Timing, benchmark

GiB = 1 << 30


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
    from tuner.core.errors import InputError

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
