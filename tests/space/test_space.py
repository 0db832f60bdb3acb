"""Search spaces: loading, expressions in a space, enumeration and every bad-input case (file and line in the
message); the expression language alone: tests/expr/."""

from __future__ import annotations

import textwrap

import pytest

from tuner.build import render
from tuner.core.errors import SpaceError
from tuner.space import space as space_mod

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


def test_config_from_assignments_takes_uri_short_names():
    """A config written back from its kernel URI: the family's short names stand for the params."""
    gemv = space_mod.load("gemv")
    problem = gemv.problem("m64")
    text = "mma=4,sk=2,t=128,kw=1,rw=16,u=4,pf=0,wc=na,st=3,cl=1"
    cfg = gemv.config_from_assignments(text.split(","), problem)
    assert (cfg["split_k"], cfg["threads"], cfg["stages"], cfg["cluster"], cfg["w_cache"]) == (2, 128, 3, 1, "na")
    assert render.uri(gemv.family, cfg) == "gemv_mma4_sk2_t128_kw1_rw16_mt64_v8_u4_pf0_wcna_lb1_st3_cl1"
    with pytest.raises(SpaceError, match=r"--set zz: unknown parameter"):
        gemv.config_from_assignments(["zz=1"], problem)


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
        (
            GOOD.replace("stride * vec <= 8", "block <= 1024and items > 0"),
            "cannot parse 'block <= 1024and items > 0': invalid decimal literal",
            12,
        ),
        (GOOD.replace("per_block: block * items * vec", "per_block: \"'\\\\d' and block\""), "invalid escape", 9),
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


@pytest.mark.parametrize("command", ["render", "check"])
def test_a_parser_warning_in_an_expression_is_one_line_naming_the_file(tmp_path, command):
    """Python warns of ``1024and`` (a number run into a keyword) on stderr, naming no file (``<unknown>:1:
    SyntaxWarning``); the space refuses the expression instead: one line with the file, the line and the
    expression, exit 2."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = write(tmp_path, GOOD.replace("stride * vec <= 8", "block <= 1024and items > 0"))
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", command, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root), "PYTHONWARNINGS": "default"},
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"tuner: error: {path}:12: constraints: cannot parse 'block <= 1024and items > 0': invalid decimal literal"
    ]


def test_missing_file(tmp_path):
    with pytest.raises(SpaceError, match="no such space file"):
        space_mod.load(tmp_path / "absent.yaml")


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


# ---------------------------------------------------------------------------------------------------------------
# listing the valid set over arrays: the same configs, in the same order, as the config-by-config walk


def _walked(space, problem):
    """The valid set as `enumerate` walks it, as rows of positions (what valid_positions must equal)."""
    import numpy as np

    pairs = [(n, {v: i for i, v in enumerate(vals)}) for n, vals in space.params.items()]
    flat = [pos[c[n]] for c in space.enumerate(problem) for n, pos in pairs]
    return np.array(flat, dtype=np.int16).reshape(-1, len(pairs))


@pytest.mark.parametrize("path", space_mod.shipped_spaces(), ids=lambda p: p.stem)
def test_shipped_spaces_list_over_arrays_exactly_as_walked(path):
    import numpy as np

    space = space_mod.load(path)
    for problem in space.problems:
        # the array path itself (valid_positions would quietly walk where the arrays cannot)
        listed = space._positions_over_arrays(problem, space_mod.WALK_BUDGET)
        assert np.array_equal(listed, _walked(space, problem)), problem.name


EDGES = """\
kernel: copy
problem: {name: small, n: 4096, big: 1099511627776, dtype: float32}
params:
  a: [0, 1, 2, 3, 4, 8]
  b: [0, 1, 2, 4, 16]
  f: [0.5, 1.0, 2.5]
  s: [x, y]
  flag: [false, true]
derived:
  q: n // b if b else -1
  r: n / a
  m: min(a, b) + max(a, b, 1) + abs(a - b) + ceil_div(n, a)
  t: "(a, b)"
constraints:
  - a == 0 or n % a == 0
  - 0 <= b < 16 or b * a > 40
  - b in (0, a, 4)
  - s == 'x' or flag
  - not flag or is_pow2(a)
  - r * f > 100 or f == 0.5
  - q != 3 and m >= 0
  - (s == 'y') <= (a + b * 2 > 3 if dtype == 'float32' else a < 2)
"""


def test_array_listing_keeps_python_semantics(tmp_path):
    """Division by zero rules a config out (only where Python would divide), `or`/`and` and chained comparisons
    stop where Python stops, membership in a tuple of per-config values, strings, floats and booleans."""
    import numpy as np

    space = space_mod.load(write(tmp_path, EDGES))
    walked = _walked(space, space.problems[0])
    assert 0 < len(walked) < space.cartesian
    assert np.array_equal(space._positions_over_arrays(space.problems[0], None), walked)


def test_array_listing_hands_back_what_it_cannot_do_exactly(tmp_path):
    """Integers past 2**53 (Python's are unbounded, int64 wraps) and powers go back to the walk, with its result."""
    import numpy as np

    from tuner.expr.arrays import NotVectorizable

    text = EDGES.replace("  - q != 3 and m >= 0\n", "  - q != 3 and m >= 0\n  - big * big * a >= 0\n  - a ** 2 < 50\n")
    space = space_mod.load(write(tmp_path, text))
    with pytest.raises(NotVectorizable):
        space._positions_over_arrays(space.problems[0], None)
    assert np.array_equal(space.valid_positions(), _walked(space, space.problems[0]))


def test_array_listing_runs_out_of_budget_where_the_walk_does(tmp_path):
    space = space_mod.load(write(tmp_path, GOOD))

    def completes(list_it, budget):
        try:
            list_it(budget)
        except space_mod.WalkBudgetExceeded:
            return False
        return True

    walks = [completes(lambda b: list(space.enumerate(budget=b)), b) for b in range(1, 120)]
    assert not walks[0] and walks[-1]  # the walk needs more than 1 partial config, and fewer than 120
    assert [completes(lambda b: space.valid_positions(budget=b), b) for b in range(1, 120)] == walks


def test_shipped_files_are_found_where_they_are_and_not_in_an_empty_leftover_folder(tmp_path, monkeypatch):
    """A wheel holds them inside the package; a source tree at its top, even beside an empty tuner/templates that
    an older checkout (or a copy that dropped files but kept folders) left behind."""
    from tuner.core import shipped

    package = tmp_path / "tuner"
    (package / "templates").mkdir(parents=True)
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "gemm.cu.j2").write_text("// top\n")
    monkeypatch.setattr(shipped, "PACKAGE", package)
    assert shipped.shipped_dir("templates") == tmp_path / "templates"
    (package / "templates" / "gemm.cu.j2").write_text("// packaged\n")
    assert shipped.shipped_dir("templates") == package / "templates"
