"""The adamw family: space, template (real NVRTC), the tensor table and arena layout, launches, the reference
against a float64 transcription of torch.optim.AdamW's single-tensor code, accounting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tuner import kernels
from tuner.build import compilers, render
from tuner.kernels import adamw, bf16
from tuner.space import space

ROOT = Path(__file__).resolve().parents[2]
SMALL = {"hidden": 36, "intermediate": 100, "kv_dim": 12, "layers": 2, "dtype": "float32"}


@pytest.fixture(scope="module")
def fam():
    return kernels.get("adamw")


@pytest.fixture(scope="module")
def spc():
    return space.load(ROOT / "search_spaces" / "adamw.yaml")


def test_family_contract_and_space(fam, spc):
    assert kernels.get("adamw") is fam and "adamw" in kernels.names()
    assert fam.dtypes == ("float32",) and fam.problem_sizes == ("hidden", "intermediate", "kv_dim", "layers")
    assert set(fam.uri_names) == set(spc.params)
    assert [p.name for p in spc.problems] == ["llama8b_layer", "small_4layers"]
    for problem in spc.problems:
        assert spc.validate(spc.default, problem) is None
        assert 100 <= spc.count_valid(problem) <= 400
    assert spc.resolve(spc.default, spc.problem("small_4layers"))["tensors"] == 36


def test_tensor_sizes_and_accounting(fam, spc):
    problem = {**spc.problem("llama8b_layer").sizes, "dtype": "float32"}
    sizes = adamw.tensor_sizes(problem)
    h, f, kv = 4096, 14336, 1024
    assert sizes == [h, h * h, kv * h, kv * h, h * h, h, f * h, f * h, h * f]
    total = sum(sizes)
    assert total == 218_112_000
    assert fam.bytes_moved(problem) == 26 * total == 5_670_912_000
    assert fam.flops(problem) == 14 * total
    assert len(adamw.tensor_sizes({**problem, "layers": 3})) == 27


def test_layout_aligns_and_separates_tensors():
    offsets, length = adamw.layout(SMALL)
    sizes = adamw.tensor_sizes(SMALL)
    assert len(offsets) == len(sizes) == 18
    for i, (offset, n) in enumerate(zip(offsets, sizes, strict=True)):
        assert offset % adamw.ALIGN == 0
        end = offsets[i + 1] if i + 1 < len(offsets) else length
        assert end - (offset + n) >= adamw.GAP
    mask = adamw.inside(np, SMALL)
    assert mask.sum() == sum(sizes) and mask.size == length


def test_inputs_table_points_into_the_arenas(fam):
    inputs = fam.inputs(np, SMALL, np.random.default_rng(0))
    offsets, length = adamw.layout(SMALL)
    table = inputs["table"]
    assert table.shape == (18, 5) and table.dtype == np.int64
    for name, column, size in (("p", 0, 4), ("g", 1, 2), ("m", 2, 4), ("v", 3, 4)):
        assert inputs[name].shape == (length,)
        assert inputs[name].itemsize == size
        assert list(table[:, column]) == [inputs[name].ctypes.data + o * size for o in offsets]
        assert all(a % 16 == 0 for a in table[:, column])  # 16-byte vector accesses
    assert list(table[:, 4]) == adamw.tensor_sizes(SMALL)
    assert inputs["step"] == np.int32(10) and isinstance(inputs["lr"], np.float32)
    assert (inputs["v"] > 0).all()


def torch_single_tensor_adamw(p, g, m, v, lr, beta1, beta2, eps, weight_decay, step):
    """float64 transcription of torch.optim.adamw._single_tensor_adamw (amsgrad off, maximize off)."""
    p = p * (1 - lr * weight_decay)
    m = m + (g - m) * (1 - beta1)  # exp_avg.lerp_(grad, 1 - beta1)
    v = v * beta2 + (1 - beta2) * g * g  # exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    step_size = lr / bias_correction1
    denom = np.sqrt(v) / np.sqrt(bias_correction2) + eps
    p = p - step_size * m / denom  # param.addcdiv_(exp_avg, denom, value=-step_size)
    return p, m, v


def test_reference_matches_torch_math_in_float64_and_keeps_the_gaps(fam):
    inputs = fam.inputs(np, SMALL, np.random.default_rng(1))
    saved = {k: inputs[k].copy() for k in ("p", "m", "v")}
    ref = fam.reference(np, inputs, SMALL)
    assert all((inputs[k] == saved[k]).all() for k in saved)  # the reference does not touch its inputs
    hyper = {k: float(inputs[k]) if k != "step" else int(inputs[k]) for k in adamw.HYPER}
    args64 = (
        inputs["p"].astype(np.float64),
        bf16.decode(np, inputs["g"]).astype(np.float64),
        inputs["m"].astype(np.float64),
        inputs["v"].astype(np.float64),
    )
    exact = torch_single_tensor_adamw(*args64, **hyper)
    mask = adamw.inside(np, SMALL)
    tol = fam.tolerance(SMALL)

    def err(out, want):
        return np.max(np.abs(out - want) / np.maximum(np.abs(want), 1))

    for name, want in zip(("p", "m", "v"), exact, strict=True):
        assert ref[name].dtype == np.float32
        assert err(ref[name][mask], want[mask]) < tol / 10
        assert (ref[name][~mask] == inputs[name][~mask]).all()
    # every term is visible: an update without weight decay, without bias correction 2, or a p left alone fails
    p_no_decay = torch_single_tensor_adamw(*args64, **{**hyper, "weight_decay": 0.0})[0]
    assert err(p_no_decay[mask], exact[0][mask]) > tol
    p_step1 = torch_single_tensor_adamw(*args64, **{**hyper, "step": 1})[0]
    assert err(p_step1[mask], exact[0][mask]) > tol
    assert err(inputs["p"][mask], exact[0][mask]) > tol
    # a write past a tensor's end (into a gap) is a mismatch
    spoiled = ref["p"].copy()
    spoiled[~mask] += 1.0
    assert err(spoiled, ref["p"]) > tol
    assert fam.checked() == ("p", "m", "v") and fam.outputs(SMALL, {}) == {}


@pytest.mark.parametrize("params", [{}, {"vec": 8, "threads": 128, "unroll": 4}, {"vec": 1, "unroll": 1}])
def test_launch_covers_every_chunk(fam, spc, params):
    config = {**spc.default, **params}
    chunk = config["threads"] * config["vec"] * config["unroll"]
    launches = fam.launches("e", config, SMALL)
    assert len(launches) == 1
    (launch,) = launches
    assert launch.grid == (sum(-(-n // chunk) for n in adamw.tensor_sizes(SMALL)), 1, 1)
    assert launch.block == (config["threads"], 1, 1)
    assert launch.args == ("table", "lr", "beta1", "beta2", "eps", "weight_decay", "step")
    names = set(fam.inputs(np, SMALL, np.random.default_rng(0)))
    assert set(launch.args) <= names


def test_default_and_every_vec_compile_without_spills(fam, spc):
    problem = spc.problem("llama8b_layer")
    configs = [spc.default] + [
        next(c for c in spc.valid_configs(problem) if c["vec"] == vec and c["hint"] == hint)
        for vec in (1, 2, 4, 8)
        for hint in ("plain", "stream")
    ]
    sources = [render.render(fam, c, spc.resolve(c, problem), problem.env) for c in configs]
    assert "constexpr int NT = 9;" in sources[0].text
    for source, result in compilers.compile_many(sources, jobs=1):  # in this process: see tests/README.md
        assert result.ok, (source.uri, result.reason)
        assert set(result.functions) == {source.entry}
        assert 0 < result.registers <= 128 and result.spill_bytes == 0
