# PYTHON_ARGCOMPLETE_OK
"""The `tuner` command line. Each subcommand is a thin layer over the Python API (`tuner.api`: study, bench, best)
or one stage module: spaces, render, check (space, render, compile); ceiling (worker); pareto, export, dashboard,
trials (export's rooms).

Bad input of any kind (an `InputError`, or an argparse complaint) is one line on stderr and exit code 2, with no
traceback; anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from tuner.cli.args import positive_float, positive_int, screen_cutoff, seconds
from tuner.cli.gpu import cmd_bench, cmd_ceiling
from tuner.cli.results import add_results_commands, cmd_import_kt
from tuner.cli.spaces import cmd_check, cmd_new, cmd_render, cmd_spaces
from tuner.cli.study import cmd_study
from tuner.errors import InputError

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    """argparse prints usage plus a message; we want one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{self.prog}: {message}")


# ---------------------------------------------------------------------------------------------------------------
# spaces / render / check


# ---------------------------------------------------------------------------------------------------------------
# bench / ceiling (one GPU, in a worker process so a faulting kernel cannot take the CLI down)


# ---------------------------------------------------------------------------------------------------------------
# study


# ---------------------------------------------------------------------------------------------------------------
# results


# ---------------------------------------------------------------------------------------------------------------
# results: pareto / export / dashboard / trials / best (outputs are checked before any work, written atomically)


# ---------------------------------------------------------------------------------------------------------------
# registration


# ---------------------------------------------------------------------------------------------------------------
# parser and entry point


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tuner", description="Auto-tune memory-bound CUDA kernels.")
    parser.add_argument("--version", action="version", version=f"tuner {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("spaces", help="list the shipped search spaces with their sizes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_spaces)

    p = sub.add_parser("render", help="print the CUDA source of one config")
    p.add_argument("space", help="a space file or the name of a shipped space")
    p.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a param of the default config")
    p.add_argument("--problem", help="problem name (default: the space's first)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("check", help="render and compile all valid configs (or a sample); report resources")
    p.add_argument("space")
    p.add_argument("--sample", type=positive_int, help="compile a seeded sample of N valid configs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=positive_int, help="parallel compiles (default: all cores)")
    p.add_argument("--arch", help="e.g. sm_90 (default: GPU 0's, else sm_90)")
    p.add_argument("--problem")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check)

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

    p = sub.add_parser("new", help="write a starter kernel (template, space, reference) into this directory")
    p.add_argument("name", help="the kernel's name (an identifier)")
    p.set_defaults(func=cmd_new)

    from tuner.space.limits import ENGINES, SAMPLERS

    p = sub.add_parser("study", help="run (or resume) an Optuna study over the GPUs Ray sees")
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
    p.add_argument("--gpus", type=positive_int, help="GPU workers (default: every GPU Ray sees)")
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
    p.add_argument("--replay", metavar="PATH", help="answer from a recorded study instead of a GPU")
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
    p.add_argument("--problem")
    p.add_argument("--json", action="store_true", help="print the summary as JSON, no progress bar")
    p.set_defaults(func=cmd_study)

    p = sub.add_parser("import-kt", help="write a space YAML for a Kernel Tuner cache file (replay only)")
    p.add_argument("cache", help="a Kernel Tuner cache, .json or .json.gz")
    p.add_argument("-o", "--out", required=True, metavar="SPACE.yaml")
    p.add_argument(
        "--restrictions",
        metavar="FILE",
        help="Kernel Tuner's restrictions (a JSON list of strings, or one a line): those that parse as "
        "expressions become the space's constraints",
    )
    p.add_argument("--restriction", action="append", metavar="EXPR", help="one such restriction (repeat)")
    p.set_defaults(func=cmd_import_kt)

    add_results_commands(sub)  # studies, pareto, export, dashboard, trials, best

    from tuner.cli.lesson import add_commands as add_lesson_commands

    add_lesson_commands(sub)  # explain, lesson
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tuner")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from tuner import __version__

        return __version__


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if words[:1] == ["study"] and not {"-h", "--help", "--in-process"} & set(words):
        # A study will need its writer process (tuner.study.writer): start it before this process builds its parser,
        # so that the writer's imports (a second or two) overlap everything after. Bad flags end it with us.
        from tuner.study.writer import launch_writer

        launch_writer()
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:  # a shell asking for completions (register-python-argcomplete tuner)
        import argcomplete

        argcomplete.autocomplete(parser)
    try:
        args = parser.parse_args(argv)
        from tuner.build.cachedirs import ensure_writable
        from tuner.build.child import profiled

        ensure_writable()  # before anything imports CuPy or starts a process that will (they inherit the choice)
        code = int(profiled(f"tuner-{words[0] if words else 'help'}", args.func, args) or 0)
        sys.stdout.flush()  # inside the try: a reader that went away is a BrokenPipeError caught below
        if argv is None and getattr(args, "exit_at_once", False):  # the command line's own process, not a caller's
            sys.stderr.flush()
            os._exit(code)
        return code
    except InputError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`tuner spaces --json | head`): nothing more to say, and Python must not
        # complain again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
