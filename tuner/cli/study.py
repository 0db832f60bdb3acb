"""``tuner study``: a thin layer over `tuner.study` (the API call), which starts the GPU workers as early as it may."""

from __future__ import annotations

import argparse
import json
import sys


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

    summary = study(
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
        replay=args.replay,
        replay_study=args.replay_study,
        replay_delay=args.replay_delay,
        in_process=args.in_process,
        problem=args.problem,
        objectives=args.objectives,
        repair=args.repair,
        ordered=not args.categorical,
        screen_cutoff=args.screen_cutoff,
        screen_ms=args.screen_ms,
        takeover=args.takeover,
        progress=not args.json,
    ).summary
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    # The study has closed its GPU workers, its writer and its database; without Ray (whose exit handler stops the
    # cluster it started) nothing is left for the interpreter's teardown to do but spend a few tenths of a second.
    args.exit_at_once = "ray" not in sys.modules
    return 0
