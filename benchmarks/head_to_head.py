"""Ours against each peer, interleaved round by round, for the close calls a single timing cannot settle.

    python benchmarks/head_to_head.py --from benchmarks/results/catalog-2026-12-01-rmsnorm-l2.json
        [--from ...] [--only rmsnorm decode_attention] [--problems b16_s8192] [--rounds 12] [--out DIR]

benchmarks/catalog.py, decode.py and decode_b.py time our tuned config inside its study and the peers afterwards,
once each: two kernels 0.3% apart there may differ by the GPU's state between the two timings, not by the
kernels. Here, for every ``impl: tuner`` record of the --from files (its family, problem and config), our
config is compiled and verified, then each round times it and each of catalog.py's peers for the problem once
(`tuner.bench`'s protocol: L2 flushed by the read flush before every launch, CUDA events, the median of
--budget-ms of launches; ours through `GpuEvaluator.evaluate`, which checks the output again every round), in a
shuffled order per round. A round's ratio ours / peer compares two timings taken seconds apart.

Verdict per peer over the rounds: "ahead" (or "behind") when ours is faster (slower) in so many rounds that
a fair coin would do it with probability < 0.05 (two-sided sign test), else "tie". Writes
``head_to_head-<date>.json`` (one record per round and impl, plus one summary per peer) and ``.md`` under --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import random
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def sign_test(wins: int, n: int) -> float:
    """Two-sided p-value of `wins` successes in `n` fair coin flips (ties dropped before)."""
    if n == 0:
        return 1.0
    k = min(wins, n - wins)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def verdict(ours: list[float], peer: list[float], alpha: float = 0.05) -> tuple[str, int, int, float]:
    """(verdict, rounds ours faster, rounds compared, p) over paired TB/s figures (equal figures dropped)."""
    pairs = [(a, b) for a, b in zip(ours, peer, strict=True) if a != b]
    wins = sum(a > b for a, b in pairs)
    p = sign_test(wins, len(pairs))
    if p >= alpha:
        return "tie", wins, len(pairs), p
    return ("ahead" if wins > len(pairs) - wins else "behind"), wins, len(pairs), p


def targets(paths: list[str], only, problems) -> list[dict]:
    """The `impl: tuner` records of result files: kernel, problem name, config (each distinct config once)."""
    found: dict[tuple[str, str, str], dict] = {}
    for path in paths:
        records = json.loads(Path(path).read_text())
        if not isinstance(records, list):
            raise ValueError(f"{path} is not a list of result records (catalog.py, decode.py, decode_b.py write one)")
        for rec in records:
            if not isinstance(rec, dict) or rec.get("impl") != "tuner" or not isinstance(rec.get("config"), dict):
                continue
            problem = rec.get("problem") or str(rec["shape"]).split()[0]
            if (only and rec["kernel"] not in only) or (problems and problem not in problems):
                continue
            found.setdefault(
                (rec["kernel"], problem, json.dumps(rec["config"], sort_keys=True)),
                {"kernel": rec["kernel"], "problem": problem, "config": rec["config"], "source": path},
            )
    return list(found.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="sources", action="append", required=True, metavar="JSON")
    parser.add_argument("--only", nargs="*", help="families to keep")
    parser.add_argument("--problems", nargs="*", help="problem names to keep")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--budget-ms", type=float, default=200.0, help="timed launches per impl and round")
    parser.add_argument("--seed", type=int, default=0, help="the rounds' shuffle")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]])
    try:
        chosen = targets(args.sources, args.only, args.problems)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # unreadable, not JSON, not a list of records
        print(f"head_to_head.py: --from: {exc}", file=sys.stderr)
        return 2
    if not chosen:
        print("head_to_head.py: no `impl: tuner` record in --from matches --only/--problems", file=sys.stderr)
        return 2

    import catalog
    import torch

    from tuner import kernels
    from tuner.build.compile import compile_source
    from tuner.build.render import render
    from tuner.gpu.evaluator import GpuEvaluator
    from tuner.gpu.protocol import EvaluateRequest
    from tuner.gpu.timing import LAUNCH_HOLD, benchmark
    from tuner.space import space as space_mod

    date = dt.date.today().isoformat()
    ev = GpuEvaluator()
    ev.start()
    torch_stream = torch.cuda.ExternalStream(ev.device.stream.ptr)
    shuffle = random.Random(args.seed)
    records: list[dict] = []
    summaries: list[dict] = []
    for target in chosen:
        kernel, problem_name, params = target["kernel"], target["problem"], target["config"]
        space = space_mod.load(ROOT / "search_spaces" / f"{kernel}.yaml")
        problem = space.problem(problem_name)
        family = kernels.get(kernel)
        config = space.resolve(params, problem)
        compiled = compile_source(render(family, params, config, problem.env), ev.arch)
        if not compiled.ok:
            print(f"{kernel} {problem_name}: our config does not compile: {compiled.reason}", file=sys.stderr)
            return 1
        nbytes = family.bytes_moved(problem.env)
        impls = {"tuner": None, **dict(catalog.peers(kernel, problem, torch))}

        def time_peer(fn):
            def run():
                with torch.cuda.stream(torch_stream):
                    fn()

            return benchmark(
                run, stream=ev.device.stream, budget_ms=args.budget_ms, flush=ev.device.flush, hold=ev.device.hold
            ).median_ms

        tbps: dict[str, list[float]] = {name: [] for name in impls}
        for r in range(args.rounds):
            order = list(impls)
            shuffle.shuffle(order)
            for name in order:
                gave_up = ev.device.hold.timeouts
                if name == "tuner":
                    result = ev.evaluate(
                        EvaluateRequest(compiled, family, config, problem.env, budget_ms=args.budget_ms)
                    )
                    if not result.ok:
                        print(f"{kernel} {problem_name}: our config failed: {result.reason}", file=sys.stderr)
                        return 1
                    ms = result.median_ms
                else:
                    ms = time_peer(impls[name])
                tbps[name].append(nbytes / ms / 1e9)
                # a hold that gave up may have let host time into that timing (tuner.gpu.timing.LAUNCH_HOLD)
                records.append(
                    {
                        "kernel": kernel,
                        "problem": problem_name,
                        "round": r,
                        "impl": name,
                        "median_ms": ms,
                        "holds_given_up": ev.device.hold.timeouts - gave_up,
                    }
                )
        torch.cuda.empty_cache()
        base = {"kernel": kernel, "problem": problem_name, "gpu": ev.gpu_name, "date": date, "command": command}
        for name in impls:
            if name == "tuner":
                continue
            call, wins, n, p = verdict(tbps["tuner"], tbps[name])
            ratios = [a / b for a, b in zip(tbps["tuner"], tbps[name], strict=True)]
            summaries.append(
                {
                    **base,
                    "peer": name,
                    "rounds": args.rounds,
                    "tuner_TBps_median": round(statistics.median(tbps["tuner"]), 4),
                    "tuner_TBps_range": [round(min(tbps["tuner"]), 4), round(max(tbps["tuner"]), 4)],
                    "peer_TBps_median": round(statistics.median(tbps[name]), 4),
                    "peer_TBps_range": [round(min(tbps[name]), 4), round(max(tbps[name]), 4)],
                    "ratio_median": round(statistics.median(ratios), 4),
                    "ratio_range": [round(min(ratios), 4), round(max(ratios), 4)],
                    "rounds_ours_faster": wins,
                    "rounds_compared": n,
                    "sign_test_p": round(p, 4),
                    "verdict": call,
                    "uri": compiled.uri,
                    "config": params,
                    "config_from": target["source"],
                }
            )
            s = summaries[-1]
            print(
                f"{kernel:16s} {problem_name:22s} vs {name:24s} ours {s['tuner_TBps_median']:.3f} peer "
                f"{s['peer_TBps_median']:.3f} TB/s, ratio {s['ratio_median']:.4f} "
                f"[{s['ratio_range'][0]:.4f}, {s['ratio_range'][1]:.4f}], faster in {wins}/{n} rounds "
                f"(p {p:.3g}): {call}; {compiled.uri}",
                flush=True,
            )

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"head_to_head-{date}.json").write_text(
        json.dumps({"summaries": summaries, "rounds": records}, indent=1) + "\n"
    )
    lines = [
        f"# Head to head on {ev.gpu_name}, {date}",
        "",
        f"Command: `{command}`. {args.rounds} rounds; in each, our config (verified every round) and every peer",
        f"timed once in a shuffled order, {args.budget_ms:g} ms of launches each, L2 flushed before every launch,",
        f"launches enqueued behind a stream hold ({LAUNCH_HOLD}; it gave up {ev.device.hold.timeouts} times).",
        "TB/s count each family's minimal bytes. Verdict: two-sided sign test over the rounds at p < 0.05.",
        "",
        "| kernel | problem | peer | ours TB/s (min-max) | peer TB/s (min-max) | ours / peer, median (min-max) | "
        "ours faster | p | verdict | our config |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s['kernel']} | {s['problem']} | {s['peer']} | {s['tuner_TBps_median']:.3f} "
            f"({s['tuner_TBps_range'][0]:.3f}-{s['tuner_TBps_range'][1]:.3f}) | {s['peer_TBps_median']:.3f} "
            f"({s['peer_TBps_range'][0]:.3f}-{s['peer_TBps_range'][1]:.3f}) | {s['ratio_median']:.4f} "
            f"({s['ratio_range'][0]:.4f}-{s['ratio_range'][1]:.4f}) | {s['rounds_ours_faster']}/"
            f"{s['rounds_compared']} | {s['sign_test_p']:.3g} | {s['verdict']} | {s['uri']} |"
        )
    (out / f"head_to_head-{date}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
