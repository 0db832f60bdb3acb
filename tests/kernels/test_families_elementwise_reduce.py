"""The elementwise (bias + GELU + scale, fusion depth) and reduce (row sum / max) families: spaces, launch
geometry, index math (emulated in NumPy), references and accounting; real NVRTC for a few configs, no GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner import kernels
from tuner.build import render
from tuner.build.compile import compile_source
from tuner.core.errors import SpaceError
from tuner.kernels import bf16
from tuner.kernels.elementwise import SCALE, kernel_stages
from tuner.space import space
from tuner.space.problem import Problem


@pytest.fixture(scope="module")
def ew_space() -> space.SearchSpace:
    return space.load("elementwise")


@pytest.fixture(scope="module")
def red_space() -> space.SearchSpace:
    return space.load("reduce")


def _problem(prob: Problem) -> dict:
    return {**prob.sizes, "dtype": prob.dtype}


def _compile(spc: space.SearchSpace, prob: Problem, **overrides):
    family = kernels.get(spc.kernel)
    params = {**spc.default, **overrides}
    assert spc.validate(params, prob) is None, spc.validate(params, prob)
    config = spc.resolve(params, prob)
    source = render.render(family, params, config, prob.env)
    return source, config, compile_source(source)


# -- spaces --------------------------------------------------------------------------------------------------


def test_family_contracts():
    ew, red = kernels.get("elementwise"), kernels.get("reduce")
    assert (ew.name, ew.template, ew.dtypes) == ("elementwise", "elementwise.cu.j2", ("bfloat16", "float32"))
    assert (red.name, red.template, red.dtypes) == ("reduce", "reduce.cu.j2", ("bfloat16", "float32"))
    assert ew.problem_sizes == ("rows", "cols") and red.problem_sizes == ("rows", "cols", "op")
    assert ew.throughput_unit == red.throughput_unit == "TB/s"


def test_spaces_load_with_sane_sizes(ew_space, red_space):
    assert [p.name for p in ew_space.problems] == ["r32768_c8192_bf16", "r32768_c8192_f32"]
    assert ew_space.problem().sizes == {"rows": 32768, "cols": 8192}
    assert ew_space.problem().dtype == "bfloat16"
    assert red_space.problem().sizes == {"rows": 32768, "cols": 8192, "op": 1}
    assert red_space.problem().dtype == "bfloat16"
    assert {p.sizes["op"] for p in red_space.problems} == {1, 2, 3}
    for spc in (ew_space, red_space):
        assert set(kernels.get(spc.kernel).uri_names) == set(spc.params)
        assert spc.validate(spc.default) is None
        for prob in spc.problems:
            # reduce: the persistent grid, look-ahead and no-allocate loads multiply its 2554 configs
            assert 300 <= spc.count_valid(prob) <= (10000 if spc.kernel == "reduce" else 5000)
    # fp32 problems allow at most 16-byte accesses: vec 8 is out, vec 4 is in
    f32 = ew_space.problem("r32768_c8192_f32")
    assert "constraint failed" in ew_space.validate(ew_space.default, f32)
    assert ew_space.validate({**ew_space.default, "vec": 4, "math": "sigmoid"}, f32) is None
    assert "constraint failed" in ew_space.validate({**ew_space.default, "vec": 4, "math": "tanh"}, f32)


def test_default_uris(ew_space, red_space):
    assert render.uri(kernels.get("elementwise"), ew_space.default) == (
        "elementwise_fuse3_vec8_t256_it4_mb4_hintstream_mathtanh"
    )
    assert render.uri(kernels.get("reduce"), red_space.default) == (
        "reduce_vec8_t256_rpb1_it4_mb0_hintstream_persist0_pf0"
    )


@pytest.mark.parametrize("kernel,dtype", [("elementwise", "float16"), ("reduce", "float16"), ("elementwise", "int8")])
def test_bad_dtype_is_rejected_at_load(tmp_path, kernel, dtype):
    text = space.resolve_path(kernel).read_text().replace("dtype: float32", f"dtype: {dtype}")
    path = tmp_path / f"{kernel}.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError, match=f"dtype '{dtype}' is not supported by {kernel}"):
        space.load(path)


def test_reduce_bad_op_is_rejected_at_load(tmp_path):
    text = space.resolve_path("reduce").read_text()
    path = tmp_path / "reduce.yaml"
    path.write_text(text.replace("op: 2,", "op: 4,"))
    with pytest.raises(SpaceError, match="no valid configs"):
        space.load(path)
    path.write_text(text.replace("op: 2, ", ""))
    with pytest.raises(SpaceError, match="lacks sizes"):
        space.load(path)


# -- compilation (real NVRTC) --------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["elementwise", "reduce"])
def test_default_compiles_without_spills(kernel, ew_space, red_space):
    spc = ew_space if kernel == "elementwise" else red_space
    source, config, compiled = _compile(spc, spc.problem())
    assert 'extern "C" __global__' in source.text
    assert compiled.ok, getattr(compiled, "reason", "")
    assert set(compiled.functions) == {source.entry}
    assert 0 < compiled.registers <= 64
    assert compiled.spill_bytes == 0


@pytest.mark.parametrize("fusion", [1, 2, 3])
def test_every_launch_entry_exists(ew_space, fusion):
    prob = ew_space.problem()
    source, config, compiled = _compile(ew_space, prob, fusion=fusion)
    assert compiled.ok, getattr(compiled, "reason", "")
    launches = kernels.get("elementwise").launches(source.entry, config, _problem(prob))
    assert set(compiled.functions) == {launch.entry for launch in launches}
    assert all(f.registers > 0 for f in compiled.functions.values()) and compiled.spill_bytes == 0


@pytest.mark.parametrize(
    "kernel,problem,overrides",
    [
        ("elementwise", "r32768_c8192_bf16", {"vec": 1, "fusion": 1, "hint": "none", "math": "sigmoid"}),
        ("elementwise", "r32768_c8192_f32", {"vec": 4, "math": "sigmoid", "min_blocks": 0}),
        ("elementwise", "r32768_c8192_f32", {"vec": 1, "fusion": 2, "hint": "none", "math": "sigmoid"}),
        ("reduce", "summax_r32768_c8192_bf16", {"vec": 2, "threads": 1024, "rows_per_block": 4, "items": 2}),
        ("reduce", "max_r32768_c8192_bf16", {"vec": 1, "rows_per_block": 8, "items": 8, "hint": "none"}),
        ("reduce", "sum_r32768_c8192_f32", {"vec": 4, "min_blocks": 1}),
    ],
)
def test_other_shapes_compile(ew_space, red_space, kernel, problem, overrides):
    spc = ew_space if kernel == "elementwise" else red_space
    _, _, compiled = _compile(spc, spc.problem(problem), **overrides)
    assert compiled.ok, getattr(compiled, "reason", "")
    assert compiled.registers > 0 and compiled.spill_bytes == 0


def test_template_scale_matches_the_family(ew_space):
    prob = ew_space.problem()
    config = ew_space.resolve(ew_space.default)
    source = render.render(kernels.get("elementwise"), ew_space.default, config, prob.env)
    assert SCALE == 1.5 and "constexpr float SCALE = 1.5f;" in source.text


# -- launch geometry -----------------------------------------------------------------------------------------


def test_elementwise_launches_cover_the_tensor(ew_space):
    family = kernels.get("elementwise")
    for prob in ew_space.problems:
        n = prob.sizes["rows"] * prob.sizes["cols"]
        for params in ew_space.valid_configs(prob):
            config = ew_space.resolve(params, prob)
            launches = family.launches("e", config, _problem(prob))
            assert len(launches) == config["kernels"] == math.ceil(3 / params["fusion"])
            for launch in launches:
                assert launch.block == (params["threads"], 1, 1) and launch.grid[1:] == (1, 1)
                assert launch.grid[0] * params["threads"] * params["items"] * params["vec"] == n
                assert launch.grid[0] == config["blocks"] <= 2**31 - 1
            assert params["vec"] * prob.env["elem_bytes"] <= 16 and prob.sizes["cols"] % params["vec"] == 0


def test_reduce_launches_cover_the_rows(red_space):
    family = kernels.get("reduce")
    for prob in red_space.problems:
        rows, cols = prob.sizes["rows"], prob.sizes["cols"]
        for params in red_space.valid_configs(prob):
            config = red_space.resolve(params, prob)
            (launch,) = family.launches("r", config, _problem(prob))
            tpr = params["threads"] // params["rows_per_block"]
            assert launch.block == (params["threads"], 1, 1)
            units = rows // params["rows_per_block"]
            if params["persist"]:  # a persistent grid: persist blocks per SM, never more than the units
                assert launch.grid == (min(params["persist"] * prob.gpu.sm_count, units), 1, 1)
            else:
                assert launch.grid == (units, 1, 1)
            assert tpr % 32 == 0 and config["iters"] >= 1
            assert config["iters"] * params["items"] * tpr * params["vec"] == cols


@pytest.mark.parametrize(
    "fusion,expected",
    [
        (
            1,
            [
                ("e", ("x", "bias", "t1", "rows", "cols")),
                ("e_gelu", ("t1", "t2", "rows", "cols")),
                ("e_scale", ("t2", "y", "rows", "cols")),
            ],
        ),
        (2, [("e", ("x", "bias", "t1", "rows", "cols")), ("e_scale", ("t1", "y", "rows", "cols"))]),
        (3, [("e", ("x", "bias", "y", "rows", "cols"))]),
    ],
)
def test_fusion_depth_sets_the_launches(ew_space, fusion, expected):
    family = kernels.get("elementwise")
    prob = ew_space.problem()
    config = ew_space.resolve({**ew_space.default, "fusion": fusion})
    launches = family.launches("e", config, _problem(prob))
    assert [(launch.entry, launch.args) for launch in launches] == expected
    assert len(launches) == {1: 3, 2: 2, 3: 1}[fusion] == len(kernel_stages(fusion))
    scratch = {name for name in family.outputs(_problem(prob), config) if name != "y"}
    assert scratch == set(("t1", "t2")[: len(launches) - 1])
    assert family.checked() == ("y",)


def test_reduce_launch_args_follow_op():
    family = kernels.get("reduce")
    config = {"vec": 8, "threads": 256, "rows_per_block": 1, "items": 4}
    for op, outs in ((1, ("sum",)), (2, ("max",)), (3, ("sum", "max"))):
        problem = {"rows": 4, "cols": 8192, "op": op, "dtype": "bfloat16"}
        (launch,) = family.launches("r", config, problem)
        assert launch.args == ("x", *outs, "rows", "cols")
        assert family.outputs(problem, config) == {name: ((4,), "float32") for name in outs}
    with pytest.raises(ValueError, match="op"):
        family.outputs({"rows": 4, "cols": 8192, "op": 0, "dtype": "bfloat16"}, config)


# -- accounting ----------------------------------------------------------------------------------------------


def test_bytes_moved(ew_space, red_space):
    ew = kernels.get("elementwise")
    for prob in ew_space.problems:
        problem = _problem(prob)
        eb = prob.env["elem_bytes"]
        expected = (2 * 32768 * 8192 + 8192) * eb
        # bytes_moved sees only the problem: every fusion depth is billed the fused traffic
        per_depth = {ew.bytes_moved(problem) for _ in (1, 2, 3)}
        assert per_depth == {expected}
        assert ew.flops(problem) == 0
    red = kernels.get("reduce")
    for prob in red_space.problems:
        problem = _problem(prob)
        n_out = {1: 1, 2: 1, 3: 2}[problem["op"]]
        assert red.bytes_moved(problem) == 32768 * 8192 * prob.env["elem_bytes"] + 4 * 32768 * n_out
        assert red.flops(problem) == 0


# -- references ----------------------------------------------------------------------------------------------


def _gelu_scalar(h: float) -> float:
    return 0.5 * h * (1.0 + math.tanh(0.7978845608 * (h + 0.044715 * h**3)))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_elementwise_reference_matches_direct(dtype):
    family = kernels.get("elementwise")
    problem = {"rows": 3, "cols": 5, "dtype": dtype}
    inputs = family.inputs(np, problem, np.random.default_rng(0))
    storage = np.uint16 if dtype == "bfloat16" else np.float32
    assert inputs["x"].shape == (3, 5) and inputs["x"].dtype == storage
    assert inputs["bias"].shape == (5,) and inputs["bias"].dtype == storage
    decode = (lambda a: bf16.decode(np, a)) if dtype == "bfloat16" else (lambda a: a)
    x, bias = decode(inputs["x"]), decode(inputs["bias"])
    ref = family.reference(np, inputs, problem)["y"]
    assert ref.shape == (3, 5) and ref.dtype == np.float64
    for r in range(3):
        for c in range(5):
            direct = 1.5 * _gelu_scalar(float(x[r, c]) + float(bias[c]))
            assert ref[r, c] == pytest.approx(direct, rel=1e-12, abs=1e-12)
    assert family.tolerance(problem) == {"bfloat16": 2e-2, "float32": 1e-4}[dtype]


def test_gelu_forms_agree():
    """The kernel's sigmoid form h / (1 + 2^(h (K0 + K1 h^2))) is the tanh approximation, exactly."""
    h = np.linspace(-12, 12, 2001)
    k0 = -2.0 * 0.7978845608 * math.log2(math.e)
    k1 = k0 * 0.044715
    with np.errstate(over="ignore"):
        sigmoid_form = h / (1.0 + np.exp2(h * (k0 + k1 * h * h)))
    tanh_form = np.array([_gelu_scalar(v) for v in h])
    assert np.allclose(sigmoid_form, tanh_form, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_reduce_reference_matches_direct(dtype):
    family = kernels.get("reduce")
    problem = {"rows": 4, "cols": 6, "op": 3, "dtype": dtype}
    inputs = family.inputs(np, problem, np.random.default_rng(1))
    x = bf16.decode(np, inputs["x"]) if dtype == "bfloat16" else inputs["x"]
    ref = family.reference(np, inputs, problem)
    assert set(ref) == {"sum", "max"}
    for r in range(4):
        assert ref["sum"][r] == pytest.approx(sum(float(v) for v in x[r]), rel=1e-12, abs=1e-12)
        assert ref["max"][r] == max(float(v) for v in x[r])
    assert set(family.reference(np, inputs, {**problem, "op": 1})) == {"sum"}
    assert set(family.reference(np, inputs, {**problem, "op": 2})) == {"max"}
    assert family.tolerance({**problem, "op": 2}) == 0.0
    assert family.tolerance({**problem, "cols": 8192}) == 5e-4
    assert family.tolerance({**problem, "cols": 32768}) == 2e-3


# -- index math, emulated ------------------------------------------------------------------------------------


def _elementwise_elements(config: dict, launch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(element, bias column, first) of every (block, thread, item, lane), as the template computes them."""
    vec, threads, items = config["vec"], config["threads"], config["items"]
    b = np.arange(launch.grid[0])[:, None, None, None]
    t = np.arange(threads)[None, :, None, None]
    j = np.arange(items)[None, None, :, None]
    k = np.arange(vec)[None, None, None, :]
    first = b * (threads * items * vec) + t * vec
    return first + j * threads * vec + k, j, first


@pytest.mark.parametrize(
    "params",
    [
        {"fusion": 3, "vec": 8, "threads": 64, "items": 4},
        {"fusion": 1, "vec": 2, "threads": 128, "items": 8},
        {"fusion": 2, "vec": 4, "threads": 64, "items": 1},
        {"fusion": 3, "vec": 1, "threads": 256, "items": 2},
    ],
)
@pytest.mark.parametrize("cols", [64, 96, 512])
def test_elementwise_index_math_covers_each_element_once(params, cols):
    family = kernels.get("elementwise")
    rows = 64
    problem = {"rows": rows, "cols": cols, "dtype": "bfloat16"}
    per_block = params["threads"] * params["items"] * params["vec"]
    if (rows * cols) % per_block or cols % params["vec"]:
        pytest.skip("the space's constraints rule this shape out")
    config = {**params, "min_blocks": 0, "hint": "stream", "math": "tanh"}
    for launch in family.launches("e", config, problem):
        elem, j, first = _elementwise_elements(config, launch)
        counts = np.bincount(elem.ravel(), minlength=rows * cols)
        assert counts.shape == (rows * cols,) and (counts == 1).all()
        column = (first % cols + j * params["threads"] * params["vec"]) % cols + np.arange(params["vec"])
        assert (column == elem % cols).all()  # the bias vector the template loads is the element's column


@pytest.mark.parametrize(
    "params",
    [
        {"vec": 8, "threads": 256, "rows_per_block": 1, "items": 4},
        {"vec": 1, "threads": 64, "rows_per_block": 2, "items": 8},
        {"vec": 4, "threads": 1024, "rows_per_block": 8, "items": 2},
        {"vec": 2, "threads": 512, "rows_per_block": 4, "items": 1},
    ],
)
def test_reduce_index_math_covers_each_element_once(params):
    family = kernels.get("reduce")
    rows, cols = 32, 8192
    problem = {"rows": rows, "cols": cols, "op": 3, "dtype": "bfloat16"}
    vec, threads, rpb, items = params["vec"], params["threads"], params["rows_per_block"], params["items"]
    tpr = threads // rpb
    iters = cols // (vec * tpr * items)
    (launch,) = family.launches("r", {**params, "min_blocks": 0, "hint": "none"}, problem)
    b = np.arange(launch.grid[0])[:, None, None, None, None]
    t = np.arange(threads)[None, :, None, None, None]
    it = np.arange(iters)[None, None, :, None, None]
    j = np.arange(items)[None, None, None, :, None]
    k = np.arange(vec)[None, None, None, None, :]
    row = b * rpb + t // tpr
    col = (it * tpr * items + j * tpr + t % tpr) * vec + k
    flat = np.broadcast_to(row * cols + col, (launch.grid[0], threads, iters, items, vec))
    assert (np.bincount(flat.ravel(), minlength=rows * cols) == 1).all()
    # thread 0 of each row (t % tpr == 0) writes it: every row exactly once
    writer_threads = np.arange(0, threads, tpr)
    written = np.arange(launch.grid[0])[:, None] * rpb + (writer_threads // tpr)[None, :]
    assert (np.bincount(written.ravel(), minlength=rows) == 1).all()
    # the SMEM slot arithmetic: warp w of row r of the block is warp r * (tpr // 32) + w
    warps = np.arange(threads) // 32
    assert (warps == (np.arange(threads) // tpr) * (tpr // 32) + (np.arange(threads) % tpr) // 32).all()
