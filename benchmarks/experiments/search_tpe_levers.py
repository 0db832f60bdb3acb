"""TPE settings tried against the default on recorded spaces (the levers of the search defaults).

Same harness as benchmarks/search.py (the driver in process over a replay, the recorded subset searched, 200
evaluated configs at most), with the study's TPE sampler replaced per variant (`tuner.study.search.make_sampler`
patched in each worker). Prints mean/10th percentile at 25, 50, 100, 200 evaluated configs and writes JSON.

    PYTHONPATH=. python benchmarks/experiments/search_tpe_levers.py gemv_m64,gemm tpe-default,tpe-startup20
        20 1,8 nearest OUT.json

Arguments: spaces (names in benchmarks/data/grid), variants (keys of VARIANTS), seeds, configs in flight,
repair (nearest, uniform or both comma-separated), output JSON path.
"""

import json
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/search.py
import optuna
import search as S

optuna.logging.set_verbosity(optuna.logging.ERROR)

VARIANTS = {
    "tpe-default": dict(multivariate=True, group=True),
    "tpe-startup20": dict(multivariate=True, group=True, n_startup_trials=20),
    "tpe-startup30": dict(multivariate=True, group=True, n_startup_trials=30),
    "tpe-independent": dict(),
    "tpe-liar": dict(multivariate=True, group=True, constant_liar=True),
}


def job(args):
    variant, space_name, rec, sp, kernel, seed, k, trials, repair = args
    from tuner.study import driver as st

    kw = VARIANTS[variant]
    orig = st.make_sampler

    def make(name, s, n):
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=s, **kw)
        return orig(name, s, n)

    st.make_sampler = make
    from tuner.study.driver import Driver
    from tuner.study.options import StudyOptions

    d = Driver(
        StudyOptions(
            kernel=kernel,
            space=sp,
            trials=trials,
            storage=":memory:",
            sampler="tpe",
            seed=seed,
            replay=rec,
            in_process=True,
            replay_in_flight=k,
            replay_recorded_only=True,
            progress=False,
            repair=repair,
        )
    )
    s = d.run()
    study = optuna.load_study(study_name=s["study"], storage=d.opening.storage)
    seq = []
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        if "screened" in t.user_attrs:
            seq.append((t.user_attrs["screened"], None))
        elif t.state.name == "COMPLETE":
            seq.append(("measured", float(t.user_attrs["median_ms"])))
        else:
            seq.append(("failed", None))
    return variant, space_name, k, repair, seq


if __name__ == "__main__":
    spaces = sys.argv[1].split(",")
    variants = sys.argv[2].split(",")
    seeds = int(sys.argv[3])
    ks = [int(x) for x in sys.argv[4].split(",")]
    repairs = [x == "nearest" for x in (sys.argv[5].split(",") if len(sys.argv) > 5 else ["nearest"])]
    tmp = Path(tempfile.mkdtemp())
    jobs, truths = [], {}
    for name in spaces:
        n, rec, sp = S.resolve(f"benchmarks/data/grid/{name}.db.gz", tmp)
        truth = S.ground_truth(rec, sp)
        truths[name] = truth
        trials = min(200, truth["valid"])
        for v in variants:
            for seed in range(seeds):
                for k in ks:
                    for r in repairs:
                        jobs.append((v, name, rec, sp, truth["kernel"], seed, k, trials, r))
    with ProcessPoolExecutor(2) as ex:
        runs = list(ex.map(job, jobs))
    out = {}
    for name in spaces:
        t = truths[name]
        print(f"{name}: uniform " + " ".join(f"{S.uniform_expectation(t['times'], n):.3f}" for n in (25, 50, 100, 200)))
        groups = {}
        for v, sn, k, r, seq in runs:
            if sn == name:
                groups.setdefault((v, k, r), []).append({"sequence": seq, "sampler_ms": None})
        for (v, k, r), rs in groups.items():
            summ = S.summarize(rs, t, [25, 50, 100, 200])
            label = f"{v} k={k}" + ("" if r else " uniform-repair")
            out[f"{name} {label}"] = summ
            cells = " ".join(
                f"{summ['by_config'][n]['mean']:.3f}/{summ['by_config'][n]['p10']:.2f}" for n in (25, 50, 100, 200)
            )
            print(f"  {label:34} {cells}  screened {summ['bad_proposals_total_fraction']:.2f}")
    Path(sys.argv[6]).write_text(json.dumps(out, indent=1))
