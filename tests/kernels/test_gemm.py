"""The gemm family: its space, template and host-side contract, with real NVRTC (no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest

from tuner import kernels
from tuner.build import compile as tcompile
from tuner.build import render
from tuner.space import space

BIG = {"M": 4096, "N": 4096, "K": 4096, "dtype": "float32"}


@pytest.fixture(autouse=True)
def _cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))


@pytest.fixture(scope="module")
def gemm_space() -> space.SearchSpace:
    return space.load("gemm")


@pytest.fixture(scope="module")
def family():
    return kernels.get("gemm")


def _compile(family, gemm_space, **overrides):
    config = {**gemm_space.default, **overrides}
    assert gemm_space.validate(config) is None
    problem = gemm_space.problem()
    source = render.render(family, config, gemm_space.resolve(config, problem), problem.env)
    return source, tcompile.compile_source(source)


def test_family_contract(family):
    assert family.name == "gemm" and family.template == "gemm.cu.j2"
    assert family.dtypes == ("float32",) and family.problem_sizes == ("M", "N", "K")
    assert family.throughput_unit == "TFLOP/s"
    assert kernels.get("gemm") is family


def test_space_is_large_and_names_every_param(gemm_space, family):
    assert gemm_space.kernel == "gemm"
    assert gemm_space.cartesian == 960_000
    assert gemm_space.count_valid() >= 10_000
    # every knob has a short name; one the shipped space does not list (k_unroll) keeps the kernel as it was
    assert set(family.uri_names) == set(gemm_space.params) | set(family.uri_defaults)
    assert gemm_space.validate(gemm_space.default) is None


def test_default_compiles_without_spills(family, gemm_space):
    source, result = _compile(family, gemm_space)
    assert result.ok, result.reason
    assert set(result.functions) == {source.entry}  # fusion 3: the epilogue lives in the GEMM kernel
    assert 0 < result.registers <= 128
    assert result.spill_bytes == 0
    config = gemm_space.resolve(gemm_space.default)
    assert result.smem_static_bytes == config["smem_tile_bytes"]


def test_tight_launch_bounds_spill(family, gemm_space):
    # 8×8 accumulators per thread, but __launch_bounds__(256, 4) leaves 64 registers: ptxas must spill.
    _, result = _compile(family, gemm_space, min_blocks=4)
    assert result.ok, result.reason
    assert result.registers <= 64
    assert result.spill_bytes > 0


@pytest.mark.parametrize("fusion", [0, 1, 2, 3])
def test_fusion_depth_sets_the_launches(family, gemm_space, fusion):
    config = gemm_space.resolve({**gemm_space.default, "fusion": fusion})
    launches = family.launches("e", config, BIG)
    assert len(launches) == 4 - fusion
    gemm = launches[0]
    assert gemm.entry == "e"
    assert gemm.grid == (4096 // 128, 4096 // 128, 1) and gemm.block == (256, 1, 1)
    extra = {1: ("bias",), 3: ("R",)}
    expected = ("A", "B") + sum((extra.get(d, ()) for d in range(1, fusion + 1)), ()) + ("C", "M", "N", "K")
    assert gemm.args == expected
    stages = ("bias", "gelu", "residual")[fusion:]
    assert [launch.entry for launch in launches[1:]] == [f"e_{s}" for s in stages]
    for launch in launches[1:]:
        assert launch.args[0] == "C" and launch.args[-2:] == ("M", "N")
        assert launch.block == (256, 1, 1) and launch.grid == (4096 * 4096 // 4 // 256, 1, 1)
    names = set(family.inputs(np, {**BIG, "M": 8, "N": 8, "K": 8}, np.random.default_rng(0)))
    names |= set(family.outputs(BIG, config)) | {"M", "N", "K"}
    assert all(arg in names for launch in launches for arg in launch.args)


def test_unfused_source_has_every_stage_kernel(family, gemm_space):
    source, result = _compile(family, gemm_space, fusion=0)
    assert result.ok, result.reason
    config = gemm_space.resolve({**gemm_space.default, "fusion": 0})
    entries = {launch.entry for launch in family.launches(source.entry, config, BIG)}
    assert len(entries) == 4
    assert set(result.functions) == entries
    assert result.spill_bytes == 0


def test_reference_matches_numpy(family):
    problem = {"M": 48, "N": 40, "K": 64, "dtype": "float32"}
    inputs = family.inputs(np, problem, np.random.default_rng(0))
    assert {k: (v.shape, v.dtype) for k, v in inputs.items()} == {
        "A": ((48, 64), np.float32),
        "B": ((64, 40), np.float32),
        "bias": ((40,), np.float32),
        "R": ((48, 40), np.float32),
    }
    a, b, bias, r = (inputs[k].astype(np.float64) for k in ("A", "B", "bias", "R"))
    x = a @ b + bias
    expected = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))) + r
    ref = family.reference(np, inputs, problem)["C"]
    assert ref.shape == (48, 40) and ref.dtype == np.float64
    np.testing.assert_allclose(ref, expected, rtol=1e-9, atol=1e-9)
    # An FP32 computation of the same thing is within tolerance; dropping one K term is not.
    fp32 = np.float32
    x32 = inputs["A"] @ inputs["B"] + inputs["bias"]
    gelu32 = fp32(0.5) * x32 * (1 + np.tanh(fp32(0.7978845608) * (x32 + fp32(0.044715) * x32**3)))
    out32 = gelu32 + inputs["R"]
    tol = family.tolerance(problem)
    assert np.max(np.abs(out32 - ref) / np.maximum(np.abs(ref), 1)) < tol
    dropped = inputs["A"][:, 1:] @ inputs["B"][1:] + inputs["bias"]
    dropped = 0.5 * dropped * (1 + np.tanh(0.7978845608 * (dropped + 0.044715 * dropped**3))) + inputs["R"]
    assert np.max(np.abs(dropped - ref) / np.maximum(np.abs(ref), 1)) > tol
    assert family.outputs(problem, {}) == {"C": ((48, 40), "float32")}


def test_accounting_4096(family):
    n = 4096
    assert family.flops(BIG) == 2 * n**3 == 137_438_953_472
    # A, B, bias and R read once, C written once, 4 bytes each.
    assert family.bytes_moved(BIG) == 4 * (4 * n * n + n) == 268_451_840
    assert 1e-4 <= family.tolerance(BIG) <= 1e-3


def test_tiles_past_48_kib_go_dynamic(family):
    """A space that allows SMEM tiles past the static 48 KiB (benchmarks/spaces/gemm_dynamic_smem.yaml) gets them
    as dynamic SMEM: no static SMEM in the cubin, the tiles' bytes asked for at launch; smaller tiles stay static."""
    from pathlib import Path

    big_space = space.load(Path(__file__).resolve().parents[2] / "benchmarks" / "spaces" / "gemm_dynamic_smem.yaml")
    problem = big_space.problem()
    for tile_k, stages, dynamic in ((16, 2, 50176), (16, 1, 0)):
        config = {**big_space.default, "tile_m": 128, "tile_n": 256, "tile_k": tile_k, "thread_m": 16}
        config.update(thread_n=8, min_blocks=1, stages=stages)
        assert big_space.validate(config) is None
        resolved = big_space.resolve(config, problem)
        source = render.render(family, config, resolved, problem.env)
        result = tcompile.compile_source(source)
        assert result.ok and result.spill_bytes == 0, result.reason
        assert result.smem_static_bytes == (0 if dynamic else resolved["smem_tile_bytes"])
        assert family.launches(source.entry, resolved, problem.env)[0].smem_dynamic == dynamic
        assert resolved["smem_tile_bytes"] == (dynamic or 25088)
