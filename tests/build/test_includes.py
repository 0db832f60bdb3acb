"""Headers a kernel includes, compiled with real NVRTC (sm_90, no GPU): CUDA's own from the wheels, files beside
the template (and what editing one does to the cache), and the one line a missing include is."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tuner.build import compile as compile_mod
from tuner.build import includes
from tuner.build.render import Source, render
from tuner.core.errors import InputError
from tuner.space import space as space_mod

ROOT = Path(__file__).resolve().parents[2]

# The six headers a CUDA programmer reaches for, each one used (not only included).
SIX_HEADERS = """\
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cooperative_groups.h>
#include <cuda/pipeline>
#include <cuda/barrier>

namespace cg = cooperative_groups;

extern "C" __global__ void {{ entry }}(const float* src, float* dst, int n)
{
    __shared__ float tile[{{ block }}];
    __shared__ cuda::barrier<cuda::thread_scope_block> bar;
    auto block = cg::this_thread_block();
    auto pipe = cuda::make_pipeline();
    if (threadIdx.x == 0) init(&bar, blockDim.x);
    pipe.producer_acquire();
    cuda::memcpy_async(&tile[threadIdx.x], &src[threadIdx.x], sizeof(float), pipe);
    pipe.producer_commit();
    pipe.consumer_wait();
    block.sync();
    float v = tile[{{ block }} - 1 - threadIdx.x];
    pipe.consumer_release();
    bar.arrive_and_wait();
    __nv_bfloat16 b = __float2bfloat16(v);
    __half h = __float2half(v);
    __nv_fp8_e4m3 f = __nv_fp8_e4m3(v);
    dst[threadIdx.x] = __bfloat162float(b) + __half2float(h) + float(f);
}
"""

# A light kernel whose shared memory the header sizes: ptxas reports TILE * 4 bytes, so an edit shows.
USES_COMMON = """\
#include "common.cuh"

extern "C" __global__ void {{ entry }}(const float* src, float* dst, int n)
{
    __shared__ float tile[TILE];
    tile[threadIdx.x % TILE] = src[threadIdx.x];
    __syncthreads();
    dst[threadIdx.x] = tile[(threadIdx.x + 1) % TILE];
}
"""


def make_space(folder: Path, template: str, extra: str = "") -> Path:
    """A space of the copy family with a template of its own beside it, two configs."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mine.cu.j2").write_text(template)
    path = folder / "mine.yaml"
    path.write_text(
        "kernel: copy\n"
        "template: mine.cu.j2\n"
        "problem: {name: small, n: 4096, span: 1, dtype: float32}\n"
        "params: {stride: [1], vec: [1], block: [128, 256], items: [1]}\n" + extra
    )
    return path


def compile_default(path: Path):
    space = space_mod.load(path)
    problem = space.problem()
    source = render(space.family, space.default, space.resolve(space.default, problem), problem.env)
    return source, compile_mod.compile_source(source)


def test_cuda_header_folders_are_the_pathfinders():
    from cuda.pathfinder import find_nvidia_header_directory

    dirs = includes.system_include_dirs()
    # CUDA's own, then our answers to the C++ standard headers (CCCL's cuda/std under the standard names)
    assert dirs == (
        find_nvidia_header_directory("cudart"),
        find_nvidia_header_directory("cccl"),
        includes.std_header_dir(),
    )
    assert (Path(dirs[0]) / "cuda_fp8.h").is_file() and (Path(dirs[1]) / "cuda" / "pipeline").is_file()
    versions = compile_mod.versions()
    assert versions["cudart_headers"].startswith("13.") and versions["cccl_headers"].count(".") == 2


def test_the_six_cuda_headers_compile_for_sm_90(tmp_path):
    source, result = compile_default(make_space(tmp_path, SIX_HEADERS))
    assert result.ok, result.reason
    assert result.arch == "sm_90" and source.entry in result.functions
    assert result.registers > 0 and result.smem_static_bytes >= 128 * 4


def test_a_header_beside_the_template_is_found_and_its_edit_is_a_cache_miss(tmp_path):
    path = make_space(tmp_path, USES_COMMON)
    (tmp_path / "common.cuh").write_text("#pragma once\n#define TILE 64\n")
    source, first = compile_default(path)
    assert first.ok and first.smem_static_bytes == 64 * 4
    again = compile_mod.compile_source(source)
    assert again.cached and again.key == first.key

    (tmp_path / "common.cuh").write_text("#pragma once\n#define TILE 96\n")
    edited = compile_mod.compile_source(source)  # the same rendered text: only the header changed
    assert edited.ok and not edited.cached and edited.key != first.key
    assert edited.smem_static_bytes == 96 * 4


def test_local_includes_are_followed_transitively_and_only_local_ones_are_hashed(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "common.cuh").write_text('#include "sub/inner.cuh"\n#include <cuda_fp16.h>\n')
    (tmp_path / "sub" / "inner.cuh").write_text('#include "leaf.cuh"\n#include "common.cuh"\n')
    (tmp_path / "sub" / "leaf.cuh").write_text("#define LEAF 1\n")  # beside inner.cuh, not the template
    text = '#include "common.cuh"\n// #include "commented.cuh" is no include\n#include "not_here.cuh"\n'
    found = includes.local_includes(text, [str(tmp_path)], includes.system_include_dirs())
    assert [name for name, _ in found] == ["common.cuh", "sub/inner.cuh", "leaf.cuh"]  # each once, in order met
    (tmp_path / "sub" / "leaf.cuh").write_text("#define LEAF 2\n")
    assert includes.local_includes(text, [str(tmp_path)], includes.system_include_dirs()) != found


def test_a_quoted_include_is_not_looked_up_in_the_working_folder(tmp_path, monkeypatch):
    """NVRTC looks beside the main program first; the program is named in its template's folder, so a file of
    the same name in the process's working folder is never what a kernel gets."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "common.cuh").write_text("#define TILE 32\n")
    monkeypatch.chdir(work)
    source, result = compile_default(make_space(tmp_path / "space", USES_COMMON))
    assert not result.ok and "common.cuh" in result.reason
    assert includes.missing_include(result.details["log"]).name == "common.cuh"


def test_missing_include_is_read_from_both_forms_of_nvrtcs_message():
    """NVRTC says "could not open ... (no directories in search list)" without include folders and "cannot
    open" with them; another error is not a missing include."""
    body = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'
    bare = compile_mod.nvrtc_compile("#include <nowhere.h>\n" + body, "k.cu", ["--gpu-architecture=sm_90"])
    searched = compile_mod.nvrtc_compile(
        '#include "nowhere.h"\n' + body, "k.cu", ["--gpu-architecture=sm_90", f"-I{ROOT}"]
    )
    other = compile_mod.nvrtc_compile(body.replace("1.0f", "no_such_name"), "k.cu", ["--gpu-architecture=sm_90"])
    assert "no directories in search list" in bare[1] and "cannot open source file" in searched[1]
    assert includes.missing_include(bare[1]) == includes.MissingInclude("nowhere.h", "k.cu", 1)
    assert includes.missing_include(searched[1]) == includes.MissingInclude("nowhere.h", "k.cu", 1)
    assert other[0] != 0 and includes.missing_include(other[1]) is None


def test_a_missing_include_is_one_line_naming_template_include_and_folders(tmp_path, monkeypatch):
    import tuner

    path = make_space(tmp_path, "// mine\n" + USES_COMMON.replace("common.cuh", "commn.cuh"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as info:
        tuner.study(path, trials=2)  # a GPU study checks its space before any trial (and before any GPU is asked)
    assert not (tmp_path / "studies").exists()
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'mine.cu.j2'}:2: ")
    assert '#include "commn.cuh" not found' in message and "\n" not in message
    for folder in (str(tmp_path), *includes.system_include_dirs()):
        assert folder in message


def test_a_missing_include_in_a_local_header_names_the_header_and_its_line(tmp_path):
    path = make_space(tmp_path, USES_COMMON)
    (tmp_path / "common.cuh").write_text('#define TILE 64\n#include "deeper.cuh"\n')
    with pytest.raises(InputError) as info:
        compile_mod.check_includes(space_mod.load(path))
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'mine.cu.j2'}: ")
    assert '#include "deeper.cuh" in common.cuh:2 not found' in message


def test_tuner_check_says_a_missing_include_once_and_exits_2(tmp_path):
    path = make_space(tmp_path, USES_COMMON.replace("common.cuh", "commn.cuh"))
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "check", str(path), "--arch", "sm_90"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TUNER_CACHE_DIR": str(tmp_path / "cache")},
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "mine.cu.j2:1" in lines[0] and '"commn.cuh" not found' in lines[0] and proc.stdout == ""


def test_an_unwritable_cache_folder_compiles_without_the_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("TUNER_CACHE_DIR", str(blocker / "cache"))  # a folder under a file: never creatable
    source = Source(kernel="k", text='extern "C" __global__ void k() {}', entry="k", uri="k", template="")
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        result = compile_mod.compile_source(source)
    assert result.ok and not result.cached


def test_no_home_puts_the_cache_in_the_temporary_folder(monkeypatch):
    def no_home():
        raise RuntimeError("Could not determine home directory.")

    for name in ("TUNER_CACHE_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert str(compile_mod.cache_dir()).startswith(os.path.join(tempfile.gettempdir(), "tuner-"))


def test_the_kernels_import_nothing_from_the_compile_stage():
    """The include pre-flight belongs to the compile stage, called by `tuner check` and the API's study: the
    families (tuner/kernels/, a stage below it) never import it, at module level or inside a function."""
    import ast

    for path in sorted((ROOT / "tuner" / "kernels").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            assert "tuner.build.compile" not in names, f"{path.name}:{node.lineno} imports tuner.build.compile"
