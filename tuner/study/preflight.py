"""What a study must pass before its first config is measured: a name that every command can open it by, a
storage it can write, and trials left to run.

The driver (`tuner.study.driver.Driver`, which the CLI and `tuner.study(...)` both build) runs these checks while it
sets up, before a pool, a GPU worker or the study's writer is given any work; ``tuner study`` runs the quick ones
again before it starts its GPU workers. Each failure is an `InputError`: one line naming the storage (or the name)
and the fault. Nothing here leaves a trace.

* `check_study_name`: non-empty, printable, no path separator, not a flag. Every command that takes a study
  reads its STUDY argument as a study's name, a kernel's, or a database's path; a name with a ``/`` would be
  read as a path, and one that starts with ``-`` as a flag.
* the storage: `tuner.store.probe.check_storage` (writable, or creatable; answered once per process).
* `maybe_complete`: whether a study may already hold its trials, from a glance at its SQLite file
  (`tuner.store.schema.counted_trials`, the store's rule of which trials count), so that a study that is
  complete is said to be so before anything starts.
"""

from __future__ import annotations

from pathlib import Path

from tuner.core.errors import InputError
from tuner.store.dbfiles import plain_sqlite_file, study_storage_url
from tuner.store.schema import counted_trials, studies_of

#: the longest study name Optuna's schema and the lease table keep (``VARCHAR(512)``)
MAX_NAME = 512


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
# trials left to run


def complete_line(name: str, counted: int, trials: int, where: str) -> str:
    """The one line that says a study holds its trials already."""
    held = f"{counted} of {trials} trials" if counted == trials else f"{counted} trials (--trials {trials})"
    return f"study {name} is complete: {held} in {where}; nothing to run (a larger --trials adds more)"


def maybe_complete(storage: str | None, kernel: str, trials: int, study_name: str | None) -> bool:
    """Whether ``tuner study`` may find its study complete, from a glance at the SQLite file (no space loaded,
    no Optuna): study `study_name`, or else a study of `kernel` on this machine's GPU model
    (`tuner.space.discovery.local_gpu_model`), holds `trials` counted trials. True only says the driver's exact check
    (which knows the study's name and space) should run before GPU workers start; False costs nothing."""
    from tuner.gpu.discovery import local_gpu_model

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
    return [] if gpu is None else studies_of(path, kernel, gpu)
