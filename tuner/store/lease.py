"""One driver per study, enforced by a lease held in the study's own storage.

Two drivers on one study would each fail the other's RUNNING trials as leftovers of a crash, measure the same
configs twice and point ``duplicate_of`` at trials of another sampler's numbering. So a driver claims the study
before it touches any trial: one row in the table ``tuner_leases`` of the same database (the primary key makes
the claim atomic on SQLite and on a database server shared by several hosts). The row names the holder (host,
pid, start time). A second driver is refused with that name; it takes the lease over by itself when the holder
ran on the same host and is no longer alive (a killed driver), and with ``--takeover`` otherwise (a holder on
another host that crashed).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from tuner.core.errors import InputError

TABLE = "tuner_leases"


def _table():
    import sqlalchemy as sa

    metadata = sa.MetaData()
    return sa.Table(
        TABLE,
        metadata,
        sa.Column("study_name", sa.String(512), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started", sa.Float, nullable=False),
        sa.Column("token", sa.String(64), nullable=False),
    )


@dataclass
class Lease:
    """A held claim on one study. `release()` drops it (only if it is still ours)."""

    url: str
    study_name: str
    token: str
    took_over: dict[str, Any] | None = None

    def release(self) -> None:
        import sqlalchemy as sa

        table = _table()
        engine = sa.create_engine(self.url)
        try:
            with engine.begin() as conn:
                conn.execute(table.delete().where(table.c.study_name == self.study_name, table.c.token == self.token))
        finally:
            engine.dispose()


def _process_start(pid: int) -> float | None:
    """Wall-clock start time of a local process (Linux /proc), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _alive(pid: int, started: float) -> bool:
    """Whether the local process `pid` that took a lease at `started` still runs (not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    began = _process_start(pid)
    # A process that began after the lease was taken is another one under a recycled pid.
    return began is None or began <= started + 1.0


def holder_text(row) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.started))
    return f"pid {row.pid} on {row.host} since {when}"


def _cannot_write(study_name: str, url: str, exc: BaseException) -> InputError:
    """The one-line refusal for a storage that the lease cannot be written to (decided by SQLite's code)."""
    from tuner.store.dbfiles import is_read_only

    if is_read_only(exc):
        return InputError(f"study {study_name!r}: read-only database: its lease and trials cannot be written", url)
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return InputError(f"study {study_name!r}: cannot write its lease: {text[0] if text else type(exc).__name__}", url)


def acquire(url: str, study_name: str, takeover: bool = False, pid: int | None = None) -> Lease:
    """Claim `study_name` in the storage at `url` for the process `pid` (default: this one; the study's writer
    claims a new study for its driver), or raise InputError naming the holder."""
    import sqlalchemy as sa
    from sqlalchemy.exc import IntegrityError, OperationalError

    from tuner.store.dbfiles import create_storage, is_busy, sqlite_code

    table = _table()
    token = uuid.uuid4().hex
    me = {
        "study_name": study_name,
        "host": socket.gethostname(),
        "pid": pid or os.getpid(),
        "started": time.time(),
        "token": token,
    }
    engine = sa.create_engine(url)
    try:
        try:
            create_storage(lambda: table.metadata.create_all(engine))
        except OperationalError as exc:
            raise _cannot_write(study_name, url, exc) from None
        for _ in range(3):
            try:
                with engine.begin() as conn:
                    conn.execute(table.insert().values(**me))
                return Lease(url, study_name, token)
            except IntegrityError:
                pass
            except OperationalError as exc:
                # Busy: another driver is claiming at this moment. Any other SQLite fault (a read-only file, ...)
                # is no one's claim, and another attempt would not mend it; another database's errors carry no
                # SQLite code and are taken for contention, as ever.
                if sqlite_code(exc) is not None and not is_busy(exc):
                    raise _cannot_write(study_name, url, exc) from None
                time.sleep(0.2)
                continue
            with engine.connect() as conn:
                row = conn.execute(table.select().where(table.c.study_name == study_name)).first()
            if row is None:
                continue  # released in between: try again
            stale = row.host == me["host"] and not _alive(row.pid, row.started)
            if not (stale or takeover):
                raise InputError(
                    f"study {study_name!r} is being run by {holder_text(row)}; one driver per study (a second "
                    f"would measure configs twice). If that run is gone, rerun with --takeover",
                    url,
                )
            with engine.begin() as conn:
                gone = conn.execute(
                    table.delete().where(table.c.study_name == study_name, table.c.token == row.token)
                ).rowcount
                if gone:
                    conn.execute(table.insert().values(**me))
                    return Lease(url, study_name, token, took_over=dict(row._mapping))  # noqa: SLF001 - SQLAlchemy's public Row API
        raise InputError(f"study {study_name!r}: another driver is claiming it at this moment; try again", url)
    finally:
        engine.dispose()
