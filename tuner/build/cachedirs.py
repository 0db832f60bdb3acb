"""The folders tuner and CuPy cache compiled kernels in, made writable before anything compiles.

Two caches live under the user's home by default: tuner's (`tuner_root`: compiled configs, ceilings, listings of
valid sets, loaded recordings) and CuPy's kernel cache (``CUPY_CACHE_DIR``, else ``~/.cupy/kernel_cache``). CuPy
makes its folder when it is first imported and raises there when it cannot, so a home that cannot be written (a
container's, a service account's) would end every command that touches CuPy in a traceback. `ensure_writable`
checks both folders by making them and writing a file in each; one that fails is replaced, for this process and
every process it starts afterwards (GPU workers, the study's writer, Ray's workers inherit the environment), by a
folder of this user's under the temporary folder, and one line on stderr says so, once.

Only the standard library is imported: the command line calls this before anything heavy.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

from tuner.build.files import folder_fault
from tuner.core.errors import InputError

__all__ = ["cupy_root", "ensure_writable", "tuner_root"]

#: the environment variable that names each cache, as its owner reads it
TUNER_VAR = "TUNER_CACHE_DIR"
CUPY_VAR = "CUPY_CACHE_DIR"

#: the variables `ensure_writable` has checked, or set, in this process
_checked: set[str] = set()


def tuner_root() -> Path:
    """``$TUNER_CACHE_DIR``, else ``$XDG_CACHE_HOME/tuner``, else ``~/.cache/tuner`` (a folder in the temporary
    folder where the user has no home)."""
    root = os.environ.get(TUNER_VAR)
    if root:
        return Path(root)
    try:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    except RuntimeError:  # no HOME and no password entry
        base = os.path.join(tempfile.gettempdir(), f"tuner-{os.getuid()}")
    return Path(base) / "tuner"


def cupy_root() -> Path:
    """The folder CuPy's kernel cache will use: ``$CUPY_CACHE_DIR``, else ``~/.cupy/kernel_cache`` (CuPy's own
    default, read the way CuPy reads it)."""
    return Path(os.environ.get(CUPY_VAR) or os.path.expanduser("~/.cupy/kernel_cache"))


def _fault(folder: Path) -> str | None:
    """Why `folder` cannot hold a cache (the OS's words), or None when a file can be written in it or, where it
    does not exist yet, in its nearest existing parent (which is where it would be made: nothing is created here,
    so a command that fails on bad input leaves no cache folder behind). A probe file is the only test that holds
    for root and read-only mounts alike (`os.access` says yes to root on a folder it cannot write)."""
    here = folder
    try:  # a folder on the way that cannot be searched (a home of mode 000) raises here, as a fault of `folder`
        while not here.exists() and here.parent != here:
            here = here.parent
        if not here.is_dir():
            return "Not a directory"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return folder_fault(here)


def _private_temp_root() -> Path:
    """This user's folder under the temporary folder, made private. One that another user made or can write
    is not used (a cache there could hand us their binaries): a fresh folder is made instead."""
    uid = os.getuid()
    root = Path(tempfile.gettempdir()) / f"tuner-{uid}"
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        info = root.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == uid and not info.st_mode & 0o022:
            return root
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix=f"tuner-{uid}-"))


def ensure_writable(cupy_only: bool = False) -> None:
    """Make sure tuner's cache folder (unless `cupy_only`) and CuPy's can be written; replace each that cannot by
    a folder under the temporary folder, through its environment variable (``TUNER_CACHE_DIR``,
    ``CUPY_CACHE_DIR``), and say so in one line on stderr. Each folder is checked once per process. An InputError
    when no temporary folder can be written either."""
    wanted = [(CUPY_VAR, cupy_root, "cupy")]
    if not cupy_only:
        wanted.insert(0, (TUNER_VAR, tuner_root, "tuner"))
    moved: list[tuple[str, Path, Path, str]] = []  # (variable, folder, replacement, why)
    for var, root_of, name in wanted:
        if var in _checked:
            continue
        _checked.add(var)
        folder = root_of()
        fault = _fault(folder)
        if fault is None:
            continue
        try:
            fallback = _private_temp_root() / name
        except OSError as exc:  # tempfile found no writable temporary folder at all
            raise InputError(
                f"cache folder {folder} cannot be written ({fault}), nor a temporary folder ({exc})"
            ) from None
        if (again := _fault(fallback)) is not None:
            raise InputError(f"cache folder {folder} cannot be written ({fault}), nor {fallback} ({again})")
        os.environ[var] = str(fallback)
        moved.append((var, folder, fallback, fault))
    if moved:
        plural = "s" if len(moved) > 1 else ""
        folders = " and ".join(str(folder) for _, folder, _, _ in moved)
        why = "; ".join(dict.fromkeys(fault for *_, fault in moved))
        instead = " and ".join(str(fallback) for _, _, fallback, _ in moved)
        names = " or ".join(var for var, *_ in moved)
        print(
            f"tuner: cache folder{plural} {folders} cannot be written ({why}); caching in {instead} instead "
            f"(set {names} to choose)",
            file=sys.stderr,
        )
