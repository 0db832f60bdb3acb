"""Brute-force ground truth: every valid config of six spaces of different character, measured on the GPU.

Runs ``tuner study KERNEL --space SPACE --sampler grid`` for each space below, one after another, each within a
share of the time budget proportional to its number of valid configs (a space cut short is recorded as such: its
grid is incomplete and benchmarks/search.py must not treat it as ground truth). Each study database is
checkpointed, vacuumed and gzipped to $OUT/NAME.db.gz; $OUT/manifest.json names each recording's space, problem,
GPU, valid and recorded configs and the command. benchmarks/search.py replays them (commit them under
benchmarks/data/ with the manifest).

    python benchmarks/record_grid.py --gpus 2                 # about 7 minutes on two H200s
    python benchmarks/record_grid.py --only transpose,softmax --budget-s 120
    python benchmarks/record_grid.py --resume --out DIR   # continue the recordings DIR/NAME.db.gz hold
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: name → (kernel, space file, problem). Character: transpose (small, dense), softmax and rmsnorm (row kernels,
#: string knobs), GEMV M = 1 and M = 64 (sparse: under 1% of the Cartesian product is valid), GEMM (FLOP-bound,
#: thousands of valid configs, some spilling).
SPACES = {
    "transpose": ("transpose", "search_spaces/transpose.yaml", None),
    "softmax": ("softmax", "benchmarks/spaces/grid_softmax.yaml", None),
    "rmsnorm": ("rmsnorm", "benchmarks/spaces/grid_rmsnorm.yaml", None),
    "gemv_m1": ("gemv", "benchmarks/spaces/grid_gemv_m1.yaml", None),
    "gemv_m64": ("gemv", "benchmarks/spaces/grid_gemv_m64.yaml", None),
    "gemm": ("gemm", "benchmarks/spaces/grid_gemm.yaml", None),
    # The decode ladder: the GEMV grid space at M = 1, 2, 4, ... 64, one recording per problem, for transfer between
    # neighbouring shapes (benchmarks/shapes.py --replay). Not in the default six: --only gemv_ladder_m1,...
    **{
        f"gemv_ladder_m{m}": ("gemv", "benchmarks/spaces/grid_gemv_ladder.yaml", f"m{m}")
        for m in (1, 2, 4, 8, 16, 32, 64)
    },
}
#: what a run without --only records
DEFAULT = ("transpose", "softmax", "rmsnorm", "gemv_m1", "gemv_m64", "gemm")


def valid_count(space: str, problem: str | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from tuner.space import space as space_mod

    loaded = space_mod.load(ROOT / space)
    return loaded.count_valid(loaded.problem(problem) if problem else None)


def compact(db: Path, out: Path) -> int:
    """Fold the WAL in, vacuum, gzip to `out`; returns the gzipped size."""
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute("VACUUM")
    conn.close()
    with open(db, "rb") as src, gzip.open(out, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    return out.stat().st_size


def recorded(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(db)
    rows = conn.execute("SELECT state, COUNT(*) FROM trials GROUP BY state").fetchall()
    conn.close()
    return {str(state): n for state, n in rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--budget-s", type=float, default=450.0, help="total seconds for all spaces")
    parser.add_argument("--only", help="comma-separated names (default: the six of DEFAULT)")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT/NAME.db.gz where it exists (the grid measures only the configs not yet recorded)",
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "data"))
    args = parser.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.only.split(",") if args.only else list(DEFAULT)
    counts = {name: valid_count(SPACES[name][1], SPACES[name][2]) for name in names}
    total = sum(counts.values())
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    deadline = time.monotonic() + args.budget_s
    print(f"{'space':10} {'valid':>6} {'recorded':>8} {'failed':>6} {'seconds':>7} {'cfg/s':>6} {'MB':>5}  complete")
    for i, name in enumerate(names):
        kernel, space, problem = SPACES[name]
        # This space's share of what is left, so time one space does not use passes to the next.
        left = deadline - time.monotonic()
        share = left * counts[name] / sum(counts[n] for n in names[i:])
        db = out / f"{name}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        previous = manifest.get(f"{name}.db.gz", {}) if args.resume else {}
        resuming = args.resume and (out / f"{name}.db.gz").exists()
        if resuming:
            with gzip.open(out / f"{name}.db.gz", "rb") as src, open(db, "wb") as dst:
                shutil.copyfileobj(src, dst)
        cmd = [
            sys.executable,
            "-m",
            "tuner",
            "study",
            kernel,
            "--space",
            space,
            "--sampler",
            "grid",
            "--trials",
            "1000000",
            "--storage",
            f"sqlite:///{db}",
            "--study-name",
            f"grid-{name}",
            "--gpus",
            str(args.gpus),
            "--json",
        ]
        if problem:
            cmd += ["--problem", problem]
        if resuming:
            cmd += ["--takeover"]  # the lease names the machine that recorded the first part
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            stdout, stderr = proc.communicate(timeout=max(share, 30.0))
            cut = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)  # the driver stops; trials it wrote stay in the database
            try:
                stdout, stderr = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, stderr = proc.communicate()
            cut = True
        seconds = time.monotonic() - started
        summary = {}
        if proc.returncode == 0 and stdout.strip():
            summary = json.loads(stdout)
        elif not cut:
            print(f"{name}: tuner study failed ({proc.returncode}): {stderr.strip().splitlines()[-1:]}")
        if not db.exists():
            continue
        states = recorded(db)
        done = states.get("COMPLETE", 0) + states.get("FAIL", 0) + states.get("PRUNED", 0)
        size = compact(db, out / f"{name}.db.gz")
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        # The dashboard's .cu/PTX artifacts (one small file per trial) are not ground truth: not kept.
        shutil.rmtree(out / f"{name}.artifacts", ignore_errors=True)
        complete = not cut and done >= counts[name]
        manifest[f"{name}.db.gz"] = {
            "kernel": kernel,
            "space": space,
            "problem": problem,
            "valid": counts[name],
            "recorded": done,
            "states": states,
            "complete": complete,
            "seconds": round(seconds + (previous.get("seconds", 0.0) if resuming else 0.0), 1),
            "gpus": args.gpus,
            "gpu": (summary.get("gpus") or [{}])[0].get("gpu"),
            "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(cmd[1:]),
            **({"resumed_from": {k: previous.get(k) for k in ("recorded", "date", "gpus")}} if resuming else {}),
        }
        print(
            f"{name:10} {counts[name]:>6} {done:>8} {states.get('FAIL', 0):>6} {seconds:>7.0f} "
            f"{done / seconds:>6.1f} {size / 1e6:>5.1f}  {'yes' if complete else 'NO (cut by the budget)'}"
        )
        manifest_path.write_text(json.dumps(manifest, indent=1))
    print(f"wrote {manifest_path} ({total} valid configs in {len(names)} spaces)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
