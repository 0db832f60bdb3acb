"""The timing protocol's own kernels, shipped as PTX the driver loads (no NVRTC): the L2 flush and the stream hold.

`ReadFlush` is the timing protocol's L2 flush (it reads a buffer of twice the L2) and `Hold` its stream hold (no
timed launch waits on the host). Each is the PTX text NVRTC (CUDA 13) makes of its CUDA C (`FLUSH_SOURCE`,
`HOLD_SOURCE`), shipped under a conservative ``.version`` / ``.target``, so that the copy ceiling is timed with the
flush as soon as the worker's CUDA context exists, before any NVRTC module is built (`tuner.gpu.kernelsource`).
Both belong to `tuner.gpu.timing` and launch on the stream they are given, never the caller's current one.
"""

from __future__ import annotations

from tuner.gpu.devicekernels import grid_stride_launch

__all__ = [
    "FLUSH_PTX",
    "FLUSH_SOURCE",
    "HOLD_PTX",
    "HOLD_SOURCE",
    "Hold",
    "ReadFlush",
]

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
#: in it is older); tests/gpu/test_timingkernels.py holds it to NVRTC's output for FLUSH_SOURCE.
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
#: tests/gpu/test_timingkernels.py holds it to NVRTC's output).
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
        grid_stride_launch(self.kernel, n, (buf, np.uint64(n), sink), self.stream, self._sm_count)


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
