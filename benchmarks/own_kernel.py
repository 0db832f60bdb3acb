"""A user's own bf16 kernel tuned four ways on one GPU, each from cold caches: tuner, Kernel Tuner, Triton's
autotune, and torch.compile's kernel beside our best.

    python benchmarks/own_kernel.py [--part 1|2|all] [--out DIR] [--budget-s 540] [--problems ...] [--only ...]
    python benchmarks/own_kernel.py --dry-run                     # no GPU: compile every config, check the set-ups
    python benchmarks/own_kernel.py --merge A.json B.json [--out DIR]   # the parts' records as one file

The kernel (benchmarks/own_kernel/) is SwiGLU, out[m, j] = silu(x[m, j]) * x[m, H + j], bf16, H = 14336
(Llama-70B), as README's "Tune your own kernel" has a user write one: ``swiglu.cu`` with cuda_bf16.h types and its
knobs as the #defines Kernel Tuner writes (vec, block_size_x, items, min_blocks: 144 configs), ``swiglu.cu.j2``
defining them from the config before it, ``swiglu.yaml`` a declarative ``kernel:`` block, ``ref.py`` a float64
reference. Problems: M = 16384 (1.41 GB moved per call) and M = 4096 (352 MB). Each contender runs in its own
process with fresh TUNER_CACHE_DIR, CUPY_CACHE_DIR, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, CUDA_CACHE_PATH
and XDG_CACHE_HOME:

1. tuner as a user types it, in a fresh project directory: ``python3 -m tuner study swiglu --space
   benchmarks/own_kernel/swiglu.yaml --problem P --trials 144 --sampler grid --json``, timed from before its
   process starts to its exit; at M = 4096 also ``tuner.tune(...)`` in a generated plain script (the notebook
   form). From the summary and the stored trials: start-up (process start to the first measurement's start), the
   GPU time of every trial and of the finalists' re-timing (Measurement.gpu_ms where the tuner records it, else
   median_ms x the timed, estimating and checked launches), and from those the overhead per config.
2. Kernel Tuner 1.5 ``tune_kernel`` on swiglu.cu itself: the same 144 configs (tune_params, grid_div_x, no
   restrictions), CuPy backend, brute force, ``answer`` computed by torch on the GPU, a bf16 ``verify`` (NumPy has
   no bfloat16: the arrays travel as their bits, the answer as float32), its cache file written as it goes, so a
   run cut short by the time budget still reports the configs it finished.
3. Triton: the same op under ``@triton.autotune`` over 16 configs (BLOCK_SIZE x num_warps); the first call's wall.
4. Side by side in one process with tuner's timing protocol, as benchmarks/head_to_head.py times peers
   (`tuner.gpu.timing.benchmark`: a read of 2x L2 before every launch, CUDA events, the stream hold): our best config
   (verified against ref.py first), torch.compile's fused kernel, torch eager, Triton's chosen config and the
   same-bytes cudaMemcpy (the fair ceiling), once per round in a shuffled order; medians over the rounds, and a
   sign test for ours against torch.compile.

Writes ``own_kernel-DATE.json`` (a list, one record per problem) and ``own_kernel-DATE.md`` under --out ($OUT,
else benchmarks/results; ``-partN`` in the names for a part), and ``own_kernel-DATE[-partN]-raw.tar.gz`` (the
study databases and Kernel Tuner's cache files). Part 1 is M = 4096 with every contender and M = 16384 without
Kernel Tuner (~6 min on an H200); part 2 is tuner and Kernel Tuner at M = 16384 (~5-8 min; tuner's compiles cold
there: merge part 2 first, and its M = 16384 tuner record is the one kept). Exit code 1 when a contender
failed or a correctness check did not pass (what the others measured is still written); 2, before any GPU work,
when ``tuner check --sample 1`` cannot compile a config (tuner does not find cuda_bf16.h yet; --force runs anyway).

Top-level imports are the standard library's only: a child process (Kernel Tuner's, Triton's) pays for nothing of
ours.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "benchmarks" / "own_kernel"
SPACE = HERE / "swiglu.yaml"
KERNEL_SOURCE = HERE / "swiglu.cu"
TEMPLATE = HERE / "swiglu.cu.j2"
INCLUDE_LINE = '{% include "swiglu.cu" %}\n'
KERNEL = "swiglu"
H = 14336
PROBLEMS = {"m16384": 16384, "m4096": 4096}
TUNE_PROBLEM = "m4096"  # the problem the notebook form (tuner.tune) runs on
PARAMS = {"vec": [1, 2, 4, 8], "block": [128, 256, 512, 1024], "items": [1, 2, 4], "min_blocks": [0, 2, 4]}
CONFIGS = 144
#: our knob → Kernel Tuner's tunable parameter (the macro swiglu.cu reads; Kernel Tuner's block size is block_size_x)
KT_NAMES = {"vec": "vec", "block": "block_size_x", "items": "items", "min_blocks": "min_blocks"}
KT_GRID_DIV_X = ["block_size_x", "items", "vec"]  # grid x = ceil(H / (block * items * vec)); grid y = M
KT_ITERATIONS = 7  # Kernel Tuner's default, passed explicitly so the record says what was used
KT_COMPILER_OPTIONS = ["-std=c++17"]  # what tuner's NVRTC options have; Kernel Tuner's CuPy backend would use c++11
#: bf16 closeness as torch.testing has it (rtol 1.6e-2), with an atol for outputs near zero
BF16_RTOL, BF16_ATOL = 1.6e-2, 1e-2
TRITON_CONFIGS = [(block, warps) for block in (512, 1024, 2048, 4096) for warps in (2, 4, 8, 16)]
CONTENDERS = ("tuner", "tune", "triton", "peers", "kernel_tuner")
PARTS = {
    "1": [("m4096", c) for c in CONTENDERS] + [("m16384", c) for c in ("tuner", "triton", "peers")],
    # tuner first on part 2's fresh machine: part 1's M = 4096 study compiled the same sources, and the GPU host
    # serves a repeated NVRTC compile (same source and options) from a cache of its own, across processes
    # (benchmarks/experiments/nvrtc_lineinfo.py: 16 GEMM configs 10.2 s on their first compile, 0.3 s in a later
    # process)
    "2": [("m16384", "tuner"), ("m16384", "kernel_tuner")],
}
PARTS["all"] = PARTS["1"] + PARTS["2"]
#: seconds a contender may take at most (each also stops at the run's --budget-s)
CAPS_S = {"tuner": 240, "tune": 120, "triton": 240, "peers": 300, "kernel_tuner": 600}
RESERVE_S = 20  # kept back from --budget-s for writing the results
MARKER = "@@own_kernel@@ "  # prefixes the one JSON line a child prints
#: multiprocessing's message when a spawned child re-runs a script that has no main guard
SPAWN_FAILURE = "has finished its bootstrapping phase"

#: what this benchmark needs from tuner that is being built on other branches (see `dependencies` in the records)
PENDING_FEATURES = {
    "cuda_bf16_include": "NVRTC include paths from the CUDA wheels: swiglu.cu includes <cuda_bf16.h> (tuner check, "
    "tuner study and tuner.tune compile it; compile_ours falls back to -I of cuda_include_dirs())",
    "bf16_arguments": "bf16 arguments declared with dtype: bfloat16 and a __nv_bfloat16* parameter",
    "xp_reference": "ref.py:swiglu takes xp (CuPy arrays: the reference on the GPU) where offered, or the input-set "
    "pool computes it once per input set: today every checked config gets a NumPy float64 reference on the host "
    "(5.6 s at M = 4096 on a 2-CPU machine, 4x that at M = 16384), which the contenders' caps do not fit",
    "gpu_ms_phases": "Measurement.gpu_ms and phases_s in every trial (else GPU time from median_ms x launches)",
    "script_spawn": "tuner.tune from a plain script with no main guard: today the study's writer process is "
    "started with multiprocessing's spawn, which re-runs the script; the study then waits for it forever",
}


def study_argv(problem: str) -> list[str]:
    """The study as a user types it (``python3 -m tuner ...``), from a directory holding benchmarks/own_kernel/."""
    return [
        *("python3", "-m", "tuner", "study", KERNEL, "--space", "benchmarks/own_kernel/swiglu.yaml"),
        *("--problem", problem, "--trials", str(CONFIGS), "--sampler", "grid", "--json"),
    ]


def kt_tune_params() -> dict[str, list[int]]:
    """Our knobs under Kernel Tuner's names: the same 144 configs, no restrictions."""
    return {KT_NAMES[name]: list(values) for name, values in PARAMS.items()}


def ours_of(kt_params: dict[str, Any]) -> dict[str, int]:
    """A Kernel Tuner config in our knob names (and order)."""
    return {name: int(kt_params[macro]) for name, macro in KT_NAMES.items()}


def template_header() -> str:
    """swiglu.cu.j2 without its include: what the notebook form pastes before swiglu.cu's text."""
    text = TEMPLATE.read_text()
    if INCLUDE_LINE not in text:
        raise RuntimeError(f"{TEMPLATE} no longer ends with {INCLUDE_LINE.strip()!r}")
    return text.replace(INCLUDE_LINE, "")


def cuda_include_dirs() -> list[str]:
    """The directory of the CUDA headers (cuda_bf16.h and what it includes): the toolkit CuPy found NVRTC in (a
    CUDA wheel's nvidia/cuXX, or a system toolkit), else an nvidia wheel, CUDA_PATH, CUDA_HOME, /usr/local/cuda."""
    candidates: list[Path] = []
    try:
        import cupy

        if cupy.cuda.get_cuda_path():
            candidates.append(Path(cupy.cuda.get_cuda_path()) / "include")
    except ImportError:
        pass
    try:
        import nvidia  # the namespace package of NVIDIA's wheels

        for base in map(Path, nvidia.__path__):
            candidates += [*sorted(base.glob("cu*/include")), base / "cuda_runtime" / "include"]
    except ImportError:
        pass
    candidates += [Path(os.environ[k]) / "include" for k in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(k)]
    candidates.append(Path("/usr/local/cuda/include"))
    found = next((c for c in candidates if (c / "cuda_bf16.h").is_file()), None)
    return [] if found is None else [str(found)]


def bf16_verify(answer, result_host, atol=BF16_ATOL) -> bool:
    """Kernel Tuner's `verify` for a bf16 output that travels as uint16 bits: decoded with torch, compared as
    torch.testing compares bf16 (rtol 1.6e-2) with `atol`."""
    import numpy as np
    import torch

    got = torch.from_numpy(np.ascontiguousarray(result_host[1]).view(np.int16)).view(torch.bfloat16).float().numpy()
    return bool(np.allclose(got, np.asarray(answer[1]).reshape(got.shape), rtol=BF16_RTOL, atol=atol))


# ---------------------------------------------------------------------------------------------------------------
# running a contender: a subprocess with fresh caches, its stdout lines stamped as they arrive


@dataclass
class Ran:
    """A finished (or killed) subprocess. `spawned_at` is `time.perf_counter()` just before it started (on Linux the
    host's monotonic clock, which the child's own perf_counter stamps share); `lines` are (seconds from spawn, line)."""

    returncode: int | None  # None: killed at its timeout
    wall_s: float
    spawned_at: float
    lines: list[tuple[float, str]] = field(default_factory=list)
    stderr: str = ""
    gave_up: bool = False  # killed when stderr showed the failure it was told to give up on

    @property
    def stdout(self) -> str:
        return "".join(line for _, line in self.lines)


def fresh_env(tmp: Path, name: str) -> dict[str, str]:
    """The environment of one contender: empty caches of its own for every compiler and JIT it may use."""
    caches = tmp / f"caches-{name}"
    env = dict(os.environ)
    for var, sub in (
        ("TUNER_CACHE_DIR", "tuner"),
        ("CUPY_CACHE_DIR", "cupy"),
        ("TRITON_CACHE_DIR", "triton"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
        ("CUDA_CACHE_PATH", "cuda"),  # the driver's PTX JIT cache (tuner's flush and hold kernels are PTX)
        ("XDG_CACHE_HOME", "xdg"),
    ):
        (caches / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(caches / sub)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env.setdefault("RAY_AUTH_MODE", "disabled")
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("KERNEL_TUNER_PARALLEL", None)
    return env


def run_timed(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float, give_up_on: str = "") -> Ran:
    """Run `cmd`, stamping each stdout line as it arrives. Past `timeout_s`, or as soon as a line of stderr holds
    `give_up_on` (a failure known to hang the process), its whole process group is killed: a study's GPU worker and
    writer are its children."""
    spawned_at = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    ran = Ran(returncode=None, wall_s=0.0, spawned_at=spawned_at)
    errors: list[str] = []

    def read_stdout() -> None:
        for line in proc.stdout:
            ran.lines.append((time.perf_counter() - spawned_at, line))

    def kill_group() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group is gone already
            pass

    def read_stderr() -> None:
        for line in proc.stderr:
            errors.append(line)
            if give_up_on and give_up_on in line and proc.poll() is None:
                ran.gave_up = True
                kill_group()

    readers = [threading.Thread(target=f, daemon=True) for f in (read_stdout, read_stderr)]
    for reader in readers:
        reader.start()
    try:
        ran.returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group()
        proc.wait()
    ran.wall_s = time.perf_counter() - spawned_at
    kill_group()  # what the process left running (its own children) would hold the GPU and the pipes
    for reader in readers:
        reader.join(timeout=10)
    ran.stderr = "".join(errors)
    return ran


def last_json(ran: Ran) -> tuple[dict[str, Any] | None, float | None]:
    """The last top-level JSON object on stdout (a --json summary, printed with indent) and when its first line
    arrived, in seconds from spawn."""
    decoder = json.JSONDecoder()
    text = ran.stdout
    offsets, at = [], 0
    for stamp, line in ran.lines:
        offsets.append((at, stamp, line))
        at += len(line)
    for start, stamp, line in reversed(offsets):
        if not line.startswith("{"):
            continue
        try:
            obj, _ = decoder.raw_decode(text[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj, stamp
    return None, None


def marked(ran: Ran) -> dict[str, Any] | None:
    """The JSON a child printed after MARKER."""
    for _, line in reversed(ran.lines):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    return None


def failure(ran: Ran, what: str, timeout_s: float) -> dict[str, Any]:
    """The record of a contender that did not deliver: why, and the tails of its output."""
    why = f"timed out after {timeout_s:.0f} s" if ran.returncode is None else f"exit code {ran.returncode}"
    if ran.gave_up:
        why = f"killed after {ran.wall_s:.0f} s: a known hang began (see stderr_tail)"
    return {
        "error": f"{what}: {why}",
        "wall_s": round(ran.wall_s, 3),
        "stdout_tail": ran.stdout[-3000:],
        "stderr_tail": ran.stderr[-3000:],
    }


# ---------------------------------------------------------------------------------------------------------------
# tuner: the CLI study and the notebook form, and what their summaries and trials say


def copy_project(where: Path) -> Path:
    """A fresh directory laid out as a user's project: benchmarks/own_kernel/ and nothing else (no studies/)."""
    shutil.copytree(HERE, where / "benchmarks" / "own_kernel", ignore=shutil.ignore_patterns("__pycache__"))
    return where


def run_tuner_cli(problem: str, tmp: Path, timeout_s: float) -> dict[str, Any]:
    """``python3 -m tuner study ...`` as typed, in a fresh project directory; its figures."""
    project = copy_project(tmp / f"project-cli-{problem}")
    argv = study_argv(problem)
    ran = run_timed([sys.executable, *argv[1:]], project, fresh_env(tmp, f"cli-{problem}"), timeout_s)
    summary, printed_s = last_json(ran)
    if ran.returncode != 0 or summary is None or "command_wall_s" not in summary:
        return failure(ran, "tuner study", timeout_s)
    # The summary is printed as soon as command_wall_s is taken: the command's clock (tuner.IMPORTED_AT) started
    # that long before the JSON arrived; what came before it is the interpreter's start.
    command_started_s = printed_s - summary["command_wall_s"]
    trials = study_trials(project / "studies" / f"{KERNEL}.db", summary["study"])
    out = tuner_figures(summary, trials, ran.wall_s, command_started_s)
    out["command"] = " ".join(shlex.quote(a) for a in argv)
    out["exit_s"] = round(ran.wall_s - printed_s, 3)  # from the summary's print to the process's exit
    out["database"] = str(project / "studies" / f"{KERNEL}.db")
    return out


TUNE_SCRIPT = """\
import time

script_started_at = time.perf_counter()

import json
from pathlib import Path

import numpy as np

import tuner


def swiglu(x, H):
    gate, up = x[:, :H], x[:, H:]
    return gate / (1.0 + np.exp(-gate)) * up


template = @HEADER@ + Path(@SOURCE@).read_text()
result = tuner.tune(
    "swiglu",
    template,
    params=@PARAMS@,
    problem=@PROBLEM@,
    reference=swiglu,
    arguments=["x: input bfloat16[M, 2 * H]", "out: output bfloat16[M, H]", "H: int32"],
    grid=["ceil_div(H, block * items * vec)", "M"],
    block="block",
    constraints=["H % vec == 0"],
    trials=@CONFIGS@,
    sampler="grid",
)
stamps = {"script_started_at": script_started_at, "imported_at": tuner.IMPORTED_AT}
print(@MARKER@ + json.dumps({**stamps, "summary": result.summary}, default=str), flush=True)
"""


def tune_script(problem: str, source: Path) -> str:
    """The notebook form as a plain script (no main guard): the same header and kernel text, the same knobs,
    the reference as a function of the script."""
    values = {
        "@HEADER@": repr(template_header()),
        "@SOURCE@": repr(str(source)),
        "@PARAMS@": repr(PARAMS),
        "@PROBLEM@": repr({"name": problem, "M": PROBLEMS[problem], "H": H, "dtype": "bfloat16"}),
        "@CONFIGS@": str(CONFIGS),
        "@MARKER@": repr(MARKER),
    }
    text = TUNE_SCRIPT
    for key, value in values.items():
        text = text.replace(key, value)
    return text


def run_tune_api(problem: str, tmp: Path, timeout_s: float) -> dict[str, Any]:
    """``tuner.tune(...)`` in a generated script, run in a fresh directory; its figures."""
    project = copy_project(tmp / f"project-tune-{problem}")
    script = project / "tune_swiglu.py"
    script.write_text(tune_script(problem, project / "benchmarks" / "own_kernel" / "swiglu.cu"))
    # Until tuner.tune runs from a script without a main guard, multiprocessing's spawn of the study's writer
    # re-runs the script and the study waits for a writer that never comes (PENDING_FEATURES["script_spawn"])
    ran = run_timed([sys.executable, script.name], project, fresh_env(tmp, f"tune-{problem}"), timeout_s, SPAWN_FAILURE)
    payload = marked(ran)
    if ran.returncode != 0 or payload is None:
        return failure(ran, "tuner.tune script", timeout_s)
    summary = payload["summary"]
    trials = study_trials(project / "studies" / f"{KERNEL}.db", summary["study"])
    out = tuner_figures(summary, trials, ran.wall_s, payload["imported_at"] - ran.spawned_at)
    out["interpreter_start_s"] = round(payload["script_started_at"] - ran.spawned_at, 3)
    out["command"] = f"python3 {script.name}  # tuner.tune(...), generated by benchmarks/own_kernel.py"
    out["database"] = str(project / "studies" / f"{KERNEL}.db")
    return out


def study_trials(db: Path, study_name: str) -> list[dict[str, Any]]:
    """Every stored trial of the study, as the figures below need them."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{db}")
    keys = ("median_ms", "repetitions", "gpu_ms", "phases_s", "tbps", "uri", "failure", "duplicate_of", "screened")
    return [
        {"number": t.number, "state": t.state.name, "params": dict(t.params), **{k: t.user_attrs.get(k) for k in keys}}
        for t in study.trials
    ]


def gpu_ms_of(figures: dict[str, Any]) -> tuple[float, str]:
    """GPU time (ms) of one measured config's own launches, and where the figure comes from: the Measurement's
    gpu_ms where the tuner records it, else median_ms x (the check launch + the 3-repetition estimate + the timed
    repetitions; a config cut short after its estimate has repetitions 3, the estimate)."""
    if figures.get("gpu_ms"):
        return float(figures["gpu_ms"]), "Measurement.gpu_ms"
    median, reps = figures.get("median_ms"), figures.get("repetitions")
    if not median or not reps:
        return 0.0, "none"
    launches = 1 + reps + (3 if reps > 3 else 0)
    return float(median) * launches, "median_ms x launches"


def tuner_figures(
    summary: dict[str, Any], trials: list[dict[str, Any]], wall_s: float, command_started_s: float
) -> dict[str, Any]:
    """Walls, start-up and per-config overhead from a study's summary and trials. `wall_s` is the process's wall
    (the whole wall a user waits); `command_started_s` when the command's clock started, from the spawn."""
    startup = summary.get("startup") or {}
    first_measure = (
        startup.get("first_measure_start_s") or max(startup.get("gpu_worker_ready_s") or [0]) or summary["cold_start_s"]
    )
    startup_s = command_started_s + first_measure
    evaluated = [t for t in trials if t["duplicate_of"] is None and t["failure"] != "invalid" and not t["screened"]]
    measured = [t for t in evaluated if t["failure"] is None and t["median_ms"]]
    trial_gpu = [gpu_ms_of(t) for t in measured]
    finalist_gpu = [gpu_ms_of(f) for f in summary.get("finalists") or [] if f.get("median_ms")]
    trials_gpu_s = sum(ms for ms, _ in trial_gpu) / 1e3
    gpu_s = trials_gpu_s + sum(ms for ms, _ in finalist_gpu) / 1e3
    configs = len(evaluated)
    loop_end = summary["wall_s"] + startup.get("imports_s", 0.0)  # the driver's loop end, on the command's clock
    window = loop_end - first_measure  # first measurement's start to the last result
    phases: dict[str, float] = {}
    for t in measured:
        for key, seconds in (t["phases_s"] or {}).items():
            phases[key] = phases.get(key, 0.0) + seconds
    gpus = summary.get("gpus") or [{}]
    best = summary.get("best") or {}
    return {
        "configs": configs,
        "measured": len(measured),
        "failures": summary.get("failures_this_run"),
        "cut_short": summary.get("cut_short_this_run"),
        "wall_s": round(wall_s, 3),
        "command_wall_s": summary["command_wall_s"],
        "command_started_s": round(command_started_s, 3),
        "first_measure_s": round(first_measure, 3),
        "startup_s": round(startup_s, 3),
        "gpu_s": round(gpu_s, 3),
        "trials_gpu_s": round(trials_gpu_s, 3),
        "gpu_s_source": sorted({source for _, source in trial_gpu}),
        "per_config_overhead_s": round((wall_s - startup_s - gpu_s) / configs, 4) if configs else None,
        "per_config_overhead_after_startup_s": round((window - trials_gpu_s) / configs, 4) if configs else None,
        "s_per_config_whole_wall": round(wall_s / configs, 4) if configs else None,
        "s_per_config_after_startup": round(window / configs, 4) if configs else None,
        "phases_s_per_config": {k: round(v / len(measured), 4) for k, v in phases.items()} if measured else {},
        "gpu_busy_fraction": summary.get("gpu_busy_fraction"),
        "finalists_s": summary.get("finalists_s"),
        "best": {k: best.get(k) for k in ("uri", "params", "tbps", "fraction_of_ceiling", "median_ms", "registers")},
        "gpu": gpus[0].get("gpu"),
        "ceiling_tbps": gpus[0].get("ceiling_tbps"),
        "versions": gpus[0].get("versions"),
        "startup": startup,
        "study": summary.get("study"),
    }


# ---------------------------------------------------------------------------------------------------------------
# children: Kernel Tuner, Triton, the side-by-side; each prints one MARKER line of JSON


def child_kernel_tuner(problem: str, cache: Path) -> dict[str, Any]:
    """tune_kernel on swiglu.cu, as a Kernel Tuner user with torch at hand writes it."""
    started = time.perf_counter()
    import cupy
    import kernel_tuner
    import numpy as np
    import torch
    import torch.nn.functional as F
    from kernel_tuner import tune_kernel

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from kt_cupy import pad_device_uuid

    pad_device_uuid(cupy)
    imported = time.perf_counter()
    M = PROBLEMS[problem]
    torch.manual_seed(0)
    x = torch.randn(M, 2 * H, device="cuda", dtype=torch.bfloat16)
    expected = F.silu(x[:, :H]) * x[:, H:]
    # NumPy has no bfloat16: the kernel's arrays travel as their bits, the answer as float32
    x_bits = x.view(torch.int16).cpu().numpy().view(np.uint16)
    answer = [None, expected.float().cpu().numpy(), None]
    del x, expected
    torch.cuda.empty_cache()
    arguments = [x_bits, np.zeros((M, H), dtype=np.uint16), np.int32(H)]
    set_up = time.perf_counter()
    results, env = tune_kernel(
        KERNEL,
        str(KERNEL_SOURCE),
        problem_size=(H, M),
        arguments=arguments,
        tune_params=kt_tune_params(),
        grid_div_x=KT_GRID_DIV_X,
        answer=answer,
        verify=bf16_verify,
        atol=BF16_ATOL,
        lang="cupy",
        compiler_options=list(KT_COMPILER_OPTIONS),
        iterations=KT_ITERATIONS,
        strategy="brute_force",
        cache=str(cache),
        verbose=False,
        quiet=True,
    )
    wall = time.perf_counter() - set_up
    out = kt_figures(results, problem)
    out.update(
        kernel_tuner=kernel_tuner.__version__,
        cupy=cupy.__version__,
        torch=torch.__version__,
        gpu=env.get("device_name"),
        import_s=round(imported - started, 3),
        set_up_s=round(set_up - imported, 3),
        tune_kernel_wall_s=round(wall, 3),
        kt_timings_s={
            k.removeprefix("total_").removesuffix("_time"): round(float(env[k]) / 1000, 3)
            for k in ("total_compile_time", "total_verification_time", "total_benchmark_time", "total_framework_time")
            if k in env
        },
    )
    return out


def kt_figures(results: list[dict[str, Any]], problem: str) -> dict[str, Any]:
    """Configs, failures and the best of Kernel Tuner's results (tune_kernel's list, or its cache's values)."""

    def timed(r: dict[str, Any]) -> bool:
        t = r.get("time")
        return isinstance(t, int | float) and not isinstance(t, bool) and t > 0

    ok = [r for r in results if timed(r)]
    failed = [r for r in results if not timed(r)]
    best = min(ok, key=lambda r: float(r["time"])) if ok else None
    nbytes = 6 * PROBLEMS[problem] * H
    ours = {tuple(c) for c in _all_configs()}
    evaluated = {tuple(ours_of(r).values()) for r in results}
    return {
        "configs_evaluated": len(results),
        "configs_failed": len(failed),
        "configs_match_ours": evaluated == ours and len(results) == len(ours),
        "failures": [{**ours_of(r), "error": str(r.get("__error__", r.get("time")))} for r in failed][:12],
        "best": None
        if best is None
        else {
            "config": ours_of(best),
            "time_ms": float(best["time"]),
            "TBps": round(nbytes / float(best["time"]) / 1e9, 4),
        },
    }


def _all_configs() -> list[tuple[int, ...]]:
    import itertools

    return [tuple(values) for values in itertools.product(*PARAMS.values())]


def read_kt_cache(path: Path) -> list[dict[str, Any]]:
    """The configs a Kernel Tuner run wrote to its cache file so far (a run that was killed leaves it open)."""
    if not path.is_file():
        return []
    text = path.read_text().rstrip()
    for tail in ("", "}\n}", "}}"):
        candidate = (text[:-1] if text.endswith(",") else text) + tail
        try:
            return list(json.loads(candidate).get("cache", {}).values())
        except json.JSONDecodeError:
            continue
    return []


def child_triton(problem: str) -> dict[str, Any]:
    """@triton.autotune's first call on the problem (every config compiled and benchmarked), then the output
    checked against torch eager."""
    started = time.perf_counter()
    import torch
    import torch.nn.functional as F
    import triton

    sys.path.insert(0, str(HERE))
    import swiglu_triton

    imported = time.perf_counter()
    M = PROBLEMS[problem]
    x = torch.randn(M, 2 * H, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M, H, device="cuda", dtype=torch.bfloat16)
    kernel = swiglu_triton.autotuned(TRITON_CONFIGS)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    swiglu_triton.swiglu(x, out, kernel)
    torch.cuda.synchronize()
    first_call_s = time.perf_counter() - t0
    expected = F.silu(x[:, :H]) * x[:, H:]
    close = torch.isclose(out.float(), expected.float(), rtol=BF16_RTOL, atol=BF16_ATOL)

    def ms(timing) -> float:  # do_bench's quantiles (median, p20, p80), or one figure
        return float(timing[0] if isinstance(timing, list | tuple) else timing)

    timings = [
        {"BLOCK_SIZE": c.kwargs["BLOCK_SIZE"], "num_warps": c.num_warps, "median_ms": ms(t)}
        for c, t in kernel.configs_timings.items()
    ]
    best = kernel.best_config
    best_ms = ms(kernel.configs_timings[best])
    return {
        "triton": triton.__version__,
        "torch": torch.__version__,
        "import_s": round(imported - started, 3),
        "first_call_s": round(first_call_s, 3),
        "bench_time_s": round(getattr(kernel, "bench_time", float("nan")), 3),
        "configs": len(timings),
        "s_per_config": round(first_call_s / len(timings), 4),
        "best": {
            "BLOCK_SIZE": best.kwargs["BLOCK_SIZE"],
            "num_warps": best.num_warps,
            "median_ms": best_ms,
            "TBps": round(6 * M * H / best_ms / 1e9, 4),
        },
        "timings": sorted(timings, key=lambda t: t["median_ms"]),
        "mismatches_vs_torch_eager": int((~close).sum().item()),
        "max_abs_diff_vs_torch_eager": float((out.float() - expected.float()).abs().max().item()),
    }


def compile_ours(space, params: dict[str, Any], problem, arch: str):
    """Our config's cubin, rendered and compiled as the study did. Depends on tuner compiling cuda_bf16.h by itself
    (PENDING_FEATURES["cuda_bf16_include"]); should it not, NVRTC gets the CUDA headers' directory here."""
    from tuner.build.compile import compile_source
    from tuner.build.render import render

    config = space.resolve(params, problem)
    source = render(space.family, params, config, problem.env)
    compiled = compile_source(source, arch)
    if not compiled.ok:
        compiled = compile_source(source, arch, options=[f"-I{d}" for d in cuda_include_dirs()])
    return compiled, config


def child_peers(problem_name: str, params: dict[str, Any], triton_best: dict | None, rounds: int, budget_ms: float):
    """Our best config, torch.compile, torch eager, Triton's chosen config and the same-bytes copy, timed with
    tuner's protocol once per round in a shuffled order (benchmarks/head_to_head.py's way)."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from head_to_head import verdict

    from tuner.gpu.ceiling import measure_ceiling
    from tuner.gpu.evaluator import GpuEvaluator
    from tuner.gpu.protocol import EvaluateRequest
    from tuner.gpu.timing import LAUNCH_HOLD, benchmark
    from tuner.space import space as space_mod

    ev = GpuEvaluator()
    ev.start()
    space = space_mod.load(SPACE)
    problem = space.problem(problem_name)
    compiled, config = compile_ours(space, params, problem, ev.arch)
    if not compiled.ok:
        return {"error": f"our config does not compile: {compiled.reason}"}
    verified = ev.evaluate(EvaluateRequest(compiled, space.family, config, problem.env, budget_ms=budget_ms))
    if not verified.ok:
        return {"error": f"our config failed its check: {verified.kind}: {verified.reason}"}
    nbytes = space.family.bytes_moved(problem.env)
    impls, outputs, compile_s, x = peer_impls(ev, space.family, compiled, config, problem, triton_best)

    shuffle = random.Random(0)
    tbps: dict[str, list[float]] = {name: [] for name in [*impls, "copy (same bytes)"]}
    torch_stream = torch.cuda.ExternalStream(ev.device.stream.ptr)
    for _ in range(rounds):
        order = list(tbps)
        shuffle.shuffle(order)
        for name in order:
            if name == "copy (same bytes)":
                tbps[name].append(
                    measure_ceiling(nbytes // 2, budget_ms, stream=ev.device.stream, flush=ev.device.flush)
                )
                continue

            def run(fn=impls[name]):
                with torch.cuda.stream(torch_stream):
                    fn()

            timing = benchmark(
                run, stream=ev.device.stream, budget_ms=budget_ms, flush=ev.device.flush, hold=ev.device.hold
            )
            tbps[name].append(nbytes / timing.median_ms / 1e9)
    checks = peer_checks(outputs, x)
    medians = {name: round(statistics.median(v), 4) for name, v in tbps.items()}
    call, wins, n, p = verdict(tbps["tuner"], tbps["torch.compile"])
    ratios = [a / b for a, b in zip(tbps["tuner"], tbps["torch.compile"], strict=True)]
    return {
        "gpu": ev.gpu_name,
        "rounds": rounds,
        "budget_ms": budget_ms,
        "protocol": f"tuner.gpu.timing.benchmark: read flush of 2x L2, CUDA events, {LAUNCH_HOLD}; median per round",
        "holds_given_up": ev.device.hold.timeouts,
        "uri": compiled.uri,
        "config": params,
        "verified": {"median_ms": verified.median_ms, "tbps": verified.tbps, "max_rel_error": verified.max_rel_error},
        "TBps_median": medians,
        "TBps_rounds": {name: [round(v, 4) for v in values] for name, values in tbps.items()},
        "fraction_of_fair_ceiling": round(medians["tuner"] / medians["copy (same bytes)"], 4),
        "vs_torch_compile": round(medians["tuner"] / medians["torch.compile"], 4),
        "vs_torch_compile_round_median": round(statistics.median(ratios), 4),
        "vs_torch_compile_verdict": {"verdict": call, "rounds_ours_faster": wins, "rounds_compared": n, "p": p},
        "torch_compile_first_call_s": round(compile_s, 3),
        "checks_vs_torch_eager": checks,
        "versions": {**ev.device.versions, "torch": torch.__version__, "triton": _version("triton")},
    }


def peer_impls(ev, family, compiled, config, problem, triton_best):
    """The callables timed side by side, on one shared x (torch's, seen by CuPy through its CUDA array interface),
    each enqueuing on the evaluator's stream; their outputs (for the checks) and torch.compile's first-call wall."""
    import cupy
    import numpy as np
    import torch
    import torch.nn.functional as F

    M = problem.env["M"]
    torch_stream = torch.cuda.ExternalStream(ev.device.stream.ptr)
    with torch.cuda.stream(torch_stream):
        x = torch.randn(M, 2 * H, device="cuda", dtype=torch.bfloat16)
        torch_stream.synchronize()
    x_bits = cupy.asarray(x.view(torch.int16)).view(cupy.uint16)
    ours_out = cupy.empty((M, H), dtype=cupy.uint16)
    module = cupy.cuda.function.Module()
    module.load(compiled.cubin)
    function = module.get_function(compiled.entry)
    (launch,) = family.launches(compiled.entry, config, problem.env)
    args = (x_bits, ours_out, np.int32(H))

    def ours():
        function(launch.grid, launch.block, args, shared_mem=launch.smem_dynamic, stream=ev.device.stream)

    def eager():
        return torch.nn.functional.silu(x[:, :H]) * x[:, H:]

    compiled_op = torch.compile(lambda x: F.silu(x[:, :H]) * x[:, H:])
    t0 = time.perf_counter()
    with torch.cuda.stream(torch_stream):
        compiled_op(x)
        torch_stream.synchronize()
    compile_s = time.perf_counter() - t0
    impls = {"tuner": ours, "torch.compile": lambda: compiled_op(x), "torch eager": eager}
    outputs = {"tuner": lambda: torch.as_tensor(ours_out.view(cupy.int16), device="cuda").view(torch.bfloat16)}
    outputs["torch.compile"] = lambda: compiled_op(x)
    if triton_best:
        sys.path.insert(0, str(HERE))
        import swiglu_triton

        triton_out = torch.empty((M, H), device="cuda", dtype=torch.bfloat16)
        meta = {"BLOCK_SIZE": triton_best["BLOCK_SIZE"], "num_warps": triton_best["num_warps"]}
        impls["triton (autotuned config)"] = lambda: swiglu_triton.swiglu(x, triton_out, **meta)
        outputs["triton (autotuned config)"] = lambda: triton_out
    return impls, outputs, compile_s, x


def peer_checks(outputs: dict[str, Any], x) -> dict[str, dict[str, float]]:
    """Each implementation's last output against torch eager's, as torch.testing compares bf16."""
    import torch

    expected = (torch.nn.functional.silu(x[:, :H]) * x[:, H:]).float()
    checks = {}
    for name, get in outputs.items():
        got = get().float()
        torch.cuda.synchronize()
        close = torch.isclose(got, expected, rtol=BF16_RTOL, atol=BF16_ATOL)
        checks[name] = {
            "mismatches": int((~close).sum().item()),
            "max_abs_diff": float((got - expected).abs().max().item()),
        }
    return checks


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def child_main(args) -> int:
    try:
        if args.child == "kernel_tuner":
            payload = child_kernel_tuner(args.problem, Path(args.kt_cache))
        elif args.child == "triton":
            payload = child_triton(args.problem)
        else:
            triton_best = json.loads(args.triton_best) if args.triton_best else None
            payload = child_peers(args.problem, json.loads(args.params), triton_best, args.rounds, args.budget_ms)
        code = 1 if "error" in payload else 0
    except BaseException as exc:  # reported on the marker line; the parent keeps the traceback
        payload = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        code = 1
    sys.stdout.flush()
    print(MARKER + json.dumps(payload, default=str), flush=True)
    return code


def run_child(mode: str, problem: str, tmp: Path, timeout_s: float, *extra: str) -> dict[str, Any]:
    """This script as --child MODE with fresh caches; its payload, with the process's wall."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--problem", problem, *extra]
    ran = run_timed(cmd, ROOT, fresh_env(tmp, f"{mode}-{problem}"), timeout_s)
    try:
        payload = marked(ran)
    except json.JSONDecodeError:
        payload = None
    if payload is None or ran.returncode is None:
        payload = {**(payload or {}), **failure(ran, mode, timeout_s)}
    elif "error" in payload:
        payload["stderr_tail"] = ran.stderr[-3000:]
    payload["subprocess_wall_s"] = round(ran.wall_s, 3)
    return payload


# ---------------------------------------------------------------------------------------------------------------
# the parent: a part's jobs in order within the budget, then one record per problem


def run_contender(contender: str, problem: str, so_far: dict[str, Any], tmp: Path, timeout_s: float, args):
    """One contender on one problem; `so_far` holds the problem's earlier outcomes (the side-by-side needs the
    study's best config and Triton's)."""
    if contender == "tuner":
        return run_tuner_cli(problem, tmp, timeout_s)
    if contender == "tune":
        return run_tune_api(problem, tmp, timeout_s)
    if contender == "triton":
        return run_child("triton", problem, tmp, timeout_s)
    if contender == "peers":
        params = ((so_far.get("tuner") or {}).get("best") or {}).get("params")
        if not params:
            return {"error": "skipped: the tuner study gave no best config"}
        extra = ["--params", json.dumps(params), "--rounds", str(args.rounds), "--budget-ms", str(args.budget_ms)]
        triton_best = (so_far.get("triton") or {}).get("best")
        if triton_best:
            extra += ["--triton-best", json.dumps(triton_best)]
        return run_child("peers", problem, tmp, timeout_s, *extra)
    cache = tmp / f"kernel_tuner-cache-{problem}.json"
    out = run_child("kernel_tuner", problem, tmp, timeout_s, "--kt-cache", str(cache))
    out["cache_file"] = str(cache)
    if "error" in out:  # cut short (the budget) or aborted (Kernel Tuner stops at a failed verify): what it did
        done = read_kt_cache(cache)
        wall = out.get("subprocess_wall_s") or 0.0
        out["partial"] = {
            **kt_figures(done, problem),
            "configs_done": len(done),
            "wall_s_when_stopped": wall,
            "wall_s_extrapolated": round(wall * CONFIGS / len(done), 1) if done else None,
        }
    return out


def run_part(args, jobs: list[tuple[str, str]], tmp: Path, started: float, write) -> dict[str, dict[str, Any]]:
    """Run the (problem, contender) jobs in order; outcomes[problem][contender]. A contender's timeout is the
    smaller of its cap and what --budget-s leaves; the results are written after each one."""
    outcomes: dict[str, dict[str, Any]] = {problem: {} for problem, _ in jobs}
    for problem, contender in jobs:
        elapsed = time.perf_counter() - started
        timeout_s = min(CAPS_S[contender], args.budget_s - elapsed - RESERVE_S)
        if timeout_s < 30:
            outcomes[problem][contender] = {"error": f"skipped: {args.budget_s - elapsed:.0f} s of the budget left"}
            continue
        print(f"[{elapsed:5.0f} s] {problem}: {contender} (up to {timeout_s:.0f} s) ...", flush=True)
        outcome = run_contender(contender, problem, outcomes[problem], tmp, timeout_s, args)
        outcomes[problem][contender] = outcome
        print(f"          {one_line(contender, outcome)}", flush=True)
        write(outcomes)
    return outcomes


def one_line(contender: str, o: dict[str, Any]) -> str:
    """What a contender's outcome says, in a line of the run's log (its keys, should a figure be missing)."""
    try:
        return _one_line(contender, o)
    except (KeyError, TypeError, ValueError):  # a figure the outcome lacks or holds as None
        return f"done: {', '.join(o)}"


def _one_line(contender: str, o: dict[str, Any]) -> str:
    if "error" in o:
        partial = o.get("partial")
        more = f"; {partial['configs_done']} configs done" if partial else ""
        return f"FAILED: {o['error']}{more}"
    if contender in ("tuner", "tune"):
        best = o["best"]
        return (
            f"{o['configs']} configs in {o['wall_s']:.1f} s (start-up {o['startup_s']:.1f} s, GPU {o['gpu_s']:.2f} s); "
            f"overhead {o['per_config_overhead_s']:.4f} s/config; best {best['uri']} {best['tbps']:.3f} TB/s"
        )
    if contender == "kernel_tuner":
        best = o.get("best") or {}
        return (
            f"{o['configs_evaluated']} configs in {o['subprocess_wall_s']:.1f} s (tune_kernel "
            f"{o['tune_kernel_wall_s']:.1f} s), {o['configs_failed']} failed; best {best.get('time_ms')} ms"
        )
    if contender == "triton":
        return f"{o['configs']} configs, first call {o['first_call_s']:.1f} s; best {o['best']}"
    medians = ", ".join(f"{k} {v:.3f}" for k, v in o["TBps_median"].items())
    call = o["vs_torch_compile_verdict"]["verdict"]
    return f"TB/s: {medians}; ours / torch.compile {o['vs_torch_compile']:.3f} ({call})"


def build_record(problem: str, outcomes: dict[str, Any], date: str, commands: list[str]) -> dict[str, Any]:
    """The problem's record: the headline figures at the top level, every contender's outcome under
    `contenders` (which --merge rebuilds from)."""
    ok = {name: o for name, o in outcomes.items() if o and "error" not in o}
    ours, kt, tri, peers = (ok.get(k, {}) for k in ("tuner", "kernel_tuner", "triton", "peers"))
    kt_partial = (outcomes.get("kernel_tuner") or {}).get("partial") or {}
    kt_best = kt.get("best") or kt_partial.get("best") or {}
    best = ours.get("best") or {}
    medians = peers.get("TBps_median") or {}
    M = PROBLEMS[problem]
    record = {
        "kernel": KERNEL,
        "problem": problem,
        "shape": f"M={M} H={H} bf16: x {M}x{2 * H}, out {M}x{H}",
        "gpu": ours.get("gpu") or peers.get("gpu") or kt.get("gpu"),
        "problem_bytes": 6 * M * H,
        "configs": ours.get("configs"),
        **{
            k: ours.get(k)
            for k in (
                "wall_s",
                "startup_s",
                "per_config_overhead_s",
                "per_config_overhead_after_startup_s",
                "s_per_config_whole_wall",
                "s_per_config_after_startup",
                "gpu_s",
            )
        },
        "kernel_tuner_wall_s": kt.get("subprocess_wall_s"),
        "kernel_tuner_tune_kernel_wall_s": kt.get("tune_kernel_wall_s"),
        "kernel_tuner_best_ms": kt_best.get("time_ms"),
        "kernel_tuner_complete": bool(kt),
        "kernel_tuner_configs": kt.get("configs_evaluated") or kt_partial.get("configs_done"),
        "kernel_tuner_wall_s_extrapolated": kt_partial.get("wall_s_extrapolated"),
        "triton_s_per_config": tri.get("s_per_config"),
        "triton_configs": tri.get("configs"),
        "triton_first_call_s": tri.get("first_call_s"),
        "vs_torch_compile": peers.get("vs_torch_compile"),
        "vs_torch_compile_verdict": (peers.get("vs_torch_compile_verdict") or {}).get("verdict"),
        "best": {
            "uri": best.get("uri"),
            "params": best.get("params"),
            "TBps": best.get("tbps"),
            "median_ms": best.get("median_ms"),
            "fraction_of_ceiling": best.get("fraction_of_ceiling"),
            "ceiling_TBps": ours.get("ceiling_tbps"),
            "TBps_side_by_side": medians.get("tuner"),
            "copy_same_bytes_TBps": medians.get("copy (same bytes)"),
            "fraction_of_fair_ceiling": peers.get("fraction_of_fair_ceiling"),
        },
        "side_by_side_TBps": medians,
        "tune_api": summary_of_tune(ok.get("tune")),
        "date": date,
        "command": commands[0] if len(commands) == 1 else commands,
        "versions": versions_of(ok),
        "failed": {name: o["error"] for name, o in outcomes.items() if o and "error" in o},
        "definitions": DEFINITIONS,
        "dependencies": PENDING_FEATURES,
        "contenders": outcomes,
    }
    return record


def summary_of_tune(tune: dict[str, Any] | None) -> dict[str, Any] | None:
    if not tune:
        return None
    keys = ("configs", "wall_s", "startup_s", "per_config_overhead_s", "per_config_overhead_after_startup_s")
    return {
        **{k: tune.get(k) for k in keys},
        "s_per_config_whole_wall": tune.get("s_per_config_whole_wall"),
        "best": tune.get("best"),
    }


def versions_of(ok: dict[str, dict[str, Any]]) -> dict[str, Any]:
    import platform

    out: dict[str, Any] = {"python": platform.python_version()}
    for name in ("tuner", "peers"):
        out.update({k: v for k, v in (ok.get(name, {}).get("versions") or {}).items() if v is not None})
    for name, keys in (("kernel_tuner", ("kernel_tuner", "cupy", "torch")), ("triton", ("triton", "torch"))):
        out.update({k: ok[name][k] for k in keys if name in ok and ok[name].get(k)})
    try:
        import tuner

        out["tuner"] = tuner.__version__
    except ImportError:
        pass
    return out


DEFINITIONS = {
    "wall_s": "tuner study's whole wall: from before its process starts to its exit (interpreter start, imports, "
    "GPU worker, search, finalists' re-timing, last database write, exit)",
    "startup_s": "process start to the start of the first measurement on the GPU (summary startup "
    "first_measure_start_s on the command's clock, plus the interpreter's start before it)",
    "gpu_s": "GPU time of every measured config's own launches and of the finalists' (Measurement.gpu_ms, else "
    "median_ms x (check + 3-repetition estimate + timed repetitions))",
    "per_config_overhead_s": "(wall_s - startup_s - gpu_s) / configs",
    "per_config_overhead_after_startup_s": "(driver loop's end - first measurement's start - the trials' GPU time) / "
    "configs: the steady-state cost per config around its GPU time",
    "s_per_config_whole_wall": "wall_s / configs",
    "kernel_tuner_wall_s": "Kernel Tuner's process wall (imports, torch inputs and answer, tune_kernel, exit)",
    "kernel_tuner_best_ms": "Kernel Tuner's best 'time': the mean of 7 CUDA-event-timed launches without an L2 flush",
    "triton_s_per_config": "the autotuned kernel's first call (compile + do_bench of every config) / configs",
    "vs_torch_compile": "our best config's median TB/s / torch.compile's, side by side in one process",
    "fraction_of_fair_ceiling": "our side-by-side TB/s / the same-bytes cudaMemcpy's, same process and protocol",
}


def config_text(config: dict[str, Any]) -> str:
    """A config as our uris spell it: vec8_block256_items2_min_blocks0."""
    return "_".join(f"{k}{v}" for k, v in config.items())


def _f(x: Any, spec: str, missing: str = "-") -> str:
    return missing if x is None else format(x, spec)


def markdown(records: list[dict[str, Any]], date: str, commands: list[str]) -> str:
    """The results file: command, GPU, date, the headline table, the side-by-side, the notebook form, failures."""
    gpu = next((r["gpu"] for r in records if r.get("gpu")), "?")
    lines = [
        f"# A user's own bf16 kernel (SwiGLU, H = {H}) tuned four ways on {gpu}, {date}",
        "",
        "Command: " + "; ".join(f"`{c}`" for c in commands) + ". 144 configs of benchmarks/own_kernel/swiglu.yaml "
        "(vec x block x items x min_blocks), every contender in its own process with empty compile caches. tuner: "
        "`python3 -m tuner study swiglu --space benchmarks/own_kernel/swiglu.yaml --problem P --trials 144 --sampler "
        "grid --json` (every config verified on the GPU against ref.py). Kernel Tuner 1.5: tune_kernel on the same "
        "swiglu.cu, CuPy backend, brute force, 7 iterations, answer from torch checked on the host. Triton: "
        "@triton.autotune over 16 configs, first call. Side by side: tuner's protocol in one process (read flush, "
        "CUDA events, stream hold), medians over shuffled rounds.",
        "",
        "| problem | MB moved | tuner wall s (start-up) | s/config, whole wall | overhead/config s (after start-up) "
        "| Kernel Tuner wall s | Triton s/config | best config | TB/s | x copy, same bytes | ours / torch.compile |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in records:
        kt = _f(r["kernel_tuner_wall_s"], ".1f")
        if not r["kernel_tuner_complete"] and r.get("kernel_tuner_configs"):
            estimate = _f(r["kernel_tuner_wall_s_extrapolated"], ".0f")
            kt = f"stopped after {r['kernel_tuner_configs']} configs (~{estimate} for all)"
        best = r["best"]
        vs = _f(r["vs_torch_compile"], ".3f")
        if r.get("vs_torch_compile_verdict"):
            vs += f" ({r['vs_torch_compile_verdict']})"
        lines.append(
            f"| {r['problem']} | {r['problem_bytes'] / 1e6:.0f} "
            f"| {_f(r['wall_s'], '.1f')} ({_f(r['startup_s'], '.1f')}) "
            f"| {_f(r['s_per_config_whole_wall'], '.4f')} | {_f(r['per_config_overhead_s'], '.4f')} "
            f"({_f(r['per_config_overhead_after_startup_s'], '.4f')}) | {kt} | {_f(r['triton_s_per_config'], '.3f')} "
            f"| {best.get('uri') or '-'} | {_f(best.get('TBps_side_by_side') or best.get('TBps'), '.3f')} "
            f"| {_f(best.get('fraction_of_fair_ceiling'), '.3f')} | {vs} |"
        )
    lines += side_by_side_lines(records) + best_lines(records)
    for r in records:
        if r.get("tune_api"):
            t = r["tune_api"]
            lines += [
                "",
                f"`tuner.tune(...)` in a plain script ({r['problem']}): {t['configs']} configs in "
                f"{_f(t['wall_s'], '.1f')} s whole wall (start-up {_f(t['startup_s'], '.1f')} s), overhead "
                f"{_f(t['per_config_overhead_s'], '.4f')} s/config "
                f"({_f(t['per_config_overhead_after_startup_s'], '.4f')} "
                f"after start-up); best {(t.get('best') or {}).get('uri')}.",
            ]
    for r in records:
        for name, why in r["failed"].items():
            lines.append(f"\n{r['problem']} {name}: {why}")
    return "\n".join(lines) + "\n"


def side_by_side_lines(records: list[dict[str, Any]]) -> list[str]:
    names = ["tuner", "torch.compile", "torch eager", "triton (autotuned config)", "copy (same bytes)"]
    lines = ["", "Side by side, TB/s (medians over the rounds):", "", "| problem | " + " | ".join(names) + " |"]
    lines.append("|---|" + "---:|" * len(names))
    for r in records:
        m = r.get("side_by_side_TBps") or {}
        lines.append(f"| {r['problem']} | " + " | ".join(_f(m.get(n), ".3f") for n in names) + " |")
    return lines


def best_lines(records: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "Best config per tuner, each timed its own way (tuner: median, L2 flushed; Kernel Tuner: mean of 7, no "
        "flush; Triton: do_bench median):",
        "",
        "| problem | tuner | Kernel Tuner | Triton |",
        "|---|---|---|---|",
    ]
    for r in records:
        c = r["contenders"]
        ours = r["best"]
        kt_outcome = c.get("kernel_tuner") or {}
        kt = kt_outcome.get("best") or (kt_outcome.get("partial") or {}).get("best")
        tri = (c.get("triton") or {}).get("best")
        tri_text = f"BLOCK_SIZE {tri['BLOCK_SIZE']} num_warps {tri['num_warps']}" if tri else "-"
        lines.append(
            f"| {r['problem']} | {ours.get('uri') or '-'}: {_f(ours.get('median_ms'), '.4f')} ms "
            f"| {config_text(kt['config']) if kt else '-'}: {_f((kt or {}).get('time_ms'), '.4f')} ms "
            f"| {tri_text}: {_f((tri or {}).get('median_ms'), '.4f')} ms |"
        )
    return lines


def write_results(out: Path, stem: str, records: list[dict[str, Any]], date: str, commands: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(records, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown(records, date, commands))


def bundle_raw(out: Path, stem: str, outcomes: dict[str, dict[str, Any]]) -> Path | None:
    """The study databases and Kernel Tuner's cache files as one tarball (few files come back from a device call)."""
    paths = []
    for problem, by_contender in outcomes.items():
        for name, o in by_contender.items():
            for key in ("database", "cache_file"):
                if o.get(key) and Path(o[key]).is_file():
                    paths.append((Path(o[key]), f"{problem}-{name}-{Path(o[key]).name}"))
    if not paths:
        return None
    target = out / f"{stem}-raw.tar.gz"
    with tarfile.open(target, "w:gz") as tar:
        for path, name in paths:
            tar.add(path, arcname=name)
    return target


def merge(paths: list[str], out: Path) -> int:
    """Records of several parts (own_kernel-*-partN.json) as one own_kernel-DATE.json/.md: each problem's
    contenders from every part (a later part's outcome of a contender replaces an earlier failure)."""
    by_problem: dict[str, dict[str, Any]] = {}
    commands: list[str] = []
    date = None
    for path in paths:
        for record in json.loads(Path(path).read_text()):
            date = date or record["date"]
            cmds = record["command"] if isinstance(record["command"], list) else [record["command"]]
            commands += [c for c in cmds if c not in commands]
            merged = by_problem.setdefault(record["problem"], {})
            for name, o in record["contenders"].items():
                if name not in merged or ("error" in merged[name] and "error" not in o):
                    merged[name] = o
    order = [p for p in PROBLEMS if p in by_problem][::-1]  # the smaller problem first
    records = [build_record(p, by_problem[p], date, commands) for p in order]
    write_results(out, f"own_kernel-{date}", records, date, commands)
    print(markdown(records, date, commands))
    return 0


# ---------------------------------------------------------------------------------------------------------------
# --dry-run: everything that needs no GPU


def dry_space() -> list[tuple[str, bool, str]]:
    """The space: 144 valid configs and 6·M·H bytes per problem; both problems render the same CUDA."""
    from tuner.build.render import render
    from tuner.space import space as space_mod

    space = space_mod.load(SPACE)
    out = []
    for p in space.problems:
        n, nbytes = space.count_valid(p), space.family.bytes_moved(p.env)
        good = n == CONFIGS and nbytes == 6 * PROBLEMS[p.name] * H
        out.append((f"{SPACE.relative_to(ROOT)} {p.name}: {n} valid configs, {nbytes} bytes per call", good, ""))
    a, b = space.problem("m16384"), space.problem("m4096")
    same = all(
        render(space.family, c, space.resolve(c, a), a.env).text
        == render(space.family, c, space.resolve(c, b), b.env).text
        for c in space.enumerate(a)
    )
    out.append(("the two problems render the same source for every config", same, ""))
    return out


def dry_tuner_check(tmp: Path, sample: int | None = None) -> tuple[str, bool, str]:
    """``tuner check`` on the space (every config, or a sample), as a user runs it: it passes once tuner finds
    cuda_bf16.h itself (PENDING_FEATURES["cuda_bf16_include"])."""
    cmd = [sys.executable, "-m", "tuner", "check", str(SPACE.relative_to(ROOT)), "--json"]
    cmd += [] if sample is None else ["--sample", str(sample)]
    ran = run_timed(cmd, ROOT, fresh_env(tmp, f"check-{sample}"), 600)
    report, _ = last_json(ran)
    if report is None:
        return "tuner check: no JSON report", False, ran.stderr[-1500:]
    reasons = [c.get("reason", "") for c in report.get("configs", []) if c.get("failure")]
    good = report.get("failed") == 0 and report.get("compiled") == (sample or CONFIGS)
    detail = "" if good else f"first failure: {reasons[0][:300] if reasons else '?'}"
    return f"tuner check: {report.get('compiled')} compiled, {report.get('failed')} failed", good, detail


def dry_compiles(arch: str, includes: list[str]) -> list[tuple[str, bool, str]]:
    """Every config through NVRTC three ways: ours as rendered; Kernel Tuner's string (its #define prefix before
    swiglu.cu) with our options, whose PTX must be ours; and that string with the options Kernel Tuner's CuPy
    backend compiles with (`cupy_options`; CuPy adds -ftz=true and the arch)."""
    from concurrent.futures import ThreadPoolExecutor

    from kernel_tuner import util as kt_util
    from kernel_tuner.core import KernelSource
    from vs_kernel_tuner import _norm_ptx

    from tuner.build.compile import BASE_OPTIONS, nvrtc_compile, parse_ptxas
    from tuner.build.render import render
    from tuner.space import space as space_mod

    space = space_mod.load(SPACE)
    problem = space.problem("m16384")
    source = KernelSource(KERNEL, str(KERNEL_SOURCE), "cupy")
    names = list(kt_util.default_block_size_names)
    incl = [f"-I{d}" for d in includes]
    ours_opts = [*BASE_OPTIONS, f"--gpu-architecture={arch}", *incl]
    kt_opts = [*cupy_options(KT_COMPILER_OPTIONS, incl), "-ftz=true", f"-arch={arch}"]
    kt_opts += ["--device-as-default-execution-space", "-Xptxas=-v"]

    def one(params):
        rendered = render(space.family, params, space.resolve(params, problem), problem.env)
        kt_params = {KT_NAMES[k]: v for k, v in params.items()}
        threads, grid = kt_util.setup_block_and_grid(
            (H, problem.env["M"]), (KT_GRID_DIV_X, None, None), kt_params, names
        )
        name, kt_text, _ = source.prepare_list_of_files(KERNEL, kt_params, grid, threads, names)
        ours = nvrtc_compile(rendered.text, f"{rendered.uri}.cu", ours_opts)
        twin = nvrtc_compile(kt_text, f"{name}.cu", ours_opts)
        kt = nvrtc_compile(kt_text, f"{name}.cu", kt_opts)
        return params, rendered.entry, name, ours, twin, kt

    rows, bad = [], []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for params, entry, name, ours, twin, kt in pool.map(one, space.enumerate(problem)):
            if ours[0] or twin[0] or kt[0]:
                bad.append((params, next(c[1] for c in (ours, twin, kt) if c[0])[-800:]))
                continue
            same = _norm_ptx(ours[3].decode(), entry) == _norm_ptx(twin[3].decode(), name)
            rows.append((params, parse_ptxas(ours[1]).get(entry), parse_ptxas(kt[1]).get(name), same))
    spills = sorted({f"{p}" for p, r, _, _ in rows if r and (r.spill_store_bytes or r.spill_load_bytes)})
    regs = sorted({r.registers for _, r, _, _ in rows if r})
    return [
        (
            f"our {len(rows)}/{CONFIGS} rendered configs compile for {arch} (registers {regs})",
            not bad,
            str(bad[:2]) if bad else "",
        ),
        (
            f"Kernel Tuner's string compiles with CuPy's options and, with ours, to our PTX: "
            f"{sum(same for *_, same in rows)}/{CONFIGS}",
            not bad and all(same for *_, same in rows),
            "",
        ),
        (f"configs that spill (min_blocks caps their registers): {len(spills)}", True, "; ".join(spills[:6])),
    ]


def cupy_options(options: list[str], fallback_includes: list[str]) -> list[str]:
    """The NVRTC options CuPy's RawModule (Kernel Tuner's CuPy backend) compiles with: its bundled CCCL first, its
    own headers, the CUDA headers of the toolkit it found (cupy._core.core.assemble_cupy_compiler_options, a
    private function: where it is missing, `options` and the CUDA headers we found)."""
    try:
        from cupy._core.core import assemble_cupy_compiler_options
    except ImportError:
        return [*options, *fallback_includes]
    return list(assemble_cupy_compiler_options(tuple(options)))


def dry_kernel_tuner() -> list[tuple[str, bool, str]]:
    """Kernel Tuner's search space is our 144 configs, and its block and grid are our launches'."""
    from kernel_tuner import util as kt_util
    from kernel_tuner.searchspace import Searchspace

    from tuner.space import space as space_mod

    space = space_mod.load(SPACE)
    ss = Searchspace(kt_tune_params(), None, 1024)
    names = list(kt_util.default_block_size_names)
    theirs = {tuple(ours_of(dict(zip(kt_tune_params(), c, strict=True))).values()) for c in ss.sorted_list()}
    same_space = ss.size == CONFIGS and theirs == set(_all_configs())
    mismatches = []
    for p in space.problems:
        for params in space.enumerate(p):
            config = space.resolve(params, p)
            (launch,) = space.family.launches("swiglu", config, p.env)
            kt_params = {KT_NAMES[k]: v for k, v in params.items()}
            threads, grid = kt_util.setup_block_and_grid((H, p.env["M"]), (KT_GRID_DIV_X, None, None), kt_params, names)
            if tuple(threads) != tuple(launch.block) or tuple(grid) != tuple(launch.grid):
                mismatches.append((p.name, params, threads, grid, launch.block, launch.grid))
    return [
        (f"Kernel Tuner's search space: {ss.size} configs, ours: {same_space}", same_space, ""),
        (
            "Kernel Tuner's block and grid (problem_size (H, M), grid_div_x block_size_x*items*vec) are our launches' "
            "on both problems",
            not mismatches,
            str(mismatches[:2]) if mismatches else "",
        ),
    ]


def dry_verify() -> list[tuple[str, bool, str]]:
    """bf16_verify accepts a correct bf16 output and refuses a wrong one (needs torch; skipped without it)."""
    try:
        import numpy as np
        import torch
    except ImportError:
        return [("bf16_verify: skipped (no torch here)", True, "")]
    x = torch.randn(64, 2 * 256, dtype=torch.bfloat16)
    expected = torch.nn.functional.silu(x[:, :256]) * x[:, 256:]
    fp32 = x[:, :256].float() / (1 + torch.exp(-x[:, :256].float())) * x[:, 256:].float()
    bits = fp32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    answer = [None, expected.float().numpy(), None]
    good = bf16_verify(answer, [None, bits, None])
    wrong = bits.copy()
    wrong[3, 5] ^= 0x4000  # an exponent bit: a value far off
    return [
        (
            "bf16_verify accepts the kernel's rounding, refuses a wrong element",
            good and not bf16_verify(answer, [None, wrong, None]),
            "",
        )
    ]


def dry_reference() -> list[tuple[str, bool, str]]:
    """ref.py against a NumPy SwiGLU written another way, through the declarative family's own path (bf16 inputs
    decoded, float64), and a NumPy emulation of the kernel (fp32 math, one bf16 rounding) within the tolerance the
    GPU check applies."""
    import numpy as np

    from tuner.kernels import bf16
    from tuner.space import space as space_mod

    sys.path.insert(0, str(HERE))
    import ref

    family = space_mod.load(SPACE).family
    env = {"name": "tiny", "M": 64, "H": 256, "dtype": "bfloat16", "elem_bytes": 2}
    inputs = family.inputs(np, env, np.random.default_rng(0))
    expected = family.reference(np, inputs, env)["out"]
    x = bf16.decode(np, inputs["x"]).astype(np.float64)
    gate, up = x[:, :256], x[:, 256:]
    tiny = gate * 0.5 * (1 + np.tanh(gate / 2)) * up  # silu(g) = g * sigmoid(g), sigmoid(z) = (1 + tanh(z/2)) / 2
    g32, u32 = gate.astype(np.float32), up.astype(np.float32)
    kernel = bf16.decode(np, bf16.encode(np, g32 / (np.float32(1) + np.exp(-g32)) * u32)).astype(np.float64)
    tol = family.tolerance(env)
    rel = np.abs(kernel - expected) / np.maximum(np.abs(expected), 1)
    direct = ref.swiglu(x.astype(np.float32), 256)
    # the family hands a NumPy reference of 16-bit outputs float32 arrays: float32 rounding, not float64's
    off = np.abs(expected - tiny).max() / max(np.abs(tiny).max(), 1.0)
    return [
        (
            f"ref.py:swiglu == a tiny float64 SwiGLU within float32 rounding (max rel diff {off:.1e}), and the "
            "family calls it as written",
            bool(off < 1e-6 and np.array_equal(direct, expected)),
            "",
        ),
        (
            f"the kernel's math (fp32, one bf16 rounding) is within tolerance {tol}: max rel {rel.max():.2e}",
            bool(rel.max() <= tol),
            "",
        ),
    ]


def dry_tune_form(tmp: Path) -> list[tuple[str, bool, str]]:
    """The notebook form: its generated script compiles, and tuner.tune_space with the script's arguments gives the
    same 144 configs and the same CUDA source as swiglu.yaml."""
    import numpy as np

    import tuner
    from tuner.build.render import render
    from tuner.space import space as space_mod

    script = tune_script(TUNE_PROBLEM, KERNEL_SOURCE)
    compile(script, "tune_swiglu.py", "exec")

    def swiglu(x, H, xp=np):
        gate, up = x[:, :H], x[:, H:]
        return gate / (1.0 + xp.exp(-gate)) * up

    tuned = tuner.tune_space(
        KERNEL,
        template_header() + KERNEL_SOURCE.read_text(),
        params=PARAMS,
        problem={"name": TUNE_PROBLEM, "M": PROBLEMS[TUNE_PROBLEM], "H": H, "dtype": "bfloat16"},
        reference=swiglu,
        arguments=["x: input bfloat16[M, 2 * H]", "out: output bfloat16[M, H]", "H: int32"],
        grid=["ceil_div(H, block * items * vec)", "M"],
        block="block",
        constraints=["H % vec == 0"],
        directory=tmp / "tune_form",
    )
    space = space_mod.load(SPACE)
    a, b = tuned.problem(), space.problem(TUNE_PROBLEM)
    same = all(
        render(tuned.family, c, tuned.resolve(c, a), a.env).text
        == render(space.family, c, space.resolve(c, b), b.env).text
        for c in space.enumerate(b)
    )
    launches_same = all(
        tuned.family.launches("e", tuned.resolve(c, a), a.env) == space.family.launches("e", space.resolve(c, b), b.env)
        for c in space.enumerate(b)
    )
    return [
        (
            f"tuner.tune's space: {tuned.count_valid(a)} configs; the same CUDA as swiglu.yaml for every one: {same}; "
            f"same launches: {launches_same}",
            tuned.count_valid(a) == CONFIGS and same and launches_same,
            "",
        )
    ]


def dry_triton() -> list[tuple[str, bool, str]]:
    import ast

    ast.parse((HERE / "swiglu_triton.py").read_text())
    distinct = len(set(TRITON_CONFIGS)) == 16 and all(b & (b - 1) == 0 for b, _ in TRITON_CONFIGS)
    out = [(f"Triton: {len(TRITON_CONFIGS)} configs (BLOCK_SIZE x num_warps), swiglu_triton.py parses", distinct, "")]
    try:
        sys.path.insert(0, str(HERE))
        import swiglu_triton
    except ImportError as exc:
        out.append((f"Triton's autotuner: not built here ({exc.name} missing)", True, ""))
    else:
        n = len(swiglu_triton.autotuned(TRITON_CONFIGS).configs)
        out.append((f"Triton's autotuner built over {n} configs", n == 16, ""))
    return out


def device_commands() -> list[str]:
    pre = (
        "mkdir -p /tmp/site && tar -C /tmp/site -xJf .devcarry/devsite.txz && export PYTHONPATH=$PWD:/tmp/site "
        "RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1;"
    )
    return [f"{pre} python3 benchmarks/own_kernel.py --part {part} --out $OUT" for part in ("1", "2")]


def dry_run(args) -> int:
    """Run every check that needs no GPU; exit 1 when one fails (tuner check's is reported, not counted, until
    tuner compiles cuda_bf16.h itself: `PENDING_FEATURES`)."""
    started = time.perf_counter()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    includes = cuda_include_dirs()
    print(f"CUDA headers for the dry run's own compiles: {includes or 'NOT FOUND'}")
    tmp = Path(tempfile.mkdtemp(prefix="own_kernel_dry_"))
    try:
        results = dry_space() + dry_reference() + dry_verify() + dry_tune_form(tmp) + dry_triton()
        results += dry_kernel_tuner() + dry_compiles(args.arch, includes)
        check = dry_tuner_check(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    failed = 0
    for what, good, detail in results:
        failed += not good
        print(f"[{'ok' if good else 'FAIL'}] {what}" + (f"\n       {detail}" if detail and not good else ""))
        if detail and good:
            print(f"       {detail}")
    what, good, detail = check
    print(f"[{'ok' if good else 'pending'}] {what}" + ("" if good else f"\n       {detail}"))
    print('\nOn the H200, one device call per part (carry [".devcarry"]):')
    for line in device_commands():
        print(f"  {line}")
    print(f"\ndry run: {time.perf_counter() - started:.0f} s, {failed} failed")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--part",
        choices=sorted(PARTS),
        default="all",
        help="1: M = 4096 every contender and M = "
        "16384 but Kernel Tuner; 2: Kernel Tuner at M = 16384; all (default): both, within --budget-s",
    )
    parser.add_argument("--problems", nargs="*", choices=list(PROBLEMS), help="keep only these of the part's jobs")
    parser.add_argument("--only", nargs="*", choices=CONTENDERS, help="keep only these contenders")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--budget-s", type=float, default=540.0, help="wall for the whole run (default 540)")
    parser.add_argument("--rounds", type=int, default=8, help="side-by-side rounds (default 8)")
    parser.add_argument("--budget-ms", type=float, default=200.0, help="timed launches per impl and round")
    parser.add_argument("--keep-tmp", action="store_true", help="keep the projects, caches and databases")
    parser.add_argument(
        "--force", action="store_true", help="run even when tuner check cannot compile a config (the preflight)"
    )
    parser.add_argument("--dry-run", action="store_true", help="no GPU: compile every config, check every set-up")
    parser.add_argument("--arch", default="sm_90", help="--dry-run: the arch to compile for")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="merge the parts' JSON files into one; exit")
    for hidden in ("--child", "--problem", "--kt-cache", "--params", "--triton-best"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args)
    if args.dry_run:
        return dry_run(args)
    out = Path(args.out)
    if args.merge:
        return merge(args.merge, out)

    jobs = [
        (p, c)
        for p, c in PARTS[args.part]
        if (not args.problems or p in args.problems) and (not args.only or c in args.only)
    ]
    date = dt.date.today().isoformat()
    stem = f"own_kernel-{date}" + ("" if args.part == "all" else f"-part{args.part}")
    script = os.path.relpath(Path(sys.argv[0]).resolve(), ROOT)
    command = "python3 " + " ".join(shlex.quote(a) for a in [script, *sys.argv[1:]])
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="own_kernel_"))

    def write(outcomes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        records = [build_record(p, o, date, [command]) for p, o in outcomes.items()]
        write_results(out, stem, records, date, [command])
        return records

    try:
        # A tuner that cannot compile cuda_bf16.h yet would spend the device call on failed studies: stop first.
        if not args.force and any(c in ("tuner", "tune", "peers") for _, c in jobs):
            what, good, detail = dry_tuner_check(tmp, sample=1)
            if not good:
                print(f"preflight: {what}; {detail}\nnot running (--force runs anyway)", file=sys.stderr)
                return 2
        outcomes = run_part(args, jobs, tmp, started, write)
        records = write(outcomes)
        raw = bundle_raw(out, stem, outcomes)
    finally:
        if args.keep_tmp:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\nwrote {out / stem}.json, .md"
        + (f" and {raw.name}" if raw else "")
        + f" in {time.perf_counter() - started:.0f} s\n"
    )
    print(markdown(records, date, [command]))
    return 1 if any(run_was_bad(r) for r in records) else 0


def run_was_bad(record: dict[str, Any]) -> bool:
    """A contender failed, a config computed a wrong result, or Kernel Tuner did other configs than ours."""
    c = record["contenders"]
    wrong = ((c.get("tuner") or {}).get("failures") or {}).get("wrong_result")
    checks = ((c.get("peers") or {}).get("checks_vs_torch_eager") or {}).values()
    kt = c.get("kernel_tuner") or {}
    kt_bad = "error" not in kt and kt and (kt.get("configs_failed") or not kt.get("configs_match_ours"))
    return bool(record["failed"] or wrong or any(x["mismatches"] for x in checks) or kt_bad)


if __name__ == "__main__":
    sys.exit(main())
