"""Faults in a user's kernel, on a GPU: what each config of tests/data/faults ends as, and what a hang costs.

    python3 benchmarks/faults.py [--out DIR] [--timeout S]      # default: $OUT, else benchmarks/results

Runs the study of `tests/gpu/test_faults_gpu.py` (a declarative family whose configs hang, hit an illegal address,
trap, store misaligned, compute a wrong result, allocate beyond memory, ask for too many registers or too much
shared memory) on GPU 0 and writes ``faults-<date>.json`` and ``faults-<date>.md`` under the output directory:
the command, the GPU, the date, each config's failure type and reason, and for the hang its deadline, what it
cost its GPU and the start-up of the worker that replaced it. Exit status 1 when a config ends otherwise than
expected or the hang cost more than 2 s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANG_BUDGET_S = 2.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--timeout", type=float, default=60.0, help="the study's --timeout (the deadline's ceiling)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path[:0] = [str(ROOT)]
    from tests.gpu.test_faults_gpu import EXPECTED, run_fault_study

    work = Path(tempfile.mkdtemp(prefix="faults_"))
    os.environ.setdefault("TUNER_CACHE_DIR", str(work / "cache"))
    os.chdir(work)
    started = time.perf_counter()
    summary, by_mode = run_fault_study(work, timeout_s=args.timeout)
    wall = time.perf_counter() - started
    gpus = summary.get("gpus") or [{}]
    mismatched = {m: t["failure"] for m, t in by_mode.items() if t["failure"] != EXPECTED.get(m)}
    over = [h for h in summary.get("hangs", []) if h["cost_s"] > HANG_BUDGET_S]
    date = dt.date.today().isoformat()
    record = {
        "benchmark": "faults",
        "date": date,
        "gpu": gpus[0].get("gpu"),
        "command": f"python3 benchmarks/faults.py --out {args.out} --timeout {args.timeout:g}",
        "study_wall_s": summary.get("wall_s"),
        "script_wall_s": round(wall, 3),
        "configs": {m: {**t, "expected": EXPECTED.get(m)} for m, t in by_mode.items()},
        "hangs": summary.get("hangs", []),
        "replacements_s": summary.get("replacements_s", []),
        "hang_budget_s": HANG_BUDGET_S,
        "mismatched": mismatched,
    }
    (out / f"faults-{date}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    lines = [
        f"# faults, {date}, {record['gpu']}",
        "",
        f"`{record['command']}`: study of {len(by_mode)} configs in {summary.get('wall_s')} s; "
        f"workers replaced, start-up s: {record['replacements_s']}",
        "",
        "| mode | expected | got | reason |",
        "|---|---|---|---|",
        *(
            f"| {m} | {EXPECTED.get(m) or 'measured'} | {t['failure'] or 'measured'} | "
            f"{(t['reason'] or '').splitlines()[0][:140] if t['reason'] else ''} |"
            for m, t in sorted(by_mode.items(), key=lambda kv: kv[1]["number"])
        ),
        "",
        "| hung trial | deadline s | cost s | phase |",
        "|---|---|---|---|",
        *(f"| {h['trial']} | {h['deadline_s']} | {h['cost_s']} | {h['phase']} |" for h in record["hangs"]),
        "",
    ]
    (out / f"faults-{date}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    if mismatched or over or not record["hangs"]:
        print(f"FAILED: mismatched {mismatched}; hangs over {HANG_BUDGET_S} s: {over}; hangs {record['hangs']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
