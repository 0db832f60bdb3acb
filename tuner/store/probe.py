"""Whether a study can write its trials to a storage, found out before anything is measured.

`check_storage` refuses a storage the study could not write: a SQLite file must be writable (its folder for
SQLite's journal and WAL files, the file itself with a real write, rolled back), or creatable (the nearest folder
that exists takes a file); a URL that opens it read-only is refused; any other database is connected to and runs a
transaction. Each failure is an `InputError`: one line naming the storage (`storage_label`) and the fault. Nothing
is left behind: the write is rolled back, a folder is tested with a probe file that is removed. A storage that
passed is not probed again in the same process (``tuner study`` checks before its GPU workers start, the driver
again while it sets up).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tuner.build.files import folder_fault
from tuner.core.errors import InputError
from tuner.store.dbfiles import (
    SQLITE_CANTOPEN,
    SQLITE_READONLY,
    check_contents,
    is_busy,
    plain_sqlite_file,
    sqlite_code,
)

#: SQLITE_READONLY_DIRECTORY (an extended code): the database's folder cannot be written, so neither can its
#: journal or WAL file
SQLITE_READONLY_DIRECTORY = 1544

#: storage URLs that passed `check_storage` in this process: process-wide, a cache of a probe of the storage
#: (the machine's), not of any study's state
_WRITABLE: set[str] = set()


def storage_label(url: str, given: bool) -> str:
    """How a message names the storage: ``--storage X`` for one the user gave (X: a SQLite URL's file, any other
    URL without its password), the file and "the default storage" otherwise (the user gave no flag to blame)."""
    file = plain_sqlite_file(url)
    if file is None and "://" in url and not url.startswith("sqlite"):
        from sqlalchemy.engine import make_url

        shown = make_url(url).render_as_string(hide_password=True)
    else:
        shown = str(file) if file is not None else url
    if given:
        return f"--storage {shown}"
    return f"{shown} (the default storage, under {Path.cwd()}; --storage chooses another)"


def check_storage(url: str, given: bool = True) -> Path | None:
    """Refuse a storage the study could not write its trials to, before anything is measured. Returns the
    storage's SQLite file (which may not exist yet), None for another database. Writes nothing (see the module
    docstring). `given`: whether the user named it (``--storage``), for the message."""
    label = storage_label(url, given)
    try:
        path = check_contents(url)
    except InputError as exc:
        if given:
            raise
        raise InputError(exc.message.removeprefix("--storage: "), label) from None  # no flag to blame
    if url in _WRITABLE:
        return path
    if path is None:
        _probe_server(url, label)
    else:
        _refuse_read_only_url(url, label)
        if path.exists():
            _probe_file(path, label)
        else:
            _probe_new_file(path, label, given)
    _WRITABLE.add(url)
    return path


def _refuse_read_only_url(url: str, label: str) -> None:
    """A SQLite URL whose query opens the file read-only (``mode=ro``, ``immutable=1``)."""
    if "?" not in url:
        return
    from sqlalchemy.engine import make_url

    query = make_url(url).query  # SQLite's URI options, where ``uri=true`` passes them on
    if query.get("mode") == "ro" or query.get("immutable") in ("1", "true"):
        raise InputError(
            "the URL opens the database read-only (mode=ro or immutable=1); a study writes its trials there", label
        )


def _probe_new_file(path: Path, label: str, given: bool) -> None:
    """A database to be created: a storage the user named must be in a folder that exists (a mistyped folder is
    refused, not made); the default one's folders are made as needed, so the nearest folder that exists must take
    a file."""
    parent = folder = path.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(f"cannot create the database: {folder} is not a folder", label)
    if given and folder != parent:
        raise InputError(f"cannot create the database: folder {parent} does not exist (make it first)", label)
    fault = folder_fault(folder)
    if fault is not None:
        raise InputError(f"cannot create the database: folder {folder} cannot be written ({fault})", label)


def _probe_file(path: Path, label: str) -> None:
    """An existing database: its folder takes a file (SQLite's journal and WAL files), and the file a write, in
    a transaction that is rolled back. A database another process is writing now is writable."""
    if not path.is_file():
        raise InputError("is not a regular file", label)
    folder = path.absolute().parent
    fault = folder_fault(folder)
    if fault is not None:
        raise InputError(
            f"folder {folder} cannot be written ({fault}); SQLite keeps the database's journal and WAL files beside it",
            label,
        )
    from urllib.parse import quote

    try:
        uri = f"file:{quote(str(path.resolve()))}?mode=rw"  # never creates: the file is there
        conn = sqlite3.connect(uri, uri=True, timeout=1.0, isolation_level=None)
    except sqlite3.Error as exc:
        raise InputError(f"cannot open the database for writing ({exc})", label) from None
    try:
        conn.execute("BEGIN")
        conn.execute("CREATE TABLE tuner_write_probe (x INTEGER)")
    except sqlite3.Error as exc:
        if not is_busy(exc):  # busy: another process is writing it, so it can be written
            raise InputError(_write_fault(exc), label) from None
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()


def _write_fault(exc: sqlite3.Error) -> str:
    """SQLite's refusal to write, in words, decided by its result code."""
    if getattr(exc, "sqlite_errorcode", None) == SQLITE_READONLY_DIRECTORY:
        return f"its folder cannot be written ({exc})"
    code = sqlite_code(exc)
    if code == SQLITE_READONLY:
        return f"read-only database: it can be read, not written ({exc})"
    if code == SQLITE_CANTOPEN:
        return f"cannot open the database's journal for writing ({exc})"
    return f"cannot write to the database ({exc})"


def _probe_server(url: str, label: str) -> None:
    """A database server: connect and run a transaction, rolled back (wrong host, credentials, database or
    driver show up here, not after the first trials)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            transaction = conn.begin()
            conn.execute(sa.text("SELECT 1"))
            transaction.rollback()
    except Exception as exc:  # SQLAlchemyError, or a driver's own error on connect; all mean "cannot use it"
        text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        raise InputError(f"cannot connect: {text[0][:200] if text else type(exc).__name__}", label) from None
    finally:
        engine.dispose()
