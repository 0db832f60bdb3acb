"""Search spaces: loading, expressions, enumeration and every bad-input case (file and line in the message)."""

from __future__ import annotations

import textwrap

import pytest

from tuner import space as space_mod
from tuner.errors import SpaceError
from tuner.expr import Expr, ExprError

GOOD = """\
kernel: copy
problem: {name: small, n: 4096, dtype: float32}
params:
  stride: [1, 2, 4]
  vec: [1, 2, 4]
  block: {pow2: [64, 256]}
  items: [1, 2]
derived:
  per_block: block * items * vec
constraints:
  - n % per_block == 0
  - stride * vec <= 8
"""


def write(tmp_path, text: str, name: str = "space.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_good_space_counts_and_enumeration(tmp_path):
    s = space_mod.load(write(tmp_path, GOOD))
    assert s.kernel == "copy"
    assert s.params["block"] == (64, 128, 256)
    assert s.cartesian == 3 * 3 * 3 * 2
    valid = list(s.enumerate())
    # Brute force over the Cartesian product must agree with the backtracking walk.
    import itertools

    brute = []
    for values in itertools.product(*s.params.values()):
        cfg = dict(zip(s.params, values, strict=True))
        if s.validate(cfg) is None:
            brute.append(cfg)
    assert valid == brute
    assert s.count_valid() == len(brute) > 0
    assert all(c["stride"] * c["vec"] <= 8 for c in valid)
    assert s.resolve(valid[0])["per_block"] == valid[0]["block"] * valid[0]["items"] * valid[0]["vec"]
    assert s.default == valid[0]


def test_objectives_default_to_throughput_registers_smem(tmp_path):
    s = space_mod.load(write(tmp_path, GOOD))
    assert [(o.name, o.direction) for o in s.objectives] == [
        ("throughput", "maximize"),
        ("registers", "minimize"),
        ("smem_bytes", "minimize"),
    ]


def test_validate_reports_reason(tmp_path):
    s = space_mod.load(write(tmp_path, GOOD))
    assert "constraint failed: stride * vec <= 8" in s.validate({"stride": 4, "vec": 4, "block": 64, "items": 1})
    assert "unknown parameter" in s.validate({**s.default, "tile": 3})
    assert "not one of" in s.validate({**s.default, "vec": 3})


def test_sample_is_seeded_and_distinct(tmp_path):
    s = space_mod.load(write(tmp_path, GOOD))
    a, b = s.sample(5, seed=3), s.sample(5, seed=3)
    assert a == b and len({tuple(c.values()) for c in a}) == 5
    assert s.sample(10_000) == list(s.enumerate())


def test_several_problems(tmp_path):
    text = GOOD.replace(
        "problem: {name: small, n: 4096, dtype: float32}",
        "problem:\n  - {name: small, n: 4096}\n  - {name: odd, n: 192}",
    )
    s = space_mod.load(write(tmp_path, text))
    assert [p.name for p in s.problems] == ["small", "odd"]
    assert s.count_valid(s.problem("odd")) < s.count_valid(s.problem("small"))
    with pytest.raises(SpaceError, match="unknown problem"):
        s.problem("nope")


def test_config_from_assignments(tmp_path):
    path = write(tmp_path, GOOD)
    s = space_mod.load(path)
    cfg = s.config_from_assignments(["vec=2", "block=128"])
    assert cfg["vec"] == 2 and cfg["block"] == 128
    with pytest.raises(SpaceError, match=r"--set tile: unknown parameter"):
        s.config_from_assignments(["tile=3"])
    with pytest.raises(SpaceError, match=r"value outside the space"):
        s.config_from_assignments(["vec=3"])
    with pytest.raises(SpaceError, match=r"not valid: constraint failed"):
        s.config_from_assignments(["stride=4", "vec=4"])


@pytest.mark.parametrize(
    "text, fault, line",
    [
        ("kernel: copy\nparams: [1, 2\n", "malformed YAML", 3),
        (GOOD + "colour: blue\n", "unknown top-level key 'colour'", 13),
        (GOOD.replace("items: [1, 2]", "items: []"), "parameter 'items' has no values", 7),
        (GOOD.replace("stride * vec <= 8", "stride * wibble <= 8"), "unknown symbol(s) wibble", 12),
        (GOOD.replace("stride * vec <= 8", "stride.real <= 8"), "attribute access is not allowed", 12),
        (GOOD.replace("stride * vec <= 8", "open('x') == 1"), "call of 'open' is not allowed", 12),
        (GOOD.replace("stride * vec <= 8", "'(lambda: 1)() == 1'"), "not allowed", 12),
        (GOOD.replace("stride * vec <= 8", "'[v for v in (1, 2)] == 1'"), "comprehension is not allowed", 12),
        (GOOD.replace("stride * vec <= 8", "__import__('os') == 1"), "not allowed", 12),
        (GOOD.replace("stride * vec <= 8", "import os"), "cannot parse", 12),
        (GOOD.replace("stride * vec <= 8", "stride > 100"), "no valid configs", None),
        (GOOD.replace("kernel: copy", "kernel: fft"), "unknown kernel 'fft'", 1),
        (GOOD.replace("dtype: float32", "dtype: int8"), "dtype 'int8' is not supported", 2),
        (GOOD.replace("block: {pow2: [64, 256]}", "block: {pow2: [64, 100]}"), "pow2 expects", 6),
        (GOOD + "objectives:\n  - speed: maximize\n", "unknown objective metric 'speed'", 14),
        (GOOD + "default: {vec: 3}\n", "default config is not valid", 13),
        ("- just\n- a list\n", "expected a mapping", 1),
    ],
)
def test_bad_spaces_name_file_line_and_fault(tmp_path, text, fault, line):
    path = write(tmp_path, text)
    with pytest.raises(SpaceError) as info:
        space_mod.load(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert fault in message, message
    assert "\n" not in message
    if line is not None:
        assert message.startswith(f"{path}:{line}:"), message


def test_missing_file(tmp_path):
    with pytest.raises(SpaceError, match="no such space file"):
        space_mod.load(tmp_path / "absent.yaml")


def test_expressions_whitelist():
    env = {"a": 7, "b": 2}
    assert Expr.parse("a // b + a % b")(env) == 4
    assert Expr.parse("min(a, b) < max(a, b) and not abs(-a) == 3")(env) is True
    assert Expr.parse("ceil_div(a, b)")(env) == 4
    assert Expr.parse("a if a > b else b")(env) == 7
    assert Expr.parse("a in (1, 7)")(env) is True
    assert Expr.parse("a * b").names == {"a", "b"}
    for bad in ("a.b", "f(a)", "lambda: 1", "[x for x in a]", "__class__", "a[0]", "min(a, key=b)", "(a := 1)"):
        with pytest.raises(ExprError):
            Expr.parse(bad)


def test_division_by_zero_is_an_invalid_config_not_a_crash(tmp_path):
    text = GOOD.replace("stride * vec <= 8", "8 // (stride - 1) >= 1")
    s = space_mod.load(write(tmp_path, text))
    assert all(c["stride"] != 1 for c in s.enumerate())
    assert "ZeroDivisionError" in s.validate({**s.default, "stride": 1})


@pytest.mark.parametrize("path", space_mod.shipped_spaces(), ids=lambda p: p.stem)
def test_shipped_spaces_load(path):
    s = space_mod.load(path)
    assert s.count_valid() > 0
    assert s.validate(s.default) is None
