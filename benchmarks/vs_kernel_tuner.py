"""Tuning throughput against Kernel Tuner 1.5: one 45-config FP32 transpose space at 8192², one GPU, one run.

    python benchmarks/vs_kernel_tuner.py [--out benchmarks/results] [--skip tuner answer none]
    python benchmarks/vs_kernel_tuner.py --check [--arch sm_90]     # no GPU: the checks below, then exit

Three contenders, each in its own subprocess with a cold compile cache (fresh TUNER_CACHE_DIR and
CUPY_CACHE_DIR), so no cache, CUDA context or import is shared:

- ``tuner``: ``python -m tuner study transpose --space benchmarks/spaces/transpose_8192_45.yaml --sampler grid
  --trials 45 --storage sqlite:///TMP/kt_ours.db --json``, as a user would run it (the local engine). Its
  summary gives command_wall_s (the whole wall a user waits: from the command's start — the tuner package's
  import — through set-up, search, the finalists' re-timing and the last write to the database),
  cold_start_s (command start to the first result) and wall_s (the driver's loop, from the driver's start).
  Trials per GPU-minute over the whole wall = measured / (command_wall_s / 60); "after start-up" = measured /
  ((loop end - first result) / 60), both ends on the driver's clock; over the subprocess wall (interpreter start
  and exit too) alongside.
- ``kernel_tuner answer``: ``kernel_tuner.tune_kernel``, CuPy backend, brute force, the default 7 iterations,
  ``answer=[None, src.T, None, None]``: every config checked on the host with numpy.allclose, as Kernel Tuner
  does it.
- ``kernel_tuner unverified``: the same without ``answer`` (no correctness check at all).
  Kernel Tuner's figure is configs / (tune_kernel wall / 60); the subprocess wall is reported too.

Kernel Tuner gets the kernel the way a Kernel Tuner user writes one: a single source whose tunable parameters
(TILE, RPT, PAD, VEC, block_size_x, block_size_y) arrive as the ``#define``s Kernel Tuner inserts. It is a
line-by-line translation of templates/transpose.cu.j2 (the Jinja conditionals become ``#if``s), compiled with
the same ``-std=c++17``. ``--check`` shows that for all 45 configs it compiles to the same registers, SMEM and
spills as our rendered kernels, from the same PTX. block_size_x/y are tunable parameters tied to the knobs
by restrictions (Kernel Tuner reads thread-block sizes from tunable parameters only); grid_div_x/y = ["TILE"]
makes the grid (8192/TILE, 8192/TILE), as ours. Kernel Tuner's search space for these tune_params +
restrictions is checked to be exactly our 45 configs before the run (a preflight subprocess) and after it (the
configs Kernel Tuner evaluated).

Best-config TB/s count 2·8192²·4 bytes but are not measured alike: ours is the median over a time budget of
launches with L2 flushed in between, Kernel Tuner's "time" the mean of 7 event-timed launches without a flush
(each array is 256 MiB, several times the L2, so the difference is small but not nil). What this benchmark is
about is the throughput of the tuning itself.

Writes ``vs_kernel_tuner-<date>.json`` (a list of records: kernel, shape, impl, TBps, TFLOPs, ceiling_TBps,
gpu, date, command, plus the raw figures; the last record, impl "comparison", carries the ratios) and
``vs_kernel_tuner-<date>.md`` under --out, and prints a short table last. Exit code 1 when a contender failed
(what the others measured is still written).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kt_cupy import pad_device_uuid  # noqa: E402

from tuner import kernels  # noqa: E402
from tuner.space import space as space_mod  # noqa: E402

SPACE = ROOT / "benchmarks" / "spaces" / "transpose_8192_45.yaml"
EXPECTED_CONFIGS = 45
KERNEL_NAME = "transpose_kt"
KT_ITERATIONS = 7  # Kernel Tuner's default, passed explicitly so the record says what was used
#: what tuner/build/compile.py uses; without it Kernel Tuner's CuPy backend would pass --std=c++11
KT_COMPILER_OPTIONS = ["-std=c++17"]
MARKER = "@@vs_kernel_tuner@@ "  # prefixes the one JSON line a child prints
IMPLS = {"tuner": "tuner", "answer": "kernel_tuner answer", "none": "kernel_tuner unverified"}
#: our parameter name → Kernel Tuner's (macro) name
KT_NAMES = {"tile": "TILE", "rows_per_thread": "RPT", "pad": "PAD", "vec": "VEC"}

# The Kernel Tuner twin of templates/transpose.cu.j2. Per config Kernel Tuner prepends "#define TILE 32",
# "#define RPT 4", "#define PAD 1", "#define VEC 4", "#define block_size_x 8", "#define block_size_y 8", the
# grid sizes and "#define kernel_tuner 1". Every line maps to one of the template's; @ROWS@ and @COLS@ are
# filled in once, from the space's problem.
KT_KERNEL = r"""// transpose_kt: templates/transpose.cu.j2 with its Jinja knobs as Kernel Tuner #defines
constexpr long long ROWS = @ROWS@;
constexpr long long COLS = @COLS@;
constexpr int BX = TILE / VEC;     // threads across a tile row
constexpr int BY = TILE / RPT;     // tile rows covered per pass
constexpr int LD = TILE + PAD;     // SMEM row pitch, floats
static_assert(BX == block_size_x && BY == block_size_y, "block shape");

#if VEC == 1
typedef float vec_t;
#elif VEC == 2
typedef float2 vec_t;
#elif VEC == 4
typedef float4 vec_t;
#else
#error "VEC must be 1, 2 or 4"
#endif

// widest SMEM store, in floats, that the padded pitch keeps aligned
#if (TILE + PAD) % VEC == 0
#define SVEC VEC
#elif VEC >= 2 && (TILE + PAD) % 2 == 0
#define SVEC 2
#else
#define SVEC 1
#endif

extern "C" __global__ void __launch_bounds__(block_size_x * block_size_y)
transpose_kt(const float* __restrict__ src, float* __restrict__ dst, int rows, int cols)
{
    __shared__ __align__(16) float tile[TILE * LD];
    const int tx = threadIdx.x;
    const int ty = threadIdx.y;
    const long long r0 = (long long)blockIdx.y * TILE;  // first src row of the tile
    const long long c0 = (long long)blockIdx.x * TILE;  // first src col of the tile

    // Load: all RPT global loads issue before the first SMEM store.
    const float* in = src + (r0 + ty) * COLS + c0 + tx * VEC;
    vec_t v[RPT];
#pragma unroll
    for (int j = 0; j < RPT; ++j)
        v[j] = __ldg(reinterpret_cast<const vec_t*>(in + (long long)j * BY * COLS));

#pragma unroll
    for (int j = 0; j < RPT; ++j) {
        float* s = tile + (ty + j * BY) * LD + tx * VEC;
#if SVEC == VEC
        *reinterpret_cast<vec_t*>(s) = v[j];
#elif SVEC == 2
        *reinterpret_cast<float2*>(s + 0) = make_float2(v[j].x, v[j].y);
        *reinterpret_cast<float2*>(s + 2) = make_float2(v[j].z, v[j].w);
#elif VEC == 2
        s[0] = v[j].x;
        s[1] = v[j].y;
#else
        s[0] = v[j].x;
        s[1] = v[j].y;
        s[2] = v[j].z;
        s[3] = v[j].w;
#endif
    }
    __syncthreads();

    // Store: dst row c0 + ty + j*BY, cols r0 + tx*VEC ... + VEC-1 <- SMEM column ty + j*BY, rows tx*VEC + k.
    float* out = dst + (c0 + ty) * ROWS + r0 + tx * VEC;
#pragma unroll
    for (int j = 0; j < RPT; ++j) {
        const float* s = tile + (tx * VEC) * LD + ty + j * BY;
        vec_t o;
#if VEC == 1
        o = s[0 * LD];
#else
        o.x = s[0 * LD];
        o.y = s[1 * LD];
#if VEC == 4
        o.z = s[2 * LD];
        o.w = s[3 * LD];
#endif
#endif
        __stwb(reinterpret_cast<vec_t*>(out + (long long)j * BY * ROWS), o);
    }
}
"""


# ------------------------------------------------------------------------------------------------------------
# the Kernel Tuner set-up (shared by the children and --check)


def load_space():
    space = space_mod.load(SPACE)
    return space, space.problem()


def kt_source(problem) -> str:
    rows, cols = problem.sizes["rows"], problem.sizes["cols"]
    return KT_KERNEL.replace("@ROWS@", str(rows)).replace("@COLS@", str(cols))


def kt_tune_params(space) -> dict[str, list[int]]:
    """Our four knobs under their macro names, plus the thread-block sizes they imply (Kernel Tuner reads the
    block shape from tunable parameters only, so these are parameters tied to the knobs by restrictions)."""
    tiles, rpts, vecs = space.params["tile"], space.params["rows_per_thread"], space.params["vec"]
    params = {KT_NAMES[name]: list(values) for name, values in space.params.items()}
    params["block_size_x"] = sorted({t // v for t in tiles for v in vecs if t % v == 0})
    params["block_size_y"] = sorted({t // r for t in tiles for r in rpts if t % r == 0})
    return params


def kt_restrictions(problem) -> list[str]:
    """The space file's constraints (those of search_spaces/transpose.yaml) as Kernel Tuner restrictions."""
    rows, cols, elem = problem.sizes["rows"], problem.sizes["cols"], problem.env["elem_bytes"]
    return [
        *dict.fromkeys([f"{rows} % TILE == 0", f"{cols} % TILE == 0"]),
        "TILE % RPT == 0",
        "TILE % VEC == 0",
        "block_size_x == TILE // VEC",
        "block_size_y == TILE // RPT",
        "block_size_x * block_size_y >= 32",
        "block_size_x * block_size_y <= 1024",
        f"TILE * (TILE + PAD) * {elem} <= {48 * 1024}",
    ]


def ours_of(kt_params: dict[str, Any]) -> dict[str, int]:
    """A Kernel Tuner config in our parameter names (and order)."""
    return {name: int(kt_params[macro]) for name, macro in KT_NAMES.items()}


def config_key(config: dict[str, Any]) -> tuple:
    return tuple(int(config[name]) for name in KT_NAMES)


def kt_space_check(space, problem, max_threads: int = 1024) -> dict[str, Any]:
    """Build Kernel Tuner's own search space (the Searchspace tune_kernel builds; 1024 is the H200's
    MaxThreadsPerBlock) and compare it with ours."""
    from kernel_tuner.searchspace import Searchspace

    tune_params = kt_tune_params(space)
    ss = Searchspace(tune_params, kt_restrictions(problem), max_threads)
    names = list(tune_params)
    theirs = [dict(zip(names, c, strict=True)) for c in ss.sorted_list()]
    bad_block = [
        c for c in theirs if c["block_size_x"] != c["TILE"] // c["VEC"] or c["block_size_y"] != c["TILE"] // c["RPT"]
    ]
    ours = {config_key(c) for c in space.enumerate(problem)}
    kt = {config_key(ours_of(c)) for c in theirs}
    same = kt == ours and ss.size == len(ours) and not bad_block
    return {
        "kt_size": ss.size,
        "ours_size": len(ours),
        "same": same,
        "only_kt": sorted(kt - ours),
        "only_ours": sorted(ours - kt),
        "bad_block_sizes": bad_block,
    }


# ------------------------------------------------------------------------------------------------------------
# children: one Kernel Tuner run (or the preflight) per process; each prints one MARKER line of JSON


def _timed(result: dict[str, Any]) -> bool:
    t = result.get("time")
    return isinstance(t, int | float) and not isinstance(t, bool) and t > 0


def child_kt(mode: str, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    import numpy as np

    space, problem = load_space()
    import cupy
    import kernel_tuner
    from kernel_tuner import tune_kernel

    pad_device_uuid(cupy)
    imported = time.perf_counter()
    rows, cols = problem.sizes["rows"], problem.sizes["cols"]
    rng = np.random.default_rng(seed)
    src = rng.standard_normal((rows, cols), dtype=np.float32)
    dst = np.zeros((cols, rows), dtype=np.float32)
    arguments = [src, dst, np.int32(rows), np.int32(cols)]
    answer = [None, np.ascontiguousarray(src.T), None, None] if mode == "answer" else None
    tune_params = kt_tune_params(space)
    source = kt_source(problem)
    restrictions = kt_restrictions(problem)
    set_up = time.perf_counter()

    t0 = time.perf_counter()
    results, env = tune_kernel(
        KERNEL_NAME,
        source,
        problem_size=(cols, rows),
        arguments=arguments,
        tune_params=tune_params,
        grid_div_x=["TILE"],
        grid_div_y=["TILE"],
        restrictions=restrictions,
        answer=answer,
        lang="CuPy",
        compiler_options=list(KT_COMPILER_OPTIONS),
        iterations=KT_ITERATIONS,
        strategy="brute_force",
        # Off for the timed comparison (writing the cache costs Kernel Tuner time); --write-kt-cache sets it.
        cache=os.environ.get("TUNER_BENCH_KT_CACHE") or None,
        verbose=False,
        quiet=True,
        parallel=False,
    )
    wall = time.perf_counter() - t0

    ok = [r for r in results if _timed(r)]
    failed = [r for r in results if not _timed(r)]
    nbytes = 2 * rows * cols * problem.env["elem_bytes"]
    best = min(ok, key=lambda r: float(r["time"])) if ok else None
    evaluated = {config_key(ours_of(r)) for r in results}
    ours = {config_key(c) for c in space.enumerate(problem)}
    n = len(results)
    timings = (
        "total_compile_time",
        "total_verification_time",
        "total_benchmark_time",
        "total_framework_time",
        "total_strategy_time",
        "overhead_time",
    )
    return {
        "mode": mode,
        "kernel_tuner": kernel_tuner.__version__,
        "cupy": cupy.__version__,
        "gpu": env.get("device_name"),
        "cupy_cache_dir": os.environ.get("CUPY_CACHE_DIR"),
        "import_s": round(imported - started, 3),
        "set_up_s": round(set_up - imported, 3),
        "tune_kernel_wall_s": round(wall, 3),
        "configs_evaluated": n,
        "configs_failed": len(failed),
        "failures": [{**ours_of(r), "error": str(r.get("__error__", r.get("time")))} for r in failed],
        "seconds_per_config": round(wall / n, 4) if n else None,
        "trials_per_gpu_minute": round(n / (wall / 60), 2) if n else None,
        "configs_match_ours": evaluated == ours and n == len(ours),
        # Kernel Tuner's own split of its time, ms → s
        "kt_timings_s": {
            k.removeprefix("total_").removesuffix("_time"): round(float(env[k]) / 1000, 3) for k in timings if k in env
        },
        "best": None
        if best is None
        else {
            "config": ours_of(best),
            "kt_params": {k: int(best[k]) for k in tune_params},
            "time_ms": float(best["time"]),
            "TBps": round(nbytes / float(best["time"]) / 1e9, 4),
            "times_ms": [round(float(t), 5) for t in best.get("times", [])],
        },
    }


def child_preflight() -> dict[str, Any]:
    import cupy
    import kernel_tuner

    space, problem = load_space()
    return {
        "kernel_tuner": kernel_tuner.__version__,
        "cupy": cupy.__version__,
        "ours_valid": space.count_valid(problem),
        **kt_space_check(space, problem),
    }


def child_main(mode: str, seed: int) -> int:
    try:
        payload = child_preflight() if mode == "preflight" else child_kt(mode, seed)
        code = 0
    except BaseException as exc:  # report it on the marker line; the parent prints the traceback
        payload = {"mode": mode, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        code = 1
    sys.stdout.flush()
    print(MARKER + json.dumps(payload, default=str), flush=True)
    return code


# ------------------------------------------------------------------------------------------------------------
# the parent


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def _tail(text: str | bytes | None, n: int = 3000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-n:]


def _marked(stdout: str) -> dict[str, Any] | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(MARKER)]
    return json.loads(lines[-1][len(MARKER) :]) if lines else None


def _last_json_object(text: str) -> dict[str, Any] | None:
    """The last top-level JSON object in `text`: the study's --json summary, whatever Ray prints around it."""
    decoder = json.JSONDecoder()
    for match in reversed(list(re.finditer(r"(?m)^\{", text))):
        try:
            obj, _ = decoder.raw_decode(text[match.start() :])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def run_child(args, mode: str, tmp: Path, timeout: float) -> tuple[dict[str, Any], float]:
    """This script with --kt-mode MODE and a fresh (empty) CuPy cache; returns its JSON and wall time."""
    cache = Path(tempfile.mkdtemp(prefix=f"cupy_cache_{mode}_", dir=tmp))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--kt-mode", mode, "--seed", str(args.seed)]
    env = _env({"CUPY_CACHE_DIR": str(cache), "TUNER_CACHE_DIR": str(tmp / f"tuner_cache_{mode}")})
    env.pop("KERNEL_TUNER_PARALLEL", None)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return (
            {
                "mode": mode,
                "error": f"timed out after {timeout:.0f} s",
                "stdout_tail": _tail(exc.stdout),
                "stderr_tail": _tail(exc.stderr),
            },
            time.perf_counter() - t0,
        )
    wall = time.perf_counter() - t0
    try:
        payload = _marked(proc.stdout)
    except json.JSONDecodeError:
        payload = None
    if payload is None:
        payload = {
            "mode": mode,
            "error": f"exit code {proc.returncode}, no result line",
            "stdout_tail": _tail(proc.stdout),
        }
    elif proc.returncode != 0 and "error" not in payload:
        payload["error"] = f"exit code {proc.returncode}"
    if "error" in payload:
        payload.setdefault("stderr_tail", _tail(proc.stderr))
    return payload, wall


def run_ours(args, tmp: Path, timeout: float) -> tuple[dict[str, Any], float, list[str]]:
    """`python -m tuner study ... --json` with fresh tuner and CuPy caches; returns its summary, its wall time
    and the command."""
    db = tmp / "kt_ours.db"
    cmd = [
        sys.executable,
        "-m",
        "tuner",
        "study",
        "transpose",
        "--space",
        str(SPACE.relative_to(ROOT)),
        "--sampler",
        "grid",
        "--trials",
        str(EXPECTED_CONFIGS),
        "--storage",
        f"sqlite:///{db}",
        "--json",
    ]
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = _env(
        {
            "TUNER_CACHE_DIR": str(tmp / "tuner_cache_ours"),
            "CUPY_CACHE_DIR": str(tmp / "cupy_cache_ours"),
            "RAY_AUTH_MODE": "disabled",
            "PYTHONPATH": pythonpath,
        }
    )
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return (
            {
                "error": f"timed out after {timeout:.0f} s",
                "stdout_tail": _tail(exc.stdout),
                "stderr_tail": _tail(exc.stderr),
            },
            time.perf_counter() - t0,
            cmd,
        )
    wall = time.perf_counter() - t0
    summary = _last_json_object(proc.stdout)
    if proc.returncode != 0 or summary is None or "wall_s" not in summary:
        summary = {
            "error": f"exit code {proc.returncode}" + ("" if summary else ", no JSON summary"),
            "stdout_tail": _tail(proc.stdout),
            "stderr_tail": _tail(proc.stderr),
        }
    return summary, wall, cmd


def _detail(outcome: dict[str, Any]) -> str:
    text = outcome.get("traceback") or outcome.get("stderr_tail") or outcome.get("stdout_tail") or ""
    return text[-1500:]


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def _per_min(n: int | None, seconds: float | None) -> float | None:
    return _r(n / (seconds / 60), 2) if n and seconds and seconds > 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Run from the repository root on a machine with one GPU, with kernel_tuner, optuna and ray "
        "importable (e.g. on PYTHONPATH).",
    )
    parser.add_argument(
        "--out",
        default=str(ROOT / "benchmarks" / "results"),
        help="where the JSON and MD go (default benchmarks/results)",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=list(IMPLS), help="contenders to leave out")
    parser.add_argument("--seed", type=int, default=0, help="seed of Kernel Tuner's input matrix")
    parser.add_argument(
        "--timeout", type=float, default=420.0, help="seconds per contender before giving up (default 420)"
    )
    parser.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the preflight subprocess (imports; Kernel Tuner's search space == ours)",
    )
    parser.add_argument("--keep-tmp", action="store_true", help="keep the temporary caches and study database")
    parser.add_argument(
        "--check",
        action="store_true",
        help="no GPU needed: space size, Kernel Tuner's search space, and its kernel against "
        "ours (registers, SMEM, spills, PTX) for every config; then exit",
    )
    parser.add_argument("--arch", default="sm_90", help="--check: the arch to compile for")
    parser.add_argument(
        "--write-kt-cache",
        metavar="PATH",
        help="only run Kernel Tuner (with answer) over the space, letting it write its cache file to PATH; exit",
    )
    parser.add_argument("--kt-mode", choices=["answer", "none", "preflight"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.kt_mode:
        return child_main(args.kt_mode, args.seed)
    if args.check:
        return check(args.arch)
    if args.write_kt_cache:
        path = Path(args.write_kt_cache).resolve()
        path.unlink(missing_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix="kt_cache_"))
        os.environ["TUNER_BENCH_KT_CACHE"] = str(path)
        result, wall = run_child(args, "answer", tmp, timeout=args.timeout)
        print(json.dumps({"cache": str(path), "wall_s": round(wall, 2), **result}, default=str)[:2000])
        return 0 if path.exists() and "error" not in result else 1

    script = os.path.relpath(sys.argv[0], ROOT)
    command = "python " + " ".join(shlex.quote(a) for a in [script, *sys.argv[1:]])
    date = dt.date.today().isoformat()
    space, problem = load_space()
    n_valid = space.count_valid(problem)
    if n_valid != EXPECTED_CONFIGS:
        print(f"error: {SPACE} has {n_valid} valid configs, expected {EXPECTED_CONFIGS}", file=sys.stderr)
        return 2
    rows, cols = problem.sizes["rows"], problem.sizes["cols"]
    nbytes = 2 * rows * cols * problem.env["elem_bytes"]
    shape = f"{rows}x{cols} fp32, {n_valid} configs"
    failed = False

    tmp = Path(tempfile.mkdtemp(prefix="vs_kernel_tuner_"))
    outcomes: dict[str, dict[str, Any]] = {}
    try:
        if not args.no_preflight and not {"answer", "none"} <= set(args.skip):
            pre, pre_wall = run_child(args, "preflight", tmp, timeout=300)
            if "error" in pre or not pre.get("same"):
                print(
                    "preflight failed (Kernel Tuner or CuPy not importable, or Kernel Tuner's search space "
                    "is not ours):",
                    file=sys.stderr,
                )
                print(json.dumps(pre, indent=1, default=str), file=sys.stderr)
                return 2
            print(
                f"preflight ok in {pre_wall:.1f} s: Kernel Tuner {pre['kernel_tuner']}, CuPy "
                f"{pre['cupy']}, its search space is our {pre['ours_size']} configs",
                flush=True,
            )

        for key, impl in IMPLS.items():
            if key in args.skip:
                continue
            print(f"running {impl} ...", flush=True)
            if key == "tuner":
                summary, wall, cmd = run_ours(args, tmp, args.timeout)
                summary["cmd"] = " ".join(shlex.quote(c) for c in cmd)
            else:
                summary, wall = run_child(args, key, tmp, args.timeout)
            summary["subprocess_wall_s"] = round(wall, 3)
            outcomes[key] = summary
            if "error" in summary:
                failed = True
                print(f"  {impl} FAILED: {summary['error']}", file=sys.stderr)
                for k in ("traceback", "stderr_tail", "stdout_tail"):
                    if summary.get(k):
                        print(f"  --- {k} ---\n{summary[k]}", file=sys.stderr)
            else:
                print(f"  done in {wall:.1f} s (subprocess wall)", flush=True)
            write_results(args.out, outcomes, shape, date, command, nbytes, final=False)
    finally:
        if args.keep_tmp:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    bad = write_results(args.out, outcomes, shape, date, command, nbytes, final=True)
    return 1 if failed or bad else 0


def build_records(
    outcomes: dict[str, dict[str, Any]], shape: str, date: str, command: str
) -> tuple[list[dict[str, Any]], str | None, float | None, bool]:
    """The records (list format of benchmarks/results) from the contenders' outcomes; also the GPU, the copy
    ceiling, and whether a Kernel Tuner run evaluated other configs than ours or had failures."""
    ours = outcomes.get("tuner", {})
    ours_ok = bool(ours) and "error" not in ours
    gpu = ceiling = None
    if ours_ok and ours.get("gpus"):
        gpu, ceiling = ours["gpus"][0].get("gpu"), ours["gpus"][0].get("ceiling_tbps")
    for key in ("answer", "none"):
        gpu = gpu or outcomes.get(key, {}).get("gpu")

    records: list[dict[str, Any]] = []
    bad = False

    def record(impl: str, tbps: float | None, **extra) -> None:
        records.append(
            {
                "kernel": "transpose",
                "shape": shape,
                "impl": impl,
                "TBps": _r(tbps, 4),
                "TFLOPs": None,
                "ceiling_TBps": _r(ceiling, 4),
                "fraction_of_ceiling": _r(tbps / ceiling, 4) if tbps and ceiling else None,
                "gpu": gpu,
                "date": date,
                "command": command,
                **extra,
            }
        )

    rates: dict[str, float | None] = {}
    full_wall_rate = None
    if "tuner" in outcomes and ours_ok:
        wall = ours["wall_s"]  # the driver's loop end, from the driver's start (imports not included)
        cold = ours.get("cold_start_s") or 0.0  # from the command's start (imports included)
        imports = (ours.get("startup") or {}).get("imports_s") or 0.0
        # The whole wall a user waits, to the last durable write (summaries before command_wall_s: the loop's
        # end plus imports, which leaves out the finalists and the writer's tail).
        whole = ours.get("command_wall_s") or wall + imports
        after = wall + imports - cold  # loop end minus first result, both on the command's clock
        measured = ours.get("measured_this_run") or 0
        best = ours.get("best") or {}
        rates["tuner"] = _per_min(measured, after)
        full_wall_rate = _per_min(measured, whole)
        record(
            "tuner",
            best.get("tbps"),
            trials=ours.get("trials"),
            measured=measured,
            failures=ours.get("failures_this_run"),
            wall_s=_r(whole),
            driver_loop_wall_s=wall,
            cold_start_s=cold,
            imports_s=imports,
            finalists_s=ours.get("finalists_s"),
            writer_flush_s=ours.get("writer_flush_s"),
            startup=ours.get("startup"),
            writer=ours.get("writer"),
            wall_after_startup_s=_r(after),
            subprocess_wall_s=ours["subprocess_wall_s"],
            seconds_per_config=_r(after / measured, 4) if measured else None,
            seconds_per_config_full_wall=_r(whole / measured, 4) if measured else None,
            trials_per_gpu_minute=rates["tuner"],
            trials_per_gpu_minute_full_wall=full_wall_rate,
            trials_per_gpu_minute_subprocess_wall=_per_min(measured, ours["subprocess_wall_s"]),
            trials_per_gpu_minute_after_startup_excluding_first=_per_min(measured - 1, after),
            gpu_busy_fraction=ours.get("gpu_busy_fraction"),
            best_config=best.get("params"),
            uri=best.get("uri"),
            registers=best.get("registers"),
            timing="median over a time budget of launches, L2 flushed between launches",
            verification="every config on the GPU, bit-exact against a CuPy reference",
            definition="wall_s = command_wall_s: command start (tuner import) to the last durable write, "
            "finalists' re-timing included; trials_per_gpu_minute = measured / ((loop end - first result) / "
            "60), after start-up; _full_wall over wall_s; _subprocess_wall over the process's wall",
            study_command=ours.get("cmd"),
        )
    elif "tuner" in outcomes:
        record(
            "tuner",
            None,
            error=ours.get("error"),
            detail=_detail(ours),
            subprocess_wall_s=ours.get("subprocess_wall_s"),
        )
    for key in ("answer", "none"):
        if key not in outcomes:
            continue
        kt = outcomes[key]
        if "error" in kt:
            record(
                IMPLS[key], None, error=kt["error"], detail=_detail(kt), subprocess_wall_s=kt.get("subprocess_wall_s")
            )
            continue
        n = kt["configs_evaluated"]
        rates[key] = kt["trials_per_gpu_minute"]
        best = kt.get("best") or {}
        if not kt["configs_match_ours"] or kt["configs_failed"]:
            bad = True
        record(
            IMPLS[key],
            best.get("TBps"),
            configs_evaluated=n,
            configs_failed=kt["configs_failed"],
            failures=kt["failures"],
            configs_match_ours=kt["configs_match_ours"],
            wall_s=kt["tune_kernel_wall_s"],
            subprocess_wall_s=kt["subprocess_wall_s"],
            seconds_per_config=kt["seconds_per_config"],
            trials_per_gpu_minute=kt["trials_per_gpu_minute"],
            trials_per_gpu_minute_subprocess_wall=_per_min(n, kt["subprocess_wall_s"]),
            best_config=best.get("config"),
            best_kt_params=best.get("kt_params"),
            best_time_ms=best.get("time_ms"),
            best_times_ms=best.get("times_ms"),
            kt_timings_s=kt["kt_timings_s"],
            import_s=kt["import_s"],
            set_up_s=kt["set_up_s"],
            kernel_tuner=kt["kernel_tuner"],
            cupy=kt["cupy"],
            iterations=KT_ITERATIONS,
            verification=(
                "answer=[None, src.T, None, None]: numpy.allclose on the host" if key == "answer" else "none"
            ),
            timing=f"mean of {KT_ITERATIONS} CUDA-event-timed launches, no L2 flush (Kernel Tuner's way)",
            definition="trials_per_gpu_minute = configs / (tune_kernel wall / 60); wall_s is "
            "tune_kernel's, call to return (device set-up, search space, warm-up config "
            "included)",
        )

    def ratio(a: float | None, b: float | None) -> float | None:
        return _r(a / b, 3) if a and b else None

    by_impl = {r["impl"]: r for r in records}
    kt_best = [by_impl[IMPLS[k]]["TBps"] for k in ("answer", "none") if by_impl.get(IMPLS[k], {}).get("TBps")]
    record(
        "comparison",
        None,
        trials_per_gpu_minute_ratio_vs_kernel_tuner=ratio(rates.get("tuner"), rates.get("answer")),
        trials_per_gpu_minute_ratio_vs_kernel_tuner_unverified=ratio(rates.get("tuner"), rates.get("none")),
        trials_per_gpu_minute_ratio_vs_kernel_tuner_full_wall=ratio(full_wall_rate, rates.get("answer")),
        trials_per_gpu_minute_ratio_vs_kernel_tuner_unverified_full_wall=ratio(full_wall_rate, rates.get("none")),
        gpu_busy_fraction=ours.get("gpu_busy_fraction") if ours_ok else None,
        best_tbps_ours=by_impl.get("tuner", {}).get("TBps"),
        best_tbps_kernel_tuner=max(kt_best) if kt_best else None,
        trials_per_gpu_minute_ratio_process_to_process=ratio(
            by_impl.get("tuner", {}).get("trials_per_gpu_minute_subprocess_wall"),
            by_impl.get(IMPLS["answer"], {}).get("trials_per_gpu_minute_subprocess_wall"),
        ),
        trials_per_gpu_minute_ratio_process_to_process_unverified=ratio(
            by_impl.get("tuner", {}).get("trials_per_gpu_minute_subprocess_wall"),
            by_impl.get(IMPLS["none"], {}).get("trials_per_gpu_minute_subprocess_wall"),
        ),
        note="ratios are ours / Kernel Tuner's trials per GPU-minute: ours after start-up (loop end - first "
        "result), the _full_wall ones over our whole command wall (command start to the last durable write), "
        "Kernel Tuner's over tune_kernel's wall; process_to_process over both subprocess walls (imports, "
        "interpreter start and exit on both sides). Ours verifies every config on the GPU; 'answer' verifies "
        "on the host; 'unverified' does not verify.",
    )

    return records, gpu, ceiling, bad


def write_results(out_dir: str, outcomes, shape: str, date: str, command: str, nbytes: int, final: bool) -> bool:
    """Write (or rewrite: it runs after every contender, so a run cut short keeps what it measured) the JSON
    and the markdown; print the table when `final`. Returns whether a Kernel Tuner run looked wrong."""
    records, gpu, ceiling, bad = build_records(outcomes, shape, date, command)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"vs_kernel_tuner-{date}.json", out / f"vs_kernel_tuner-{date}.md"
    json_path.write_text(json.dumps(records, indent=1, default=str) + "\n")
    table = _table(records)
    md_path.write_text(_markdown(table, gpu, date, command, ceiling, nbytes))
    if final:
        print(f"\nwrote {json_path} and {md_path}\n")
        print("\n".join(table))
    return bad


def _fmt(x: Any, spec: str) -> str:
    return "" if x is None else format(x, spec)


def _cfg(c: dict | None) -> str:
    return f"tile {c['tile']} rpt {c['rows_per_thread']} pad {c['pad']} vec {c['vec']}" if c else ""


def _table(records: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| impl | configs | wall s | s/config | trials/GPU-min | best config | best TB/s | x ceiling |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in records:
        if r["impl"] == "comparison":
            continue
        if r.get("error"):
            lines.append(f"| {r['impl']} | failed: {r['error']} |  |  |  |  |  |  |")
            continue
        if r["impl"] == "tuner":
            n = r["measured"]
            wall = (
                f"{_fmt(r['wall_s'], '.1f')} whole ({_fmt(r['wall_after_startup_s'], '.1f')} after start-up, "
                f"{_fmt(r['subprocess_wall_s'], '.1f')} process)"
            )
            rate = (
                f"{_fmt(r['trials_per_gpu_minute'], '.0f')} after start-up, "
                f"{_fmt(r['trials_per_gpu_minute_full_wall'], '.0f')} full wall"
            )
        else:
            n = r["configs_evaluated"]
            wall = f"{_fmt(r['wall_s'], '.1f')} ({_fmt(r['subprocess_wall_s'], '.1f')} process)"
            rate = _fmt(r["trials_per_gpu_minute"], ".0f")
        lines.append(
            f"| {r['impl']} | {n} | {wall} | {_fmt(r.get('seconds_per_config'), '.3f')} | {rate} | "
            f"{_cfg(r.get('best_config'))} | {_fmt(r['TBps'], '.3f')} | "
            f"{_fmt(r.get('fraction_of_ceiling'), '.3f')} |"
        )
    comp = next((r for r in records if r["impl"] == "comparison"), None)
    key = "trials_per_gpu_minute_ratio_vs_kernel_tuner"
    parts = []
    for label, suffix in (("with answer", ""), ("unverified", "_unverified")):
        after, full = comp.get(key + suffix), comp.get(key + suffix + "_full_wall")
        if after is not None:
            parts.append(
                f"ours / Kernel Tuner {label}: {after:.2f}x after our start-up, {_fmt(full, '.2f')}x over our full wall"
            )
    for label, suffix in (("with answer", ""), ("unverified", "_unverified")):
        if comp.get(f"trials_per_gpu_minute_ratio_process_to_process{suffix}") is not None:
            ratio = comp[f"trials_per_gpu_minute_ratio_process_to_process{suffix}"]
            parts.append(f"process to process vs Kernel Tuner {label}: {ratio:.2f}x")
    if comp.get("gpu_busy_fraction") is not None:
        parts.append(f"our GPU busy fraction {comp['gpu_busy_fraction']:.2f}")
    if parts:
        lines += ["", "Trials per GPU-minute: " + "; ".join(parts) + "."]
    return lines


def _markdown(table, gpu, date, command, ceiling, nbytes) -> str:
    head = [
        f"# Tuning throughput vs Kernel Tuner on {gpu}, {date}",
        "",
        f"Command: `{command}`. FP32 transpose 8192x8192, the 45 configs of "
        "`benchmarks/spaces/transpose_8192_45.yaml`, each contender in its own process with a cold compile "
        f"cache. Copy ceiling {_fmt(ceiling, '.3f')} TB/s; TB/s count {nbytes} bytes per transpose.",
        "",
        "- tuner: `tuner study --sampler grid` (the default local engine; compiles on CPUs while the GPU "
        "measures; every config verified on the GPU). wall = the whole command wall: from the command's "
        "start (imports included) to the last write to the database, the finalists' re-timing included. "
        "Trials/GPU-min over it, and after start-up = measured / ((loop end - first result) / 60); the "
        "process wall adds the interpreter's start and exit.",
        f"- kernel_tuner: `tune_kernel`, CuPy backend, brute force, {KT_ITERATIONS} iterations; 'answer' "
        "checks every config against numpy on the host, 'unverified' checks nothing. Trials/GPU-min = "
        "configs / (tune_kernel wall / 60).",
        "- best TB/s are not measured alike: ours is a median with L2 flushed, Kernel Tuner's the mean of 7 "
        "launches without a flush.",
        "",
    ]
    return "\n".join(head + table) + "\n"


# ------------------------------------------------------------------------------------------------------------
# --check: no GPU


def _nvrtc(text: str, name: str, options: list[str]) -> tuple[int, str, bytes, str]:
    """NVRTC status, log, cubin and PTX (as text) of one source, through the package's NVRTC wrapper."""
    from tuner.build.compile import nvrtc_compile

    status, log, cubin, ptx = nvrtc_compile(text, f"{name}.cu", options)
    return status, log, cubin, ptx.decode(errors="replace")


def _norm_ptx(ptx: str, entry: str) -> str:
    """The entry function's PTX with the entry's name, comments and line info taken out. Module-scope data
    before it (our template's unused constexpr globals) is not code; a mangled local name carries the length
    of the entry's name (_ZZ<len><entry>E4tile), so that length goes too."""
    keep, inside = [], False
    for line in ptx.splitlines():
        s = line.strip()
        inside = inside or s.startswith((".visible .entry", ".entry"))
        if not inside or not s or s.startswith(("//", ".loc", ".file")):
            continue
        keep.append(re.sub(r"_ZZ\d+ENTRY", "_ZZENTRY", s.replace(entry, "ENTRY")))
    return "\n".join(keep)


def check(arch: str) -> int:
    """The no-GPU checks: space size, Kernel Tuner's search space, its kernel against ours."""
    from concurrent.futures import ThreadPoolExecutor

    from tuner.build.compile import BASE_OPTIONS, parse_ptxas
    from tuner.build.render import render

    ok = True
    space, problem = load_space()
    n = space.count_valid(problem)
    print(
        f"[{'ok' if n == EXPECTED_CONFIGS else 'FAIL'}] {SPACE.relative_to(ROOT)}: {n} valid configs "
        f"(expected {EXPECTED_CONFIGS})"
    )
    ok &= n == EXPECTED_CONFIGS

    try:
        import kernel_tuner
        from kernel_tuner import util as kt_util
        from kernel_tuner.core import KernelSource
    except ImportError as exc:
        print(f"[FAIL] cannot import kernel_tuner ({exc}); put it on PYTHONPATH")
        return 1
    sc = kt_space_check(space, problem)
    detail = (
        ""
        if sc["same"]
        else (f" (only KT: {sc['only_kt']}, only ours: {sc['only_ours']}, bad block sizes: {sc['bad_block_sizes']})")
    )
    print(
        f"[{'ok' if sc['same'] else 'FAIL'}] Kernel Tuner {kernel_tuner.__version__} search space: "
        f"{sc['kt_size']} configs, the same as ours: {sc['same']}{detail}"
    )
    ok &= sc["same"]

    family = kernels.get(space.kernel)
    source = KernelSource(KERNEL_NAME, kt_source(problem), "CuPy")
    block_size_names = list(kt_util.default_block_size_names)
    rows, cols = problem.sizes["rows"], problem.sizes["cols"]
    configs = list(space.enumerate(problem))
    jobs, geometry_bad = [], []
    for cfg in configs:
        kt_params = {KT_NAMES[k]: v for k, v in cfg.items()}
        kt_params["block_size_x"] = cfg["tile"] // cfg["vec"]
        kt_params["block_size_y"] = cfg["tile"] // cfg["rows_per_thread"]
        # what tune_kernel does per config: block and grid from the params, then its #define prefix
        threads, grid = kt_util.setup_block_and_grid(
            (cols, rows), (["TILE"], ["TILE"], None), kt_params, block_size_names
        )
        name, kt_text, _ = source.prepare_list_of_files(KERNEL_NAME, kt_params, grid, threads, block_size_names)
        ours_src = render(family, cfg, space.resolve(cfg, problem), problem.env)
        (launch,) = family.launches(ours_src.entry, cfg, problem.env)
        if tuple(threads) != tuple(launch.block) or tuple(grid) != tuple(launch.grid):
            geometry_bad.append((cfg, threads, grid, launch.block, launch.grid))
        jobs.append((cfg, name, kt_text, ours_src))
    print(
        f"[{'ok' if not geometry_bad else 'FAIL'}] Kernel Tuner's block and grid are our launches' for all "
        f"{len(configs)} configs" + (f": {geometry_bad}" if geometry_bad else "")
    )
    ok &= not geometry_bad

    # Kernel Tuner's CuPy backend: cupy.RawModule(options=KT_COMPILER_OPTIONS), to which CuPy adds -ftz=true,
    # -arch=sm_XX and --device-as-default-execution-space (and an -I of its headers); ours: BASE_OPTIONS.
    # -Xptxas=-v only adds the resource report.
    kt_opts = [*KT_COMPILER_OPTIONS, "-ftz=true", f"-arch={arch}", "--device-as-default-execution-space", "-Xptxas=-v"]
    our_opts = [*BASE_OPTIONS, f"--gpu-architecture={arch}"]

    def one(job):
        cfg, name, kt_text, ours_src = job
        kt = _nvrtc(kt_text, name, kt_opts)
        return cfg, name, kt, _nvrtc(ours_src.text, ours_src.uri, our_opts), ours_src

    compared, mismatches = [], 0
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for cfg, name, kt, ours, ours_src in pool.map(one, jobs):
            if kt[0] != 0 or ours[0] != 0:
                mismatches += 1
                which, log = ("Kernel Tuner's", kt[1]) if kt[0] else ("ours", ours[1])
                print(f"[FAIL] {_cfg(cfg)}: {which} does not compile:\n{log[-2000:]}")
                continue
            rk = parse_ptxas(kt[1]).get(name)
            ro = parse_ptxas(ours[1]).get(ours_src.entry)
            same_ptx = bool(kt[3]) and _norm_ptx(kt[3], name) == _norm_ptx(ours[3], ours_src.entry)
            same = rk is not None and rk == ro and same_ptx
            mismatches += not same
            compared.append((cfg, rk, ro, same_ptx, same))
    for cfg, rk, ro, same_ptx, same in compared:
        if not same:
            print(f"[FAIL] {_cfg(cfg)}: Kernel Tuner's {rk} vs ours {ro}, same PTX: {same_ptx}")
    print(
        f"[{'ok' if mismatches == 0 else 'FAIL'}] Kernel Tuner's source (with its #define prefix, CuPy's "
        f"options) compiles on {arch} to our rendered kernels' registers, SMEM and spills, from the same "
        f"PTX (entry name, comments and line info aside; same PTX and ptxas options, same SASS): "
        f"{len(jobs) - mismatches}/{len(jobs)} configs"
    )
    regs = sorted({rk.registers for _, rk, _, _, _ in compared if rk})
    print(f"      registers over the space: {regs}")
    ok &= mismatches == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
