"""Where a study's time went: its trials' stages summed, from the study's database.

    python benchmarks/phases.py STORAGE_URL_OR_DB [--study NAME]

Sums every trial's ``phases_s`` (inputs, reference, launch, compare, timing: the GPU evaluator's host wall per
stage) and ``gpu_ms`` (the GPU time of the config's own launches), and lists the trials that cost the most. Prints
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import optuna

    parser = argparse.ArgumentParser()
    parser.add_argument("storage")
    parser.add_argument("--study", default=None)
    args = parser.parse_args()
    url = args.storage if "://" in args.storage else f"sqlite:///{args.storage}"
    name = args.study or optuna.get_all_study_names(url)[0]
    trials = optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)
    sums: dict[str, float] = {}
    gpu_ms, costly = 0.0, []
    for t in trials:
        phases = t.user_attrs.get("phases_s") or {}
        for key, value in phases.items():
            sums[key] = sums.get(key, 0.0) + float(value)
        gpu_ms += float(t.user_attrs.get("gpu_ms") or 0.0)
        costly.append((sum(float(v) for v in phases.values()), t.number, t.user_attrs.get("uri"), phases))
    costly.sort(reverse=True)
    out = {
        "study": name,
        "trials": len(trials),
        "phases_s": {k: round(v, 3) for k, v in sums.items()},
        "gpu_s": round(gpu_ms / 1e3, 3),
        "costliest": [{"trial": n, "uri": u, "total_s": round(c, 4), "phases_s": p} for c, n, u, p in costly[:8]],
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
