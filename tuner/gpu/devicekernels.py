"""The GPU worker's own kernels: random inputs and the output check, compiled through our NVRTC cache.

CuPy builds its random generators and element-wise operations (``isnan``, ``abs``, comparisons, reductions)
by JIT-compiling a kernel on first use and caching it under ``CUPY_CACHE_DIR``. On a fresh machine the check of
the first config then pays for a dozen NVRTC compiles inside the GPU worker. The kernels here do the same work
from sources compiled by `tuner.build.compile.compile_source` (content-addressed, under the tuner cache dir, so each is
compiled once per machine and arch) and loaded as modules with ``cupy.cuda.function.Module``, which compiles
nothing. The GPU worker builds two: the random-input kernels with the checks every shipped family needs
(`FIRST_CHECKS`) while its ceiling is timed, then the checks of the other dtypes in the background (`Built`).

`DeviceRng` offers the four generator calls the kernel families use (``standard_normal``, ``random``,
``uniform``, ``integers``), as counter-based draws (SplitMix64 of seed and element index: every element is
independent of the launch geometry, and a seed reproduces its inputs). `DeviceKernels.check` compares one output
with its reference in one pass (a grid-stride loop, warp reductions, four atomics per warp) and returns
`tuner.gpu.checks.OutputCheck`'s fields, for outputs of every dtype a kernel may declare (`CHECK_DTYPES`: bf16 and
fp16 read as their stored bits) against float32 or float64 references; what it does not cover returns None (CuPy's
path then runs).
`ReadFlush` is the timing protocol's L2 flush (it reads a buffer of twice the L2) and `Hold` its stream hold (no
timed launch waits on the host): PTX the driver loads, no NVRTC.

Streams: `DeviceKernels` and `DeviceRng` launch on the caller's current CuPy stream, as CuPy's own operations do,
so what the caller wrote on that stream before a call is what the call reads, and what a call writes is there for
the caller's next operation on it. (A stream of their own, unordered with the caller's, let a check read an
output before the caller's writes to it had landed.) `ReadFlush` and `Hold` belong to the timing protocol and
take its stream explicitly.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "CHECK_DTYPES",
    "CHECK_PAIRS",
    "STORED_AS",
    "check_pair",
    "FIRST_CHECKS",
    "LATER_CHECKS",
    "FLUSH_PTX",
    "FLUSH_SOURCE",
    "HOLD_PTX",
    "HOLD_SOURCE",
    "Built",
    "DeviceKernels",
    "DeviceRng",
    "Hold",
    "ReadFlush",
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

_THREADS = 256

#: The L2 flush between timed launches, in CUDA C: the PTX below is NVRTC's (CUDA 13) for it.
FLUSH_SOURCE = r"""
typedef unsigned long long u64;
// Reads n 16-byte words, so that every line it brings in replaces one of the previous launch's, and leaves no
// line dirty (a write flush leaves ~2x the L2 of dirty lines, whose write-back lands on the next launch). The
// buffer holds zeros; the store never happens, but the compiler cannot know that, so no load is dropped.
extern "C" __global__ void flush_read(const uint4* buf, u64 n, unsigned* sink) {
    unsigned acc = 0;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const uint4 v = buf[i];
        acc |= v.x | v.y | v.z | v.w;
    }
    if (acc == 0xFFFFFFFFu) sink[0] = acc;
}
"""

#: FLUSH_SOURCE as PTX, which the driver loads without NVRTC: the copy ceiling is timed with the flush as soon as
#: the worker's CUDA context exists, instead of after the NVRTC module (~1 s to build on a fresh machine, while
#: the study's compiles take the CPUs). Shipped as text with a conservative .version / .target (every instruction
#: in it is older); tests/gpu/test_devicekernels.py holds it to NVRTC's output for FLUSH_SOURCE.
FLUSH_PTX = """\
.version 7.0
.target sm_70
.address_size 64

.visible .entry flush_read(
	.param .u64 flush_read_param_0,
	.param .u64 flush_read_param_1,
	.param .u64 flush_read_param_2
)
{
	.reg .pred 	%p<8>;
	.reg .b32 	%r<21>;
	.reg .b64 	%rd<17>;

	ld.param.u64 	%rd7, [flush_read_param_0];
	ld.param.u64 	%rd8, [flush_read_param_1];
	ld.param.u64 	%rd9, [flush_read_param_2];
	mov.u32 	%r3, %ctaid.x;
	mov.u32 	%r4, %ntid.x;
	cvt.u64.u32 	%rd1, %r4;
	mul.wide.u32 	%rd10, %r3, %r4;
	mov.u32 	%r5, %tid.x;
	cvt.u64.u32 	%rd11, %r5;
	add.s64 	%rd16, %rd10, %rd11;
	setp.ge.u64 	%p4, %rd16, %rd8;
	mov.pred 	%p7, 0;
	@%p4 bra 	$L__BB0_4;

	mov.u32 	%r7, %nctaid.x;
	cvt.u64.u32 	%rd12, %r7;
	mul.lo.s64 	%rd3, %rd12, %rd1;
	cvta.to.global.u64 	%rd4, %rd7;
	mov.u32 	%r20, 0;

$L__BB0_2:
	shl.b64 	%rd13, %rd16, 4;
	add.s64 	%rd14, %rd4, %rd13;
	ld.global.v4.u32 	{%r8, %r9, %r10, %r11}, [%rd14];
	or.b32  	%r16, %r9, %r20;
	or.b32  	%r17, %r16, %r8;
	or.b32  	%r18, %r17, %r10;
	or.b32  	%r20, %r18, %r11;
	add.s64 	%rd16, %rd16, %rd3;
	setp.lt.u64 	%p5, %rd16, %rd8;
	@%p5 bra 	$L__BB0_2;

	setp.eq.s32 	%p7, %r20, -1;

$L__BB0_4:
	not.pred 	%p6, %p7;
	@%p6 bra 	$L__BB0_6;

	cvta.to.global.u64 	%rd15, %rd9;
	mov.u32 	%r19, -1;
	st.global.u32 	[%rd15], %r19;

$L__BB0_6:
	ret;

}
"""


#: The stream hold of the timing protocol, in CUDA C: the PTX below is NVRTC's (CUDA 13) for it. One thread waits
#: until the host's word `released` reaches `ticket` (the host writes it once it has enqueued the launches behind
#: the hold), so that those launches run back to back and none waits inside its timed region for the host to
#: enqueue it. After `timeout_ns` it gives up and writes its ticket to `late`, so that a host that cannot enqueue
#: (a full launch queue, a call that synchronizes) never hangs the stream.
HOLD_SOURCE = r"""
typedef unsigned long long u64;
extern "C" __global__ void hold(const volatile unsigned* released, unsigned ticket, u64 timeout_ns,
                                volatile unsigned* late) {
    u64 start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    while ((int)(*released - ticket) < 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > timeout_ns) {
            *late = ticket;
            return;
        }
    }
}
"""

#: HOLD_SOURCE as PTX the driver loads (as FLUSH_PTX, under the same conservative version and target;
#: tests/gpu/test_devicekernels.py holds it to NVRTC's output).
HOLD_PTX = """\
.version 7.0
.target sm_70
.address_size 64

.visible .entry hold(
	.param .u64 hold_param_0,
	.param .u32 hold_param_1,
	.param .u64 hold_param_2,
	.param .u64 hold_param_3
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<10>;

	ld.param.u64 	%rd6, [hold_param_0];
	ld.param.u32 	%r1, [hold_param_1];
	ld.param.u64 	%rd4, [hold_param_2];
	ld.param.u64 	%rd7, [hold_param_3];
	cvta.to.global.u64 	%rd1, %rd7;
	cvta.to.global.u64 	%rd2, %rd6;
	mov.u64 %rd5, %globaltimer;

$L__BB0_1:
	ld.volatile.global.u32 	%r2, [%rd2];
	sub.s32 	%r3, %r2, %r1;
	setp.gt.s32 	%p1, %r3, -1;
	@%p1 bra 	$L__BB0_4;

	mov.u64 %rd8, %globaltimer;
	sub.s64 	%rd9, %rd8, %rd5;
	setp.le.u64 	%p2, %rd9, %rd4;
	@%p2 bra 	$L__BB0_1;

	st.volatile.global.u32 	[%rd1], %r1;

$L__BB0_4:
	ret;

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
        template="tuner/gpu/devicekernels.py",
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
    CuPy; `dtype` as `DeviceKernels.check` takes it), or None where none does: a dtype it does not cover, an array
    that does not store `dtype`, two shapes, an array that is not C-contiguous."""
    import numpy as np

    stored, r_name = np.dtype(out.dtype).name, np.dtype(ref.dtype).name
    o_name = dtype or stored
    if o_name not in CHECK_DTYPES or stored != STORED_AS.get(o_name, o_name) or r_name not in _REF_DTYPES:
        return None
    if out.shape != ref.shape or not (out.flags.c_contiguous and ref.flags.c_contiguous):
        return None
    return o_name, r_name


def _launch(kernel, n: int, args: tuple, stream, sm_count: int) -> None:
    """Launch a grid-stride kernel over n items on `stream` (None: the current CuPy stream): blocks of _THREADS,
    enough to fill the GPU, at most 8 per SM."""
    if stream is None:
        import cupy

        stream = cupy.cuda.get_current_stream()
    blocks = max(1, min(math.ceil(n / _THREADS), sm_count * 8))
    kernel((blocks,), (_THREADS,), args, stream=stream)


def _load_ptx(ptx: str, name: str):
    """(module, function) of a shipped PTX text loaded by the driver (no NVRTC); the module must outlive the
    function's launches."""
    import cupy

    module = cupy.cuda.function.Module()
    module.load(ptx.encode())
    return module, module.get_function(name)


class ReadFlush:
    """The L2 flush (FLUSH_PTX) loaded on the current device: ``flush(buf, sink)`` enqueues a read of `buf` (a CuPy
    array of zeros, a multiple of 16 bytes; `sink` one uint32 the kernel never writes) on `stream`."""

    def __init__(self, stream):
        import cupy

        self.stream = stream
        self.module, self.kernel = _load_ptx(FLUSH_PTX, "flush_read")
        self._sm_count = cupy.cuda.Device().attributes["MultiProcessorCount"]

    def __call__(self, buf, sink) -> None:
        import numpy as np

        n = buf.nbytes // 16
        _launch(self.kernel, n, (buf, np.uint64(n), sink), self.stream, self._sm_count)


class Hold:
    """The stream hold (HOLD_PTX) loaded on the current device, and its two host words in mapped pinned memory.

    ``hold()`` enqueues the hold kernel on `stream` under a new ticket; ``release()`` lets it go. Launches
    enqueued between the two start together once the host has enqueued all of them: a call whose host side is
    slower than its GPU side (a peer library's dispatch, a busy CPU) is timed on the GPU alone, as a kernel
    launched from a CUDA graph would be. `timeouts` counts the holds that gave up (the host took longer than
    `timeout_s` to release); launches behind such a hold may have waited on the host."""

    def __init__(self, stream, timeout_s: float = 0.05):
        import ctypes

        import cupy

        self.stream = stream
        self.timeout_ns = int(timeout_s * 1e9)
        self.module, self.kernel = _load_ptx(HOLD_PTX, "hold")
        rt = cupy.cuda.runtime
        # mapped pinned memory: with unified addressing the device reads it at the host pointer
        self._ptr = rt.hostAlloc(8, rt.hostAllocMapped | rt.hostAllocPortable)
        self._words = (ctypes.c_uint32 * 2).from_address(self._ptr)  # [released, late]
        self._words[0] = self._words[1] = 0
        self._ticket = 0
        self._late_seen = 0
        self.timeouts = 0

    def hold(self) -> None:
        import numpy as np

        self._ticket = (self._ticket + 1) & 0xFFFFFFFF
        args = (np.uint64(self._ptr), np.uint32(self._ticket), np.uint64(self.timeout_ns), np.uint64(self._ptr + 4))
        self.kernel((1,), (1,), args, stream=self.stream)

    def release(self) -> None:
        self._words[0] = self._ticket

    def gave_up(self) -> bool:
        """Whether a hold gave up since the last call (the device writes `late` when it does; read after a
        synchronize, it is exact)."""
        late = self._words[1]
        if late != self._late_seen:
            self._late_seen = late
            self.timeouts += 1
            return True
        return False

    def __del__(self) -> None:
        try:
            import cupy

            cupy.cuda.runtime.freeHost(self._ptr)
        except Exception:  # noqa: BLE001 - interpreter shutdown or a lost context: the process frees it
            pass


class DeviceKernels:
    """The module loaded on the current device, from `compiled` (a `tuner.build.compile.Compiled` of
    `source(checks)`); check pairs outside `checks` come from `later` (a `Built` of the other pairs, loaded when
    a check first needs it), else the check answers None. Every launch runs on the caller's current CuPy stream
    (see the module docstring)."""

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
        _launch(self.function(name), n, args, None, self._sm_count)

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
        _launch(kernel, out.size, (out, ref, np.uint64(out.size), np.float64(tolerance), acc), stream, self._sm_count)
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
