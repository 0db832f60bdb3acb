"""The README's "Tune your own kernel" example, end to end on a GPU, exactly as a user runs it.

    python benchmarks/example_scale_add.py [--out DIR]      # default: $OUT, else benchmarks/results

Copies examples/scale_add into a fresh directory (outside the package), then runs there

1. ``tuner check scale_add.yaml`` (every config compiles),
2. ``tuner study scale_add --space scale_add.yaml --trials 48 --sampler grid`` (each of the 48 configs verified
   against ref.py and timed),
3. ``tuner best scale_add --json`` and ``tuner export scale_add --header scale_add_tuned.h``.

Writes ``example_scale_add-<date>.json`` (trial states, best config, its TB/s and fraction of the copy ceiling,
the commands), the exported header and a short markdown table under the output directory. Exit status 1 when a
config computes a wrong result or the best config is under 0.90 of the copy ceiling.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.90


def tuner(*args: str, cwd: Path, env: dict[str, str], ok: tuple[int, ...] = (0, 1)) -> subprocess.CompletedProcess:
    """Run one tuner command; any exit code outside `ok` stops the script with the command's stderr."""
    proc = subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode not in ok:
        sys.exit(f"tuner {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="scale_add_")) / "scale_add"
    shutil.copytree(ROOT / "examples" / "scale_add", work)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "TUNER_CACHE_DIR": str(work.parent / "cache"),
        "RAY_AUTH_MODE": "disabled",
    }
    commands = [
        ["check", "scale_add.yaml", "--json"],
        ["study", "scale_add", "--space", "scale_add.yaml", "--trials", "48", "--sampler", "grid", "--json"],
        ["best", "scale_add", "--json"],
        ["export", "scale_add", "--header", "scale_add_tuned.h"],
    ]
    check = json.loads(tuner(*commands[0], cwd=work, env=env).stdout)
    print(f"check: {check['compiled']} compiled, {check['failed']} failed", flush=True)
    study = json.loads(tuner(*commands[1], cwd=work, env=env, ok=(0,)).stdout)
    best = json.loads(tuner(*commands[2], cwd=work, env=env).stdout)
    tuner(*commands[3], cwd=work, env=env)

    import optuna

    url = f"sqlite:///{work}/studies/scale_add.db"
    trials = optuna.load_study(study_name=optuna.get_all_study_summaries(url)[0].study_name, storage=url).trials
    states = Counter(t.user_attrs.get("failure", t.state.name.lower()) for t in trials)
    date = dt.date.today().isoformat()
    record = {
        "kernel": "scale_add",
        "problem": "n64M float32 (out = 0.5 * x + y, 768 MiB moved per call)",
        "date": date,
        "gpu": best.get("gpu"),
        "trials": len(trials),
        "states": dict(states),
        "best": {
            k: best.get(k)
            for k in (
                "uri",
                "params",
                "throughput",
                "tbps",
                "fraction_of_ceiling",
                "ceiling_tbps",
                "median_ms",
                "registers",
            )
        },
        "target_fraction": TARGET,
        "study_wall_s": study.get("wall_s"),
        "commands": ["tuner " + " ".join(c) for c in commands],
        "script": "python benchmarks/example_scale_add.py",
    }
    (out / f"example_scale_add-{date}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    shutil.copy(work / "scale_add_tuned.h", out / f"example_scale_add-{date}.h")
    fraction = best.get("fraction_of_ceiling") or 0.0
    table = (
        "| kernel | best config | TB/s | fraction of copy ceiling | trials (states) | GPU |\n"
        "|---|---|---|---|---|---|\n"
        f"| scale_add n64M fp32 | {best.get('uri')} | {best.get('tbps', 0):.3f} | {fraction:.3f} | "
        f"{len(trials)} ({', '.join(f'{k} {v}' for k, v in sorted(states.items()))}) | {best.get('gpu')} |\n"
    )
    (out / f"example_scale_add-{date}.md").write_text(table)
    print(table)
    wrong = states.get("wrong_result", 0)
    if wrong or fraction < TARGET:
        print(f"FAILED: {wrong} wrong results; best at {fraction:.3f} of the ceiling (target {TARGET})")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
