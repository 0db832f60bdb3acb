"""The timing protocol's own kernels (`tuner.gpu.timingkernels`): the shipped PTX is NVRTC's for its source; on a
GPU, the read flush reads without writing and the stream hold keeps the host's time out of the timings, giving up
(no hang) when the host does not release it in time."""

from __future__ import annotations

import pytest

from tuner.gpu import timingkernels

try:
    import cupy

    HAVE_GPU = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:  # no CuPy, no driver or no device
    HAVE_GPU = False


def _memory_ops(ptx: str) -> list[str]:
    """The global loads and stores of a PTX text's entry, in order (opcodes only)."""
    body = ptx[ptx.index(".visible .entry") :]
    ops = [line.split()[0] for line in body.splitlines() if line.strip() and not line.strip().startswith("//")]
    return [op for op in ops if op.startswith(("ld.global", "st.global"))]


def test_the_shipped_flush_ptx_does_what_its_source_does():
    """FLUSH_PTX (loaded by the driver, no NVRTC) is NVRTC's PTX of FLUSH_SOURCE: the same global loads and
    stores as NVRTC gives for the source today, a grid-stride loop around the one 16-byte load, and the one store
    behind a predicate (so no load is dead), under a conservative PTX version and target."""
    from tuner.build.compile import nvrtc_compile

    status, log, _, ptx = nvrtc_compile(timingkernels.FLUSH_SOURCE, "flush.cu", ["--gpu-architecture=compute_75"])
    assert status == 0, log
    shipped = timingkernels.FLUSH_PTX
    assert _memory_ops(shipped) == _memory_ops(ptx.decode()) == ["ld.global.v4.u32", "st.global.u32"]
    assert shipped.startswith(".version 7.0\n.target sm_70\n") and ".visible .entry flush_read(" in shipped
    loop = shipped[shipped.index("$L__BB0_2:") : shipped.index("@%p5 bra \t$L__BB0_2;")]
    assert "ld.global.v4.u32" in loop and "st.global" not in loop
    tail = shipped[shipped.index("$L__BB0_4:") :]
    assert tail.index("@%p6 bra") < tail.index("st.global.u32")


def test_the_shipped_hold_ptx_is_nvrtcs_for_its_source():
    """HOLD_PTX (loaded by the driver) is NVRTC's PTX of HOLD_SOURCE instruction for instruction, under the
    flush's conservative PTX version and target; its loop polls the host's word with a volatile load and reads
    the global timer, and the one store (the give-up) is outside the loop."""
    from tuner.build.compile import nvrtc_compile

    status, log, _, ptx = nvrtc_compile(timingkernels.HOLD_SOURCE, "hold.cu", ["--gpu-architecture=compute_75"])
    assert status == 0, log

    def body(text: str) -> list[str]:
        lines = (line.strip() for line in text.splitlines())
        return [line for line in lines if line and not line.startswith(("//", ".version", ".target"))]

    shipped = timingkernels.HOLD_PTX
    assert body(shipped) == body(ptx.decode())
    assert shipped.startswith(".version 7.0\n.target sm_70\n") and ".visible .entry hold(" in shipped
    loop = shipped[shipped.index("$L__BB0_1:") : shipped.index("@%p2 bra \t$L__BB0_1;")]
    assert "ld.volatile.global.u32" in loop and "%globaltimer" in loop and "st." not in loop
    memory = [line.split()[0] for line in body(shipped) if line.startswith(("ld.", "st.")) and ".param" not in line]
    assert memory == ["ld.volatile.global.u32", "st.volatile.global.u32"]


@pytest.fixture
def stream():
    """A non-blocking stream, as the GPU worker's: nothing orders it with the legacy default stream."""
    if not HAVE_GPU:
        pytest.skip("needs a CUDA GPU")
    return cupy.cuda.Stream(non_blocking=True)


@pytest.mark.gpu
def test_read_flush_reads_without_writing(stream):
    flush = timingkernels.ReadFlush(stream)  # the shipped PTX, loaded by the driver
    with stream:
        buf = cupy.zeros(64 << 20, dtype=cupy.uint8)
        sink = cupy.full(1, 0xDEAD, dtype=cupy.uint32)
        flush(buf, sink)
        stream.synchronize()
        assert int(sink[0]) == 0xDEAD
        buf[:16] = 255  # a word of all ones: the one case the kernel stores, so its loads did happen
        flush(buf[:16], sink)
        stream.synchronize()
        assert int(sink[0]) == 0xFFFFFFFF


@pytest.mark.gpu
def test_the_hold_keeps_the_hosts_time_out_of_the_timings(stream):
    """A call that sleeps 2 ms on the host before a 1 MB memset: timed without the hold, each event pair holds
    the GPU idling for the sleep; behind the hold, only the memset."""
    import time

    from tuner.gpu.timing import time_launches

    hold = timingkernels.Hold(stream)
    buf = cupy.empty(1 << 20, dtype=cupy.uint8)

    def run() -> None:
        time.sleep(0.002)
        buf.data.memset_async(0, buf.nbytes, stream)

    plain = sorted(time_launches(run, stream=stream, reps=8))
    held = sorted(time_launches(run, stream=stream, reps=8, hold=hold))
    assert plain[4] > 1.5 and held[4] < 0.1, (plain, held)
    assert hold.timeouts == 0


@pytest.mark.gpu
def test_a_hold_the_host_does_not_release_in_time_gives_up(stream):
    """The hold lets the stream go after its timeout (no hang), says so, and the next batch is smaller."""
    import time

    from tuner.gpu.timing import time_launches

    hold = timingkernels.Hold(stream, timeout_s=0.005)
    buf = cupy.empty(1 << 20, dtype=cupy.uint8)

    def run() -> None:
        time.sleep(0.002)
        buf.data.memset_async(0, buf.nbytes, stream)

    t0 = time.perf_counter()
    times = time_launches(run, stream=stream, reps=16, hold=hold)  # 32 ms of host time against 5 ms
    assert len(times) == 16 and time.perf_counter() - t0 < 2.0
    assert hold.timeouts >= 1
