"""The persistent-grid and look-ahead knobs of reduce and rmsnorm: space rules, launch grids from the GPU's SM
count, index coverage of the grid-stride walk, and real NVRTC compiles without spills. No GPU."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from tuner import kernels
from tuner.build import render
from tuner.build.compile import compile_source
from tuner.core.gpufacts import DEFAULT
from tuner.space import space


def _sample(spc: space.SearchSpace, prob, count: int) -> list[dict]:
    configs = [c for c in spc.valid_configs(prob) if c["persist"] or c["prefetch"]]
    random.Random(1).shuffle(configs)
    return configs[:count]


@pytest.mark.parametrize("name", ["reduce", "rmsnorm"])
def test_new_knobs_compile_without_spills(name):
    spc, family = space.load(name), kernels.get(name)
    for prob in spc.problems[:2]:
        for params in _sample(spc, prob, 6):
            source = render.render(family, params, spc.resolve(params, prob), prob.env)
            compiled = compile_source(source)
            assert compiled.ok, (source.entry, getattr(compiled, "reason", ""))
            assert compiled.spill_bytes == 0, source.entry


@pytest.mark.parametrize("name", ["reduce", "rmsnorm"])
def test_neutral_knobs_keep_the_kernel(name):
    """persist 0 and prefetch 0 render the same kernel as a config that predates the knobs."""
    spc, family = space.load(name), kernels.get(name)
    prob = spc.problem()
    old = {k: v for k, v in spc.default.items() if k not in ("persist", "prefetch")}
    new_text = render.render(family, spc.default, spc.resolve(spc.default, prob), prob.env).text
    old_text = render.render(family, old, {**spc.resolve(spc.default, prob), **old}, prob.env).text
    strip = lambda text: text.replace("_persist0_pf0", "")  # noqa: E731 - the entry name carries the knobs
    assert strip(new_text) == old_text


@pytest.mark.parametrize("name", ["reduce", "rmsnorm"])
def test_persistent_grid_follows_the_sm_count(name):
    spc, family = space.load(name), kernels.get(name)
    params = _sample(spc, spc.problem(), 40)
    params = next(p for p in params if p["persist"])
    for sm_count in (132, 78):
        prob = dataclasses.replace(spc.problem(), gpu=dataclasses.replace(DEFAULT, sm_count=sm_count))
        config = spc.resolve(params, prob)
        (launch,) = family.launches("k", config, {**prob.sizes, "dtype": prob.dtype})
        assert launch.grid == (params["persist"] * sm_count, 1, 1) == (config["blocks"], 1, 1)
    with pytest.raises(ValueError, match="blocks"):
        family.launches("k", params, {**prob.sizes, "dtype": prob.dtype})  # unresolved: no grid to launch


def test_space_rules():
    red, rms = space.load("reduce"), space.load("rmsnorm")
    base = {**red.default, "vec": 8, "threads": 256, "items": 4}
    assert red.validate({**base, "persist": 4, "prefetch": 1}) is None
    assert "constraint failed" in red.validate({**base, "persist": 4, "prefetch": 0})  # no look-ahead
    assert "constraint failed" in red.validate({**base, "persist": 8, "threads": 512, "prefetch": 1})  # not resident
    assert "constraint failed" in red.validate({**base, "vec": 2, "items": 8, "prefetch": 1})  # 4-byte loads
    assert red.validate({**base, "hint": "noalloc"}) is None
    base = {**rms.default, "vec": 8, "threads": 1024, "min_blocks": 0}
    assert rms.validate({**base, "persist": 2, "prefetch": 1}) is None
    assert "constraint failed" in rms.validate({**base, "persist": 0, "prefetch": 1})  # look-ahead needs the loop
    assert "constraint failed" in rms.validate({**base, "persist": 2, "cache": "smem"})
    for spc in (red, rms):
        for prob in spc.problems[:1]:
            assert 1000 <= spc.count_valid(prob) <= 10000


@pytest.mark.parametrize("rpb,blocks,rows", [(1, 7, 40), (4, 3, 32), (2, 5, 10)])
def test_grid_stride_walk_covers_every_row_once(rpb, blocks, rows):
    """The persistent walk of both templates: block b takes units b, b + grid, ...; row = unit * rpb + g."""
    units = rows // rpb
    blocks = min(blocks, units)
    seen = [u * rpb + g for b in range(blocks) for u in range(b, units, blocks) for g in range(rpb)]
    assert np.array_equal(np.sort(seen), np.arange(rows))
