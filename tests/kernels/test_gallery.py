"""The gallery under examples/: user kernels written only as YAML + template + reference. On the CPU each example's
space loads, a spread of its configs renders and compiles with real NVRTC (sm_90) on every dtype it takes, and its
reference, run on the small problem, agrees with an independent NumPy computation (add_rmsnorm's reference is torch:
that part is skipped where torch is not installed). On a GPU (``@pytest.mark.gpu``) a handful of configs of its
realistic problem verify and time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tuner.build.compile import compile_source
from tuner.build.render import render
from tuner.kernels.custom import check_reference
from tuner.space import space as space_mod

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def spread(space, problem, count: int) -> list[dict]:
    """`count` valid configs of `problem`, spread evenly over the space's enumeration (first and last included)."""
    configs = space.valid_configs(problem)
    assert len(configs) >= count
    step = (len(configs) - 1) / max(count - 1, 1)
    return [configs[round(i * step)] for i in range(count)]


def compiles(space_file: Path, problem_name: str, count: int = 3) -> None:
    space = space_mod.load(space_file)
    problem = space.problem(problem_name)
    for config in spread(space, problem, count):
        source = render(space.family, config, space.resolve(config, problem), problem.env)
        compiled = compile_source(source, "sm_90")
        assert compiled.ok, compiled
        assert source.entry in compiled.functions and compiled.registers > 0


def small(space_file: Path, seed: int = 7):
    """The space, its small problem's env, inputs drawn by NumPy and the reference's answer for them."""
    space = space_mod.load(space_file)
    env = space.problem("small").env
    inputs = space.family.inputs(np, env, np.random.default_rng(seed))
    before = {name: value.copy() for name, value in inputs.items() if isinstance(value, np.ndarray)}
    expected = space.family.reference(np, inputs, env)
    for name, value in before.items():  # the reference worked on copies: the kernel's inputs are as drawn
        np.testing.assert_array_equal(inputs[name], value)
    check_reference(space, space.problem("small"))
    return space, env, inputs, expected


def _have_gpu() -> bool:
    from tests.gpu.test_evaluator_gpu import HAVE_GPU

    return HAVE_GPU


def tune_some(space_file: Path, count: int = 5) -> list:
    """Verify and time `count` configs of the space's first (realistic) problem in one GPU worker."""
    from tuner.core.result import Measurement
    from tuner.gpu.evaluate import evaluate_config
    from tuner.gpu.worker import IsolatedEvaluator

    space = space_mod.load(space_file)
    problem = space.problem()
    with IsolatedEvaluator(gpu=0, timeout_s=120) as evaluator:
        results = [evaluate_config(space, c, problem, evaluator=evaluator) for c in spread(space, problem, count)]
    for result in results:
        assert isinstance(result, Measurement) and result.ok, result
        assert result.bytes_moved == space.family.bytes_moved(problem.env) and result.tbps > 0
    return results


# ---------------------------------------------------------------------------------------------------------------
# embedding_gather: out[r, :] = table[ids[r], :], int32 ids in [0, vocab), an fp16 or fp32 table

GATHER = EXAMPLES / "embedding_gather" / "embedding_gather.yaml"


@pytest.mark.parametrize("problem", ["llama3_64k", "llama3_32k_fp32"])
def test_embedding_gather_compiles(problem):
    compiles(GATHER, problem)


def test_embedding_gather_reference_is_a_row_gather():
    space, env, inputs, expected = small(GATHER)
    ids, table = inputs["ids"], inputs["table"]
    assert ids.dtype == np.int32 and ids.shape == (300,) and 0 <= ids.min() and ids.max() < 1000
    assert len(np.unique(ids)) > 100  # drawn over the vocabulary, not one row
    rows = np.stack([table[int(i)] for i in ids])
    np.testing.assert_array_equal(np.asarray(expected["out"]), rows)
    assert space.family.checked() == ("out",)
    assert space.family.bytes_moved(env) == 2 * 300 * 256 * 4 + 4 * 300
    big = space.problem().env  # the example's problem: about a gigabyte moved
    assert 0.9e9 < space.family.bytes_moved(big) < 1.2e9 and big["dtype"] == "float16"


# ---------------------------------------------------------------------------------------------------------------
# adamw_inplace: param, exp_avg and exp_avg_sq updated in place (role: inout) from a bf16 or fp32 gradient

ADAMW = EXAMPLES / "adamw_inplace" / "adamw_inplace.yaml"


@pytest.mark.parametrize("problem", ["llama3_mlp_bf16_grad", "small"])
def test_adamw_inplace_compiles(problem):
    compiles(ADAMW, problem)


def test_adamw_inplace_reference_is_torchs_step():
    space, env, inputs, expected = small(ADAMW)
    assert space.family.checked() == ("param", "exp_avg", "exp_avg_sq")
    assert {inputs[name].dtype for name in ("param", "exp_avg", "exp_avg_sq", "grad")} == {np.dtype(np.float32)}
    assert inputs["exp_avg_sq"].min() >= 1e-4 and inputs["exp_avg_sq"].max() < 1e-3
    # torch.optim.AdamW's single-tensor step, written out in float64 in its own order
    lr, beta1, beta2, eps, wd, step = 1e-3, 0.9, 0.999, 1e-8, 0.1, 3
    p, m, v, g = (inputs[name].astype(np.float64) for name in ("param", "exp_avg", "exp_avg_sq", "grad"))
    p = p * (1 - lr * wd)
    m = m + (g - m) * (1 - beta1)  # exp_avg.lerp_(grad, 1 - beta1)
    v = v * beta2 + g * g * (1 - beta2)
    step_size = lr / (1 - beta1**step)
    denom = np.sqrt(v) / np.sqrt(1 - beta2**step) + eps
    p = p - step_size * (m / denom)
    for name, want in (("param", p), ("exp_avg", m), ("exp_avg_sq", v)):
        got = np.asarray(expected[name])  # an xp reference computes in float32: the check's metric, far below 1e-5
        assert got.shape == want.shape and (np.abs(got - want) / np.maximum(np.abs(want), 1)).max() < 1e-6, name
    assert np.abs(p - inputs["param"]).max() > 1e-4  # the step moves the weights by more than the tolerance
    assert space.family.tolerance(env) == 1e-5
    assert space.family.bytes_moved(env) == (3 * 2 * 4 + 4) * 5003
    big = space.problem().env  # fp32 weights and moments read and written, bf16 gradients read
    assert space.family.bytes_moved(big) == 26 * 58720256


# ---------------------------------------------------------------------------------------------------------------
# paged_kv_write: key and value rows scattered into in-place paged caches at int32 slots (a permutation's)

PAGED = EXAMPLES / "paged_kv_write" / "paged_kv_write.yaml"


@pytest.mark.parametrize("problem", ["llama3_prefill_128k", "llama3_fp16_32k"])
def test_paged_kv_write_compiles(problem):
    compiles(PAGED, problem)


def test_paged_kv_write_reference_fills_each_tokens_slot_and_leaves_the_rest():
    space, env, inputs, expected = small(PAGED)
    slots = inputs["slot_mapping"]
    assert slots.dtype == np.int32 and slots.shape == (50,)
    assert len(set(slots.tolist())) == 50 and 0 <= slots.min() and slots.max() < 8 * 16  # distinct slots
    assert space.family.checked() == ("key_cache", "value_cache")
    for rows, cache in (("key", "key_cache"), ("value", "value_cache")):
        want = inputs[cache].astype(np.float32).copy()  # [blocks, block_size, heads, head_dim]
        for token, slot in enumerate(slots.tolist()):
            want[slot // 16, slot % 16] = inputs[rows][token]
        got = np.asarray(expected[cache])
        assert got.shape == (8, 16, 2, 64)
        np.testing.assert_array_equal(got, want)
        untouched = np.ones(8 * 16, bool)
        untouched[slots] = False
        np.testing.assert_array_equal(got.reshape(128, 2, 64)[untouched], inputs[cache].reshape(128, 2, 64)[untouched])
    assert space.family.bytes_moved(env) == 4 * 50 * 2 * 64 * 2 + 4 * 50
    assert 0.9e9 < space.family.bytes_moved(space.problem().env) < 1.2e9


# ---------------------------------------------------------------------------------------------------------------
# masked_softmax: a row softmax over the positions a bool mask keeps

SOFTMAX = EXAMPLES / "masked_softmax" / "masked_softmax.yaml"


@pytest.mark.parametrize("problem", ["scores_48k_by_4k", "scores_16k_by_8k_bf16", "small"])
def test_masked_softmax_compiles(problem):
    compiles(SOFTMAX, problem, count=2)


def test_masked_softmax_reference_is_a_softmax_of_the_kept_positions():
    space, env, inputs, expected = small(SOFTMAX)
    x, mask = inputs["x"].astype(np.float64), inputs["mask"]
    assert mask.dtype == np.bool_ and 0.3 < mask.mean() < 0.7
    mask[3] = False  # a row with nothing kept: all zeros, not NaN
    expected = space.family.reference(np, inputs, env)
    got = np.asarray(expected["out"])
    assert got.shape == (40, 512)
    for r in range(40):
        want = np.zeros(512)
        kept = np.flatnonzero(mask[r])
        if kept.size:
            e = np.exp(x[r, kept] - x[r, kept].max())
            want[kept] = e / e.sum()
        np.testing.assert_allclose(got[r], want, rtol=1e-5, atol=1e-7, err_msg=f"row {r}")
    assert (got[3] == 0).all() and np.allclose(np.delete(got, 3, axis=0).sum(axis=1), 1)
    assert space.family.bytes_moved(env) == 40 * 512 * (4 + 1 + 4)  # x and mask read once, out written once
    assert 0.9e9 < space.family.bytes_moved(space.problem().env) < 1.2e9


# ---------------------------------------------------------------------------------------------------------------
# add_rmsnorm: h = x + residual (fp16), out = h / rms(h) * weight; two outputs, a torch reference on the GPU

RMSNORM = EXAMPLES / "add_rmsnorm" / "add_rmsnorm.yaml"


@pytest.mark.parametrize("problem", ["llama3_16k", "small"])
def test_add_rmsnorm_compiles(problem):
    compiles(RMSNORM, problem)


def test_add_rmsnorm_space_loads_without_running_its_torch_reference():
    space = space_mod.load(RMSNORM)  # ref.py imports torch: read, not imported
    family = space.family
    assert family.reference_arrays == "torch" and family.checked() == ("out", "residual_out")
    env = space.problem("small").env
    assert family.bytes_moved(env) == 4 * 37 * 2048 * 2 + 2048 * 2  # x, residual, out, residual_out; the weight
    big = space.problem().env
    assert 0.5e9 < family.bytes_moved(big) < 0.6e9 and big["dtype"] == "float16"
    assert space.count_valid(space.problem()) == 41


def test_add_rmsnorm_reference_is_the_fused_add_and_norm():
    pytest.importorskip("torch", reason="ref.py computes with torch; without it only the compiles are checked")
    space, env, inputs, expected = small(RMSNORM)
    x, residual, weight = (inputs[name] for name in ("x", "residual", "weight"))
    assert x.dtype == np.float16 and x.shape == (37, 2048) and weight.shape == (2048,)
    assert 0.8 < weight.astype(np.float64).mean() < 1.2  # drawn around 1, as a norm's weight is
    # the kernel's math in NumPy: the sum rounded to fp16 once, the norm in fp32 on it, one rounding at the end
    h = (x.astype(np.float32) + residual.astype(np.float32)).astype(np.float16)
    hf = h.astype(np.float32)
    scale = 1 / np.sqrt((hf * hf).mean(axis=1, keepdims=True) + np.float32(1e-6))
    out = (hf * scale * weight.astype(np.float32)).astype(np.float16).astype(np.float64)
    np.testing.assert_array_equal(np.asarray(expected["residual_out"]), h.astype(np.float32))
    got = np.asarray(expected["out"], dtype=np.float64)
    assert got.shape == (37, 2048)
    assert (np.abs(got - out) / np.maximum(np.abs(out), 1)).max() <= space.family.tolerance(env)


@pytest.mark.gpu
@pytest.mark.parametrize("space", [GATHER, ADAMW, PAGED, SOFTMAX, RMSNORM], ids=lambda path: path.stem)
def test_each_example_tunes_on_the_gpu(space):
    if not _have_gpu():
        pytest.skip("needs a CUDA GPU")
    if space == RMSNORM:
        pytest.importorskip("torch", reason="add_rmsnorm's reference computes with torch")
    tune_some(space)
