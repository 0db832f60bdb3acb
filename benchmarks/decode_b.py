"""Decode attention and fused AdamW: tune each with `tuner study`, then time the peers in the same run.

    python benchmarks/decode_b.py [--out DIR] [--trials-attention 100] [--trials-adamw 60] [--only KERNEL ...]
    python benchmarks/decode_b.py --dry-run      # no GPU: render and compile the defaults and a sample, then stop
    python benchmarks/decode_b.py --only decode_attention --probe   # + the fixed decode-attention probe configs

For each target (family, problem) it runs a real study (TPE, seed 0, one Ray session, SQLite under --out) whose
fastest configs are re-timed with a longer budget; then, on the same GPU with the same protocol
(`tuner.gpu.timing.benchmark`: L2 flushed, CUDA events, median):

- decode_attention: torch.nn.functional.scaled_dot_product_attention under each backend that accepts the shape
  (flash, memory-efficient, cuDNN, math; GQA through ``enable_gqa``, K/V in torch's [B, H, S, D] layout,
  contiguous — the layout its kernels prefer), the fastest marked; torch eager and torch.compile of the formula
  (q·Kᵀ, softmax, ·V with the query heads of a group as rows of one batched matmul); flash_attn's
  ``flash_attn_with_kvcache`` (split-KV decoding on the [B, S, H, D] cache) where that package is installed;
- adamw: ``torch.optim.AdamW(fused=True)``, ``foreach=True`` and a torch.compile'd ``step()`` over fp32
  parameters of the same sizes. torch needs gradients of the parameters' dtype, so its gradients are fp32
  (28 bytes per element against our 26): its TB/s is quoted on our minimal bytes (time ratio) and on its own;
- both: a cudaMemcpy device-to-device copy that moves the same bytes (read + write) as the problem, beside the
  worker's 2 GiB ceiling.

--probe also times a fixed list of decode-attention configs (`ATTENTION_PROBES`: each problem's last winner
against the same config with a combine launch, a fused combine and a cluster combine, other split counts, larger
tiles) on every attention problem, each verified against the reference first, so that the knobs are compared
head to head whatever the sampler visits; they are recorded as impl ``probe <config>`` (``probe default``: the
space's default).

Every TB/s counts the family's minimal bytes (`Family.bytes_moved`). Writes ``decode_b-<date>.json`` (records:
kernel, shape, impl, TBps, median_ms, ceiling_TBps, same_bytes_copy_TBps, gpu, date, command, ...) and
``decode_b-<date>.md`` under --out (default $OUT, else benchmarks/results), beside the studies' SQLite file; the
studies' per-trial artifact folder is deleted at the end unless --keep-artifacts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import shlex
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner import kernels  # noqa: E402
from tuner.space import space as space_mod  # noqa: E402

# (family, problem, target fraction of the copy ceiling)
TARGETS = [
    ("decode_attention", "b8_s4096", 0.85),
    ("decode_attention", "b16_s8192", 0.90),
    ("decode_attention", "b64_s8192", 0.90),
    ("adamw", "llama8b_layer", 0.90),
]


# the fastest config of each problem in the last H200 run (decode_b-2026-11-30: 0.788x, 0.925x and 1.017x the
# same-bytes copy at b8_s4096, b16_s8192 and b64_s8192), as changes to the space's default
_B8 = {"splits": 4, "threads": 128, "vec": 4, "tile": 2, "min_blocks": 4, "stages": 4, "combine": "fused"}
_B16 = {"splits": 2, "vec": 4, "tile": 2, "min_blocks": 2, "stages": 4, "combine": "fused"}
_B64 = {"splits": 8, "threads": 128, "tile": 2, "min_blocks": 4, "stages": 4, "combine": "launch"}

# changes to the space's default, timed by --probe on each decode_attention problem (invalid ones are skipped):
# each problem's last winner against the same config with the splits merged in a thread block cluster (no
# workspace round trip, no fence or atomic, one launch), other split counts under the cluster, and larger tiles
# with 3 stages
ATTENTION_PROBES = [
    {},
    _B8,
    {**_B8, "combine": "cluster"},
    {**_B8, "combine": "launch"},
    {**_B8, "splits": 8, "combine": "cluster"},
    {**_B8, "splits": 8, "stages": 3, "tile": 4, "min_blocks": 2, "combine": "cluster"},
    _B16,
    {**_B16, "combine": "cluster"},
    {**_B16, "splits": 4, "combine": "cluster"},
    {**_B16, "vec": 8, "stages": 3, "combine": "cluster"},
    _B64,
    {**_B64, "combine": "cluster"},
    {**_B64, "stages": 3, "tile": 4, "min_blocks": 2, "combine": "cluster"},
    {**_B64, "splits": 4, "combine": "cluster"},
]


# ------------------------------------------------------------------------------------------------------------
# peers


def attention_peers(problem, torch):
    """[(impl, callable)]: SDPA per backend that runs the shape, the formula in eager and compiled, flash_attn."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    s = problem.sizes
    B, S, hq, hkv, D = s["B"], s["S"], s["heads_q"], s["heads_kv"], s["head_dim"]
    g = hq // hkv
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(B, hq, 1, D, device=dev, dtype=bf)
    k = torch.randn(B, hkv, S, D, device=dev, dtype=bf)
    v = torch.randn(B, hkv, S, D, device=dev, dtype=bf)
    out = []
    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.MATH,
    ):

        def sdpa(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        try:
            sdpa()
            torch.cuda.synchronize()
        except RuntimeError as exc:  # this backend refuses the shape (the reason goes into the table)
            out.append((f"sdpa {backend.name.lower()}", None, str(exc).splitlines()[0][:160]))
            continue
        out.append((f"sdpa {backend.name.lower()}", sdpa, None))

    def formula(q=q, k=k, v=v):
        qg = q.view(B, hkv, g, D)
        p = torch.softmax((qg @ k.transpose(-1, -2)).float() * (1.0 / math.sqrt(D)), dim=-1)
        return (p.to(bf) @ v).view(B, hq, 1, D)

    compiled = torch.compile(formula)
    compiled()
    out += [("torch eager (formula)", formula, None), ("torch.compile (formula)", compiled, None)]
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        out.append(("flash_attn_with_kvcache", None, "flash_attn is not installed"))
    else:
        kc = k.transpose(1, 2).contiguous()  # its cache layout: [B, S, H, D]
        vc = v.transpose(1, 2).contiguous()
        qf = q.transpose(1, 2).contiguous()  # [B, 1, HQ, D]
        out.append(("flash_attn_with_kvcache", lambda: flash_attn_with_kvcache(qf, kc, vc), None))
    return out


def adamw_peers(problem, torch):
    """[(impl, callable)]: torch's AdamW over fp32 parameters of the problem's sizes, fused / foreach / compiled."""
    from tuner.kernels.adamw import HYPER, tensor_sizes

    sizes = tensor_sizes(problem.env)
    out = []
    for impl, kwargs in (
        ("torch AdamW fused", {"fused": True}),
        ("torch AdamW foreach", {"foreach": True}),
        ("torch.compile AdamW step", {"foreach": False}),
    ):
        params = [torch.nn.Parameter(torch.randn(n, device="cuda")) for n in sizes]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(
            params,
            lr=HYPER["lr"],
            betas=(HYPER["beta1"], HYPER["beta2"]),
            eps=HYPER["eps"],
            weight_decay=HYPER["weight_decay"],
            **kwargs,
        )
        step = opt.step
        if impl.startswith("torch.compile"):
            # the pattern of torch's compiled-optimizer recipe: compile a function that calls step()
            step = torch.compile(lambda opt=opt: opt.step(), fullgraph=False)
        step()  # creates the state (and compiles)
        out.append((impl, step, None))
    return out


# ------------------------------------------------------------------------------------------------------------
# dry run (no GPU)


def dry_run(targets, sample: int, probe: bool = False) -> int:
    """Render and compile each target's default and a seeded sample of valid configs (with `probe`, the
    decode-attention probes too) for sm_90; print the resources. Exit 1 if any fails."""
    from tuner.build.compilers import compile_many
    from tuner.build.render import render

    failed = 0
    for kernel, problem_name, _ in targets:
        space = space_mod.load(ROOT / "search_spaces" / f"{kernel}.yaml")
        problem = space.problem(problem_name)
        family = kernels.get(kernel)
        valid = list(space.enumerate(problem))
        configs = [space.default] + random.Random(0).sample(valid, min(sample, len(valid)))
        if probe and kernel == "decode_attention":
            changed = ({**space.default, **change} for change in ATTENTION_PROBES)
            configs += [c for c in changed if space.validate(c, problem) is None]
        sources = [render(family, c, space.resolve(c, problem), problem.env) for c in configs]
        for config, (source, result) in zip(configs, compile_many(sources, arch="sm_90", jobs=2), strict=True):
            launches = family.launches(source.entry, space.resolve(config, problem), problem.env)
            if result.ok:
                print(
                    f"{kernel:16s} {problem_name:14s} ok   regs {result.registers:3d} spill {result.spill_bytes:3d} "
                    f"launches {len(launches)}  {source.uri}"
                )
            else:
                failed += 1
                print(f"{kernel:16s} {problem_name:14s} FAIL {source.uri}: {result.reason}")
        megabytes = family.bytes_moved(problem.env) / 1e6
        print(f"{kernel:16s} {problem_name:14s} {len(valid)} valid configs, {megabytes:.1f} MB minimal")
    return 1 if failed else 0


# ------------------------------------------------------------------------------------------------------------
# the run


def probe_attention(space, problem, ev, base: dict, copy_tbps: float, best: dict) -> list[dict]:
    """Verify and time each of ATTENTION_PROBES on `problem` with the peers' evaluator; one record each."""
    from tuner.build.render import render
    from tuner.core.result import Measurement
    from tuner.gpu.evaluate import evaluate_config

    family = kernels.get("decode_attention")

    records = []
    for change in ATTENTION_PROBES:
        params = {**space.default, **change}
        name = "probe default"
        if (fault := space.validate(params, problem)) is None and change:
            uri = render(family, params, space.resolve(params, problem), problem.env).uri
            name = "probe " + uri.removeprefix(family.name + "_")
        if fault is not None:
            print(f"{'decode_attention':16s} {problem.name:12s} {name:48s} invalid here ({fault})", flush=True)
            continue
        result = evaluate_config(space, params, problem, evaluator=ev, budget_ms=200.0)
        if not isinstance(result, Measurement):
            reason = getattr(result, "reason", type(result).__name__)
            records.append({**base, "impl": name, "TBps": None, "median_ms": None, "note": reason, "config": params})
            print(f"{'decode_attention':16s} {problem.name:12s} {name:48s} FAILED: {reason}", flush=True)
            continue
        records.append(
            {
                **base,
                "impl": name,
                "TBps": round(result.tbps, 4),
                "median_ms": result.median_ms,
                "fraction_of_ceiling": round(result.fraction_of_ceiling, 4),
                "fraction_of_same_bytes_copy": round(result.tbps / copy_tbps, 4),
                "tuner_speedup": round(result.median_ms / best["median_ms"], 3) if best.get("median_ms") else None,
                "config": params,
                "registers": result.registers,
                "smem_bytes": result.smem_dynamic_bytes,
                "blocks_per_sm": result.blocks_per_sm,
            }
        )
        print(
            f"{'decode_attention':16s} {problem.name:12s} {name:48s} {result.tbps:.3f} TB/s "
            f"{result.tbps / copy_tbps:.3f}x same-bytes copy ({result.median_ms:.4f} ms, {result.registers} regs, "
            f"{result.smem_dynamic_bytes} B smem, {result.blocks_per_sm} blocks/SM)",
            flush=True,
        )
    return records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--trials-attention", type=int, default=100)
    parser.add_argument("--trials-adamw", type=int, default=60)
    parser.add_argument("--only", nargs="*", help="kernels or problem names to keep")
    parser.add_argument("--dry-run", action="store_true", help="render and compile only (no GPU)")
    parser.add_argument("--sample", type=int, default=6, help="configs compiled per target by --dry-run")
    parser.add_argument("--probe", action="store_true", help="also time ATTENTION_PROBES on each attention problem")
    parser.add_argument(
        "--keep-artifacts",
        action="store_true",
        help="keep the studies' per-trial source/PTX artifacts (<db>.artifacts/ under --out; deleted by default)",
    )
    args = parser.parse_args()
    targets = [t for t in TARGETS if not args.only or t[0] in args.only or t[1] in args.only]
    if args.dry_run:
        return dry_run(targets, args.sample, args.probe)

    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    from tuner.gpu.ceiling import _time_copy
    from tuner.gpu.evaluator import GpuEvaluator
    from tuner.gpu.timing import benchmark
    from tuner.store.artifacts import artifact_dir_for
    from tuner.study.driver import run_study
    from tuner.study.options import StudyOptions

    date = dt.date.today().isoformat()
    stem = f"decode_b-{date}"
    records: list[dict] = []
    started = time.time()
    ev = None  # the peers' evaluator: its stream, L2 flush and copy timing (created after the first study)
    for kernel, problem_name, target in targets:
        space = space_mod.load(ROOT / "search_spaces" / f"{kernel}.yaml")
        problem = space.problem(problem_name)
        family = kernels.get(kernel)
        trials = args.trials_attention if kernel == "decode_attention" else args.trials_adamw
        t0 = time.time()
        summary = run_study(
            StudyOptions(
                kernel=kernel,
                space=str(space.path),
                trials=trials,
                storage=f"sqlite:///{out}/{stem}.db",
                problem=problem_name,
                progress=False,
                finalists=3,
                seed=0,
            )
        )
        study_s = time.time() - t0
        best = summary["best"]
        ceiling = summary["gpus"][0]["ceiling_tbps"]
        gpu = summary["gpus"][0]["gpu"]
        nbytes = family.bytes_moved(problem.env)
        shape = f"{problem_name} " + " ".join(f"{k}={v}" for k, v in problem.sizes.items())
        base = {
            "kernel": kernel,
            "shape": shape,
            "bytes_moved": nbytes,
            "ceiling_TBps": round(ceiling, 4),
            "gpu": gpu,
            "date": date,
            "command": command,
        }

        # peers and the same-bytes copy, in this process, on the evaluator's stream
        torch.cuda.empty_cache()
        if ev is None:
            ev = GpuEvaluator()
            ev.start()
        copy = _time_copy(nbytes // 2, ev.device.stream, 200.0, 10, ev.device.flush)
        copy_tbps = nbytes / (copy.median_ms * 1e-3) / 1e12
        base["same_bytes_copy_TBps"] = round(copy_tbps, 4)
        frac = best["tbps"] / ceiling
        records.append(
            {
                **base,
                "impl": "tuner",
                "TBps": round(best["tbps"], 4),
                "median_ms": best.get("median_ms"),
                "fraction_of_ceiling": round(frac, 4),
                "fraction_of_same_bytes_copy": round(best["tbps"] / copy_tbps, 4),
                "target_fraction": target,
                "met": frac >= target,
                "config": best["params"],
                "uri": best["uri"],
                "registers": best["registers"],
                "smem_bytes": best["smem_bytes"],
                "study": summary["study"],
                "trials": summary["trials"],
                "measured": summary["measured_this_run"],
                "failures": summary["failures_this_run"],
                "study_wall_s": round(study_s, 1),
            }
        )
        print(
            f"{kernel:16s} {problem_name:12s} {'tuner':28s} {best['tbps']:.3f} TB/s {frac:.3f}x ceiling "
            f"{best['tbps'] / copy_tbps:.3f}x same-bytes copy (target {target}) {best['uri']} "
            f"[{summary['trials']} trials, {study_s:.0f} s, failures {summary['failures_this_run']}]",
            flush=True,
        )
        print(
            f"{kernel:16s} {problem_name:12s} {'cudaMemcpy same bytes':28s} {copy_tbps:.3f} TB/s; 2 GiB ceiling "
            f"{ceiling:.3f}",
            flush=True,
        )

        if args.probe and kernel == "decode_attention":
            records += probe_attention(space, problem, ev, base, copy_tbps, best)

        torch_stream = torch.cuda.ExternalStream(ev.device.stream.ptr)
        with torch.cuda.stream(torch_stream):
            peers = attention_peers(problem, torch) if kernel == "decode_attention" else adamw_peers(problem, torch)
        timed = []
        for impl, fn, why_not in peers:
            if fn is None:
                records.append({**base, "impl": impl, "TBps": None, "median_ms": None, "note": why_not})
                print(f"{kernel:16s} {problem_name:12s} {impl:28s} n/a ({why_not})", flush=True)
                continue

            def run(fn=fn, torch_stream=torch_stream):
                with torch.cuda.stream(torch_stream):
                    fn()

            ms = benchmark(
                run, stream=ev.device.stream, budget_ms=200.0, flush=ev.device.flush, hold=ev.device.hold
            ).median_ms
            tbps = nbytes / ms / 1e9
            record = {
                **base,
                "impl": impl,
                "TBps": round(tbps, 4),
                "median_ms": ms,
                "fraction_of_ceiling": round(tbps / ceiling, 4),
                "tuner_speedup": round(ms / best["median_ms"], 3) if best.get("median_ms") else None,
            }
            if kernel == "adamw":
                record["own_bytes_TBps"] = round(nbytes / 26 * 28 / ms / 1e9, 4)  # fp32 gradients
            records.append(record)
            timed.append((ms, impl))
            print(
                f"{kernel:16s} {problem_name:12s} {impl:28s} {tbps:.3f} TB/s {tbps / ceiling:.3f}x ceiling "
                f"({ms:.4f} ms; tuner {record['tuner_speedup']}x faster)",
                flush=True,
            )
        if timed and kernel == "decode_attention":
            fastest = min((t for t in timed if t[1].startswith("sdpa")), default=None)
            if fastest:
                for r in records:
                    if r["kernel"] == kernel and r["shape"] == shape and r["impl"] == fastest[1]:
                        r["fastest_sdpa_backend"] = True
        del peers
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        (out / f"{stem}.json").write_text(json.dumps(records, indent=1, default=str) + "\n")

    lines = [
        f"# Decode attention and fused AdamW on {records[0]['gpu'] if records else '?'}, {date}",
        "",
        f"Command: `{command}`. TB/s count each family's minimal bytes (attention: K + V + q + out; AdamW: "
        "26 B per parameter); ceiling = 2 GiB cudaMemcpy D2D measured by the study's worker; same-bytes copy = "
        "a D2D copy moving the problem's bytes, this run. torch's AdamW reads fp32 gradients (28 B per "
        "parameter): its TB/s on its own bytes is in the JSON (own_bytes_TBps).",
        "",
        "| kernel | problem | impl | TB/s | × ceiling | × same-bytes copy | ms | tuner faster by | config |",
        "|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in records:
        if r["TBps"] is None:
            lines.append(f"| {r['kernel']} | {r['shape']} | {r['impl']} | n/a | | | | | {r.get('note', '')} |")
            continue
        mark = " (fastest SDPA)" if r.get("fastest_sdpa_backend") else ""
        lines.append(
            f"| {r['kernel']} | {r['shape']} | {r['impl']}{mark} | {r['TBps']:.3f} | "
            f"{r['TBps'] / r['ceiling_TBps']:.3f} | {r['TBps'] / r['same_bytes_copy_TBps']:.3f} | "
            f"{r['median_ms']:.4f} | {r.get('tuner_speedup') or ''} | {r.get('uri', '')} |"
        )
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    if not args.keep_artifacts:
        # one source and one PTX file per measured trial: thousands of small files nobody reads from a results folder
        shutil.rmtree(artifact_dir_for(f"sqlite:///{out}/{stem}.db"), ignore_errors=True)
    print("\n".join(lines))
    print(f"total {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
