"""The GPU worker's own kernels on the device (`tuner.gpu.devicekernels`): on a GPU, the random draws have the right
moments and ranges, a seed reproduces them, both they and the one-pass check follow the caller's stream, and the
check agrees with CuPy's element-wise comparison (`tuner.gpu.checks.check_output`) on exact, noisy, NaN and far-off
outputs of every dtype pair."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.build.compile import compile_source
from tuner.gpu import devicekernels, kernelsource

try:
    import cupy

    HAVE_GPU = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:  # no CuPy, no driver or no device
    HAVE_GPU = False


@pytest.fixture(scope="module")
def device_kernels():
    if not HAVE_GPU:
        pytest.skip("needs a CUDA GPU")
    arch = f"sm_{cupy.cuda.Device(0).compute_capability}"
    # as the GPU worker builds them: the first checks up front, the other pairs (int32 below) from `later`
    first = compile_source(kernelsource.source(kernelsource.FIRST_CHECKS), arch)
    rest = kernelsource.LATER_CHECKS
    later = kernelsource.Built(rest, arch, fills=False)
    return devicekernels.DeviceKernels(first, kernelsource.FIRST_CHECKS, later)


@pytest.fixture
def stream():
    """A non-blocking stream, as the GPU worker's: nothing orders it with the legacy default stream."""
    if not HAVE_GPU:
        pytest.skip("needs a CUDA GPU")
    return cupy.cuda.Stream(non_blocking=True)


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
@pytest.mark.parametrize("pair", kernelsource.CHECK_PAIRS, ids="-".join)
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
