"""Opening studies and choosing their trials: the first room of the results stage.

`open_studies` finds a study in any storage (a study or kernel name under `studies/`, a .db path, a storage URL)
without ever creating a database; `measured_trials`, `pareto_trials`, `best_trial` and `finalist` choose trials
by the rules below; `study_context` rebuilds what rendering a trial's config needs, and `gpu_facts` the facts of
the GPU the study ran on. Everything reads a study that `tuner/study/driver.py` wrote (its user attrs: `StudyAttr`;
per trial: `TrialAttr` and every field of a Measurement). Which trials count:

- **measured**: state COMPLETE and no "failure" user attr;
- **original**: no "duplicate_of" user attr (a duplicate re-proposed a measured config and was answered from it
  without GPU time; it must not show up twice in a front or be exported as if measured);
- **feasible**: every Optuna constraint <= 0 and the "constraint" user attr (its mirror), where present, <= 0;
- **best**: best for the study's first objective and its direction (`goal`, `tuner.objective.Goal`): the shortest
  time of a time-only study (one imported from a Kernel Tuner cache), the highest throughput of a throughput one.

Bad input (an unknown study or database, an empty study) raises `InputError` with a one-line message.
"""

from __future__ import annotations

import json
import shlex
import sqlite3
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import InputError
from tuner.gpufacts import GpuFacts
from tuner.objective import Goal, figure, goal_of, has_throughput
from tuner.result import StudyAttr, TrialAttr
from tuner.results.dbfiles import sqlite_path

if TYPE_CHECKING:
    from tuner.build.render import Source

STUDIES_DIR = Path("studies")
"""Where `tuner study` puts `<kernel>.db` by default (relative to the working directory, like its URL)."""
#: endings of a STUDY argument that, naming no file and no study, is reported as a missing database
DB_SUFFIXES = (".db", ".sqlite", ".sqlite3")

#: storage URL of each study `open_studies` returned (Optuna keeps its storage private)
_URLS: weakref.WeakKeyDictionary[optuna.Study, str] = weakref.WeakKeyDictionary()


# ---------------------------------------------------------------------------------------------------------------
# Opening studies


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _as_url(storage: str) -> str:
    """A ``--storage`` value as a URL (`tuner.results.dbfiles.storage_url`), a path turned into the URL of its
    absolute path."""
    from tuner.results.dbfiles import storage_url

    url = storage_url(storage)  # the form is checked as a study's --storage is
    return url if "://" in storage or not url.startswith("sqlite:///") else _file_url(storage)


def _file_url(path: str) -> str:
    """The URL of the SQLite file at `path` (one found or named as STUDY), by its absolute path."""
    from tuner.results.dbfiles import file_url

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
        raise InputError(f"{path}: not a SQLite database ({_first_line(exc)})") from None
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
    for url, rdb in _storages(None):
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
        raise InputError(f"cannot open storage {url}: {_first_line(exc)}") from None


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


def _storages(storage: str | None) -> list[tuple[str, optuna.storages.RDBStorage]]:
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
    """The names of the studies in `storage`, or in the default storage when None (see `_storages`)."""
    return [s.study_name for _, rdb in _storages(storage) for s in rdb.get_all_studies()]


def list_studies(storage: str | None = None) -> list[dict[str, Any]]:
    """One row per study in `storage` (a URL or .db path), or in the default storage (every `databases()`
    file) when None: name, kernel, problem, gpu, trials (all states), measured, objective and direction (the
    study's first, `goal`), best (that objective's figure of `best_trial`, re-timed where the study re-timed it;
    None with nothing measured), unit (the figure's), last_change (the
    latest start or end of a trial, ISO 8601; None for an empty study), storage (its URL). Oldest first per
    storage. InputError for a `storage` that is missing or not a study database; files under `studies/`
    that are not study databases are skipped."""
    rows: list[dict[str, Any]] = []
    for url, rdb in _storages(storage):
        summaries = sorted(rdb.get_all_studies(), key=lambda s: rdb.get_study_id_from_name(s.study_name))
        for summary in summaries:
            study = optuna.load_study(study_name=summary.study_name, storage=rdb)
            _URLS[study] = url
            rows.append(_study_row(study, url))
    return rows


def _study_row(study: optuna.Study, url: str) -> dict[str, Any]:
    trials = study.get_trials(deepcopy=False)
    attrs = study.user_attrs
    target = goal(study)
    best = None
    measured = [t for t in trials if is_measured(t) and not is_duplicate(t) and is_feasible(t)]
    if measured:
        top = best_trial(study)
        final = finalist(study, top.number)
        best = target.value(final) if final is not None else None
        best = best if best is not None else objective_value(study, top, target)
    stamps = [d for t in trials for d in (t.datetime_start, t.datetime_complete) if d is not None]
    return {
        "name": study.study_name,
        "kernel": attrs.get("kernel"),
        "problem": (attrs.get("problem") or {}).get("name"),
        "gpu": attrs.get("gpu"),
        "trials": len(trials),
        "measured": len(measured),
        "objective": target.metric,
        "direction": "minimize" if target.minimize else "maximize",
        "best": best,
        "unit": target.unit,
        "last_change": max(stamps).isoformat(timespec="seconds") if stamps else None,
        "storage": url,
    }


def artifact_dir_for(url: str) -> Path | None:
    """Default artifact folder of a storage: `<db stem>.artifacts/` next to a SQLite file; None otherwise."""
    path = sqlite_path(url, in_memory_ok=True)
    return None if path is None else path.with_name(f"{path.stem}.artifacts")


def storage_url(study: optuna.Study) -> str:
    """The URL of the storage behind a study that `open_studies` returned. InputError for another study."""
    url = _URLS.get(study)
    if url is None:
        raise InputError(f"study {study.study_name}: its storage is unknown (open it with open_studies)")
    return url


def gpu_facts(study: optuna.Study) -> GpuFacts:
    """The facts of the GPU the study ran on (its "gpu_facts" attr); for a study recorded before studies stored
    them, `tuner.gpufacts.DEFAULT` (H100/H200), whose `measured` is False."""
    return GpuFacts.from_dict(study.user_attrs.get(StudyAttr.GPU_FACTS))


# ---------------------------------------------------------------------------------------------------------------
# Which trials count

# Which trials count


def is_measured(trial: FrozenTrial) -> bool:
    """COMPLETE, verified and timed (no "failure" attr)."""
    return trial.state == TrialState.COMPLETE and TrialAttr.FAILURE not in trial.user_attrs


def is_duplicate(trial: FrozenTrial) -> bool:
    """Answered from an earlier trial of the same config ("duplicate_of"), without GPU time."""
    return trial.user_attrs.get(TrialAttr.DUPLICATE_OF) is not None


def is_feasible(trial: FrozenTrial) -> bool:
    """Every Optuna constraint ≤ 0, and the "constraint" mirror, where present, ≤ 0."""
    mirrored = trial.user_attrs.get(TrialAttr.CONSTRAINT)
    return all(c <= 0.0 for c in trial.constraints.values()) and (mirrored is None or float(mirrored) <= 0.0)


def measured_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Measured, original, feasible trials, in trial order. InputError when there are none."""
    trials = study.get_trials(deepcopy=False)
    if not trials:
        raise InputError(f"study {study.study_name} is empty: it has no trials")
    kept = [t for t in trials if is_measured(t) and not is_duplicate(t) and is_feasible(t)]
    if not kept:
        states = _state_counts(trials)
        raise InputError(f"study {study.study_name} has no completed, verified trials ({states})")
    return kept


def _state_counts(trials: Iterable[FrozenTrial]) -> str:
    counts: dict[str, int] = {}
    for t in trials:
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def throughput_unit(study: optuna.Study) -> str:
    """ "TB/s" or "TFLOP/s": what the study's throughput means ("ms" for a family without one, such as a kernel
    imported from a Kernel Tuner cache)."""
    return str(study.user_attrs.get("throughput_unit") or "TB/s")


def replay_only(study: optuna.Study) -> bool:
    """Whether the study's kernel has no template (a kernel known only from a Kernel Tuner cache, family
    ``kt``): its configs cannot be rendered, compiled or exported, only replayed."""
    from tuner import kernels

    attrs = study.user_attrs
    ref = str(attrs.get(StudyAttr.FAMILY) or attrs.get("kernel") or "")
    if ref.startswith(kernels.SPACE_PREFIX):
        return False
    try:
        return not kernels.get(ref).template
    except KeyError:
        return False


def goal(study: optuna.Study) -> Goal:
    """The study's first objective, its direction and unit (`tuner.objective.Goal`): what "best" means for it.
    From the study's metric names and directions; for a study stored without metric names, its "objectives"
    user attr; else throughput, maximized."""
    names = study.metric_names
    if names:
        directions = [d.name.lower() for d in study.directions]
        return goal_of(list(zip(names, directions, strict=False)), throughput_unit(study))
    return goal_of(study.user_attrs.get("objectives"), throughput_unit(study))


def objective_value(study: optuna.Study, trial: FrozenTrial, target: Goal | None = None) -> float | None:
    """The trial's figure for the study's first objective (`target`, default `goal(study)`); None where the
    trial has none."""
    target = target or goal(study)
    value = target.value(trial.user_attrs)
    if value is None and trial.values and trial.user_attrs.get(target.key) is None:
        return float(trial.values[0])
    return value


def throughput(study: optuna.Study, trial: FrozenTrial) -> float | None:
    """The trial's throughput in the study's unit; None for a study without one (a replay-only family) and for
    a trial whose bytes or FLOPs were not recorded."""
    unit = throughput_unit(study)
    if not has_throughput(unit):
        return None
    names = study.metric_names or []
    if "throughput" in names and trial.values is not None:
        return figure({"tbps": trial.values[names.index("throughput")]}, "tbps")
    return figure(trial.user_attrs, "tflops" if unit == "TFLOP/s" else "tbps")


def finalist(study: optuna.Study, number: int) -> dict[str, Any] | None:
    """The re-timed figures of trial `number` when the study re-timed it at the end (user attr "finalists",
    written by the driver with a longer budget than screening), else None."""
    for entry in study.user_attrs.get(StudyAttr.FINALISTS) or []:
        if entry.get("trial") == number and "median_ms" in entry:
            return entry
    return None


def best_trial(study: optuna.Study) -> FrozenTrial:
    """The best measured, original, feasible trial for the study's first objective and its direction (`goal`):
    the fastest for a time or throughput objective. Where the study re-timed its best configs at the end, the
    best by those figures (the screening order can differ by noise). InputError when there is none."""
    measured = measured_trials(study)
    target = goal(study)
    by_number = {t.number: t for t in measured}
    retimed = [
        f
        for f in study.user_attrs.get(StudyAttr.FINALISTS) or []
        if f.get("trial") in by_number and target.value(f) is not None
    ]
    if retimed:
        return by_number[min(retimed, key=lambda f: target.rank(target.value(f)))["trial"]]
    return min(measured, key=lambda t: (target.rank(objective_value(study, t, target)), t.number))


def pareto_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Optuna's own Pareto front (`study.best_trials`, constraint-aware) minus what must not be there: failed or
    unverified trials, duplicates and infeasible ones. Best first (by `goal`). InputError when nothing is
    measured."""
    measured = measured_trials(study)  # raises for an empty study or one with nothing measured
    if len(study.directions) == 1:
        # A one-objective search: the front of that objective against registers and SMEM over every measured trial.
        front = _front(study, measured)
    else:
        front = [t for t in study.best_trials if is_measured(t) and not is_duplicate(t) and is_feasible(t)]
    target = goal(study)
    return sorted(front, key=lambda t: (target.rank(objective_value(study, t, target)), t.number))


def _front(study: optuna.Study, trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """Trials no other trial beats on the study's objective, registers and SMEM at once (ties on all three: the
    first)."""
    target = goal(study)
    points = [
        (
            target.rank(objective_value(study, t, target)),
            t.user_attrs.get("registers") or 0,
            t.user_attrs.get("smem_bytes") or 0,
        )
        for t in trials
    ]
    front, seen = [], set()
    for i, p in enumerate(points):
        dominated = any(all(a <= b for a, b in zip(q, p, strict=True)) and q != p for q in points)
        if not dominated and p not in seen:
            seen.add(p)
            front.append(trials[i])
    return front


# ---------------------------------------------------------------------------------------------------------------
# The space and sources behind a study


@dataclass
class StudyContext:
    """What rendering a study's configs needs: its family, its problem, and its space when the file is still
    there and unchanged (`space_note` says why not, otherwise)."""

    kernel: str
    family: Any
    problem: Any
    space: Any = None
    space_note: str = ""


def study_context(study: optuna.Study) -> StudyContext:
    """Family and problem from the study's user attrs; the space from "space_path" (as given, else relative to
    the package root) when its sha256 matches "space_hash" and the family's template matches "templates_hash"
    (so a source rendered now is the one that was measured). InputError when the attrs are missing."""
    from tuner import families, kernels
    from tuner.build.render import templates_hash
    from tuner.space import space as space_mod

    attrs = study.user_attrs
    kernel = attrs.get("kernel")
    ref = str(attrs.get(StudyAttr.FAMILY) or kernel)  # a name, or space:PATH for a family a space file defines
    if ref not in kernels.names() and not ref.startswith(kernels.SPACE_PREFIX):
        raise InputError(
            f"study {study.study_name}: user attr 'kernel' is {kernel!r}, not one of "
            f"{', '.join(kernels.names())} (was it written by `tuner study`?)"
        )
    problem_attr = attrs.get("problem")
    if not isinstance(problem_attr, dict) or not isinstance(problem_attr.get("sizes"), dict):
        raise InputError(f"study {study.study_name}: user attr 'problem' (name, dtype, sizes) is missing")
    problem = space_mod.Problem(
        name=str(problem_attr.get("name", "problem")),
        dtype=str(problem_attr.get("dtype", "float32")),
        sizes={k: int(v) for k, v in problem_attr["sizes"].items()},
        gpu=gpu_facts(study),
    )
    ctx = StudyContext(kernel=str(kernel), family=families.get(ref), problem=problem)
    space_path = attrs.get("space_path")
    if not space_path:
        ctx.space_note = "the study does not name its space file"
        return ctx
    candidates = [space_mod.resolve_path(space_path), space_mod.PACKAGE_ROOT / space_path]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        ctx.space_note = f"space file {space_path} not found"
        return ctx
    space = space_mod.load(path)
    recorded = str(attrs.get("space_hash") or "")
    if recorded and space.content_hash() != recorded:
        ctx.space_note = f"space file {path} changed since the study ran (sha256 differs from 'space_hash')"
        return ctx
    recorded = str(attrs.get(StudyAttr.TEMPLATES_HASH) or "")
    if recorded and templates_hash(ctx.family) != recorded:
        ctx.space_note = (
            f"kernel template {ctx.family.template} changed since the study ran (sha256 differs from 'templates_hash')"
        )
        return ctx
    ctx.space = space
    return ctx


def render_trial(ctx: StudyContext, trial: FrozenTrial) -> Source:
    """The rendered `Source` of a trial's config. InputError when the space is unavailable (see
    `ctx.space_note`)."""
    from tuner.build.render import render

    if ctx.space is None:
        raise InputError(f"cannot render trial {trial.number}: {ctx.space_note}")
    params = {name: trial.params[name] for name in ctx.space.params if name in trial.params}
    return render(ctx.family, params, ctx.space.resolve(params, ctx.problem), ctx.problem.env)


def _space_argument(space_path: str, space_hash: str) -> str:
    """How a command names a study's space: a shipped space by its name (which resolves from any directory)
    when the study was run on that very file (same sha256), any other space by its path as recorded."""
    from tuner.space import space as space_mod

    path = Path(space_path)
    shipped = space_mod.SPACES_DIR / path.name
    if path.suffix in (".yaml", ".yml") and path.parent.name == "search_spaces" and shipped.is_file():
        if not space_hash or space_mod.load(shipped).content_hash() == space_hash:
            return path.stem
    return space_path


def render_command(study: optuna.Study, trial: FrozenTrial) -> str:
    """The `tuner render` command line that prints a trial's source."""
    attrs = study.user_attrs
    problem = (attrs.get("problem") or {}).get("name")
    words = [
        "tuner",
        "render",
        _space_argument(
            str(attrs.get("space_path") or attrs.get("kernel") or "SPACE"), str(attrs.get("space_hash") or "")
        ),
    ]
    if problem:
        words += ["--problem", str(problem)]
    for name, value in trial.params.items():
        text = json.dumps(value) if isinstance(value, bool) else str(value)
        words += ["--set", f"{name}={text}"]
    return shlex.join(words)


def derived(trial: FrozenTrial) -> dict[str, Any]:
    """The derived values the driver recorded for a trial's config (empty where it recorded none)."""
    value = trial.user_attrs.get(TrialAttr.DERIVED)
    return dict(value) if isinstance(value, dict) else {}


def threads(trial: FrozenTrial) -> int | None:
    """Threads per block of a trial's config: its derived "threads", else the threads of the main launch its
    measurement reported (`Measurement.threads_per_block`, for a family that derives none, such as a declarative
    one); None where neither was recorded."""
    value = derived(trial).get("threads", trial.user_attrs.get("threads"))
    if value is None:
        value = trial.user_attrs.get("threads_per_block") or None  # 0: a measurement from before the field
    return int(value) if value is not None else None
