"""Commands on one GPU: ``tuner bench`` (verify and time one config in a worker process) and ``tuner ceiling`` (the
device-to-device copy ceiling, measured afresh).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tuner.cli.args import positive_float
from tuner.cli.spaces import load_space_and_problem
from tuner.core.errors import InputError


def _start_gpu(evaluator, gpu: int) -> dict[str, Any]:
    """Start the GPU worker; no usable GPU or driver is a one-line error, not a traceback."""
    from tuner.gpu import discovery
    from tuner.gpu.worker import WorkerError

    discovery.require_gpu(gpu)  # in words, before a worker process starts only to fail
    try:
        return evaluator.start()
    except WorkerError as exc:
        raise InputError(f"GPU {gpu} is not usable: {str(exc).splitlines()[0].split(': ', 1)[-1]}") from None


def cmd_bench(args: argparse.Namespace) -> int:
    from tuner.api import run_bench
    from tuner.results.console import Column, print_table

    s, problem = load_space_and_problem(args, renders=True)
    params = s.config_from_assignments(args.set or [], problem)
    result, info = run_bench(s, params, problem, gpu=args.gpu, timeout_s=args.timeout, budget_ms=args.budget_ms)
    record = {
        "space": str(s.path),
        "problem": problem.name,
        "params": params,
        "gpu": info.get("gpu"),
        **result.to_dict(),
    }
    if args.json:
        print(json.dumps(record, indent=2, default=str))
        return 0 if result.ok else 1
    print_table(
        f"{s.name} on {info.get('gpu')}",
        [Column("field"), Column("value", copy=True)],
        [
            [key, f"{value:.4g}" if isinstance(value, float) else str(value)]
            for key, value in record.items()
            if key not in ("clocks", "versions", "log")
        ],
    )
    return 0 if result.ok else 1


def cmd_ceiling(args: argparse.Namespace) -> int:
    from tuner.gpu.worker import IsolatedEvaluator

    # Measured afresh (never the cached figure), and stored for the studies that follow.
    with IsolatedEvaluator(gpu=args.gpu, timeout_s=120.0, evaluator_kwargs={"ceiling": "measure"}) as evaluator:
        info = _start_gpu(evaluator, args.gpu)
    record = {
        "gpu": info["gpu"],
        "ceiling_tbps": info["ceiling_tbps"],
        "method": (
            "cudaMemcpyAsync D2D, 2 GiB, read + write counted, median of event-timed repetitions with L2 flushed "
            "(a read of twice the L2)"
        ),
    }
    print(
        json.dumps(record, indent=2)
        if args.json
        else f"{record['gpu']}: {record['ceiling_tbps']:.3f} TB/s ({record['method']})"
    )
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """bench, ceiling."""
    p = sub.add_parser("bench", help="verify and time one config on a GPU")
    p.add_argument("space")
    p.add_argument("--set", action="append", metavar="NAME=VALUE")
    p.add_argument("--problem")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--timeout", type=positive_float, default=60.0, help="seconds before the kernel is a hang")
    p.add_argument("--budget-ms", type=positive_float, default=100.0, help="timed work per config")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("ceiling", help="measure the device-to-device copy bandwidth")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ceiling)
