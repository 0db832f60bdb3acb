"""Where a GEMM compile's time goes: NVRTC to PTX (the front end and NVVM) against NVRTC to a cubin (the same plus
ptxas), for the main job's best config and a sample of the shipped GEMM space.

    python benchmarks/experiments/nvrtc_split.py [--configs 12] [--seed 1] [--repeats 3] [--out DIR]

Each config is rendered and compiled through `tuner.build.compile.nvrtc_compile` (no cache) for compute_90 (PTX
only) and for sm_90 (a cubin), `--repeats` times each after one warm-up compile of the process (NVRTC's first
compile also loads the library); the median of each is kept, and ptxas's share is 1 - PTX / cubin. Needs no GPU.
Writes ``nvrtc_split-<date>.json`` under --out (default: $OUT, else benchmarks/results) and prints a summary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

#: the main job's best config on the H200 (benchmarks/results/study_gemm-2026-12-04.md at commit a50964f)
BEST = {
    "tile_m": 128,
    "tile_n": 256,
    "tile_k": 16,
    "thread_m": 16,
    "thread_n": 8,
    "pad": 4,
    "vec": 4,
    "min_blocks": 0,
    "fusion": 2,
    "stages": 1,
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    if args.configs < 0 or args.repeats < 1:
        parser.error("--configs must be at least 0 and --repeats at least 1")

    from tuner.build.compile import include_options, nvrtc_compile, nvrtc_options
    from tuner.build.render import render
    from tuner.space import space as space_mod

    space = space_mod.load("gemm")
    problem = space.problems[0]
    sample = random.Random(args.seed).sample(space.valid_configs(problem), args.configs)

    def timed(params: dict, arch: str) -> float:
        source = render(space.family, params, space.resolve(params, problem), problem.expression_env)
        options = [*nvrtc_options(source, arch), *include_options(source)]
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            status, log, _, _ = nvrtc_compile(source.text, "gemm.cu", options)
            times.append(time.perf_counter() - started)
            assert status == 0, log[-500:]
        return statistics.median(times)

    timed(BEST, "sm_90")  # the warm-up: NVRTC's first compile in a process also loads it
    rows = []
    for params in [BEST, *sample]:
        ptx, cubin = timed(params, "compute_90"), timed(params, "sm_90")
        rows.append({"params": params, "ptx_s": round(ptx, 4), "cubin_s": round(cubin, 4)})
    ptx_total, cubin_total = sum(r["ptx_s"] for r in rows[1:]), sum(r["cubin_s"] for r in rows[1:])
    record = {
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": dt.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores (no GPU needed)",
        "best": rows[0],
        "best_ptxas_share": round(1 - rows[0]["ptx_s"] / rows[0]["cubin_s"], 3),
        "sample_ptxas_share": round(1 - ptx_total / cubin_total, 3) if cubin_total else None,
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"nvrtc_split-{record['date']}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "rows"} | {"written": str(path)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
