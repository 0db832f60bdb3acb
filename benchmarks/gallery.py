"""The gallery of user kernels under examples/ tuned on one GPU as a user types it, then timed beside torch.compile,
torch eager and a same-bytes copy.

    python benchmarks/gallery.py [--out DIR] [--budget-s 510] [--only add_rmsnorm scale_add ...]
    python benchmarks/gallery.py --dry-run            # no GPU: compile every config, check the torch ports

The examples (`EXAMPLES`): add_rmsnorm (a fused residual add + RMSNorm in fp16 whose ref.py imports torch and
computes on the GPU), scale_add (a reference that needs only NumPy: it runs on the host), and the gallery's
embedding_gather, adamw_inplace, paged_kv_write and masked_softmax (references written for any array module, run
with CuPy where the data is). Each is tuned on its space's first problem (0.5-1.5 GB moved per call), and for each:

1. The study as a user types it, in a fresh project directory holding only examples/NAME/, with fresh
   TUNER_CACHE_DIR, CUPY_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, CUDA_CACHE_PATH and XDG_CACHE_HOME:
   ``python3 -m tuner study NAME --space examples/NAME/NAME.yaml --trials N --json``, N the space's valid configs
   or `MAX_TRIALS`, whichever is fewer; timed from before its process starts to its exit. From the study's SQLite
   (through Optuna: each trial's datetime_complete is the wall-clock time the driver was told its result, written
   by tuner's trial writer) the first result: process start to the earliest completion of a measured trial; and
   the mean seconds per config after it: (last evaluated trial's completion - the first's) / (evaluated - 1). The
   summary's own first_result_s (command clock, plus the interpreter's start before it) is recorded beside it.
2. In one process of its own (fresh caches again), with tuner's timing protocol (`tuner.gpu.timing.benchmark`:
   a read of 2x L2 before every launch, CUDA events, the stream hold): the study's best config (verified against
   ref.py every round through `GpuEvaluator.evaluate`), torch.compile of the same op written in torch (`PORTS`;
   add_rmsnorm's is its ref.py), torch eager, and a cudaMemcpy of half the bytes the op must move (read + write:
   the same bytes, the fair ceiling), once per round in a shuffled order; medians over the rounds, GB/s of the
   family's bytes, ours / torch.compile with a sign test, ours / copy. torch.compile's and eager's outputs are
   checked against each other first.

Writes ``gallery-DATE.json`` (one record per example) and ``gallery-DATE.md`` under --out ($OUT, else
benchmarks/results), after every step, so a run cut short keeps what it measured. Exit 1 when a step failed or a
check did not pass. ``--dry-run`` needs no GPU: each space loads, ``tuner check`` compiles every config for sm_90,
and each torch port is compared with the example's reference on a small CPU problem (skipped, and said, where
torch is not installed). Top-level imports are the standard library's only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from own_kernel import fresh_env, last_json, run_timed  # noqa: E402  (standard library only at import)

EXAMPLES_DIR = ROOT / "examples"
MAX_TRIALS = 60  # the whole grid where the space has no more valid configs
#: seconds a step may take at most (each also stops at the run's --budget-s)
CAPS_S = {"study": 150, "peers": 150}
RESERVE_S = 10  # kept back from --budget-s for writing the results
MARKER = "@@gallery@@ "  # prefixes the one JSON line a child prints
COPY = "copy (same bytes)"
IMPLS = ("tuner", "torch.compile", "torch eager", COPY)
#: what a first result and each config after it should take at most on an H100 (~1 GB moved per call)
GOALS = {"first_result_s_torch_reference": 8.0, "first_result_s_numpy_reference": 4.0, "s_per_config_after": 0.1}


@dataclass(frozen=True)
class Example:
    """One example: its folder under examples/ (holding NAME.yaml), and what its reference imports."""

    name: str
    reference: str  # "torch" (ref.py imports torch), "numpy" (runs on the host), "xp" (any array module)

    @property
    def space(self) -> Path:
        return EXAMPLES_DIR / self.name / f"{self.name}.yaml"

    @property
    def space_arg(self) -> str:
        return f"examples/{self.name}/{self.name}.yaml"


EXAMPLES = [
    Example("add_rmsnorm", "torch"),
    Example("scale_add", "numpy"),
    Example("embedding_gather", "xp"),
    Example("adamw_inplace", "xp"),
    Example("paged_kv_write", "xp"),
    Example("masked_softmax", "xp"),
]
BY_NAME = {e.name: e for e in EXAMPLES}


def study_argv(example: Example, trials: int) -> list[str]:
    """The study as a user types it, from a project directory holding examples/NAME/."""
    return ["python3", "-m", "tuner", "study", example.name, "--space", example.space_arg, "--trials", str(trials)] + [
        "--json"
    ]


# ---------------------------------------------------------------------------------------------------------------
# the torch versions of each op: keyword arguments named as the kernel's (arrays as tensors, scalars as numbers),
# a dict of the kernel's checked outputs back (in-place ops update their tensors and return them)


def _port_add_rmsnorm(torch):
    return _load_ref("add_rmsnorm").add_rmsnorm


def _port_scale_add(torch):
    def scale_add(x, y, alpha, **_):
        return {"out": alpha * x + y}

    return scale_add


def _port_embedding_gather(torch):
    def embedding_gather(table, ids, **_):
        return {"out": torch.nn.functional.embedding(ids, table)}

    return embedding_gather


def _port_adamw_inplace(torch):
    import math

    def adamw_inplace(param, exp_avg, exp_avg_sq, grad, lr, beta1, beta2, eps, weight_decay, step, **_):
        g = grad.float()
        exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = exp_avg_sq.sqrt() / math.sqrt(1 - beta2**step) + eps
        param.mul_(1 - lr * weight_decay).addcdiv_(exp_avg, denom, value=-lr / (1 - beta1**step))
        return {"param": param, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}

    return adamw_inplace


def _port_paged_kv_write(torch):
    def paged_kv_write(key, value, key_cache, value_cache, slot_mapping, **_):
        shape, slots = key_cache.shape, slot_mapping.long()  # index_put_ wants int64 indices in older torch
        key_cache.view(-1, *shape[2:])[slots] = key
        value_cache.view(-1, *shape[2:])[slots] = value
        return {"key_cache": key_cache, "value_cache": value_cache}

    return paged_kv_write


def _port_masked_softmax(torch):
    def masked_softmax(x, mask, **_):
        scores = x.float().masked_fill(~mask, float("-inf"))
        # a row with nothing kept is NaN after the softmax, and all of it is masked: 0 like the rest
        return {"out": torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0).to(x.dtype)}

    return masked_softmax


PORTS = {
    "add_rmsnorm": _port_add_rmsnorm,
    "scale_add": _port_scale_add,
    "embedding_gather": _port_embedding_gather,
    "adamw_inplace": _port_adamw_inplace,
    "paged_kv_write": _port_paged_kv_write,
    "masked_softmax": _port_masked_softmax,
}


def _load_ref(name: str):
    """examples/NAME/ref.py as a module (importing it runs its imports: add_rmsnorm's imports torch)."""
    import importlib.util

    path = EXAMPLES_DIR / name / "ref.py"
    spec = importlib.util.spec_from_file_location(f"gallery_ref_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torch_dtype(torch, name: str):
    return {
        "float32": torch.float32,
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "float64": torch.float64,
        "int32": torch.int32,
        "int64": torch.int64,
        "bool": torch.bool,
    }[name]


def scalars_of(family, env: dict[str, Any]) -> dict[str, Any]:
    """The kernel's scalar arguments as Python numbers, as its space file gives them for the problem."""
    return {a.name: a.value(env) for a in family.arguments if a.role == "scalar" and a.value is not None}


def torch_inputs(name: str, torch, env: dict[str, Any], device: str) -> dict[str, Any]:
    """The op's arrays, drawn in torch as the space file's `init:`s draw them (on `device`)."""
    gen = torch.Generator(device=device).manual_seed(0)
    dt_ = torch_dtype(torch, env["dtype"])

    def normal(*shape, mean=0.0, scale=1.0, dtype=dt_):
        return (torch.randn(*shape, generator=gen, device=device) * scale + mean).to(dtype)

    def uniform(*shape, low, high):
        return torch.rand(*shape, generator=gen, device=device) * (high - low) + low

    if name == "add_rmsnorm":
        t, h = env["tokens"], env["hidden"]
        return {"x": normal(t, h), "residual": normal(t, h), "weight": normal(h, mean=1.0, scale=0.1)}
    if name == "scale_add":
        return {"x": normal(env["n"]), "y": normal(env["n"])}
    if name == "embedding_gather":
        ids = torch.randint(0, env["vocab"], (env["tokens"],), generator=gen, device=device, dtype=torch.int32)
        return {"table": normal(env["vocab"], env["dim"]), "ids": ids}
    if name == "adamw_inplace":
        n = env["n"]
        return {
            "param": normal(n, dtype=torch.float32),
            "exp_avg": normal(n, scale=0.01, dtype=torch.float32),
            "exp_avg_sq": uniform(n, low=1e-4, high=1e-3),
            "grad": normal(n),
        }
    if name == "paged_kv_write":
        rows = (env["tokens"], env["heads"], env["head_dim"])
        cache = (env["blocks"], env["block_size"], env["heads"], env["head_dim"])
        slots = torch.randperm(env["blocks"] * env["block_size"], generator=gen, device=device)[: env["tokens"]]
        return {
            "key": normal(*rows),
            "value": normal(*rows),
            "key_cache": normal(*cache),
            "value_cache": normal(*cache),
            "slot_mapping": slots.to(torch.int32),
        }
    if name == "masked_softmax":
        shape = (env["rows"], env["cols"])
        return {"x": normal(*shape), "mask": torch.rand(*shape, generator=gen, device=device) < 0.5}
    raise KeyError(name)


def mismatches(torch, got, want, tol: float) -> tuple[int, float]:
    """(elements not within `tol`, relative and absolute as the family's check, max abs difference)."""
    g, w = got.float(), want.float()
    close = torch.isclose(g, w, rtol=tol, atol=tol, equal_nan=True)
    return int((~close).sum().item()), float((g - w).abs().nan_to_num(0.0).max().item()) if g.numel() else 0.0


def tolerance_of(family, env, name: str) -> float:
    tol = family.tolerance(env)
    return float(tol[name] if isinstance(tol, dict) else tol)


# ---------------------------------------------------------------------------------------------------------------
# step 1: the study as typed, and what its stored trials say


def count_configs(example: Example) -> tuple[int, str, int]:
    """(valid configs of the space's first problem, that problem's name, bytes it moves per call)."""
    from tuner.space import space as space_mod

    space = space_mod.load(example.space)
    problem = space.problem()
    return space.count_valid(problem), problem.name, space.family.bytes_moved(problem.env)


def run_study(example: Example, trials: int, tmp: Path, timeout_s: float) -> dict[str, Any]:
    """The study, typed in a fresh project directory with fresh caches; its figures."""
    project = tmp / f"project-{example.name}"
    shutil.copytree(
        EXAMPLES_DIR / example.name, project / "examples" / example.name, ignore=shutil.ignore_patterns("__pycache__")
    )
    argv = study_argv(example, trials)
    env = fresh_env(tmp, f"study-{example.name}")
    spawned_epoch = time.time()
    ran = run_timed([sys.executable, *argv[1:]], project, env, timeout_s)
    summary, printed_s = last_json(ran)
    out: dict[str, Any] = {"command": " ".join(shlex.quote(a) for a in argv), "wall_s": round(ran.wall_s, 3)}
    if ran.returncode != 0 or summary is None or "command_wall_s" not in summary:
        why = f"timed out after {timeout_s:.0f} s" if ran.returncode is None else f"exit code {ran.returncode}"
        return {
            **out,
            "error": f"tuner study: {why}",
            "stdout_tail": ran.stdout[-3000:],
            "stderr_tail": ran.stderr[-3000:],
        }
    db = project / "studies" / f"{example.name}.db"
    trials_seen = stored_trials(db, summary["study"])
    command_started_s = printed_s - summary["command_wall_s"]  # the interpreter's start, before tuner's clock
    startup = summary.get("startup") or {}
    best = summary.get("best") or {}
    gpus = summary.get("gpus") or [{}]
    out.update(
        trial_figures(trials_seen, spawned_epoch),
        trials_asked=trials,
        first_result_s_summary=(
            round(command_started_s + startup["first_result_s"], 3) if startup.get("first_result_s") else None
        ),
        command_started_s=round(command_started_s, 3),
        command_wall_s=summary["command_wall_s"],
        finalists_s=summary.get("finalists_s"),
        failures=summary.get("failures_this_run"),
        best={k: best.get(k) for k in ("uri", "params", "tbps", "median_ms", "fraction_of_ceiling")},
        gpu=gpus[0].get("gpu"),
        ceiling_tbps=gpus[0].get("ceiling_tbps"),
        versions=gpus[0].get("versions"),
        startup=startup,
        study=summary.get("study"),
        database=str(db),
    )
    return out


def stored_trials(db: Path, study_name: str) -> list[dict[str, Any]]:
    """The study's trials as Optuna loads them from its SQLite: state, completion time (epoch seconds) and the
    attributes tuner stores (failure, duplicate_of, screened, median_ms)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=study_name, storage=f"sqlite:///{db}")
    keys = ("median_ms", "tbps", "failure", "duplicate_of", "screened")
    return [
        {
            "number": t.number,
            "state": t.state.name,
            # a naive local time (tuner's writer stores datetime.now() at the tell): local, as time.time() is
            "complete": t.datetime_complete.timestamp() if t.datetime_complete else None,
            **{k: t.user_attrs.get(k) for k in keys},
        }
        for t in study.trials
    ]


def trial_figures(trials: list[dict[str, Any]], spawned_epoch: float) -> dict[str, Any]:
    """First result and pace from stored trials. Evaluated: not a duplicate, not screened, not invalid (compiled
    and run, measured or failed); measured: evaluated without a failure, with a median. `spawned_epoch` is
    time.time() just before the study's process started."""
    evaluated = [
        t
        for t in trials
        if t["complete"] is not None and t["duplicate_of"] is None and not t["screened"] and t["failure"] != "invalid"
    ]
    measured = [t for t in evaluated if t["failure"] is None and t["median_ms"]]
    if not measured:
        return {"configs_evaluated": len(evaluated), "configs_measured": 0, "first_result_s": None}
    first = min(t["complete"] for t in measured)
    after = sorted(t["complete"] for t in evaluated if t["complete"] >= first)
    return {
        "configs_evaluated": len(evaluated),
        "configs_measured": len(measured),
        "first_result_s": round(first - spawned_epoch, 3),
        "last_result_s": round(after[-1] - spawned_epoch, 3),
        "s_per_config_after_first": round((after[-1] - first) / (len(after) - 1), 4) if len(after) > 1 else None,
    }


# ---------------------------------------------------------------------------------------------------------------
# step 2: side by side in one process (the child)


def child_peers(name: str, params: dict[str, Any], rounds: int, budget_ms: float) -> dict[str, Any]:
    """Our config, torch.compile, torch eager and the same-bytes copy, once per round in a shuffled order."""
    import torch
    from head_to_head import verdict

    from tuner.build.compile import compile_source
    from tuner.build.render import render
    from tuner.gpu.ceiling import measure_ceiling
    from tuner.gpu.evaluator import GpuEvaluator
    from tuner.gpu.protocol import EvaluateRequest
    from tuner.gpu.timing import LAUNCH_HOLD, benchmark
    from tuner.space import space as space_mod

    example = BY_NAME[name]
    ev = GpuEvaluator()
    ev.start()
    space = space_mod.load(example.space)
    problem = space.problem()
    family, env = space.family, problem.env
    config = space.resolve(params, problem)
    compiled = compile_source(render(family, params, config, env), ev.arch)
    if not compiled.ok:
        return {"error": f"our config does not compile: {compiled.reason}"}
    nbytes = family.bytes_moved(env)

    def ours() -> float:
        result = ev.evaluate(EvaluateRequest(compiled, family, config, env, budget_ms=budget_ms))
        if not result.ok:
            raise RuntimeError(f"our config failed: {result.kind}: {result.reason}")
        return result.median_ms

    ours()  # inputs, references and the module, before any timing

    torch_stream = torch.cuda.ExternalStream(ev.device.stream.ptr)
    scalars = scalars_of(family, env)
    op = PORTS[name](torch)
    with torch.cuda.stream(torch_stream):
        inputs = torch_inputs(name, torch, env, "cuda")
        torch_stream.synchronize()
    compiled_op = torch.compile(op)
    # the check: eager and torch.compile on copies of the same inputs (in-place ops update theirs)
    with torch.cuda.stream(torch_stream):
        want = op(**{k: v.clone() for k, v in inputs.items()}, **scalars)
        t0 = time.perf_counter()
        got = compiled_op(**{k: v.clone() for k, v in inputs.items()}, **scalars)
        torch_stream.synchronize()
    compile_s = time.perf_counter() - t0
    checks = {}
    for out_name in want:
        bad, diff = mismatches(torch, got[out_name], want[out_name], tolerance_of(family, env, out_name))
        checks[out_name] = {"mismatches": bad, "max_abs_diff": diff}
    del want, got
    torch.cuda.empty_cache()

    def time_torch(fn) -> float:
        def run():
            with torch.cuda.stream(torch_stream):
                fn(**inputs, **scalars)

        return benchmark(
            run, stream=ev.device.stream, budget_ms=budget_ms, flush=ev.device.flush, hold=ev.device.hold
        ).median_ms

    def copy_ms() -> float:  # measure_ceiling gives TB/s of 2x the buffer: back to ms for the op's bytes
        return (
            nbytes
            / (measure_ceiling(nbytes // 2, budget_ms, stream=ev.device.stream, flush=ev.device.flush) * 1e12)
            * 1e3
        )

    timers = {
        "tuner": ours,
        "torch.compile": lambda: time_torch(compiled_op),
        "torch eager": lambda: time_torch(op),
        COPY: copy_ms,
    }
    shuffle = random.Random(0)
    ms: dict[str, list[float]] = {impl: [] for impl in IMPLS}
    for _ in range(rounds):
        order = list(IMPLS)
        shuffle.shuffle(order)
        for impl in order:
            ms[impl].append(timers[impl]())
    gbps = {impl: [nbytes / m / 1e6 for m in values] for impl, values in ms.items()}
    median_ms = {impl: round(statistics.median(v), 5) for impl, v in ms.items()}
    median_gbps = {impl: round(statistics.median(v), 1) for impl, v in gbps.items()}
    call, wins, n, p = verdict(gbps["tuner"], gbps["torch.compile"])
    return {
        "gpu": ev.gpu_name,
        "rounds": rounds,
        "budget_ms": budget_ms,
        "protocol": f"tuner.gpu.timing.benchmark: read flush of 2x L2, CUDA events, {LAUNCH_HOLD}; median per round",
        "holds_given_up": ev.device.hold.timeouts,
        "uri": compiled.uri,
        "config": params,
        "bytes": nbytes,
        "median_ms": median_ms,
        "GBps_median": median_gbps,
        "GBps_rounds": {impl: [round(v, 1) for v in values] for impl, values in gbps.items()},
        "ours_vs_torch_compile": round(median_gbps["tuner"] / median_gbps["torch.compile"], 4),
        "ours_vs_torch_eager": round(median_gbps["tuner"] / median_gbps["torch eager"], 4),
        "ours_vs_copy": round(median_gbps["tuner"] / median_gbps[COPY], 4),
        "vs_torch_compile_verdict": {"verdict": call, "rounds_ours_faster": wins, "rounds_compared": n, "p": p},
        "torch_compile_first_call_s": round(compile_s, 3),
        "torch_compile_vs_eager": checks,
        "versions": {**ev.device.versions, "torch": torch.__version__},
    }


def child_main(args) -> int:
    try:
        payload = child_peers(args.child, json.loads(args.params), args.rounds, args.budget_ms)
        code = 1 if "error" in payload else 0
    except BaseException as exc:  # reported on the marker line
        payload = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        code = 1
    sys.stdout.flush()
    print(MARKER + json.dumps(payload, default=str), flush=True)
    return code


def run_peers(example: Example, params: dict[str, Any], tmp: Path, timeout_s: float, args) -> dict[str, Any]:
    """This script as --child NAME with fresh caches; its payload, with the process's wall."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", example.name, "--params", json.dumps(params)]
    cmd += ["--rounds", str(args.rounds), "--budget-ms", str(args.budget_ms)]
    ran = run_timed(cmd, ROOT, fresh_env(tmp, f"peers-{example.name}"), timeout_s)
    payload = None
    for _, line in reversed(ran.lines):
        if line.startswith(MARKER):
            payload = json.loads(line[len(MARKER) :])
            break
    if payload is None:
        why = f"timed out after {timeout_s:.0f} s" if ran.returncode is None else f"exit code {ran.returncode}"
        payload = {"error": f"side by side: {why}", "stdout_tail": ran.stdout[-3000:]}
    if "error" in payload:
        payload["stderr_tail"] = ran.stderr[-3000:]
    payload["subprocess_wall_s"] = round(ran.wall_s, 3)
    return payload


# ---------------------------------------------------------------------------------------------------------------
# the parent: each example's study then its side by side, within the budget; a record per example


def build_record(example: Example, facts: dict[str, Any], outcomes, date: str, command: str) -> dict[str, Any]:
    """The example's record: headline figures at the top, each step's outcome (`outcomes` "study" and "peers",
    None where not run yet) under `study` and `side_by_side`."""
    study, peers = outcomes["study"] or {}, outcomes["peers"] or {}
    ok_study = study if "error" not in study else {}
    ok_peers = peers if "error" not in peers else {}
    goal = GOALS["first_result_s_torch_reference" if example.reference == "torch" else "first_result_s_numpy_reference"]
    failed = {step: o["error"] for step, o in (("study", study), ("side_by_side", peers)) if o and "error" in o}
    bad_checks = {k: v for k, v in (ok_peers.get("torch_compile_vs_eager") or {}).items() if v["mismatches"]}
    return {
        "example": example.name,
        "reference": example.reference,
        "space": example.space_arg,
        **facts,
        "gpu": ok_study.get("gpu") or ok_peers.get("gpu"),
        "wall_s": ok_study.get("wall_s"),
        "first_result_s": ok_study.get("first_result_s"),
        "first_result_goal_s": goal if example.reference in ("torch", "numpy") else None,
        "s_per_config_after_first": ok_study.get("s_per_config_after_first"),
        "s_per_config_goal": GOALS["s_per_config_after"],
        "best": ok_study.get("best"),
        "GBps_median": ok_peers.get("GBps_median"),
        "median_ms": ok_peers.get("median_ms"),
        "ours_vs_torch_compile": ok_peers.get("ours_vs_torch_compile"),
        "ours_vs_copy": ok_peers.get("ours_vs_copy"),
        "vs_torch_compile_verdict": (ok_peers.get("vs_torch_compile_verdict") or {}).get("verdict"),
        "date": date,
        "command": command,
        "failed": failed,
        "check_failures": bad_checks,
        "definitions": DEFINITIONS,
        "study": study,
        "side_by_side": peers,
    }


DEFINITIONS = {
    "wall_s": "the study's whole wall: from before its process starts to its exit",
    "first_result_s": "from before the study's process starts to the earliest datetime_complete of a measured "
    "trial in its SQLite (the driver's tell of the first config verified and timed on the GPU)",
    "s_per_config_after_first": "(last evaluated trial's datetime_complete - the first measured one's) / (evaluated "
    "configs completed from then on - 1)",
    "GBps_median": "the family's bytes per call / the median time, medians over the side-by-side rounds",
    "ours_vs_torch_compile": "our best config's median GB/s / torch.compile's, side by side in one process",
    "ours_vs_copy": "our median GB/s / a cudaMemcpy moving the same bytes (half read, half written), same protocol",
}


def _f(x: Any, spec: str, missing: str = "-") -> str:
    return missing if x is None else format(x, spec)


def markdown(records: list[dict[str, Any]], date: str, command: str) -> str:
    """The results file: command, GPU, date, the studies' table, the side-by-side table, failures."""
    gpu = next((r["gpu"] for r in records if r.get("gpu")), "?")
    lines = [
        f"# The gallery of user kernels tuned on {gpu}, {date}",
        "",
        f"Command: `{command}`. Each example's study typed as a user types it (`python3 -m tuner study NAME --space "
        "examples/NAME/NAME.yaml --trials N --json`) in a fresh project directory with empty compile caches, timed "
        "from before its process starts; first result and pace from the trials' completion times in its SQLite. "
        f"Goals: a first result in {GOALS['first_result_s_torch_reference']:g} s with a torch reference, "
        f"{GOALS['first_result_s_numpy_reference']:g} s with a NumPy one, {GOALS['s_per_config_after']:g} s a config "
        "after it.",
        "",
        "| example | reference | MB moved | configs (valid) | wall s | first result s | s/config after | best config "
        "| study TB/s |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in records:
        s, best = r["study"] or {}, r.get("best") or {}
        lines.append(
            f"| {r['example']} | {r['reference']} | {r['bytes'] / 1e6:.0f} | {_f(s.get('configs_evaluated'), 'd')} "
            f"({r['configs_valid']}) | {_f(r['wall_s'], '.1f')} | {_f(r['first_result_s'], '.2f')} "
            f"| {_f(r['s_per_config_after_first'], '.3f')} | {best.get('uri') or '-'} | {_f(best.get('tbps'), '.3f')} |"
        )
    lines += [
        "",
        "Side by side in one process per example (tuner's protocol: read flush of 2x L2, CUDA events, stream hold; "
        "medians over shuffled rounds), GB/s of the family's bytes (ms):",
        "",
        "| example | tuner | torch.compile | torch eager | copy, same bytes | ours / torch.compile | ours / copy |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        g, m = r.get("GBps_median") or {}, r.get("median_ms") or {}
        cells = [f"{_f(g.get(i), '.0f')} ({_f(m.get(i), '.4f')})" for i in IMPLS]
        vs = _f(r["ours_vs_torch_compile"], ".3f") + (
            f" ({r['vs_torch_compile_verdict']})" if r.get("vs_torch_compile_verdict") else ""
        )
        lines.append(f"| {r['example']} | " + " | ".join(cells) + f" | {vs} | {_f(r['ours_vs_copy'], '.3f')} |")
    for r in records:
        for step, why in r["failed"].items():
            lines.append(f"\n{r['example']} {step}: {why}")
        for out, check in r["check_failures"].items():
            lines.append(
                f"\n{r['example']}: torch.compile's {out} differs from eager's in {check['mismatches']} elements"
            )
    return "\n".join(lines) + "\n"


def write_results(out: Path, stem: str, records: list[dict[str, Any]], date: str, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(records, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown(records, date, command))


def run_all(args, examples: list[Example], tmp: Path, started: float, write) -> list[dict[str, Any]]:
    """Each example's study, then its side by side with the study's best; results written after every step."""
    records: list[dict[str, Any]] = []
    for example in examples:
        valid, problem, nbytes = count_configs(example)
        trials = min(valid, args.max_trials)
        facts = {"problem": problem, "bytes": nbytes, "configs_valid": valid, "trials": trials}
        outcomes: dict[str, Any] = {"study": None, "peers": None}
        for step in ("study", "peers"):
            left = args.budget_s - (time.perf_counter() - started) - RESERVE_S
            timeout_s = min(CAPS_S[step], left)
            if timeout_s < 20:
                outcomes[step] = {"error": f"skipped: {left + RESERVE_S:.0f} s of the budget left"}
                continue
            elapsed = time.perf_counter() - started
            print(f"[{elapsed:5.0f} s] {example.name}: {step} (up to {timeout_s:.0f} s) ...", flush=True)
            if step == "study":
                outcomes[step] = run_study(example, trials, tmp, timeout_s)
            else:
                params = ((outcomes["study"] or {}).get("best") or {}).get("params")
                outcomes[step] = (
                    run_peers(example, params, tmp, timeout_s, args)
                    if params
                    else {"error": "skipped: the study gave no best config"}
                )
            print(f"          {one_line(step, outcomes[step])}", flush=True)
            write([*records, build_record(example, facts, outcomes, args.date, args.command)])
        records.append(build_record(example, facts, outcomes, args.date, args.command))
    return records


def one_line(step: str, o: dict[str, Any]) -> str:
    if "error" in o:
        return f"FAILED: {o['error']}"
    if step == "study":
        best = o.get("best") or {}
        return (
            f"{o.get('configs_evaluated')} configs in {o['wall_s']:.1f} s; first result {o.get('first_result_s')} s "
            f"(summary: {o.get('first_result_s_summary')} s), {o.get('s_per_config_after_first')} s/config after; "
            f"best {best.get('uri')} {best.get('tbps')} TB/s"
        )
    g = o["GBps_median"]
    return (
        "GB/s: " + ", ".join(f"{k} {v:.0f}" for k, v in g.items()) + f"; ours / torch.compile "
        f"{o['ours_vs_torch_compile']:.3f} ({o['vs_torch_compile_verdict']['verdict']}), ours / copy "
        f"{o['ours_vs_copy']:.3f}"
    )


# ---------------------------------------------------------------------------------------------------------------
# --dry-run: what needs no GPU


def dry_check(example: Example, tmp: Path) -> tuple[str, bool, str]:
    """``tuner check`` of every config of the space, as a user runs it (never imports the reference)."""
    cmd = [sys.executable, "-m", "tuner", "check", example.space_arg, "--json"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    ran = run_timed(cmd, ROOT, env, 900)
    report, _ = last_json(ran)
    if report is None:
        return f"{example.name}: tuner check gave no JSON report", False, ran.stderr[-1500:]
    good = report.get("failed") == 0 and bool(report.get("compiled"))
    errors = report.get("errors") or [c.get("reason", "") for c in report.get("configs", []) if c.get("failure")]
    return (
        f"{example.name}: tuner check compiled {report.get('compiled')}, failed {report.get('failed')} "
        f"({report.get('seconds')} s)",
        good,
        "" if good else str(errors[:1])[:600],
    )


def small_env(space) -> dict[str, Any]:
    """The space's `small` problem, or (scale_add has none) its first with n cut to 4099."""
    names = [p.name for p in space.problems]
    if "small" in names:
        return dict(space.problem("small").env)
    return {**space.problem().env, "n": 4099}


def dry_port(example: Example) -> list[tuple[str, bool, str]]:
    """The torch port against the example's reference on its small problem, on the CPU; and torch_inputs draws
    arrays of the shapes and dtypes the family's inputs have."""
    import numpy as np

    from tuner.space import space as space_mod

    try:
        import torch
    except ImportError:
        return [(f"{example.name}: torch port not checked: torch is not installed here", True, "")]
    space = space_mod.load(example.space)
    family = space.family
    env = small_env(space)
    inputs = family.inputs(np, env, np.random.default_rng(3))
    expected = family.reference(np, inputs, env)
    arrays = {}
    for arg in family.arguments:
        if arg.role in ("input", "inout"):
            value = np.ascontiguousarray(inputs[arg.name])
            if arg.dtype_of(env) == "bfloat16":  # bf16 travels as its bits
                arrays[arg.name] = torch.from_numpy(value.view(np.int16)).view(torch.bfloat16)
            else:
                arrays[arg.name] = torch.from_numpy(value.copy())
    got = PORTS[example.name](torch)(**arrays, **scalars_of(family, env))
    out, worst = [], []
    for name, want in expected.items():
        tol = tolerance_of(family, env, name)
        w = torch.from_numpy(np.asarray(want, dtype=np.float64))
        g = got[name].double()
        bad = int((~torch.isclose(g, w, rtol=tol, atol=tol)).sum())
        worst.append(f"{name}: {bad} outside {tol:g}, max abs diff {float((g - w).abs().max()):.2e}")
        out.append(bad == 0 and tuple(g.shape) == tuple(w.shape))
    drawn = torch_inputs(example.name, torch, env, "cpu")
    want_like = {name: (tuple(a.shape), a.dtype) for name, a in arrays.items()}
    drawn_like = {name: (tuple(a.shape), a.dtype) for name, a in drawn.items()}
    return [
        (f"{example.name}: torch port == ref.py on {env.get('name')} ({'; '.join(worst)})", all(out), ""),
        (
            f"{example.name}: the side by side draws the family's shapes and dtypes",
            want_like == drawn_like,
            "" if want_like == drawn_like else f"{drawn_like} != {want_like}",
        ),
    ]


def dry_run(args) -> int:
    """Every check that needs no GPU; exit 1 when one fails."""
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="gallery_dry_"))
    results: list[tuple[str, bool, str]] = []
    try:
        for example in args.examples:
            valid, problem, nbytes = count_configs(example)
            trials = min(valid, args.max_trials)
            results.append(
                (
                    f"{example.name}: {valid} valid configs on {problem}, {nbytes / 1e6:.0f} MB a call; the study: "
                    f"{' '.join(study_argv(example, trials))}",
                    valid > 0 and example.name in PORTS,
                    "",
                )
            )
            results.append(dry_check(example, tmp))
            try:
                results += dry_port(example)
            except Exception as exc:  # a port that does not run is this check's failure
                results.append((f"{example.name}: torch port raised {type(exc).__name__}: {exc}", False, ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    failed = 0
    for what, good, detail in results:
        failed += not good
        print(f"[{'ok' if good else 'FAIL'}] {what}" + (f"\n       {detail}" if detail else ""), flush=True)
    print(f"\nOn the GPU:\n  {DEVICE_COMMAND}")
    print(f"\ndry run: {time.perf_counter() - started:.0f} s, {failed} failed")
    return 1 if failed else 0


DEVICE_COMMAND = "python3 benchmarks/gallery.py --out $OUT"


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--only", nargs="*", choices=list(BY_NAME), help="keep only these examples")
    parser.add_argument("--budget-s", type=float, default=510.0, help="wall for the whole run (default 510)")
    parser.add_argument("--max-trials", type=int, default=MAX_TRIALS, help="trials at most per study (default 60)")
    parser.add_argument("--rounds", type=int, default=6, help="side-by-side rounds (default 6)")
    parser.add_argument("--budget-ms", type=float, default=100.0, help="timed launches per impl and round (ms)")
    parser.add_argument("--keep-tmp", action="store_true", help="keep the projects, caches and databases")
    parser.add_argument("--dry-run", action="store_true", help="no GPU: compile every config, check the torch ports")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args)
    args.examples = [e for e in EXAMPLES if not args.only or e.name in args.only]
    if args.dry_run:
        return dry_run(args)

    out = Path(args.out)
    args.date = dt.date.today().isoformat()
    stem = f"gallery-{args.date}"
    script = os.path.relpath(Path(sys.argv[0]).resolve(), ROOT)
    args.command = "python3 " + " ".join(shlex.quote(a) for a in [script, *sys.argv[1:]])
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="gallery_"))

    def write(records: list[dict[str, Any]]) -> None:
        write_results(out, stem, records, args.date, args.command)

    try:
        records = run_all(args, args.examples, tmp, started, write)
        write(records)
    finally:
        if args.keep_tmp:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"\nwrote {out / stem}.json and .md in {time.perf_counter() - started:.0f} s\n")
    print(markdown(records, args.date, args.command))
    return 1 if any(r["failed"] or r["check_failures"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
