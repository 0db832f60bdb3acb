"""Writing files so that readers never see half of one: `check_writable` before any work, `atomic_write` to put
the bytes in place (a temporary file beside the target, then `os.replace`), `locked` to let one process at a time
fill a cache entry. Used by the results stage and the compile cache alike.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from tuner.core.errors import InputError

__all__ = ["atomic_write", "check_writable", "folder_fault", "locked"]


def folder_fault(folder: str | Path) -> str | None:
    """Why no file can be made in `folder` (the OS's words), or None. A probe file, made and removed at once: the
    only test that holds for root and read-only mounts alike (`os.access` says yes to root on a folder no file can
    be made in, such as /proc)."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".tuner-probe-")
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(probe)
    return None


def check_writable(path: str | Path, suffixes: Sequence[str] | None = None, what: str = "output") -> Path:
    """The path, once it is known that a file can be written there (its folder exists and is writable, it is not
    a folder) and, where `suffixes` are given, that its suffix is one of them. Else InputError. Nothing is
    left behind: the folder is tried with a probe file (`folder_fault`)."""
    path = Path(path)
    if suffixes is not None and path.suffix.lower() not in suffixes:
        raise InputError(f"{what} {path}: expected a {' or '.join(suffixes)} file")
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise InputError(f"{what} {path}: is a directory")
    if not parent.is_dir():
        raise InputError(f"{what} {path}: no such directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{what} {path}: directory {parent} is not writable")
    if (fault := folder_fault(parent)) is not None:
        raise InputError(f"{what} {path}: directory {parent} is not writable ({fault})")
    return path


def atomic_write(path: str | Path, data: bytes | str, *, make_parents: bool = False) -> Path:
    """Write `data` to a temporary file beside `path`, then `os.replace` it into place: readers see the old file
    or the whole new one. `make_parents` creates missing folders first (a cache); otherwise the folder must
    exist. InputError when the folder cannot be written."""
    path = Path(path)
    if make_parents:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create {path.parent}: {exc.strerror}") from None
    path = check_writable(path)
    payload = data.encode() if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot write {path}: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold an exclusive `fcntl.flock` on `path` (created, with its folders, if missing) for the block: two
    processes filling the same cache entry take turns, and the second finds the first's result."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InputError(f"cannot lock {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
