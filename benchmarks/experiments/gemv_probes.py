"""Hand-picked GEMV configs on the GPU in one worker: the engine-2 levers at M = 8 / 64 and the down projection.

    python benchmarks/experiments/gemv_probes.py [--out $OUT] [--budget-ms 200] [--only m64 ...]
    python benchmarks/experiments/gemv_probes.py --dry-run      # no GPU: validate every probe against the space

Each probe is a config of search_spaces/gemv.yaml (the space default plus the listed changes), verified and
timed with the study's protocol (`tuner.gpu.evaluate.evaluate_config`: L2 flushed, CUDA events, median) in one
isolated GPU worker. Writes ``gemv_probes-<date>.json`` under --out and prints a table: TB/s, × the 2 GiB copy
ceiling, registers, SMEM and the failure reason of a config that did not verify.

What the probes separate (M = 64: each W element feeds 64 rows of x):
* `rw64`: 64-row warp tiles; each warp reads the x tile from SMEM once per 64 W rows instead of once per 16
  (SMEM reads per W byte: 2 instead of 5 at 16 rows);
* `cl2` / `cl4`: cluster split-K, 128 or 256 W rows a block, so x is re-read from L2 by half or a quarter as many
  row blocks, the split partials summed through DSMEM (no fp32 partials in HBM, no second launch);
* `ref`: the best configs of the previous tuning run, for a same-run comparison.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

E2 = {"mma": 2, "m_tile": 64, "vec": 8, "prefetch": 0, "min_blocks": 1}

# (name, problem, changes to the space default)
PROBES = [
    (
        "ref",
        "m64",
        {**E2, "threads": 256, "k_warps": 2, "rows_per_warp": 16, "unroll": 4, "stages": 3, "w_cache": "cs"},
    ),
    (
        "rw64-t128",
        "m64",
        {**E2, "threads": 128, "k_warps": 4, "rows_per_warp": 64, "unroll": 1, "stages": 4, "w_cache": "cs"},
    ),
    (
        "rw64-t256-kw8",
        "m64",
        {**E2, "threads": 256, "k_warps": 8, "rows_per_warp": 64, "unroll": 1, "stages": 3, "w_cache": "cs"},
    ),
    (
        "cl2-rw64",
        "m64",
        {
            **E2,
            "split_k": 2,
            "cluster": 1,
            "threads": 256,
            "k_warps": 4,
            "rows_per_warp": 64,
            "unroll": 1,
            "stages": 3,
            "w_cache": "cs",
        },
    ),
    (
        "cl2-rw32",
        "m64",
        {
            **E2,
            "split_k": 2,
            "cluster": 1,
            "threads": 256,
            "k_warps": 2,
            "rows_per_warp": 32,
            "unroll": 2,
            "stages": 4,
            "w_cache": "cs",
        },
    ),
    (
        "cl4-rw32",
        "m64",
        {
            **E2,
            "split_k": 4,
            "cluster": 1,
            "threads": 256,
            "k_warps": 1,
            "rows_per_warp": 32,
            "unroll": 2,
            "stages": 4,
            "w_cache": "cs",
        },
    ),
    (
        "cl4-rw64",
        "m64",
        {
            **E2,
            "split_k": 4,
            "cluster": 1,
            "threads": 256,
            "k_warps": 2,
            "rows_per_warp": 64,
            "unroll": 1,
            "stages": 4,
            "w_cache": "cs",
        },
    ),
    (
        "ref",
        "down_m64",
        {
            **E2,
            "split_k": 2,
            "threads": 128,
            "k_warps": 1,
            "rows_per_warp": 32,
            "unroll": 4,
            "stages": 4,
            "w_cache": "cs",
        },
    ),
    (
        "cl2-rw64",
        "down_m64",
        {
            **E2,
            "split_k": 2,
            "cluster": 1,
            "threads": 256,
            "k_warps": 4,
            "rows_per_warp": 64,
            "unroll": 1,
            "stages": 4,
            "w_cache": "cs",
        },
    ),
    (
        "cl4-rw32",
        "down_m64",
        {
            **E2,
            "split_k": 4,
            "cluster": 1,
            "threads": 256,
            "k_warps": 1,
            "rows_per_warp": 32,
            "unroll": 2,
            "stages": 4,
            "w_cache": "cs",
        },
    ),
    (
        "ref",
        "m8",
        {**E2, "threads": 256, "k_warps": 2, "rows_per_warp": 16, "unroll": 4, "stages": 3, "w_cache": "na256"},
    ),
    (
        "cl2-rw32",
        "m8",
        {
            **E2,
            "split_k": 2,
            "cluster": 1,
            "threads": 256,
            "k_warps": 2,
            "rows_per_warp": 32,
            "unroll": 4,
            "stages": 3,
            "w_cache": "na256",
        },
    ),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "benchmarks" / "results")))
    parser.add_argument("--budget-ms", type=float, default=200.0, help="timed work per config")
    parser.add_argument("--only", nargs="*", help="problems to probe (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="validate the probes only (no GPU)")
    args = parser.parse_args()

    from tuner.space import space as space_mod

    space = space_mod.load(ROOT / "search_spaces" / "gemv.yaml")
    probes = [(name, p, {**space.default, **c}) for name, p, c in PROBES if not args.only or p in args.only]
    for name, problem_name, params in probes:
        why = space.validate(params, space.problem(problem_name))
        if why is not None:
            print(f"{space.path}: probe {name} on {problem_name} is not a valid config: {why}", file=sys.stderr)
            return 2
    if args.dry_run:
        print(f"{len(probes)} probes valid")
        return 0

    from tuner.gpu.evaluate import evaluate_config
    from tuner.gpu.worker import IsolatedEvaluator

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    with IsolatedEvaluator(gpu=0, timeout_s=120.0) as evaluator:
        info = evaluator.start()
        for name, problem_name, params in probes:
            result = evaluate_config(
                space, params, space.problem(problem_name), evaluator=evaluator, budget_ms=args.budget_ms
            )
            record = {
                "probe": name,
                "problem": problem_name,
                "params": params,
                "gpu": info.get("gpu"),
                **result.to_dict(),
            }
            records.append(record)
            if result.ok:
                line = (
                    f"{result.tbps:.3f} TB/s  {result.fraction_of_ceiling:.3f}x copy  regs {result.registers}  "
                    f"smem {result.smem_bytes}  {result.uri}"
                )
            else:
                line = f"FAILED {result.kind}: {str(getattr(result, 'reason', ''))[:200]}"
            print(f"{problem_name:9s} {name:14s} {line}", flush=True)
    path = out / f"gemv_probes-{dt.date.today().isoformat()}.json"
    path.write_text(json.dumps(records, indent=1, default=str) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
