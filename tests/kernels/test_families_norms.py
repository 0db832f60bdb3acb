"""The row-wise bf16 families, softmax, rmsnorm and layernorm: spaces, launch geometry, index coverage,
references, accounting.

Real NVRTC for the default configs (no GPU needed); NumPy for references on tiny problems and for an
emulation of the kernels' thread -> element mapping.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner import kernels
from tuner.build import render
from tuner.build.compile import compile_source
from tuner.core.errors import SpaceError
from tuner.kernels import bf16
from tuner.space import space
from tuner.space.problem import Problem

NAMES = ["softmax", "rmsnorm", "layernorm"]


def _load(name: str) -> tuple[space.SearchSpace, kernels.Family]:
    return space.load(name), kernels.get(name)


def _problem(prob: Problem) -> dict:
    return {**prob.sizes, "dtype": prob.dtype}


def _decode64(bits) -> np.ndarray:
    return bf16.decode(np, bits).astype(np.float64)


# ------------------------------------------------------------------------------------------------------------
# spaces and compilation


@pytest.mark.parametrize("name", NAMES)
def test_shipped_problems_and_space_size(name):
    spc, family = _load(name)
    first = spc.problems[0]
    assert (first.name, first.sizes, first.dtype) == ("r32768_c8192_bf16", {"rows": 32768, "cols": 8192}, "bfloat16")
    assert family.dtypes == ("bfloat16",)
    for prob in spc.problems:
        assert 300 <= spc.count_valid(prob) <= 5000
    if name != "softmax":
        assert [p.sizes.get("residual", 0) for p in spc.problems] == [0, 1]
    assert spc.validate(spc.default) is None


@pytest.mark.parametrize("name", NAMES)
def test_defaults_compile_without_spills(name):
    spc, family = _load(name)
    for prob in spc.problems:
        config = spc.resolve(spc.default, prob)
        source = render.render(family, spc.default, config, prob.env)
        assert 'extern "C" __global__' in source.text and f"{source.entry}(" in source.text
        compiled = compile_source(source)
        assert compiled.ok, getattr(compiled, "reason", "")
        assert compiled.registers > 0
        assert compiled.spill_bytes == 0, (prob.name, compiled.functions)
        # 32 registers or fewer: 2048 threads per SM
        assert compiled.registers <= 32


@pytest.mark.parametrize("vec", [1, 2, 4, 8])
def test_rmsnorm_l2_rows_read_twice_with_eviction_priorities(vec, monkeypatch, tmp_path):
    """cache l2: two reads of each chunk (evict_last, then evict_first), never merged into one, at every width,
    the weight's evict_last. Real NVRTC: PTX for the access count, a cubin for spills."""
    from tuner.results.artifacts import compile_ptx

    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    spc, family = _load("rmsnorm")
    params = {**spc.default, "vec": vec, "cache": "l2", "hint": "evict", "min_blocks": 0}
    assert spc.validate(params) is None
    for prob in spc.problems:
        source = render.render(family, params, spc.resolve(params, prob), prob.env)
        ptx = compile_ptx(source).decode()
        chunks = 8192 // (512 * vec)
        streams = 2 if prob.sizes.get("residual") else 1  # x, and r with a residual
        assert ptx.count("ld.global.L1::evict_last.L2::cache_hint") == chunks * (streams + 1)  # + the weight
        assert ptx.count("ld.global.L1::evict_first.L2::cache_hint") == chunks * streams
        assert "st.global.L1::no_allocate.L2::cache_hint" not in ptx and ptx.count("st.global") == chunks * streams
        compiled = compile_source(source)
        assert compiled.ok and compiled.spill_bytes == 0, getattr(compiled, "reason", compiled.functions)


def test_default_uris():
    assert (
        render.uri(kernels.get("softmax"), space.load("softmax").default)
        == "softmax_online_vec8_t512_rpb1_reg_bf16_plain_mb4"
    )
    assert (
        render.uri(kernels.get("rmsnorm"), space.load("rmsnorm").default)
        == "rmsnorm_vec8_t512_rpb1_reg_bf16_plain_we0_mb4_persist0_pf0"
    )
    assert (
        render.uri(kernels.get("layernorm"), space.load("layernorm").default)
        == "layernorm_welford_vec8_t1024_rpb1_reg_bf16_plain_we0_mb2"
    )


def test_residual_changes_the_kernel_signature():
    spc, family = _load("rmsnorm")
    plain, fused = spc.problems
    text0 = render.render(family, spc.default, spc.resolve(spc.default, plain), plain.env).text
    text1 = render.render(family, spc.default, spc.resolve(spc.default, fused), fused.env).text
    assert "bf16_t* __restrict__ h," not in text0 and "bf16_t* __restrict__ h," in text1
    spc, family = _load("layernorm")
    plain, fused = spc.problems
    text1 = render.render(family, spc.default, spc.resolve(spc.default, fused), fused.env).text
    assert "const bf16_t* __restrict__ bias, bf16_t* __restrict__ y, bf16_t* __restrict__ h," in text1


@pytest.mark.parametrize("name", NAMES)
def test_bad_dtype_is_rejected_at_load(name, tmp_path):
    text = space.resolve_path(name).read_text().replace("dtype: bfloat16", "dtype: float32", 1)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError, match="float32"):
        space.load(path)


def test_a_shape_the_indexing_cannot_tile_is_invalid_not_wrong():
    spc, family = _load("rmsnorm")
    # 8200 = 8 * 1025: no whole number of warps times vec divides it, so no config at all
    assert not spc.valid_configs(Problem("odd", "bfloat16", {"rows": 6, "cols": 8200}))
    # 8448 = 256 * 33: some configs tile it (e.g. 256 threads per row, vec 1), the default does not
    odd = Problem("odd", "bfloat16", {"rows": 6, "cols": 8448})
    valid = spc.valid_configs(odd)
    assert valid
    for params in valid:
        config = spc.resolve(params, odd)
        assert odd.sizes["cols"] % (config["threads_per_row"] * params["vec"]) == 0
        family.launches("k", config, _problem(odd))
    bad = {**spc.default}  # 512 threads x 8: 4096 does not divide 8448
    assert spc.validate(bad, odd) == "constraint failed: cols % (threads_per_row * vec) == 0"
    with pytest.raises(ValueError, match="not tiled"):
        family.launches("k", spc.resolve(bad, odd), _problem(odd))


# ------------------------------------------------------------------------------------------------------------
# geometry


@pytest.mark.parametrize("name", NAMES)
def test_launches_cover_every_problem_exactly(name):
    spc, family = _load(name)
    for prob in spc.problems:
        rows, cols = prob.sizes["rows"], prob.sizes["cols"]
        res = bool(prob.sizes.get("residual", 0))
        for params in spc.valid_configs(prob):
            config = spc.resolve(params, prob)
            (launch,) = family.launches("k", config, _problem(prob))
            rpb, threads, vec = params["rows_per_block"], params["threads"], params["vec"]
            assert launch.block == (threads, 1, 1) and launch.grid[1:] == (1, 1)
            if params.get("persist", 0):  # a persistent grid: persist blocks per SM, never more than the units
                assert launch.grid[0] == min(params["persist"] * prob.gpu.sm_count, rows // rpb)
            else:
                assert launch.grid[0] * rpb == rows
            tpr = config["threads_per_row"]
            assert tpr % 32 == 0 and tpr * rpb == threads
            assert (cols // (tpr * vec)) * tpr * vec == cols
            expected_smem = rpb * cols * 2 * (2 if res else 1) if params["cache"] == "smem" else 0
            assert launch.smem_dynamic == expected_smem <= 64 * 1024
            if name == "softmax":
                assert launch.args == ("x", "y", "rows", "cols")
            else:
                vectors = ("weight",) if name == "rmsnorm" else ("weight", "bias")
                expected = ("x", "r", *vectors, "y", "h") if res else ("x", *vectors, "y")
                assert launch.args == (*expected, "rows", "cols")


def _element_map(rows, cols, threads, rpb, vec):
    """For every (block, thread, j, k) of the kernels' indexing, the flat element it reads and writes:
    row = block * rpb + tid // tpr, column = ((j * tpr + tid % tpr) * vec + k)."""
    tpr = threads // rpb
    chunks = cols // (tpr * vec)
    block, tid, j, k = np.meshgrid(
        np.arange(rows // rpb), np.arange(threads), np.arange(chunks), np.arange(vec), indexing="ij"
    )
    row = block * rpb + tid // tpr
    col = (j * tpr + tid % tpr) * vec + k
    assert (col < cols).all() and (row < rows).all()
    return row * cols + col


@pytest.mark.parametrize(
    "sizes", [{"rows": 8, "cols": 8192}, {"rows": 16, "cols": 2048}, {"rows": 4, "cols": 256}, {"rows": 6, "cols": 96}]
)
def test_every_element_is_touched_exactly_once(sizes):
    """NumPy emulation of the index math, for every valid config of a tiny problem (the evaluator poisons
    outputs with NaN, so a gap would be a NaN; an overlap a read or write of the wrong element)."""
    spc = space.load("softmax")  # the three families share the geometry knobs and constraints
    prob = Problem("tiny", "bfloat16", sizes)
    seen = set()
    for params in spc.valid_configs(prob):
        key = (params["threads"], params["rows_per_block"], params["vec"])
        if key in seen:
            continue
        seen.add(key)
        flat = _element_map(sizes["rows"], sizes["cols"], *key).ravel()
        counts = np.bincount(flat, minlength=sizes["rows"] * sizes["cols"])
        assert (counts == 1).all(), key
        # vec-element chunks are aligned to vec: 2 * vec-byte accesses are aligned
        assert (flat.reshape(-1, key[2])[:, 0] % key[2] == 0).all()
    assert seen


# ------------------------------------------------------------------------------------------------------------
# references


def test_softmax_reference_matches_direct_formula_and_rows_sum_to_one():
    family = kernels.get("softmax")
    problem = {"rows": 5, "cols": 64, "dtype": "bfloat16"}
    inputs = family.inputs(np, problem, np.random.default_rng(0))
    assert inputs["x"].dtype == np.uint16 and inputs["x"].shape == (5, 64)
    ref = family.reference(np, inputs, problem)["y"]
    x = _decode64(inputs["x"])
    for r in range(5):
        denominator = sum(math.exp(v - max(x[r])) for v in x[r])
        for c in range(64):
            assert ref[r, c] == pytest.approx(math.exp(x[r, c] - max(x[r])) / denominator, rel=1e-12)
    assert np.allclose(ref.sum(axis=1), 1.0, rtol=1e-12, atol=0)
    assert family.outputs(problem, {}) == {"y": ((5, 64), "bfloat16")}
    # the offsets reach beyond fp32 exp's range: a kernel without the max subtraction would overflow
    big = family.inputs(np, {"rows": 512, "cols": 64, "dtype": "bfloat16"}, np.random.default_rng(1))
    assert _decode64(big["x"]).max() > 89


def test_softmax_reference_is_shift_invariant_and_finite_for_large_inputs():
    family = kernels.get("softmax")
    problem = {"rows": 2, "cols": 8, "dtype": "bfloat16"}
    row = np.array([100.0, 101, 102, 103, 90, 80, 70, 60], np.float32)  # all exact in bf16, as is row - 200
    x = bf16.encode(np, np.stack([row, row - 200]))
    ref = family.reference(np, {"x": x}, problem)["y"]
    assert np.isfinite(ref).all() and np.allclose(ref.sum(axis=1), 1.0)
    assert np.allclose(ref[0], ref[1], rtol=1e-12)
    assert ref[0, 3] == pytest.approx(
        1
        / (
            1
            + math.exp(-1)
            + math.exp(-2)
            + math.exp(-3)
            + math.exp(-13)
            + math.exp(-23)
            + math.exp(-33)
            + math.exp(-43)
        )
    )


@pytest.mark.parametrize("residual", [0, 1])
def test_rmsnorm_reference_matches_direct_formula(residual):
    family = kernels.get("rmsnorm")
    problem = {"rows": 4, "cols": 32, "dtype": "bfloat16", **({"residual": 1} if residual else {})}
    inputs = family.inputs(np, problem, np.random.default_rng(2))
    assert set(inputs) == ({"x", "r", "weight"} if residual else {"x", "weight"})
    assert inputs["weight"].shape == (32,)
    ref = family.reference(np, inputs, problem)
    x, w = _decode64(inputs["x"]), _decode64(inputs["weight"])
    if residual:
        exact = x + _decode64(inputs["r"])
        assert np.array_equal(ref["h"], exact)
        h = _decode64(bf16.encode(np, exact.astype(np.float32)))  # the kernel normalizes the rounded h
    else:
        h = x
    for r in range(4):
        rms = math.sqrt(sum(v * v for v in h[r]) / 32 + 1e-6)
        for c in range(32):
            assert ref["y"][r, c] == pytest.approx(h[r, c] / rms * w[c], rel=1e-12, abs=1e-300)
    expected = {"y": ((4, 32), "bfloat16")}
    if residual:
        expected["h"] = ((4, 32), "bfloat16")
    assert family.outputs(problem, {}) == expected


@pytest.mark.parametrize("residual", [0, 1])
def test_layernorm_reference_matches_direct_formula(residual):
    family = kernels.get("layernorm")
    problem = {"rows": 4, "cols": 32, "dtype": "bfloat16", **({"residual": 1} if residual else {})}
    inputs = family.inputs(np, problem, np.random.default_rng(3))
    assert set(inputs) == ({"x", "r", "weight", "bias"} if residual else {"x", "weight", "bias"})
    ref = family.reference(np, inputs, problem)
    x, w, b = _decode64(inputs["x"]), _decode64(inputs["weight"]), _decode64(inputs["bias"])
    if residual:
        h = _decode64(bf16.encode(np, (x + _decode64(inputs["r"])).astype(np.float32)))
    else:
        h = x
    for r in range(4):
        mean = sum(h[r]) / 32
        var = sum((v - mean) ** 2 for v in h[r]) / 32
        for c in range(32):
            expected = (h[r, c] - mean) / math.sqrt(var + 1e-5) * w[c] + b[c]
            assert ref["y"][r, c] == pytest.approx(expected, rel=1e-9, abs=1e-9)
    # per-row mean 0 and variance var / (var + eps) before the affine part
    d = (ref["y"] - b) / w
    assert np.allclose(d.mean(axis=1), 0, atol=1e-9)


def test_norm_inputs_exercise_eps_and_cancellation():
    """Rows whose mean square is far below eps (a misplaced eps shows), and layernorm rows offset by
    hundreds of standard deviations (E[h^2] - E[h]^2 cancels in fp32 there)."""
    problem = {"rows": 512, "cols": 8192, "dtype": "bfloat16"}
    rms = kernels.get("rmsnorm").inputs(np, problem, np.random.default_rng(4))
    ms = (_decode64(rms["x"]) ** 2).mean(axis=1)
    assert ms.min() < 1e-7 and ms.max() > 1.0
    ln = kernels.get("layernorm").inputs(np, problem, np.random.default_rng(5))
    x = _decode64(ln["x"])
    ratio = np.abs(x.mean(axis=1)) / np.maximum(x.std(axis=1), 1e-30)
    assert ratio.max() > 200 and ratio.min() < 2


@pytest.mark.parametrize("name", NAMES)
def test_a_skipped_sum_term_fails_the_check(name):
    """A kernel that leaves one warp's 32 x 16 elements (of 8192) out of the row reduction must fail the
    evaluator's check; here emulated on the reference side."""
    from tuner.gpu.checks import check_output

    family = kernels.get(name)
    problem = {"rows": 256, "cols": 8192, "dtype": "bfloat16"}
    inputs = family.inputs(np, problem, np.random.default_rng(6))
    ref = family.reference(np, inputs, problem)["y"]
    drop = np.concatenate([np.arange(32 * 8) + j * 4096 for j in range(2)])  # warp 0 of 512 threads, vec 8
    keep = np.ones(8192, bool)
    keep[drop] = False
    x = _decode64(inputs["x"])
    if name == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        bad = e / e[:, keep].sum(axis=1, keepdims=True)
    elif name == "rmsnorm":
        bad = x / np.sqrt((x[:, keep] ** 2).sum(axis=1, keepdims=True) / 8192 + 1e-6) * _decode64(inputs["weight"])
    else:
        d = x - x.mean(axis=1, keepdims=True)
        bad = d / np.sqrt((d[:, keep] ** 2).sum(axis=1, keepdims=True) / 8192 + 1e-5) * _decode64(
            inputs["weight"]
        ) + _decode64(inputs["bias"])
    rounded = bf16.decode(np, bf16.encode(np, ref.astype(np.float32)))
    assert check_output(np, "y", rounded, ref, family.tolerance(problem)).ok  # bf16 rounding alone passes
    bad = bf16.decode(np, bf16.encode(np, bad.astype(np.float32)))
    assert not check_output(np, "y", bad, ref, family.tolerance(problem)).ok


# ------------------------------------------------------------------------------------------------------------
# accounting


def test_bytes_moved_flops_and_tolerance():
    n = 32768 * 8192
    plain = {"rows": 32768, "cols": 8192, "dtype": "bfloat16"}
    fused = {**plain, "residual": 1}
    softmax, rmsnorm, layernorm = (kernels.get(n_) for n_ in NAMES)
    assert softmax.bytes_moved(plain) == 2 * n * 2 == 2**30
    assert rmsnorm.bytes_moved(plain) == (2 * n + 8192) * 2
    assert rmsnorm.bytes_moved(fused) == (4 * n + 8192) * 2
    assert layernorm.bytes_moved(plain) == (2 * n + 2 * 8192) * 2
    assert layernorm.bytes_moved(fused) == (4 * n + 2 * 8192) * 2
    for family in (softmax, rmsnorm, layernorm):
        assert family.throughput_unit == "TB/s"
        assert family.tolerance(plain) == 1e-2
        assert family.flops(plain) > 0
    assert rmsnorm.flops(fused) > rmsnorm.flops(plain)
    # the shipped problems' first entries are the ones the targets refer to
    for name in NAMES:
        assert _problem(space.load(name).problem()) == plain
