"""Hand-picked FP32 GEMM configs beside cuBLAS SGEMM, one GPU, one process.

    python benchmarks/experiments/gemm_probe.py [--space benchmarks/spaces/gemm_dynamic_smem.yaml] [--budget-ms 300]
        [--config tm=128,tn=256,tk=16,rm=16,rn=8,pad=4,vec=4,lb=1,fuse=2,st=2 ...] [--out DIR]

Each config (uri short names, or the space's own param names) is verified against the float64 reference and timed
by the same protocol as a study's finalists (`tuner.gpu.evaluate.evaluate_config`, L2 flushed between launches, the
median of `--budget-ms` of launches); cuBLAS SGEMM (torch.mm, TF32 off) is timed by that protocol before and after
the configs. Writes ``gemm_probe-<date>.json`` under --out (default $OUT, else benchmarks/results) and prints a
table of TFLOP/s and × cuBLAS (against the mean of the two cuBLAS timings).
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

#: the main job's best configs so far (2026-12-01), the reference points of every probe
DEFAULT_CONFIGS = (
    "tm=128,tn=256,tk=16,rm=16,rn=8,pad=4,vec=4,lb=1,fuse=2,st=1",
    "tm=256,tn=128,tk=8,rm=16,rn=8,pad=4,vec=4,lb=1,fuse=1,st=2",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default=str(ROOT / "benchmarks" / "spaces" / "gemm_dynamic_smem.yaml"))
    parser.add_argument("--config", nargs="*", default=[], help="configs beyond the reference points")
    parser.add_argument("--budget-ms", type=float, default=300.0)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()

    import torch

    from tuner.core.errors import SpaceError
    from tuner.gpu.evaluate import evaluate_config
    from tuner.gpu.evaluator import GpuEvaluator
    from tuner.gpu.timing import benchmark
    from tuner.space import space as space_mod

    space = space_mod.load(args.space)
    problem = space.problem()
    try:  # URI short names (tm=128) or the space's own param names
        configs = [space.config_from_assignments(text.split(","), problem) for text in (*DEFAULT_CONFIGS, *args.config)]
    except SpaceError as exc:
        raise SystemExit(f"gemm_probe: {exc}") from None
    ev = GpuEvaluator()
    info = ev.start()

    torch.backends.cuda.matmul.allow_tf32 = False
    m, n, k = problem.sizes["M"], problem.sizes["N"], problem.sizes["K"]
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(k, n, device="cuda")
    torch_stream = torch.cuda.ExternalStream(ev.device.stream.ptr)
    flops = 2 * m * n * k

    def cublas_tflops() -> float:
        def run() -> None:
            with torch.cuda.stream(torch_stream):
                torch.mm(a, b)

        return (
            flops
            / benchmark(
                run, stream=ev.device.stream, budget_ms=args.budget_ms, flush=ev.device.flush, hold=ev.device.hold
            ).median_ms
            / 1e9
        )

    before = cublas_tflops()
    rows = []
    for config in configs:
        result = evaluate_config(space, config, problem, evaluator=ev, budget_ms=args.budget_ms)
        row = {"config": config, "ok": result.ok}
        if result.ok:
            row.update(
                uri=result.uri,
                TFLOPs=round(result.tflops, 3),
                median_ms=result.median_ms,
                registers=result.registers,
                spill_bytes=result.spill_bytes,
                smem_bytes=result.smem_bytes,
            )
        else:
            row["failure"] = f"{result.kind}: {result.reason}"
        rows.append(row)
        print(row.get("uri", config), row.get("TFLOPs", row.get("failure")), flush=True)
    after = cublas_tflops()
    reference = (before + after) / 2
    for row in rows:
        if row["ok"]:
            row["ratio_vs_cublas"] = round(row["TFLOPs"] / reference, 4)
    date = dt.date.today().isoformat()
    record = {
        "command": "python benchmarks/experiments/gemm_probe.py " + " ".join(sys.argv[1:]),
        "gpu": info["gpu"],
        "date": date,
        "space": str(Path(args.space).resolve().relative_to(ROOT)),
        "budget_ms": args.budget_ms,
        "cublas_tflops_before": round(before, 3),
        "cublas_tflops_after": round(after, 3),
        "configs": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"gemm_probe-{date}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"\ncuBLAS SGEMM {before:.2f} / {after:.2f} TFLOP/s (before / after)\n")
    print("| config | TFLOP/s | × cuBLAS | registers | SMEM B |")
    print("|---|---:|---:|---:|---:|")
    for row in rows:
        if row["ok"]:
            print(
                f"| `{row['uri']}` | {row['TFLOPs']:.2f} | {row['ratio_vs_cublas']:.4f} | {row['registers']} | "
                f"{row['smem_bytes']} |"
            )
        else:
            print(f"| {row['config']} | {row['failure']} | | | |")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
