"""The memory-bound catalog at the H200's speed of light: tune every family, measure it beside its peers.

    python benchmarks/catalog.py [--trials 120] [--out benchmarks/results] [--only softmax gemv ...]
                                 [--problems m1 b8_s4096 ...] [--studies DIR]

For each target (family, problem) it runs a real `tuner study` (TPE, in one process, one Ray session, one SQLite
database), whose fastest configs are re-timed with a longer budget at the end; then it times the peers a user
would otherwise pick with the same protocol (`tuner.gpu.timing.benchmark`: L2 flushed, CUDA events, median) on the
same GPU: torch eager, torch.compile, cuBLAS (torch's F.linear) for GEMV, and for the decode-time families the
peers of benchmarks/decode.py and decode_b.py (imported from there: SDPA per backend and flash_attn for decode
attention, torch's fused/foreach/compiled AdamW). The study database and its per-trial dashboard artifacts
(one small file per trial) go to a temporary folder that is deleted at the end, unless --studies names a
folder to keep them in; --out receives only the JSON and Markdown tables. Every figure counts
the family's minimal bytes (`Family.bytes_moved`: each input read once, each output written once), so TB/s
compare across implementations. For `elementwise` it also reports the best config per fusion depth: the lesson
predicts full fusion wins by about the ratio of bytes moved.

Writes ``catalog-<date>.json`` (records: kernel, shape, impl, TBps, TFLOPs, ceiling_TBps, gpu, date, command, ...)
and ``catalog-<date>.md`` under --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (family, problem, target fraction of the copy ceiling)
TARGETS = [
    ("elementwise", "r32768_c8192_bf16", 0.92),
    ("softmax", "r32768_c8192_bf16", 0.98),
    ("rmsnorm", "r32768_c8192_bf16", 0.98),
    ("layernorm", "r32768_c8192_bf16", 0.98),
    ("reduce", "sum_r32768_c8192_bf16", 0.98),
    ("transpose", "n16384", 0.95),
    ("gemv", "m1", 0.85),
    ("gemv", "m8", 0.85),
    ("gemv", "m64", 0.85),
    ("fp8_quant", "quant_t32768_h8192", 0.90),
    ("fp8_quant", "dequant_t32768_h8192", 0.90),
    ("rope", "t32768_q32_kv8_d128", 0.90),
    ("decode_attention", "b8_s4096", 0.85),
    ("decode_attention", "b64_s8192", 0.90),
    ("adamw", "llama8b_layer", 0.90),
]


def peers(kernel: str, problem, torch):
    """[(impl, callable)] for a problem; inputs are random bf16 tensors of the problem's shapes."""
    import torch.nn.functional as F

    s = problem.sizes
    dev, bf = "cuda", torch.bfloat16
    if kernel in ("fp8_quant", "rope"):
        import decode  # benchmarks/decode.py: the peers its study is measured against

        return decode.peers(kernel, s, torch)
    if kernel in ("decode_attention", "adamw"):
        import decode_b  # benchmarks/decode_b.py; a peer that refuses the shape has no callable: left out

        maker = decode_b.attention_peers if kernel == "decode_attention" else decode_b.adamw_peers
        found = maker(problem, torch)
        return [(impl, fn) for impl, fn, _reason in found if fn is not None]
    if kernel == "transpose":
        x = torch.randn(s["rows"], s["cols"], device=dev, dtype=torch.float32)

        def op():
            return x.t().contiguous()

        compiled = torch.compile(op)
        compiled()
        return [("torch eager", op), ("torch.compile", compiled)]
    if kernel == "gemv":
        x = torch.randn(s["M"], s["K"], device=dev, dtype=bf)
        w = torch.randn(s["N"], s["K"], device=dev, dtype=bf) / s["K"] ** 0.5
        return [("cublas (F.linear)", lambda: F.linear(x, w))]
    x = torch.randn(s["rows"], s["cols"], device=dev, dtype=bf)
    vec = torch.randn(s["cols"], device=dev, dtype=bf)
    ops = {
        "elementwise": lambda: F.gelu(x + vec, approximate="tanh") * 1.5,
        "softmax": lambda: torch.softmax(x, dim=-1),
        "rmsnorm": lambda: F.rms_norm(x, (s["cols"],), vec, eps=1e-6),
        "layernorm": lambda: F.layer_norm(x, (s["cols"],), vec, vec, eps=1e-5),
        "reduce": lambda: x.sum(dim=-1, dtype=torch.float32),
    }
    op = ops[kernel]
    compiled = torch.compile(op)
    compiled()
    return [("torch eager", op), ("torch.compile", compiled)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=120)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--only", nargs="*", help="families to run (default: all)")
    parser.add_argument("--problems", nargs="*", help="problem names to run within them (default: all)")
    parser.add_argument("--sampler", default="tpe", help="the studies' sampler (grid: every valid config)")
    parser.add_argument("--studies", help="keep the study database here (default: a temporary folder, deleted)")
    args = parser.parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the decode benchmarks' peers
    scratch = None if args.studies else tempfile.mkdtemp(prefix="catalog-studies-")
    studies = Path(args.studies or scratch)
    studies.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, command, out, studies)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def run(args, command: str, out: Path, studies: Path) -> int:
    import optuna
    import torch

    from tuner import kernels
    from tuner.gpu.evaluator import GpuEvaluator
    from tuner.gpu.timing import benchmark
    from tuner.space import space as space_mod
    from tuner.study.driver import run_study
    from tuner.study.options import StudyOptions

    date = dt.date.today().isoformat()
    records: list[dict] = []
    ev = None
    started = time.time()
    for kernel, problem_name, target in TARGETS:
        if (args.only and kernel not in args.only) or (args.problems and problem_name not in args.problems):
            continue
        space = space_mod.load(ROOT / "search_spaces" / f"{kernel}.yaml")
        problem = space.problem(problem_name)
        family = kernels.get(kernel)
        url = f"sqlite:///{studies}/catalog-{date}.db"
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
        best = summary["best"]
        ceiling = summary["gpus"][0]["ceiling_tbps"]
        gpu = summary["gpus"][0]["gpu"]
        shape = f"{problem_name} " + "x".join(str(v) for k, v in problem.sizes.items() if k not in ("op",))
        base = {
            "kernel": kernel,
            "shape": shape,
            "ceiling_TBps": round(ceiling, 4),
            "gpu": gpu,
            "date": date,
            "command": command,
        }
        frac = best["tbps"] / ceiling
        records.append(
            {
                **base,
                "impl": "tuner",
                "TBps": round(best["tbps"], 4),
                "TFLOPs": round(best["tflops"], 3),
                "fraction_of_ceiling": round(frac, 4),
                "target_fraction": target,
                "met": frac >= target,
                "config": best["params"],
                "uri": best["uri"],
                "registers": best["registers"],
                "smem_bytes": best["smem_bytes"],
                "median_ms": best.get("median_ms"),
                "study": summary["study"],
                "trials": summary["trials"],
                "sampler": args.sampler,
                "measured": summary["measured_this_run"],
                "failures": summary["failures_this_run"],
                "study_wall_s": round(time.time() - t0, 1),
            }
        )
        print(
            f"{kernel:12s} {problem_name:24s} tuner          {best['tbps']:.3f} TB/s {frac:.3f}x "
            f"(target {target}) {best['uri']}",
            flush=True,
        )

        study = optuna.load_study(study_name=summary["study"], storage=url)
        trials = [t for t in study.trials if t.state.name == "COMPLETE" and "duplicate_of" not in t.user_attrs]
        best_trial = max(trials, key=lambda t: t.user_attrs["tbps"])
        ua = best_trial.user_attrs
        records[-1].update(
            {
                "blocks_per_sm": ua.get("blocks_per_sm"),
                "warps_per_sm": ua.get("warps_per_sm"),
                "spill_bytes": ua.get("spill_bytes"),
                "bytes_moved": ua.get("bytes_moved"),
            }
        )
        if kernel == "elementwise":
            for depth in (1, 2, 3):
                at = [t for t in trials if t.params.get("fusion") == depth]
                if at:
                    t = max(at, key=lambda t: t.user_attrs["tbps"])
                    records.append(
                        {
                            **base,
                            "impl": f"tuner fusion depth {depth}",
                            "TBps": round(t.user_attrs["tbps"], 4),
                            "TFLOPs": None,
                            "median_ms": t.user_attrs["median_ms"],
                            "config": dict(t.params),
                            "kernels": -(-3 // depth),
                            "configs_at_depth": len(at),
                        }
                    )

        if ev is None:
            ev = GpuEvaluator()
            ev.start()
        torch_stream = torch.cuda.ExternalStream(ev.device.stream.ptr)
        nbytes = family.bytes_moved(problem.env)
        for impl, fn in peers(kernel, problem, torch):

            def run(fn=fn, torch_stream=torch_stream):
                with torch.cuda.stream(torch_stream):
                    fn()

            ms = benchmark(
                run, stream=ev.device.stream, budget_ms=200.0, flush=ev.device.flush, hold=ev.device.hold
            ).median_ms
            tbps = nbytes / ms / 1e9
            records.append(
                {
                    **base,
                    "impl": impl,
                    "TBps": round(tbps, 4),
                    "TFLOPs": None,
                    "fraction_of_ceiling": round(tbps / ceiling, 4),
                    "median_ms": ms,
                }
            )
            print(f"{kernel:12s} {problem_name:24s} {impl:14s} {tbps:.3f} TB/s {tbps / ceiling:.3f}x", flush=True)
        torch.cuda.empty_cache()
        (out / f"catalog-{date}.json").write_text(json.dumps(records, indent=1, default=str) + "\n")

    lines = [
        f"# Memory-bound catalog on {records[0]['gpu'] if records else '?'}, {date}",
        "",
        f"Command: `{command}`. TB/s count each family's minimal bytes; ceiling = cudaMemcpy D2D measured "
        "by the same worker.",
        "",
        "| kernel | problem | impl | TB/s | × ceiling | target | config |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in records:
        frac = r.get("fraction_of_ceiling", r["TBps"] / r["ceiling_TBps"])
        lines.append(
            f"| {r['kernel']} | {r['shape']} | {r['impl']} | {r['TBps']:.3f} | {frac:.3f} | "
            f"{r.get('target_fraction', '')} | {r.get('uri', '')} |"
        )
    (out / f"catalog-{date}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"total {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
