"""One config through `tuner.gpu.evaluate.evaluate_config` on the CPU: validate, render, compile (real NVRTC), then
the evaluator (a fake one that records what it is handed)."""

from __future__ import annotations

import pytest

from tuner import kernels
from tuner.build.render import environment
from tuner.core.result import CompileFailed, Invalid
from tuner.gpu.evaluate import evaluate_config
from tuner.gpu.protocol import Evaluator
from tuner.kernels.base import Family, Launch
from tuner.space.space import load

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
