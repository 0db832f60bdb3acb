"""The GPU worker's own kernels as CUDA C, and their compile through our NVRTC cache.

CuPy builds its random generators and element-wise operations (``isnan``, ``abs``, comparisons, reductions)
by JIT-compiling a kernel on first use and caching it under ``CUPY_CACHE_DIR``. On a fresh machine the check of
the first config then pays for a dozen NVRTC compiles inside the GPU worker. The kernels here do the same work
from sources compiled by `tuner.build.compile.compile_source` (content-addressed, under the tuner cache dir, so each is
compiled once per machine and arch); `tuner.gpu.devicekernels` loads and launches them. The GPU worker builds two:
the random-input kernels with the checks every shipped family needs (`FIRST_CHECKS`) while its ceiling is timed,
then the checks of the other dtypes in the background (`Built`).

Contract: `source(checks, uri, fills)` is one `tuner.build.render.Source` holding the random-input kernels
(``fill_*``: counter-based draws, SplitMix64 of seed and element index, so that every element is independent of
the launch geometry and a seed reproduces its inputs) unless not `fills`, and ``check_<output>_<reference>`` for
each (output, reference) dtype pair of `checks` (out of `CHECK_PAIRS`: one pass, a grid-stride loop, warp
reductions, four atomics per warp; bf16 and fp16 outputs read as their stored bits). `Built` compiles one on a
daemon thread; `check_pair` names the pair whose kernel compares two arrays, or None (CuPy's path then runs).
Nothing here touches a GPU.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CHECK_DTYPES",
    "CHECK_PAIRS",
    "STORED_AS",
    "check_pair",
    "FIRST_CHECKS",
    "LATER_CHECKS",
    "Built",
    "source",
]

#: Every output dtype the check kernel reads (the dtype names of `tuner.kernels.declared`: each array dtype a kernel
#: may take) → the C type of its stored elements. bfloat16 is stored as uint16 bits (`tuner.kernels.bf16`), float16
#: as its IEEE bits: the wrappers `bf16` and `f16` (below) decode them exactly, as `bf16.decode` and CuPy's float16
#: do, without cuda_fp16.h (which NVRTC would have to find).
CHECK_DTYPES = {
    "float32": "float",
    "float64": "double",
    "float16": "f16",
    "bfloat16": "bf16",
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
    "bool": "bool",
}
#: The dtype (NumPy name) of the array that stores each output dtype whose name NumPy lacks.
STORED_AS = {"bfloat16": "uint16"}
#: Reference dtypes: `tuner.gpu.verify.normalize_reference` hands over float32 or float64 only (it widens a float16
#: reference and integer ones once, where the reference is computed).
_REF_DTYPES = {"float32": "float", "float64": "double"}
#: Every (output, reference) dtype pair the check kernels cover.
CHECK_PAIRS = tuple((o, r) for o in CHECK_DTYPES for r in _REF_DTYPES)
#: The pairs the GPU worker compiles before its first trial, beside the random-input kernels: those of every shipped
#: family, whose outputs are float32, bf16 bits (read as stored) or decoded to float64 for the check (fp8 codes),
#: against references that `tuner.gpu.verify.normalize_reference` compacts to float32 (float64 is kept only for a
#: float64 output, which no shipped family has). The other pairs (the dtypes only a declared kernel takes) compile
#: afterwards in the background, in a module of checks alone, so that the first trial waits for a fraction of the
#: whole module's NVRTC time (benchmarks/results/startup-2026-12-01-read-flush.md); a check that needs one of them
#: waits for it.
FIRST_CHECKS = (("float32", "float32"), ("bfloat16", "float32"), ("float64", "float32"))
#: The pairs compiled behind the first trials.
LATER_CHECKS = tuple(pair for pair in CHECK_PAIRS if pair not in FIRST_CHECKS)

_TYPES = r"""
typedef unsigned long long u64;
"""

_FILLS = r"""
__device__ __forceinline__ u64 splitmix64(u64 x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
// Uniform in [0, 1) with 53 random bits; `stream` separates the two draws a normal needs.
__device__ __forceinline__ double uniform01(u64 seed, u64 i, u64 stream) {
    return (double)(splitmix64(seed ^ splitmix64(2 * i + stream)) >> 11) * 0x1.0p-53;
}

extern "C" __global__ void fill_normal_f32(float* out, u64 n, u64 seed) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        double u1 = 1.0 - uniform01(seed, i, 0), u2 = uniform01(seed, i, 1);  // u1 in (0, 1]: log is finite
        out[i] = (float)(sqrt(-2.0 * log(u1)) * cospi(2.0 * u2));
    }
}
// bf16 bits of scale * N(0, 1), rounded to nearest even as __float2bfloat16_rn does (tuner.kernels.bf16.encode):
// one pass, where drawing float32 and encoding it with array operations takes a dozen over twice the bytes.
extern "C" __global__ void fill_normal_bf16(unsigned short* out, u64 n, u64 seed, float scale) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        double u1 = 1.0 - uniform01(seed, i, 0), u2 = uniform01(seed, i, 1);
        unsigned int bits = __float_as_uint((float)(sqrt(-2.0 * log(u1)) * cospi(2.0 * u2)) * scale);
        out[i] = (unsigned short)((bits + ((bits >> 16) & 1u) + 0x7FFFu) >> 16);  // finite: no NaN case
    }
}
extern "C" __global__ void fill_uniform_f32(float* out, u64 n, u64 seed, double lo, double hi) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float v = (float)(lo + (hi - lo) * uniform01(seed, i, 0));
        out[i] = v < (float)hi ? v : nextafterf((float)hi, (float)lo);  // rounding must not reach hi
    }
}
extern "C" __global__ void fill_uniform_f64(double* out, u64 n, u64 seed, double lo, double hi) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        out[i] = lo + (hi - lo) * uniform01(seed, i, 0);
}
extern "C" __global__ void fill_integers_i64(long long* out, u64 n, u64 seed, long long lo, u64 range) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        out[i] = lo + (long long)(splitmix64(seed ^ splitmix64(2 * i)) % range);
}

"""

_CHECKS = r"""
// 16-bit floats as their stored bits, widened exactly: IEEE half through the hardware conversion (subnormals,
// infinities and NaN included), bf16 as the upper half of a float.
struct __align__(2) f16 { unsigned short bits; };
struct __align__(2) bf16 { unsigned short bits; };
template <typename T> __device__ __forceinline__ double widen(T v) { return (double)v; }
__device__ __forceinline__ double widen(f16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}
__device__ __forceinline__ double widen(bf16 v) { return __uint_as_float((unsigned)v.bits << 16); }

// acc[0] mismatches, acc[1] NaN outputs, acc[2] max abs error, acc[3] max rel error (bits of a double >= 0,
// which order like unsigned integers). NaN errors count as mismatches and are left out of the maxima.
template <typename O, typename R>
__device__ void check(const O* out, const R* ref, u64 n, double tol, u64* acc) {
    u64 bad = 0, nans = 0;
    double max_abs = 0.0, max_rel = 0.0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        double o = widen(out[i]), r = widen(ref[i]);
        double diff = fabs(o - r), rel = diff / fmax(fabs(r), 1.0);
        bad += !(rel <= tol);
        nans += isnan(o);
        if (!isnan(rel)) { max_abs = fmax(max_abs, diff); max_rel = fmax(max_rel, rel); }
    }
    for (int s = 16; s > 0; s >>= 1) {
        bad += __shfl_down_sync(0xffffffffu, bad, s);
        nans += __shfl_down_sync(0xffffffffu, nans, s);
        max_abs = fmax(max_abs, __shfl_down_sync(0xffffffffu, max_abs, s));
        max_rel = fmax(max_rel, __shfl_down_sync(0xffffffffu, max_rel, s));
    }
    if ((threadIdx.x & 31) == 0) {
        if (bad) atomicAdd(&acc[0], bad);
        if (nans) atomicAdd(&acc[1], nans);
        atomicMax(&acc[2], (u64)__double_as_longlong(max_abs));
        atomicMax(&acc[3], (u64)__double_as_longlong(max_rel));
    }
}
"""


def source(checks=CHECK_PAIRS, uri: str = "tuner_worker_kernels", fills: bool = True):
    """The module's `tuner.build.render.Source` (one text: its compile is cached like any config's): the random-input
    kernels (unless not `fills`) and ``check_<output>_<reference>`` for each dtype pair of `checks`."""
    from tuner.build.render import Source

    lines = [_TYPES, _FILLS if fills else "", _CHECKS]
    for o_name, r_name in checks:
        lines.append(
            f'extern "C" __global__ void check_{o_name}_{r_name}(const {CHECK_DTYPES[o_name]}* out, '
            f"const {_REF_DTYPES[r_name]}* ref, u64 n, double tol, u64* acc) {{ check(out, ref, n, tol, acc); }}"
        )
    return Source(
        kernel="tuner_worker",
        text="\n".join(lines) + "\n",
        entry="fill_normal_f32" if fills else next((f"check_{o}_{r}" for o, r in checks), ""),
        uri=uri,
        template="tuner/gpu/kernelsource.py",
    )


class Built:
    """A compile of `source(checks, uri, fills)` run on a daemon thread (NVRTC releases the GIL), so that the caller
    goes on meanwhile; `result()` waits for it."""

    def __init__(self, checks, arch: str, uri: str = "tuner_worker_kernels", fills: bool = True):
        import threading

        from tuner.build.compile import compile_source

        self.checks = tuple(checks)
        self._out: list[Any] = []
        built = source(self.checks, uri, fills)
        self._thread = threading.Thread(
            target=lambda: self._out.append(compile_source(built, arch)), name=uri, daemon=True
        )
        self._thread.start()

    def result(self):
        """The `Compiled` (or `CompileFailed`); None if the compile raised."""
        self._thread.join()
        return self._out[0] if self._out else None


def check_pair(out, ref, dtype: str | None = None) -> tuple[str, str] | None:
    """The (output, reference) pair of `CHECK_PAIRS` whose kernel compares `out` with `ref` (arrays of NumPy or
    CuPy; `dtype` as `tuner.gpu.devicekernels.DeviceKernels.check` takes it), or None where none does: a dtype it
    does not cover, an array that does not store `dtype`, two shapes, an array that is not C-contiguous."""
    import numpy as np

    stored, r_name = np.dtype(out.dtype).name, np.dtype(ref.dtype).name
    o_name = dtype or stored
    if o_name not in CHECK_DTYPES or stored != STORED_AS.get(o_name, o_name) or r_name not in _REF_DTYPES:
        return None
    if out.shape != ref.shape or not (out.flags.c_contiguous and ref.flags.c_contiguous):
        return None
    return o_name, r_name
