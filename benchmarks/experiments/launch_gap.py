"""Where a GEMV config's measured time goes: the first launch after an L2 flush against back-to-back launches.

    python benchmarks/experiments/launch_gap.py [--problem m64] [--config mma=4,sk=2,t=128,...] [--budget-ms 100]
        [--out DIR]

The study protocol (`tuner.gpu.timing.benchmark`) times one launch between CUDA events after an L2 flush
(`tuner.gpu.timing.L2_FLUSH`). This script times each config four ways with that same function, on one GPU, in one
process:

* `flushed`: the protocol (flush, then one call of the config's launches between the events);
* `pair`: flush, then two calls back to back between the events; `pair - flushed` is what one more call costs
  when it follows a call of itself (W does not fit in L2, so the second call streams W from HBM too);
* `warm`: no flush, one call;
* `memset_flushed`: one call after a flush that *writes* the flush buffer (a memset of twice the L2, the
  protocol before 2026-12-01): it evicts the previous call's data as well, but leaves the L2 full of dirty lines.

and does the same for cuBLAS (torch.matmul) and a cudaMemcpy D2D of the GEMV's byte count. A config whose
`flushed` time exceeds its `pair - flushed` by much more than the copy's does pays a cost on the first launch
after other work (launch of a cluster grid, the SMEM carve-out the flush kernel left behind), not in its loop.
Writes ``launch_gap-<date>.json`` under --out (default $OUT, else benchmarks/results) and prints a table.
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

#: engine 4's best M = 64 config (cluster split-K), the same without the cluster (partials + a reduce launch),
#: engine 2's best, and engine 1 (no SMEM ring, no cluster) as found by the 2026-12-01 runs
DEFAULT_CONFIGS = (
    "mma=4,sk=2,t=128,kw=1,rw=16,u=4,pf=0,wc=na,st=3,cl=1",
    "mma=4,sk=1,t=128,kw=1,rw=16,u=4,pf=0,wc=na,st=3,cl=0",
    "mma=2,sk=2,t=128,kw=1,rw=16,u=4,pf=0,wc=na,st=3,cl=1",
    "mma=1,sk=1,t=128,kw=4,rw=16,u=4,pf=0,wc=na256,st=2,cl=0",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problem", default="m64")
    parser.add_argument("--config", nargs="*", default=list(DEFAULT_CONFIGS))
    parser.add_argument("--budget-ms", type=float, default=100.0)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()

    import cupy
    import torch
    from cupy.cuda import runtime
    from cupy_backends.cuda.api import driver

    from tuner import kernels
    from tuner.build import compile as compile_mod
    from tuner.build import render
    from tuner.gpu.evaluator import GpuEvaluator
    from tuner.gpu.timing import benchmark
    from tuner.space import space as space_mod

    space = space_mod.load("gemv")
    problem = space.problem(args.problem)
    family = kernels.get("gemv")
    ev = GpuEvaluator()
    info = ev.start()
    stream = ev.device.stream
    M, N, K = (problem.sizes[k] for k in ("M", "N", "K"))
    nbytes = family.bytes_moved(problem.env)

    def four_ways(run) -> dict:
        def pair() -> None:
            run()
            run()

        flushed = benchmark(run, stream=stream, budget_ms=args.budget_ms, flush=ev.device.flush).median_ms
        paired = benchmark(pair, stream=stream, budget_ms=args.budget_ms, flush=ev.device.flush).median_ms
        warm = benchmark(run, stream=stream, budget_ms=args.budget_ms).median_ms
        written = benchmark(run, stream=stream, budget_ms=args.budget_ms, flush=memset_flush).median_ms
        return {
            "flushed_us": round(flushed * 1e3, 2),
            "pair_us": round(paired * 1e3, 2),
            "second_call_us": round((paired - flushed) * 1e3, 2),
            "warm_us": round(warm * 1e3, 2),
            "memset_flushed_us": round(written * 1e3, 2),
            "TBps_memset_flushed": round(nbytes / (written * 1e-3) / 1e12, 3),
            "TBps_flushed": round(nbytes / (flushed * 1e-3) / 1e12, 3),
            "TBps_second_call": round(nbytes / ((paired - flushed) * 1e-3) / 1e12, 3),
        }

    rows = []
    with stream:
        written_buf = cupy.empty(ev.device.flush_bytes, dtype=cupy.uint8)

        def memset_flush() -> None:
            written_buf.data.memset_async(0, ev.device.flush_bytes, stream)

        x = cupy.asarray(cupy.random.standard_normal((M, K), dtype=cupy.float32)).astype(cupy.float16)
        w = cupy.asarray(cupy.random.standard_normal((N, K), dtype=cupy.float32)).astype(cupy.float16)
        x_bits, w_bits = x.view(cupy.uint16), w.view(cupy.uint16)  # the kernels read raw bf16 bits: timing only
        for text in args.config:
            config = space.config_from_assignments(text.split(","), problem)  # URI short names: t=128 ...
            resolved = space.resolve(config, problem)
            source = render.render(family, config, resolved, problem.env)
            compiled = compile_mod.compile_source(source, ev.arch)
            if not compiled.ok:
                rows.append({"config": text, "failure": compiled.reason})
                continue
            launches = family.launches(source.entry, resolved, problem.env)
            loaded = ev._load(compiled, [launch.entry for launch in launches])
            for launch in launches:  # past 48 KiB of dynamic SMEM a kernel must opt in (as the evaluator does)
                if launch.smem_dynamic > 48 * 1024:
                    ptr = loaded.functions[launch.entry].ptr
                    driver.funcSetAttribute(
                        ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, launch.smem_dynamic
                    )
            outs = {
                name: cupy.empty(shape, dtype=cupy.float32 if dtype == "float32" else cupy.uint16)
                for name, (shape, dtype) in family.outputs(problem.env, resolved).items()
            }
            arrays = {"x": x_bits, "W": w_bits, **outs}
            calls = [
                (
                    loaded.functions[launch.entry],
                    launch.grid,
                    launch.block,
                    tuple(arrays[a] if a in arrays else cupy.int32(problem.sizes[a]) for a in launch.args),
                    launch.smem_dynamic,
                )
                for launch in launches
            ]

            def run(calls=calls) -> None:
                for function, grid, block, kargs, smem in calls:
                    function(grid, block, kargs, shared_mem=smem, stream=stream)

            row = {"config": text, "uri": source.uri, **four_ways(run)}
            rows.append(row)
            print(row, flush=True)

        xt = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        wt = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        torch_stream = torch.cuda.ExternalStream(stream.ptr)

        def cublas() -> None:
            with torch.cuda.stream(torch_stream):
                torch.matmul(xt, wt.t())

        rows.append({"config": "cublas (torch.matmul)", **four_ways(cublas)})
        print(rows[-1], flush=True)
        src = cupy.empty(nbytes // 2, dtype=cupy.uint8)
        dst = cupy.empty(nbytes // 2, dtype=cupy.uint8)
        src.fill(1)
        dst.fill(0)

        def copy() -> None:
            runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes // 2, runtime.memcpyDeviceToDevice, stream.ptr)

        rows.append({"config": "cudaMemcpy D2D, same bytes (read + write)", **four_ways(copy)})
        print(rows[-1], flush=True)

    date = dt.date.today().isoformat()
    record = {
        "command": "python benchmarks/experiments/launch_gap.py " + " ".join(sys.argv[1:]),
        "gpu": info["gpu"],
        "date": date,
        "problem": problem.name,
        "bytes": nbytes,
        "budget_ms": args.budget_ms,
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"launch_gap-{date}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(
        "\n| config | flushed µs | pair µs | second call µs | warm µs | memset-flushed µs | TB/s flushed "
        "| TB/s second call | TB/s memset-flushed |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        if "failure" in row:
            print(f"| {row['config']} | failed: {row['failure']} |")
            continue
        print(
            f"| {row.get('uri', row['config'])} | {row['flushed_us']} | {row['pair_us']} | {row['second_call_us']} "
            f"| {row['warm_us']} | {row['memset_flushed_us']} | {row['TBps_flushed']} | {row['TBps_second_call']} "
            f"| {row['TBps_memset_flushed']} |"
        )
    ev.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
