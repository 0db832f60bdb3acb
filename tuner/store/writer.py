"""The study's writer: a process that mirrors the driver's trials into the durable storage.

The driver samples from an in-memory Optuna study; every trial is mirrored, in ask order, into the study's
durable storage by this process, so SQLite's commits (tens of milliseconds each) never hold up the GPUs. The
process may start before anything is known of the study (a `Mirror` of no storage yet: ``tuner study`` starts
one first thing, so that its imports of Optuna and SQLAlchemy overlap the driver's own start-up); its first
message names the storage and the study (`Mirror.bind` for a study the driver has opened, `Mirror.create` for a
new one, which the writer creates itself). The process is a `tuner.build.child` child (it never runs the caller's
``__main__``); the driver's messages go to it over its pipe from a thread (`tuner.build.child.Outbox`), so that a
slow commit never blocks the driver, and its one report comes back on the same pipe.

This module imports only the standard library at the top: the driver's command can start the process before
importing anything heavy.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from tuner.build.child import Outbox, start_child
from tuner.core.errors import InputError

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

#: How long the writer holds a started trial back, waiting for its result to write both in one insert (one
#: commit instead of one per attribute). A driver killed meanwhile loses those trials' RUNNING records only:
#: their configs had no result yet, and the rerun asks afresh.
WRITER_HOLD_S = 1.0


def _writer_main(conn: Connection, url: str | None, parent: int | None = None) -> None:
    """Mirror trials into durable storage in ask order, as `conn` (the pipe from the driver) brings them. A trial
    whose result comes within `WRITER_HOLD_S` of its start is written finished; one still running then is written
    RUNNING and completed by its finish. The trials due in one pass of the loop are written together, in one
    transaction, and the RUNNING ones whose finish came in that pass are completed together, in another
    (`tuner.store.trialwriter`). Exits when the driver (`parent`) dies (its end of the pipe closes), once what it sent
    is written, so a killed driver leaves no writer holding the database (its RUNNING trials are recovered on the
    rerun). The first message names the study, and the storage's `url` when the process was started without it:
    ("study", id[, url]) for a study the driver has opened, or ("create", spec) for a new study, which the writer
    then creates itself (the storage, the driver's lease, the study and its attributes; `_create_study`), so that a
    new study's driver never waits for the storage. A refused creation is reported on `conn` ({"refused": text})
    and nothing is written; after ("stop",), the writer's timings are. Later messages may set study attributes
    (("study_attr", key, value)). The writer is started early, to import while the driver sets up."""
    started_at = time.perf_counter()
    # The slow part of the writer's start, done while the driver sets up: Optuna, and the packages its RDB
    # storage imports on first use (about 0.6 s of the writer's 0.8 s to open the storage on a 2-core machine).
    import alembic.command  # noqa: F401
    import alembic.config  # noqa: F401
    import alembic.migration  # noqa: F401
    import alembic.script  # noqa: F401
    import optuna
    import sqlalchemy.dialects.sqlite  # noqa: F401
    import sqlalchemy.orm  # noqa: F401

    from tuner.store.dbfiles import open_storage
    from tuner.store.trialwriter import TrialWriter

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # as in the driver: no "A new study created" line
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    imported_at = time.perf_counter()
    first = _next(conn, parent, WRITER_HOLD_S / 2)
    while first == ():
        first = _next(conn, parent, WRITER_HOLD_S / 2)
    if first is None or first[0] not in ("study", "create"):
        return
    bound_at = time.perf_counter()
    lease = None
    if first[0] == "study":
        study_id = first[1]
        url = url or first[2]
        storage = open_storage(url)
    else:
        url = url or first[1]["url"]
        try:
            storage, study_id, lease = _create_study(url, first[1])
        except InputError as exc:
            _report_and_leave(conn, {"refused": exc.message, "where": exc.where})
    # what the driver's summary reports of the writer (`perf_counter` stamps: the driver makes them relative)
    stats: dict[str, Any] = {
        "started_at": started_at,
        "imported_at": imported_at,
        "bound_at": bound_at,
        "opened_at": time.perf_counter(),
        "trials": 0,
        "write_s": 0.0,
    }
    mirroring = _Mirroring(TrialWriter(storage), storage, study_id, stats)
    stop = gone = False
    while not (stop and not mirroring.held) and not gone:
        batch: list[tuple] = []
        message = _next(conn, parent, WRITER_HOLD_S / 4)
        while message:
            batch.append(message)
            message = _next(conn, parent, 0.0)
        # The driver is gone: what it sent is written below, the trials still held are not (the rerun asks afresh).
        gone = message is None
        stop = mirroring.take(batch, time.monotonic(), stop)
    if gone and not stop:
        return  # nobody to report to; a lease of a killed driver is taken over by the rerun
    if lease is not None:
        lease.release()
    storage.engine.dispose()  # closes the database (SQLite folds its write-ahead log back in)
    stats["done_at"] = time.perf_counter()
    _report_and_leave(conn, stats)


class _Mirroring:
    """The writer's loop state: trials held in ask order until they finish (or `WRITER_HOLD_S` passes), the
    storage ids of those written RUNNING, and the writer's timings."""

    def __init__(self, writer, storage, study_id: int, stats: dict[str, Any]):
        self.writer, self.storage, self.study_id, self.stats = writer, storage, study_id, stats
        self.trial_ids: dict[int, int] = {}
        self.held: dict[int, tuple[Any, float]] = {}  # started, not yet written, in ask order: number → (frozen, since)
        self.finals: dict[int, Any] = {}  # results of held trials

    def take(self, batch: list[tuple], now: float, stop: bool) -> bool:
        """Apply one pass's messages and write what is due; True once the driver has said stop (`stop`: it had)."""
        finishing: list[tuple[int, Any]] = []  # (trial id, frozen): written RUNNING in an earlier pass
        for msg in batch:
            kind = msg[0]
            if kind == "stop":
                stop = True
            elif kind == "study_attr":
                self.storage.set_study_user_attr(self.study_id, msg[1], msg[2])
            elif kind == "start":
                self.held[msg[1]] = (msg[2], now)
            elif kind == "finish" and msg[1] in self.held:
                self.finals[msg[1]] = msg[2]
            elif kind == "finish":
                finishing.append((self.trial_ids[msg[1]], msg[2]))
        if finishing:  # completed together, in one transaction (tuner.store.trialwriter)
            started = time.perf_counter()
            self.writer.finish(self.study_id, finishing)
            self.stats["write_s"] += time.perf_counter() - started
        self._write_ready(now, stop)
        return stop

    def _write_ready(self, now: float, stop: bool) -> None:
        """Write the held trials that are due, in ask order, in one transaction: finished ones, and running ones
        held for `WRITER_HOLD_S` (all of them once the driver stops). A trial not due holds back those after it."""
        ready: list[tuple[int, Any]] = []
        while self.held:
            number, (frozen, since) = next(iter(self.held.items()))
            if number not in self.finals and not stop and now - since < WRITER_HOLD_S:
                break  # later trials wait behind it: numbers must agree with the driver's
            del self.held[number]
            ready.append((number, self.finals.pop(number, frozen)))
        if ready:
            started = time.perf_counter()
            ids = self.writer.write(self.study_id, [frozen for _, frozen in ready])
            self.trial_ids.update(zip((number for number, _ in ready), ids, strict=True))
            self.stats["write_s"] += time.perf_counter() - started
            self.stats["trials"] += len(ready)
            self.stats.setdefault("first_write_at", time.perf_counter())


def _next(conn: Connection, parent: int | None, timeout: float) -> tuple | None:
    """The driver's next message, () if none came within `timeout`, or None once the driver is gone (its end of
    the pipe closed, or this process re-parented)."""
    try:
        if conn.poll(timeout):
            return conn.recv()
    except (EOFError, OSError):
        return None
    return None if parent is not None and os.getppid() != parent else ()


def _report_and_leave(conn: Connection, report: dict[str, Any]) -> None:
    """Send the driver `report` and leave without the interpreter's teardown (a tenth of a second or more of
    garbage collection and module clean-up that the driver would wait for): everything is written and closed.
    A driver that is gone no longer reads it."""
    try:
        conn.send(report)
    except OSError:
        pass
    os._exit(0)


def _create_study(url: str, spec: dict[str, Any]):
    """In the writer: create the storage at `url` and the new study `spec` describes (name, directions, user
    attrs, metric names) under a lease for the driver (`spec["pid"]`); return (storage, study id, lease). An
    InputError when another driver holds the study, or when the study appeared since the driver found no
    storage (a second driver started it meanwhile: a rerun resumes it)."""
    import optuna

    from tuner.store.dbfiles import open_storage
    from tuner.store.lease import acquire

    name = spec["name"]
    storage = open_storage(url)
    lease = acquire(url, name, spec["takeover"], pid=spec["pid"])
    try:
        new_study(storage, name, spec["directions"], spec["attrs"], spec["metric_names"])
    except optuna.exceptions.DuplicatedStudyError:
        lease.release()
        # The other run claims its study right after creating it: name it once its claim is in (a refusal
        # naming the holder, as a driver arriving later gets), else say what happened.
        time.sleep(0.5)
        acquire(url, name, False, pid=spec["pid"]).release()
        raise InputError(
            f"study {name!r} was created by another run while this one started; run the command again to resume it",
            url,
        ) from None
    return storage, storage.get_study_id_from_name(name), lease


def new_study(
    storage,
    name: str,
    directions: Sequence[Literal["minimize", "maximize"]],
    attrs: dict[str, Any],
    metric_names: list[str],
):
    """Create the durable study `name` in `storage` with its user attrs and metric names (by the writer for a new
    database, by the driver for a new study in an existing one); Optuna's DuplicatedStudyError if it exists."""
    import optuna

    durable = optuna.create_study(study_name=name, storage=storage, directions=directions)
    for key, value in attrs.items():
        durable.set_user_attr(key, value)
    durable.set_metric_names(metric_names)
    return durable


class Mirror:
    """The driver's handle on a writer process: its messages out (an `Outbox` on its pipe), its one report back
    (final timings, or a refusal). `target` is the writer's entry, called as ``target(conn, url, driver pid,
    *extra)`` in the child (tests substitute a variant of `_writer_main`)."""

    def __init__(
        self,
        url: str | None,
        study_id: int | None = None,
        target: Callable[..., None] | None = None,
        extra: tuple = (),
    ):
        self.url = url
        #: the directory the writer started in: it opens a relative storage path from there
        self.cwd = os.getcwd()
        self.proc = start_child(target or _writer_main, (url, os.getpid(), *extra), name="tuner-writer")
        self.outbox = Outbox(self.proc.conn)
        if study_id is not None:
            self.bind(study_id)

    def bind(self, study_id: int) -> None:
        """Name the study the writer mirrors into (once, before the first trial)."""
        self.outbox.put(("study", study_id, self.url))

    def create(self, spec: dict[str, Any]) -> None:
        """Have the writer create a new study (`_create_study`) and mirror into it (instead of `bind`)."""
        self.outbox.put(("create", {**spec, "url": self.url}))

    def set_study_attr(self, key: str, value: Any) -> None:
        self.outbox.put(("study_attr", key, value))

    def _report(self, timeout: float) -> dict[str, Any] | None:
        """The writer's report, if it came within `timeout` (None: none yet, or the writer is gone without one)."""
        try:
            if self.proc.conn.poll(timeout):
                return self.proc.conn.recv()
        except (EOFError, OSError):
            pass
        return None

    def _stderr(self) -> str:
        """The writer's last lines on stderr, as a block to append to the message that it died ("" if none)."""
        stderr = self.proc.stderr_tail()
        return f"\n--- the writer's last lines on stderr ---\n{stderr}" if stderr else ""

    def check(self) -> None:
        """While the study runs (no wait): raise the InputError of a refused `create` as soon as the writer has
        reported it, and a RuntimeError if the writer has died, so a study whose trials can no longer be recorded
        stops now rather than at its end."""
        report = self._report(0.0)
        if report is not None:
            self._raise_refusal(report)
        code = self.proc.exitcode
        if code is not None:
            raise RuntimeError(
                f"the study's writer process exited with code {code}; nothing more can be recorded{self._stderr()}"
            )

    @staticmethod
    def _raise_refusal(stats: dict[str, Any]) -> dict[str, Any]:
        if "refused" in stats:
            raise InputError(stats["refused"], stats.get("where"))
        return stats

    def start(self, number: int, frozen) -> None:
        self.outbox.put(("start", number, frozen))

    def finish(self, number: int, frozen) -> None:
        self.outbox.put(("finish", number, frozen))

    def abort(self) -> None:
        """Stop a writer that was never bound to a study (the study was refused during set-up)."""
        self.outbox.put(("stop",))
        self.outbox.close(10.0)
        self.proc.join(10.0)
        self.proc.close()

    def drain(self, timeout: float) -> None:
        """After an interrupt cut `close` short: let the writer write what it was sent and leave, waiting up to
        `timeout` seconds; its report and exit code are not read (the interrupt is what the user is told)."""
        deadline = time.monotonic() + timeout
        self.outbox.put(("stop",))  # a second stop, after close's own, is never read
        self.outbox.close(timeout)
        self.proc.join(max(0.0, deadline - time.monotonic()))

    def close(self, timeout: float = 300.0) -> dict[str, Any]:
        """Stop the writer once it has written every trial; its timings (epoch seconds, `_writer_main`), or {}."""
        self.outbox.put(("stop",))
        stats: dict[str, Any] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            report = self._report(0.2)
            if report is not None:
                stats = report
                break
            if not self.proc.alive():  # it ended without its timings (it failed: exit code below)
                stats = self._report(0.0) or {}
                break
        self.outbox.close(max(0.0, deadline - time.monotonic()))
        code = self.proc.join(max(0.0, deadline - time.monotonic()))
        self.proc.close()
        if code not in (0, None):
            raise RuntimeError(f"study writer exited with code {code}{self._stderr()}")
        return self._raise_refusal(stats)


class InlineMirror:
    """`Mirror` without a process: writes each trial into `storage` at once (in-process replay studies), through
    the writer process's `TrialWriter` (a trial's ~30 attributes in one transaction, not one commit each)."""

    def __init__(self, storage, study_id: int):
        from tuner.store.trialwriter import TrialWriter

        self.writer, self.study_id = TrialWriter(storage), study_id
        self.trial_ids: dict[int, int] = {}

    def start(self, number: int, frozen) -> None:
        (self.trial_ids[number],) = self.writer.write(self.study_id, [frozen])

    def finish(self, number: int, frozen) -> None:
        self.writer.finish(self.study_id, [(self.trial_ids[number], frozen)])

    def drain(self, timeout: float) -> None:
        """Nothing to wait for: each trial was written when it was told."""

    def close(self, timeout: float = 0.0) -> dict[str, Any]:
        return {}


#: how long the writer may go on writing the trials it was sent after a Ctrl-C cut its close short
FLUSH_AFTER_INTERRUPT_S = 30.0


def close_writer(mirror: Mirror | InlineMirror) -> dict[str, Any]:
    """`mirror.close()`; a Ctrl-C while it waits still lets the writer write what it was sent (within
    `FLUSH_AFTER_INTERRUPT_S`), then goes on as the interrupt."""
    try:
        return mirror.close()
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            mirror.drain(FLUSH_AFTER_INTERRUPT_S)
        raise
