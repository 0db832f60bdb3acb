"""The decode-time families fp8_quant and rope: NumPy references, the e4m3 codec, spaces, real NVRTC compiles,
and bad problems refused as one line, exit 2 (no GPU needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tuner import kernels
from tuner.build import compilers, render
from tuner.core.errors import SpaceError
from tuner.kernels import bf16
from tuner.kernels.fp8_quant import decode_e4m3, encode_e4m3, ordinal
from tuner.space import space

ROOT = Path(__file__).resolve().parents[2]


def _e4m3_table() -> np.ndarray:
    """The 254 finite e4m3 values from the format's definition (bias 7, 3 mantissa bits, no infinities)."""
    values = []
    for code in range(256):
        sign, e, m = code >> 7, (code >> 3) & 15, code & 7
        if e == 15 and m == 7:
            values.append(np.nan)
            continue
        v = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        values.append(-v if sign else v)
    return np.array(values)


# ------------------------------------------------------------------------------------------------------------
# the e4m3 codec


def test_decode_matches_the_format_definition():
    table = _e4m3_table()
    got = decode_e4m3(np, np.arange(256, dtype=np.uint8)).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(table))
    finite = ~np.isnan(table)
    np.testing.assert_array_equal(got[finite], table[finite])
    assert table[0x7E] == 448 and table[0x01] == 2.0**-9 and table[0x08] == 2.0**-6


def test_encode_round_trips_every_finite_code():
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    np.testing.assert_array_equal(encode_e4m3(np, decode_e4m3(np, codes)), codes)


def test_encode_rounds_to_nearest_even_and_saturates():
    table = _e4m3_table()
    positive = np.sort(table[:0x7F])
    # Midpoints between neighbours go to the even code; just off the midpoint goes to the nearer value.
    for lo, hi in zip(positive[:-1], positive[1:], strict=True):
        mid = (lo + hi) / 2
        code_lo, code_hi = encode_e4m3(np, [lo, hi])
        even = code_lo if code_lo % 2 == 0 else code_hi
        assert encode_e4m3(np, [mid])[0] == even
        assert encode_e4m3(np, [np.nextafter(mid, 0)])[0] == code_lo
        assert encode_e4m3(np, [np.nextafter(mid, np.inf)])[0] == code_hi
    assert list(encode_e4m3(np, [448.0, 463.9, 464.0, 1e9, -1e9, -0.0, np.nan])) == [
        0x7E,
        0x7E,
        0x7E,
        0x7E,
        0xFE,
        0x80,
        0x7F,
    ]
    assert encode_e4m3(np, [2.0**-10])[0] == 0x00  # a tie between 0 and the smallest subnormal: even is 0
    assert encode_e4m3(np, [3 * 2.0**-10])[0] == 0x02  # tie between codes 1 and 2


def test_encode_agrees_with_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.random.default_rng(0).standard_normal(200_000) * np.exp(np.random.default_rng(1).uniform(-12, 6, 200_000))
    x = np.clip(x, -448, 448)  # ml_dtypes does not saturate
    expected = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(encode_e4m3(np, x), expected)


# ------------------------------------------------------------------------------------------------------------
# fp8_quant: reference and check


@pytest.fixture(scope="module")
def fp8():
    return kernels.get("fp8_quant")


@pytest.fixture(scope="module")
def rope():
    return kernels.get("rope")


def _kernel_quant(x_bits, xp=np):
    """What the kernel computes: amax on the bits, inv = fp32(448 / amax), q = e4m3(fp32(x · inv))."""
    x = bf16.decode(xp, x_bits)
    amax = xp.abs(x).max(axis=1)
    inv = np.where(amax > 0, np.float32(448) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    return encode_e4m3(xp, (x * inv[:, None]).astype(np.float32)), (amax / np.float32(448)).astype(np.float32)


def test_quant_reference_and_the_kernels_arithmetic_agree_within_one_ulp(fp8):
    problem = {"T": 64, "H": 1024, "op": 1, "dtype": "bfloat16"}
    inputs = fp8.inputs(np, problem, np.random.default_rng(0))
    assert inputs["x"].dtype == np.uint16 and inputs["x"].shape == (64, 1024)
    ref = fp8.reference(np, inputs, problem)
    codes, scale = _kernel_quant(inputs["x"])
    tol = fp8.tolerance(problem)
    assert tol == {"q": 1 / 256, "scale": 0.0}
    view = fp8.checked_value(np, "q", codes, "uint8")
    assert np.abs(view - ref["q"]).max() <= tol["q"]
    np.testing.assert_array_equal(scale.astype(np.float64), ref["scale"])
    # each row's largest element maps to ±448 exactly, and the scale reconstructs x to within half an ulp
    assert (np.abs(ordinal(np, codes)).max(axis=1) == 126).all()
    x = bf16.decode(np, inputs["x"]).astype(np.float64)
    deq = decode_e4m3(np, codes).astype(np.float64) * scale[:, None]
    assert np.all(np.abs(deq - x) <= np.abs(x) / 16 + 2.0**-10 * scale[:, None] + 1e-30)


def test_quant_check_fails_two_ulps_a_wrong_scale_and_an_unwritten_code(fp8):
    from tuner.gpu.checks import check_output

    problem = {"T": 32, "H": 512, "op": 1, "dtype": "bfloat16"}
    inputs = fp8.inputs(np, problem, np.random.default_rng(1))
    ref = fp8.reference(np, inputs, problem)
    codes, scale = _kernel_quant(inputs["x"])
    tol = fp8.tolerance(problem)

    def check(name, array, dtype):
        return check_output(np, name, fp8.checked_value(np, name, array, dtype), ref[name], tol[name])

    assert check("q", codes, "uint8").ok and check("scale", scale, "float32").ok
    bumped = codes.copy()
    mag = bumped[5, 7] & 0x7F
    bumped[5, 7] = (bumped[5, 7] & 0x80) | (mag - 2 if mag >= 2 else mag + 2)  # two ulps off
    assert not check("q", bumped, "uint8").ok
    poisoned = codes.copy()
    poisoned[3, 3] = 0xFF  # the NaN poison the bench writes before a launch
    assert not check("q", poisoned, "uint8").ok
    assert not check("scale", np.nextafter(scale, np.float32(1)), "float32").ok


def test_zero_row_quantizes_to_zero(fp8):
    problem = {"T": 2, "H": 8, "op": 1, "dtype": "bfloat16"}
    x = bf16.encode(np, np.array([[0.0] * 8, [1, -2, 3, -4, 0, 0, 0, 448 * 4]], dtype=np.float32))
    ref = fp8.reference(np, {"x": x}, problem)
    assert list(ref["scale"]) == [0.0, 4.0]
    assert (ref["q"][0] == 0).all()
    assert ref["q"][1, -1] == 126 / 256  # amax → 448


def test_dequant_reference(fp8):
    problem = {"T": 16, "H": 256, "op": 2, "dtype": "bfloat16"}
    inputs = fp8.inputs(np, problem, np.random.default_rng(2))
    assert set(inputs) == {"q", "scale"} and inputs["q"].dtype == np.uint8
    ref = fp8.reference(np, inputs, problem)["y"]
    expected = decode_e4m3(np, inputs["q"]).astype(np.float64) * inputs["scale"][:, None]
    np.testing.assert_allclose(ref, expected, rtol=2.0**-23)
    tol = fp8.tolerance(problem)["y"]
    y = bf16.decode(np, bf16.encode(np, (decode_e4m3(np, inputs["q"]) * inputs["scale"][:, None])))
    assert (np.abs(y - ref) / np.maximum(np.abs(ref), 1)).max() <= tol
    assert fp8.outputs(problem, {}) == {"y": ((16, 256), "bfloat16")}


def test_fp8_accounting(fp8):
    T, H = 32768, 8192
    for op in (1, 2):
        assert fp8.bytes_moved({"T": T, "H": H, "op": op, "dtype": "bfloat16"}) == 3 * T * H + 4 * T
    assert fp8.flops({"T": T, "H": H, "op": 1, "dtype": "bfloat16"}) == 0


# ------------------------------------------------------------------------------------------------------------
# rope: reference and check


def test_rope_reference_is_neox_rotate_half(rope):
    problem = {"T": 8, "Hq": 4, "Hkv": 2, "D": 16, "dtype": "bfloat16"}
    inputs = rope.inputs(np, problem, np.random.default_rng(0))
    assert inputs["q"].shape == (8, 4, 16) and inputs["k"].shape == (8, 2, 16)
    assert inputs["cos"].shape == (8, 8) and inputs["cos"].dtype == np.float32
    ref = rope.reference(np, inputs, problem)
    angle = np.arctan2(inputs["sin"], inputs["cos"]).astype(np.float64)
    for name in ("q", "k"):
        x = bf16.decode(np, inputs[name]).astype(np.float64)
        # rotate_half as HF Llama writes it: x * cos + rotate_half(x) * sin with cos/sin repeated over halves
        cos = np.concatenate([np.cos(angle)] * 2, axis=-1)[:, None, :]
        sin = np.concatenate([np.sin(angle)] * 2, axis=-1)[:, None, :]
        rotated = np.concatenate([-x[..., 8:], x[..., :8]], axis=-1)
        np.testing.assert_allclose(ref[name], x * cos + rotated * sin, atol=1e-6)
        # a rotation keeps each pair's norm
        np.testing.assert_allclose(
            ref[name][..., :8] ** 2 + ref[name][..., 8:] ** 2, x[..., :8] ** 2 + x[..., 8:] ** 2, rtol=1e-5
        )


def test_rope_tolerance_passes_bf16_rounding_and_fails_mistakes(rope):
    from tuner.gpu.checks import check_output

    problem = {"T": 64, "Hq": 8, "Hkv": 2, "D": 128, "dtype": "bfloat16"}
    inputs = rope.inputs(np, problem, np.random.default_rng(3))
    ref = rope.reference(np, inputs, problem)
    tol = rope.tolerance(problem)
    assert rope.checked() == ("q", "k") and rope.outputs(problem, {}) == {}

    def fp32_kernel(cos, sin):
        out = {}
        for name in ("q", "k"):
            x = bf16.decode(np, inputs[name])
            x1, x2 = x[..., :64], x[..., 64:]
            c, s = cos[:, None, :], sin[:, None, :]
            out[name] = bf16.encode(np, np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1))
        return out

    good = fp32_kernel(inputs["cos"], inputs["sin"])
    for name in ("q", "k"):
        assert check_output(np, name, rope.checked_value(np, name, good[name], None), ref[name], tol).ok
    wrong_sign = fp32_kernel(inputs["cos"], -inputs["sin"])
    assert not check_output(np, "q", bf16.decode(np, wrong_sign["q"]), ref["q"], tol).ok
    untouched = inputs["k"].copy()
    assert not check_output(np, "k", bf16.decode(np, untouched), ref["k"], tol).ok
    skipped = good["q"].copy()
    skipped[17, 3] = inputs["q"][17, 3]  # one head of one token not rotated
    assert not check_output(np, "q", bf16.decode(np, skipped), ref["q"], tol).ok


def test_rope_accounting(rope):
    problem = {"T": 32768, "Hq": 32, "Hkv": 8, "D": 128, "dtype": "bfloat16"}
    assert rope.bytes_moved(problem) == 32768 * (2 * 2 * 40 * 128 + 2 * 4 * 64)
    assert rope.flops(problem) == 6 * 32768 * 40 * 64


# ------------------------------------------------------------------------------------------------------------
# spaces and compiles


@pytest.mark.parametrize("name, low, high", [("fp8_quant", 150, 500), ("rope", 40, 150)])
def test_space_counts_and_defaults(name, low, high):
    s = space.load(name)
    family = kernels.get(name)
    assert set(family.uri_names) == set(s.params)
    assert s.validate(s.default, s.problems[0]) is None
    for problem in s.problems:
        assert low <= s.count_valid(problem) <= high


@pytest.mark.parametrize("name", ["fp8_quant", "rope"])
def test_sampled_configs_compile_without_spills(name):
    """A seeded sample of valid configs per problem compiles for sm_90 with NVRTC, spill-free, one entry."""
    s = space.load(name)
    family = kernels.get(name)
    sources, launches = [], {}
    for problem in s.problems:
        for config in s.sample(8, seed=4, problem=problem):
            resolved = s.resolve(config, problem)
            source = render.render(family, config, resolved, problem.env)
            sources.append(source)
            launches[source.uri] = family.launches(source.entry, resolved, problem.env)
    for source, result in compilers.compile_many(sources, jobs=1):  # in this process: see tests/README.md
        assert result.ok, (source.uri, result.reason)
        assert set(result.functions) == {source.entry}
        assert 0 < result.registers <= 255 and result.spill_bytes == 0, source.uri
        (launch,) = launches[source.uri]
        assert launch.block[0] <= 1024


def test_rope_launch_covers_every_token(rope):
    s = space.load("rope")
    problem = s.problem("t32768_q32_kv8_d128")
    for config in s.valid_configs(problem):
        resolved = s.resolve(config, problem)
        (launch,) = rope.launches("e", resolved, problem.env)
        assert launch.grid[0] * config["tokens_per_block"] == 32768
        assert launch.block[0] == resolved["threads"]
        assert launch.args == ("q", "k", "cos", "sin", "T")


def test_fp8_launch_covers_every_row(fp8):
    s = space.load("fp8_quant")
    for problem in s.problems:
        for config in s.valid_configs(problem):
            (launch,) = fp8.launches("e", s.resolve(config, problem), problem.env)
            assert launch.grid[0] * config["rows_per_block"] == 32768
    with pytest.raises(ValueError, match="do not tile"):
        fp8.launches("e", s.default, {"T": 32768, "H": 8200, "op": 1, "dtype": "bfloat16"})


# ------------------------------------------------------------------------------------------------------------
# bad problems


def _space_with(tmp_path, name: str, old: str, new: str) -> Path:
    text = (ROOT / "search_spaces" / f"{name}.yaml").read_text()
    assert old in text
    path = tmp_path / f"{name}_bad.yaml"
    path.write_text(text.replace(old, new))
    return path


BAD = [
    ("rope", "Hq: 32, Hkv: 8,", "Hq: 32, Hkv: 6,", "GQA ratio Hq/Hkv = 32/6 does not divide"),
    ("rope", "dtype: bfloat16}", "dtype: float32}", "dtype 'float32' is not supported by rope"),
    ("fp8_quant", "H: 8192, op: 1,", "H: 8194, op: 1,", "H=8194 is not a multiple of 4"),
    ("fp8_quant", "H: 8192, op: 2,", "H: 8196, op: 2,", "no valid configs for problem 'dequant_t32768_h8192'"),
    ("fp8_quant", "op: 2,", "op: 3,", "op must be 1 (quantize) or 2 (dequantize)"),
    ("gemv", "{name: m8, M: 8, N: 8192,", "{name: m8, M: 8, N: 8191,", "no valid configs for problem 'm8'"),
]


@pytest.mark.parametrize("name, old, new, fault", BAD)
def test_bad_problem_is_a_space_error_naming_the_file(tmp_path, name, old, new, fault):
    path = _space_with(tmp_path, name, old, new)
    with pytest.raises(SpaceError) as info:
        space.load(path)
    assert str(path) in str(info.value) and fault in str(info.value)


def test_bad_problem_on_the_command_line_is_one_line_exit_2(tmp_path):
    path = _space_with(tmp_path, *BAD[0][:3])
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "render", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert str(path) in lines[0] and "does not divide" in lines[0]
