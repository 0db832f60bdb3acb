"""The memory-bound families, transpose and copy: their spaces, launch geometry, references and accounting.

Real NVRTC for the default configs (no GPU needed); NumPy for references on tiny problems.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner import kernels
from tuner.build import render
from tuner.build.compile import compile_source
from tuner.space import space
from tuner.space.problem import Problem


def _load(name: str) -> tuple[space.SearchSpace, kernels.Family]:
    return space.load(name), kernels.get(name)


def _problem(prob: Problem) -> dict:
    return {**prob.sizes, "dtype": prob.dtype}


@pytest.mark.parametrize("name", ["transpose", "copy"])
def test_default_compiles(name, monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    spc, family = _load(name)
    prob = spc.problem()
    config = spc.resolve(spc.default, prob)
    source = render.render(family, spc.default, config, prob.env)
    assert 'extern "C" __global__' in source.text and source.entry in source.text
    compiled = compile_source(source)
    assert compiled.ok, getattr(compiled, "reason", "")
    assert compiled.registers > 0
    assert compiled.spill_bytes == 0


def test_default_uris():
    spc, family = _load("transpose")
    assert render.uri(family, spc.default) == "transpose_tile32_rpt8_pad1_vec4"  # order row: the uri of before
    assert render.uri(family, {**spc.default, "order": "col"}) == "transpose_tile32_rpt8_pad1_vec4_ordcol"
    spc, family = _load("copy")
    assert spc.default["stride"] == 1
    assert render.uri(family, spc.default) == "copy_stride1_vec4_block256_items4"


@pytest.mark.parametrize("name", ["transpose", "copy"])
def test_space_size_and_every_config_renders(name):
    spc, family = _load(name)
    prob = spc.problem()
    valid = spc.valid_configs(prob)
    assert 20 <= len(valid) <= min(500, spc.cartesian)
    for params in valid:
        source = render.render(family, params, spc.resolve(params, prob), prob.env)
        assert source.entry in source.text


def test_transpose_launches_cover_the_matrix():
    spc, family = _load("transpose")
    prob = spc.problem()
    rows, cols = prob.sizes["rows"], prob.sizes["cols"]
    for params in spc.valid_configs(prob):
        config = spc.resolve(params, prob)
        (launch,) = family.launches("k", config, _problem(prob))
        threads = math.prod(launch.block)
        assert threads == config["threads"] <= 1024
        per_thread = config["rows_per_thread"] * config["vec"]
        assert math.prod(launch.grid) * threads * per_thread == rows * cols
        assert launch.grid == (cols // config["tile"], rows // config["tile"], 1)
        assert launch.args == ("src", "dst", "rows", "cols")


def _tile_of(order: str, b: int, x: int, y: int) -> tuple[int, int]:
    """(tile column, tile row) of block b = blockIdx.x + X * blockIdx.y, as transpose.cu.j2 computes it."""
    if order == "row":
        return b % x, b // x
    if order == "col":
        return b // y, b % y
    return (b // y + b % y) % x, b % y


@pytest.mark.parametrize("order", ["row", "col", "diag"])
def test_transpose_block_orders_move_every_tile_once(order):
    # _tile_of mirrors the template's expressions (checked in the rendered source): each order is a bijection
    src = render.render(*_order_source(order)).text
    if order != "row":
        assert "const int by = b % gridDim.y;" in src
        assert ("const int bx = b / gridDim.y;" in src) == (order == "col")
        assert ("const int bx = (b / gridDim.y + by) % gridDim.x;" in src) == (order == "diag")
    for x, y in ((4, 4), (8, 3), (3, 8), (512, 512)):
        tiles = {_tile_of(order, b, x, y) for b in range(x * y)}
        assert tiles == {(i, j) for i in range(x) for j in range(y)}


def _order_source(order: str):
    """The space's default config with the given block order: (family, params, config, env) to render."""
    spc, family = _load("transpose")
    prob = spc.problem()
    params = {**spc.default, "order": order}
    return family, params, spc.resolve(params, prob), prob.env


@pytest.mark.parametrize("order", ["col", "diag"])
def test_transpose_block_orders_compile(order, monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    compiled = compile_source(render.render(*_order_source(order)))
    assert compiled.ok, getattr(compiled, "reason", "")
    assert compiled.spill_bytes == 0


def test_copy_launches_cover_n():
    spc, family = _load("copy")
    prob = spc.problem()
    n = prob.sizes["n"]
    for params in spc.valid_configs(prob):
        config = spc.resolve(params, prob)
        (launch,) = family.launches("k", config, _problem(prob))
        assert launch.block == (config["block"], 1, 1)
        assert launch.grid[0] * config["block"] * config["items"] * config["vec"] == n
        assert launch.grid[1:] == (1, 1)
        assert launch.args == ("src", "dst", "n")


def test_transpose_reference_and_shapes():
    family = kernels.get("transpose")
    problem = {"rows": 6, "cols": 4, "dtype": "float32"}
    src = family.inputs(np, problem, np.random.default_rng(0))["src"]
    assert src.shape == (6, 4) and src.dtype == np.float32
    ref = family.reference(np, {"src": src}, problem)["dst"]
    direct = np.empty((4, 6), np.float32)
    for r in range(6):
        for c in range(4):
            direct[c, r] = src[r, c]
    assert np.array_equal(ref, direct) and ref.flags.c_contiguous
    assert family.outputs(problem, {}) == {"dst": ((4, 6), "float32")}


@pytest.mark.parametrize("stride,vec", [(1, 1), (1, 4), (2, 1), (4, 2), (32, 4), (3, 2)])
def test_copy_reference_matches_direct(stride, vec):
    family = kernels.get("copy")
    n = 16
    problem = {"n": n, "dtype": "float32"}
    src = family.inputs(np, problem, np.random.default_rng(1))["src"]
    assert src.shape == (n * family.max_stride,) and src.dtype == np.float32
    ref = family.reference(np, {"src": src}, problem, {"stride": stride, "vec": vec})["dst"]
    # chunk c = i // vec of vec elements starts at src[c * vec * stride]
    direct = np.array([src[(i // vec) * vec * stride + i % vec] for i in range(n)], np.float32)
    assert np.array_equal(ref, direct)
    if vec == 1:
        assert np.array_equal(ref, src[: n * stride : stride])
    assert family.outputs(problem, {"stride": stride, "vec": vec}) == {"dst": ((n,), "float32")}


def test_copy_reference_needs_the_config():
    family = kernels.get("copy")
    problem = {"n": 8, "dtype": "float32"}
    src = family.inputs(np, problem, np.random.default_rng(2))
    with pytest.raises(TypeError, match="config"):
        family.reference(np, src, problem)


def test_bytes_moved_and_flops():
    transpose, copy = kernels.get("transpose"), kernels.get("copy")
    t_problem = _problem(space.load("transpose").problem())
    assert t_problem == {"rows": 16384, "cols": 16384, "dtype": "float32"}
    assert transpose.bytes_moved(t_problem) == 2 * 16384 * 16384 * 4 == 2 * 2**30
    c_problem = _problem(space.load("copy").problem())
    n = c_problem["n"]
    assert copy.bytes_moved(c_problem) == 2 * n * 4
    # src for the largest stride stays well under the 139 GiB of the H200 (and under 16 GiB)
    assert n * copy.max_stride * 4 <= 16 * 2**30
    for family, problem in ((transpose, t_problem), (copy, c_problem)):
        assert family.flops(problem) == 0
        assert family.tolerance(problem) == 0.0
        assert family.throughput_unit == "TB/s"
