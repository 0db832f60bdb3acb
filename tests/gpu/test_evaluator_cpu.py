"""The GPU evaluator's (`tuner.gpu.evaluator`) pure-Python parts on a machine without a GPU: kernel-argument
packing, a poisoned evaluator's refusal, and the probe kernels of `tests/gpu/test_evaluator_gpu.py` compiled with
real NVRTC (so a typo there shows here). The status codes, timing arithmetic, output check, one-config pipeline
and worker have files of their own beside this one (test_status, test_timing, test_checks, test_evaluate,
test_worker)."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.build.compile import compile_source
from tuner.gpu import evaluator as gpu_evaluator
from tuner.gpu import status as cuda_status
from tuner.gpu.protocol import EvaluateRequest


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


def test_every_gpu_probe_kernel_compiles(tmp_path):
    from tests.gpu import test_evaluator_gpu as gpu

    env = gpu.probe_environment(tmp_path)
    for mode in gpu.PROBE_MODES:
        compiled = compile_source(gpu.probe_source(mode, env), "sm_90")
        assert compiled.ok, (mode, getattr(compiled, "reason", ""))
        assert compiled.entry in compiled.functions
    bounded = compile_source(gpu.probe_source("bounds", env), "sm_90")
    assert "__launch_bounds__(128)" in gpu.probe_source("bounds", env).text and bounded.registers > 0
