"""Finding and opening stored studies to read them, never creating a database.

A STUDY argument (``tuner best``, ``pareto``, ``export``, ``trials``, ``dashboard``, ``--warm-start``) names a study,
a kernel (→ ``studies/KERNEL.db``), a database file or a storage URL; `open_studies` finds what it names and opens
it with Optuna, after a read-only look at a SQLite file (`get_storage`), so a missing file is never created and a
foreign one never gets Optuna's tables. `study_url` gives the storage URL behind a study opened here. Bad input (an
unknown study or database, an empty one) raises `InputError` with a one-line message.
"""

from __future__ import annotations

import sqlite3
import weakref
from pathlib import Path

import optuna

from tuner.core.errors import InputError
from tuner.store.dbfiles import DB_SUFFIXES, STUDIES_DIR, file_url, sqlite_path, storage_url

#: storage URL of each study `open_studies` returned (Optuna keeps its storage private): process-wide, a weak
#: side table of the study objects themselves, gone with each of them
_URLS: weakref.WeakKeyDictionary[optuna.Study, str] = weakref.WeakKeyDictionary()


# ---------------------------------------------------------------------------------------------------------------
# Opening studies


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (its type's name where it has none), for a one-line message."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _as_url(storage: str) -> str:
    """A ``--storage`` value as a URL (`tuner.store.dbfiles.storage_url`), a path turned into the URL of its
    absolute path."""
    url = storage_url(storage)  # the form is checked as a study's --storage is
    return url if "://" in storage or not url.startswith("sqlite:///") else _file_url(storage)


def _file_url(path: str) -> str:
    """The URL of the SQLite file at `path` (one found or named as STUDY), by its absolute path."""
    return file_url(str(Path(path).resolve()))


def _check_database(url: str) -> None:
    """For a SQLite URL: the file must exist and hold Optuna's tables. Checked read-only, before Optuna (which
    would create a missing file, or its tables in a foreign one) connects."""
    path = sqlite_path(url, in_memory_ok=True)
    if path is None:
        return
    if not path.is_file():
        raise InputError(f"no such database: {path}")
    try:
        conn = sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)
        try:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise InputError(f"{path}: not a SQLite database ({first_line(exc)})") from None
    if not {"studies", "trials"} <= tables:
        raise InputError(f"{path}: not an Optuna study database (no studies/trials tables)")


def databases() -> list[Path]:
    """The default storage: every ``*.db`` under `STUDIES_DIR` (relative to the working directory), sorted."""
    return sorted(STUDIES_DIR.glob("*.db"))


def _listing(names: list[str], limit: int = 8) -> str:
    """Names for a one-line message: all of them, or the first `limit` and how many more."""
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _find_in_default_storage(name: str) -> str:
    """The URL of the database under `STUDIES_DIR` that holds study `name` (else a study of kernel `name`).
    InputError naming the studies that are there when none does, or the databases when several do."""
    exact: list[str] = []
    by_kernel: list[str] = []
    known: list[str] = []
    for url, rdb in storages(None):
        for s in rdb.get_all_studies():
            known.append(s.study_name)
            if s.study_name == name:
                exact.append(url)
            elif s.user_attrs.get("kernel") == name and url not in by_kernel:
                by_kernel.append(url)
    hits = exact or by_kernel
    if len(hits) == 1:
        return hits[0]
    if hits:
        paths = ", ".join(str(sqlite_path(u, in_memory_ok=True)) for u in hits)
        raise InputError(f"study {name!r} is in several databases ({paths}); choose one with --storage")
    raise InputError(
        f"unknown study {name!r}: not in {STUDIES_DIR}/*.db (there: {_listing(known)}); "
        "give a database path or --storage URL (`tuner studies` lists them)"
    )


def _locate(study: str | None, storage: str | None) -> tuple[str, str | None]:
    """(storage URL, the study or kernel name to look for in it, or None for all of it).

    A bare name without `storage` is looked for in the default storage: `studies/<name>.db` when that file
    exists (a kernel's database), else every database under `studies/` (a study's own name, else its kernel)."""
    if storage:
        # With a storage, STUDY is a name in it, whatever it ends with: a replay's default name ends in ".db".
        # A URL cannot be a name; a file given twice is told apart once the name is not found (`open_studies`).
        if study and "://" in study:
            raise InputError(f"give the database either as STUDY ({study}) or as --storage ({storage}), not both")
        return _as_url(storage), study or None
    if study is None:
        dbs = databases()
        if len(dbs) == 1:
            return _file_url(str(dbs[0])), None
        found = ", ".join(p.stem for p in dbs) or "none"
        raise InputError(f"name a study, a kernel or a database (in {STUDIES_DIR}/: {found})")
    if "://" in study:
        return study, None
    if Path(study).is_file():
        return _file_url(study), None
    by_kernel = STUDIES_DIR / f"{study}.db"
    if by_kernel.is_file():
        return _file_url(str(by_kernel)), study
    if study.endswith(DB_SUFFIXES) or "/" in study:
        # Not a file: a path that is not there, or a study's name that ends like one (a replay's default name
        # ends in ".db"); the name is looked for before the path is called missing.
        try:
            return _find_in_default_storage(study), study
        except InputError:
            raise InputError(
                f"no such database: {Path(study).resolve()} (nor a study of that name in {STUDIES_DIR}/*.db)"
            ) from None
    return _find_in_default_storage(study), study


def get_storage(url: str) -> optuna.storages.RDBStorage:
    """An RDB storage for `url`, checked first so that opening never creates a database file."""
    _check_database(url)
    from sqlalchemy.exc import SQLAlchemyError

    try:
        return optuna.storages.RDBStorage(url)
    except (SQLAlchemyError, RuntimeError, ValueError) as exc:  # driver, URL and Optuna schema-version errors
        raise InputError(f"cannot open storage {url}: {first_line(exc)}") from None


def resolve_storage(study: str | None, storage: str | None) -> tuple[str, str | None]:
    """The storage URL that `study`/`storage` name (checked: it exists and is an Optuna database) and the study
    or kernel name to look for in it (None: all of it)."""
    url, name = _locate(study, storage)
    _check_database(url)
    return url, name


def open_studies(study: str | None, storage: str | None = None) -> list[optuna.Study]:
    """Every study that `study` names, oldest first.

    `study` may be a study name (→ that study), a kernel name (→ `studies/<kernel>.db` and its studies of that
    kernel), a path to a ``.db`` file or a storage URL (→ all of its studies), or None with `storage` (→ all
    of it). A name without `storage` is looked up in the default storage (every ``studies/*.db``, see
    `_locate`). Raises InputError for a missing database, a database with no studies, or an
    unknown name. Never creates a database.
    """
    url, name = _locate(study, storage)
    rdb = get_storage(url)
    summaries = sorted(rdb.get_all_studies(), key=lambda s: rdb.get_study_id_from_name(s.study_name))
    if not summaries:
        raise InputError(f"{url}: holds no studies")
    chosen = summaries
    if name is not None:
        exact = [s for s in summaries if s.study_name == name]
        by_kernel = [s for s in summaries if s.user_attrs.get("kernel") == name]
        db = sqlite_path(url, in_memory_ok=True)
        if exact:
            chosen = exact
        elif by_kernel:
            chosen = by_kernel
        elif db is not None and db.stem == name and not any("kernel" in s.user_attrs for s in summaries):
            chosen = summaries  # studies/<kernel>.db written before studies carried a "kernel" attr
        elif storage and Path(name).is_file():
            raise InputError(f"give the database either as STUDY ({name}) or as --storage ({storage}), not both")
        else:
            known = _listing([s.study_name for s in summaries])
            raise InputError(f"unknown study {name!r} in {url} (it holds: {known})")
    opened = [optuna.load_study(study_name=s.study_name, storage=rdb) for s in chosen]
    for one in opened:
        _URLS[one] = url
    return opened


def open_study(study: str | None, storage: str | None = None) -> optuna.Study:
    """The one study that `study` names: as `open_studies`, and of several the latest (highest id)."""
    return open_studies(study, storage)[-1]


def storages(storage: str | None) -> list[tuple[str, optuna.storages.RDBStorage]]:
    """(URL, storage) of `storage`, or of every study database under `STUDIES_DIR` when None (files there
    that are not study databases are skipped; a `storage` given is checked: InputError)."""
    if storage is not None:
        url = _as_url(storage)
        return [(url, get_storage(url))]
    found = []
    for db in databases():
        url = _as_url(str(db))
        try:
            found.append((url, get_storage(url)))
        except InputError:
            continue
    return found


def study_names(storage: str | None = None) -> list[str]:
    """The names of the studies in `storage`, or in the default storage when None (see `storages`)."""
    return [s.study_name for _, rdb in storages(storage) for s in rdb.get_all_studies()]


def study_url(study: optuna.Study) -> str:
    """The URL of the storage behind a study that `open_studies` (or `tuner.results.studies.list_studies`) returned.
    InputError for another study."""
    url = _URLS.get(study)
    if url is None:
        raise InputError(f"study {study.study_name}: its storage is unknown (open it with open_studies)")
    return url


def remember_url(study: optuna.Study, url: str) -> None:
    """Record that `study` was opened from the storage at `url` (for `study_url`)."""
    _URLS[study] = url
