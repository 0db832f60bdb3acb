"""Decode-time kernels on the GPU in one go: tune GEMV (M = 1..64), per-token FP8 quantize/dequantize and rotary
embedding with `tuner study`, and time the peers a user would otherwise pick beside them.

    python benchmarks/decode.py [--trials 60] [--out $OUT] [--only gemv rope ...] [--problems m1 m64 ...]
    python benchmarks/decode.py --dry-run        # no GPU: render and compile a sample of every target's configs

For each target (family, problem) it runs a short real study (TPE, one process, one Ray session, a fresh SQLite
database under --out; the fastest configs re-timed with a longer budget at the end), then times with the same
protocol (`tuner.gpu.timing.benchmark`: L2 flushed, CUDA events, median) on the same GPU:

* the peers: torch eager and torch.compile for every family; cuBLAS (torch.matmul) for GEMV;
* two ceilings: cudaMemcpy device-to-device of the problem's own byte count (read + write = the family's
  minimal bytes, the fair ceiling for a problem of this size) and of 2 GiB (the study's ceiling).

Every figure counts the family's minimal bytes (`Family.bytes_moved`), so TB/s compare across implementations.
Writes ``decode-<date>.json`` (one record per figure), ``decode-<date>.md`` and the studies' SQLite database
``decode-<date>.db`` under --out and prints the table. The per-trial artifacts the studies attach (sources and
compile logs, thousands of small files in ``decode-<date>.artifacts/``) are deleted after each study: the
database keeps every trial's config, figures and reasons, and a config's source re-renders from them.
The default targets and 60 trials take about 8 minutes on an H200.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shlex
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (family, problem, target fraction of the same-bytes copy, target ratio to the best peer)
TARGETS = [
    ("gemv", "m1", 0.90, 1.15),
    ("gemv", "m2", 0.85, 1.15),
    ("gemv", "m4", 0.85, 1.15),
    ("gemv", "m8", 0.85, 1.15),
    ("gemv", "m16", 0.85, 1.15),
    ("gemv", "m32", 0.85, 1.15),
    ("gemv", "m64", 0.85, 1.15),
    ("gemv", "up_m1", 0.90, 1.15),
    ("gemv", "up_m64", 0.85, 1.15),
    ("gemv", "down_m1", 0.90, 1.15),
    ("gemv", "down_m64", 0.85, 1.15),
    ("fp8_quant", "quant_t32768_h8192", 0.90, 1.0),
    ("fp8_quant", "dequant_t32768_h8192", 0.90, 1.0),
    ("rope", "t32768_q32_kv8_d128", 0.90, 1.0),
]


def peers(kernel: str, sizes: dict, torch) -> list[tuple[str, object]]:
    """[(impl, callable)] on random inputs of the problem's shapes; torch.compile'd ones are warmed up here."""
    dev, bf = "cuda", torch.bfloat16
    if kernel == "gemv":
        x = torch.randn(sizes["M"], sizes["K"], device=dev, dtype=bf)
        w = torch.randn(sizes["N"], sizes["K"], device=dev, dtype=bf) / sizes["K"] ** 0.5

        def op():
            return torch.matmul(x, w.t())

        name = "cublas (torch.matmul)"
    elif kernel == "fp8_quant" and sizes["op"] == 1:
        x = torch.randn(sizes["T"], sizes["H"], device=dev, dtype=bf)

        def op():
            scale = x.abs().amax(dim=-1, keepdim=True).float() / 448.0
            q = (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
            return q, scale

        name = "torch eager"
    elif kernel == "fp8_quant":
        q = torch.randn(sizes["T"], sizes["H"], device=dev).clamp(-448, 448).to(torch.float8_e4m3fn)
        scale = torch.rand(sizes["T"], 1, device=dev)

        def op():
            return (q.float() * scale).to(bf)

        name = "torch eager"
    elif kernel == "rope":
        T, half = sizes["T"], sizes["D"] // 2
        q = torch.randn(T, sizes["Hq"], sizes["D"], device=dev, dtype=bf)
        k = torch.randn(T, sizes["Hkv"], sizes["D"], device=dev, dtype=bf)
        angle = torch.rand(T, half, device=dev)
        cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]

        def op():
            for x in (q, k):  # NeoX rotate-half, in place
                x1, x2 = x[..., :half].float(), x[..., half:].float()
                x.copy_(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1))

        name = "torch eager"
    else:
        raise ValueError(kernel)
    compiled = torch.compile(op)
    compiled()
    compiled()
    return [(name, op), ("torch.compile", compiled)]


def selected(args) -> list[tuple[str, str, float, float]]:
    return [t for t in TARGETS if (not args.only or t[0] in args.only) and (not args.problems or t[1] in args.problems)]


def space_paths(args) -> dict[str, Path]:
    """The space file each selected family is tuned with: a --space file naming it, else the shipped one."""
    from tuner.space import space as space_mod

    chosen = {space_mod.load(path).kernel: Path(path).resolve() for path in args.space}
    return {kernel: chosen.get(kernel, ROOT / "search_spaces" / f"{kernel}.yaml") for kernel, *_ in TARGETS}


def dry_run(args) -> int:
    """Render and compile the default plus a seeded sample of valid configs of every target (NVRTC, no GPU)."""
    from tuner import kernels
    from tuner.build import compilers, render
    from tuner.space import space as space_mod

    failures = 0
    t0 = time.time()
    spaces = space_paths(args)
    for kernel, problem_name, _, _ in selected(args):
        space = space_mod.load(spaces[kernel])
        problem = space.problem(problem_name)
        family = kernels.get(kernel)
        valid = list(space.enumerate(problem))
        configs = random.Random(0).sample(valid, min(args.dry_sample, len(valid)))
        if space.validate(space.default, problem) is None:
            configs.append(space.default)
        sources = [render.render(family, c, space.resolve(c, problem), problem.env) for c in configs]
        for config in configs:
            family.launches("e", space.resolve(config, problem), problem.env)
        results = list(compilers.compile_many(sources, jobs=args.jobs))
        bad = [(s.uri, r.reason) for s, r in results if not r.ok]
        spills = [s.uri for s, r in results if r.ok and r.spill_bytes]
        regs = [r.registers for _, r in results if r.ok]
        failures += len(bad)
        print(
            f"{kernel:10s} {problem_name:22s} valid {len(valid):5d}/{space.cartesian}  compiled {len(results)}  "
            f"failed {len(bad)}  spilling {len(spills)}  registers {min(regs, default=0)}-{max(regs, default=0)}"
            f"  MB {family.bytes_moved(problem.env) / 1e6:.1f}",
            flush=True,
        )
        for uri, reason in bad:
            print(f"  FAILED {uri}: {reason.splitlines()[0] if reason else ''}")
    print(f"dry run: {time.time() - t0:.0f} s, {failures} compile failures")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--out", default=os.environ.get("OUT", str(ROOT / "benchmarks" / "results")))
    parser.add_argument("--only", nargs="*", help="families to run (default: all)")
    parser.add_argument("--problems", nargs="*", help="problem names to run (default: all targets)")
    parser.add_argument(
        "--space",
        action="append",
        default=[],
        metavar="PATH",
        help="a space file to tune its family with instead of the shipped one (repeatable, one per family)",
    )
    parser.add_argument("--sampler", default="tpe", help="the studies' sampler (grid: every valid config)")
    parser.add_argument("--dry-run", action="store_true", help="render and compile only (no GPU)")
    parser.add_argument("--dry-sample", type=int, default=24, help="configs per target in --dry-run")
    parser.add_argument("--jobs", type=int, default=None, help="compile processes in --dry-run")
    args = parser.parse_args()
    if args.dry_run:
        return dry_run(args)

    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    from tuner import kernels
    from tuner.gpu.ceiling import measure_ceiling
    from tuner.gpu.evaluator import GpuEvaluator
    from tuner.gpu.timing import benchmark
    from tuner.space import space as space_mod
    from tuner.store.artifacts import artifact_dir_for
    from tuner.study.driver import run_study
    from tuner.study.options import StudyOptions

    date = dt.date.today().isoformat()
    url = f"sqlite:///{out}/decode-{date}.db"
    records: list[dict] = []
    ev = None
    started = time.time()

    def write() -> None:
        (out / f"decode-{date}.json").write_text(json.dumps(records, indent=1, default=str) + "\n")

    spaces = space_paths(args)
    for kernel, problem_name, target_copy, target_peer in selected(args):
        space = space_mod.load(spaces[kernel])
        problem = space.problem(problem_name)
        family = kernels.get(kernel)
        t0 = time.time()
        summary = run_study(
            StudyOptions(
                kernel=kernel,
                space=str(space.path),
                trials=args.trials,
                storage=url,
                problem=problem_name,
                progress=False,
                finalists=3,
                seed=0,
                sampler=args.sampler,
            )
        )
        artifacts = artifact_dir_for(url)
        if artifacts is not None:
            shutil.rmtree(artifacts, ignore_errors=True)
        best = summary["best"]
        gpu = summary["gpus"][0]["gpu"]
        ceiling_2g = summary["gpus"][0]["ceiling_tbps"]
        nbytes = family.bytes_moved(problem.env)
        if ev is None:
            ev = GpuEvaluator()
            ev.start()
        same_bytes = measure_ceiling(nbytes // 2, 200.0, stream=ev.device.stream, flush=ev.device.flush)
        shape = " ".join(f"{k}={v}" for k, v in problem.sizes.items())
        base = {
            "kernel": kernel,
            "problem": problem_name,
            "shape": shape,
            "bytes_moved": nbytes,
            "gpu": gpu,
            "date": date,
            "command": command,
            "copy_same_bytes_TBps": round(same_bytes, 4),
            "copy_2GiB_TBps": round(ceiling_2g, 4),
        }
        tuned = {
            **base,
            "impl": "tuner",
            "TBps": round(best["tbps"], 4),
            "TFLOPs": round(best["tflops"], 3),
            "median_ms": best.get("median_ms"),
            "config": best["params"],
            "uri": best["uri"],
            "registers": best["registers"],
            "smem_bytes": best["smem_bytes"],
            "study": summary["study"],
            "space": str(Path(space.path).resolve().relative_to(ROOT)),
            "sampler": args.sampler,
            "trials": summary["trials"],
            "measured": summary["measured_this_run"],
            "failures": summary["failures_this_run"],
            "study_wall_s": round(time.time() - t0, 1),
            "target_vs_copy": target_copy,
            "target_vs_peer": target_peer,
        }
        records.append(tuned)

        torch_stream = torch.cuda.ExternalStream(ev.device.stream.ptr)
        peer_tbps = []
        for impl, fn in peers(kernel, problem.sizes, torch):

            def run(fn=fn, torch_stream=torch_stream):
                with torch.cuda.stream(torch_stream):
                    fn()

            ms = benchmark(
                run, stream=ev.device.stream, budget_ms=200.0, flush=ev.device.flush, hold=ev.device.hold
            ).median_ms
            tbps = nbytes / ms / 1e9
            peer_tbps.append(tbps)
            records.append(
                {
                    **base,
                    "impl": impl,
                    "TBps": round(tbps, 4),
                    "median_ms": ms,
                    "TFLOPs": round(family.flops(problem.env) / ms / 1e9, 3),
                }
            )
        torch.cuda.empty_cache()
        vs_copy, vs_peer = best["tbps"] / same_bytes, best["tbps"] / max(peer_tbps)
        tuned.update(
            {
                "vs_copy_same_bytes": round(vs_copy, 4),
                "vs_best_peer": round(vs_peer, 4),
                "met": vs_copy >= target_copy and vs_peer >= target_peer,
            }
        )
        print(
            f"{kernel:10s} {problem_name:22s} tuner {best['tbps']:.3f} TB/s = {vs_copy:.3f}x copy "
            f"({same_bytes:.3f}), {vs_peer:.3f}x best peer ({max(peer_tbps):.3f}); {best['uri']}  "
            f"[{time.time() - started:.0f} s]",
            flush=True,
        )
        write()

    lines = [
        f"# Decode-time kernels on {records[0]['gpu'] if records else '?'}, {date}",
        "",
        f"Command: `{command}`. TB/s count each family's minimal bytes. copy = cudaMemcpy D2D of the same byte "
        "count (read + write), and of 2 GiB; measured in the same run, same protocol.",
        "",
        "| kernel | problem | impl | TB/s | × copy (same bytes) | × best peer | target | copy same bytes | "
        "copy 2 GiB | config |",
        "|---|---|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in records:
        tuned = r["impl"] == "tuner"
        target = f"{r['target_vs_copy']}× copy, {r['target_vs_peer']}× peer" if tuned else ""
        vs_peer = f"{r['vs_best_peer']:.3f}" if tuned else ""
        lines.append(
            f"| {r['kernel']} | {r['problem']} | {r['impl']} | {r['TBps']:.3f} | "
            f"{r['TBps'] / r['copy_same_bytes_TBps']:.3f} | {vs_peer} | {target} | "
            f"{r['copy_same_bytes_TBps']:.3f} | {r['copy_2GiB_TBps']:.3f} | {r.get('uri', '')} |"
        )
    (out / f"decode-{date}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"total {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
