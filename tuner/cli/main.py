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
    from tuner.cli import gpu, lesson, results, spaces, study

    parser = _Parser(prog="tuner", description="Auto-tune memory-bound CUDA kernels.")
    parser.add_argument("--version", action="version", version=f"tuner {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    # in the order `tuner --help` lists them
    spaces.add_commands(sub)  # spaces, render, check
    gpu.add_commands(sub)  # bench, ceiling
    spaces.add_new_command(sub)  # new
    study.add_commands(sub)  # study
    results.add_import_command(sub)  # import-kt
    results.add_commands(sub)  # studies, pareto, export, dashboard, trials, best
    lesson.add_commands(sub)  # explain, lesson
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tuner")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from tuner import __version__

        return __version__


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. Everything after this module's own import runs inside the ``try``: a
    Ctrl-C at any moment, even while the parser is built, is the one line ``tuner: interrupted`` and 130."""
    words = sys.argv[1:] if argv is None else argv
    try:
        if words[:1] == ["study"] and not {"-h", "--help", "--in-process"} & set(words):
            # A study will need its writer process (tuner.store.writer): start it before this process builds its
            # parser, so that the writer's imports (a second or two) overlap everything after. Bad flags end it
            # with us.
            from tuner.store.writer import launch_writer

            launch_writer()
        parser = build_parser()
        if "_ARGCOMPLETE" in os.environ:  # a shell asking for completions (register-python-argcomplete tuner)
            import argcomplete

            argcomplete.autocomplete(parser)
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
