"""Verification on a pool of input sets (`tuner.gpu.verify`), references computed once.

The bookkeeping (sets taken in turn, budgets, keys that fall back to fresh inputs) and the ways a declarative
reference receives its arrays run on the CPU; the pool inside the GPU evaluator (a reference computed once per
set, a fresh set for an explicit seed, a kept reference restored after a kernel wrote over it, inputs that do not
come back from their seed) needs a GPU and runs in process, so that the reference's calls can be counted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tuner.build.compile import compile_source
from tuner.build.render import environment, render
from tuner.core.result import Measurement, WrongResult
from tuner.gpu.protocol import EvaluateRequest
from tuner.gpu.verify import POOL_SIZE, InputPool, pool_key
from tuner.kernels.base import Family, Launch
from tuner.kernels.refarrays import reference_arrays_of


def _gpu_count() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device: all mean "no GPU here"
        return 0


HAVE_GPU = _gpu_count() > 0
gpu = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")]

# ---------------------------------------------------------------------------------------------------------------
# bookkeeping (CPU)


def test_sets_are_taken_in_turn_and_an_explicit_budget_of_zero_falls_back_to_fresh_inputs():
    pool = InputPool(size=2, device_budget=1 << 30, host_budget=1 << 30)
    drawn = [pool.draw(("k",)) for _ in range(6)]
    seeds = [d.seed for d in drawn if d is not None]
    assert len(seeds) == 6 and len(set(seeds)) == 2
    assert seeds[0::2] == [seeds[0]] * 3 and seeds[1::2] == [seeds[1]] * 3  # in turn, not at random
    assert pool.protocol(("k",)) == "pool of 2 input sets, references kept"
    pool.forget(("k",), "a reason")
    assert pool.draw(("k",)) is None and pool.protocol(("k",)) == "fresh inputs per check (a reason)"
    assert InputPool(size=0).draw(("k",)) is None
    assert POOL_SIZE == 2
    # an explicit seed's set stands beside the pool's, one per key, and outlives neither its seed nor the turn
    first = pool.fresh(("j",), 7)
    assert pool.fresh(("j",), 7) is first and first.uses == 2
    assert pool.fresh(("j",), 8) is not first and pool.draw(("j",)).seed not in (7, 8)


def test_sets_computed_ahead_are_drawn_only_once_settled_and_one_that_failed_is_dropped():
    from concurrent.futures import Future

    pool = InputPool(size=2, device_budget=1 << 30, host_budget=1 << 30)
    pool.reserve(99)  # the finalists' seed, told before the study's first check
    first = pool.draw(("k",))
    later = pool.ahead(("k",))  # the pool's second set and the reserved seed's
    assert len(later) == 2 and later[1].seed == 99 and later[0].seed not in (first.seed, 99)
    answer: Future = Future()
    for kept in later:
        kept.pending, kept.finish = answer, lambda expected: expected
    assert all(pool.draw(("k",)) is first for _ in range(3))  # a pending set is not drawn
    assert pool.fresh(("k",), 99) is later[1]  # the finalists find the set computed ahead for them
    assert {id(kept) for _, kept in pool.pending()} == {id(kept) for kept in later}
    assert pool.ahead(("k",)) == []  # nothing more to compute ahead for this key
    answer.set_exception(RuntimeError("the reference failed in the background"))
    pool.settle(("k",), later[0])
    assert later[0] not in pool.sets[("k",)] and later[0].pending is None
    again = pool.draw(("k",))  # the pool is short of a set: the next draw computes one in the foreground
    assert again.seed not in (first.seed, later[0].seed) and again.pending is None


def test_the_pool_key_reads_the_config_only_where_the_family_says_its_reference_does():
    from tuner import kernels

    copy, transpose = kernels.get("copy"), kernels.get("transpose")
    problem = {"n": 1024, "dtype": "float32"}
    assert pool_key(copy, problem, {"stride": 1, "vec": 4, "block": 128}) == pool_key(
        copy, problem, {"stride": 1, "vec": 4, "block": 256}
    )
    assert pool_key(copy, problem, {"stride": 1, "vec": 4}) != pool_key(copy, problem, {"stride": 2, "vec": 4})
    assert pool_key(transpose, problem, {"tile": 32}) == pool_key(transpose, problem, {"tile": 64})
    assert pool_key(transpose, problem, {}) != pool_key(transpose, {**problem, "n": 2048}, {})


def test_how_a_reference_wants_its_arrays_is_read_from_its_signature():
    def plain(x, y):
        return x + y

    def on_device(x, y, xp):
        return xp.add(x, y)

    def with_torch(x: "torch.Tensor", y):  # noqa: F821, UP037 - torch need not be importable to read the signature
        return x

    assert reference_arrays_of(plain) == "numpy"
    assert reference_arrays_of(on_device) == "xp"
    assert reference_arrays_of(with_torch) == "torch"


SPACE = """\
kernel:
  name: axpy
  dtypes: [bfloat16]
  arguments:
    - {name: x, role: input, shape: [n], dtype: __nv_bfloat16}
    - {name: out, role: output, shape: [n], dtype: float}
    - {name: n, role: scalar, dtype: int64}
  launch: {grid: ["ceil_div(n, block)"], block: [block]}
  reference: ref.py:axpy
%s
template: axpy.cu.j2
problem: {name: small, n: 4096, dtype: bfloat16}
params: {block: [128, 256]}
"""
TEMPLATE = """\
#include <cuda_bf16.h>
extern "C" __global__ void {{ entry }}(const __nv_bfloat16* x, float* out, long long n) {
    long long i = (long long)blockIdx.x * {{ block }} + threadIdx.x;
    if (i < n) out[i] = 2.0f * __bfloat162float(x[i]);
}
"""


def _axpy_space(tmp_path: Path, reference: str, arrays: str = "", out: str = "float"):
    from tuner.space.space import load

    (tmp_path / "axpy.cu.j2").write_text(TEMPLATE.replace("float* out", f"{out}* out"))
    (tmp_path / "ref.py").write_text(reference)
    text = SPACE % (f"  reference_arrays: {arrays}" if arrays else "")
    (tmp_path / "axpy.yaml").write_text(text.replace("dtype: float}", f"dtype: {out}}}"))
    return load(tmp_path / "axpy.yaml")


def _reference_on_the_host(space):
    from tuner.kernels import bf16

    family, problem = space.family, space.problem().env
    inputs = family.inputs(np, problem, np.random.default_rng(0))
    expected = family.reference(np, inputs, problem, config={"block": 128})
    return bf16.decode(np, inputs["x"]), expected["out"]


def test_cuda_types_declare_the_arrays_and_an_xp_reference_gets_float32_arrays_of_its_module(tmp_path):
    space = _axpy_space(tmp_path, "def axpy(x, n, xp):\n    assert x.dtype == xp.float32\n    return 2 * x\n")
    family = space.family
    assert family.reference_arrays == "xp"
    assert [a.dtype for a in family.arguments[:2]] == ["bfloat16", "float32"]
    x, out = _reference_on_the_host(space)
    np.testing.assert_array_equal(out, 2 * x)


def test_a_numpy_reference_gets_float64_and_an_unknown_arrays_mode_is_one_line(tmp_path):
    from tuner.core.errors import SpaceError

    space = _axpy_space(tmp_path, "def axpy(x, n):\n    assert x.dtype == 'float64'\n    return 2 * x\n")
    assert space.family.reference_arrays == "numpy"
    x, out = _reference_on_the_host(space)
    np.testing.assert_array_equal(out, 2 * x)
    with pytest.raises(SpaceError, match=r"axpy.yaml:\d+: kernel: reference_arrays 'jax': choose numpy, xp, torch"):
        (tmp_path / "bad").mkdir()
        _axpy_space(tmp_path / "bad", "def axpy(x, n):\n    return x\n", arrays="jax")


def test_a_numpy_reference_of_a_kernel_with_16_bit_outputs_gets_float32(tmp_path):
    space = _axpy_space(
        tmp_path, "def axpy(x, n):\n    assert x.dtype == 'float32', x.dtype\n    return 2 * x\n", out="__nv_bfloat16"
    )
    assert space.family.reference_arrays == "numpy"
    x, out = _reference_on_the_host(space)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, 2 * x)


def test_a_torch_reference_gets_bfloat16_tensors_and_may_return_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    space = _axpy_space(
        tmp_path,
        "import torch\n\n\ndef axpy(x: torch.Tensor, n):\n"
        "    assert x.dtype == torch.bfloat16\n    return 2 * x.float()\n",
    )
    assert space.family.reference_arrays == "torch"
    x, out = _reference_on_the_host(space)
    assert torch is not None
    np.testing.assert_array_equal(np.asarray(out), 2 * x)


# ---------------------------------------------------------------------------------------------------------------
# the pool inside the GPU evaluator

COPY_TEMPLATE = """\
extern "C" __global__ void {{ entry }}(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = {{ "2.0f * " if mode == "wrong" else "" }}x[i];
}
"""
PROBLEM = {"n": 1 << 22, "dtype": "float32", "elem_bytes": 4}


class Counted(Family):
    """y = x over n floats; counts its reference's calls. `seeded` False draws inputs past the seeded generator
    (CuPy's own global generator), which a pool cannot draw again."""

    name = "counted"
    template = "counted.cu.j2"
    made = 0
    problem_sizes = ("n",)

    def __init__(self, seeded: bool = True, fail: bool = False):
        self.seeded, self.fail, self.calls = seeded, fail, 0
        Counted.made += 1  # a key of its own in the evaluator's pool (an id() may be reused once freed)
        self.ref = f"counted-{Counted.made}"

    def launches(self, entry, config, problem):
        n = problem["n"]
        return [Launch(entry=entry, grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), args=("x", "y", "n"))]

    def inputs(self, xp, problem, rng):
        shape = (problem["n"],)
        x = rng.standard_normal(shape, dtype=xp.float32) if self.seeded else xp.random.standard_normal(shape)
        return {"x": x.astype(xp.float32)}

    def outputs(self, problem, config):
        return {"y": ((problem["n"],), "float32")}

    def reference(self, xp, inputs, problem, config=None):
        self.calls += 1
        if self.fail:
            return {"y": xp.zeros((3,))}  # the wrong shape
        return {"y": inputs["x"].astype(xp.float64)}

    def tolerance(self, problem):
        return 0.0

    def bytes_moved(self, problem):
        return 2 * problem["n"] * 4


class HostCounted(Counted):
    """Counted with a reference that runs on the host: the evaluator computes its later sets ahead. Records the
    thread each reference call ran in."""

    def __init__(self):
        super().__init__()
        self.threads: list[str] = []

    def reference_on_host(self):
        return True

    def reference(self, xp, inputs, problem, config=None):
        import threading

        self.threads.append(threading.current_thread().name)
        return super().reference(xp, inputs, problem, config)


class OwnStream(Counted):
    """Counted whose reference computes on another stream than the evaluator's, as a torch reference computes on
    torch's current stream: one of its own, or the legacy default stream, behind 0.3 s of GPU work there."""

    def __init__(self, legacy: bool):
        super().__init__()
        self.legacy = legacy

    def reference(self, xp, inputs, problem, config=None):
        from tests.gpu_helpers import spin

        self.calls += 1
        stream = xp.cuda.Stream.null if self.legacy else xp.cuda.Stream(non_blocking=True)
        with stream:
            spin(stream, 0.3)
            return {"y": inputs["x"].astype(xp.float64)}


@pytest.fixture(scope="module")
def evaluator():
    from tuner.gpu.evaluator import GpuEvaluator

    if not HAVE_GPU:
        pytest.skip("needs a CUDA GPU")
    ev = GpuEvaluator(0)
    ev.start()
    yield ev
    ev.close()


@pytest.fixture(scope="module")
def binaries(tmp_path_factory, evaluator):
    folder = tmp_path_factory.mktemp("counted")
    (folder / Counted.template).write_text(COPY_TEMPLATE)
    env, out = environment(folder), {}
    for mode in ("good", "wrong"):
        params = {"mode": mode}
        compiled = compile_source(render(Counted(), params, params, PROBLEM, env=env), evaluator.arch, use_cache=False)
        assert compiled.ok, compiled
        out[mode] = compiled
    return out


def _run(evaluator, binaries, family, mode="good", **kwargs):
    return evaluator.evaluate(EvaluateRequest(binaries[mode], family, {"mode": mode}, PROBLEM, budget_ms=1.0, **kwargs))


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")
def test_the_reference_is_computed_once_per_input_set_and_an_explicit_seed_is_a_fresh_set(evaluator, binaries):
    family = Counted()
    results = [_run(evaluator, binaries, family) for _ in range(6)]
    assert all(isinstance(r, Measurement) for r in results), results
    assert family.calls == POOL_SIZE
    assert results[-1].versions["verification"] == "pool of 2 input sets, references kept"
    fresh = _run(evaluator, binaries, family, seed=12345)
    assert isinstance(fresh, Measurement) and fresh.versions["verification"] == "fresh input set"
    assert family.calls == POOL_SIZE + 1
    assert isinstance(_run(evaluator, binaries, family, seed=12345), Measurement)  # the finalists share one set
    assert family.calls == POOL_SIZE + 1
    assert isinstance(_run(evaluator, binaries, family, seed=678), Measurement)
    assert family.calls == POOL_SIZE + 2
    # what a summary reads: threads of the launch, GPU time of the launches, the stages' host wall
    last = results[-1]
    assert last.threads_per_block == 256
    assert last.gpu_ms >= last.median_ms * last.repetitions
    assert set(last.phases_s) == {"inputs", "reference", "launch", "compare", "timing"}
    assert results[0].phases_s["reference"] > 0 and last.phases_s["reference"] < results[0].phases_s["reference"]


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")
def test_a_host_reference_is_waited_for_once_and_the_other_sets_are_computed_ahead(evaluator, binaries):
    import time

    family = HostCounted()
    evaluator.reserve(4242)  # the finalists' seed
    assert isinstance(_run(evaluator, binaries, family), Measurement)
    assert family.threads.count("MainThread") == 1  # only the first set's reference is waited for
    deadline = time.monotonic() + 30
    while family.calls < 3 and time.monotonic() < deadline:  # the second set's and the finalists', ahead
        time.sleep(0.01)
    background = [name for name in family.threads if name != "MainThread"]
    assert family.calls == 3 and len(background) == 2, family.threads
    assert all(name.startswith("tuner-reference") for name in background), family.threads
    results = [_run(evaluator, binaries, family) for _ in range(4)]
    assert all(isinstance(r, Measurement) for r in results), results
    assert isinstance(_run(evaluator, binaries, family, seed=4242), Measurement)
    assert family.calls == 3  # neither the pool's sets nor the finalists' computed a reference again
    # a wrong kernel is still caught against a reference computed ahead
    assert all(isinstance(_run(evaluator, binaries, family, "wrong"), WrongResult) for _ in range(2))


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")
def test_a_wrong_kernel_still_fails_and_a_kept_reference_written_over_is_restored(evaluator, binaries):
    family = Counted()
    # four good configs: each set computed once, then matched on inputs drawn again (confirmed)
    assert all(isinstance(_run(evaluator, binaries, family), Measurement) for _ in range(4))
    wrong = _run(evaluator, binaries, family, mode="wrong")
    assert isinstance(wrong, WrongResult) and wrong.details["verification"].startswith("pool of 2")
    assert family.calls == POOL_SIZE  # a confirmed set is not computed again to blame a config
    key = pool_key(family, PROBLEM, {"mode": "good"})
    with evaluator.device.stream:  # where a kernel of the evaluator's would write it
        for kept in evaluator.verification.pool.sets[key]:
            kept.device["y"].fill(7.0)  # as a kernel writing out of bounds might
    assert all(isinstance(_run(evaluator, binaries, family), Measurement) for _ in range(2))
    assert family.calls == POOL_SIZE  # restored from the host copies, not computed again


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("legacy", [False, True], ids=["its-own-stream", "legacy-default-stream"])
def test_a_reference_computed_on_another_stream_is_read_once_it_is_done(evaluator, binaries, legacy):
    """The producer delayed: read before its stream is done, the reference would be memory nothing wrote yet,
    and the right kernel a WrongResult."""
    family = OwnStream(legacy)
    assert all(isinstance(r, Measurement) for r in [_run(evaluator, binaries, family) for _ in range(2)])
    assert family.calls == POOL_SIZE
    assert isinstance(_run(evaluator, binaries, family, "wrong"), WrongResult)


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")
def test_inputs_that_do_not_come_back_from_their_seed_leave_the_pool(evaluator, binaries):
    family = Counted(seeded=False)
    results = [_run(evaluator, binaries, family) for _ in range(4)]
    assert all(isinstance(r, Measurement) for r in results), results
    assert results[-1].versions["verification"].startswith("fresh inputs per check (its inputs did not come back")


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")
def test_a_reference_of_the_wrong_shape_is_a_reference_fault(evaluator, binaries):
    result = _run(evaluator, binaries, Counted(fail=True))
    assert isinstance(result, WrongResult) and result.details["phase"] == "reference"
    assert "returned 'y' with shape (3,), the kernel writes (4194304,)" in result.reason


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")
def test_a_study_whose_reference_raises_stops_at_its_first_check_with_one_line(tmp_path):
    import subprocess
    import sys

    _axpy_space(tmp_path, "def axpy(x, n):\n    return x[n + 10 ** 9]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "study", "axpy", "--space", "axpy.yaml", "--trials", "4"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if "tuner: error" in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "reference ref.py:axpy raised IndexError" in lines[0] and "ref.py:2" in lines[0], lines[0]


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")
def test_the_bf16_generator_draws_the_bits_encoding_its_float32_draws_would(evaluator):
    import cupy

    from tuner.kernels import bf16

    one, two = evaluator.device.kernels.rng(99), evaluator.device.kernels.rng(99)
    bits = one.standard_normal_bf16((1 << 20,), 0.5)
    encoded = bf16.encode(cupy, two.standard_normal((1 << 20,), dtype=cupy.float32) * cupy.float32(0.5))
    assert bits.dtype == cupy.uint16 and bool((bits == encoded).all())
