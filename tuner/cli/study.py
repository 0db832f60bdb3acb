"""``tuner study``: a thin layer over `tuner.study` (the API call), which starts the GPU workers as early as it may."""

from __future__ import annotations

import argparse
import json
import sys

from tuner.cli.args import positive_float, positive_int, screen_cutoff, seconds
from tuner.errors import InputError


def _start_gpu_workers_early(args: argparse.Namespace, kernel: str | None) -> None:
    """Start the local engine's GPU worker processes before the study's own imports and set-up (Optuna, the
    space, the storage), which they overlap; a study refused meanwhile stops them on exit. First the checks that
    take milliseconds (`tuner.study.preflight`: the study's name; a SQLite file's storage, which must take a write), so
    that a study refused by them starts no worker; and none start for a study that may hold its trials already:
    the driver's exact check then comes first (it starts them itself otherwise)."""
    from tuner.gpu.worker import launch_gpu_workers
    from tuner.results.dbfiles import default_storage_url, plain_sqlite_file, storage_url
    from tuner.space import limits
    from tuner.study import preflight

    preflight.check_study_name(args.study_name)
    url = storage_url(args.storage) if args.storage is not None else kernel and default_storage_url(kernel)
    if url and plain_sqlite_file(url) is not None:  # another URL needs SQLAlchemy, or a server: the driver's
        preflight.check_storage(url, given=args.storage is not None)
    if kernel and preflight.maybe_complete(args.storage, kernel, args.trials, args.study_name):
        return
    available = limits.local_gpus() or 0
    launch_gpu_workers(min(args.gpus or available, available), timeout_s=args.timeout)


def cmd_study(args: argparse.Namespace) -> int:
    kernel = args.kernel
    if args.space is None and kernel.endswith((".yaml", ".yml")):
        # `tuner study my_space.yaml ...`: the space file names its kernel
        args.space, kernel = kernel, None
    if (args.engine in (None, "local") and not args.ray_address) and not (args.replay or args.in_process):
        _start_gpu_workers_early(args, kernel)
    from tuner.api import study

    if args.replay and len(args.replay) > 1 and not args.problems:
        raise InputError("--replay is given once, or once per problem with --problems")
    result = study(
        args.space or kernel,
        args.trials,
        kernel=kernel,
        sampler=args.sampler,
        storage=args.storage,
        study_name=args.study_name,
        seed=args.seed,
        gpus=args.gpus,
        ray_address=args.ray_address,
        engine=args.engine,
        timeout=args.timeout,
        replay=args.replay if args.problems else (args.replay or [None])[0],
        replay_study=args.replay_study,
        replay_delay=args.replay_delay,
        in_process=args.in_process,
        problem=args.problem,
        problems=args.problems,
        warm_start=args.warm_start,
        objectives=args.objectives,
        repair=args.repair,
        ordered=not args.categorical,
        screen_cutoff=args.screen_cutoff,
        screen_ms=args.screen_ms,
        takeover=args.takeover,
        progress=not args.json,
    )
    summary = result.summary
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    # The study has closed its GPU workers, its writer and its database; without Ray (whose exit handler stops the
    # cluster it started) nothing is left for the interpreter's teardown to do but spend a few tenths of a second.
    args.exit_at_once = "ray" not in sys.modules
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """study."""
    from tuner.space.limits import ENGINES, SAMPLERS

    p = sub.add_parser("study", help="run (or resume) an Optuna study over this machine's GPUs (or a Ray cluster's)")
    p.add_argument("kernel", help="kernel family, e.g. gemm, or a space file (.yaml), whose kernel is then the family")
    p.add_argument("--space", help="space file (default: the shipped space named after the kernel)")
    p.add_argument("--trials", type=positive_int, required=True, help="trials the study should end with")
    p.add_argument(
        "--storage",
        help="a .db path or SQLAlchemy URL (default sqlite:///studies/KERNEL.db, relative to the current directory)",
    )
    p.add_argument("--study-name", help="default: KERNEL-PROBLEM-GPU, so the same command resumes")
    p.add_argument("--sampler", choices=SAMPLERS, default="tpe")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--gpus",
        type=positive_int,
        help="GPU workers (default: every GPU this machine has; under --engine ray, every GPU Ray sees)",
    )
    p.add_argument("--ray-address", help="join an existing Ray cluster (default: start one locally)")
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=60.0,
        help="the most seconds a config may take before it is a hang (its deadline fits it: tuner.gpu.deadline)",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        help="local: GPU worker processes and compile threads on this machine, no Ray (the default "
        "without --ray-address); ray: Ray actors and tasks (the default with --ray-address)",
    )
    p.add_argument(
        "--replay",
        metavar="PATH",
        action="append",
        help="answer from a recorded study instead of a GPU (with --problems: once per problem)",
    )
    p.add_argument(
        "--replay-delay",
        type=seconds,
        default=0.0,
        metavar="S",
        help="seconds each replayed answer takes, standing in for GPU time",
    )
    p.add_argument(
        "--takeover",
        action="store_true",
        help="take the study over from a driver that holds it (after that driver's host crashed)",
    )
    p.add_argument("--replay-study", metavar="NAME", help="the study to replay when the file holds several")
    p.add_argument(
        "--in-process", action="store_true", help="with --replay: answer in this process (no Ray), one config in flight"
    )
    p.add_argument(
        "--repair",
        choices=("nearest", "random"),
        default="nearest",
        help="after a proposal that cannot be measured, measure the nearest unexplored valid config "
        "(default) or a uniform draw among them",
    )
    p.add_argument(
        "--objectives",
        choices=("first", "all"),
        default="first",
        help="search the space's first objective (throughput; default; the Pareto front of registers "
        "and SMEM comes from all measured trials) or all of them (multi-objective)",
    )
    p.add_argument(
        "--categorical",
        action="store_true",
        help="show the sampler every param as categorical (default: numeric params are ordered)",
    )
    p.add_argument(
        "--screen-cutoff",
        type=screen_cutoff,
        default=1.05,
        metavar="X",
        help="stop timing a config after its 3-repetition estimate when that is over X times the best median "
        "so far (default 1.05; off: every config gets the full budget)",
    )
    p.add_argument(
        "--screen-ms",
        type=positive_float,
        default=5.0,
        metavar="MS",
        help="timed work per config while screening, at least 10 launches (default 5); finalists get more",
    )
    p.add_argument("--problem", help="the space's problem to tune (default: its first)")
    p.add_argument(
        "--problems",
        metavar="all|P,Q,...",
        help="a study per problem of the space (all, or names), one after another over the same GPU workers, "
        "each starting from the best configs of the problems nearest it",
    )
    p.add_argument(
        "--warm-start",
        metavar="STUDY",
        help="start from the best configs of the studies of this space in STUDY (a study, kernel or .db: "
        "the same space tuned elsewhere, on another GPU say)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON, no progress bar")
    p.set_defaults(func=cmd_study)
