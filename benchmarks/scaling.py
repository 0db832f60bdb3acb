"""Trials per second with N GPU workers on the same space: does the driver keep every GPU busy?

    python benchmarks/scaling.py --gpus 1 2 4 8                       # real GPUs (one machine of N GPUs)
    python benchmarks/scaling.py --gpus 1 8 --replay tests/data/transpose_h200.db --delay 0.05   # CPU only

Each N runs ``tuner study transpose --sampler grid`` over every valid config of the transpose space (156) in a
fresh database and reads the study's own summary: `evaluated_per_s` counts configs that a GPU worker answered,
per second after the workers are up (start-up is reported apart). With --replay, the workers are logical GPUs
answering from a recording, each answer taking --delay seconds: it measures the driver and Ray, not a GPU.
Writes ``scaling-<mode>-<date>.json`` and prints the ratio to N × one GPU.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(gpus: int, replay: str | None, delay: float, space: str) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"scaling{gpus}_"))
    cmd = [sys.executable, "-m", "tuner", "study", "transpose", "--space", space, "--sampler", "grid",
           "--trials", "100000", "--gpus", str(gpus), "--storage", f"sqlite:///{work}/s.db", "--json"]
    if replay:
        cmd += ["--replay", replay, "--replay-delay", str(delay)]
    env = {**os.environ, "TUNER_CACHE_DIR": str(work / "cache"), "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"gpus={gpus}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--replay")
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--space", default="search_spaces/transpose.yaml")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]])
    date = dt.date.today().isoformat()
    records = []
    for n in args.gpus:
        s = run(n, args.replay, args.delay, args.space)
        records.append({"gpus": n, "evaluated_per_s": s["evaluated_per_s"], "trials": s["trials"],
                        "after_start_s": s["after_start_s"], "gpu_busy_fraction": s["gpu_busy_fraction"],
                        "startup": s["startup"], "gpu": s["gpus"][0]["gpu"],
                        "ceilings_tbps": [g["ceiling_tbps"] for g in s["gpus"]], "best": s["best"]})
        print(f"N={n}: {s['evaluated_per_s']:.2f} configs/s after start-up ({s['after_start_s']:.2f} s), GPU busy "
              f"{s['gpu_busy_fraction']}", flush=True)
    one = next((r["evaluated_per_s"] for r in records if r["gpus"] == 1), None)
    for r in records:
        r["ratio_to_n_times_one"] = round(r["evaluated_per_s"] / (r["gpus"] * one), 3) if one else None
        r["speedup_vs_one"] = round(r["evaluated_per_s"] / one, 3) if one else None
    mode = "replay" if args.replay else "gpu"
    result = {"command": command, "date": date, "mode": mode, "delay_s": args.delay if args.replay else None,
              "cpus": os.cpu_count(), "runs": records}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"scaling-{mode}-{date}.json").write_text(json.dumps(result, indent=1) + "\n")
    for r in records:
        print(f"N={r['gpus']}: {r['evaluated_per_s']:.2f}/s, speed-up {r['speedup_vs_one']}×, "
              f"{r['ratio_to_n_times_one']} of N × one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
