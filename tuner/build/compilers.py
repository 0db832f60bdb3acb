"""Compiles in child processes, one per compile slot.

NVRTC runs one compile at a time per process, however many threads call it, while processes scale with the cores
(benchmarks/results/nvrtc_threads-2026-12-02.md, CuPy's binding and a ctypes call alike). A study whose configs
compile faster than the GPU measures them was bound by its compiles in series. So `CompileProcesses`
keeps `slots` child processes (`tuner.build.child`: fresh interpreters that import tuner's code and never re-run the
caller's ``__main__``), each compiling one config at a time through `tuner.build.compile.compile_source` (the cache
included: its writes are atomic and locked across processes). A thread that calls `compile` takes an idle child,
hands it the config over its pipe and blocks there without the GIL, so the caller's compile threads stay what
they were: the feeders.

A child takes a second or more to start (a fresh interpreter, CuPy's imports). Until one is ready, one caller at a
time compiles in its own process, as before there were children, so that the first config of a study does not
wait for a child's start-up.

A child runs at a lower priority than the study's other processes (`COMPILE_NICENESS`). A child that dies while
compiling (NVRTC crashing on a source) fails that config's compile with its exit code and the end of its stderr,
never the study; a new child takes its place.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from tuner.build.child import Child, start_child
from tuner.core.gpufacts import DEFAULT_ARCH
from tuner.core.result import CompileFailed

if TYPE_CHECKING:
    from tuner.build.compile import Compiled
    from tuner.build.render import Source

__all__ = ["COMPILE_NICENESS", "CompileProcesses"]

#: how much lower than the rest of the study a compile runs (a nice increment; Linux and other POSIX systems)
COMPILE_NICENESS = 10


def _serve(conn, niceness: int) -> None:
    """A compile child's loop: (source, arch, use_cache) in, ("ok", result) or ("error", exception) out, until
    its pipe closes."""
    with contextlib.suppress(AttributeError, OSError):
        os.nice(niceness)  # before the imports below, which are most of a child's start-up
    from tuner.build.compile import compile_source

    try:
        conn.send(("ready",))  # its start-up is over: the caller stops compiling in its own process
    except OSError:  # the study stopped while this child started: nothing will ask it for a compile
        return
    while True:
        try:
            source, arch, use_cache = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[str, Any] = ("ok", compile_source(source, arch, (), use_cache))
        except Exception as exc:  # a bug in compiling, or an InputError: the caller raises it
            reply = ("error", exc)
        try:
            conn.send(reply)
        except OSError:  # the caller closed its end (a study that stopped): nothing waits for this compile
            return


class CompileProcesses:
    """`slots` compile children, started at once (their start-up overlaps the caller's); see the module
    docstring. Thread-safe: up to `slots` callers compile at the same time, more wait for an idle child."""

    def __init__(self, slots: int):
        self.slots = max(1, slots)
        self.replaced = 0  # children started after one died
        self._idle: queue.SimpleQueue[Child] = queue.SimpleQueue()
        self._all: list[Child] = []
        self._ready: set[int] = set()  # ids of the children that said they are ready
        self.in_process = 0  # compiles done in the caller's process while no child was ready
        self._here = threading.Lock()  # held by the one compile in the caller's process
        self.closed = False
        for _ in range(self.slots):
            self._idle.put(self._start())

    def _start(self) -> Child:
        child = start_child(_serve, (COMPILE_NICENESS,), name="tuner-compile")
        self._all.append(child)
        return child

    def compile(self, source, arch: str, use_cache: bool = True):
        """`tuner.build.compile.compile_source(source, arch)` in an idle child: a Compiled or CompileFailed; raises
        what compile_source raised there (in the caller's process while no child is ready yet)."""
        child = self._idle.get()
        # One compile at a time in this process: NVRTC serializes them here, and a second would wait behind the
        # first longer than a child takes to start (a GEMM config: 0.75 s of NVRTC on the H200 host).
        if not self._is_ready(child) and self._here.acquire(blocking=False):
            self._idle.put(child)
            try:
                from tuner.build.compile import compile_source

                self.in_process += 1
                return compile_source(source, arch, (), use_cache)
            finally:
                self._here.release()
        try:
            self._wait_ready(child)
            child.conn.send((source, arch, use_cache))
            status, value = child.conn.recv()
        except (EOFError, OSError):
            if self.closed:  # close() ended the child: its caller's work is being dropped
                return CompileFailed(reason="the compilers were closed before this config compiled")
            code = child.join(5.0)
            tail = child.stderr_tail()
            last = tail.splitlines()[-1].strip() if tail else "it wrote nothing to stderr"
            child = self._start()
            self.replaced += 1
            return CompileFailed(
                reason=f"the compiler process died (exit code {code}) compiling this config: {last}",
                details={"exitcode": code, "stderr": tail, "log": ""},
            )
        finally:
            if not self.closed:
                self._idle.put(child)
        if status == "error":
            raise value
        return value

    def _is_ready(self, child: Child) -> bool:
        """Whether `child` finished its start-up (its "ready" read here, once). A child that died while starting
        counts as ready: the compile sent to it fails, and a new child takes its place."""
        if id(child) in self._ready:
            return True
        try:
            if not child.conn.poll(0):
                return False
            child.conn.recv()
        except (EOFError, OSError):
            pass
        self._ready.add(id(child))
        return True

    def _wait_ready(self, child: Child) -> None:
        """Block until `child` finished its start-up (EOFError/OSError if it died meanwhile)."""
        if id(child) not in self._ready:
            child.conn.recv()
            self._ready.add(id(child))

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every child to finish its start-up; whether all did."""
        return all(child.conn.poll(timeout) and self._is_ready(child) for child in list(self._all))

    def close(self) -> None:
        """Stop every child (each reads EOF on its pipe and leaves); a compile in flight fails in its caller."""
        self.closed = True
        for child in self._all:
            child.close()
        for child in self._all:
            if child.join(2.0) is None:
                child.kill()
        self._all = []


def compile_many(
    sources: Iterable[Source],
    arch: str = DEFAULT_ARCH,
    jobs: int | None = None,
    use_cache: bool = True,
    on_done: Callable[[Source, Compiled | CompileFailed], None] | None = None,
) -> Iterator[tuple[Source, Compiled | CompileFailed]]:
    """Compile many sources in parallel, yielding (source, result) in input order.

    In `jobs` processes (`CompileProcesses`: NVRTC compiles one at a time per process, so threads of one process
    do not scale) where there are more sources than jobs; a few sources compile in threads here, which costs less
    than starting processes for them.
    """
    from concurrent.futures import ThreadPoolExecutor

    from tuner.build.compile import compile_source

    jobs = jobs or os.cpu_count() or 1
    items = list(sources)
    processes = CompileProcesses(jobs) if len(items) > jobs > 1 else None
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:

        def one(source: Source) -> Compiled | CompileFailed:
            if processes is not None:
                return processes.compile(source, arch, use_cache)
            return compile_source(source, arch, (), use_cache)

        futures = [pool.submit(one, s) for s in items]
        for src, fut in zip(items, futures, strict=True):
            result = fut.result()
            if on_done:
                on_done(src, result)
            yield src, result
    finally:
        # Interrupted (Ctrl-C) or abandoned by its caller: the compiles not started are dropped, not waited for
        # (the pool's own `with` would run all of them first).
        pool.shutdown(wait=False, cancel_futures=True)
        if processes is not None:
            processes.close()
