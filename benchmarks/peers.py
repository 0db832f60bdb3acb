"""Ours against the peers a user would otherwise pick, side by side in one run on one GPU.

    python benchmarks/peers.py [--out benchmarks/results] [--gemm-sample 48]

- transpose FP32 16384²: every valid config of search_spaces/transpose.yaml (brute force) against torch eager
  (``x.t().contiguous()``), torch.compile of the same, and CuPy (``cupy.ascontiguousarray(x.T)``);
- the copy exercise over stride 1..32: the best config per stride (and the best with vec=1, the lesson's plain
  kernel) against ``x[::stride]`` made contiguous by torch and CuPy; stride 1 against cudaMemcpy;
- FP32 GEMM 4096³: a seeded sample of search_spaces/gemm.yaml plus hand-picked configs, fusion depth 3 (bias →
  GELU → residual fused), against cuBLAS SGEMM through torch with TF32 off (GEMM alone, the fairest peer: it does
  less work than we do) and torch eager / torch.compile of the full chain;
- repeatability: the best transpose config timed twice in the same run.

Everything is verified by `tuner.gpu.evaluator.GpuEvaluator` (ours) and timed with `tuner.gpu.timing.benchmark`
(peers too: same flush, same events, same budget). Useful bytes only: each input read once, each output written once.
Writes ``peers-<date>.json`` (a list of records: kernel, shape, impl, TBps, TFLOPs, ceiling_TBps, gpu, date,
command, ...) and ``peers-<date>.md`` under --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner import kernels  # noqa: E402
from tuner.build.compilers import compile_many  # noqa: E402
from tuner.build.render import render  # noqa: E402
from tuner.gpu.evaluator import GpuEvaluator  # noqa: E402
from tuner.gpu.protocol import EvaluateRequest  # noqa: E402
from tuner.gpu.timing import benchmark  # noqa: E402
from tuner.space import space as space_mod  # noqa: E402


def sweep(ev: GpuEvaluator, space, configs, problem=None, budget_ms: float = 25.0):
    """Compile `configs` in parallel, evaluate each; return [(params, result)] in input order."""
    problem = problem or space.problem()
    family = kernels.get(space.kernel)
    resolved = [space.resolve(c, problem) for c in configs]
    sources = [render(family, c, r, problem.env) for c, r in zip(configs, resolved, strict=True)]
    out = []
    for (params, config), (_, compiled) in zip(
        zip(configs, resolved, strict=True), compile_many(sources, arch=ev.arch, jobs=16), strict=True
    ):
        result = (
            compiled
            if not compiled.ok
            else ev.evaluate(EvaluateRequest(compiled, family, config, problem.env, budget_ms=budget_ms))
        )
        out.append((params, result))
    return out


def best_of(results, key="tbps"):
    ok = [(p, r) for p, r in results if r.ok]
    return max(ok, key=lambda pr: getattr(pr[1], key)) if ok else (None, None)


def time_peer(ev: GpuEvaluator, fn, budget_ms: float = 200.0):
    """Median ms of `fn` (torch or CuPy work) on the evaluator's stream with the kernels' protocol."""
    import torch

    stream = ev.device.stream
    torch_stream = torch.cuda.ExternalStream(stream.ptr)

    def run():
        with torch.cuda.stream(torch_stream), stream:
            fn()

    return benchmark(run, stream=stream, budget_ms=budget_ms, flush=ev.device.flush, hold=ev.device.hold).median_ms


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--gemm-sample", type=int, default=48)
    parser.add_argument("--skip", nargs="*", default=[], choices=["transpose", "copy", "gemm"])
    args = parser.parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]])

    import cupy
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ev = GpuEvaluator()
    info = ev.start()
    gpu, ceiling = info["gpu"], info["ceiling_tbps"]
    date = dt.date.today().isoformat()
    records: list[dict] = []

    def record(kernel, shape, impl, tbps, tflops=None, **extra):
        rec = {
            "kernel": kernel,
            "shape": shape,
            "impl": impl,
            "TBps": round(tbps, 4),
            "TFLOPs": None if tflops is None else round(tflops, 3),
            "ceiling_TBps": round(ceiling, 4),
            "fraction_of_ceiling": round(tbps / ceiling, 4),
            "gpu": gpu,
            "date": date,
            "command": command,
            **extra,
        }
        records.append(rec)
        print(
            f"{kernel:10s} {shape:18s} {impl:28s} {tbps:7.3f} TB/s {rec['fraction_of_ceiling']:6.3f}x"
            + (f" {tflops:7.2f} TFLOP/s" if tflops else ""),
            flush=True,
        )

    record("copy", "cudaMemcpy D2D 2GiB", "cudaMemcpy", ceiling)
    started = time.time()

    # -- transpose ------------------------------------------------------------------------------------------
    if "transpose" not in args.skip:
        space = space_mod.load(ROOT / "search_spaces" / "transpose.yaml")
        problem = space.problem()
        n_rows, n_cols = problem.sizes["rows"], problem.sizes["cols"]
        shape = f"{n_rows}x{n_cols} fp32"
        nbytes = 2 * n_rows * n_cols * 4
        results = sweep(ev, space, list(space.enumerate(problem)), problem)
        failed = [(p, r) for p, r in results if not r.ok]
        params, best = best_of(results)
        record(
            "transpose",
            shape,
            "tuner",
            best.tbps,
            config=params,
            uri=best.uri,
            registers=best.registers,
            configs_measured=len(results),
            configs_failed=len(failed),
        )
        for label, match in (
            ("tuner SMEM[32][33] vec1", {"tile": 32, "pad": 1, "vec": 1}),
            ("tuner SMEM[32][32] vec1", {"tile": 32, "pad": 0, "vec": 1}),
        ):
            subset = [(p, r) for p, r in results if all(p.get(k) == v for k, v in match.items())]
            p, r = best_of(subset)
            if r:
                record("transpose", shape, label, r.tbps, config=p)
        again = sweep(ev, space, [params], problem)[0][1]
        spread = abs(again.median_ms - best.median_ms) / best.median_ms
        records.append(
            {
                "kernel": "transpose",
                "shape": shape,
                "impl": "tuner repeatability",
                "config": params,
                "median_ms_first": best.median_ms,
                "median_ms_second": again.median_ms,
                "relative_difference": round(spread, 4),
                "gpu": gpu,
                "date": date,
                "command": command,
            }
        )
        print(f"repeatability: {best.median_ms:.4f} ms vs {again.median_ms:.4f} ms ({spread:.2%})")

        x = torch.randn(n_rows, n_cols, device="cuda")
        xc = cupy.asarray(x)
        record("transpose", shape, "torch eager", nbytes / time_peer(ev, lambda: x.t().contiguous()) / 1e9)
        compiled_t = torch.compile(lambda t: t.t().contiguous())
        compiled_t(x)
        record("transpose", shape, "torch.compile", nbytes / time_peer(ev, lambda: compiled_t(x)) / 1e9)
        record("transpose", shape, "cupy", nbytes / time_peer(ev, lambda: cupy.ascontiguousarray(xc.T)) / 1e9)
        del x, xc
        torch.cuda.empty_cache()
        cupy.get_default_memory_pool().free_all_blocks()

    # -- copy exercise --------------------------------------------------------------------------------------
    if "copy" not in args.skip:
        space = space_mod.load(ROOT / "search_spaces" / "copy.yaml")
        problem = space.problem("n64M")
        n = problem.sizes["n"]
        useful = 2 * n * 4
        all_results = sweep(ev, space, list(space.enumerate(problem)), problem)
        for stride in sorted(set(space.params["stride"])):
            subset = [(p, r) for p, r in all_results if p["stride"] == stride]
            p, r = best_of(subset)
            record("copy", f"n={n} stride={stride}", "tuner", r.tbps, config=p, stride=stride)
            p1, r1 = best_of([(p, r) for p, r in subset if p["vec"] == 1])
            if r1:
                record(
                    "copy", f"n={n} stride={stride}", "tuner vec1 (lesson kernel)", r1.tbps, config=p1, stride=stride
                )
            x = torch.randn(n * stride, device="cuda")
            xc = cupy.asarray(x)
            # x[::1].contiguous() is x itself (no work): stride 1 copies with clone()/copy() instead.
            torch_op = (lambda x=x: x.clone()) if stride == 1 else (lambda x=x, s=stride: x[::s].contiguous())
            cupy_op = (
                (lambda xc=xc: xc.copy()) if stride == 1 else (lambda xc=xc, s=stride: cupy.ascontiguousarray(xc[::s]))
            )
            record(
                "copy", f"n={n} stride={stride}", "torch eager", useful / time_peer(ev, torch_op) / 1e9, stride=stride
            )
            record("copy", f"n={n} stride={stride}", "cupy", useful / time_peer(ev, cupy_op) / 1e9, stride=stride)
            del x, xc
            torch.cuda.empty_cache()
            cupy.get_default_memory_pool().free_all_blocks()

        # The coalesced copy at scale (1 GiB each way), against cudaMemcpy of the same size.
        big = space.problem("n256M")
        nb = big.sizes["n"]
        p, r = best_of(sweep(ev, space, list(space.enumerate(big)), big))
        record("copy", f"n={nb} stride=1", "tuner", r.tbps, config=p, stride=1)
        x = torch.randn(nb, device="cuda")
        y = torch.empty_like(x)
        record(
            "copy",
            f"n={nb} stride=1",
            "cudaMemcpy (same size)",
            2 * nb * 4 / time_peer(ev, lambda: y.copy_(x)) / 1e9,
            stride=1,
            note="torch copy_ between two contiguous fp32 tensors: a device-to-device cudaMemcpyAsync",
        )
        record("copy", f"n={nb} stride=1", "torch eager", 2 * nb * 4 / time_peer(ev, lambda: x.clone()) / 1e9, stride=1)
        del x, y
        torch.cuda.empty_cache()

    # -- GEMM ---------------------------------------------------------------------------------------------------
    if "gemm" not in args.skip:
        space = space_mod.load(ROOT / "search_spaces" / "gemm.yaml")
        problem = space.problem()
        m, n_, k = problem.sizes["M"], problem.sizes["N"], problem.sizes["K"]
        shape = f"{m}x{n_}x{k} fp32"
        flops = 2 * m * n_ * k
        family = kernels.get("gemm")
        gemm_bytes = family.bytes_moved(problem.env)
        hand = [dict(space.default)]
        for tm, tn, rm, rn, tk in (
            (128, 128, 8, 8, 8),
            (128, 256, 8, 16, 8),
            (256, 128, 16, 8, 8),
            (128, 64, 8, 8, 16),
            (64, 128, 8, 8, 16),
            (128, 128, 8, 8, 32),
        ):
            for lb in (1, 2):
                cfg = {
                    **space.default,
                    "tile_m": tm,
                    "tile_n": tn,
                    "thread_m": rm,
                    "thread_n": rn,
                    "tile_k": tk,
                    "min_blocks": lb,
                    "fusion": 3,
                }
                if space.validate(cfg, problem) is None and cfg not in hand:
                    hand.append(cfg)
        sample = [c for c in space.sample(args.gemm_sample * 4, seed=11, problem=problem) if c["fusion"] == 3]
        configs = hand + sample[: args.gemm_sample]
        results = sweep(ev, space, configs, problem, budget_ms=40.0)
        params, best = best_of(results, key="tflops")
        record(
            "gemm",
            shape,
            "tuner",
            best.tbps,
            best.tflops,
            config=params,
            uri=best.uri,
            registers=best.registers,
            spill_bytes=best.spill_bytes,
            configs_measured=len(results),
            note="C = gelu(A·B + bias) + R, fused; TFLOP/s count 2MNK",
        )
        a = torch.randn(m, k, device="cuda")
        b = torch.randn(k, n_, device="cuda") / k**0.5
        bias = torch.randn(n_, device="cuda")
        r = torch.randn(m, n_, device="cuda")
        ms = time_peer(ev, lambda: torch.mm(a, b))
        record(
            "gemm",
            shape,
            "cublas",
            (m * k + k * n_ + m * n_) * 4 / ms / 1e9,
            flops / ms / 1e9,
            note="cuBLAS SGEMM via torch.mm, TF32 off; GEMM alone",
        )
        chain = lambda: torch.nn.functional.gelu(torch.addmm(bias, a, b), approximate="tanh") + r  # noqa: E731
        ms = time_peer(ev, chain)
        record("gemm", shape, "torch eager (chain)", gemm_bytes / ms / 1e9, flops / ms / 1e9)
        compiled_chain = torch.compile(chain)
        compiled_chain()
        ms = time_peer(ev, compiled_chain)
        record("gemm", shape, "torch.compile (chain)", gemm_bytes / ms / 1e9, flops / ms / 1e9)
        xa, xb = cupy.asarray(a), cupy.asarray(b)
        ms = time_peer(ev, lambda: xa @ xb)
        record("gemm", shape, "cupy matmul", (m * k + k * n_ + m * n_) * 4 / ms / 1e9, flops / ms / 1e9)

    print(f"total {time.time() - started:.1f} s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"peers-{date}.json").write_text(json.dumps(records, indent=1, default=str) + "\n")
    lines = [
        f"# Peers on {gpu}, {date}",
        "",
        f"Command: `{command}`; copy ceiling {ceiling:.3f} TB/s (cudaMemcpy D2D, read + write).",
        "",
        "| kernel | shape | impl | TB/s | × ceiling | TFLOP/s |",
        "|---|---|---|---:|---:|---:|",
    ]
    for rec in records:
        if "TBps" in rec:
            tf = "" if rec["TFLOPs"] is None else f"{rec['TFLOPs']:.2f}"
            lines.append(
                f"| {rec['kernel']} | {rec['shape']} | {rec['impl']} | {rec['TBps']:.3f} | "
                f"{rec['fraction_of_ceiling']:.3f} | {tf} |"
            )
    (out / f"peers-{date}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
