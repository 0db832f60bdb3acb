"""How close a cut-short screening figure is to a full one: the 3-repetition estimate vs the full budget.

    python benchmarks/screen_fidelity.py [--space gemm] [--configs 40] [--seed 0] [--out $OUT]
    python benchmarks/screen_fidelity.py --short-ms 10 [--space transpose] ...   # a shorter screening budget
    python benchmarks/screen_fidelity.py --dry-run      # no GPU: draw and compile the configs

A study stops timing a config after its 3-repetition estimate when that is over `StudyOptions.screen_cutoff` × the
best median so far (`tuner.gpu.timing.benchmark`). This draws `--configs` valid configs of the space uniformly (seeded)
and evaluates each twice in one isolated GPU worker, with the study's protocol: once cut short (``cutoff_ms=0``:
the 3-repetition estimate is the result) and once with the full screening budget (25 ms, ≥ 10 repetitions).
Writes ``screen_fidelity-<space>-<date>.json`` under --out and prints the ratio of the two medians (estimate /
full): its median, 10th and 90th percentile and worst. With ``--short-ms X`` the short evaluation is a whole
screening of X ms of timed work (at least 10 repetitions, no cut-off) instead of the 3-repetition estimate: how
far a study screening with ``--screen-ms X`` is from one screening with the default 25 ms; the summary also says
whether the two agree on the fastest config and on the fastest five.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--space", default="gemm", help="a shipped space's name or a YAML path")
    ap.add_argument("--configs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--short-ms", type=float, help="screen with this budget instead of the 3-repetition estimate")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)

    import numpy as np

    from tuner.build.compile import compile_source
    from tuner.build.render import render
    from tuner.gpu.evaluate import evaluate_config
    from tuner.space.space import load
    from tuner.study.validset import valid_index

    space = load(args.space)
    problem = space.problem()
    index = valid_index(space, problem)
    rng = np.random.default_rng(args.seed)
    picks = rng.choice(len(index), size=min(args.configs, len(index)), replace=False)
    configs = [index.config(int(i)) for i in picks]
    if args.dry_run:
        for c in configs:
            compiled = compile_source(render(space.family, c, space.resolve(c, problem), problem.env), "sm_90")
            print(("ok " if compiled.ok else "FAILED ") + str(c))
        return 0

    from tuner.gpu.worker import IsolatedEvaluator

    rows = []
    with IsolatedEvaluator(gpu=0, timeout_s=60.0) as evaluator:
        gpu = evaluator.start()["gpu"]  # the worker's GPU, named by the worker (started once; later calls reuse it)
        for c in configs:
            if args.short_ms is None:
                short = evaluate_config(space, c, problem, evaluator=evaluator, cutoff_ms=0.0)
            else:
                short = evaluate_config(space, c, problem, evaluator=evaluator, budget_ms=args.short_ms)
            full = evaluate_config(space, c, problem, evaluator=evaluator)
            row = {"params": c, "ok": bool(short.ok and full.ok)}
            if row["ok"]:
                row.update(
                    short_ms=short.median_ms,
                    short_reps=short.repetitions,
                    full_ms=full.median_ms,
                    full_reps=full.repetitions,
                    ratio=short.median_ms / full.median_ms,
                )
            else:
                row["failure"] = next(r.reason for r in (short, full) if not r.ok)
            rows.append(row)
            print(f"{row.get('ratio', float('nan')):.4f}  {row.get('full_ms', float('nan')):8.3f} ms  {c}", flush=True)

    ratios = np.array([r["ratio"] for r in rows if r["ok"]])
    summary = {
        "space": args.space,
        "problem": problem.name,
        "configs": len(rows),
        "measured": int(ratios.size),
        "ratio_median": float(np.median(ratios)) if ratios.size else None,
        "ratio_p10": float(np.percentile(ratios, 10)) if ratios.size else None,
        "ratio_p90": float(np.percentile(ratios, 90)) if ratios.size else None,
        "worst_abs_deviation": float(np.max(np.abs(ratios - 1))) if ratios.size else None,
        "short": "3-repetition estimate" if args.short_ms is None else f"{args.short_ms:g} ms screening",
        "all_short_reps_3": all(r.get("short_reps") == 3 for r in rows if r["ok"]),
        "short_reps_min": min((r["short_reps"] for r in rows if r["ok"]), default=None),
    }
    ok = [r for r in rows if r["ok"]]
    if ok:
        by_short = sorted(range(len(ok)), key=lambda i: ok[i]["short_ms"])
        by_full = sorted(range(len(ok)), key=lambda i: ok[i]["full_ms"])
        best_full = ok[by_full[0]]["full_ms"]
        summary["same_fastest"] = by_short[0] == by_full[0]
        # what picking by the short figure costs: the full time of the short figure's fastest over the true fastest
        summary["short_pick_full_ratio"] = ok[by_short[0]]["full_ms"] / best_full
        summary["top5_overlap"] = len(set(by_short[:5]) & set(by_full[:5]))
    date = dt.date.today().isoformat()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tag = "" if args.short_ms is None else f"-{args.short_ms:g}ms"
    path = out / f"screen_fidelity-{Path(args.space).stem}{tag}-{date}.json"
    command = "python benchmarks/screen_fidelity.py " + " ".join(argv if argv is not None else sys.argv[1:])
    path.write_text(json.dumps({"command": command, "date": date, "gpu": gpu, **summary, "rows": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
