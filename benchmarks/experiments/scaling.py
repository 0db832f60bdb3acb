"""One study over 1..N GPUs: speed-up after start-up and over the whole wall a user waits.

    python benchmarks/experiments/scaling.py --gpus 1 2                                   # real GPUs, main job + grid
    python benchmarks/experiments/scaling.py --gpus 1 8 --jobs grid --replay tests/data/transpose_h200.db --delay 0.05

Two jobs, each run once per N in a fresh process with fresh caches (its own TUNER_CACHE_DIR and CUPY_CACHE_DIR,
its own database), so no run profits from what an earlier one compiled:

- ``main``: the main job, ``tuner study gemm --space search_spaces/gemm.yaml --trials 500 --seed S``;
- ``grid``: ``tuner study transpose --sampler grid``, every valid config of the transpose space.

Per run: the process wall (command start to exit, what a user waits), the study's own summary (start-up stages,
seconds after start-up, configs evaluated per second, the best config), and the GPU and ceiling of every worker.
Speed-ups against N = 1: ``after_startup`` = configs/s after the workers were up; ``whole_wall`` = configs per
second of process wall. After the largest real-GPU run, the best config is re-timed once on each GPU
(``tuner bench --gpu i``) so the GPUs can be compared on the same config.

Writes ``scaling-<mode>-<date>.json`` under --out and prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

JOBS = {
    "main": ["gemm", "--space", "search_spaces/gemm.yaml"],
    "grid": ["transpose", "--space", "search_spaces/transpose.yaml", "--sampler", "grid"],
}


def fresh_env(work: Path) -> dict[str, str]:
    """The environment of one isolated run: compile caches of its own, so nothing is warm from another run."""
    return {
        **os.environ,
        "TUNER_CACHE_DIR": str(work / "tuner-cache"),
        "CUPY_CACHE_DIR": str(work / "cupy-cache"),
        "RAY_AUTH_MODE": "disabled",
    }


def run_study(
    job: str, gpus: int, trials: int, seed: int, replay: str | None, delay: float, engine: str | None = None
) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"scaling-{job}{gpus}_"))
    cmd = [
        sys.executable,
        "-m",
        "tuner",
        "study",
        *JOBS[job],
        "--trials",
        str(trials),
        "--seed",
        str(seed),
        "--gpus",
        str(gpus),
        "--storage",
        f"sqlite:///{work}/s.db",
        "--json",
    ]
    if replay:
        cmd += ["--replay", replay, "--replay-delay", str(delay)]
    if engine:
        cmd += ["--engine", engine]
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=fresh_env(work), capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"{job} gpus={gpus}: {proc.stderr[-3000:]}")
    s = json.loads(proc.stdout)
    evaluated = round(s["evaluated_per_s"] * s["after_start_s"])
    return {
        "job": job,
        "gpus": gpus,
        "process_wall_s": round(wall, 3),
        "wall_s": s["wall_s"],
        "after_start_s": s["after_start_s"],
        "cold_start_s": s["cold_start_s"],
        "startup": s["startup"],
        "evaluated": evaluated,
        "evaluated_per_s": s["evaluated_per_s"],
        "evaluated_per_wall_s": round(evaluated / wall, 3),
        "trials": s["trials"],
        "gpu_busy_fraction": s["gpu_busy_fraction"],
        # the only busy figure of a replay (its GPU time is the recording's): the workers' time in evaluate
        "workers_busy_fraction": s.get("workers_busy_fraction"),
        "measured": s["measured_this_run"],
        "workers": [
            {"gpu": g["gpu"], "gpu_index": g.get("gpu_index"), "ceiling_tbps": g["ceiling_tbps"]} for g in s["gpus"]
        ],
        "best": s["best"],
        "command": " ".join(cmd[1:]).replace(str(work), "$TMP"),
    }


def retime_on_each_gpu(job: str, params: dict, gpus: int) -> list[dict]:
    """The same config verified and timed once on every GPU, to see whether the GPUs agree."""
    space = JOBS[job][2]
    out = []
    for i in range(gpus):
        sets = [a for k, v in params.items() for a in ("--set", f"{k}={v}")]
        cmd = [sys.executable, "-m", "tuner", "bench", space, *sets, "--gpu", str(i), "--budget-ms", "300", "--json"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            out.append({"gpu_index": i, "error": proc.stderr.strip().splitlines()[-1:]})
            continue
        r = json.loads(proc.stdout)
        out.append(
            {
                "gpu_index": i,
                "gpu": r.get("gpu"),
                "tbps": r.get("tbps"),
                "tflops": r.get("tflops"),
                "median_ms": r.get("median_ms"),
                "p20_ms": r.get("p20_ms"),
                "p80_ms": r.get("p80_ms"),
                "ceiling_tbps": r.get("ceiling_tbps"),
            }
        )
    times = [r["median_ms"] for r in out if r.get("median_ms")]
    if len(times) > 1:
        for r in out:
            r["spread_of_medians"] = round(max(times) / min(times) - 1, 4)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=["main", "grid"])
    parser.add_argument("--trials", type=int, default=500, help="trials of the main job (the grid runs to its end)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay")
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--engine", choices=("local", "ray"), help="the study's engine (default: the study's)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]])
    date = dt.date.today().isoformat()
    runs = []
    for job in args.jobs:
        if job == "main" and args.replay:
            continue  # the replay recording holds transpose configs only
        trials = args.trials if job == "main" else 100_000
        for n in args.gpus:
            r = run_study(job, n, trials, args.seed, args.replay, args.delay, args.engine)
            runs.append(r)
            print(
                f"{job} N={n}: {r['evaluated_per_s']:.2f} configs/s after start-up, process wall "
                f"{r['process_wall_s']:.1f} s, first result {r['cold_start_s']} s, GPU busy {r['gpu_busy_fraction']}, "
                f"workers busy {r['workers_busy_fraction']}",
                flush=True,
            )
    for job in args.jobs:
        mine = [r for r in runs if r["job"] == job]
        one = next((r for r in mine if r["gpus"] == 1), None)
        for r in mine:
            if one:
                r["speedup_after_startup"] = round(r["evaluated_per_s"] / one["evaluated_per_s"], 3)
                r["speedup_whole_wall"] = round(r["evaluated_per_wall_s"] / one["evaluated_per_wall_s"], 3)
                r["best_vs_one_gpu"] = _best_ratio(r, one)
    agreement = None
    real = [r for r in runs if not args.replay and r["gpus"] > 1]
    if real:
        top = max(real, key=lambda r: (r["gpus"], r["job"] == "main"))
        agreement = {
            "job": top["job"],
            "params": top["best"]["params"],
            "per_gpu": retime_on_each_gpu(top["job"], top["best"]["params"], top["gpus"]),
        }
    mode = "replay" if args.replay else "gpu"
    result = {
        "command": command,
        "date": date,
        "mode": mode,
        "delay_s": args.delay if args.replay else None,
        "engine": args.engine or "default",
        "cpus": os.cpu_count(),
        "runs": runs,
        "same_config_on_each_gpu": agreement,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"scaling-{mode}-{date}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"\n{'job':5} {'N':>2} {'wall s':>7} {'after s':>8} {'cfg/s':>7} {'×after':>7} {'×wall':>7} {'best×1':>7}")
    for r in runs:
        print(
            f"{r['job']:5} {r['gpus']:>2} {r['process_wall_s']:>7.1f} {r['after_start_s']:>8.1f} "
            f"{r['evaluated_per_s']:>7.2f} {r.get('speedup_after_startup', 0):>7.2f} "
            f"{r.get('speedup_whole_wall', 0):>7.2f} {r.get('best_vs_one_gpu') or 0:>7.3f}"
        )
    if agreement:
        for g in agreement["per_gpu"]:
            print(f"GPU {g['gpu_index']}: {g.get('median_ms')} ms (spread {g.get('spread_of_medians')})")
    print(f"wrote {path}")
    return 0


def _best_ratio(run: dict, one: dict) -> float | None:
    """The best figure found with N GPUs over the best found with one (≥ 1: as good or better)."""
    key = "tflops" if (run["best"] or {}).get("tflops") else "tbps"
    if not run["best"] or not one["best"] or not one["best"].get(key):
        return None
    return round(run["best"][key] / one["best"][key], 4)


if __name__ == "__main__":
    sys.exit(main())
