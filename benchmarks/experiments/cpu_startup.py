"""The CPU start-up targets, timed on this machine: `tuner --help`, `tuner spaces` and a 60-trial replay study.

    python benchmarks/experiments/cpu_startup.py [--repeat 5] [--trials 60]

Each command runs `--repeat` times as a fresh process (``python -m tuner ...``, from the repository root, over
one fresh TUNER_CACHE_DIR: the first ``tuner spaces`` fills its listing cache, later ones read it). The replay
study is ``tuner study transpose --trials N --replay tests/data/transpose_h200.db --json`` into a fresh SQLite
file each time; its summary gives the driver's wall, the first result and the writer process's timings (when it
was named the study, its first write, when it was done, milliseconds per trial written). Other work on a shared
machine slows every figure: the 1-minute load average before each run is recorded beside it, and the median is
reported.

Writes ``cpu_startup-<date>.json`` under --out ($OUT when set, else benchmarks/results) and prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGETS = {"help": 0.3, "spaces": 0.5, "replay": 5.0}


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(process wall s, load average before, stdout) of one run; exits on failure."""
    load = os.getloadavg()[0]
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tuner", *argv], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        sys.exit(f"tuner {' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return wall, load, proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="cpu_startup_"))
    env = {**os.environ, "TUNER_CACHE_DIR": str(work / "cache")}
    recording = ROOT / "tests" / "data" / "transpose_h200.db"
    runs: dict[str, list[dict]] = {"help": [], "spaces": [], "replay": []}
    for i in range(args.repeat):
        wall, load, _ = timed(["--help"], env)
        runs["help"].append({"process_wall_s": round(wall, 3), "load_1min": round(load, 2)})
        wall, load, _ = timed(["spaces"], env)
        runs["spaces"].append({"process_wall_s": round(wall, 3), "load_1min": round(load, 2)})
        db = work / f"replay{i}.db"
        argv = ["study", "transpose", "--trials", str(args.trials), "--replay", str(recording)]
        wall, load, out = timed([*argv, "--storage", f"sqlite:///{db}", "--json"], env)
        summary = json.loads(out)
        runs["replay"].append(
            {
                "process_wall_s": round(wall, 3),
                "load_1min": round(load, 2),
                "driver_wall_s": summary["wall_s"],
                "first_result_s": summary["cold_start_s"],
                "writer_flush_s": summary["writer_flush_s"],
                "writer": summary.get("writer"),
                "startup": summary["startup"],
            }
        )
    medians = {name: statistics.median(r["process_wall_s"] for r in rows) for name, rows in runs.items()}
    record = {
        "command": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]]),
        "date": dt.date.today().isoformat(),
        "cpus": os.cpu_count(),
        "median_process_wall_s": {k: round(v, 3) for k, v in medians.items()},
        "targets_s": TARGETS,
        "runs": runs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"cpu_startup-{record['date']}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print("| command | median s | target s | runs (s) | load 1-min |")
    print("|---|---:|---:|---|---|")
    for name, rows in runs.items():
        walls = " ".join(f"{r['process_wall_s']:.2f}" for r in rows)
        loads = " ".join(f"{r['load_1min']:.1f}" for r in rows)
        print(f"| {name} | {medians[name]:.2f} | {TARGETS[name]} | {walls} | {loads} |")
    writers = [r["writer"] for r in runs["replay"] if r["writer"]]
    if writers:
        per_trial = statistics.median(w["ms_per_trial"] for w in writers)
        print(f"writer: median {per_trial:.1f} ms per trial written, {writers[0]['trials_written']} trials a run")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
