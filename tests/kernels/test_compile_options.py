"""A space's ``compile_options:``: the known list, the one-line refusals naming file and line, and the options
reaching NVRTC (real compiles, sm_90) and the cache key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.build import compile as compile_mod
from tuner.build.render import render
from tuner.core.errors import SpaceError
from tuner.kernels import compile_options
from tuner.space import space as space_mod

SIZED = """\
#include "sizes.cuh"
extern "C" __global__ void {{ entry }}(const float* src, float* dst, int n)
{
    __shared__ float tile[SCALE * 32];
    tile[threadIdx.x % (SCALE * 32)] = src[threadIdx.x];
    __syncthreads();
    dst[threadIdx.x] = tile[(threadIdx.x + 1) % (SCALE * 32)];
}
"""

# 96 accumulators live across a loop: far more than 32 registers unless ptxas is told otherwise.
HUNGRY = """\
extern "C" __global__ void {{ entry }}(const float* src, float* dst, int n)
{
    float acc[96];
#pragma unroll
    for (int i = 0; i < 96; ++i) acc[i] = src[i * n + threadIdx.x];
    for (int j = 0; j < n; ++j) {
#pragma unroll
        for (int i = 0; i < 96; ++i) acc[i] = acc[i] * acc[(i + 1) % 96] + src[j];
    }
    float s = 0;
#pragma unroll
    for (int i = 0; i < 96; ++i) s += acc[i];
    dst[threadIdx.x] = s;
}
"""


def make_space(folder: Path, options: list[str] | str, template: str = SIZED) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mine.cu.j2").write_text(template)
    listed = options if isinstance(options, str) else "".join(f"  - {o!r}\n" for o in options)
    path = folder / "mine.yaml"
    path.write_text(
        "kernel: copy\n"
        "template: mine.cu.j2\n"
        "problem: {name: small, n: 4096, span: 1, dtype: float32}\n"
        "params: {stride: [1], vec: [1], block: [128], items: [1]}\n"
        "compile_options:\n" + listed
    )
    return path


def compiled(path: Path):
    space = space_mod.load(path)
    problem = space.problem()
    source = render(space.family, space.default, space.resolve(space.default, problem), problem.env)
    return source, compile_mod.compile_source(source)


def _fail(message, *keys):
    return SpaceError(message, "s.yaml", 7)


@pytest.mark.parametrize(
    ("given", "passed"),
    [
        ("-DSCALE", "-DSCALE"),
        ("-DSCALE=3", "-DSCALE=3"),
        ("--define-macro=EPS=1e-5f", "-DEPS=1e-5f"),
        ("-DMODE=fast", "-DMODE=fast"),
        ("-DMASK=0xffu", "-DMASK=0xffu"),
        ("-UNDEBUG", "-UNDEBUG"),
        ("-use_fast_math", "--use_fast_math"),
        ("--use_fast_math", "--use_fast_math"),
        ("-extra-device-vectorization", "--extra-device-vectorization"),
        ("-restrict", "--restrict"),
        ("-maxrregcount=32", "--maxrregcount=32"),
        ("--maxrregcount=255", "--maxrregcount=255"),
        ("-ftz=true", "--ftz=true"),
        ("--prec-div=false", "--prec-div=false"),
        ("-prec-sqrt=false", "--prec-sqrt=false"),
        ("-fmad=false", "--fmad=false"),
        ("-std=c++20", "--std=c++20"),
    ],
)
def test_known_options_pass_in_their_long_spelling(given, passed):
    assert compile_options.parse([given], Path("."), _fail).options == (passed,)


def test_lineinfo_is_passed_on_once_whatever_its_spelling():
    """Line tables are off by default (`tuner.build.compile.BASE_OPTIONS`): a space that asks gets them."""
    assert compile_options.parse(["-lineinfo"], Path("."), _fail).options == ("-lineinfo",)
    assert compile_options.parse(["--generate-line-info"], Path("."), _fail).options == ("-lineinfo",)


@pytest.mark.parametrize(
    ("options", "fragment", "line"),
    [
        (["-G"], "refused: builds unoptimized debug code", 6),
        (["--gpu-architecture=sm_80"], "refused: the tuner compiles for the GPU", 6),
        (["-arch sm_80"], "refused", 6),
        (["-Xptxas=-O0"], "unknown or unsupported option '-Xptxas=-O0'", 6),
        (["--use_fast_math", "-include evil.h"], "unknown or unsupported option '-include evil.h'", 7),
        (["-DX=(1+2)"], "the value '(1+2)' is not an identifier or a number", 6),
        (['-DX="a b"'], "is not an identifier or a number", 6),
        (["-D1X=2"], "the macro name '1X' is not an identifier", 6),
        (["-maxrregcount=0"], "--maxrregcount takes a register count", 6),
        (["-maxrregcount=256"], "--maxrregcount takes a register count", 6),
        (["-ftz=yes"], "--ftz takes true or false", 6),
        (["-std=c++14"], "--std takes c++17 or c++20", 6),
        (["-DTILE=4", "-DTILE=8"], "macro TILE is given twice", 7),
        (["-ftz=true", "--ftz=false"], "--ftz is given twice", 7),
        (["-I", "inc"], "name the folder in the same item", 6),
        (["-I ../outside"], "is outside the space's folder", 6),
        (["-I/etc"], "is outside the space's folder", 6),
        (["-I no_such_folder"], "no such folder", 6),
        ("  - 3\n", "3 is not an option", 6),
        ("  {a: 1}\n", "must be a list of NVRTC options", 5),
    ],
)
def test_bad_options_are_a_space_error_naming_file_and_line(tmp_path, options, fragment, line):
    """One line, ``FILE:LINE: ...``, with the line of the option at fault (the key's, for a value that is no
    list); nothing is compiled."""
    path = make_space(tmp_path / "space", options)
    (tmp_path / "outside").mkdir()
    with pytest.raises(SpaceError) as info:
        space_mod.load(path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: ") and fragment in message and "\n" not in message


def test_a_symlink_out_of_the_space_folder_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    path = make_space(tmp_path / "space", ["-I inc"])
    (tmp_path / "space" / "inc").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SpaceError, match="outside the space's folder"):
        space_mod.load(path)


def test_a_define_reaches_nvrtc_and_the_cache_key(tmp_path):
    """-DSCALE sizes the shared tile, so ptxas's report shows which value NVRTC got; the header comes through
    an -I folder of the space."""
    (tmp_path / "three" / "inc").mkdir(parents=True)
    (tmp_path / "three" / "inc" / "sizes.cuh").write_text("#ifndef SCALE\n#define SCALE 1\n#endif\n")
    three_source, three = compiled(make_space(tmp_path / "three", ["-DSCALE=3", "-I inc"]))
    assert three.ok and three.smem_static_bytes == 3 * 32 * 4
    assert three_source.options == ("-DSCALE=3",)
    assert three_source.include_dirs == (str(tmp_path / "three"), str(tmp_path / "three" / "inc"))

    (tmp_path / "four" / "inc").mkdir(parents=True)
    (tmp_path / "four" / "inc" / "sizes.cuh").write_text((tmp_path / "three" / "inc" / "sizes.cuh").read_text())
    four_source, four = compiled(make_space(tmp_path / "four", ["-DSCALE=4", "-I inc"]))
    assert four_source.text == three_source.text  # the same rendered source: only the option differs
    assert four.ok and four.smem_static_bytes == 4 * 32 * 4 and four.key != three.key


def test_maxrregcount_caps_the_registers_ptxas_reports(tmp_path):
    _, free = compiled(make_space(tmp_path / "free", ["-DUNUSED"], template=HUNGRY))
    _, capped = compiled(make_space(tmp_path / "capped", ["-maxrregcount=32"], template=HUNGRY))
    assert free.ok and capped.ok
    assert free.registers > 32 >= capped.registers and capped.spill_bytes > 0
