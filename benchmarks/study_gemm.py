"""The main job, timed, and its best config against cuBLAS in the same run.

    python benchmarks/study_gemm.py [--trials 500] [--caches fresh|warm] [--engine local|ray] [--study-only]

1. runs ``tuner study gemm --space search_spaces/gemm.yaml --trials N`` (fresh database) and takes its process
   wall, start-up stage by stage (the summary's ``startup``: imports, storage, pool and GPU worker start, the
   ceiling measured or cached, the first result), cold start and GPU-busy fraction. ``--caches fresh`` (the
   default) gives it empty TUNER_CACHE_DIR and CUPY_CACHE_DIR, as on a new machine; ``--caches warm`` runs the
   same study twice over the same caches (into two databases) and reports the second;
2. re-times the study's fastest config with a longer budget (finalists are re-timed before they are reported),
   verified again on fresh inputs;
3. times cuBLAS SGEMM (torch.mm, TF32 off) with the same protocol (`tuner.gpu.timing.benchmark`) on the same GPU.

Writes ``study_gemm-<date>.json`` (records: kernel, shape, impl, TBps, TFLOPs, ceiling_TBps, gpu, date, command)
and a markdown table under --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument(
        "--out",
        default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"),
        help="folder for the JSON and table (default: $OUT when set, else benchmarks/results)",
    )
    parser.add_argument(
        "--caches",
        choices=("fresh", "warm"),
        default="fresh",
        help="fresh: empty compile/ceiling and CuPy caches; warm: run twice, report the second",
    )
    parser.add_argument("--engine", choices=("local", "ray"), help="the study's engine (default: the study's)")
    parser.add_argument("--study-only", action="store_true", help="time the study alone (no re-time, no cuBLAS)")
    parser.add_argument("--seed", type=int, help="the sampler's seed (default: unseeded, as a user runs it)")
    args = parser.parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]])
    work = Path(tempfile.mkdtemp(prefix="study_gemm_"))
    env = {
        **os.environ,
        "TUNER_CACHE_DIR": str(work / "cache"),
        "CUPY_CACHE_DIR": str(work / "cupy-cache"),
        "RAY_AUTH_MODE": "disabled",
    }
    runs = []
    for attempt in range(2 if args.caches == "warm" else 1):
        url = f"sqlite:///{work}/gemm{attempt}.db"
        study_cmd = [
            sys.executable,
            "-m",
            "tuner",
            "study",
            "gemm",
            "--space",
            "search_spaces/gemm.yaml",
            "--trials",
            str(args.trials),
            "--storage",
            url,
            "--json",
        ]
        if args.engine:
            study_cmd += ["--engine", args.engine]
        if args.seed is not None:
            study_cmd += ["--seed", str(args.seed)]
        started = time.perf_counter()
        proc = subprocess.run(study_cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            print(proc.stderr[-4000:])
            return 1
        summary = json.loads(proc.stdout)
        runs.append(
            {
                "caches": "fresh" if attempt == 0 else "warm",
                "process_wall_s": round(wall, 3),
                "driver_wall_s": summary["wall_s"],
                "cold_start_s": summary["cold_start_s"],
                "startup": summary["startup"],
                "after_start_s": summary["after_start_s"],
                "evaluated_per_s": summary["evaluated_per_s"],
                "gpu_busy_fraction": summary["gpu_busy_fraction"],
                # where the search's time went: GPU seconds, the workers' occupied share, compile and check phases
                **{
                    k: summary.get(k)
                    for k in ("gpu_s", "workers_busy_fraction", "gpu_window_s", "phases_s", "phases_share")
                },
                "writer_flush_s": summary.get("writer_flush_s"),
                "writer": summary.get("writer"),
                "trials": summary["trials"],
                "cut_short": summary.get("cut_short_this_run"),
                "screened": summary.get("screened_this_run"),
                "sampler_ms_per_proposal": summary.get("sampler_ms_per_proposal"),
                "best_screening_tflops": (summary.get("best") or {}).get("tflops"),
            }
        )
        print(
            f"study ({runs[-1]['caches']} caches): {summary['trials']} trials in {wall:.1f} s (driver wall "
            f"{summary['wall_s']} s, first result after {summary['cold_start_s']} s, GPU busy "
            f"{summary['gpu_busy_fraction']})",
            flush=True,
        )
        print("  start-up: " + ", ".join(f"{k} {v}" for k, v in _flat(summary["startup"]).items()), flush=True)
    if args.study_only:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        date = dt.date.today().isoformat()
        path = out / f"study_gemm-startup-{args.caches}-{date}.json"
        path.write_text(json.dumps({"command": command, "date": date, "runs": runs}, indent=1) + "\n")
        print(f"wrote {path}")
        print("| caches | process wall s | first result s | valid-set wait s | study ready s | GPU busy |")
        print("|---|---:|---:|---:|---:|---:|")
        for run in runs:
            stages = run["startup"]
            print(
                f"| {run['caches']} | {run['process_wall_s']:.1f} | {run['cold_start_s']} | "
                f"{stages.get('valid_index_wait_s')} | {stages.get('study_ready_s')} | {run['gpu_busy_fraction']} |"
            )
        return 0

    import optuna
    import torch

    from tuner.gpu.evaluate import evaluate_config
    from tuner.gpu.evaluator import GpuEvaluator
    from tuner.gpu.timing import benchmark
    from tuner.space import space as space_mod

    study = optuna.load_study(study_name=summary["study"], storage=url)
    space = space_mod.load(ROOT / "search_spaces" / "gemm.yaml")
    problem = space.problem()
    best = summary["best"]
    params = best["params"]
    ev = GpuEvaluator()
    info = ev.start()
    final = evaluate_config(space, params, problem, evaluator=ev, budget_ms=500.0)
    assert final.ok, final
    # The space's default (trial 0 of every new study), re-timed by the same protocol: the search must beat it.
    default_params = dict(space.default)
    default = evaluate_config(space, default_params, problem, evaluator=ev, budget_ms=500.0)
    assert default.ok, default

    torch.backends.cuda.matmul.allow_tf32 = False
    m, n, k = problem.sizes["M"], problem.sizes["N"], problem.sizes["K"]
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(k, n, device="cuda")
    torch_stream = torch.cuda.ExternalStream(ev.device.stream.ptr)

    def cublas():
        with torch.cuda.stream(torch_stream):
            torch.mm(a, b)

    cublas_ms = benchmark(
        cublas, stream=ev.device.stream, budget_ms=500.0, flush=ev.device.flush, hold=ev.device.hold
    ).median_ms
    flops = 2 * m * n * k
    cublas_tflops = flops / cublas_ms / 1e9
    date = dt.date.today().isoformat()
    shape = f"{m}x{n}x{k} fp32"
    base = {
        "kernel": "gemm",
        "shape": shape,
        "ceiling_TBps": round(info["ceiling_tbps"], 4),
        "gpu": info["gpu"],
        "date": date,
        "command": command,
    }
    counts = {s: sum(1 for t in study.trials if t.state.name == s) for s in ("COMPLETE", "PRUNED", "FAIL")}
    records = [
        {
            **base,
            "impl": "tuner",
            "TBps": round(final.tbps, 4),
            "TFLOPs": round(final.tflops, 3),
            "config": params,
            "uri": final.uri,
            "registers": final.registers,
            "spill_bytes": final.spill_bytes,
            "median_ms": final.median_ms,
            "p20_ms": final.p20_ms,
            "p80_ms": final.p80_ms,
            "ratio_vs_cublas": round(final.tflops / cublas_tflops, 4),
            "ratio_vs_default": round(final.tflops / default.tflops, 4),
            "best_is_default": params == default_params,
            "study_tflops_screening": round(best["tflops"], 3),
            "note": "C = gelu(A·B + bias) + R with the epilogue fused; TFLOP/s count 2MNK; re-timed with a 500 ms "
            "budget after the study",
        },
        {
            **base,
            "impl": "space default",
            "TBps": round(default.tbps, 4),
            "TFLOPs": round(default.tflops, 3),
            "config": default_params,
            "uri": default.uri,
            "median_ms": default.median_ms,
            "ratio_vs_cublas": round(default.tflops / cublas_tflops, 4),
            "note": "the space's default config (trial 0 of every new study), re-timed with the same 500 ms budget",
        },
        {
            **base,
            "impl": "cublas",
            "TBps": round((m * k + k * n + m * n) * 4 / cublas_ms / 1e9, 4),
            "TFLOPs": round(cublas_tflops, 3),
            "median_ms": cublas_ms,
            "note": "cuBLAS SGEMM via torch.mm, TF32 off, GEMM alone",
        },
        {
            **base,
            "impl": "tuner study (main job)",
            "trials": summary["trials"],
            "wall_s": round(wall, 2),
            "caches": args.caches,
            "startup": summary["startup"],
            "runs": runs,
            "driver_wall_s": summary["wall_s"],
            "cold_start_s": summary["cold_start_s"],
            "gpu_busy_fraction": summary["gpu_busy_fraction"],
            "measured": summary["measured_this_run"],
            "duplicates": summary["duplicates_this_run"],
            "failures": summary["failures_this_run"],
            "trial_states": counts,
            "study_command": " ".join(study_cmd[1:]).replace(str(work), "$TMP"),
        },
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "" if args.seed is None else f"-seed{args.seed}"
    (out / f"study_gemm-{date}{tag}.json").write_text(json.dumps(records, indent=1, default=str) + "\n")
    lines = [
        f"# The main job on {info['gpu']}, {date}",
        "",
        f"Command: `{command}`",
        "",
        f"Best found vs the space's default: {final.tflops / default.tflops:.3f}×"
        + (" (the best is the default)" if params == default_params else ""),
        "",
        f"`tuner study gemm --trials {args.trials}`: {summary['trials']} trials in {wall:.1f} s "
        f"(first result after {summary['cold_start_s']} s; GPU busy {summary['gpu_busy_fraction']}).",
        "",
        "| impl | TFLOP/s | × cuBLAS | median ms | config |",
        "|---|---:|---:|---:|---|",
        f"| tuner | {final.tflops:.2f} | {final.tflops / cublas_tflops:.3f} | {final.median_ms:.3f} | `{final.uri}` |",
        f"| space default | {default.tflops:.2f} | {default.tflops / cublas_tflops:.3f} | {default.median_ms:.3f} "
        f"| `{default.uri}` |",
        f"| cuBLAS SGEMM (TF32 off) | {cublas_tflops:.2f} | 1.000 | {cublas_ms:.3f} | |",
    ]
    (out / f"study_gemm-{date}{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def _flat(d: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} → {"a.b": 1}: the start-up stages on one line."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


if __name__ == "__main__":
    sys.exit(main())
