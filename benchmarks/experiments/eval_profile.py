"""Where a screening evaluation's time goes in the GPU worker: the GEMM main job's space, in-process evaluator.

    python benchmarks/experiments/eval_profile.py > profile.txt

Draws 24 valid configs of search_spaces/gemm.yaml uniformly (seed 0), compiles them, and evaluates each twice with
`tuner.gpu.evaluator.GpuEvaluator` (after one warm-up evaluation of the default): cut short (``cutoff_ms=0``: check + 3
timed runs) and with the full screening budget. Prints, for each, the median wall per evaluation, the median
kernel time and the overhead = wall - runs × kernel median (inputs, reference, check, module load, host work),
then cProfile's top entries.
"""

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tuner.build.compile import compile_source  # noqa: E402
from tuner.build.render import render  # noqa: E402
from tuner.gpu.evaluator import GpuEvaluator  # noqa: E402
from tuner.gpu.protocol import EvaluateRequest  # noqa: E402
from tuner.space.space import load  # noqa: E402
from tuner.study.validset import valid_index  # noqa: E402


def main() -> None:
    space = load("gemm")
    problem = space.problem()
    index = valid_index(space, problem)
    rng = np.random.default_rng(0)
    configs = [dict(space.default)] + [index.config(int(i)) for i in rng.choice(len(index), 24, replace=False)]
    compiled = []
    for c in configs:
        resolved = space.resolve(c, problem)
        compiled.append((resolved, compile_source(render(space.family, c, resolved, problem.env), "sm_90")))
    evaluator = GpuEvaluator(0)
    evaluator.start()
    # CuPy's first use
    evaluator.evaluate(EvaluateRequest(compiled[0][1], space.family, compiled[0][0], problem.env, cutoff_ms=0.0))
    rows = []
    profile = cProfile.Profile()
    for resolved, cubin in compiled[1:]:
        for cutoff in (0.0, None):
            started = time.perf_counter()
            profile.enable()
            result = evaluator.evaluate(EvaluateRequest(cubin, space.family, resolved, problem.env, cutoff_ms=cutoff))
            profile.disable()
            wall = (time.perf_counter() - started) * 1e3
            if result.ok:
                runs = 1 + result.repetitions + (3 if cutoff is None else 0)
                rows.append((cutoff is None, wall, result.median_ms, wall - runs * result.median_ms))
    for full in (False, True):
        sel = [r for r in rows if r[0] == full]
        print(
            "full" if full else "short",
            "n",
            len(sel),
            "wall ms median",
            round(float(np.median([r[1] for r in sel])), 2),
            "kernel ms median",
            round(float(np.median([r[2] for r in sel])), 3),
            "overhead ms median",
            round(float(np.median([r[3] for r in sel])), 2),
            "overhead ms mean",
            round(float(np.mean([r[3] for r in sel])), 2),
        )
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(40)
    print(out.getvalue())


if __name__ == "__main__":
    main()
