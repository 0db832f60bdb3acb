"""Every shape in one command: ``tuner study gemv --problems all`` (transfer between shapes) against the same
problems tuned one command at a time.

    python benchmarks/shapes.py --gpu [--trials 30] [--out DIR]        # on a GPU: the shipped GEMV space
    python benchmarks/shapes.py --gpu --kernel decode_attention        # ... or another shipped space's problems
    python benchmarks/shapes.py --replay [--trials 30] [--seeds 20] [--in-flight 19]  # on CPU: the GEMV ladder

``--gpu`` runs, on this machine's GPUs and from cold caches (a fresh cache folder per command): (1) ``tuner study
gemv --problems all --trials T`` over the shipped space's 11 problems (GEMV at M = 1 … 64 on N = K = 8192 and the
four Llama-70B projections), the studies side by side over one pool ("transfer"); (1b) the same with
``--one-at-a-time`` ("one_at_a_time"); (1c) the same as (1) with ``--trials 3T`` ("transfer_3x"); (2) the same
problems one command each, ``--problem P --trials T``; (3) the same with ``--trials 3T``. Each command's whole
wall is what a user waits, start-up included. Per problem it records the best throughput of each run, the best
known (the best of these runs and of the recorded studies listed in ``BEST_KNOWN_RESULTS``), the trial at which
each run first reached 0.99 of it, and ``trials_ratio_to_0.99``: the trials (1c) took to reach 0.99 of the best
known over the trials (3) took (the quality target: at most 1/3). The record (benchmarks/results/shapes-DATE.json)
carries ``gpu``, ``problems``, ``wall_ratio_vs_independent`` (the one command's wall over the sum of the
independent commands' at the same trials per problem), ``wall_ratio_3x_vs_independent_3x`` (the same for (1c) and
(3)), ``min_fraction_of_best_known`` (the worst problem's best over its best known) and
``max_trials_ratio_to_0.99`` (the worst problem's ratio). For GEMV it then checks the header (`header_check`).
``--kernel decode_attention`` runs the same over that space's three batch x sequence shapes (best known: the best
of the runs; record shapes-decode_attention-DATE.json).

``--replay`` needs no GPU: the GEMV grid space at every M of the decode ladder, M = 1, 2, 4, ... 64
(benchmarks/spaces/grid_gemv_ladder.yaml, answered by the complete H200 recordings
benchmarks/data/grid/gemv_ladder_mM.db.gz), over ``--seeds`` seeds: per seed the five runs above, answered in this
process; the optimum of each problem is known exactly (every valid config is recorded), and each problem's
neighbours are recorded too, so transfer between neighbouring shapes is measured without a GPU's noise.
``trials_ratio_to_0.99`` is then the median over the seeds of the trials (1c) needs over the median (3) needs.
``--in-flight`` configs are outstanding at a time (default: as many as on the H200 host, `H200_IN_FLIGHT`): the
sampler then proposes as it does there (side by side, each study its share of them). Walls of a replay say nothing
of a GPU and are not compared.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tuner.study.scheduler import QUEUE_DEPTH  # noqa: E402

GRID = ROOT / "benchmarks" / "data" / "grid"
REPLAY_SPACE = ROOT / "benchmarks" / "spaces" / "grid_gemv_ladder.yaml"
REPLAYS = {f"m{m}": GRID / f"gemv_ladder_m{m}.db.gz" for m in (1, 2, 4, 8, 16, 32, 64)}
#: earlier H200 results whose per-problem best (impl "tuner") counts as best known, beside this run's own
BEST_KNOWN_RESULTS = ("decode-2026-12-01-gemv-300.json", "decode-2026-12-01-gemv-llama.json")
REACH = 0.99
#: each problem's `_trials_ratio`, in the records
RATIO = f"trials_ratio_to_{REACH}"


def _curve(storage: str, study: str) -> list[float]:
    """The study's throughput per trial number (0 for a trial without one), in trial order."""
    import optuna

    trials = optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    return [float(t.user_attrs.get("tbps") or 0.0) for t in sorted(trials, key=lambda t: t.number)]


def _reached(curve: list[float], target: float) -> int | None:
    """The number of trials after which the running best first reached `target` (None: never)."""
    best = 0.0
    for i, value in enumerate(curve):
        best = max(best, value)
        if best >= target:
            return i + 1
    return None


# ---------------------------------------------------------------------------------------------------------------
# replay (CPU)


#: configs in flight on the H200 host the GPU figures come from, as `tuner.study.local.LocalPool.capacity` counts
#: them there: a compile process per core (16) and one GPU worker's queue, so a replay's sampler proposes as it does
H200_IN_FLIGHT = 16 + 1 * (QUEUE_DEPTH + 1)


def replay(trials: int, seeds: int, in_flight: int = H200_IN_FLIGHT) -> dict:
    from tuner.space import space as space_mod
    from tuner.space.space import params_key
    from tuner.study.driver import run_study
    from tuner.study.options import StudyOptions
    from tuner.study.replay import load_recording
    from tuner.study.shapes import run_problems

    space = space_mod.load(REPLAY_SPACE)
    optimum = {}
    for problem in space.problems:
        records = load_recording(str(REPLAYS[problem.name]))[0]
        valid = {params_key(c) for c in space.valid_configs(problem)}
        optimum[problem.name] = max(float(a.get("tbps") or 0) for k, (_, a) in records.items() if k in valid)
    runs: dict[str, dict[str, list]] = {
        "transfer": {},
        "one_at_a_time": {},
        "independent": {},
        "independent_3x": {},
        "transfer_3x": {},
    }
    with tempfile.TemporaryDirectory() as scratch:
        for seed in range(seeds):
            base = StudyOptions(
                kernel="gemv",
                space=str(REPLAY_SPACE),
                trials=trials,
                seed=seed,
                progress=False,
                storage="",
                in_process=True,  # answered in this process, `in_flight` at a time (not this machine's pool)
                replay_in_flight=in_flight,
            )
            replays = [str(p) for p in REPLAYS.values()]
            # at 3x trials too, so that the trials each needs to reach REACH compare with independent studies' at 3x
            for label, in_turn, budget in (
                ("transfer", False, trials),
                ("one_at_a_time", True, trials),
                ("transfer_3x", False, 3 * trials),
            ):
                db = f"sqlite:///{scratch}/{label}-{seed}.db"
                opts = dataclasses.replace(
                    base, storage=db, trials=budget, problems="all", replay=replays, one_at_a_time=in_turn
                )
                for row in run_problems(opts)["problems"]:
                    runs[label].setdefault(row["problem"], []).append(_curve(db, row["study"]))
            for label, budget in (("independent", trials), ("independent_3x", 3 * trials)):
                for name, recording in REPLAYS.items():
                    db = f"sqlite:///{scratch}/{label}-{name}-{seed}.db"
                    opts = dataclasses.replace(base, storage=db, trials=budget, problem=name, replay=str(recording))
                    summary = run_study(opts)
                    runs[label].setdefault(name, []).append(_curve(db, summary["study"]))
    problems = []
    for name, best in optimum.items():
        row: dict = {"problem": name, "optimum_tbps": best}
        for label, curves in runs.items():
            reached = [_reached(c, REACH * best) for c in curves[name]]
            row[label] = {
                "trials": len(curves[name][0]),
                "mean_fraction_of_optimum": statistics.mean(max(c) / best for c in curves[name]),
                "min_fraction_of_optimum": min(max(c) / best for c in curves[name]),
                f"seeds_reaching_{REACH}": sum(r is not None for r in reached),
                f"median_trials_to_{REACH}": statistics.median(r if r is not None else float("inf") for r in reached),
            }
        row[RATIO] = _trials_ratio(
            *(row[run][f"median_trials_to_{REACH}"] for run in ("transfer_3x", "independent_3x"))
        )
        problems.append(row)
    return {
        "mode": "replay",
        "gpu": "NVIDIA H200 (replay of benchmarks/data/grid/gemv_ladder_m1..m64.db.gz)",
        "space": str(REPLAY_SPACE.relative_to(ROOT)),
        "trials_per_problem": trials,
        "seeds": seeds,
        "in_flight": in_flight,
        "problems": problems,
        "min_fraction_of_best_known": min(p["transfer"]["min_fraction_of_optimum"] for p in problems),
        f"max_{RATIO}": _worst_ratio(problems),
    }


def _trials_ratio(ours: float | None, theirs: float | None) -> float | None:
    """The quality measure for one problem: the trials side by side at 3T took to reach REACH of the best known
    (`ours`) over the trials an independent 3T study took (`theirs`), each a count or a median over the seeds
    (None or inf: never). inf where side by side never reached it, None where the independent study never did.
    The target is at most 1/3."""
    if theirs is None or math.isinf(theirs):
        return None
    return (math.inf if ours is None else ours) / theirs


def _worst_ratio(rows: list[dict]) -> float | None:
    """The largest `RATIO` over the problems' rows that have one."""
    return max((row[RATIO] for row in rows if row[RATIO] is not None), default=None)


# ---------------------------------------------------------------------------------------------------------------
# GPU


def _study(argv: list[str], workdir: Path) -> tuple[dict, float]:
    """One ``tuner study`` command from cold caches (its own cache folder); its --json summary and whole wall."""
    env = {**os.environ, "TUNER_CACHE_DIR": str(workdir / f"cache-{time.monotonic_ns()}")}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "study", *argv, "--json"], cwd=workdir, env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"tuner study {' '.join(argv)}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout), wall


def _best_known_recorded() -> dict[str, float]:
    best: dict[str, float] = {}
    for name in BEST_KNOWN_RESULTS:
        path = ROOT / "benchmarks" / "results" / name
        if not path.exists():
            continue
        for row in json.loads(path.read_text()):
            if row.get("impl") == "tuner" and row.get("problem") and row.get("TBps"):
                best[row["problem"]] = max(best.get(row["problem"], 0.0), float(row["TBps"]))
    return best


#: shapes no problem of the shipped GEMV space has, each nearer one tuned shape than any other (by the header's
#: distance, `tuner.study.shapes.problem_distance`), with the problem whose config `select` must give them
UNTUNED = {(3, 8192, 8192): "m4", (48, 8192, 8192): "m64", (1, 16384, 8192): "up_m1", (64, 8192, 16384): "down_m64"}


def header_check(work: Path, together: dict) -> dict:
    """`tuner export gemv --header` over the one command's database, as a user types it, then a host program
    that includes the header, compiled by g++ and by nvcc where there is one, and prints ``select(M, N, K)->uri``
    for every tuned shape (it must be that problem's best config) and for the `UNTUNED` shapes (the nearest
    tuned shape's best config)."""
    from tuner.study.shapes import problem_distance

    rows = {r["problem"]: r for r in together["problems"]}
    for shape, name in UNTUNED.items():  # the expectations hold for these sizes: no ties, the named one nearest
        sizes = dict(zip(("M", "N", "K"), shape, strict=True))
        nearest = sorted(rows.values(), key=lambda r: problem_distance(r["sizes"], sizes))
        first, second = (problem_distance(r["sizes"], sizes) for r in nearest[:2])
        assert nearest[0]["problem"] == name and first < second, (shape, name)
    header = work / "gemv_tuned.h"
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "export", "gemv", "--storage", "all.db", "--header", str(header)],
        cwd=work,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return {"ok": False, "error": f"tuner export: exit {proc.returncode}: {proc.stderr[-500:]}"}
    asks = [tuple(r["sizes"][n] for n in ("M", "N", "K")) for r in rows.values()] + list(UNTUNED)
    want = [r["best"]["uri"] for r in rows.values()] + [rows[n]["best"]["uri"] for n in UNTUNED.values()]
    calls = "".join(f'    std::printf("%s\\n", g::select({m}, {n}, {k})->uri);\n' for m, n, k in asks)
    main = f'#include <cstdio>\n#include "gemv_tuned.h"\nnamespace g = tuned::gemv;\nint main() {{\n{calls}}}\n'
    results = {}
    for compiler, suffix in (("g++", ".cpp"), ("nvcc", ".cu")):
        if shutil.which(compiler) is None:
            results[compiler] = {"ok": None, "error": "not on this machine"}
            continue
        source = work / f"pick{suffix}"
        source.write_text(main)
        exe = work / f"pick-{compiler}"
        flags = ["-std=c++17"] + (["-arch=sm_90"] if compiler == "nvcc" else [])
        build = subprocess.run([compiler, *flags, "-o", str(exe), str(source)], capture_output=True, text=True)
        if build.returncode != 0:
            results[compiler] = {"ok": False, "error": build.stderr[-500:]}
            continue
        got = subprocess.run([str(exe)], capture_output=True, text=True).stdout.split()
        results[compiler] = {"ok": got == want, "picked": got}
    return {
        "shapes_tuned": len(rows),
        "shapes_asked": [list(s) for s in asks],
        "expected": want,
        "compilers": results,
        "ok": all(r["ok"] is not False for r in results.values()),
    }


def gpu(trials: int, kernel: str, problems: list[str]) -> dict:
    """The five runs over `kernel`'s `problems` (module docstring)."""
    work = Path(tempfile.mkdtemp(prefix="shapes-"))
    runs: dict[str, dict] = {}
    one_command: dict[str, dict] = {}  # the summary of each --problems command
    for label, db, order, budget in (
        ("transfer", "all.db", [], trials),
        ("one_at_a_time", "in_turn.db", ["--one-at-a-time"], trials),
        ("transfer_3x", "all_3x.db", [], 3 * trials),  # for the trials each needs to reach REACH (see replay)
    ):
        argv = [kernel, "--problems", "all", *order, "--trials", str(budget), "--storage", db]
        one_command[label], wall = _study(argv, work)
        studies = {row["problem"]: row["study"] for row in one_command[label]["problems"]}
        runs[label] = {"wall_s": wall, "db": f"sqlite:///{work}/{db}", "studies": studies}
    together = one_command["transfer"]
    for label, budget in (("independent", trials), ("independent_3x", 3 * trials)):
        runs[label] = {"wall_s": 0.0, "db": f"sqlite:///{work}/{label}.db", "studies": {}}
        for name in problems:
            argv = [kernel, "--problem", name, "--trials", str(budget), "--storage", f"{label}.db"]
            summary, wall = _study(argv, work)
            runs[label]["wall_s"] += wall
            runs[label]["studies"][name] = summary["study"]
    header = header_check(work, together) if kernel == "gemv" else None
    recorded = _best_known_recorded() if kernel == "gemv" else {}
    rows = []
    for name in problems:
        curves = {label: _curve(run["db"], run["studies"][name]) for label, run in runs.items()}
        known = max([recorded.get(name, 0.0), *(max(c) for c in curves.values())])
        row = {"problem": name, "best_known_tbps": known, "recorded_best_tbps": recorded.get(name)}
        for label, curve in curves.items():
            row[label] = {
                "trials": len(curve),
                "best_tbps": max(curve),
                "fraction_of_best_known": max(curve) / known,
                f"trials_to_{REACH}": _reached(curve, REACH * known),
            }
        row[RATIO] = _trials_ratio(*(row[run][f"trials_to_{REACH}"] for run in ("transfer_3x", "independent_3x")))
        rows.append(row)
    return {
        "mode": "gpu",
        "kernel": kernel,
        "gpu": together["studies"][problems[0]]["gpus"][0]["gpu"],
        "problems": problems,
        "trials_per_problem": trials,
        "walls_s": {label: round(run["wall_s"], 2) for label, run in runs.items()},
        "wall_ratio_vs_independent": runs["transfer"]["wall_s"] / runs["independent"]["wall_s"],
        "wall_ratio_vs_independent_3x": runs["transfer"]["wall_s"] / runs["independent_3x"]["wall_s"],
        "wall_ratio_one_at_a_time_vs_independent": runs["one_at_a_time"]["wall_s"] / runs["independent"]["wall_s"],
        "wall_ratio_3x_vs_independent_3x": runs["transfer_3x"]["wall_s"] / runs["independent_3x"]["wall_s"],
        "min_fraction_of_best_known": min(r["transfer"]["fraction_of_best_known"] for r in rows),
        f"max_{RATIO}": _worst_ratio(rows),
        "header": header,
        "rows": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--gpu", action="store_true")
    mode.add_argument("--replay", action="store_true")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument(
        "--kernel", default="gemv", help="--gpu: a shipped space with several problems (gemv, decode_attention)"
    )
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument(
        "--in-flight", type=int, default=H200_IN_FLIGHT, help="--replay: configs in flight (default: the H200 host's)"
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    for flag in ("in_flight", "trials", "seeds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be at least 1")
    if args.gpu:  # a bad --kernel is one line and exit 2, before any GPU work
        from tuner.core.errors import InputError
        from tuner.space import space as space_mod

        try:
            problems = [p.name for p in space_mod.load(args.kernel).problems]
        except InputError as exc:
            parser.error(f"--kernel: {exc}")
        if len(problems) < 2:
            parser.error(f"--kernel {args.kernel}: its space has one problem; nothing to transfer between")
    record = replay(args.trials, args.seeds, args.in_flight) if args.replay else gpu(args.trials, args.kernel, problems)
    record.update(
        command="python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]]),
        date=dt.date.today().isoformat(),
    )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "-replay" if args.replay else "" if args.kernel == "gemv" else f"-{args.kernel}"
    path = out / f"shapes{suffix}-{record['date']}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("rows", "problems")} | {"written": str(path)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
