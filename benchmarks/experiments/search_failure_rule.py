"""Whether the failure rule changes a search: trial sequences with `tells_failures_as_worst` as shipped and with
every failure told as the worst value (the rule before 2026-12-03), same seeds, compared for equality.

On a recording with no failed config the two must be identical; prints one line per space × in flight × seed
and writes JSON.

    python benchmarks/experiments/search_failure_rule.py rmsnorm,softmax,gemv_m64,gemm 1 100 out.json
    python benchmarks/experiments/search_failure_rule.py
        tests/data/transpose_h200.db=tuner/search_spaces/transpose.yaml 3 200 o.js

Arguments: recordings (names in benchmarks/data/grid, or anything search.py takes), seeds, trials, output JSON.
"""

from __future__ import annotations

import json
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
import search as S  # noqa: E402


def main() -> int:
    import optuna

    from tuner.study import driver, failures, opening

    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    items, seeds, trials, out = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    shipped = failures.tells_failures_as_worst
    report: dict[str, str] = {}
    for item in items:
        path = item if "=" in item or "/" in item else str(ROOT / "benchmarks" / "data" / "grid" / f"{item}.db.gz")
        name, recording, space = S.resolve(path, Path(tempfile.mkdtemp()))
        truth = S.ground_truth(recording, space)
        for in_flight in (1, 8):
            for seed in range(seeds):
                sequences = []
                for rule in (shipped, lambda *args: True):
                    driver.tells_failures_as_worst = opening.tells_failures_as_worst = rule  # type: ignore[assignment]
                    job = {
                        "space_name": name,
                        "kernel": truth["kernel"],
                        "space": space,
                        "recording": recording,
                        "trials": trials,
                        "sampler": "tpe",
                        "seed": seed,
                        "in_flight": in_flight,
                        "objectives": "first",
                        "ordered": True,
                    }
                    sequences.append(S.one_run(job)["sequence"])
                verdict = "identical" if sequences[0] == sequences[1] else "different"
                report[f"{name} k={in_flight} seed={seed} trials={trials}"] = verdict
                print(name, in_flight, seed, verdict, flush=True)
    Path(out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
