"""The study's writer: a process that mirrors the driver's trials into the durable storage.

The driver samples from an in-memory Optuna study; every trial is mirrored, in ask order, into the study's
durable storage by this process, so SQLite's commits (tens of milliseconds each) never hold up the GPUs. The
process is started before anything is known of the study (`launch_writer`, called first thing by ``tuner study``,
so that its imports of Optuna and SQLAlchemy overlap the driver's own start-up); its first message names the
storage and the study (`_Mirror.bind` for a study the driver has opened, `_Mirror.create` for a new one, which the
writer creates itself).

This module imports only the standard library at the top: the driver's command can start the process before
importing anything heavy.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue as queue_mod
import time
import warnings
from collections.abc import Sequence
from typing import Any, Literal

from tuner.errors import InputError

#: How long the writer holds a started trial back, waiting for its result to write both in one insert (one
#: commit instead of one per attribute). A driver killed meanwhile loses those trials' RUNNING records only:
#: their configs had no result yet, and the rerun asks afresh.
WRITER_HOLD_S = 1.0


def _writer_main(url: str | None, inbox: mp.Queue, done: mp.Queue, parent: int | None = None) -> None:
    """Mirror trials into durable storage in ask order. A trial whose result comes within `WRITER_HOLD_S` of its
    start is written finished; one still running then is written RUNNING and completed by its finish. The trials
    due in one pass of the loop are written together, in one transaction, and the RUNNING ones whose finish came
    in that pass are completed together, in another (`tuner.trialwriter`). Exits when the
    driver (`parent`) dies, so a killed driver leaves no writer holding the database (its RUNNING trials are
    recovered on the rerun). The first message names the study, and the storage's `url` when the process was
    started without it: ("study", id[, url]) for a study the driver has opened, or ("create", spec) for a new
    study, which the writer then creates itself (the storage, the driver's lease, the study and its attributes;
    `_create_study`), so that a new study's driver never waits for the storage. A refused creation is reported on
    `done` ({"refused": text}) and nothing is written. Later messages may set study attributes
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

    from tuner.lease import get_unless_orphaned
    from tuner.study import open_storage
    from tuner.trialwriter import TrialWriter

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # as in the driver: no "A new study created" line
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    imported_at = time.perf_counter()
    first = get_unless_orphaned(inbox, parent)
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
            _report_and_leave(done, {"refused": exc.message, "where": exc.where})
    writer = TrialWriter(storage)  # held trials that are ready go in one transaction (tuner.trialwriter)
    # what the driver's summary reports of the writer (`perf_counter` stamps: the driver makes them relative)
    stats: dict[str, Any] = {
        "started_at": started_at,
        "imported_at": imported_at,
        "bound_at": bound_at,
        "opened_at": time.perf_counter(),
        "trials": 0,
        "write_s": 0.0,
    }
    trial_ids: dict[int, int] = {}
    held: dict[int, tuple[Any, float]] = {}  # started, not yet written, in ask order: number → (frozen, since)
    finals: dict[int, Any] = {}  # results of held trials
    stop = False
    while not (stop and not held):
        try:
            batch = [inbox.get(timeout=WRITER_HOLD_S / 4)]
        except queue_mod.Empty:
            batch = []
            if parent is not None and os.getppid() != parent:
                return
        while True:
            try:
                batch.append(inbox.get_nowait())
            except queue_mod.Empty:
                break
        now = time.monotonic()
        finishing: list[tuple[int, Any]] = []  # (trial id, frozen): written RUNNING in an earlier pass
        for msg in batch:
            kind = msg[0]
            if kind == "stop":
                stop = True
            elif kind == "study_attr":
                storage.set_study_user_attr(study_id, msg[1], msg[2])
            elif kind == "start":
                held[msg[1]] = (msg[2], now)
            elif kind == "finish" and msg[1] in held:
                finals[msg[1]] = msg[2]
            elif kind == "finish":
                finishing.append((trial_ids[msg[1]], msg[2]))
        if finishing:  # completed together, in one transaction (tuner.trialwriter)
            started = time.perf_counter()
            writer.finish(study_id, finishing)
            stats["write_s"] += time.perf_counter() - started
        ready: list[tuple[int, Any]] = []  # written in this pass, in ask order, in one transaction
        while held:
            number, (frozen, since) = next(iter(held.items()))
            if number not in finals and not stop and now - since < WRITER_HOLD_S:
                break  # later trials wait behind it: numbers must agree with the driver's
            del held[number]
            ready.append((number, finals.pop(number, frozen)))
        if ready:
            started = time.perf_counter()
            ids = writer.write(study_id, [frozen for _, frozen in ready])
            trial_ids.update(zip((number for number, _ in ready), ids, strict=True))
            stats["write_s"] += time.perf_counter() - started
            stats["trials"] += len(ready)
            stats.setdefault("first_write_at", time.perf_counter())
    if lease is not None:
        lease.release()
    storage.engine.dispose()  # closes the database (SQLite folds its write-ahead log back in)
    stats["done_at"] = time.perf_counter()
    _report_and_leave(done, stats)


def _report_and_leave(done: mp.Queue, report: dict[str, Any]) -> None:
    """Send the driver `report` and leave without the interpreter's teardown (a tenth of a second or more of
    garbage collection and module clean-up that the driver would wait for): everything is written and closed."""
    done.put(report)
    done.close()
    done.join_thread()
    os._exit(0)


def _create_study(url: str, spec: dict[str, Any]):
    """In the writer: create the storage at `url` and the new study `spec` describes (name, directions, user
    attrs, metric names) under a lease for the driver (`spec["pid"]`); return (storage, study id, lease). An
    InputError when another driver holds the study, or when the study appeared since the driver found no
    storage (a second driver started it meanwhile: a rerun resumes it)."""
    import optuna

    from tuner.lease import acquire
    from tuner.study import open_storage

    name = spec["name"]
    storage = open_storage(url)
    lease = acquire(url, name, spec["takeover"], pid=spec["pid"])
    try:
        new_study(storage, name, spec["directions"], spec["attrs"], spec["metric_names"])
    except optuna.exceptions.DuplicatedStudyError:
        lease.release()
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


class _Mirror:
    """The driver's handle on a writer process: its two queues (trials in, final timings or a refusal out)."""

    def __init__(self, url: str | None, study_id: int | None = None):
        ctx = mp.get_context("spawn")
        self.url = url
        self.inbox, self.done = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_writer_main, args=(url, self.inbox, self.done, os.getpid()), daemon=True)
        self.proc.start()
        if study_id is not None:
            self.bind(study_id)

    @classmethod
    def for_storage(cls, url: str) -> _Mirror:
        """A writer for the storage at `url`: the one `launch_writer` started, if it is still running, else a new
        one."""
        global _LAUNCHED
        launched, _LAUNCHED = _LAUNCHED, None
        if launched is not None and launched.proc.is_alive():
            launched.url = url
            return launched
        return cls(url)

    def bind(self, study_id: int) -> None:
        """Name the study the writer mirrors into (once, before the first trial)."""
        self.inbox.put(("study", study_id, self.url))

    def create(self, spec: dict[str, Any]) -> None:
        """Have the writer create a new study (`_create_study`) and mirror into it (instead of `bind`)."""
        self.inbox.put(("create", {**spec, "url": self.url}))

    def set_study_attr(self, key: str, value: Any) -> None:
        self.inbox.put(("study_attr", key, value))

    def check(self) -> None:
        """While the study runs (no wait): raise the InputError of a refused `create` as soon as the writer has
        reported it, and a RuntimeError if the writer has died, so a study whose trials can no longer be recorded
        stops now rather than at its end."""
        with contextlib.suppress(queue_mod.Empty):
            self._raise_refusal(self.done.get_nowait())
        if self.proc.exitcode is not None:
            raise RuntimeError(
                f"the study's writer process exited with code {self.proc.exitcode}; nothing more can be recorded"
            )

    @staticmethod
    def _raise_refusal(stats: dict[str, Any]) -> dict[str, Any]:
        if "refused" in stats:
            raise InputError(stats["refused"], stats.get("where"))
        return stats

    def start(self, number: int, frozen) -> None:
        self.inbox.put(("start", number, frozen))

    def finish(self, number: int, frozen) -> None:
        self.inbox.put(("finish", number, frozen))

    def abort(self) -> None:
        """Stop a writer that was never bound to a study (the study was refused during set-up)."""
        self.inbox.put(("stop",))
        self.proc.join(10.0)

    def close(self, timeout: float = 300.0) -> dict[str, Any]:
        """Stop the writer once it has written every trial; its timings (epoch seconds, `_writer_main`), or {}."""
        self.inbox.put(("stop",))
        stats: dict[str, Any] = {}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                stats = self.done.get(timeout=0.2)
                break
            except queue_mod.Empty:
                if not self.proc.is_alive():  # it ended without its timings (it failed: exitcode below)
                    with contextlib.suppress(queue_mod.Empty):
                        stats = self.done.get_nowait()
                    break
        self.proc.join(timeout)
        # End the inbox's feeder thread now: while it lives it holds one of the queue's semaphores, which a driver
        # that leaves with os._exit would then leave registered (a "leaked semaphore" warning at exit).
        self.inbox.close()
        self.inbox.join_thread()
        self.done.close()
        if self.proc.exitcode not in (0, None):
            raise RuntimeError(f"study writer exited with code {self.proc.exitcode}")
        return self._raise_refusal(stats)


#: the writer `launch_writer` started ahead of the study (taken by `_Mirror.for_storage`)
_LAUNCHED: _Mirror | None = None


def launch_writer() -> None:
    """Start a study writer's process now, before the storage is known: ``tuner study`` calls this first thing,
    so the writer's imports (Optuna, SQLAlchemy, Alembic: a second or two on a busy host) overlap the driver's own
    start-up instead of ending after it. One never taken dies with this process (a daemon, and it exits when its
    parent is gone)."""
    global _LAUNCHED
    if _LAUNCHED is None:
        _LAUNCHED = _Mirror(None)
