"""Compile throughput of `tuner check`: cold and warm compile cache, on this machine's CPUs (no GPU needed).

    python benchmarks/experiments/check_speed.py [--space search_spaces/gemm.yaml] [--sample 200]

Runs ``tuner check SPACE --sample N --json`` twice against a fresh cache directory (cold, then warm) and writes
``check_speed-<date>.json`` with configs/s as `tuner check` measures them (render + compile, in-process), the
process wall time, the CPU count and the load average at the start (other work on the machine slows NVRTC).
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--space", default="search_spaces/gemm.yaml")
    parser.add_argument("--sample", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]])
    env = {**os.environ, "TUNER_CACHE_DIR": tempfile.mkdtemp(prefix="check_speed_")}
    runs = {}
    for label in ("cold", "warm"):
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "tuner", "check", args.space, "--sample", str(args.sample), "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - t0
        report = json.loads(proc.stdout)
        runs[label] = {
            "configs": report["compiled"] + report["failed"],
            "failed": report["failed"],
            "seconds": report["seconds"],
            "configs_per_s": report["configs_per_s"],
            "process_wall_s": round(wall, 2),
            "load_average_1min_before": round(load, 2),
        }
        print(f"{label}: {runs[label]}")
    record = {
        "command": command,
        "date": dt.date.today().isoformat(),
        "cpus": os.cpu_count(),
        "space": args.space,
        "sample": args.sample,
        **runs,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"check_speed-{record['date']}.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
