"""How fast each sampler finds the best config of a recorded space: the study driver itself, replayed.

For every recorded space (a brute-force study database, ``.db`` or ``.db.gz``, or a Kernel Tuner cache) and
every sampler × seed × configs in flight, runs `tuner.study.driver.Driver` in this process with an in-process replay
pool (`tuner.study.replay.ReplayPool`: no Ray, no GPU; the same ask → evaluate → tell code as a GPU study) and reads the
trial sequence back from its storage. Reports per space and setting:

- fraction of optimum (t_opt / t_best so far; failures count as never best) at each budget, mean and 10th
  percentile over seeds, counted by evaluated (unique) configs and by proposals (every trial, including those
  answered without evaluation);
- proposals that broke a constraint, repeated an evaluated config, or repeated a known failure, per evaluated
  config;
- evaluated configs to reach 0.95 / 0.98 / 1.0 of the optimum (mean over the seeds that reached it, and how many);
- sampler milliseconds per proposal (ask + tell);
- the exact expected fraction of uniform random sampling without replacement over the valid set (the baseline).

Writes ``search.json`` and one convergence plot per space under --out (default $OUT or benchmarks/results/search).

    python benchmarks/search.py tests/data/transpose_h200.db=search_spaces/transpose.yaml --seeds 20
    python benchmarks/search.py benchmarks/data/*.db.gz --seeds 20 --jobs 16      # spaces from the manifest
    python benchmarks/search.py cache.json.gz --seeds 20                          # a Kernel Tuner cache

The searched space is the recorded subset of the space (`tuner.study.replay.recorded_subspace`): for a recording that
covers part of its space, a config it lacks is invalid to the search and never counted, and the optimum and the
uniform baseline are the subset's; the report says per space whether the recording was complete.

A recording is ``PATH=SPACE``, or a PATH whose space a manifest.json beside it (or benchmarks/data/manifest.json)
names, or a
Kernel Tuner cache (its space is made with `tuner.store.kt.write_space`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUDGETS = (25, 50, 100, 200, 400, 800)
THRESHOLDS = (0.95, 0.98, 1.0)
DEFAULT_SAMPLERS = ("tpe", "random", "nsga2", "gp", "cmaes")
MANIFEST = ROOT / "benchmarks" / "data" / "manifest.json"


# ---------------------------------------------------------------------------------------------------------------
# one space


def resolve(item: str, tmp: Path) -> tuple[str, str, str]:
    """(name, recording path, space path) of one command-line item."""
    from tuner.store import kt

    path, sep, space = item.partition("=")
    name = Path(path).name.split(".")[0]
    if sep:
        return name, path, space
    if kt.is_cache_path(path):
        out = tmp / f"{name}.yaml"
        kt.write_space(kt.read_cache(path), path, out)  # a large cache's configs go to a file beside it
        return name, path, str(out)
    for manifest_path in (Path(path).with_name("manifest.json"), MANIFEST):  # beside the recording, or ours
        if manifest_path.exists():
            entry = json.loads(manifest_path.read_text()).get(Path(path).name)
            if entry:
                return name, path, str(ROOT / entry["space"])
    raise SystemExit(f"search.py: {path}: no space given (use PATH=SPACE) and none in {MANIFEST}")


def ground_truth(record_path: str, space_path: str) -> dict[str, Any]:
    """Times of the configs searched (inf for failures), sorted. The searched space is the recorded subset of the
    space (`tuner.study.replay.recorded_subspace`): for a partial recording, the configs it lacks are neither proposed
    as valid nor counted, and the optimum and the uniform baseline are those of the recorded configs."""
    from tuner.space import space as space_mod
    from tuner.space.space import params_key
    from tuner.study.replay import load_records, recorded_subspace

    space = space_mod.load(space_path)
    records = load_records(record_path)
    subspace = recorded_subspace(space, records, space.problem())
    times = []
    for config in subspace.enumerate():
        state, attrs = records[params_key(config)]
        times.append(float(attrs["median_ms"]) if state == "COMPLETE" else math.inf)
    times.sort()
    if not math.isfinite(times[0]):
        raise SystemExit(f"search.py: {record_path}: no valid config of {space_path} was measured")
    space_valid = space.count_valid()
    state, attrs = records[params_key(subspace.default)]
    default_fraction = times[0] / float(attrs["median_ms"]) if state == "COMPLETE" else 0.0
    return {
        "kernel": space.kernel,
        "valid": len(times),
        "measured": sum(map(math.isfinite, times)),
        "space_valid": space_valid,
        "complete": len(times) == space_valid,
        "default_fraction": round(default_fraction, 4),
        "t_opt_ms": times[0],
        "times": times,
    }


def uniform_expectation(times: list[float], n: int) -> float:
    """E[t_opt / t_best] after n uniform draws without replacement from the valid set (exact): the best of the
    draws is the k-th fastest with probability C(N-k, n-1) / C(N, n)."""
    big_n = len(times)
    n = min(n, big_n)
    total = 0.0
    log_denominator = math.lgamma(big_n + 1) - math.lgamma(n + 1) - math.lgamma(big_n - n + 1)
    for k in range(1, big_n - n + 2):
        t = times[k - 1]
        if not math.isfinite(t):
            break
        m = big_n - k
        log_p = math.lgamma(m + 1) - math.lgamma(n) - math.lgamma(m - n + 2) - log_denominator
        total += math.exp(log_p) * times[0] / t
    return total


def one_run(job: dict[str, Any]) -> dict[str, Any]:
    """One replayed study; returns its trial sequence as (kind, time) pairs and the sampler's cost."""
    import optuna

    from tuner.study.driver import Driver
    from tuner.study.options import StudyOptions

    opts = StudyOptions(
        kernel=job["kernel"],
        space=job["space"],
        trials=job["trials"],
        storage=":memory:",
        sampler=job["sampler"],
        seed=job["seed"],
        replay=job["recording"],
        in_process=True,
        replay_in_flight=job["in_flight"],
        replay_recorded_only=True,
        progress=False,
        objectives=job["objectives"],
        ordered=job["ordered"],
    )
    started = time.perf_counter()
    driver = Driver(opts)
    asks: list[float] = []
    tells: list[float] = []
    ask, tell = optuna.study.Study.ask, driver._tell_sampler

    def timed_ask(study, *args, **kwargs):  # the driver asks only its in-memory study
        t0 = time.perf_counter()
        out = ask(study, *args, **kwargs)
        asks.append(time.perf_counter() - t0)
        return out

    def timed_tell(*args, **kwargs):
        t0 = time.perf_counter()
        out = tell(*args, **kwargs)
        tells.append(time.perf_counter() - t0)
        return out

    optuna.study.Study.ask = timed_ask  # type: ignore[method-assign]
    driver._tell_sampler = timed_tell  # type: ignore[method-assign]
    try:
        summary = driver.run()
    finally:
        optuna.study.Study.ask = ask  # type: ignore[method-assign]
    per_proposal = sorted(a + t for a, t in zip(asks, tells, strict=False))
    study = optuna.load_study(study_name=summary["study"], storage=driver.opening.storage)
    sequence = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        attrs = t.user_attrs
        if "screened" in attrs:
            sequence.append((attrs["screened"], None))
        elif t.state.name == "COMPLETE":
            sequence.append(("measured", float(attrs["median_ms"])))
        else:
            sequence.append(("failed", None))
    return {
        **{k: job[k] for k in ("space_name", "sampler", "seed", "in_flight", "objectives", "ordered")},
        "sequence": sequence,
        "sampler_ms": summary["sampler_ms_per_proposal"],
        "sampler_ms_median": round(1000 * per_proposal[len(per_proposal) // 2], 3) if per_proposal else None,
        "wall_s": round(time.perf_counter() - started, 2),
    }


# ---------------------------------------------------------------------------------------------------------------
# figures


def curves(sequence: list[tuple[str, float | None]], t_opt: float) -> tuple[list[float], list[float]]:
    """Best fraction of optimum after each evaluated config, and after each proposal."""
    by_config, by_proposal, best = [], [], math.inf
    for kind, t in sequence:
        if kind in ("measured", "failed"):
            if t is not None:
                best = min(best, t)
            by_config.append(t_opt / best if math.isfinite(best) else 0.0)
        by_proposal.append(t_opt / best if math.isfinite(best) else 0.0)
    return by_config, by_proposal


def at(curve: list[float], n: int) -> float:
    return curve[min(n, len(curve)) - 1] if curve else 0.0


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(values, q)) if values else math.nan


def summarize(runs: list[dict[str, Any]], truth: dict[str, Any], budgets: list[int]) -> dict[str, Any]:
    t_opt = truth["t_opt_ms"]
    per_config, per_proposal = [], []
    bad = {"invalid": 0, "duplicate": 0, "known_failure": 0}
    evaluated = 0
    # Bad proposals while the search is young: once most of a small space is evaluated, nearly every proposal
    # repeats one, which says little about the sampler.
    early, early_bad, early_evaluated = min(100, truth["valid"] // 4), 0, 0
    reach: dict[float, list[int]] = {th: [] for th in THRESHOLDS}
    for run in runs:
        c, p = curves(run["sequence"], t_opt)
        per_config.append(c)
        per_proposal.append(p)
        evaluated += len(c)
        seen = 0
        for kind, _ in run["sequence"]:
            if kind in bad:
                bad[kind] += 1
                early_bad += seen < early
            else:
                seen += 1
        early_evaluated += min(seen, early)
        for th in THRESHOLDS:
            hit = next((i + 1 for i, f in enumerate(c) if f >= th - 1e-12), None)
            if hit is not None:
                reach[th].append(hit)
    out: dict[str, Any] = {"runs": len(runs), "by_config": {}, "by_proposal": {}}
    for n in budgets:
        for label, group in (("by_config", per_config), ("by_proposal", per_proposal)):
            values = [at(c, n) for c in group]
            out[label][n] = {"mean": round(sum(values) / len(values), 4), "p10": round(percentile(values, 10), 4)}
    out["bad_proposals_per_evaluated"] = {k: round(v / max(evaluated, 1), 4) for k, v in bad.items()}
    out["bad_proposals_total_fraction"] = round(sum(bad.values()) / max(evaluated, 1), 4)
    out["bad_proposals_early"] = {
        "first_evaluated": early,
        "per_evaluated": round(early_bad / max(early_evaluated, 1), 4),
    }
    out["evaluations_to_reach"] = {
        str(th): {"mean": round(sum(v) / len(v), 1) if v else None, "reached": f"{len(v)}/{len(runs)}"}
        for th, v in reach.items()
    }
    ms = [r["sampler_ms"] for r in runs if r["sampler_ms"] is not None]
    out["sampler_ms_per_proposal"] = round(sum(ms) / len(ms), 3) if ms else None
    out["mean_curve_by_config"] = [
        round(sum(at(c, n) for c in per_config) / len(per_config), 4) for n in range(1, max(budgets) + 1)
    ]
    return out


def plot(space_name: str, truth: dict[str, Any], results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    n_max = max(len(r["mean_curve_by_config"]) for r in results.values())
    xs = list(range(1, n_max + 1))
    ax.plot(xs, [uniform_expectation(truth["times"], n) for n in xs], "k--", label="uniform random (exact)")
    for label, r in results.items():
        ax.plot(range(1, len(r["mean_curve_by_config"]) + 1), r["mean_curve_by_config"], label=label)
    ax.set_xscale("log")
    ax.set_xlabel("configs evaluated")
    ax.set_ylabel("mean fraction of optimum (t_opt / t_best)")
    ax.set_ylim(max(0.0, min(min(r["mean_curve_by_config"][:1] or [0]) for r in results.values()) - 0.05), 1.005)
    ax.axhline(0.98, color="grey", lw=0.5)
    ax.set_title(
        f"{space_name}: {truth['valid']} valid configs"
        if truth["complete"]
        else f"{space_name}: the {truth['valid']} recorded of {truth['space_valid']} valid configs"
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(report: dict[str, Any]) -> str:
    """The report as Markdown tables: per space, mean / 10th percentile fraction of optimum by evaluated configs
    at each budget, proposals screened per evaluated config, evaluations to reach 0.98, sampler ms."""
    lines = [
        f"# Search replayed over recorded spaces ({report['date']})",
        "",
        f"    {report['command']}",
        "",
        "Cells: mean / 10th percentile of the fraction of optimum (t_opt / t_best) after that many evaluated "
        "(unique, valid) configs. *Screened*: proposals answered without an evaluation (invalid, duplicate, "
        "known failure) per evaluated config; they cost sampler time, not GPU time. *to .98*: evaluated "
        "configs to reach 0.98 (mean over the runs that reached it; reached/runs).",
        "",
    ]
    for name, sp in report["spaces"].items():
        budgets = list(sp["uniform_random_expected"])
        lines += [
            f"## {name}",
            "",
            f"{sp['valid']} configs searched: {sp['searched']}. Optimum "
            f"{sp['t_opt_ms']:.4g} ms; the space's default (measured first) alone reaches "
            f"{sp['default_fraction']:.3f}.",
            "",
            "| sampler | " + " | ".join(map(str, budgets)) + " | screened | to .98 | ms/proposal |",
            "|---|" + "---|" * (len(budgets) + 3),
            "| uniform random (exact) | "
            + " | ".join(f"{v:.3f}" for v in sp["uniform_random_expected"].values())
            + " | | | |",
        ]
        for label, r in sp["results"].items():
            cells = " | ".join(
                f"{r['by_config'][n]['mean']:.3f} / {r['by_config'][n]['p10']:.3f}" for n in r["by_config"]
            )
            reach = r["evaluations_to_reach"]["0.98"]
            lines.append(
                f"| {label} ({r['runs']} runs) | {cells} | {r['bad_proposals_total_fraction']:.2f} | "
                f"{reach['mean']} ({reach['reached']}) | {r['sampler_ms_per_proposal']} |"
            )
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recordings", nargs="+", help="PATH=SPACE, a manifest-listed PATH, or a KT cache")
    parser.add_argument("--samplers", default=",".join(DEFAULT_SAMPLERS))
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--in-flight", default="1,8", help="configs in flight, comma-separated (default 1,8)")
    parser.add_argument("--objectives", default="first", help="first, all, or both (comma-separated)")
    parser.add_argument("--ordered", default="yes", help="yes, no, or yes,no (ordered vs categorical params)")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--name", default="search", help="stem of the JSON, Markdown and plot files")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results" / "search"))
    args = parser.parse_args(argv)

    samplers = [s for s in args.samplers.split(",") if s]
    usable = []
    for sampler in samplers:  # a sampler whose packages are missing here is reported and skipped
        try:
            from tuner.study.search import make_sampler

            make_sampler(sampler, 0, 1)
            usable.append(sampler)
        except Exception as exc:  # InputError naming the missing package
            print(f"skip {sampler}: {exc}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp())
    report: dict[str, Any] = {"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "spaces": {}}
    for item in args.recordings:
        space_name, recording, space_path = resolve(item, tmp)
        truth = ground_truth(recording, space_path)
        budgets = sorted({min(int(b), truth["valid"]) for b in args.budgets.split(",")})
        jobs = [
            {
                "space_name": space_name,
                "kernel": truth["kernel"],
                "space": space_path,
                "recording": recording,
                "trials": budgets[-1],
                "sampler": s,
                "seed": seed,
                "in_flight": int(k),
                "objectives": o,
                "ordered": ordered == "yes",
            }
            for s in usable
            for seed in range(args.seeds)
            for k in args.in_flight.split(",")
            for o in (args.objectives.split(",") if args.objectives != "both" else ["first", "all"])
            for ordered in args.ordered.split(",")
        ]
        started = time.perf_counter()
        with ProcessPoolExecutor(max_workers=args.jobs) as ex:
            runs = list(ex.map(one_run, jobs))
        groups: dict[str, list[dict[str, Any]]] = {}
        for run in runs:
            label = (
                f"{run['sampler']} k={run['in_flight']}"
                + ("" if run["objectives"] == "first" else " multi")
                + ("" if run["ordered"] else " categorical")
            )
            groups.setdefault(label, []).append(run)
        results = {label: summarize(rs, truth, budgets) for label, rs in groups.items()}
        uniform = {n: round(uniform_expectation(truth["times"], n), 4) for n in budgets}
        report["spaces"][space_name] = {
            "recording": recording,
            "space": space_path,
            "valid": truth["valid"],
            "measured": truth["measured"],
            "space_valid": truth["space_valid"],
            "complete": truth["complete"],
            "searched": "the whole valid set"
            if truth["complete"]
            else f"the recorded subset ({truth['valid']} of {truth['space_valid']} valid configs): "
            "a config the recording lacks is invalid to the search and never counted; "
            "optimum and uniform baseline are the subset's",
            "t_opt_ms": truth["t_opt_ms"],
            "default_fraction": truth["default_fraction"],
            "uniform_random_expected": uniform,
            "results": results,
            "seconds": round(time.perf_counter() - started, 1),
        }
        plot(space_name, truth, results, out / f"{args.name}_{space_name}.png")
        of = "" if truth["complete"] else f" (recorded subset of {truth['space_valid']})"
        print(
            f"\n{space_name}: {truth['valid']} valid{of}, optimum {truth['t_opt_ms']:.4g} ms "
            f"({time.perf_counter() - started:.0f} s)"
        )
        head = "".join(f"{n:>13}" for n in budgets)
        print(f"{'':24}{head}   bad/eval (early)  ms/prop  to .98")
        print(f"{'default alone':24}{truth['default_fraction']:>13.3f}")
        print(f"{'uniform (exact)':24}" + "".join(f"{uniform[n]:>13.3f}" for n in budgets))
        for label, r in results.items():
            cells = "".join(f"{r['by_config'][n]['mean']:>7.3f}/{r['by_config'][n]['p10']:.2f}" for n in budgets)
            print(
                f"{label:24}{cells}   {r['bad_proposals_total_fraction']:>7.3f} "
                f"({r['bad_proposals_early']['per_evaluated']:.3f})  {r['sampler_ms_per_proposal']!s:>7}"
                f"  {r['evaluations_to_reach']['0.98']['mean']}"
            )
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    (out / f"{args.name}.md").write_text(markdown(report))
    print(f"\nwrote {out / args.name}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
