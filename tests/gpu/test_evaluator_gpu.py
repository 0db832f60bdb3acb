"""The GPU evaluator on a real GPU: shipped defaults verify and time, faults are contained, numbers are sane.

Skipped as a whole where there is no CUDA GPU. The fault cases use a tiny ad-hoc family (`Probe`) whose
template is written into a temporary folder: an out-of-bounds store, an endless loop, a wrong result, a launch
bound the launch breaks, and > 48 KiB of dynamic shared memory. `tests/gpu/test_evaluator_cpu.py` compiles every probe
with NVRTC, so a typo here shows on a machine without a GPU.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tuner import kernels
from tuner.build.compile import compile_source
from tuner.build.render import environment, render
from tuner.core.result import LaunchFailed, Measurement, TimedOut, WrongResult
from tuner.gpu.protocol import EvaluateRequest
from tuner.kernels.base import Family, Launch


def _gpu_count() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device: all mean "no GPU here"
        return 0


HAVE_GPU = _gpu_count() > 0
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA GPU")]

PROBE_TEMPLATE = """\
extern "C" __global__ void
{% if mode == "bounds" %}__launch_bounds__(128){% endif %}
{{ entry }}(const float* __restrict__ x, float* __restrict__ y, const int* flag, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
{% if mode == "hang" %}
    while (*(volatile const int*)flag == 0) { }  // flag is zero: spins forever, and volatile keeps the loop
{% endif %}
{% if mode == "smem" %}
    extern __shared__ float stage[];
    stage[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
{% endif %}
    if (i >= n) return;
{% if mode == "oob" %}
    y[i + (1LL << 40)] = x[i];  // 4 TiB past the buffer
{% elif mode == "wrong" %}
    y[i] = 2.0f * x[i];
{% elif mode == "smem" %}
    y[i] = stage[threadIdx.x];
{% else %}
    y[i] = x[i];
{% endif %}
}
"""
PROBE_MODES = ("good", "oob", "hang", "wrong", "bounds", "smem")
PROBE_SMEM = 64 * 1024  # dynamic shared memory of the "smem" probe: above the 48 KiB that needs the opt-in
PROBLEM = {"n": 1 << 25, "dtype": "float32", "elem_bytes": 4}  # 128 MiB in, 128 MiB out: 4x the H200's L2


class Probe(Family):
    """y = x over n floats, with deliberate faults chosen by the config's `mode`."""

    name = "probe"
    template = "probe.cu.j2"
    problem_sizes = ("n",)

    def launches(self, entry, config, problem):
        n = problem["n"]
        smem = PROBE_SMEM if config["mode"] == "smem" else 0
        return [
            Launch(
                entry=entry,
                grid=((n + 255) // 256, 1, 1),
                block=(256, 1, 1),
                args=("x", "y", "flag", "n"),
                smem_dynamic=smem,
            )
        ]

    def inputs(self, xp, problem, rng):
        return {"x": rng.standard_normal((problem["n"],), dtype=xp.float32), "flag": xp.zeros(1, dtype=xp.int32)}

    def outputs(self, problem, config):
        return {"y": ((problem["n"],), "float32")}

    def reference(self, xp, inputs, problem, config=None):
        return {"y": inputs["x"].astype(xp.float64)}

    def tolerance(self, problem):
        return 0.0

    def bytes_moved(self, problem):
        return 2 * problem["n"] * 4


PROBE = Probe()


def probe_environment(folder: Path):
    (Path(folder) / Probe.template).write_text(PROBE_TEMPLATE)
    return environment(folder)


def probe_source(mode: str, env):
    params = {"mode": mode}
    return render(PROBE, params, params, PROBLEM, env=env)


# ------------------------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def isolated():
    from tuner.gpu.worker import IsolatedEvaluator

    with IsolatedEvaluator(gpu=0, timeout_s=120.0) as evaluator:
        evaluator.start()
        yield evaluator


@pytest.fixture(scope="module")
def probes(tmp_path_factory, isolated):
    env = probe_environment(tmp_path_factory.mktemp("probe_templates"))
    out = {}
    for mode in PROBE_MODES:
        compiled = compile_source(probe_source(mode, env), isolated.arch, use_cache=False)
        assert compiled.ok, compiled
        out[mode] = compiled
    return out


def _evaluate(evaluator, probes, mode, **kwargs):
    return evaluator.evaluate(EvaluateRequest(probes[mode], PROBE, {"mode": mode}, PROBLEM, **kwargs))


# ------------------------------------------------------------------------------------------------------------
# shipped families


@pytest.mark.parametrize("name", ["copy", "transpose", "gemm"])
def test_default_config_of_each_shipped_family_verifies_and_times(name, isolated):
    from tuner.gpu.evaluate import evaluate_config
    from tuner.space.space import SPACES_DIR, load

    path = SPACES_DIR / f"{name}.yaml"  # shipped: a missing one is a fault of the install, not a reason to skip
    space = load(path)
    result = evaluate_config(space, space.default, evaluator=isolated)
    assert isinstance(result, Measurement), result
    assert result.tbps > 0 and result.median_ms > 0 and result.repetitions >= 10
    assert result.p20_ms <= result.median_ms <= result.p80_ms
    assert result.registers > 0 and result.blocks_per_sm > 0 and result.gpu
    if kernels.get(name).throughput_unit == "TB/s":
        assert 0.05 <= result.fraction_of_ceiling <= 1.2, result
    else:  # GEMM is compute-bound: its minimal bytes over time is far below the copy ceiling
        assert result.tflops > 0


# ------------------------------------------------------------------------------------------------------------
# faults


def test_out_of_bounds_store_is_sticky_and_the_next_evaluation_succeeds(isolated, probes):
    before = isolated.pid
    result = _evaluate(isolated, probes, "oob")
    assert isinstance(result, LaunchFailed), result
    assert result.details["sticky"] is True
    assert result.details["status"] in (700, 716, 719)
    good = _evaluate(isolated, probes, "good")
    assert isinstance(good, Measurement), good
    assert isolated.pid != before  # a fresh child


def test_endless_loop_times_out_at_its_deadline_within_the_limit(tmp_path, probes):
    from tuner.gpu.worker import IsolatedEvaluator

    with IsolatedEvaluator(gpu=0, timeout_s=5.0) as evaluator:
        evaluator.start()  # CUDA start-up is not part of the limit
        started = time.monotonic()
        result = _evaluate(evaluator, probes, "hang")
        elapsed = time.monotonic() - started
        assert isinstance(result, TimedOut), result
        assert result.details["phase"] == "launch" and result.details["deadline_s"] < 5.0  # tuner.gpu.deadline
        assert elapsed < 15.0
        assert isinstance(_evaluate(evaluator, probes, "good"), Measurement)


def test_in_process_hang_guard_times_out_and_poisons(probes):
    from tuner.gpu.worker import IsolatedEvaluator

    with IsolatedEvaluator(gpu=0, timeout_s=60.0, evaluator_kwargs={"hang_timeout_s": 2.0}) as evaluator:
        evaluator.start()
        started = time.monotonic()
        result = _evaluate(evaluator, probes, "hang")
        assert isinstance(result, TimedOut), result
        assert result.details["timeout_s"] == 2.0
        assert time.monotonic() - started < 15.0
        assert not evaluator.alive()  # the poisoned child left by itself


def test_wrong_kernel_is_a_wrong_result_with_its_errors(isolated, probes):
    result = _evaluate(isolated, probes, "wrong")
    assert isinstance(result, WrongResult), result
    assert "max abs error" in result.reason and "max rel error" in result.reason
    assert result.details["mismatches"] > 0 and result.details["max_abs_error"] > 0


def test_block_above_the_launch_bound_fails_before_launching(isolated, probes):
    before = isolated.pid
    result = _evaluate(isolated, probes, "bounds")
    assert isinstance(result, LaunchFailed), result
    assert result.details["sticky"] is False and result.details["max_threads_per_block"] == 128
    assert isinstance(_evaluate(isolated, probes, "good"), Measurement)
    assert isolated.pid == before  # not sticky: the same child goes on


def test_dynamic_shared_memory_above_48_kib_is_opted_in(isolated, probes):
    result = _evaluate(isolated, probes, "smem")
    assert isinstance(result, Measurement), result
    assert result.smem_dynamic_bytes == PROBE_SMEM


# ------------------------------------------------------------------------------------------------------------
# numbers


def test_ceiling_is_a_plausible_hbm_bandwidth(isolated):
    assert 2.0 < isolated.ceiling() < 6.0  # H200: about 4.2 TB/s


def test_the_same_config_timed_twice_agrees_within_five_percent(isolated, probes):
    first = _evaluate(isolated, probes, "good", budget_ms=100.0)
    second = _evaluate(isolated, probes, "good", budget_ms=100.0)
    assert isinstance(first, Measurement) and isinstance(second, Measurement)
    assert abs(first.median_ms - second.median_ms) / min(first.median_ms, second.median_ms) < 0.05
    assert 0.05 <= first.fraction_of_ceiling <= 1.2
