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

from tuner.core.errors import InputError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


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


class _Interrupts:
    """Ctrl-C delivered until the command has heard it. Python raises KeyboardInterrupt wherever the main thread
    is when the signal's handler runs, and where that is a weakref callback or a ``__del__`` (the import system
    runs such callbacks while a study starts) the exception is printed as ignored and lost: the command would run
    on. So each SIGINT also starts a thread that, `AGAIN_S` later, raises it again in the main thread unless
    `heard` says the ``except`` clause took it; from then on SIGINT is ignored, so a second press cannot turn the
    exit code 130 into a death by signal. Installed only in the command line's own process (a caller of `main`
    keeps its handler)."""

    AGAIN_S = 0.2

    def __init__(self, install: bool):
        import threading

        self._heard = threading.Event()
        self._installed = install and threading.current_thread() is threading.main_thread()
        if self._installed:
            import signal

            signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum, frame) -> None:
        import threading

        if not self._heard.is_set():  # one thread at a time: each re-delivery runs this handler again
            threading.Thread(target=self._again, name="tuner-interrupt", daemon=True).start()
        raise KeyboardInterrupt

    def _again(self) -> None:
        import _thread

        if not self._heard.wait(self.AGAIN_S):
            _thread.interrupt_main()

    def heard(self) -> None:
        self._heard.set()
        if self._installed:
            import signal

            signal.signal(signal.SIGINT, signal.SIG_IGN)

    @staticmethod
    def exit(code: int) -> NoReturn:
        """End the process with `code` after the exit handlers (children ended, buffers flushed), without the
        interpreter's own exit: CPython marks a KeyboardInterrupt that passed through C code running a string of
        Python (some imports do) as unhandled even when our ``except`` took it, and then ends a normal exit by
        killing itself with SIGINT (exit status -2 where 130 was returned)."""
        import atexit

        atexit._run_exitfuncs()  # noqa: SLF001 - the one way to run them before os._exit
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code. Everything after this module's own import runs inside the ``try``: a
    Ctrl-C at any moment, even while the parser is built, is the one line ``tuner: interrupted`` and 130."""
    words = sys.argv[1:] if argv is None else argv
    interrupts = _Interrupts(argv is None)
    try:
        ahead = None  # what a study's command starts before it knows the study (`tuner.study.ahead`)
        if words[:1] == ["study"] and not {"-h", "--help", "--in-process"} & set(words):
            # A study will need its writer process (tuner.store.writer): start it before this process builds its
            # parser, so that the writer's imports (a second or two) overlap everything after. Bad flags end it
            # with us.
            from tuner.study.ahead import Ahead

            ahead = Ahead()
            ahead.launch_writer()
        parser = build_parser()
        if "_ARGCOMPLETE" in os.environ:  # a shell asking for completions (register-python-argcomplete tuner)
            import argcomplete

            argcomplete.autocomplete(parser)
        args = parser.parse_args(argv)
        if ahead is not None:
            args.ahead = ahead  # ``tuner study`` hands it to the study (`tuner.cli.study.cmd_study`)
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
        interrupts.heard()
        print("tuner: interrupted", file=sys.stderr)
        if argv is None:  # the command line's own process
            interrupts.exit(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`tuner spaces --json | head`): nothing more to say, and Python must not
        # complain again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
