"""The GPU evaluator's pure-Python parts, for real, on a machine without a GPU.

Status-code classification (with CuPy's own exception types), the repetition and percentile arithmetic, the
output check (with NumPy as the array module), kernel-argument packing, the one-config pipeline up to the
evaluator (real NVRTC), and the worker's fault containment: a fake evaluator in a real spawned child hangs,
dies, poisons itself or raises, and the same `IsolatedEvaluator` goes on with a fresh child each time.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import time

import numpy as np
import pytest
from cupy_backends.cuda.api import driver, runtime

from tests.child_helpers import spy_retire
from tuner import kernels
from tuner.build.compile import compile_source
from tuner.build.render import environment
from tuner.gpu import checks
from tuner.gpu import evaluator as gpu_evaluator
from tuner.gpu import status as cuda_status
from tuner.gpu import timing as gpu_timing
from tuner.gpu.evaluate import evaluate_config
from tuner.gpu.protocol import EvaluateRequest, Evaluator
from tuner.gpu.worker import IsolatedEvaluator, WorkerError
from tuner.kernels.base import Family, Launch
from tuner.result import CompileFailed, Invalid, LaunchFailed, Measurement, TimedOut
from tuner.space.space import load

# ------------------------------------------------------------------------------------------------------------
# status codes


@pytest.mark.parametrize("status", [700, 714, 715, 716, 718, 719])
def test_context_poisoning_statuses_are_sticky(status):
    assert cuda_status.classify_status(status) == "sticky"


@pytest.mark.parametrize("status", [1, 200, 209, 218, 500, 701])
def test_refused_launch_statuses_are_not_sticky(status):
    assert cuda_status.classify_status(status) == "launch"


@pytest.mark.parametrize("status", [None, 0, 3, 600, 801])
def test_other_statuses_are_not_ours(status):
    assert cuda_status.classify_status(status) is None


def test_status_numbers_match_the_cuda_runtime_names():
    """Guards the tables against a typo: the runtime names each code itself (no driver needed for that)."""
    expected = {
        700: "cudaErrorIllegalAddress",
        714: "cudaErrorHardwareStackError",
        715: "cudaErrorIllegalInstruction",
        716: "cudaErrorMisalignedAddress",
        718: "cudaErrorInvalidPc",
        719: "cudaErrorLaunchFailure",
        1: "cudaErrorInvalidValue",
        200: "cudaErrorInvalidKernelImage",
        209: "cudaErrorNoKernelImageForDevice",
        701: "cudaErrorLaunchOutOfResources",
        600: "cudaErrorNotReady",
    }
    for status, name in expected.items():
        assert str(runtime.CUDARuntimeError(status)).startswith(name + ":")


def test_runtime_error_becomes_a_sticky_launch_failure():
    failure = cuda_status.cuda_failure(runtime.CUDARuntimeError(700), "launch")
    assert isinstance(failure, LaunchFailed)
    assert failure.details["status"] == 700 and failure.details["sticky"] is True
    assert failure.reason.startswith("launch: CUDA error 700 (illegal address)")


def test_driver_error_becomes_a_non_sticky_launch_failure():
    # CUDADriverError's constructor asks libcuda for the name; without a driver, build it around its status.
    exc = driver.CUDADriverError.__new__(driver.CUDADriverError)
    exc.status = 701
    failure = cuda_status.cuda_failure(exc, "launch")
    assert failure.details == {**failure.details, "status": 701, "sticky": False}
    assert "too many resources" in failure.reason


def test_unexpected_status_is_left_to_propagate():
    assert cuda_status.cuda_failure(runtime.CUDARuntimeError(3), "launch") is None


# ------------------------------------------------------------------------------------------------------------
# timing arithmetic


@pytest.mark.parametrize(
    ("estimate_ms", "budget_ms", "expected"),
    [
        (0.1, 25.0, 250),
        (1.0, 25.0, 25),
        (5.0, 25.0, 10),
        (1e-5, 25.0, 10_000),
        (0.0, 25.0, 10_000),
        (float("nan"), 25.0, 10),
        (0.07, 25.0, 357),
    ],
)
def test_repetitions_fill_the_budget_within_bounds(estimate_ms, budget_ms, expected):
    assert gpu_timing.repetitions(estimate_ms, budget_ms, min_reps=10, max_reps=10_000) == expected


def test_summarize_reports_median_and_p20_p80():
    times = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 6.0, 8.0, 7.0, 9.0]
    timing = gpu_timing.summarize(times)
    assert timing.median_ms == pytest.approx(5.5)
    assert timing.p20_ms == pytest.approx(np.percentile(times, 20))
    assert timing.p80_ms == pytest.approx(np.percentile(times, 80))
    assert timing.repetitions == 10


class ScriptedHold:
    """Stands in for `tuner.gpu.devicekernels.Hold`: logs hold/release and gives up on the batches it is told to."""

    def __init__(self, gives_up_after: set[int]):
        self.log: list[str] = []
        self.gives_up_after = gives_up_after  # batch numbers (from 0) the hold gives up on
        self.batches = 0

    def hold(self) -> None:
        self.log.append("hold")

    def release(self) -> None:
        self.log.append("release")

    def gave_up(self) -> bool:
        self.batches += 1
        return self.batches - 1 in self.gives_up_after


def test_launches_are_enqueued_in_order_in_held_batches_that_halve_after_a_give_up():
    hold = ScriptedHold(gives_up_after={1, 2})
    enqueued: list[int] = []
    sizes = gpu_timing.enqueue_behind(hold, 50, lambda i: (enqueued.append(i), hold.log.append("launch")))
    assert enqueued == list(range(50))
    assert sizes == [16, 16, 8, 4, 4, 2] and sum(sizes) == 50
    # each batch: hold, its launches, release
    expected = [entry for size in sizes for entry in ["hold", *["launch"] * size, "release"]]
    assert hold.log == expected


def test_without_a_hold_every_launch_goes_in_one_batch():
    enqueued: list[int] = []
    assert gpu_timing.enqueue_behind(None, 40, enqueued.append) == [40]
    assert enqueued == list(range(40))
    assert gpu_timing.enqueue_behind(None, 0, enqueued.append) == []


def test_a_launch_that_raises_still_releases_the_stream():
    hold = ScriptedHold(gives_up_after=set())

    def enqueue(i: int) -> None:
        if i == 20:
            raise RuntimeError("launch refused")

    with pytest.raises(RuntimeError, match="launch refused"):
        gpu_timing.enqueue_behind(hold, 40, enqueue)
    assert hold.log == ["hold", "release", "hold", "release"]


# ------------------------------------------------------------------------------------------------------------
# correctness check (NumPy stands in for CuPy)


def test_check_output_accepts_an_exact_match():
    ref = np.linspace(-3, 3, 101)
    check = checks.check_output(np, "y", ref.astype(np.float32), ref, 1e-6)
    assert check.ok and check.max_abs_error < 1e-6


def test_check_output_counts_mismatches_and_nans():
    ref = np.arange(10, dtype=np.float64)
    out = ref.astype(np.float32)
    out[3] = 100.0
    out[7] = np.nan
    check = checks.check_output(np, "y", out, ref, 1e-4)
    assert not check.ok
    assert (check.mismatches, check.nan_count) == (2, 1)
    assert check.max_abs_error == pytest.approx(97.0)
    assert check.max_rel_error == pytest.approx(97.0 / 3.0)
    text = check.describe()
    assert "2 of 10" in text and "max abs error 97" in text and "max rel error" in text and "1 NaN" in text


def test_check_output_tolerance_is_relative_to_large_values():
    ref = np.array([1e6, 1.0])
    out = np.array([1e6 + 50.0, 1.0])  # 5e-5 relative
    assert checks.check_output(np, "y", out, ref, 1e-4).ok
    assert not checks.check_output(np, "y", out, ref, 1e-5).ok


def test_check_output_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="shape"):
        checks.check_output(np, "y", np.zeros((4, 4)), np.zeros(16), 0.0)


def test_scalar_arguments_are_packed_for_any_int_width():
    assert gpu_evaluator._scalar(7).dtype == np.int64
    assert gpu_evaluator._scalar(0.5).dtype == np.float32
    assert gpu_evaluator._scalar(np.int32(3)).dtype == np.int32
    with pytest.raises(TypeError):
        gpu_evaluator._scalar("float32")


def test_a_poisoned_evaluator_refuses_work_without_touching_cuda():
    evaluator = gpu_evaluator.GpuEvaluator()
    evaluator.poisoned = True
    with pytest.raises(cuda_status.EvaluatorPoisoned):
        evaluator.evaluate(EvaluateRequest(None, "copy", {}, {}))


# ------------------------------------------------------------------------------------------------------------
# the GPU tests' probe kernels compile (so a typo there shows here)


def test_every_gpu_probe_kernel_compiles(tmp_path):
    from tests.gpu import test_evaluator_gpu as gpu

    env = gpu.probe_environment(tmp_path)
    for mode in gpu.PROBE_MODES:
        compiled = compile_source(gpu.probe_source(mode, env), "sm_90")
        assert compiled.ok, (mode, getattr(compiled, "reason", ""))
        assert compiled.entry in compiled.functions
    bounded = compile_source(gpu.probe_source("bounds", env), "sm_90")
    assert "__launch_bounds__(128)" in gpu.probe_source("bounds", env).text and bounded.registers > 0


# ------------------------------------------------------------------------------------------------------------
# evaluate_config: validate → render → compile → evaluator (real NVRTC, a fake evaluator)

TOY_TEMPLATE = """\
extern "C" __global__ void {{ entry }}(const float* x, float* y, long long n)
{
    long long i = (long long)blockIdx.x * {{ block }} + threadIdx.x;
    if (i < n) y[i] = x[i]{% if broken %} +{% endif %};
}
"""
TOY_SPACE = """\
kernel: toy
problem: {name: small, n: 4096, dtype: float32}
params:
  block: [64, 128, 256, 2048]
  broken: [false, true]
derived:
  grid: n // block
constraints:
  - block <= 1024
"""


class Toy(Family):
    name = "toy"
    template = "toy.cu.j2"
    problem_sizes = ("n",)

    def launches(self, entry, config, problem):
        return [Launch(entry, (config["grid"], 1, 1), (config["block"], 1, 1), ("x", "y", "n"))]


FAMILY = Toy()  # what `kernels.get("toy")` answers once the test registers this module


class RecordingEvaluator(Evaluator):
    arch = "sm_90"

    def __init__(self):
        self.calls = []

    def evaluate(self, request):
        self.calls.append(request)
        return "measured"


@pytest.fixture
def toy_space(tmp_path, monkeypatch):
    monkeypatch.setitem(kernels._REGISTRY, "toy", __name__)
    monkeypatch.setitem(kernels._LOADED, "toy", FAMILY)
    (tmp_path / "toy.cu.j2").write_text(TOY_TEMPLATE)
    (tmp_path / "toy.yaml").write_text(TOY_SPACE)
    return load(tmp_path / "toy.yaml"), environment(tmp_path)


def test_evaluate_config_refuses_an_invalid_config_before_any_work(toy_space):
    space, env = toy_space
    evaluator = RecordingEvaluator()
    result = evaluate_config(space, {"block": 2048, "broken": False}, evaluator=evaluator, env=env)
    assert isinstance(result, Invalid) and "block <= 1024" in result.reason
    assert evaluator.calls == []


def test_evaluate_config_returns_the_compile_failure(toy_space):
    space, env = toy_space
    evaluator = RecordingEvaluator()
    result = evaluate_config(space, {"block": 128, "broken": True}, evaluator=evaluator, env=env)
    assert isinstance(result, CompileFailed) and result.details["log"]
    assert evaluator.calls == []


def test_evaluate_config_hands_the_compiled_config_to_the_evaluator(toy_space):
    space, env = toy_space
    evaluator = RecordingEvaluator()
    result = evaluate_config(
        space, {"block": 128, "broken": False}, evaluator=evaluator, env=env, seed=5, budget_ms=50.0
    )
    assert result == "measured"
    (request,) = evaluator.calls
    compiled = request.compiled
    assert compiled.ok and compiled.arch == "sm_90" and compiled.entry == "toy_block128_brokenFalse"
    assert request.family is FAMILY
    assert request.config == {"block": 128, "broken": False, "grid": 32}
    assert request.problem == {"n": 4096, "dtype": "float32", "elem_bytes": 4}
    assert (request.seed, request.budget_ms, request.min_reps, request.cutoff_ms) == (5, 50.0, 10, None)


# ------------------------------------------------------------------------------------------------------------
# the worker: a fake evaluator in a real spawned child


def _measurement(uri: str) -> Measurement:
    return Measurement(
        median_ms=1.0,
        p20_ms=0.9,
        p80_ms=1.1,
        repetitions=10,
        bytes_moved=1,
        flops=0,
        tbps=1.0,
        tflops=0.0,
        ceiling_tbps=4.0,
        fraction_of_ceiling=0.25,
        registers=1,
        smem_static_bytes=0,
        smem_dynamic_bytes=0,
        spill_bytes=0,
        uri=uri,
    )


class FakeEvaluator(Evaluator):
    """Stands in for GpuEvaluator in the child; `config["mode"]` picks what goes wrong."""

    def __init__(self, fail_start: bool = False):
        if fail_start:
            raise RuntimeError("no GPU for you")
        self.poisoned = False
        self.ceiling_tbps = 4.2

    def start(self):
        return {"gpu": "fake", "arch": "sm_90", "ceiling_tbps": self.ceiling_tbps, "pid": os.getpid()}

    def evaluate(self, request):
        mode = request.config["mode"]
        if mode == "hang":
            time.sleep(3600)
        if mode == "die":
            os._exit(7)
        if mode == "sticky":
            self.poisoned = True
            return LaunchFailed(
                reason="launch: CUDA error 700 (illegal address)", details={"status": 700, "sticky": True}
            )
        if mode == "bug":
            raise ZeroDivisionError("a bug in the evaluator")
        family = request.family
        family_seen = family if isinstance(family, str) else type(family).__name__
        return _measurement(f"{family_seen}:{os.getpid()}")


def _gone(pid: int) -> bool:
    """The process has exited and been reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _isolated(**kwargs) -> IsolatedEvaluator:
    return IsolatedEvaluator(evaluator_factory=FakeEvaluator, start_timeout_s=60.0, **kwargs)


def _ok(evaluator, family="copy"):
    result = evaluator.evaluate(EvaluateRequest(None, family, {"mode": "ok"}, {"n": 1}))
    assert isinstance(result, Measurement), result
    return result


def test_an_evaluate_request_is_a_value_that_pickles():
    # what crosses the worker's pipe and Ray, as it is
    request = EvaluateRequest(None, Toy(), {"mode": "ok"}, {"n": 1}, seed=5, cutoff_ms=1.5)
    again = pickle.loads(pickle.dumps(request))
    assert (again.config, again.problem, again.seed, again.budget_ms, again.min_reps) == (
        {"mode": "ok"},
        {"n": 1},
        5,
        25.0,
        10,
    )
    assert again.cutoff_ms == 1.5 and type(again.family) is Toy
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.seed = 6  # type: ignore[misc]


def test_worker_answers_and_stays_alive_across_calls():
    with _isolated(timeout_s=30.0) as evaluator:
        assert evaluator.start()["gpu"] == "fake"
        first = _ok(evaluator)
        second = _ok(evaluator, family=Toy())  # an unregistered family crosses pickled
        assert first.uri == f"copy:{evaluator.pid}"  # a registered family crosses by name
        assert second.uri == f"Toy:{evaluator.pid}"
        assert evaluator.ceiling() == 4.2
        assert evaluator.restarts == 0
        pid = evaluator.pid
    assert _gone(pid)


def test_worker_hang_times_out_and_a_fresh_child_takes_over(monkeypatch):
    with _isolated(timeout_s=1.0) as evaluator:
        evaluator.start()
        hung_pid = evaluator.pid
        kills = spy_retire(monkeypatch)
        result = evaluator.evaluate(EvaluateRequest(None, "copy", {"mode": "hang"}, {"n": 1}))
        assert isinstance(result, TimedOut) and "1 s" in result.reason
        assert result.details["timeout_s"] == 1.0
        # cut at its 1 s bound: the child, an hour into its sleep, was killed rather than waited for
        assert kills == [True] and _gone(hung_pid)
        assert _ok(evaluator).uri.endswith(str(evaluator.pid)) and evaluator.pid != hung_pid
        assert evaluator.restarts == 1


def test_worker_death_is_a_launch_failure_and_a_fresh_child_takes_over():
    with _isolated(timeout_s=30.0) as evaluator:
        evaluator.start()
        dead_pid = evaluator.pid
        result = evaluator.evaluate(EvaluateRequest(None, "copy", {"mode": "die"}, {"n": 1}))
        assert isinstance(result, LaunchFailed) and result.reason.startswith("worker died")
        assert result.details["exitcode"] == 7
        _ok(evaluator)
        assert evaluator.pid != dead_pid


def test_sticky_failure_retires_the_child_and_the_next_call_succeeds():
    with _isolated(timeout_s=30.0) as evaluator:
        evaluator.start()
        poisoned_pid = evaluator.pid
        result = evaluator.evaluate(EvaluateRequest(None, "copy", {"mode": "sticky"}, {"n": 1}))
        assert isinstance(result, LaunchFailed) and result.details["sticky"] is True
        assert not evaluator.alive() and _gone(poisoned_pid)
        _ok(evaluator)
        assert evaluator.pid != poisoned_pid


def test_a_bug_in_the_child_raises_and_the_next_call_succeeds():
    with _isolated(timeout_s=30.0) as evaluator:
        with pytest.raises(WorkerError, match="ZeroDivisionError") as info:
            evaluator.evaluate(EvaluateRequest(None, "copy", {"mode": "bug"}, {"n": 1}))
        assert "Traceback" in info.value.remote
        _ok(evaluator)


def test_a_child_that_cannot_start_raises():
    evaluator = _isolated(timeout_s=30.0, evaluator_kwargs={"fail_start": True})
    with pytest.raises(WorkerError, match="no GPU for you"):
        evaluator.start()
    assert not evaluator.alive()
    evaluator.close()


def test_close_stops_the_child():
    evaluator = _isolated(timeout_s=30.0)
    evaluator.start()
    pid = evaluator.pid
    evaluator.close()
    assert _gone(pid) and not evaluator.alive() and evaluator.pid is None
