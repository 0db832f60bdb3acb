"""The driver's child processes (the GPU workers, the study's writer): fresh interpreters that run tuner's code and
never the caller's ``__main__``.

Why not ``multiprocessing``: its spawn start prepares each child by importing the parent's main module again.
From a plain script without an ``if __name__ == "__main__"`` guard the child then reaches the script's own
``tuner.study(...)`` call and dies ("An attempt has been made to start a new process before the current process
has finished its bootstrapping phase"); from ``python -`` the child tries to open a file named ``<stdin>``. A
tuner call must work wherever a Python call works (a script, standard input, IPython, a notebook, pytest), and
spawn offers no documented way to skip that preparation; forkserver prepares the main module the same way, and
fork is unsafe in a driver that runs threads (compiles, relays, a notebook's own). So `start_child` starts the
child itself:

* ``subprocess.Popen([sys.executable, "-c", BOOT, ...])``: the child imports this module from the parent's own
  package directory (``BOOT`` puts it first on the child's path), reads from its pipe the parent's ``sys.path``
  (so a family, factory or reference the parent imports by name, the child imports too), then its target
  function and arguments, and calls it. What crosses is pickled, the target by reference: it must be importable
  by name. A function or class defined in the caller's ``__main__`` (a script, a notebook cell) is not; spawn
  reached a guarded script's by running the script again, which is what this module exists to avoid.
  (`tuner.tune` stores a reference by value, so a notebook's function needs no module.)
* the pipe is a `multiprocessing.Pipe` (a socket pair), the child's end inherited through ``pass_fds`` and
  wrapped again in the child as ``multiprocessing.connection.Connection(fd)``. That constructor is what `Pipe`
  itself calls on POSIX, but the documentation does not describe it: tests/build/test_child.py fails if it stops taking
  a file descriptor. The messages over it are those of multiprocessing's connections (pickled objects). No
  semaphore, queue lock or resource-tracker process is involved, so a study leaves none behind.
* the child's stderr is a pipe that a thread of the parent relays, line by line, to the parent's ``sys.stderr``
  (the terminal, or a notebook's cell output, which an inherited descriptor would not reach), keeping its last
  lines: a child that dies says why (`Child.stderr_tail`), not only its exit code. Its stdout is inherited; its
  stdin is ``/dev/null`` (under ``python -`` the parent's stdin is the program).
* children belong to the parent: those still running when it exits are terminated (`atexit`, as multiprocessing
  did its daemonic ones), and a child whose parent was killed reads EOF on its pipe and leaves. Each starts in a
  process group of its own, so a Ctrl-C in the terminal reaches the parent alone, which shuts them down in order
  (a study's writer first writes what it was sent).

The child's work before its target runs is what spawn's was (an interpreter and multiprocessing's connection
module, this module importing only the standard library), less the main module's re-import; the parent starts no
resource-tracker process. POSIX only (``pass_fds``), like the rest of the GPU path.
"""

from __future__ import annotations

import _thread
import atexit
import collections
import contextlib
import multiprocessing
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

__all__ = ["Child", "Outbox", "start_child"]

#: What the child runs: the tuner package's directory first on its path, then `main` (argv: that directory, the
#: pipe's file descriptor, the child's name for ``ps``).
BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from tuner.build.child import main; main()"
#: How much of a child's stderr `Child.stderr_tail` gives: its last lines, at most this many and this many bytes.
TAIL_LINES = 12
TAIL_BYTES = 2048
#: How long a lost child's relay may take to read the rest of its stderr (the pipe's EOF comes when it exits).
RELAY_DRAIN_S = 2.0

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
#: this process's children still running: process-wide by nature, as they end with the process (its exit handler)
_LIVE: weakref.WeakSet[Child] = weakref.WeakSet()


class _Relay:
    """A thread that copies a child's stderr (the read end `fd` of its pipe) to this process's ``sys.stderr`` as it
    comes, keeping the last lines. It reads to EOF whatever happens to the copy, so the child never blocks on a
    full pipe."""

    def __init__(self, fd: int):
        self.tail: collections.deque[bytes] = collections.deque(maxlen=TAIL_LINES)
        self.done = threading.Event()
        # The low-level start: `threading.Thread.start` waits until the new thread runs, which on a busy host is
        # milliseconds of the launching thread's time per child; this thread needs nothing that wait ensures.
        _thread.start_new_thread(self._run, (fd,))

    def _run(self, fd: int) -> None:
        try:
            with open(fd, "rb") as stream:
                for line in iter(lambda: stream.readline(8192), b""):
                    self.tail.append(line)
                    sink = sys.stderr
                    if sink is None:
                        continue
                    try:
                        sink.write(line.decode(errors="replace"))
                        sink.flush()
                    except (OSError, ValueError):  # a closed or replaced stream (pytest's capture ended, a lost tty)
                        pass
        finally:
            self.done.set()


class Child:
    """One child process started by `start_child`: its `pid`, the parent's end of its pipe (`conn`), and the tail
    of what it wrote to stderr. Exit codes read as `subprocess` reports them (negative: killed by that signal)."""

    def __init__(self, proc: subprocess.Popen, conn: Connection, name: str, relay: _Relay):
        self.proc, self.conn, self.name = proc, conn, name
        self.pid = proc.pid
        self._relay = relay

    @property
    def exitcode(self) -> int | None:
        """The exit code, or None while it runs (reaps it once it has exited)."""
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, if it still runs."""
        if self.alive():
            self.proc.kill()

    def join(self, timeout: float | None = None) -> int | None:
        """Wait up to `timeout` seconds for it to exit; its exit code, or None if it still runs."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stderr_tail(self) -> str:
        """Its last lines on stderr (at most `TAIL_LINES` lines, `TAIL_BYTES` bytes), once its relay has read
        them: after the child has exited, this waits up to `RELAY_DRAIN_S` for the rest of the pipe."""
        if self.proc.poll() is not None:
            self._relay.done.wait(RELAY_DRAIN_S)
        text = b"".join(list(self._relay.tail))[-TAIL_BYTES:].decode(errors="replace")
        return text.rstrip("\n")

    def close(self) -> None:
        """Close the parent's end of the pipe (a child still running then reads EOF and leaves)."""
        self.conn.close()


def start_child(target: Callable[..., Any], args: tuple = (), name: str = "tuner-child") -> Child:
    """Start a child process that runs ``target(conn, *args)``, `conn` being its end of a duplex pipe whose other
    end is the returned `Child`'s ``conn``. `target` and `args` are pickled (`target` by reference: a module-level
    function the child can import with the parent's ``sys.path``). Returns once the process exists, without
    waiting for it to set up. The child's exit code is 1 when `target` raises (its traceback goes to stderr).
    Arguments that do not pickle raise here, before any process starts."""
    payload = pickle.dumps((target, tuple(args)), protocol=pickle.HIGHEST_PROTOCOL)
    parent_conn, child_conn = multiprocessing.Pipe(duplex=True)
    fd = child_conn.fileno()
    stderr_read, stderr_write = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", BOOT, _PACKAGE_ROOT, str(fd), name],
            stdin=subprocess.DEVNULL,
            stderr=stderr_write,
            pass_fds=(fd,),
            # A process group of its own: Ctrl-C in a terminal signals the foreground group, and the parent alone
            # must hear it (it shuts its children down); a child that got it too would die mid-write.
            process_group=0,
        )
    except BaseException:
        os.close(stderr_read)
        raise
    finally:
        child_conn.close()  # the child holds the only other ends: its death reads as EOF on both
        os.close(stderr_write)
    # Buffered in the socket until the child reads them: the path first, which the target's unpickling needs.
    parent_conn.send(list(sys.path))
    parent_conn.send_bytes(payload)
    # After the child is on its way (a GPU worker's start is what a study waits for): its first lines wait in the
    # pipe meanwhile.
    child = Child(proc, parent_conn, name, _Relay(stderr_read))
    _LIVE.add(child)
    return child


def main() -> None:
    """The child's entry (see `BOOT`): take the parent's path, then its target, and run it."""
    conn = Connection(int(sys.argv[2]))
    sys.path[:] = conn.recv()
    target, args = pickle.loads(conn.recv_bytes())
    profiled(getattr(target, "__name__", "child"), target, conn, *args)


#: Set to a directory, every tuner process (the command, its GPU workers, its writer) writes a cProfile of its main
#: thread there when it ends (``NAME-PID.prof``): where a study's time goes, on the machine that ran it.
PROFILE_DIR_ENV = "TUNER_PROFILE_DIR"


def profiled(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, under cProfile when `PROFILE_DIR_ENV` names a directory (the stats written even if it
    raises)."""
    directory = os.environ.get(PROFILE_DIR_ENV)
    if not directory:
        return fn(*args)
    import cProfile

    profile = cProfile.Profile()
    try:
        return profile.runcall(fn, *args)
    finally:
        Path(directory).mkdir(parents=True, exist_ok=True)
        profile.dump_stats(str(Path(directory) / f"{name}-{os.getpid()}.prof"))


class Outbox:
    """Sends on a child's pipe from a thread, so that `put` never blocks its caller while the child is slow to
    read (a writer committing to a slow database): what `multiprocessing.Queue.put` offered. Messages go in order;
    once the child is gone the rest are dropped (its death is reported by whoever watches it)."""

    _STOP = object()

    def __init__(self, conn: Connection):
        self._conn = conn
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done = threading.Event()
        _thread.start_new_thread(self._feed, ())  # without waiting for it to run (see `_Relay`)

    def put(self, message: Any) -> None:
        self._queue.put(message)

    def _feed(self) -> None:
        lost = False
        try:
            while (message := self._queue.get()) is not Outbox._STOP:
                if lost:
                    continue
                try:
                    self._conn.send(message)
                except OSError:  # the child has gone (BrokenPipeError, ConnectionResetError)
                    lost = True
                except Exception:  # a message that does not pickle: said here, as multiprocessing's queues say it
                    traceback.print_exc()
        finally:
            self._done.set()

    def close(self, timeout: float | None = None) -> None:
        """Send what is queued (waiting up to `timeout`), then stop the thread."""
        self.put(Outbox._STOP)
        self._done.wait(timeout)


@atexit.register
def _end_children(wait_s: float = 2.0) -> None:
    """At the parent's exit: terminate the children still running (as multiprocessing did its daemonic ones), and
    give them `wait_s` in all to go."""
    children = [child for child in list(_LIVE) if child.alive()]
    for child in children:
        child.proc.terminate()
    deadline = time.monotonic() + wait_s
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))


@contextlib.contextmanager
def quiet_after_interrupt(interrupted: bool) -> Iterator[None]:
    """Tear-down after an interrupt: a child process that ended meanwhile (a pool's, a study's writer) is part of
    the interrupt, not a fault of its own to report over it; the trials the writer took are stored either way."""
    try:
        yield
    except Exception:
        if not interrupted:
            raise
