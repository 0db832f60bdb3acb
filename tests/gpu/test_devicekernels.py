"""The GPU worker's own kernels (`tuner.gpu.devicekernels`): they compile with NVRTC here; on a GPU, the random draws
have the right moments and ranges, a seed reproduces them, and the one-pass check agrees with CuPy's element-wise
comparison (`tuner.gpu.checks.check_output`) on exact, noisy, NaN and far-off outputs."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.build.compile import compile_source
from tuner.gpu import devicekernels

try:
    import cupy

    HAVE_GPU = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:  # no CuPy, no driver or no device
    HAVE_GPU = False


def test_the_worker_kernels_compile_for_sm_90_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    compiled = compile_source(devicekernels.source(), "sm_90")
    assert compiled.ok, compiled
    names = set(compiled.functions)
    assert {"fill_normal_f32", "fill_normal_bf16", "fill_uniform_f32", "fill_uniform_f64", "fill_integers_i64"} <= names
    assert {f"check_{o}_{r}" for o, r in devicekernels.CHECK_PAIRS} <= names
    assert {o for o, _ in devicekernels.CHECK_PAIRS} == set(devicekernels.CHECK_DTYPES)
    assert {r for _, r in devicekernels.CHECK_PAIRS} == {"float32", "float64"}
    assert all(f.spill_store_bytes == 0 for f in compiled.functions.values())
    assert compile_source(devicekernels.source(), "sm_90").cached  # the second worker start compiles nothing


def test_the_worker_builds_the_checks_in_two_parts_that_cover_every_pair(tmp_path, monkeypatch):
    """The first part (on the worker's critical path) holds the random-input kernels and the checks of
    FIRST_CHECKS only; `Built` compiles the rest on a thread, checks alone; together they hold every pair of
    CHECK_PAIRS."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    rest = devicekernels.LATER_CHECKS
    assert len(devicekernels.CHECK_PAIRS) == len(devicekernels.FIRST_CHECKS) + len(rest) == 26
    later = devicekernels.Built(rest, "sm_90", fills=False)
    first = compile_source(devicekernels.source(devicekernels.FIRST_CHECKS), "sm_90")
    fills = {"fill_normal_f32", "fill_normal_bf16", "fill_uniform_f32", "fill_uniform_f64", "fill_integers_i64"}
    assert first.ok and set(first.functions) == fills | {f"check_{o}_{r}" for o, r in devicekernels.FIRST_CHECKS}
    built = later.result()
    assert built.ok and {f"check_{o}_{r}" for o, r in rest} == set(built.functions)  # checks alone
    assert not ({f"check_{o}_{r}" for o, r in devicekernels.FIRST_CHECKS} & set(built.functions))
    assert all(f.spill_store_bytes == 0 for f in [*first.functions.values(), *built.functions.values()])


#: Every dtype a reference may return (after torch's bf16 becomes float32): what `normalize_reference` turns it into
#: is a reference dtype of the check.
RETURNED = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def test_every_declared_dtype_has_a_one_pass_check_against_every_reference_dtype():
    """Each array dtype a ``kernel:`` block may declare, stored as the GPU worker stores it, against each reference
    dtype `normalize_reference` hands over (whatever the reference returned): a pair of the module, never CuPy's
    multi-pass comparison."""
    from tuner.gpu.verify import reference_dtype
    from tuner.kernels import declared

    assert set(devicekernels.CHECK_DTYPES) == set(declared.ARRAY_DTYPES)
    for dtype in declared.ARRAY_DTYPES:
        out = np.zeros((3, 5), dtype=declared.storage(dtype))
        for returned in (*RETURNED, "bool"):
            ref = np.zeros((3, 5), dtype=reference_dtype(returned, dtype))
            assert devicekernels.check_pair(out, ref, dtype) in devicekernels.CHECK_PAIRS, (dtype, returned)
    # what the pair refuses: another shape, a strided view, an array that does not store the dtype named
    out, ref = np.zeros((4, 6), dtype=np.float16), np.zeros((4, 6), dtype=np.float32)
    assert devicekernels.check_pair(out, ref) == ("float16", "float32")
    assert devicekernels.check_pair(out, ref[:2]) is None and devicekernels.check_pair(out[:, ::2], ref[:, ::2]) is None
    assert devicekernels.check_pair(out, ref, "bfloat16") is None
    assert devicekernels.check_pair(out.view(np.uint16), ref, "bfloat16") == ("bfloat16", "float32")
    assert devicekernels.check_pair(out, ref.astype(np.float16)) is None  # normalize_reference widens it first


def test_a_declared_kernel_has_every_output_and_inout_compared_as_stored(tmp_path):
    """The check reads every output and in-place argument of a declared kernel as it is stored (bf16 bits as
    bfloat16, the problem's dtype resolved), so none goes through a decoded copy; a family with a
    `checked_value` of its own is compared through it."""
    from tuner.kernels.base import Family
    from tuner.kernels.declared import ARRAY_DTYPES, storage
    from tuner.space import space as space_mod

    outputs = "".join(f"    - {{name: o_{d}, role: output, dtype: {d}, shape: [n]}}\n" for d in ARRAY_DTYPES)
    (tmp_path / "all.yaml").write_text(
        "kernel:\n  name: all_dtypes\n  dtypes: [bfloat16]\n  arguments:\n"
        + outputs
        + "    - {name: acc, role: inout, shape: [n]}\n"
        + "    - {name: n, role: scalar, dtype: int64}\n"
        + "  launch: {grid: [1], block: [block]}\n"
        + "template: all.cu.j2\nproblem: {name: p, n: 64, dtype: bfloat16}\nparams: {block: [64]}\n"
    )
    (tmp_path / "all.cu.j2").write_text('extern "C" __global__ void {{ entry }}() {}\n')
    space = space_mod.load(tmp_path / "all.yaml")
    family, env = space.family, space.problem().env
    declared = family.outputs(env, space.default)
    for name in family.checked():
        dtype = declared[name][1] if name in declared else None
        array = np.zeros(64, dtype=storage(dtype or "bfloat16"))
        stored = family.checked_stored(name, array, dtype)
        assert stored == (dtype or "bfloat16"), name
        ref = np.zeros(64, dtype=np.float32)
        assert devicekernels.check_pair(array, ref, stored) in devicekernels.CHECK_PAIRS, name

    class Codes(Family):
        def checked_value(self, xp, name, array, dtype):
            return array.astype(xp.float64) / 256

    class Plain(Family):
        pass

    assert Codes().checked_stored("q", np.zeros(4, dtype=np.uint8), "uint8") is None
    assert Plain().checked_stored("y", np.zeros(4, dtype=np.uint16), "bfloat16") == "bfloat16"
    assert Plain().checked_stored("y", np.zeros(4, dtype=np.int16), "int16") == "int16"


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

    status, log, _, ptx = nvrtc_compile(devicekernels.FLUSH_SOURCE, "flush.cu", ["--gpu-architecture=compute_75"])
    assert status == 0, log
    shipped = devicekernels.FLUSH_PTX
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

    status, log, _, ptx = nvrtc_compile(devicekernels.HOLD_SOURCE, "hold.cu", ["--gpu-architecture=compute_75"])
    assert status == 0, log

    def body(text: str) -> list[str]:
        lines = (line.strip() for line in text.splitlines())
        return [line for line in lines if line and not line.startswith(("//", ".version", ".target"))]

    shipped = devicekernels.HOLD_PTX
    assert body(shipped) == body(ptx.decode())
    assert shipped.startswith(".version 7.0\n.target sm_70\n") and ".visible .entry hold(" in shipped
    loop = shipped[shipped.index("$L__BB0_1:") : shipped.index("@%p2 bra \t$L__BB0_1;")]
    assert "ld.volatile.global.u32" in loop and "%globaltimer" in loop and "st." not in loop
    memory = [line.split()[0] for line in body(shipped) if line.startswith(("ld.", "st.")) and ".param" not in line]
    assert memory == ["ld.volatile.global.u32", "st.volatile.global.u32"]


@pytest.fixture(scope="module")
def device_kernels():
    if not HAVE_GPU:
        pytest.skip("needs a CUDA GPU")
    arch = f"sm_{cupy.cuda.Device(0).compute_capability}"
    # as the GPU worker builds them: the first checks up front, the other pairs (int32 below) from `later`
    first = compile_source(devicekernels.source(devicekernels.FIRST_CHECKS), arch)
    rest = devicekernels.LATER_CHECKS
    later = devicekernels.Built(rest, arch, fills=False)
    return devicekernels.DeviceKernels(first, devicekernels.FIRST_CHECKS, later)


@pytest.fixture
def stream():
    """A non-blocking stream, as the GPU worker's: nothing orders it with the legacy default stream."""
    if not HAVE_GPU:
        pytest.skip("needs a CUDA GPU")
    return cupy.cuda.Stream(non_blocking=True)


@pytest.mark.gpu
def test_read_flush_reads_without_writing(stream):
    flush = devicekernels.ReadFlush(stream)  # the shipped PTX, loaded by the driver
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
def test_a_check_reads_what_the_callers_stream_wrote_before_it(device_kernels, stream):
    """The producer delayed: NaNs written on the caller's stream behind 0.3 s of GPU work. A check that ran on a
    stream of its own would read the output before they land and count none."""
    from tests.gpu_helpers import spin

    def nans_counted(delay_s: float):
        with stream:
            ref = cupy.zeros(1 << 22, dtype=cupy.float64)
            out = cupy.zeros(1 << 22, dtype=cupy.float32)
            stream.synchronize()
            spin(stream, delay_s)
            out[::2] = cupy.nan
            return device_kernels.check(out, ref, 1e-6), out.size // 2

    nans_counted(0.0)  # every module loaded first: a load waits for the whole GPU and would order the race
    counted, nans = nans_counted(0.3)
    assert counted is not None and counted[0] == counted[1] == nans


@pytest.mark.gpu
def test_a_draw_lands_after_what_the_callers_stream_did_to_its_memory(device_kernels, stream):
    """CuPy's memory pool hands a block freed on a stream to the next array of that stream at once, while work
    enqueued there may still write it: here a fill of 5s behind 0.3 s of GPU work. A draw on the caller's stream
    lands after the fill; one on a stream of its own would land first and be overwritten."""
    from tests.gpu_helpers import spin

    n = 1 << 20
    expected = cupy.asnumpy(device_kernels.rng(11).standard_normal((n,), dtype=np.float32))

    def drawn_after_a_fill(delay_s: float):
        with stream:
            spin(stream, delay_s)
            scratch = cupy.empty((n,), dtype=np.float32)
            scratch.fill(5.0)
            address = scratch.data.ptr
            del scratch
            drawn = device_kernels.rng(11).standard_normal((n,), dtype=np.float32)
            assert drawn.data.ptr == address  # the premise: the draw got the block the pending fill writes
            return cupy.asnumpy(drawn, stream=stream)

    drawn_after_a_fill(0.0)  # every module loaded first (see above)
    assert np.array_equal(drawn_after_a_fill(0.3), expected)


@pytest.mark.gpu
def test_draws_have_their_moments_and_ranges_and_a_seed_repeats_them(device_kernels):
    rng = device_kernels.rng(7)
    x = cupy.asnumpy(rng.standard_normal((1024, 1024), dtype=np.float32))
    assert x.dtype == np.float32 and x.shape == (1024, 1024)
    assert abs(x.mean()) < 0.01 and abs(x.std() - 1) < 0.01 and np.isfinite(x).all()
    u = cupy.asnumpy(rng.random(1 << 20, dtype=np.float32))
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    w = cupy.asnumpy(rng.uniform(-2.0, 3.0, size=(100, 1000)))
    assert w.dtype == np.float64 and w.min() >= -2 and w.max() < 3
    k = cupy.asnumpy(rng.integers(0, 7, size=70000))
    assert k.dtype == np.int64 and set(np.unique(k)) == set(range(7))
    again = cupy.asnumpy(device_kernels.rng(7).standard_normal((1024, 1024), dtype=np.float32))
    assert np.array_equal(x, again)
    other = cupy.asnumpy(device_kernels.rng(8).standard_normal((1024, 1024), dtype=np.float32))
    assert not np.array_equal(x, other)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["exact", "noise", "nan", "far", "int"])
def test_one_pass_check_agrees_with_cupy(device_kernels, case):
    from tuner.gpu.checks import check_output

    ref = device_kernels.rng(3).standard_normal((512, 777), dtype=np.float32).astype(cupy.float64) * 10
    out = ref.astype(cupy.float32)
    if case == "noise":
        out = out + device_kernels.rng(4).standard_normal(ref.shape, dtype=np.float32) * 1e-4
    elif case == "nan":
        out[5, 7] = cupy.nan
        out[100, 0] = cupy.nan
    elif case == "far":
        out[3, 3] += 1.0
    elif case == "int":
        out = cupy.rint(ref).astype(cupy.int32)
        ref = cupy.rint(ref)
    mine = device_kernels.check(out, ref, 1e-4)
    theirs = check_output(cupy, "y", out, ref, 1e-4)
    assert mine is not None
    assert mine[0] == theirs.mismatches and mine[1] == theirs.nan_count
    assert mine[2] == pytest.approx(theirs.max_abs_error, rel=1e-12, abs=1e-300)
    assert mine[3] == pytest.approx(theirs.max_rel_error, rel=1e-12, abs=1e-300)
    if case in ("exact", "int"):
        assert mine[0] == 0
    if case == "nan":
        assert mine[0] == 2 and mine[1] == 2


def _stored_output(dtype: str, base):
    """`base` (float64 on the GPU) as an output of `dtype`, stored as the GPU worker stores it (bf16 as bits)."""
    from tuner.kernels import bf16

    if dtype == "bfloat16":
        return bf16.encode(cupy, base.astype(cupy.float32))
    if dtype == "bool":
        return base > 0
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        out = cupy.rint(cupy.abs(base) if dtype.startswith("u") else base).astype(dtype)
        out[0, 0], out[0, 1] = np.dtype(dtype).type(info.max), np.dtype(dtype).type(info.min)  # the widest values
        return out
    return base.astype(dtype)


def _as_read(dtype: str, out):
    """What `check_output` compares of a stored output of `dtype`: bf16 bits decoded (a copy), others as they are."""
    from tuner.kernels import bf16

    return bf16.decode(cupy, out) if dtype == "bfloat16" else out


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["finite", "infinite"])
@pytest.mark.parametrize("pair", devicekernels.CHECK_PAIRS, ids="-".join)
def test_one_pass_check_agrees_with_cupy_for_every_dtype_pair(device_kernels, pair, case):
    """Every output dtype (as stored) against every reference dtype: the same mismatches, NaN count and maxima as
    CuPy's element-wise comparison, with NaN outputs, NaN references and far-off elements (`finite`), and
    infinities in the output and the reference beside them (`infinite`)."""
    from tuner.gpu.checks import check_output

    o_name, r_name = pair
    floats = o_name in ("float16", "bfloat16", "float32", "float64")
    base = device_kernels.rng(3).standard_normal((300, 1001), dtype=np.float32).astype(cupy.float64) * 10
    out = _stored_output(o_name, base)
    if floats:  # two NaN outputs (bits of a NaN in every float format: all ones)
        out.view(cupy.uint8).reshape(300, -1)[5, : out.itemsize] = 0xFF
        out.view(cupy.uint8).reshape(300, -1)[100, : out.itemsize] = 0xFF
    ref = (
        _as_read(o_name, out).astype(cupy.float64)
        + device_kernels.rng(4).standard_normal(out.shape, dtype=np.float32) * 1e-4
    )
    ref[::37] += 0.5  # far off: a mismatch in every 37th row
    if floats:
        ref[5, 0] = ref[100, 0] = 1.0  # finite where the output is NaN
    ref[10, 10] = cupy.nan
    if case == "infinite":
        ref[11, 11], ref[12, 12] = cupy.inf, -cupy.inf  # against finite outputs: NaN errors
        if floats:
            inf = {"float16": 0x7C00, "bfloat16": 0x7F80}
            for row, sign in ((13, 1.0), (14, -1.0)):
                if o_name in inf:  # written as bits: a float16 or bf16 infinity of that sign
                    out.view(cupy.uint16)[row, 3] = inf[o_name] | (0x8000 if sign < 0 else 0)
                else:
                    out[row, 3] = sign * cupy.inf
            ref[14, 3] = -cupy.inf  # -inf against -inf: a NaN error; +inf against a finite value: an infinite one
    ref = cupy.ascontiguousarray(ref.astype(r_name))
    mine = device_kernels.check(out, ref, 1e-3, o_name if o_name == "bfloat16" else None)
    theirs = check_output(cupy, "y", _as_read(o_name, out), ref, 1e-3)
    assert mine is not None, pair
    assert (mine[0], mine[1]) == (theirs.mismatches, theirs.nan_count)
    assert mine[2] == pytest.approx(theirs.max_abs_error, rel=1e-12, abs=1e-300)
    assert mine[3] == pytest.approx(theirs.max_rel_error, rel=1e-12, abs=1e-300)
    assert mine[0] >= 9 * 1001 - 2 and mine[1] == (2 if floats else 0)  # the widest integers of row 0 may pass
    if case == "infinite" and floats:
        assert mine[2] == mine[3] == float("inf")
    else:
        assert 0.4 < mine[3] < 1 and np.isfinite(mine[2])


@pytest.mark.gpu
def test_the_hold_keeps_the_hosts_time_out_of_the_timings(stream):
    """A call that sleeps 2 ms on the host before a 1 MB memset: timed without the hold, each event pair holds
    the GPU idling for the sleep; behind the hold, only the memset."""
    import time

    from tuner.gpu.timing import time_launches

    hold = devicekernels.Hold(stream)
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

    hold = devicekernels.Hold(stream, timeout_s=0.005)
    buf = cupy.empty(1 << 20, dtype=cupy.uint8)

    def run() -> None:
        time.sleep(0.002)
        buf.data.memset_async(0, buf.nbytes, stream)

    t0 = time.perf_counter()
    times = time_launches(run, stream=stream, reps=16, hold=hold)  # 32 ms of host time against 5 ms
    assert len(times) == 16 and time.perf_counter() - t0 < 2.0
    assert hold.timeouts >= 1
