"""How long a GPU worker's child takes to start, on a CPU: `IsolatedEvaluator.launch` → the child's reply.

    python benchmarks/experiments/child_start.py [--repeat 20] [--gpu-repeat 3]
    PYTHONPATH=/other/checkout python benchmarks/experiments/child_start.py      # the same figures for another checkout

Three figures per start, each its median over `--repeat` fresh children (one more first, to warm the page cache):

* ``launch_ms``: the parent's own time in `launch` (it returns before the child is up);
* ``entry_s``: launch → the child's entry into `tuner.gpu.worker._child_main` (interpreter, imports, the pipe), from
  the child's own ``perf_counter`` stamp (system-wide on Linux); its evaluator is a stand-in that starts at once;
* ``child_cpu_s``: the child's CPU time (user + system, /proc) once it has replied: what a busy host has to find;
* ``gpu_fail_s`` (``--gpu-repeat`` times): launch → the WorkerError of the default GpuEvaluator on a host without
  a GPU, i.e. its CuPy import and CUDA initialisation up to the driver's refusal.

Other work on the machine slows each figure: the 1-minute load average is printed beside them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
import types
from pathlib import Path

from tuner.gpu.worker import IsolatedEvaluator, WorkerError

#: An evaluator that starts at once, made of picklable built-ins so that any checkout's child can build it.
QUICK = functools.partial(types.SimpleNamespace, start=functools.partial(dict, startup={}, arch="sm_90"))


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def quick_start() -> dict[str, float]:
    evaluator = IsolatedEvaluator(evaluator_factory=QUICK)
    t0 = time.perf_counter()
    evaluator.launch()
    launched = time.perf_counter()
    info = evaluator.start()
    assert evaluator.pid is not None
    cpu = _cpu_s(evaluator.pid)
    evaluator.close()
    return {
        "launch_ms": (launched - t0) * 1e3,
        "entry_s": info["startup"]["entered_at"] - t0,
        "child_cpu_s": cpu,
    }


def gpu_fail() -> float:
    evaluator = IsolatedEvaluator()
    t0 = time.perf_counter()
    try:
        evaluator.start()
    except WorkerError:
        pass
    else:
        raise SystemExit("a GPU answered: this measures a host without one")
    evaluator.close()
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--gpu-repeat", type=int, default=3)
    args = parser.parse_args()
    quick_start()
    runs = [quick_start() for _ in range(args.repeat)]
    fails = [gpu_fail() for _ in range(args.gpu_repeat)]
    out = {key: round(statistics.median(r[key] for r in runs), 4) for key in runs[0]}
    if fails:
        out["gpu_fail_s"] = round(statistics.median(fails), 3)
    out["load_1min"] = round(os.getloadavg()[0], 2)
    import tuner.gpu.worker

    out["tuner"] = str(Path(tuner.gpu.worker.__file__).parent)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
