"""What a study must pass before its first config is measured: a name that every command can open it by, a
storage it can write, and trials left to run.

The driver (`tuner.study.driver.Driver`, which the CLI and `tuner.study(...)` both build) runs these checks while it
sets up, before a pool, a GPU worker or the study's writer is given any work; ``tuner study`` runs the quick ones
again before it starts its GPU workers (each check is answered once per process). Each failure is an
`InputError`: one line naming the storage (or the name) and the fault. Nothing here leaves a trace: the storage
is probed with a write in a transaction that is rolled back, a folder with a probe file that is removed.

* `check_study_name`: non-empty, printable, no path separator, not a flag. Every command that takes a study
  reads its STUDY argument as a study's name, a kernel's, or a database's path; a name with a ``/`` would be
  read as a path, and one that starts with ``-`` as a flag.
* `check_storage`: a SQLite file is writable (its folder for SQLite's journal and WAL files, the file itself
  with a real write, rolled back), or can be created (the nearest folder that exists takes a file); a URL that
  opens it read-only is refused; any other database is connected to and runs a transaction.
* `counted_trials` / `maybe_complete`: how many trials of a study count towards ``--trials``, read from a SQLite
  file without Optuna, so that a study that already holds its trials is said to be complete before anything
  starts.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from tuner.build.files import folder_fault
from tuner.errors import InputError
from tuner.result import INTERRUPTED, TrialAttr
from tuner.results.dbfiles import SQLITE_CANTOPEN, SQLITE_READONLY, connect_readonly, is_busy, sqlite_code
from tuner.results.dbfiles import check_storage as check_contents

#: the longest study name Optuna's schema and the lease table keep (``VARCHAR(512)``)
MAX_NAME = 512
#: the user attr that marks a proposal answered without evaluation (`tuner.study.search.SCREENED`; not imported from
#: there: this module must stay cheap to import)
SCREENED = "screened"

#: SQLITE_READONLY_DIRECTORY (an extended code): the database's folder cannot be written, so neither can its
#: journal or WAL file
SQLITE_READONLY_DIRECTORY = 1544

#: storage URLs that passed `check_storage` in this process
_WRITABLE: set[str] = set()


# ---------------------------------------------------------------------------------------------------------------
# the study's name


def check_study_name(name: str | None) -> None:
    """Refuse a ``--study-name`` that a command could not open the study by again (see the module docstring).
    None (the default name, which is built from safe characters) passes."""
    if name is None:
        return
    if not name.strip():
        raise InputError(f"--study-name {name!r}: empty; give a name, or leave the flag out for the default one")
    if "/" in name or "\\" in name:
        raise InputError(
            f"--study-name {name!r}: holds a path separator; commands that take a study would read it as a "
            f"database's path"
        )
    if not name.isprintable():
        odd = next(c for c in name if not c.isprintable())
        raise InputError(f"--study-name {name!r}: holds a character that does not print ({odd!r})")
    if name.startswith("-"):
        raise InputError(f"--study-name {name!r}: starts with '-'; commands that take a study would read it as a flag")
    if len(name) > MAX_NAME:
        raise InputError(f"--study-name: {len(name)} characters; a study's name holds at most {MAX_NAME}")


# ---------------------------------------------------------------------------------------------------------------
# the storage


def storage_label(url: str, given: bool) -> str:
    """How a message names the storage: ``--storage X`` for one the user gave (X: a SQLite URL's file, any other
    URL without its password), the file and "the default storage" otherwise (the user gave no flag to blame)."""
    from tuner.results.dbfiles import plain_sqlite_file

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


# ---------------------------------------------------------------------------------------------------------------
# trials left to run


def counted_trials(path: Path, name: str) -> tuple[int, dict[str, Any]] | None:
    """(trials of study `name` that count towards ``--trials``, the study's user attrs) from the SQLite file
    `path`, read-only and without Optuna; None when the file or the study is not there. A trial counts when it
    finished and is neither a leftover of a killed driver ("interrupted") nor a proposal answered without
    evaluation ("screened"): the rule of `tuner.study.search.counts`."""
    if not path.is_file():
        return None
    try:
        with connect_readonly(path) as conn:
            row = conn.execute("SELECT study_id FROM studies WHERE study_name = ?", (name,)).fetchone()
            if row is None:
                return None
            (study_id,) = row
            attrs = {
                key: json.loads(value)
                for key, value in conn.execute(
                    'SELECT "key", value_json FROM study_user_attributes WHERE study_id = ?', (study_id,)
                )
            }
            (count,) = conn.execute(
                """SELECT COUNT(*) FROM trials t
                   WHERE t.study_id = ? AND t.state IN ('COMPLETE', 'PRUNED', 'FAIL')
                   AND NOT EXISTS (SELECT 1 FROM trial_user_attributes a WHERE a.trial_id = t.trial_id
                                   AND (a."key" = ? OR (a."key" = ? AND a.value_json = ?)))""",
                (study_id, SCREENED, TrialAttr.FAILURE, json.dumps(INTERRUPTED)),
            ).fetchone()
    except (sqlite3.Error, ValueError):  # not an Optuna database after all: the storage's own checks say so
        return None
    return int(count), attrs


def complete_line(name: str, counted: int, trials: int, where: str) -> str:
    """The one line that says a study holds its trials already."""
    held = f"{counted} of {trials} trials" if counted == trials else f"{counted} trials (--trials {trials})"
    return f"study {name} is complete: {held} in {where}; nothing to run (a larger --trials adds more)"


def maybe_complete(storage: str | None, kernel: str, trials: int, study_name: str | None) -> bool:
    """Whether ``tuner study`` may find its study complete, from a glance at the SQLite file (no space loaded,
    no Optuna): study `study_name`, or else a study of `kernel` on this machine's GPU model
    (`tuner.space.limits.local_gpu_model`), holds `trials` counted trials. True only says the driver's exact check
    (which knows the study's name and space) should run before GPU workers start; False costs nothing."""
    from tuner.results.dbfiles import plain_sqlite_file, study_storage_url
    from tuner.space.limits import local_gpu_model

    url = study_storage_url(storage, kernel)
    path = plain_sqlite_file(url)
    if path is None or not path.is_file():
        return False
    names = [study_name] if study_name else _names_on(path, kernel, local_gpu_model())
    for name in names:
        found = counted_trials(path, name)
        if found is not None and found[0] >= trials:
            return True
    return False


def _names_on(path: Path, kernel: str, gpu: str | None) -> list[str]:
    """The studies of `kernel` run on GPU model `gpu` in the SQLite file `path` (none where `gpu` is unknown)."""
    if gpu is None:
        return []
    try:
        with connect_readonly(path) as conn:
            rows = conn.execute(
                """SELECT s.study_name FROM studies s
                   JOIN study_user_attributes k ON k.study_id = s.study_id AND k."key" = 'kernel'
                   JOIN study_user_attributes g ON g.study_id = s.study_id AND g."key" = 'gpu'
                   WHERE k.value_json = ? AND g.value_json = ?""",
                (json.dumps(kernel), json.dumps(gpu)),
            ).fetchall()
    except sqlite3.Error:
        return []
    return [name for (name,) in rows]
