"""The decode_attention family: space, template (real NVRTC), launches, reference, accounting, bad input.

`emulate` re-traces templates/decode_attention.cu.j2 in NumPy at the level of its schedule: the grid of the
family's launches, the positions each lane group visits (first row, row jump, tile, iterations), the
per-tile online-softmax update in base 2, the xor-butterfly merge of the groups of a warp, the SMEM merge of the
warps and the combine over splits. It checks that every position of every (b, kv head) is visited exactly once
per query head, and that the result matches the reference.
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tuner import kernels
from tuner.build import compile as tcompile
from tuner.build import compilers, render
from tuner.core.errors import SpaceError
from tuner.kernels import bf16
from tuner.space import space

ROOT = Path(__file__).resolve().parents[2]


def tuner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def assert_bad_input(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit 2, one line on stderr naming every fragment, no traceback."""
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


SMALL = {"B": 2, "S": 512, "heads_q": 8, "heads_kv": 2, "head_dim": 64, "dtype": "bfloat16"}
LOG2E = 1.4426950408889634


@pytest.fixture(scope="module")
def fam():
    return kernels.get("decode_attention")


@pytest.fixture(scope="module")
def spc():
    return space.load(ROOT / "search_spaces" / "decode_attention.yaml")


def config_for(spc, params, problem):
    sizes = {k: v for k, v in problem.items() if k != "dtype"}
    return spc.resolve(params, space.Problem("p", problem["dtype"], sizes))


# ------------------------------------------------------------------------------------------------------------
# emulation of the kernel's schedule


def emulate(fam, config, problem, inputs):
    B, S, HQ, HKV, D = (problem[k] for k in fam.problem_sizes)
    G, QH, splits = HQ // HKV, config["q_per_pass"], config["splits"]
    lanes, tile, threads = config["lanes"], config["tile"], config["threads"]
    groups, warps, per_warp = threads // lanes, threads // 32, 32 // lanes
    L = S // splits
    iters = L // (groups * tile)
    launches = fam.launches("e", config, problem)
    assert launches[0].grid == (splits, HQ // QH, B)
    q = bf16.decode(np, inputs["q"]) * np.float32(LOG2E / math.sqrt(D))
    k = bf16.decode(np, inputs["k"])
    v = bf16.decode(np, inputs["v"])
    visits = np.zeros((B, HQ, S), dtype=int)
    ws_acc = np.full((B, HQ, splits, D), np.nan, dtype=np.float32)
    ws_ml = np.full((B, HQ, splits, 2), np.nan, dtype=np.float32)
    for split, qg, b in np.ndindex(*launches[0].grid):
        hq0 = qg * QH
        hkv = hq0 // G
        qb = q[b, hq0 : hq0 + QH]  # [QH, D]
        m = np.full((groups, QH), -np.inf, dtype=np.float32)
        lsum = np.zeros((groups, QH), dtype=np.float32)
        acc = np.zeros((groups, QH, D), dtype=np.float32)
        for it in range(iters):
            # rows of group grp: first row split*L + grp, jump `groups` rows per tile row, `tile` rows per iteration
            pos = split * L + np.arange(groups)[:, None] + (it * tile + np.arange(tile))[None, :] * groups
            visits[b, hq0 : hq0 + QH][:, pos.ravel()] += 1
            s = np.einsum("gjd,hd->gjh", k[b, pos, hkv], qb)  # [groups, tile, QH]
            mn = np.maximum(m, s.max(axis=1))
            sc = np.exp2(m - mn)
            p = np.exp2(s - mn[:, None, :])
            lsum = lsum * sc + p.sum(axis=1)
            acc = acc * sc[..., None] + np.einsum("gjh,gjd->ghd", p, v[b, pos, hkv])
            m = mn
        # groups of a warp: xor butterfly over the group index within the warp
        o = 1
        while o < per_warp:
            partner = np.arange(groups) ^ o
            mn = np.maximum(m, m[partner])
            sa, sb = np.exp2(m - mn), np.exp2(m[partner] - mn)
            lsum, acc = lsum * sa + lsum[partner] * sb, acc * sa[..., None] + acc[partner] * sb[..., None]
            m = mn
            o *= 2
        # warps through SMEM: the first group of each warp holds the warp's result
        mw, lw, aw = m[::per_warp], lsum[::per_warp], acc[::per_warp]
        assert mw.shape[0] == warps
        M = mw.max(axis=0)
        f = np.exp2(mw - M)
        a = (aw * f[..., None]).sum(axis=0)
        total = (lw * f).sum(axis=0)
        ws_acc[b, hq0 : hq0 + QH, split] = a
        ws_ml[b, hq0 : hq0 + QH, split, 0] = M
        ws_ml[b, hq0 : hq0 + QH, split, 1] = total
    M = ws_ml[..., 0].max(axis=2, keepdims=True)
    f = np.exp2(ws_ml[..., 0] - M)
    out = (ws_acc * f[..., None]).sum(axis=2) / (ws_ml[..., 1] * f).sum(axis=2)[..., None]
    return out, visits


EMULATED = [
    {"splits": 1, "threads": 64, "lanes": 16, "vec": 4, "tile": 4, "q_per_pass": 4},
    {"splits": 4, "threads": 128, "lanes": 8, "vec": 8, "tile": 2, "q_per_pass": 4},
    {"splits": 8, "threads": 64, "lanes": 16, "vec": 4, "tile": 1, "q_per_pass": 2},
    {"splits": 2, "threads": 256, "lanes": 16, "vec": 4, "tile": 8, "q_per_pass": 1},
]


@pytest.mark.parametrize("params", EMULATED)
def test_emulated_schedule_visits_each_position_once_and_matches_reference(fam, params):
    config = {**params, "hint": "plain", "min_blocks": 0, "stages": 0, "combine": "launch"}
    inputs = fam.inputs(np, SMALL, np.random.default_rng(3))
    out, visits = emulate(fam, config, SMALL, inputs)
    assert (visits == 1).all()
    ref = fam.reference(np, inputs, SMALL)["out"]
    assert np.max(np.abs(out - ref) / np.maximum(np.abs(ref), 1)) < 1e-4


# ------------------------------------------------------------------------------------------------------------
# space, compile, launches


def test_family_contract(fam, spc):
    assert kernels.get("decode_attention") is fam and "decode_attention" in kernels.names()
    assert fam.dtypes == ("bfloat16",) and fam.throughput_unit == "TB/s"
    assert set(fam.uri_names) == set(spc.params)
    assert [p.name for p in spc.problems] == ["b8_s4096", "b16_s8192", "b64_s8192"]
    for problem in spc.problems:
        assert problem.sizes["heads_q"] == 32 and problem.sizes["heads_kv"] == 8 and problem.sizes["head_dim"] == 128
        assert spc.validate(spc.default, problem) is None
        assert 1000 <= spc.count_valid(problem) <= 40000
        assert {c["splits"] > 1 for c in spc.valid_configs(problem)} == {True, False} or problem.name == "b8_s4096"


@pytest.mark.parametrize("problem_name", ["b8_s4096", "b64_s8192"])
def test_default_compiles_without_spills(fam, spc, problem_name):
    problem = spc.problem(problem_name)
    config = spc.resolve(spc.default, problem)
    source = render.render(fam, spc.default, config, problem.env)
    result = tcompile.compile_source(source)
    assert result.ok, result.reason
    assert set(result.functions) == {source.entry, source.entry + "_combine"}
    assert 0 < result.main.registers <= 255 and result.spill_bytes == 0


def test_sampled_configs_compile(fam, spc):
    """A seeded sample of valid configs (split and unsplit, each lane width) compiles; few spill."""
    rng = random.Random(2)
    problem = spc.problem("b16_s8192")
    groups: dict[tuple, list] = {}
    for config in spc.valid_configs(problem):
        groups.setdefault((config["splits"] > 1, config["lanes"]), []).append(config)
    assert len(groups) == 6
    sources = [
        render.render(fam, c, spc.resolve(c, problem), problem.env)
        for configs in groups.values()
        for c in rng.sample(configs, 2)
    ]
    spilled = 0
    for source, result in compilers.compile_many(sources, jobs=1):  # in this process: see tests/README.md
        assert result.ok, (source.uri, result.reason)
        assert source.entry in result.functions and result.main.registers > 0
        spilled += result.spill_bytes > 0
    assert spilled <= 2


@pytest.mark.parametrize("problem_name", ["b8_s4096", "b64_s8192"])
@pytest.mark.parametrize(
    "change",
    [
        {"stages": 2},
        {"stages": 3, "tile": 2},
        {"stages": 4, "threads": 128},
        {"combine": "fused"},
        {"stages": 2, "combine": "fused", "splits": 32},
        {"stages": 3, "lanes": 32, "vec": 4},
        {"combine": "cluster"},
        {"stages": 4, "threads": 128, "tile": 2, "splits": 4, "combine": "cluster"},
    ],
)
def test_ring_and_fused_combine_compile_without_spills(fam, spc, problem_name, change):
    """The cp.async ring and the fused and cluster combines compile for sm_90 with the default's register budget
    (NVRTC: 114-128 registers, no spill at 256 threads), and neither merge in the main launch has a combine
    kernel; the cluster config asks for one cluster of `splits` blocks."""
    problem = spc.problem(problem_name)
    params = {**spc.default, **change}
    assert spc.validate(params, problem) is None
    config = spc.resolve(params, problem)
    source = render.render(fam, params, config, problem.env)
    assert ("cp_async(slot" in source.text) == (config["stages"] > 0)
    result = tcompile.compile_source(source)
    assert result.ok, result.reason
    fused = change.get("combine") in ("fused", "cluster")
    ptx = result.ptx.decode()
    clustered = f".reqnctapercluster {config['splits']}, 1, 1" in ptx and "mapa.shared::cluster" in ptx
    assert clustered == (change.get("combine") == "cluster")
    assert set(result.functions) == ({source.entry} if fused else {source.entry, source.entry + "_combine"})
    assert 0 < result.main.registers <= 128 and result.spill_bytes == 0


def test_ring_smem_matches_the_space_and_fits(fam, spc):
    """The family's dynamic SMEM equals the space's smem_bytes_needed for every knob, and the constraints keep it
    under the 227 KiB a block may opt into."""
    problem = spc.problem("b16_s8192")
    seen = set()
    for config in spc.valid_configs(problem):
        key = (config["combine"], config["threads"], config["lanes"], config["tile"], config["q_per_pass"])
        key += (config["stages"],)
        if key in seen:
            continue
        seen.add(key)
        resolved = spc.resolve(config, problem)
        assert fam.smem_bytes(resolved, problem.env) == resolved["smem_bytes_needed"] <= 227 * 1024
    assert {k[-1] for k in seen} == {0, 2, 3, 4}
    default = spc.resolve({**spc.default, "stages": 2}, problem)
    assert fam.smem_bytes(default, problem.env) == 16640 + 2 * 2 * 64 * 128 * 2


def test_ring_and_combine_constraints(spc):
    problem = spc.problem("b8_s4096")
    assert "hint" in spc.validate({**spc.default, "stages": 2, "hint": "stream"}, problem)
    assert "combine" in spc.validate({**spc.default, "splits": 1, "combine": "fused"}, problem)
    assert spc.validate({**spc.default, "stages": 2, "combine": "fused"}, problem) is None
    # a ring too large for one block: 512 threads in groups of 8 lanes, tile 8, 4 stages
    assert spc.validate({**spc.default, "threads": 512, "lanes": 8, "tile": 8, "stages": 4}, problem) is not None


def test_fused_launch_and_bad_knobs(fam, spc):
    problem = {**spc.problem("b8_s4096").sizes, "dtype": "bfloat16"}
    config = config_for(spc, {**spc.default, "combine": "fused", "stages": 3}, problem)
    (main,) = fam.launches("e", config, problem)
    assert main.args == ("q", "k", "v", "ws_acc", "ws_ml", "counters", "out") and main.grid == (8, 8, 8)
    assert main.smem_dynamic == 16640 + 3 * 2 * 64 * 128 * 2
    assert set(fam.outputs(problem, config)) == {"out", "ws_acc", "ws_ml"}
    with pytest.raises(ValueError, match="stages=1"):
        fam.launches("e", {**config, "stages": 1}, problem)
    with pytest.raises(ValueError, match="combine='atomic'"):
        fam.launches("e", {**config, "combine": "atomic"}, problem)


def test_cluster_combine_launch_smem_and_limits(fam, spc):
    """The cluster combine is one launch with no workspace (q, k, v, out), its partial in SMEM after the ring, and
    at most 8 splits (a portable cluster): the space and the family both refuse 16."""
    problem = {**spc.problem("b8_s4096").sizes, "dtype": "bfloat16"}
    config = config_for(spc, {**spc.default, "combine": "cluster", "stages": 3}, problem)
    (main,) = fam.launches("e", config, problem)
    assert main.args == ("q", "k", "v", "out") and main.grid == (8, 8, 8)
    assert main.smem_dynamic == 16640 + 3 * 2 * 64 * 128 * 2 + 4 * 130 * 4
    assert set(fam.outputs(problem, config)) == {"out"} and config["workspace_bytes"] == 0
    with pytest.raises(ValueError, match="2 to 8 splits"):
        fam.launches("e", {**config, "splits": 16}, problem)
    assert "cluster" in spc.validate({**spc.default, "combine": "cluster", "splits": 16}, spc.problem("b8_s4096"))


def test_configs_recorded_before_the_ring_render_the_register_path(fam, spc):
    """A config without stages / combine (recorded before they existed) renders the same kernel body as
    stages 0 with a combine launch."""
    problem = spc.problem("b8_s4096")
    new = {**spc.default}
    old = {k: v for k, v in new.items() if k not in ("stages", "combine")}
    a = render.render(fam, new, spc.resolve(new, problem), problem.env)
    resolved_old = {k: v for k, v in spc.resolve(new, problem).items() if k not in ("stages", "combine")}
    b = render.render(fam, old, resolved_old, problem.env)

    def body(s):
        return s.text.replace(s.entry, "ENTRY").split("\n", 1)[1]

    assert "cp_async(" not in body(a).split('extern "C"')[1]
    assert body(a).replace(", stages 0, combine launch", "") == body(b).replace(", stages 0, combine launch", "")


@pytest.mark.parametrize("splits", [1, 16])
def test_launches_and_outputs(fam, spc, splits):
    problem = {**spc.problem("b8_s4096").sizes, "dtype": "bfloat16"}
    config = config_for(spc, {**spc.default, "splits": splits}, problem)
    launches = fam.launches("e", config, problem)
    main = launches[0]
    assert main.grid == (splits, 8, 8) and main.block == (256, 1, 1)
    assert main.smem_dynamic == 8 * 4 * 130 * 4
    outs = fam.outputs(problem, config)
    assert outs["out"] == ((8, 32, 128), "bfloat16")
    if splits == 1:
        assert len(launches) == 1 and main.args == ("q", "k", "v", "out") and set(outs) == {"out"}
    else:
        assert main.args == ("q", "k", "v", "ws_acc", "ws_ml")
        combine = launches[1]
        assert combine.entry == "e_combine" and combine.grid == (8 * 32, 1, 1) and combine.block == (128, 1, 1)
        assert combine.args == ("ws_acc", "ws_ml", "out")
        assert outs["ws_acc"] == ((8, 32, 16, 128), "float32") and outs["ws_ml"] == ((8, 32, 16, 2), "float32")
    assert fam.checked() == ("out",)


def test_launches_refuse_untiled_problems(fam, spc):
    problem = {**spc.problem("b8_s4096").sizes, "dtype": "bfloat16"}
    config = config_for(spc, spc.default, problem)
    with pytest.raises(ValueError, match="S=4000"):
        fam.launches("e", config, {**problem, "S": 4000})
    with pytest.raises(ValueError, match="heads_q=30"):
        fam.launches("e", config, {**problem, "heads_q": 30})


# ------------------------------------------------------------------------------------------------------------
# reference, tolerance, accounting


def naive(inputs, problem):
    """float64, one query head at a time, straight from the formula."""
    B, S, HQ, HKV, D = (problem[k] for k in ("B", "S", "heads_q", "heads_kv", "head_dim"))
    q, k, v = (bf16.decode(np, inputs[n]).astype(np.float64) for n in ("q", "k", "v"))
    out = np.empty((B, HQ, D))
    for b in range(B):
        for h in range(HQ):
            kv = h // (HQ // HKV)
            s = k[b, :, kv, :] @ q[b, h] / math.sqrt(D)
            p = np.exp(s - s.max())
            out[b, h] = (p / p.sum()) @ v[b, :, kv, :]
    return out


def test_reference_matches_float64_and_tolerance_catches_a_lost_split(fam):
    inputs = fam.inputs(np, SMALL, np.random.default_rng(0))
    assert {k: (a.shape, a.dtype) for k, a in inputs.items()} == {
        "q": ((2, 8, 64), np.uint16),
        "k": ((2, 512, 2, 64), np.uint16),
        "v": ((2, 512, 2, 64), np.uint16),
        "counters": ((2, 8), np.int32),
    }
    assert not inputs["counters"].any()
    ref = fam.reference(np, inputs, SMALL)["out"]
    exact = naive(inputs, SMALL)
    assert ref.dtype == np.float32 and ref.shape == (2, 8, 64)
    tol = fam.tolerance(SMALL)

    def err(out):
        return np.max(np.abs(out - exact) / np.maximum(np.abs(exact), 1))

    assert err(ref) < 1e-5
    assert err(bf16.decode(np, bf16.encode(np, ref))) < tol / 2  # the kernel's bf16 rounding passes
    # peaky heads: outputs of size O(1), not ~1/sqrt(S)
    assert np.abs(exact).max() > 1.0
    # a combine that loses one of 8 splits (positions 192..255) fails
    q = bf16.decode(np, inputs["q"]).astype(np.float64)
    k = bf16.decode(np, inputs["k"]).astype(np.float64)
    v = bf16.decode(np, inputs["v"]).astype(np.float64)
    keep = np.ones(512, dtype=bool)
    keep[3 * 64 : 4 * 64] = False
    masked = np.empty_like(exact)
    for b in range(2):
        for h in range(8):
            s = k[b, keep, h // 4, :] @ q[b, h] / 8.0
            p = np.exp(s - s.max())
            masked[b, h] = (p / p.sum()) @ v[b, keep, h // 4, :]
    assert err(masked) > tol


def test_accounting(fam, spc):
    problem = {**spc.problem("b8_s4096").sizes, "dtype": "bfloat16"}
    kv = 8 * 4096 * 8 * 128 * 2
    assert fam.bytes_moved(problem) == 2 * kv + 2 * 8 * 32 * 128 * 2 == 134_348_800
    assert fam.flops(problem) == 4 * 8 * 32 * 4096 * 128
    big = {**spc.problem("b64_s8192").sizes, "dtype": "bfloat16"}
    assert fam.bytes_moved(big) == 2 * 64 * 8192 * 8 * 128 * 2 + 2 * 64 * 32 * 128 * 2
    assert fam.tolerance(problem) == 1e-2


# ------------------------------------------------------------------------------------------------------------
# bad input


def test_heads_that_do_not_split_into_groups_are_a_one_line_error(tmp_path):
    text = (
        open(ROOT / "search_spaces" / "decode_attention.yaml")
        .read()
        .replace("{name: b8_s4096, B: 8, S: 4096, heads_q: 32,", "{name: b8_s4096, B: 8, S: 4096, heads_q: 30,")
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(SpaceError, match="heads_q=30 is not a multiple of heads_kv=8"):
        space.load(bad)
    assert_bad_input(tuner("render", str(bad)), str(bad), "b8_s4096", "heads_q=30")


def test_unsupported_dtype_is_a_one_line_error(tmp_path):
    text = (
        open(ROOT / "search_spaces" / "decode_attention.yaml")
        .read()
        .replace("head_dim: 128, dtype: bfloat16}", "head_dim: 128, dtype: float32}", 1)
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    assert_bad_input(tuner("render", str(bad)), str(bad), "float32")
