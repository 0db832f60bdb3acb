"""Our samplers beside Kernel Tuner's strategies on Kernel Tuner caches: who finds the fastest config soonest.

For every cache given, replays our study driver (`search.one_run`: the imported space, the replay pool, each
sampler × seed × configs in flight) and Kernel Tuner's strategies in its simulation mode (`tune_kernel(...,
simulation_mode=True)`, ``max_fevals`` = the largest budget, each strategy's default options) over the same
configs: the cache's configs that are not InvalidConfig, compile and runtime failures included (they cost time on
a GPU, so they count as evaluations; Kernel Tuner's own `tune_cache` would leave them out of its search space).
Kernel Tuner's strategies ignore its ``seed`` option, so each run seeds `random` and `numpy.random` instead; a run
that passes --kt-timeout seconds (its bayes_opt can stall where many configs fail) is dropped and counted.

Fraction of the optimum = t_opt / best time after b distinct configs (0 before any config succeeded). Per method
and budget: the mean over the caches of the seeds' mean, the mean over the caches of the seeds' 10th percentile,
the mean rank over the caches (1 = best seeds' mean of all methods on that cache), and the caches where the
seeds' mean is below uniform random sampling (its exact expectation) by more than 2 standard errors.

    python benchmarks/search_kt.py ../shared/kt-caches/*.json.gz --samplers forest,tpe --seeds 5 \\
        --kt pso,firefly_algorithm,genetic_algorithm,dual_annealing --name kt-2026-12-06

Writes ``<name>.json`` (every run's curve) and ``<name>.md`` under --out (default benchmarks/results/search).
--kt-from JSON takes Kernel Tuner's runs (and those of any sampler not run now) from an earlier report instead of
running them again; the report says so.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import search as S  # noqa: E402

ROOT = S.ROOT
BUDGETS = (25, 50, 100, 200)
KT_STRATEGIES = (
    "pso",
    "firefly_algorithm",
    "genetic_algorithm",
    "dual_annealing",
    "simulated_annealing",
    "bayes_opt",
    "diff_evo",
    "random_sample",
    "greedy_mls",
    "greedy_ils",
    "mls",
)


# ---------------------------------------------------------------------------------------------------------------
# Kernel Tuner


def kt_sequence(job: dict[str, Any]) -> list[float | None]:
    """One Kernel Tuner strategy run in simulation mode: the time of each distinct config it evaluated, in order
    (None for a failed one)."""
    import random
    import warnings

    import numpy as np
    from constraint import FunctionConstraint
    from kernel_tuner import tune_kernel

    warnings.filterwarnings("ignore")
    random.seed(job["seed"])
    np.random.seed(job["seed"])
    raw = Path(job["cache"]).read_bytes()
    data = json.loads(gzip.decompress(raw) if job["cache"].endswith(".gz") else raw)
    keys = data["tune_params_keys"]
    valid = {
        tuple(entry[k] for k in keys)
        for entry in data["cache"].values()
        if not any(v == "InvalidConfig" for v in entry.values())
    }
    plain = Path(job["tmp"]) / (Path(job["cache"]).name.removesuffix(".gz"))
    if not plain.exists():  # written whole, then renamed: a run beside it may read it at any moment
        part = plain.with_name(f"{plain.name}.{os.getpid()}.part")
        part.write_bytes(gzip.decompress(raw) if job["cache"].endswith(".gz") else raw)
        os.replace(part, plain)
    problem = data["problem_size"]
    results, _ = tune_kernel(
        data["kernel_name"],
        "",
        tuple(problem) if isinstance(problem, list) else (problem,),
        [],
        data["tune_params"],
        restrictions=[FunctionConstraint(lambda *values: values in valid)],
        cache=str(plain),
        simulation_mode=True,
        strategy=job["strategy"],
        strategy_options={"max_fevals": job["budget"]},
        quiet=True,
        verbose=False,
    )
    seen: set[tuple[Any, ...]] = set()
    sequence: list[float | None] = []
    for result in results:
        config = tuple(result[k] for k in keys)
        if config in seen or config not in valid:
            continue
        seen.add(config)
        t = result.get("time")
        ok = "__error__" not in result and isinstance(t, int | float) and math.isfinite(t)
        sequence.append(float(t) if ok else None)
    return sequence[: job["budget"]]


def _kt_child(job: dict[str, Any], queue) -> None:
    try:
        queue.put(("ok", kt_sequence(job)))
    except Exception as exc:  # reported as the run's failure, the others go on
        queue.put(("error", f"{type(exc).__name__}: {exc}"))


def kt_run(job: dict[str, Any]) -> dict[str, Any]:
    """`kt_sequence` in a child process, killed after job["timeout"] seconds."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_kt_child, args=(job, queue))
    started = time.perf_counter()
    child.start()
    try:
        status, payload = queue.get(timeout=job["timeout"])
    except Exception:  # queue.Empty: the run stalled
        status, payload = "timeout", f"no result within {job['timeout']} s"
    child.join(timeout=5)
    if child.is_alive():
        child.kill()
        child.join()
    out = {k: job[k] for k in ("space_name", "strategy", "seed")}
    out["wall_s"] = round(time.perf_counter() - started, 1)
    if status == "ok":
        out["sequence"] = payload
    else:
        out["error"] = payload
    return out


# ---------------------------------------------------------------------------------------------------------------
# figures


def fractions(sequence: list[float | None], t_opt: float, budgets: list[int]) -> list[float]:
    """Fraction of the optimum after each budget of distinct configs (a run that stopped early keeps its best)."""
    out, best = [], math.inf
    bests = []
    for t in sequence:
        if t is not None:
            best = min(best, t)
        bests.append(t_opt / best if math.isfinite(best) else 0.0)
    for b in budgets:
        out.append(bests[min(b, len(bests)) - 1] if bests else 0.0)
    return out


def table(report: dict[str, Any]) -> dict[str, Any]:
    """Per method and budget: mean, p10, mean rank over caches, caches below random (2 standard errors)."""
    import numpy as np

    budgets = report["budgets"]
    spaces = report["spaces"]
    methods = sorted({m for sp in spaces.values() for m in sp["runs"]}, key=lambda m: (m.startswith("KT "), m))
    rows: dict[str, Any] = {}
    cell_means: dict[str, dict[str, list[float]]] = {}
    for name, sp in spaces.items():
        cell_means[name] = {}
        for m in methods:
            runs = sp["runs"].get(m)
            if not runs:
                continue
            arr = np.array([r["fractions"] for r in runs])
            cell_means[name][m] = arr.mean(axis=0).tolist()
    for m in methods:
        entry: dict[str, Any] = {"mean": [], "p10": [], "rank": [], "below_random": [], "caches": 0}
        for i, _ in enumerate(budgets):
            means, p10s, ranks, below = [], [], [], []
            for name, sp in spaces.items():
                runs = sp["runs"].get(m)
                if not runs:
                    continue
                values = np.array([r["fractions"][i] for r in runs])
                means.append(values.mean())
                p10s.append(np.percentile(values, 10))
                others = [cell_means[name][o][i] for o in cell_means[name]]
                ranks.append(1 + sum(o > values.mean() + 1e-12 for o in others))
                se = values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else 0.0
                if values.mean() < sp["uniform"][i] - 2 * se - 1e-12:
                    below.append(name)
            entry["mean"].append(round(float(np.mean(means)), 4))
            entry["p10"].append(round(float(np.mean(p10s)), 4))
            entry["rank"].append(round(float(np.mean(ranks)), 2))
            entry["below_random"].append(below)
            entry["caches"] = len(means)
        rows[m] = entry
    uniform = [round(float(np.mean([sp["uniform"][i] for sp in spaces.values()])), 4) for i in range(len(budgets))]
    return {"methods": rows, "uniform": uniform}


def markdown(report: dict[str, Any]) -> str:
    t = report["table"]
    budgets = report["budgets"]
    against = (
        "against Kernel Tuner's strategies" if any(m.startswith("KT ") for m in t["methods"]) else "on recorded spaces"
    )
    lines = [
        f"# Search {against} ({report['date']}, {report['machine']})",
        "",
        f"    {report['command']}",
        "",
        f"{len(report['spaces'])} caches: {', '.join(report['spaces'])}. {report['note']}",
        "",
        "Cells: mean over the caches of the seeds' mean fraction of the optimum (t_opt / best after that many "
        "distinct configs, failures counted) / mean of the seeds' 10th percentile / mean rank per cache; "
        "*below random*: caches whose seeds' mean is below uniform random by more than 2 standard errors.",
        "",
        "| method | " + " | ".join(map(str, budgets)) + " | below random |",
        "|---|" + "---|" * (len(budgets) + 1),
    ]
    for m, e in t["methods"].items():
        cells = " | ".join(f"{e['mean'][i]:.3f} / {e['p10'][i]:.3f} / {e['rank'][i]:.1f}" for i in range(len(budgets)))
        below = sorted({c for b in e["below_random"] for c in b})
        lines.append(f"| {m} ({e['caches']} caches) | {cells} | {', '.join(below) or 'none'} |")
    lines.append("| uniform random (exact) | " + " | ".join(f"{v:.3f}" for v in t["uniform"]) + " | |")
    lines += ["", "Per cache, seeds' mean at each budget:", ""]
    for name, sp in report["spaces"].items():
        lines += [f"### {name} ({sp['valid']} configs, {sp['failed']} failing)", ""]
        lines += ["| method | " + " | ".join(map(str, budgets)) + " |", "|---|" + "---|" * len(budgets)]
        for m, runs in sp["runs"].items():
            if runs:
                cells = " | ".join(
                    f"{sum(r['fractions'][i] for r in runs) / len(runs):.3f}" for i in range(len(budgets))
                )
                lines.append(f"| {m} ({len(runs)} runs) | {cells} |")
        lines.append("| uniform random (exact) | " + " | ".join(f"{v:.3f}" for v in sp["uniform"]) + " |")
        if sp.get("sampler_ms"):
            lines.append("")
            lines.append(
                "Sampler ms per proposal (ask + tell; the runs' median of each run's median): "
                + ", ".join(f"{k} {v}" for k, v in sp["sampler_ms"].items())
            )
        if sp.get("dropped"):
            lines.append("")
            lines.append("Dropped Kernel Tuner runs: " + "; ".join(sp["dropped"]))
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("caches", nargs="+", help="Kernel Tuner caches (.json or .json.gz)")
    parser.add_argument("--samplers", default="forest", help="our samplers, comma-separated ('' for none)")
    parser.add_argument("--in-flight", default="1,8", help="configs in flight for ours, comma-separated")
    parser.add_argument("--kt", default=",".join(KT_STRATEGIES), help="Kernel Tuner strategies ('' for none)")
    parser.add_argument(
        "--kt-from", help="a report of this script whose runs to reuse: Kernel Tuner's, and those of samplers not run"
    )
    parser.add_argument("--kt-timeout", type=float, default=300.0, help="seconds before a KT run is dropped")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--name", default="kt")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "search"))
    args = parser.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    samplers = [s for s in args.samplers.split(",") if s]
    strategies = [s for s in args.kt.split(",") if s] if not args.kt_from else []
    earlier = json.loads(Path(args.kt_from).read_text()) if args.kt_from else None
    tmp = Path(tempfile.mkdtemp())
    report: dict[str, Any] = {
        "command": "python "
        + " ".join(
            [
                str(Path(sys.argv[0]).relative_to(ROOT)) if Path(sys.argv[0]).is_absolute() else sys.argv[0],
                *sys.argv[1:],
            ]
        ),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.node()}: {os.cpu_count()} CPUs, {platform.machine()}, "
        f"Python {platform.python_version()}",
        "budgets": budgets,
        "seeds": args.seeds,
        "note": "",
        "spaces": {},
    }
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    for cache in args.caches:
        name, recording, space_path = S.resolve(cache, tmp)
        truth = S.ground_truth(recording, space_path)
        t_opt = truth["t_opt_ms"]
        sp: dict[str, Any] = {
            "valid": truth["valid"],
            "failed": truth["valid"] - truth["measured"],
            "uniform": [round(S.uniform_expectation(truth["times"], b), 4) for b in budgets],
            "runs": {},
            "sampler_ms": {},
            "dropped": [],
        }
        started = time.perf_counter()
        jobs = [
            {
                "space_name": name,
                "kernel": truth["kernel"],
                "space": space_path,
                "recording": recording,
                "trials": max(budgets),
                "sampler": s,
                "seed": seed,
                "in_flight": k,
                "objectives": "first",
                "ordered": True,
            }
            for s in samplers
            for k in (int(x) for x in args.in_flight.split(","))
            for seed in range(args.seeds)
        ]
        with ProcessPoolExecutor(max_workers=args.jobs) as ex:
            for run in ex.map(S.one_run, jobs):
                label = f"{run['sampler']} k={run['in_flight']}"
                seq = [
                    t if kind == "measured" else None for kind, t in run["sequence"] if kind in ("measured", "failed")
                ]
                sp["runs"].setdefault(label, []).append(
                    {
                        "seed": run["seed"],
                        "fractions": fractions(seq, t_opt, budgets),
                        "sampler_ms": run["sampler_ms"],
                        "sampler_ms_median": run["sampler_ms_median"],
                    }
                )
        for label, runs in sp["runs"].items():
            ms = sorted(r["sampler_ms_median"] for r in runs if r.get("sampler_ms_median") is not None)
            sp["sampler_ms"][label] = ms[len(ms) // 2] if ms else None
        if earlier is not None:
            for label, runs in earlier["spaces"].get(name, {}).get("runs", {}).items():
                if label not in sp["runs"]:  # Kernel Tuner's, and ours of a sampler not run now (the previous default)
                    sp["runs"][label] = runs
            sp["dropped"] = [d for d in earlier["spaces"].get(name, {}).get("dropped", [])]
        kt_jobs = [
            {
                "space_name": name,
                "cache": recording,
                "strategy": s,
                "seed": seed,
                "budget": max(budgets),
                "tmp": str(tmp),
                "timeout": args.kt_timeout,
            }
            for s in strategies
            for seed in range(args.seeds)
        ]
        with ThreadPoolExecutor(max_workers=args.jobs) as ex:
            for run in ex.map(kt_run, kt_jobs):
                label = f"KT {run['strategy']}"
                if "sequence" in run:
                    sp["runs"].setdefault(label, []).append(
                        {
                            "seed": run["seed"],
                            "fractions": fractions(run["sequence"], t_opt, budgets),
                            "distinct": len(run["sequence"]),
                            "wall_s": run["wall_s"],
                        }
                    )
                else:
                    sp["dropped"].append(f"{label} seed {run['seed']}: {run['error']}")
        report["spaces"][name] = sp
        print(f"{name}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
        for label, runs in sp["runs"].items():
            means = [sum(r["fractions"][i] for r in runs) / len(runs) for i in range(len(budgets))]
            print(f"  {label:28}" + "".join(f"{v:8.3f}" for v in means), file=sys.stderr)
        print(f"  {'uniform':28}" + "".join(f"{v:8.3f}" for v in sp["uniform"]), file=sys.stderr)
    if earlier is not None:
        report["note"] = (
            f"Kernel Tuner's runs, and those of samplers not run by this command, taken from {args.kt_from} "
            f"(`{earlier['command']}`, {earlier['date']}, {earlier['machine']})."
        )
    elif strategies:
        report["note"] = f"Kernel Tuner {_kt_version()} strategies run here: {', '.join(strategies)}."
    report["table"] = table(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    (out / f"{args.name}.md").write_text(markdown(report))
    print(markdown(report).split("Per cache")[0])
    print(f"wrote {out / args.name}.json and .md")
    return 0


def _kt_version() -> str:
    try:
        from importlib.metadata import version

        return version("kernel_tuner")
    except Exception:  # not installed: no strategy runs either
        return "(not installed)"


if __name__ == "__main__":
    sys.exit(main())
