"""Kernels declared in a space's ``kernel:`` block: arrays of every dtype, how each input is made, in-place
arguments, several launches, a reference imported only where it runs, and the C++ headers a CUDA programmer
includes. Real NVRTC (sm_90), the real space loader and CLI; the GPU-side draws carry ``@pytest.mark.gpu``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tuner.kernels import declared, usercode
from tuner.kernels.base import ReferenceFailed
from tuner.kernels.custom import check_reference
from tuner.space import space as space_mod

ROOT = Path(__file__).resolve().parents[2]


def tuner(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def write(directory: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (directory / name).write_text(text)


# ---------------------------------------------------------------------------------------------------------------
# a gather over int32 ids, with an in-place accumulator, a bool mask and every other integer dtype

GATHER = """\
kernel:
  name: gather
  arguments:
    - {name: table, role: input, shape: [vocab, dim]}
    - {name: ids, role: input, dtype: int, shape: [tokens], init: {kind: integers, low: 0, high: vocab}}
    - {name: order, role: input, dtype: unsigned int, shape: [tokens], init: {kind: permutation, size: tokens}}
    - {name: keep, role: input, dtype: bool, shape: [tokens]}
    - {name: out, role: output, shape: [tokens, dim]}
    - {name: hits, role: inout, dtype: float, shape: [tokens], init: {kind: constant, value: 2}}
    - {name: tokens, role: scalar, dtype: int64_t}
    - {name: dim, role: scalar, dtype: int}
  launch: {grid: [tokens], block: [block]}
  reference: ref.py:gather
template: gather.cu.j2
problem: {name: p, vocab: 1000, dim: 64, tokens: 256, dtype: float32}
params: {block: [64, 128]}
"""
GATHER_TEMPLATE = """\
extern "C" __global__ void {{ entry }}(const float* table, const int* ids, const unsigned int* order,
                                       const bool* keep, float* out, float* hits, long long tokens, int dim)
{
    long long t = blockIdx.x;
    for (int c = threadIdx.x; c < dim; c += {{ block }}) out[t * dim + c] = table[(long long)ids[t] * dim + c];
    if (threadIdx.x == 0) hits[t] += keep[t] ? 1.0f : 0.5f;
}
"""
GATHER_REF = """\
import numpy as np

def gather(table, ids, order, keep, hits, tokens, dim):
    assert ids.dtype == np.int32 and order.dtype == np.uint32 and keep.dtype == np.bool_
    hits += 100.0  # a reference that writes its in-place argument: the kernel's input must not see it
    return {"out": table[ids], "hits": hits - 100.0 + np.where(keep, 1.0, 0.5)}
"""


@pytest.fixture
def gather(tmp_path):
    write(tmp_path, {"gather.yaml": GATHER, "gather.cu.j2": GATHER_TEMPLATE, "ref.py": GATHER_REF})
    return tmp_path


def test_every_dtype_by_name_or_cuda_type():
    for name in declared.ARRAY_DTYPES:
        assert declared.array_dtype(name) == name
    spelled = {
        "int": "int32",
        "int64_t": "int64",
        "uint8_t": "uint8",
        "unsigned  int": "uint32",
        "std::uint32_t": "uint32",
        "cuda::std::int16_t": "int16",
        "unsigned long long": "uint64",
        "signed char": "int8",
        "__nv_bfloat16": "bfloat16",
        "__half": "float16",
        "bool": "bool",
    }
    for text, dtype in spelled.items():
        assert declared.array_dtype(text) == dtype, text
    assert declared.array_dtype("int128_t") is None
    for dtype, size in declared.ARRAY_DTYPES.items():
        assert declared.storage(dtype).itemsize == size


def test_a_gather_with_int32_ids_loads_draws_and_checks_its_reference(gather):
    space = space_mod.load(gather / "gather.yaml")
    family, env = space.family, space.problem().env
    assert family.checked() == ("out", "hits")
    inputs = family.inputs(np, env, np.random.default_rng(7))
    dtypes = {name: inputs[name].dtype for name in ("table", "ids", "order", "keep", "hits")}
    assert dtypes == {
        "table": np.float32,
        "ids": np.int32,
        "order": np.uint32,
        "keep": np.bool_,
        "hits": np.float32,
    }
    assert inputs["ids"].min() >= 0 and inputs["ids"].max() < 1000
    assert sorted(inputs["order"].tolist()) == list(range(256))
    assert (inputs["hits"] == 2).all() and inputs["keep"].any() and not inputs["keep"].all()
    before = inputs["hits"].copy()
    expected = family.reference(np, inputs, env)
    assert (inputs["hits"] == before).all()  # the reference worked on its own copy of the in-place argument
    np.testing.assert_array_equal(expected["out"], inputs["table"][inputs["ids"]])
    np.testing.assert_array_equal(expected["hits"], before + np.where(inputs["keep"], 1.0, 0.5))
    # bytes: each input read once, out written once, hits read and written
    assert family.bytes_moved(env) == 4 * 1000 * 64 + 4 * 256 + 4 * 256 + 256 + 4 * 256 * 64 + 2 * 4 * 256
    check_reference(space)


def test_the_same_seed_gives_the_same_arrays(gather):
    family, env = (space := space_mod.load(gather / "gather.yaml")).family, space.problem().env
    first = family.inputs(np, env, np.random.default_rng(3))
    again = family.inputs(np, env, np.random.default_rng(3))
    other = family.inputs(np, env, np.random.default_rng(4))
    for name in ("table", "ids", "order", "keep"):
        np.testing.assert_array_equal(first[name], again[name])
    assert not np.array_equal(first["ids"], other["ids"])


def test_the_gather_compiles_every_config(gather):
    proc = tuner("check", "gather.yaml", "--arch", "sm_90", "--json", cwd=gather)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["compiled"] == 2


INIT_KINDS = {
    "{kind: normal, mean: 5, scale: 0.5}": ("float32", lambda a: abs(a.mean() - 5) < 0.05 and 0.4 < a.std() < 0.6),
    "{kind: uniform, low: -2, high: n}": ("float64", lambda a: a.min() >= -2 and a.max() < 4096 and a.std() > 100),
    "{kind: integers, low: -128, high: 128}": ("int8", lambda a: a.min() == -128 and a.max() == 127),
    "{kind: permutation}": ("int64", lambda a: sorted(a.ravel().tolist()) == list(range(4096))),
    "{kind: permutation, size: n * 4}": ("uint16", lambda a: len(set(a.ravel().tolist())) == 4096),
    "{kind: arange, start: 3, step: 2}": ("int32", lambda a: (a.ravel() == 3 + 2 * np.arange(4096)).all()),
    "zeros": ("uint64", lambda a: (a == 0).all()),
    "ones": ("float16", lambda a: (a == 1).all()),
    "{kind: constant, value: -7}": ("int16", lambda a: (a == -7).all()),
    "{kind: constant, value: true}": ("bool", lambda a: a.all()),
    "{kind: normal, scale: 2}": ("__nv_bfloat16", lambda a: 1.8 < declared.bf16.decode(np, a).std() < 2.2),
    "gen.py:ramp": ("uint8", lambda a: (a.ravel() == np.arange(4096) % 256).all()),
}
INIT_SPACE = """\
kernel:
  name: fill
  arguments:
    - {{name: x, role: input, dtype: {dtype}, shape: [64, "n // 64"], init: {init}}}
    - {{name: y, role: output, shape: [n]}}
  launch: {{grid: [1], block: [block]}}
template: fill.cu.j2
problem: {{name: p, n: 4096, dtype: float32}}
params: {{block: [64]}}
"""
GEN = "def ramp(xp, rng, shape, dtype, problem):\n    return xp.arange(problem['n']).reshape(shape) % 256\n"


@pytest.mark.parametrize("init", sorted(INIT_KINDS))
def test_each_init_kind_makes_what_it_says(tmp_path, init):
    dtype, holds = INIT_KINDS[init]
    write(tmp_path, {"k.yaml": INIT_SPACE.format(dtype=dtype, init=init), "fill.cu.j2": "", "gen.py": GEN})
    space = space_mod.load(tmp_path / "k.yaml")
    x = space.family.inputs(np, space.problem().env, np.random.default_rng(0))["x"]
    assert x.shape == (64, 64) and x.dtype == declared.storage(declared.array_dtype(dtype))
    assert holds(x), x


# ---------------------------------------------------------------------------------------------------------------
# bad input: one line naming the file and line, exit 2, nothing written

BAD = {
    "unknown init kind": (
        GATHER.replace("init: {kind: constant, value: 2}", "init: {kind: gaussian}"),
        r"gather\.yaml:9: kernel: init: unknown kind 'gaussian'",
    ),
    "empty range": (
        GATHER.replace("low: 0, high: vocab", "low: vocab, high: vocab"),
        r"gather\.yaml:5: kernel: init integers of 'ids' \(int32\) on problem 'p': the range \[1000, 1000\) is empty",
    ),
    "range out of the dtype": (
        GATHER.replace(
            "dtype: int, shape: [tokens], init: {kind: integers",
            "dtype: int8_t, shape: [tokens], init: {kind: integers",
        ),
        r"gather\.yaml:5: .*gives 999, outside int8 \(-128\.\.127\)",
    ),
    "permutation out of the dtype": (
        GATHER.replace("dtype: unsigned int, shape: [tokens]", "dtype: int8, shape: [tokens]"),
        r"gather\.yaml:6: kernel: init permutation of 'order' \(int8\).* gives 255, outside int8",
    ),
    "permutation too small": (
        GATHER.replace("size: tokens}", "size: 10}"),
        r"gather\.yaml:6: .*a permutation of 10 values cannot fill 256 elements",
    ),
    "normal for an int array": (
        GATHER.replace("{kind: integers, low: 0, high: vocab}", "normal"),
        r"gather\.yaml:5: kernel: init normal draws floats, but the array is int32",
    ),
    "inout not an array": (
        GATHER.replace("{name: dim, role: scalar, dtype: int}", "{name: dim, role: inout, dtype: int}"),
        r"gather\.yaml:11: kernel: inout 'dim' is updated in place, so it must be an array",
    ),
    "unknown dtype": (
        GATHER.replace("dtype: int, shape", "dtype: int128_t, shape"),
        r"gather\.yaml:5: kernel: array 'ids': dtype 'int128_t' must be",
    ),
    "unknown init field": (
        GATHER.replace("{kind: constant, value: 2}", "{kind: constant, valu: 2}"),
        r"gather\.yaml:9: kernel: init constant: unknown field 'valu'",
    ),
    "init reads an unknown size": (
        GATHER.replace("high: vocab}", "high: vocabulary}"),
        r"gather\.yaml:5: kernel: init high 'vocabulary' names unknown symbol\(s\) vocabulary",
    ),
    "init function missing": (
        GATHER.replace("{kind: constant, value: 2}", "gen.py:nothing"),
        r"gather\.yaml:9: kernel: init 'gen\.py:nothing': gen\.py has no function 'nothing'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_declarations_are_one_line_exit_2_nothing_written(gather, case):
    text, pattern = BAD[case]
    write(gather, {"gather.yaml": text, "gen.py": "def other(xp, rng, shape, dtype, problem):\n    pass\n"})
    _refused_in_one_line(gather, pattern, ["check", "gather.yaml", "--arch", "sm_90"], ["render", "gather.yaml"])


def _refused_in_one_line(folder, pattern: str, *commands: list[str]) -> None:
    """Each of `commands`, run in `folder`, exits 2 with one line matching `pattern`, and writes nothing there."""
    before = sorted(p.name for p in folder.iterdir())
    for args in commands:
        proc = tuner(*args, cwd=folder)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert re.search(pattern, lines[0]), lines[0]
    assert sorted(p.name for p in folder.iterdir() if p.name != "__pycache__") == before


def test_a_users_init_that_returns_the_wrong_shape_is_a_reference_failure(gather):
    write(
        gather,
        {
            "gather.yaml": GATHER.replace("{kind: constant, value: 2}", "gen.py:short"),
            "gen.py": "def short(xp, rng, shape, dtype, problem):\n    return xp.zeros(3)\n",
        },
    )
    space = space_mod.load(gather / "gather.yaml")
    with pytest.raises(ReferenceFailed, match=r"init gen\.py:short returned shape \(3,\), the argument has \(256,\)"):
        space.family.inputs(np, space.problem().env, np.random.default_rng(0))


# ---------------------------------------------------------------------------------------------------------------
# the reference is imported only where it runs

MARKING_REF = """\
open(__file__ + ".imported", "w").close()
import numpy as np

def gather(table, ids, order, keep, hits, tokens, dim):
    return {"out": table[ids], "hits": hits + np.where(keep, 1.0, 0.5)}
"""


@pytest.mark.parametrize(
    "module",
    [
        "raise RuntimeError('needs a GPU')\ndef gather(table, ids, order, keep, hits, tokens, dim): pass\n",
        "import torch_that_is_not_installed\ndef gather(table, ids, order, keep, hits, tokens, dim): pass\n",
    ],
)
def test_render_and_check_never_import_the_reference(gather, module):
    write(gather, {"ref.py": module})
    render = tuner("render", "gather.yaml", cwd=gather)
    assert render.returncode == 0, render.stderr
    proc = tuner("check", "gather.yaml", "--arch", "sm_90", "--json", cwd=gather)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["compiled"] == 2


def test_loading_the_space_and_a_study_start_up_never_import_the_reference(gather):
    write(gather, {"ref.py": MARKING_REF})
    space = space_mod.load(gather / "gather.yaml")
    check_reference(space, required=True, run=False)  # what a study's driver asks before its workers start
    assert not (gather / "ref.py.imported").exists()
    assert usercode.user_module_name((gather / "ref.py").resolve()) not in sys.modules
    proc = tuner("study", "gather", "--space", "gather.yaml", "--trials", "20", cwd=gather)
    # no GPU here: the study stops where its workers would start, and its driver has not imported the reference
    assert proc.returncode == 2 and "GPU" in proc.stderr, proc.stderr
    assert not (gather / "ref.py.imported").exists()
    # where it runs (the GPU worker, or a replay's host check), its first call imports it
    env = space.problem().env
    space.family.reference(np, space.family.inputs(np, env, np.random.default_rng(0)), env)
    assert (gather / "ref.py.imported").exists()


def test_a_reference_that_fails_to_import_fails_where_it_runs_in_one_line(gather):
    write(
        gather,
        {
            "ref.py": "import numpy\nraise RuntimeError('broken')\n"
            "def gather(table, ids, order, keep, hits, tokens, dim): pass\n"
        },
    )
    space = space_mod.load(gather / "gather.yaml")  # loads: its source parses and names the function
    env = space.problem().env
    with pytest.raises(ReferenceFailed, match=r"ref\.py does not import: RuntimeError: broken") as caught:
        space.family.reference(np, space.family.inputs(np, env, np.random.default_rng(0)), env)
    assert "\n" not in str(caught.value)


#: A reference whose import says where it ran (thread and process, a line each time the module runs) and takes a
#: while, as one that imports torch does: a check meanwhile waits for it rather than importing it again.
TIMED_REF = """\
import os, threading, time
with open(__file__ + ".imported", "a") as log:
    log.write(f"{threading.current_thread().name} {os.getpid()}\\n")
time.sleep(0.5)
import numpy as np
# BROKEN
def gather(table, ids, order, keep, hits, tokens, dim):
    return {"out": table[ids], "hits": hits + np.where(keep, 1.0, 0.5)}
"""


@pytest.mark.parametrize("broken", [False, True], ids=["imports", "fails"])
def test_the_gpu_worker_imports_the_reference_as_it_starts_before_any_config(gather, broken):
    """The local pool's GPU worker (a real child process, a stand-in for the GPU) imports the reference in a thread
    of its own as soon as it is up, with no config sent: its first check finds it imported (or waits for the
    import under way). A reference that fails to import fails there as before, in one line, the check importing it
    again. The driver never imports it."""
    from tests.child_helpers import FirstCheck
    from tuner.gpu.protocol import EvaluateRequest
    from tuner.gpu.worker import IsolatedEvaluator
    from tuner.study.local import LocalPool

    write(gather, {"ref.py": TIMED_REF.replace("# BROKEN", "raise RuntimeError('broken')" if broken else "")})
    log = gather / "ref.py.imported"
    space = space_mod.load(gather / "gather.yaml")

    def worker(gpu: int) -> IsolatedEvaluator:
        return IsolatedEvaluator(gpu=gpu, timeout_s=60.0, start_timeout_s=120.0, evaluator_factory=FirstCheck)

    pool = LocalPool(space, space.problem(), worker, gpus=1, arch="sm_90", compile_slots=1)
    try:
        pool.wait_ready()
        evaluator = pool._workers[0].evaluator
        child = evaluator.pid
        deadline = time.time() + 60
        while not log.exists() and time.time() < deadline:  # nothing submitted: the worker imports by itself
            time.sleep(0.02)
        assert log.read_text().splitlines() == [f"tuner-import-ahead {child}"]
        result = evaluator.evaluate(EvaluateRequest(None, space.family, space.default, space.problem()))
    finally:
        pool.close()
    lines = log.read_text().splitlines()
    if broken:  # the first check imports it again and says why it fails, in one line
        assert re.fullmatch(r".*ref\.py:\d+: ref\.py does not import: RuntimeError: broken", result.reason), result
        assert lines == [f"tuner-import-ahead {child}", f"MainThread {child}"]
    else:
        assert result.reason == "ok: hits,out" and len(lines) == 1
    assert usercode.user_module_name((gather / "ref.py").resolve()) not in sys.modules


def test_the_reference_signature_is_read_from_its_source(gather):
    """Without importing it: the arguments it cannot take are refused, and how it wants its arrays is read."""
    write(
        gather,
        {"ref.py": "import torch\n\ndef gather(table: torch.Tensor, ids, order, keep, hits, tokens, dim):\n    pass\n"},
    )
    assert space_mod.load(gather / "gather.yaml").family.reference_arrays == "torch"
    write(gather, {"ref.py": "def gather(table, ids, order, keep, hits, tokens, dim, xp=None):\n    pass\n"})
    assert space_mod.load(gather / "gather.yaml").family.reference_arrays == "xp"
    write(gather, {"ref.py": "def gather(table, ids):\n    pass\n"})
    proc = tuner("check", "gather.yaml", "--arch", "sm_90", cwd=gather)
    assert proc.returncode == 2
    assert re.search(r"gather\.yaml:13: kernel: reference 'ref\.py:gather' cannot be called", proc.stderr)


# ---------------------------------------------------------------------------------------------------------------
# on a GPU: the seeded generator draws every init on the caller's stream, and the in-place argument is checked


def _have_gpu() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver or no device
        return False


@pytest.mark.gpu
def test_the_gpu_draws_every_init_from_the_seed_on_the_callers_stream(gather):
    if not _have_gpu():
        pytest.skip("needs a CUDA GPU")
    import cupy

    from tuner.build.compile import compile_source
    from tuner.gpu import devicekernels, kernelsource

    arch = f"sm_{cupy.cuda.Device(0).compute_capability}"
    first = compile_source(kernelsource.source(kernelsource.FIRST_CHECKS), arch)
    kernels = devicekernels.DeviceKernels(
        first, kernelsource.FIRST_CHECKS, kernelsource.Built(kernelsource.LATER_CHECKS, arch)
    )
    space = space_mod.load(gather / "gather.yaml")
    env = space.problem().env
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        drawn = space.family.inputs(cupy, env, kernels.rng(5))
        again = space.family.inputs(cupy, env, kernels.rng(5))
    stream.synchronize()
    ids, order = cupy.asnumpy(drawn["ids"]), cupy.asnumpy(drawn["order"])
    assert drawn["ids"].dtype == np.int32 and 0 <= ids.min() and ids.max() < 1000
    assert drawn["order"].dtype == np.uint32 and sorted(order.tolist()) == list(range(256))
    assert (cupy.asnumpy(drawn["hits"]) == 2).all() and drawn["keep"].dtype == np.bool_
    for name in ("table", "ids", "order", "keep", "hits"):
        np.testing.assert_array_equal(cupy.asnumpy(drawn[name]), cupy.asnumpy(again[name]))


@pytest.mark.gpu
def test_the_gather_and_its_in_place_argument_verify_on_the_gpu(gather):
    if not _have_gpu():
        pytest.skip("needs a CUDA GPU")
    from tuner.gpu.evaluate import evaluate_config

    result = evaluate_config(gather / "gather.yaml", {"block": 128})
    assert result.ok, result
    # a kernel that updates its in-place argument twice is caught on that argument
    write(gather, {"gather.cu.j2": GATHER_TEMPLATE.replace("hits[t] += ", "hits[t] += hits[t] + ")})
    wrong = evaluate_config(gather / "gather.yaml", {"block": 128})
    assert wrong.kind == "wrong_result" and "hits" in wrong.reason, wrong


# ---------------------------------------------------------------------------------------------------------------
# several launches: a split sum, then its combine, through a scratch array whose size the config sets

SPLIT_SUM = """\
kernel:
  name: split_sum
  arguments:
    - {name: x, role: input, shape: [n]}
    - {name: partial, role: scratch, dtype: float, shape: [splits]}
    - {name: out, role: output, dtype: double, shape: [1]}
    - {name: n, role: scalar, dtype: int64}
  launch:
    - {grid: [splits], block: [block], arguments: [x, partial, n]}
    - {entry: combine, grid: [1], block: [32], arguments: [partial, out]}
  reference: sum_ref.py:total
  tolerance: 1.0e-4
template: split_sum.cu.j2
problem: {name: p, n: 1048576, dtype: float32}
params: {splits: [64, 128], block: [128, 256]}
"""
SPLIT_SUM_TEMPLATE = """\
extern "C" __global__ void {{ entry }}(const float* x, float* partial, long long n)
{
    __shared__ float sums[{{ block }}];
    float s = 0.0f;
    for (long long i = blockIdx.x * {{ block }} + threadIdx.x; i < n; i += {{ splits }} * {{ block }}) s += x[i];
    sums[threadIdx.x] = s;
    __syncthreads();
    for (int w = {{ block }} / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) sums[threadIdx.x] += sums[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = sums[0];
}

extern "C" __global__ void {{ entry }}_combine(const float* partial, double* out)
{
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int i = 0; i < {{ splits }}; ++i) s += partial[i];
        out[0] = s;
    }
}
"""
SUM_REF = "def total(x, n):\n    return x.sum(keepdims=True)\n"


@pytest.fixture
def split_sum(tmp_path):
    write(tmp_path, {"s.yaml": SPLIT_SUM, "split_sum.cu.j2": SPLIT_SUM_TEMPLATE, "sum_ref.py": SUM_REF})
    return tmp_path


def test_several_launches_are_declared_with_their_entries_and_arguments(split_sum):
    space = space_mod.load(split_sum / "s.yaml")
    family, env = space.family, space.problem().env
    config = space.resolve({"splits": 128, "block": 256}, space.problem())
    first, combine = family.launches("split_sum_s128", config, env)
    assert (first.entry, first.grid, first.block, first.args) == (
        "split_sum_s128",
        (128, 1, 1),
        (256, 1, 1),
        ("x", "partial", "n"),
    )
    assert (combine.entry, combine.grid, combine.block, combine.args) == (
        "split_sum_s128_combine",
        (1, 1, 1),
        (32, 1, 1),
        ("partial", "out"),
    )
    # the scratch array is allocated (and poisoned) by the config's size, never checked nor counted as traffic
    assert family.outputs(env, config) == {"partial": ((128,), "float32"), "out": ((1,), "float64")}
    assert family.checked() == ("out",)
    assert family.bytes_moved(env) == 4 * 1048576 + 8
    check_reference(space)


def test_every_launch_of_every_config_compiles(split_sum):
    from tuner.build.compile import compile_source
    from tuner.build.render import render

    space = space_mod.load(split_sum / "s.yaml")
    problem = space.problem()
    config = {"splits": 64, "block": 128}
    source = render(space.family, config, space.resolve(config, problem), problem.env)
    compiled = compile_source(source, "sm_90")
    assert compiled.ok, compiled
    entries = {
        launch.entry for launch in space.family.launches(source.entry, space.resolve(config, problem), problem.env)
    }
    assert entries <= set(compiled.functions) and len(entries) == 2
    proc = tuner("check", "s.yaml", "--arch", "sm_90", "--json", cwd=split_sum)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["compiled"] == 4


LAUNCH_BAD = {
    "argument declared nowhere": (
        SPLIT_SUM.replace("arguments: [partial, out]}", "arguments: [partial, result]}"),
        r"s\.yaml:10: kernel: launch 1: arguments 'result' name nothing declared \(declared: x, partial, out, n\)",
    ),
    "unknown launch field": (
        SPLIT_SUM.replace("{entry: combine, grid", "{entry: combine, grd: [1], grid"),
        r"s\.yaml:10: kernel: launch 1: unknown field 'grd'",
    ),
    "entry not an identifier": (
        SPLIT_SUM.replace("entry: combine", "entry: 'combine()'"),
        r"s\.yaml:10: kernel: launch 1: entry 'combine\(\)' is not a C identifier",
    ),
    "launch reads an unknown name": (
        SPLIT_SUM.replace("grid: [splits], block: [block]", "grid: [split], block: [block]"),
        r"s\.yaml:9: kernel: grid 'split' names unknown symbol\(s\) split",
    ),
    "scratch shape unknown": (
        SPLIT_SUM.replace("shape: [splits]}", "shape: [parts]}"),
        r"s\.yaml:5: kernel: shape 'parts' names unknown symbol\(s\) parts",
    ),
}


@pytest.mark.parametrize("case", sorted(LAUNCH_BAD))
def test_bad_launch_lists_are_one_line_exit_2_nothing_written(split_sum, case):
    text, pattern = LAUNCH_BAD[case]
    write(split_sum, {"s.yaml": text})
    _refused_in_one_line(split_sum, pattern, ["check", "s.yaml", "--arch", "sm_90"])


@pytest.mark.gpu
def test_the_split_sum_verifies_on_the_gpu(split_sum):
    if not _have_gpu():
        pytest.skip("needs a CUDA GPU")
    from tuner.gpu.evaluate import evaluate_config

    result = evaluate_config(split_sum / "s.yaml", {"splits": 128, "block": 256})
    assert result.ok, result
    # a combine that drops a split is caught
    write(
        split_sum, {"split_sum.cu.j2": SPLIT_SUM_TEMPLATE.replace("i < {{ splits }}; ++i", "i < {{ splits }} - 1; ++i")}
    )
    wrong = evaluate_config(split_sum / "s.yaml", {"splits": 128, "block": 256})
    assert wrong.kind == "wrong_result", wrong


# ---------------------------------------------------------------------------------------------------------------
# the C++ headers a CUDA programmer includes, under NVRTC through CCCL's cuda/std

STD_KERNEL = """\
{includes}
extern "C" __global__ void k(uint32_t* out, const float* x, std::size_t n)
{{
    static_assert(std::is_same_v<std::uint32_t, uint32_t> && std::is_integral<int64_t>::value, "");
    std::array<int, 3> a{{1, 2, 3}};
    auto [first, second] = std::make_pair(std::numeric_limits<int8_t>::max(), INT_MAX);
    float y = std::sqrt(std::fabs(x[0])) + sqrtf(x[1]) + FLT_EPSILON;
    std::swap(a[0], a[2]);
    out[0] = std::min<uint32_t>(n, UINT32_MAX) + first + second + std::accumulate(a.begin(), a.end(), 0)
           + std::popcount(5u) + (uint32_t)y + std::get<0>(std::make_tuple(1u));
}}
"""


def _compiles(text: str):
    from tuner.build.compile import compile_source
    from tuner.build.render import Source

    return compile_source(Source(kernel="std", text=text, entry="k", uri="std_headers", template="k.cu.j2"), "sm_90")


def test_the_standard_headers_compile_under_nvrtc_through_cccl():
    from tuner.build import includes

    every = "\n".join(f"#include <{name}>" for name in includes.STD_HEADERS)
    compiled = _compiles(STD_KERNEL.format(includes=every))
    assert compiled.ok, compiled
    # each header the kernel uses, included on its own with the others it needs
    used = ("cstdint", "cstddef", "type_traits", "array", "utility", "limits", "climits", "cmath", "cfloat")
    compiled = _compiles(
        STD_KERNEL.format(
            includes="\n".join(f"#include <{n}>" for n in (*used, "algorithm", "numeric", "bit", "tuple"))
        )
    )
    assert compiled.ok, compiled


@pytest.mark.parametrize("header", ["cstdint", "type_traits", "limits", "cmath", "utility"])
def test_each_common_header_compiles_alone(header):
    body = 'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }\n'
    compiled = _compiles(f"#include <{header}>\n{body}")
    assert compiled.ok, compiled
    without = _compiles(f"#include <{header}_not_a_header>\n{body}")
    assert not without.ok  # the compile is real: a header that does not exist fails


def test_a_header_with_no_equivalent_is_one_line_naming_the_replacement(gather):
    write(gather, {"gather.cu.j2": "#include <cstdint>\n#include <cstdio>\n" + GATHER_TEMPLATE})
    proc = tuner("check", "gather.yaml", "--arch", "sm_90", cwd=gather)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(r"gather\.cu\.j2:2: #include <cstdio> has no equivalent under NVRTC: printf is built in", lines[0])


def test_a_reference_called_from_several_threads_at_once_is_imported_once_and_found_by_all(tmp_path):
    """The GPU worker computes the pool's later references ahead in threads while its main thread computes the
    first: all three resolve the user's function at once. A module whose body is still running must not be handed
    out from sys.modules (its function not yet defined)."""
    import threading

    (tmp_path / "slow.py").write_text(
        "import time\nCALLS = []\nCALLS.append(1)\ntime.sleep(0.3)\n\ndef ref(xp, inputs, problem):\n    return 7\n"
    )

    def fail(message, *_keys):
        return ValueError(message)

    functions = [usercode.find("slow.py:ref", tmp_path, fail, "reference") for _ in range(4)]
    results: list = [None] * len(functions)

    def call(i: int) -> None:
        try:
            results[i] = functions[i](None, {}, {})
        except Exception as exc:  # what a racing caller got, kept for the assertion
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(functions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [7] * len(functions), results
    module = sys.modules[usercode.user_module_name((tmp_path / "slow.py").resolve())]
    assert module.CALLS == [1]
