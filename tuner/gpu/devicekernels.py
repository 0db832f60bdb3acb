"""The GPU worker's own kernels on the device: random inputs and the output check, loaded from their compile.

`DeviceKernels` loads the module `tuner.gpu.kernelsource` builds (a compile of `source`, through our NVRTC cache)
with ``cupy.cuda.function.Module``, which compiles nothing, and launches its kernels: check pairs outside the first
module come from the `Built` compile of the others, loaded when a check first needs one.

`DeviceRng` offers the four generator calls the kernel families use (``standard_normal``, ``random``,
``uniform``, ``integers``), as counter-based draws (SplitMix64 of seed and element index: every element is
independent of the launch geometry, and a seed reproduces its inputs). `DeviceKernels.check` compares one output
with its reference in one pass (a grid-stride loop, warp reductions, four atomics per warp) and returns
`tuner.gpu.checks.OutputCheck`'s fields, for outputs of every dtype a kernel may declare
(`tuner.gpu.kernelsource.CHECK_DTYPES`: bf16 and fp16 read as their stored bits) against float32 or float64
references; what it does not cover returns None (CuPy's path then runs). `grid_stride_launch` launches a
grid-stride kernel over n items, here and for the timing protocol's flush (`tuner.gpu.timingkernels`).

Streams: `DeviceKernels` and `DeviceRng` launch on the caller's current CuPy stream, as CuPy's own operations do,
so what the caller wrote on that stream before a call is what the call reads, and what a call writes is there for
the caller's next operation on it. (A stream of their own, unordered with the caller's, let a check read an
output before the caller's writes to it had landed.)
"""

from __future__ import annotations

import math
from typing import Any

from tuner.gpu.kernelsource import CHECK_PAIRS, Built, check_pair

__all__ = [
    "DeviceKernels",
    "DeviceRng",
    "grid_stride_launch",
]

_THREADS = 256


def grid_stride_launch(kernel, n: int, args: tuple, stream, sm_count: int) -> None:
    """Launch a grid-stride kernel over n items on `stream` (None: the current CuPy stream): blocks of _THREADS,
    enough to fill the GPU, at most 8 per SM."""
    if stream is None:
        import cupy

        stream = cupy.cuda.get_current_stream()
    blocks = max(1, min(math.ceil(n / _THREADS), sm_count * 8))
    kernel((blocks,), (_THREADS,), args, stream=stream)


class DeviceKernels:
    """The module loaded on the current device, from `compiled` (a `tuner.build.compile.Compiled` of
    `tuner.gpu.kernelsource.source(checks)`); check pairs outside `checks` come from `later` (a `Built` of the
    other pairs, loaded when a check first needs it), else the check answers None. Every launch runs on the
    caller's current CuPy stream (see the module docstring)."""

    def __init__(self, compiled, checks=CHECK_PAIRS, later: Built | None = None):
        import cupy

        self.module = cupy.cuda.function.Module()
        self.module.load(compiled.cubin)
        self.checks = frozenset(checks)
        self._later = later
        self._later_module: Any = None
        self._functions: dict[str, Any] = {}
        self._sm_count = cupy.cuda.Device().attributes["MultiProcessorCount"]

    def function(self, name: str):
        if name not in self._functions:
            self._functions[name] = self.module.get_function(name)
        return self._functions[name]

    def _check_function(self, pair: tuple[str, str]):
        """The check kernel of an (output, reference) pair, or None where no module has it."""
        name = f"check_{pair[0]}_{pair[1]}"
        if pair in self.checks:
            return self.function(name)
        if self._later is None or pair not in self._later.checks:
            return None
        if name not in self._functions:
            if self._later_module is None:
                import cupy

                built = self._later.result()
                if built is None or not built.ok:
                    self._later = None  # the CuPy path answers these checks from now on
                    return None
                self._later_module = cupy.cuda.function.Module()
                self._later_module.load(built.cubin)
            self._functions[name] = self._later_module.get_function(name)
        return self._functions[name]

    def launch(self, name: str, n: int, args: tuple) -> None:
        grid_stride_launch(self.function(name), n, args, None, self._sm_count)

    def rng(self, seed: int) -> DeviceRng:
        return DeviceRng(self, seed)

    def check(self, out, ref, tolerance: float, dtype: str | None = None) -> tuple[int, int, float, float] | None:
        """(mismatches, NaN count, max abs error, max rel error) of `out` against `ref`, in one pass, as
        `tuner.gpu.checks.check_output` counts them; None where the dtypes are not covered or the arrays are not
        C-contiguous of one shape (the caller then compares with CuPy). `dtype` names what `out` stores where its
        array dtype does not say (``"bfloat16"``: uint16 bits), else None. Reads both after whatever the caller's
        current stream wrote to them, and waits for that stream to answer."""
        import cupy
        import numpy as np

        pair = check_pair(out, ref, dtype)
        kernel = None if pair is None else self._check_function(pair)
        if kernel is None:
            return None
        stream = cupy.cuda.get_current_stream()
        acc = cupy.empty(4, dtype=cupy.uint64)
        acc.data.memset_async(0, acc.nbytes, stream)
        grid_stride_launch(
            kernel, out.size, (out, ref, np.uint64(out.size), np.float64(tolerance), acc), stream, self._sm_count
        )
        host = np.empty(4, dtype=np.uint64)
        acc.data.copy_to_host_async(host.ctypes.data, acc.nbytes, stream)
        stream.synchronize()
        maxima = host[2:].view(np.float64)
        return int(host[0]), int(host[1]), float(maxima[0]), float(maxima[1])


class DeviceRng:
    """The generator calls the kernel families make (a subset of `numpy.random.Generator`'s signatures),
    answered by `DeviceKernels` on the caller's current CuPy stream; each call draws from a fresh sequence of the
    seed."""

    def __init__(self, kernels: DeviceKernels, seed: int):
        self.kernels = kernels
        self.seed = seed & 0xFFFFFFFFFFFFFFFF
        self.calls = 0

    def _next_seed(self):
        import numpy as np

        self.calls += 1
        return np.uint64((self.seed + 0x632BE59BD9B4E019 * self.calls) & 0xFFFFFFFFFFFFFFFF)

    @staticmethod
    def _shape(size) -> tuple[int, ...]:
        if size is None:
            return ()
        return (int(size),) if isinstance(size, (int,)) or hasattr(size, "__index__") else tuple(size)

    def _empty(self, size, dtype):
        import cupy

        return cupy.empty(self._shape(size), dtype=dtype)

    def standard_normal(self, size=None, dtype=None):
        import numpy as np

        dtype = np.dtype(dtype or np.float64)
        if dtype != np.float32:
            raise TypeError(f"DeviceRng.standard_normal: dtype {dtype} (float32 only)")
        out = self._empty(size, dtype)
        self.kernels.launch("fill_normal_f32", out.size, (out, np.uint64(out.size), self._next_seed()))
        return out

    def standard_normal_bf16(self, size=None, scale: float = 1.0):
        """bf16 bits (uint16) of ``scale * standard_normal(size, float32)``, encoded as `tuner.kernels.bf16.encode`
        encodes, in one kernel."""
        import numpy as np

        out = self._empty(size, np.uint16)
        self.kernels.launch(
            "fill_normal_bf16", out.size, (out, np.uint64(out.size), self._next_seed(), np.float32(scale))
        )
        return out

    def random(self, size=None, dtype=None):
        return self.uniform(0.0, 1.0, size, dtype)

    def uniform(self, low=0.0, high=1.0, size=None, dtype=None):
        import numpy as np

        dtype = np.dtype(dtype or np.float64)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"DeviceRng.uniform: dtype {dtype} (float32 or float64)")
        out = self._empty(size, dtype)
        name = "fill_uniform_f32" if dtype == np.float32 else "fill_uniform_f64"
        self.kernels.launch(
            name, out.size, (out, np.uint64(out.size), self._next_seed(), np.float64(low), np.float64(high))
        )
        return out

    def integers(self, low, high=None, size=None, dtype=None):
        import numpy as np

        if high is None:
            low, high = 0, low
        if int(high) <= int(low):
            raise ValueError(f"DeviceRng.integers: high {high} must exceed low {low}")
        dtype = np.dtype(dtype or np.int64)
        out = self._empty(size, np.int64)
        self.kernels.launch(
            "fill_integers_i64",
            out.size,
            (out, np.uint64(out.size), self._next_seed(), np.int64(low), np.uint64(int(high) - int(low))),
        )
        return out if dtype == np.int64 else out.astype(dtype)
