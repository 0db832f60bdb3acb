"""What the tuner may do to the SQLite files it is given: read inputs without writing, create storage only for a
study about to start.

A replay recording is an input: it is checked with a read-only SQLite connection and opened through a read-only
URL, so a wrong file (empty, another program's database) is refused without a byte written to it. A storage
file that exists must already be an Optuna database (or be empty); anything else is refused before Optuna adds
its tables. In-memory SQLite is refused: the study's writer runs in another process and would see another
database. Creating a new database from several processes at once is retried, since Optuna's schema set-up is
not atomic (two creators race on the ``alembic_version`` row).
"""

from __future__ import annotations

import contextlib
import random
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from tuner.core.errors import InputError

if TYPE_CHECKING:
    from optuna.storages import RDBStorage

#: tables every complete Optuna RDB storage has
OPTUNA_TABLES = frozenset({"studies", "trials", "alembic_version"})
#: every table an Optuna RDB storage (schema v12), the lease table or SQLite itself may add; a database being
#: created by another process at this moment holds a subset of them
KNOWN_TABLES = OPTUNA_TABLES | {
    "study_directions",
    "study_user_attributes",
    "study_system_attributes",
    "trial_user_attributes",
    "trial_system_attributes",
    "trial_params",
    "trial_values",
    "trial_intermediate_values",
    "trial_heartbeats",
    "version_info",
    "tuner_leases",
    "sqlite_sequence",
}


def plain_sqlite_file(url: str) -> Path | None:
    """The file of a plain ``sqlite:///PATH`` URL (nothing to decode, not in memory) as SQLAlchemy's URL parser
    gives it, without importing SQLAlchemy (a third of a second or more that a study's set-up would otherwise
    wait for); None for any other URL, which the parser must read."""
    plain = url.removeprefix("sqlite:///")
    if plain != url and plain not in ("", ":memory:") and not plain.startswith("file:") and not set("?%#") & set(plain):
        return Path(plain)
    return None


#: the names a database file given as a path may end in
DB_SUFFIXES = (".db", ".sqlite", ".sqlite3")
#: what a ``--storage`` value must be, for the message that refuses one
STORAGE_FORMS = (
    "a SQLAlchemy URL (DIALECT://..., e.g. sqlite:///studies/x.db, or sqlite:////abs/x.db for an absolute path) "
    "or a path to a database file (.db, .sqlite or .sqlite3)"
)
#: the start of a URL (a scheme and its colon), with or without the slashes that must follow
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


#: the folder of the default storage, relative to the working directory: a study of KERNEL goes to
#: ``studies/KERNEL.db`` when no storage is given, and a bare name is looked for in ``studies/*.db``
STUDIES_DIR = Path("studies")


def default_storage_url(kernel: str) -> str:
    """Where a study of `kernel` is stored when no storage is given: ``sqlite:///studies/KERNEL.db``, relative to
    the working directory (`STUDIES_DIR`)."""
    return f"sqlite:///{STUDIES_DIR}/{kernel}.db"


def study_storage_url(storage: str | None, kernel: str) -> str:
    """The storage URL of a study of `kernel`: `storage_url` of the ``--storage`` given, else the default
    (`default_storage_url`). Every command and the API decide a study's storage here."""
    return default_storage_url(kernel) if storage is None else storage_url(storage)


def storage_url(storage: str) -> str:
    """The SQLAlchemy URL of a ``--storage`` value: a URL (``sqlite:///studies/x.db``, ``postgresql://...``) as
    given, a path to a database file (``studies/x.db``; `DB_SUFFIXES`) as the URL of that SQLite file, relative
    where the path is. Anything else is an InputError naming the forms expected (`STORAGE_FORMS`): the empty
    string, a folder, a scheme without its slashes (``sqlite:/x.db``), a path of another kind of file (a typo
    would otherwise become a new database of that name)."""
    if not storage.strip():
        raise InputError(f"--storage '': names no database; give {STORAGE_FORMS}")
    if "://" in storage or storage == ":memory:":
        return storage
    if _SCHEME.match(storage):
        raise InputError(f"--storage {storage}: not a URL (a URL's scheme is followed by //); give {STORAGE_FORMS}")
    if Path(storage).is_dir():
        raise InputError("--storage: is a directory, not a database file", storage)
    if not storage.lower().endswith(DB_SUFFIXES):
        raise InputError(f"--storage {storage!r}: not a database file's name; give {STORAGE_FORMS}")
    return file_url(storage)


def file_url(path: str) -> str:
    """The SQLAlchemy URL of the SQLite file at `path` (relative where the path is). A path with characters a
    URL reserves (``?``, ``%``, ``#``) is escaped by SQLAlchemy's own URL builder."""
    if not set("?%#") & set(path):
        return f"sqlite:///{path}"
    from sqlalchemy.engine import URL

    return URL.create("sqlite", database=path).render_as_string(hide_password=False)


def sqlite_path(url: str, *, in_memory_ok: bool = False) -> Path | None:
    """The file behind a ``sqlite:///PATH`` URL; None for other databases. An in-memory URL is an InputError (a
    study's would vanish with its writer process), or None with `in_memory_ok` (reading: there is no file)."""
    if not url.startswith("sqlite:"):
        return None
    if (plain := plain_sqlite_file(url)) is not None:
        return plain
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise InputError(f"--storage {url}: not a database URL ({exc})") from None
    database = parsed.database or ""
    if database in ("", ":memory:") or parsed.query.get("mode") == "memory":
        if in_memory_ok:
            return None
        raise InputError(
            f"--storage {url}: an in-memory database would vanish with the study's writer process; "
            f"give a file (sqlite:///PATH)"
        )
    if database.startswith("file:"):
        database = database.removeprefix("file:").split("?", 1)[0]
    return Path(database)


def _readonly_uri(path: Path) -> str:
    """A SQLite URI that reads `path` without writing or creating anything. Without a -wal file beside it the
    database is whole in its main file, and ``immutable=1`` keeps SQLite from creating -wal/-shm files just to
    read it; with one, the WAL holds committed pages that must be read (``mode=ro``)."""
    uri = f"file:{quote(str(path.resolve()))}?mode=ro"
    if not Path(f"{path}-wal").exists():
        uri += "&immutable=1"
    return uri


@contextlib.contextmanager
def connect_readonly(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to the SQLite file `path` (`_readonly_uri`: nothing is written or created), closed
    after the block."""
    conn = sqlite3.connect(_readonly_uri(path), uri=True)
    try:
        yield conn
    finally:
        conn.close()


def tables(path: Path, what: str) -> set[str]:
    """The table names of a SQLite file, read through a read-only connection. Not SQLite: an InputError."""
    uri = _readonly_uri(path)
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{what}: cannot read as a study database: not a SQLite database ({exc})", str(path)) from None
    return {name for (name,) in rows}


def check_contents(url: str) -> Path | None:
    """Refuse a storage that is in memory, or a SQLite file that holds something other than Optuna studies.
    Writes nothing. Returns the file of a SQLite storage (which may not exist yet)."""
    path = sqlite_path(url)
    if path is None:
        import sqlalchemy

        try:  # loads the dialect and its driver; connects to nothing
            sqlalchemy.create_engine(url).dispose()
        except Exception as exc:  # ArgumentError, NoSuchModuleError, ImportError of the driver, ...
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            raise InputError(f"--storage {url}: cannot open: {first}") from None
        return None
    if path.is_dir():
        raise InputError("--storage: is a directory, not a database file", str(path))
    if path.exists() and path.stat().st_size > 0:
        found = tables(path, "--storage")
        if found - KNOWN_TABLES:
            others = ", ".join(sorted(found - KNOWN_TABLES)[:5])
            raise InputError(
                f"--storage: holds tables that are not an Optuna study's ({others}); refusing to add "
                f"Optuna's tables to it",
                str(path),
            )
    return path


def readonly_url(path: str) -> str:
    """A read-only SQLAlchemy URL for a recorded study (a SQLite file, after checking it is an Optuna database
    with a read-only connection); a URL of another database is returned as given."""
    if "://" in path and not path.startswith("sqlite:"):
        return path
    file = sqlite_path(path) if "://" in path else Path(path)
    assert file is not None  # a URL here starts with sqlite:, and sqlite_path names its file or raises
    if not file.exists():
        raise InputError("replay file not found", path)
    if not file.is_file():
        raise InputError("replay file is not a file", path)
    found = tables(file, "replay file")
    if not OPTUNA_TABLES <= found:
        raise InputError("replay file: cannot read as a study database: no Optuna tables in it", path)
    return f"sqlite:///{_readonly_uri(file)}&uri=true"


class WalConnection(sqlite3.Connection):
    """A SQLite connection in write-ahead-log mode with ``synchronous=NORMAL`` from its first statement: a commit
    appends to the log without waiting for the disk (a crash of the process loses nothing committed; a power
    cut may lose the last commits, never the file). Passed as ``connect_args={"factory": WalConnection}`` so the
    storage's very creation runs this way too: Optuna's schema set-up and a new study's attributes took ~120
    fsyncs in the default rollback-journal mode, 9 in this one (~10 ms each on a slow disk)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.execute("PRAGMA journal_mode=WAL")
        self.execute("PRAGMA synchronous=NORMAL")


def sqlite_engine_kwargs(url: str) -> dict:
    """SQLAlchemy `create_engine` keywords for a storage URL: WAL connections for SQLite, nothing otherwise."""
    return {"connect_args": {"factory": WalConnection}} if url.startswith("sqlite") else {}


# SQLite's primary result codes (https://sqlite.org/rescode.html): the low byte of `sqlite3.Error.sqlite_errorcode`
SQLITE_PERM = 3
SQLITE_BUSY = 5
SQLITE_LOCKED = 6
SQLITE_READONLY = 8
SQLITE_CANTOPEN = 14
SQLITE_NOTADB = 26
#: faults that another attempt cannot mend (a read-only file, one that cannot be opened or is not a database)
PERMANENT = frozenset({SQLITE_PERM, SQLITE_READONLY, SQLITE_CANTOPEN, SQLITE_NOTADB})


def sqlite_code(exc: BaseException) -> int | None:
    """SQLite's primary result code behind `exc` (a `sqlite3.Error`, or a SQLAlchemy error wrapping one in
    ``orig``); None for an error of another database, or none of SQLite's."""
    code = getattr(getattr(exc, "orig", None) or exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def is_busy(exc: BaseException) -> bool:
    """Whether `exc` is SQLite saying that another connection holds the database at this moment."""
    return sqlite_code(exc) in (SQLITE_BUSY, SQLITE_LOCKED)


def is_read_only(exc: BaseException) -> bool:
    """Whether `exc` is SQLite refusing to write a database that it can read."""
    return sqlite_code(exc) == SQLITE_READONLY


def create_storage(make, attempts: int = 8):
    """Call `make()` (which builds an Optuna RDBStorage), retrying when another process is creating the same new
    database at the same moment: Optuna's schema set-up then fails with a unique-constraint or lock error. A
    fault that no retry mends (`PERMANENT`: a read-only file, ...) is raised at once."""
    from sqlalchemy.exc import IntegrityError, OperationalError

    for attempt in range(attempts):
        try:
            return make()
        except (IntegrityError, OperationalError) as exc:
            if attempt == attempts - 1 or sqlite_code(exc) in PERMANENT:
                raise
            time.sleep(0.05 + random.random() * 0.15 * (attempt + 1))
    raise AssertionError("unreachable")


def open_storage(url: str) -> RDBStorage:
    """An Optuna RDBStorage; SQLite gets WAL from its first connection (`WalConnection`), so the
    storage's creation and the writer's commits stay cheap. Errors are InputErrors."""
    import optuna

    path = check_contents(url)
    if path is not None:
        if path.parent and not path.parent.exists():
            try:
                path.parent.mkdir(parents=True)
            except OSError as exc:
                raise InputError(f"--storage {url}: cannot create {path.parent}: {exc.strerror}") from None
    try:
        storage = create_storage(
            lambda: optuna.storages.RDBStorage(url, engine_kwargs=sqlite_engine_kwargs(url), heartbeat_interval=None)
        )
    except Exception as exc:  # SQLAlchemy raises ArgumentError/OperationalError/...; all mean "cannot open"
        first = str(exc).strip().splitlines()[0][:200]
        if is_read_only(exc):
            raise InputError(f"--storage {url}: read-only database: it can be read, not written ({first})") from None
        raise InputError(f"--storage {url}: cannot open: {first}") from None
    return storage
