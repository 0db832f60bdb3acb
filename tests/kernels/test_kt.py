"""A Kernel Tuner kernel runs as it is: a plain ``.cu`` file whose knobs arrive as ``#define`` lines, Kernel
Tuner's launch (block from block_size_x/y/z, grid = ceil(problem_size / grid_div)) and its restriction strings as
constraints. The example is examples/kt_kernel (a 2-D stencil); real NVRTC (sm_90), real spaces, real Optuna
against a synthetic replay recording, and on a GPU a short study.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.fakes import recorded_study
from tuner.build import compile as compile_mod
from tuner.build.render import render
from tuner.core.errors import InputError
from tuner.insight.ncu import kernel_regex
from tuner.space import space as space_mod

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kt_kernel"
SPACE = EXAMPLE / "stencil2d.yaml"
#: The example's restrictions as a Kernel Tuner user passes them to tune_kernel.
RESTRICTIONS = [
    "block_size_x*block_size_y >= 64",
    "block_size_x*block_size_y <= 512 and block_size_x*tile_size_x <= 512",
]


def tuner(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    # The checkout first, then whatever the caller's path already holds (a machine whose packages live in a
    # --target folder on PYTHONPATH, as on the GPU host).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def sources(space, problem=None):
    problem = problem or space.problem()
    for config in space.valid_configs(problem):
        yield config, render(space.family, config, space.resolve(config, problem), problem.env)


# ---------------------------------------------------------------------------------------------------------------
# the example: every config compiles, its source is the file behind its defines, its launch is Kernel Tuner's


def test_check_compiles_every_config_and_reads_its_registers(tmp_path):
    proc = tuner("check", str(SPACE), "--arch", "sm_90", "--json", "--jobs", "1", cwd=tmp_path)  # tests/README.md
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    space = space_mod.load(SPACE)
    assert summary["failed"] == 0 and summary["compiled"] == len(space.valid_configs(space.problem())) == 136
    assert all(r["registers"] > 0 and r["spill_bytes"] == 0 for r in summary["configs"])
    assert len({r["uri"] for r in summary["configs"]}) == 136
    assert list(tmp_path.iterdir()) == []  # check writes nothing


def test_the_restrictions_prune_as_kernel_tuner_evaluates_them():
    """The space's valid configs are those of the Cartesian product for which Python (as Kernel Tuner does)
    finds every restriction true."""
    space = space_mod.load(SPACE)
    assert [c.text for c in space.constraints] == RESTRICTIONS
    names = list(space.params)
    kept = [
        dict(zip(names, combo, strict=True))
        for combo in itertools.product(*space.params.values())
        if all(eval(r, {}, dict(zip(names, combo, strict=True))) for r in RESTRICTIONS)  # noqa: S307 - our literals
    ]
    assert space.valid_configs(space.problem()) == kept


def test_render_is_the_defines_then_the_file_unchanged(tmp_path):
    proc = tuner(
        "render",
        str(SPACE),
        "--set",
        "block_size_x=64",
        "--set",
        "tile_size_x=4",
        "--set",
        "tile_size_y=2",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    # the default's block_size_y is 2: grid = (8192 / (64 * 4), 8192 / (2 * 2))
    defines = (
        "#define grid_size_x 32\n#define grid_size_y 2048\n#define grid_size_z 1\n"
        "#define block_size_x 64\n#define block_size_y 2\n#define block_size_z 1\n"
        "#define tile_size_x 4\n#define tile_size_y 2\n#define kernel_tuner 1\n"
    )
    file_text = (EXAMPLE / "stencil2d.cu").read_text()
    assert proc.stdout == defines + 'extern "C" {\n#line 1\n' + file_text + "\n}\n"


def test_launch_follows_block_size_and_grid_div_on_any_size(tmp_path):
    work = tmp_path / "kt"
    shutil.copytree(EXAMPLE, work)
    text = (work / "stencil2d.yaml").read_text().replace("width: 8192, height: 8192", "width: 1000, height: 300")
    (work / "stencil2d.yaml").write_text(text)
    space = space_mod.load(work / "stencil2d.yaml")
    family, problem = space.family, space.problem()
    keys = set()
    for config, source in sources(space, problem):
        bx, by, tx, ty = (config[k] for k in ("block_size_x", "block_size_y", "tile_size_x", "tile_size_y"))
        (launch,) = family.launches(source.entry, space.resolve(config, problem), problem.env)
        assert launch.block == (bx, by, 1)
        assert launch.grid == (math.ceil(1000 / (bx * tx)), math.ceil(300 / (by * ty)), 1)
        assert launch.args == ("dst", "src", "width", "height")
        assert source.entry == "stencil2d" and source.uri.startswith("stencil2d_block_size_x")
        assert f"#define grid_size_x {launch.grid[0]}\n#define grid_size_y {launch.grid[1]}\n" in source.text
        keys.add(compile_mod.cache_key(source, (), "sm_90", {}))
    assert len(keys) == len(space.valid_configs(problem))  # one entry name, yet a cache key per config


def test_a_compiled_config_is_its_named_entry():
    space = space_mod.load(SPACE)
    problem = space.problem()
    source = render(space.family, space.default, space.resolve(space.default, problem), problem.env)
    compiled = compile_mod.compile_source(source, "sm_90")
    assert compiled.ok, compiled
    assert list(compiled.functions) == ["stencil2d"] and compiled.entry == "stencil2d"
    assert compiled.main.registers == compiled.registers > 0
    assert b".entry stencil2d(" in compiled.ptx  # unmangled: extern "C", as Kernel Tuner wraps it
    pattern = kernel_regex(source.entry).removeprefix("regex:")  # what ncu profiles for this config
    import re

    assert re.match(pattern, "stencil2d") and not re.match(pattern, source.uri)


# ---------------------------------------------------------------------------------------------------------------
# Kernel Tuner's defaults, a file with its own extern "C", NVRTC's lines are the file's

VECTOR_ADD = """\
__global__ void vector_add(float *c, float *a, float *b, int n) {
    int i = blockIdx.x * block_size_x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
    }
}
"""


def write_vector_add(folder: Path, params: str, launch: str, source: str = VECTOR_ADD, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vector_add.cu").write_text(source)
    path = folder / "vector_add.yaml"
    path.write_text(
        "kernel:\n"
        "  name: vector_add\n"
        "  arguments:\n"
        "    - {name: c, role: output, shape: [n]}\n"
        "    - {name: a, role: input, shape: [n]}\n"
        "    - {name: b, role: input, shape: [n]}\n"
        "    - {name: n, role: scalar, dtype: int32}\n"
        f"  launch: {launch}\n"
        "template: vector_add.cu\n"
        "problem: {name: n1M, n: 1000000}\n"
        f"params: {params}\n" + extra
    )
    return path


def default_launch(path: Path):
    space = space_mod.load(path)
    problem = space.problem()
    config = space.resolve(space.default, problem)
    source = render(space.family, space.default, config, problem.env)
    (launch,) = space.family.launches(source.entry, config, problem.env)
    return source, launch


@pytest.mark.parametrize(
    ("params", "launch", "block", "grid"),
    [
        # block_size_x tuned, no grid_div_x: Kernel Tuner divides by block_size_x
        ("{block_size_x: [128]}", "{problem_size: n}", (128, 1, 1), (7813, 1, 1)),
        # not tuned: block 256, 1, 1, and the grid divisor 1 (Kernel Tuner's params.get(block_size_x, 1))
        ("{unroll: [1]}", "{problem_size: [n]}", (256, 1, 1), (1000000, 1, 1)),
        ("{unroll: [1]}", "{problem_size: [n], grid_div_x: [256]}", (256, 1, 1), (3907, 1, 1)),
        # an empty divisor list divides by 1; a block given is the launch's, and its defines
        ("{block_size_x: [64]}", "{problem_size: [n], grid_div_x: []}", (64, 1, 1), (1000000, 1, 1)),
        (
            "{threads: [32]}",
            "{problem_size: [n], grid_div_x: [threads], block: [threads, 2]}",
            (32, 2, 1),
            (31250, 1, 1),
        ),
        ("{block_size_x: [64], block_size_y: [4]}", "{problem_size: [n, 8]}", (64, 4, 1), (15625, 2, 1)),
    ],
)
def test_kernel_tuner_defaults_for_block_and_grid(tmp_path, params, launch, block, grid):
    source, got = default_launch(write_vector_add(tmp_path, params, launch))
    assert (got.block, got.grid) == (block, grid)
    assert f"#define block_size_x {block[0]}\n#define block_size_y {block[1]}\n" in source.text
    compiled = compile_mod.compile_source(source, "sm_90")
    assert compiled.ok and list(compiled.functions) == ["vector_add"], compiled


def test_a_file_with_its_own_extern_c_is_not_wrapped_again(tmp_path):
    own = 'extern "C" ' + VECTOR_ADD
    source, _ = default_launch(write_vector_add(tmp_path, "{block_size_x: [128]}", "{problem_size: n}", own))
    assert source.text.endswith("#define kernel_tuner 1\n#line 1\n" + own)
    assert compile_mod.compile_source(source, "sm_90").ok


def test_nvrtc_names_the_files_own_line(tmp_path):
    broken = VECTOR_ADD.replace("c[i] = a[i] + b[i];", "c[i] = a[i] + d[i];")  # line 4 of the file
    source, _ = default_launch(write_vector_add(tmp_path, "{block_size_x: [128]}", "{problem_size: n}", broken))
    failed = compile_mod.compile_source(source, "sm_90")
    assert not failed.ok and f"{source.uri}.cu(4): error" in failed.details["log"], failed.details["log"]


def test_bools_and_floats_are_c_literals(tmp_path):
    source, _ = default_launch(
        write_vector_add(
            tmp_path, "{block_size_x: [128], fast: [true]}", "{problem_size: n}", extra="derived: {scale: fast / 4}\n"
        )
    )
    assert "#define fast 1\n#define scale 0.25\n#define kernel_tuner 1\n" in source.text


# ---------------------------------------------------------------------------------------------------------------
# bad input: one line naming the file (and line), exit 2

BAD = {
    "no such __global__": (
        {"params": "{block_size_x: [128]}", "source": VECTOR_ADD.replace("vector_add(", "vadd(")},
        r"vector_add\.cu: no __global__ function 'vector_add' \(the kernel's name, Kernel Tuner's kernel_name\); "
        r"it has vadd",
    ),
    "a Jinja template named .cu": (
        {"params": "{block_size_x: [128]}", "source": 'extern "C" __global__ void {{ entry }}(float* c) {}'},
        r"vector_add\.cu: no __global__ function 'vector_add' .*; it has none \(a Jinja2 template's name ends in "
        r"\.j2\)",
    ),
    "a define name that is not C": (
        {"params": "{block_size_x: [128], größe: [1]}"},
        r"vector_add\.yaml:11: parameter name 'größe' is not a C identifier",
    ),
    "a derived value tuner defines": (
        {"params": "{block_size_x: [128]}", "extra": "derived: {kernel_tuner: 2}\n"},
        r"vector_add\.yaml:12: derived value 'kernel_tuner' is #defined by tuner itself",
    ),
    "an unparsable restriction": (
        {
            "params": "{block_size_x: [128, 256]}",
            "extra": "constraints:\n  - block_size_x >= 64\n  - block_size_x <=> 512\n",
        },
        r"vector_add\.yaml:14: constraints: cannot parse 'block_size_x <=> 512': invalid syntax",
    ),
    "a restriction outside the language": (
        {"params": "{block_size_x: [128]}", "extra": "constraints: np.prod([block_size_x]) <= 1024\n"},
        r"vector_add\.yaml:12: constraints: call of 'np\.prod' is not allowed",
    ),
    "a restriction naming no param": (
        {"params": "{block_size_x: [128]}", "extra": "constraints: [block_size_x * tile_size_x <= 1024]\n"},
        r"vector_add\.yaml:12: 'block_size_x \* tile_size_x <= 1024' names unknown symbol\(s\) tile_size_x",
    ),
    "grid and problem_size": (
        {"launch": "{problem_size: n, grid: [n], block: [128]}"},
        r"vector_add\.yaml:8: kernel: launch: either grid or problem_size",
    ),
    "grid_div without problem_size": (
        {"launch": "{grid: [n], block: [128], grid_div_x: [block_size_x]}"},
        r"vector_add\.yaml:8: kernel: launch: grid_div_x divides problem_size, which the launch lacks",
    ),
    "a problem_size of four dims": (
        {"launch": "{problem_size: [n, 1, 1, 1]}"},
        r"vector_add\.yaml:8: kernel: launch: problem_size: expected 1 to 3 expressions",
    ),
    "a block size that is no size": (
        {"params": "{block_size_x: [wide]}"},
        r"vector_add\.yaml:8: kernel: launch: the block is block_size_x/y/z, but block_size_x='wide'",
    ),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_is_one_line_exit_2(tmp_path, case):
    import re

    given, pattern = BAD[case]
    path = write_vector_add(
        tmp_path,
        given.get("params", "{block_size_x: [128]}"),
        given.get("launch", "{problem_size: n}"),
        given.get("source", VECTOR_ADD),
        given.get("extra", ""),
    )
    with pytest.raises(InputError) as info:
        space_mod.load(path)
    assert re.search(pattern, str(info.value)), str(info.value)
    proc = tuner("check", str(path), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert re.search(pattern, line), line


def test_one_restriction_string_is_a_constraint(tmp_path):
    path = write_vector_add(
        tmp_path,
        "{block_size_x: [32, 64, 128, 256]}",
        "{problem_size: n}",
        extra="constraints: block_size_x >= 64 and not block_size_x == 128\n",
    )
    space = space_mod.load(path)
    assert [c["block_size_x"] for c in space.valid_configs(space.problem())] == [64, 256]


# ---------------------------------------------------------------------------------------------------------------
# through a study (answered from a synthetic recording) to the exported header


def record(space_file: Path, db: Path) -> int:
    """One COMPLETE trial per valid config with made-up times (more points per thread is faster)."""
    space = space_mod.load(space_file)
    dists = {name: optuna.distributions.CategoricalDistribution(values) for name, values in space.params.items()}
    configs = space.valid_configs(space.problem())
    trials = []
    for config in configs:
        ms = 1.0 / (config["tile_size_x"] * config["tile_size_y"]) + 1e-3 * config["block_size_x"]
        tbps = (2 << 28) / ms / 1e9
        attrs = {
            **dict.fromkeys(("p20_ms", "p80_ms", "median_ms"), ms),
            **dict(repetitions=10, bytes_moved=2 << 28, flops=0, tbps=tbps, tflops=0.0, ceiling_tbps=4.0),
            **dict(fraction_of_ceiling=tbps / 4.0, registers=24, smem_static_bytes=0, smem_dynamic_bytes=0),
            **dict(spill_bytes=0, gpu="synthetic"),
        }
        trials.append(optuna.trial.create_trial(params=config, distributions=dists, values=[tbps], user_attrs=attrs))
    recorded_study(f"sqlite:///{db}", trials)
    return len(configs)


def test_a_replayed_study_exports_the_fixed_entry(tmp_path):
    work = tmp_path / "kt"
    shutil.copytree(EXAMPLE, work)
    assert record(work / "stencil2d.yaml", tmp_path / "rec.db") == 136
    replay = ("--replay", str(tmp_path / "rec.db"), "--seed", "2", "--json")
    proc = tuner("study", "stencil2d.yaml", "--trials", "20", *replay, cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["trials"] == 20
    for flags in ((), ("--with-source",)):  # the entry from the rendered source, and without one
        proc = tuner("export", "stencil2d", "--header", "tuned.h", "--pick", "pareto", *flags, cwd=work)
        assert proc.returncode == 0, proc.stderr[-3000:]
        header = (work / "tuned.h").read_text()
        assert '{"stencil2d", {' in header and '"stencil2d_block_size_x' in header
        assert "_block_size_x" not in header.split('{"stencil2d", {')[1].split("}")[0]
    assert "#define kernel_tuner 1" in header


# ---------------------------------------------------------------------------------------------------------------
# on a GPU: the example verifies against ref.py, and a short study runs on it


def _have_gpu() -> bool:
    from tests.gpu.test_evaluator_gpu import HAVE_GPU

    return HAVE_GPU


@pytest.mark.gpu
def test_the_example_verifies_and_times_on_the_gpu():
    if not _have_gpu():
        pytest.skip("needs a CUDA GPU")
    from tuner.gpu.evaluate import evaluate_config

    result = evaluate_config(SPACE, {"block_size_x": 64, "block_size_y": 4, "tile_size_x": 2, "tile_size_y": 4})
    assert result.ok, result
    assert result.bytes_moved == 2 * 4 * 8192 * 8192  # src read once, dst written once
    assert result.registers > 0 and result.median_ms > 0


@pytest.mark.gpu
def test_a_short_study_on_the_gpu(tmp_path):
    if not _have_gpu():
        pytest.skip("needs a CUDA GPU")
    work = tmp_path / "kt"
    shutil.copytree(EXAMPLE, work)
    proc = tuner("study", "stencil2d.yaml", "--trials", "12", "--seed", "1", "--json", cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["trials"] == 12
    url = f"sqlite:///{work}/studies/stencil2d.db"
    (name,) = [s.study_name for s in optuna.get_all_study_summaries(url)]
    trials = optuna.load_study(study_name=name, storage=url).trials
    failures = [t.user_attrs.get("failure") for t in trials if t.user_attrs.get("failure")]
    assert "wrong_result" not in failures and "compile_failed" not in failures, failures
    measured = [t for t in trials if t.state.name == "COMPLETE" and "tbps" in t.user_attrs]
    assert len(measured) >= 8
    assert all(t.user_attrs["uri"].startswith("stencil2d_block_size_x") for t in measured)
    best = max(t.user_attrs["fraction_of_ceiling"] for t in measured)
    assert 0.3 < best < 1.2, best  # a memory-bound stencil near the copy ceiling, not a broken timer
