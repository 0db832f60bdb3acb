"""Results out of a study: the Pareto front (table, CSV/JSON, plot), the best config, a flat trials table, a
C++17 header for production builds, and artifacts (rendered CUDA and PTX) that optuna-dashboard shows per trial.

Everything here reads a study that `tuner/study.py` wrote (see its user attrs: "kernel", "problem", "gpu",
"arch", "space_path", "space_hash", "throughput_unit"; per COMPLETE trial: "uri", "tbps", "registers",
"smem_bytes", "derived", ...). Which trials count:

- **measured**: state COMPLETE and no "failure" user attr;
- **original**: no "duplicate_of" user attr (a duplicate re-proposed a measured config and was answered from it
  without GPU time; it must not show up twice in a front or be exported as if measured);
- **feasible**: every Optuna constraint ≤ 0 and the "constraint" user attr (its mirror), where present, ≤ 0.

Bad input (an unknown study or database, an empty study, an output path that cannot be written, a namespace that
is not a C++ identifier) raises `InputError` with a one-line message. Every file is written to a temporary name
in its directory and `os.replace`d into place, so an output is either whole or absent.

Optuna refuses to change a finished trial (``UpdateFinishedTrialError``), yet artifacts are attached after the
fact, so `attach_artifacts` writes the two trial attributes it needs ("artifacts:<id>" system attrs, the
"artifacts"/"constraint" user attrs) straight into the RDB storage's attribute tables, in Optuna's own format.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import os
import re
import shlex
import sqlite3
import tempfile
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import InputError
from tuner.expr import ceil_div

if TYPE_CHECKING:  # pandas is imported where it is used: it costs ~0.3 s at startup
    import pandas as pd

STUDIES_DIR = Path("studies")
"""Where `tuner study` puts `<kernel>.db` by default (relative to the working directory, like its URL)."""

# H100/H200 (sm_90) per-SM resources, for the occupancy budgets drawn on the Pareto plot.
SM_REGISTERS = 65_536
SM_SMEM_BYTES = 228 * 1024
BLOCK_SMEM_MAX_BYTES = 227 * 1024
SMEM_RESERVED_PER_BLOCK = 1024  # the driver keeps 1 KiB of every block's SMEM for itself on sm_80+
MAX_REGISTERS_PER_THREAD = 255
REGISTER_ALLOCATION_UNIT = 8  # registers per thread are allocated in steps of 8 (256 per warp)
MAX_WARPS_PER_SM = 64
RESIDENT_BLOCKS = (1, 2, 4, 8)
TYPICAL_THREADS = 256

PARETO_COLUMNS = ("throughput", "tbps", "tflops", "fraction_of_ceiling", "registers", "smem_bytes",
                  "spill_bytes", "blocks_per_sm", "warps_per_sm", "threads", "median_ms")


# ---------------------------------------------------------------------------------------------------------------
# Opening studies


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _as_url(storage: str) -> str:
    """A storage URL as given, or a path to a SQLite file turned into one."""
    if "://" in storage:
        return storage
    return f"sqlite:///{Path(storage).resolve()}"


def _sqlite_path(url: str) -> Path | None:
    """The file behind a sqlite URL (None for other backends and for in-memory databases)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise InputError(f"not a storage URL: {url!r} ({_first_line(exc)})") from None
    if not parsed.drivername.startswith("sqlite"):
        return None
    if not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def _check_database(url: str) -> None:
    """For a SQLite URL: the file must exist and hold Optuna's tables. Checked read-only, before Optuna (which
    would create a missing file, or its tables in a foreign one) connects."""
    path = _sqlite_path(url)
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


def _locate(study: str | None, storage: str | None) -> tuple[str, str | None]:
    """(storage URL, the study or kernel name to look for in it, or None for all of it)."""
    if storage:
        if study and (study.endswith(".db") or "://" in study):
            raise InputError(f"give the database either as STUDY ({study}) or as --storage ({storage}), "
                             "not both")
        return _as_url(storage), study or None
    if study is None:
        dbs = sorted(STUDIES_DIR.glob("*.db"))
        if len(dbs) == 1:
            return _as_url(str(dbs[0])), None
        found = ", ".join(p.stem for p in dbs) or "none"
        raise InputError(f"name a study, a kernel or a database (in {STUDIES_DIR}/: {found})")
    if "://" in study:
        return study, None
    if study.endswith((".db", ".sqlite", ".sqlite3")) or Path(study).is_file():
        return _as_url(study), None
    by_kernel = STUDIES_DIR / f"{study}.db"
    if by_kernel.is_file():
        return _as_url(str(by_kernel)), study
    by_prefix = STUDIES_DIR / f"{study.split('-')[0]}.db"  # study names start with the kernel: gemm-mnk4096_...
    if by_prefix.is_file():
        return _as_url(str(by_prefix)), study
    looked = by_kernel if by_kernel == by_prefix else f"{by_kernel} and no {by_prefix}"
    raise InputError(f"unknown study {study!r}: no {looked}; give a database path or --storage URL")


def get_storage(url: str) -> optuna.storages.RDBStorage:
    """An RDB storage for `url`, checked first so that opening never creates a database file."""
    _check_database(url)
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as exc:  # SQLAlchemy / driver / schema-version errors: all mean "cannot open this"
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
    of it). A study name without `storage` is looked up in `studies/<kernel>.db`, the kernel being the name's
    prefix before the first "-". Raises InputError for a missing database, a database with no studies, or an
    unknown name. Never creates a database.
    """
    url, name = _locate(study, storage)
    rdb = get_storage(url)
    summaries = sorted(rdb.get_all_studies(), key=lambda s: s._study_id)
    if not summaries:
        raise InputError(f"{url}: holds no studies")
    chosen = summaries
    if name is not None:
        exact = [s for s in summaries if s.study_name == name]
        by_kernel = [s for s in summaries if s.user_attrs.get("kernel") == name]
        db = _sqlite_path(url)
        if exact:
            chosen = exact
        elif by_kernel:
            chosen = by_kernel
        elif db is not None and db.stem == name and not any("kernel" in s.user_attrs for s in summaries):
            chosen = summaries  # studies/<kernel>.db written before studies carried a "kernel" attr
        else:
            known = ", ".join(s.study_name for s in summaries)
            raise InputError(f"unknown study {name!r} in {url} (it holds: {known})")
    return [optuna.load_study(study_name=s.study_name, storage=rdb) for s in chosen]


def open_study(study: str | None, storage: str | None = None) -> optuna.Study:
    """The one study that `study` names: as `open_studies`, and of several the latest (highest id)."""
    return open_studies(study, storage)[-1]


def artifact_dir_for(url: str) -> Path | None:
    """Default artifact folder of a storage: `<db stem>.artifacts/` next to a SQLite file; None otherwise."""
    path = _sqlite_path(url)
    return None if path is None else path.with_name(f"{path.stem}.artifacts")


def storage_url(study: optuna.Study) -> str:
    """The URL of the RDB storage behind `study`."""
    return str(_rdb(study).url)


def _rdb(study: optuna.Study) -> optuna.storages.RDBStorage:
    storage = study._storage
    inner = getattr(storage, "_backend", storage)  # optuna wraps an RDBStorage in a _CachedStorage
    if not isinstance(inner, optuna.storages.RDBStorage):
        raise InputError(f"study {study.study_name}: needs an RDB (SQLAlchemy) storage, "
                         f"not {type(inner).__name__}")
    return inner


# ---------------------------------------------------------------------------------------------------------------
# Which trials count


def is_measured(trial: FrozenTrial) -> bool:
    """COMPLETE, verified and timed (no "failure" attr)."""
    return trial.state == TrialState.COMPLETE and "failure" not in trial.user_attrs


def is_duplicate(trial: FrozenTrial) -> bool:
    """Answered from an earlier trial of the same config ("duplicate_of"), without GPU time."""
    return trial.user_attrs.get("duplicate_of") is not None


def is_feasible(trial: FrozenTrial) -> bool:
    """Every Optuna constraint ≤ 0, and the "constraint" mirror, where present, ≤ 0."""
    mirrored = trial.user_attrs.get("constraint")
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
    """"TB/s" or "TFLOP/s": what the study's throughput means."""
    return str(study.user_attrs.get("throughput_unit") or "TB/s")


def throughput(study: optuna.Study, trial: FrozenTrial) -> float:
    """The trial's throughput: the "throughput" objective where the study has one, else tbps/tflops by unit."""
    names = study.metric_names or []
    if "throughput" in names and trial.values is not None:
        return float(trial.values[names.index("throughput")])
    key = "tflops" if throughput_unit(study) == "TFLOP/s" else "tbps"
    value = trial.user_attrs.get(key)
    if value is not None:
        return float(value)
    return float(trial.values[0]) if trial.values else math.nan


def finalist(study: optuna.Study, number: int) -> dict[str, Any] | None:
    """The re-timed figures of trial `number` when the study re-timed it at the end (user attr "finalists",
    written by the driver with a longer budget than screening), else None."""
    for entry in study.user_attrs.get("finalists") or []:
        if entry.get("trial") == number and "tbps" in entry:
            return entry
    return None


def best_trial(study: optuna.Study) -> FrozenTrial:
    """The fastest measured, original, feasible trial. Where the study re-timed its fastest configs at the end,
    the fastest by those figures (the screening order can differ by noise); else the fastest by `throughput`.
    InputError when there is none."""
    measured = measured_trials(study)
    by_number = {t.number: t for t in measured}
    retimed = [f for f in study.user_attrs.get("finalists") or [] if "tbps" in f and f.get("trial") in by_number]
    if retimed:
        return by_number[retimed[0]["trial"]]  # the driver stores finalists fastest first
    return max(measured, key=lambda t: throughput(study, t))


def pareto_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Optuna's own Pareto front (`study.best_trials`, constraint-aware) minus what must not be there: failed or
    unverified trials, duplicates and infeasible ones. Fastest first. InputError when nothing is measured."""
    measured_trials(study)  # raises for an empty study or one with nothing measured
    front = [t for t in study.best_trials if is_measured(t) and not is_duplicate(t) and is_feasible(t)]
    if not front and len(study.directions) == 1:
        front = [best_trial(study)]  # the single best was a duplicate: its original ties with it
    return sorted(front, key=lambda t: (-throughput(study, t), t.number))


# ---------------------------------------------------------------------------------------------------------------
# Tables


def _derived(trial: FrozenTrial) -> dict[str, Any]:
    derived = trial.user_attrs.get("derived")
    return dict(derived) if isinstance(derived, dict) else {}


def _threads(trial: FrozenTrial) -> int | None:
    value = _derived(trial).get("threads", trial.user_attrs.get("threads"))
    return int(value) if value is not None else None


def trial_record(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
    """One measured trial as a flat dict: number, uri, params (under their own names), the metrics of
    `PARETO_COLUMNS` (None where the study did not record one)."""
    attrs = trial.user_attrs
    record: dict[str, Any] = {"number": trial.number, "uri": attrs.get("uri", "")}
    for name, value in trial.params.items():
        record[name if name not in PARETO_COLUMNS and name not in record else f"param_{name}"] = value
    record["throughput"] = throughput(study, trial)
    for key in PARETO_COLUMNS[1:]:
        record[key] = _threads(trial) if key == "threads" else attrs.get(key)
    return record


def pareto_frame(study: optuna.Study) -> pd.DataFrame:
    """The Pareto front as a DataFrame, fastest first: number, uri, each param, then `PARETO_COLUMNS`.
    ``frame.attrs`` carries the study name, GPU and throughput unit."""
    import pandas as pd

    frame = pd.DataFrame([trial_record(study, t) for t in pareto_trials(study)])
    frame.attrs.update(study=study.study_name, gpu=study.user_attrs.get("gpu", ""), unit=throughput_unit(study))
    return frame


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}", inner, out)
    else:
        out[prefix] = value


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """Every trial, one row each: Optuna's `trials_dataframe` (number, values_<metric>, datetimes, duration,
    params_<name>, state) with the user attrs under their own names, nested dicts flattened with dots
    (``derived.threads``, ``clocks.sm_mhz``, ``versions.cupy``), plus "constraint" (the largest Optuna
    constraint, where the trial has one and no mirror attr) and "feasible". InputError for an empty study."""
    import pandas as pd

    trials = study.get_trials(deepcopy=False)
    if not trials:
        raise InputError(f"study {study.study_name} is empty: it has no trials")
    base = study.trials_dataframe(
        attrs=("number", "value", "datetime_start", "datetime_complete", "duration", "params", "state"))
    rows = []
    for t in trials:
        row: dict[str, Any] = {}
        for key, value in t.user_attrs.items():
            _flatten(key, value, row)
        if "constraint" not in row:
            row["constraint"] = max(t.constraints.values()) if t.constraints else None
        row["feasible"] = is_feasible(t)
        rows.append(row)
    extra = pd.DataFrame(rows, index=base.index)
    clash = [c for c in extra.columns if c in base.columns]
    extra = extra.rename(columns={c: f"user_attrs_{c}" for c in clash})
    return pd.concat([base, extra], axis=1)


# ---------------------------------------------------------------------------------------------------------------
# Writing files


def check_writable(path: str | Path, suffixes: Sequence[str] | None = None, what: str = "output") -> Path:
    """The path, once it is known that a file can be written there (its folder exists and is writable, it is not
    a folder) and, where `suffixes` are given, that its suffix is one of them. Else InputError. Nothing is
    created."""
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
    return path


def atomic_write(path: str | Path, data: bytes | str) -> Path:
    """Write `data` to a temporary file beside `path`, then `os.replace` it into place: readers see the old file
    or the whole new one. InputError when the folder cannot be written."""
    path = check_writable(path)
    payload = data.encode() if isinstance(data, str) else data
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.",
                                   suffix=".tmp")
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


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


def write_pareto(study: optuna.Study, path: str | Path) -> Path:
    """The Pareto front as CSV (one row per trial, `pareto_frame`) or JSON ({"study", "gpu", "arch",
    "throughput_unit", "problem", "trials": [{number, uri, params: {...}, metrics...}]})."""
    path = check_writable(path, (".csv", ".json"), "--out")
    if path.suffix.lower() == ".csv":
        return atomic_write(path, pareto_frame(study).to_csv(index=False))
    trials = []
    for t in pareto_trials(study):
        record = trial_record(study, t)
        record = {"number": record["number"], "uri": record["uri"], "params": dict(t.params),
                  **{k: record[k] for k in PARETO_COLUMNS}}
        trials.append(record)
    attrs = study.user_attrs
    doc = {"study": study.study_name, "gpu": attrs.get("gpu"), "arch": attrs.get("arch"),
           "throughput_unit": throughput_unit(study), "problem": attrs.get("problem"), "trials": trials}
    return atomic_write(path, json.dumps(doc, indent=2, default=_json_default) + "\n")


def write_trials(study: optuna.Study, path: str | Path) -> Path:
    """`trials_frame` as CSV or Parquet (columns of mixed types are written as JSON text in Parquet)."""
    path = check_writable(path, (".csv", ".parquet"), "--out")
    frame = trials_frame(study)
    if path.suffix.lower() == ".csv":
        return atomic_write(path, frame.to_csv(index=False))
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise InputError("--out .parquet needs pyarrow (pip install pyarrow); or write .csv") from None
    def missing(v: Any) -> bool:
        return v is None or (isinstance(v, float) and math.isnan(v))

    for col in frame.columns:
        if frame[col].dtype == object:
            kinds = {type(v) for v in frame[col] if not missing(v)}
            if len(kinds) > 1 or kinds & {list, tuple, dict}:
                frame[col] = [None if missing(v) else json.dumps(v, default=_json_default) for v in frame[col]]
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    return atomic_write(path, buf.getvalue())


# ---------------------------------------------------------------------------------------------------------------
# The Pareto plot


def register_budget(threads: int, blocks: int) -> int:
    """The most registers per thread that let `blocks` blocks of `threads` threads reside on one SM (65,536
    registers per SM, allocated per warp in steps of 8 per thread), capped at 255."""
    warps = -(-threads // 32)
    per_thread = SM_REGISTERS // (blocks * warps * 32)
    return min(MAX_REGISTERS_PER_THREAD, per_thread // REGISTER_ALLOCATION_UNIT * REGISTER_ALLOCATION_UNIT)


def smem_budget(blocks: int) -> int:
    """The most SMEM bytes per block that let `blocks` blocks reside on one SM (228 KiB per SM, 1 KiB of it
    reserved per block, at most 227 KiB per block)."""
    return min(BLOCK_SMEM_MAX_BYTES, SM_SMEM_BYTES // blocks - SMEM_RESERVED_PER_BLOCK)


def plot_pareto(study: optuna.Study, path: str | Path) -> Path:
    """Draw throughput against registers/thread and against SMEM bytes/block (each colored by the other), every
    measured original trial as a dot and the Pareto trials ringed, with dashed lines at the register and SMEM
    budgets that allow 1, 2, 4 and 8 resident blocks per SM on H100/H200 (65,536 registers, 228 KiB SMEM per
    SM). The register budget depends on the block size: the lines are drawn for the fastest config's threads per
    block (its derived "threads"; 256 where the study did not record it), which the panel title states. Budgets
    far right of the data are listed in the panel instead of stretching its axis.

    Writes a PNG, or for ``.html`` a small page with the PNG inline (base64) and the Pareto table.
    """
    path = check_writable(path, (".png", ".html"), "--plot")
    png = _pareto_png(study)
    if path.suffix.lower() == ".png":
        return atomic_write(path, png)
    table = pareto_frame(study).to_html(index=False, float_format=lambda x: f"{x:.4g}", border=0)
    title = f"{study.study_name}: Pareto front"
    page = (
        "<!doctype html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{_html_escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:12px}"
        "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}</style></head><body>\n"
        f"<h1>{_html_escape(title)}</h1>\n"
        f"<img alt=\"Pareto plot\" src=\"data:image/png;base64,{base64.b64encode(png).decode()}\">\n"
        f"{table}\n</body></html>\n"
    )
    return atomic_write(path, page)


def _html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _pareto_png(study: optuna.Study) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    trials = measured_trials(study)
    front = pareto_trials(study)
    unit = throughput_unit(study)
    fastest = front[0]
    threads = _threads(fastest) or TYPICAL_THREADS
    threads_note = "the fastest config's" if _threads(fastest) else "typical; not recorded"

    def column(ts: list[FrozenTrial], key: str) -> list[float]:
        return [float(t.user_attrs.get(key) or 0) for t in ts]

    y_all, y_front = [throughput(study, t) for t in trials], [throughput(study, t) for t in front]
    regs, smem = column(trials, "registers"), column(trials, "smem_bytes")
    smem_kib = [v / 1024 for v in smem]
    panels = [
        ("registers", regs, column(front, "registers"), smem_kib, "SMEM KiB/block",
         "registers / thread", [(k, register_budget(threads, k)) for k in RESIDENT_BLOCKS],
         f"lines: registers for 1/2/4/8 blocks/SM at {threads} threads/block ({threads_note})", ""),
        ("smem", smem_kib, [v / 1024 for v in column(front, "smem_bytes")], regs, "registers/thread",
         "SMEM KiB / block", [(k, smem_budget(k) / 1024) for k in RESIDENT_BLOCKS],
         "lines: SMEM/block for 1/2/4/8 blocks/SM (228 KiB/SM, 1 KiB reserved/block)", " KiB"),
    ]
    fig = Figure(figsize=(13, 5.2), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    ceiling = fastest.user_attrs.get("ceiling_tbps") if unit == "TB/s" else None
    for ax, (_, xs, xs_front, colors, color_label, xlabel, budgets, note, budget_unit) in zip(axes, panels,
                                                                                              strict=True):
        points = ax.scatter(xs, y_all, c=colors, cmap="viridis", s=28, alpha=0.85, linewidths=0, zorder=2)
        fig.colorbar(points, ax=ax, label=color_label, pad=0.01)
        ax.scatter(xs_front, y_front, s=130, facecolors="none", edgecolors="crimson", linewidths=1.8, zorder=3,
                   label=f"Pareto front ({len(front)})")
        hi = max(max(xs, default=0.0) * 1.25, min(b for _, b in budgets) * 1.1, 1.0)
        off_scale = []
        for k, budget in budgets:
            if budget <= hi:
                ax.axvline(budget, color="0.45", linestyle="--", linewidth=1, zorder=1)
                ax.annotate(f"{k} blk/SM", (budget, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                            ha="right", va="top", fontsize=8, color="0.3")
            else:
                off_scale.append(f"{k} blk ≤ {budget:g}{budget_unit}")
        if off_scale:
            note += "\noff scale: " + ", ".join(off_scale)
        if ceiling:
            ax.axhline(float(ceiling), color="tab:orange", linestyle=":", linewidth=1.2,
                       label=f"copy ceiling {float(ceiling):.2f} TB/s")
        ax.set_xlim(0, hi)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"throughput ({unit})")
        ax.set_title(note, fontsize=9)
        ax.grid(alpha=0.25)
        ax.legend(loc="best", fontsize=8, framealpha=0.85)
    gpu = study.user_attrs.get("gpu", "")
    fig.suptitle(f"{study.study_name} — {len(trials)} measured configs, {gpu}; best "
                 f"{fastest.user_attrs.get('uri', '')} {throughput(study, fastest):.3g} {unit}", fontsize=11)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


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
    from tuner import kernels
    from tuner import space as space_mod
    from tuner.render import TEMPLATES_DIR

    attrs = study.user_attrs
    kernel = attrs.get("kernel")
    if kernel not in kernels.names():
        raise InputError(f"study {study.study_name}: user attr 'kernel' is {kernel!r}, not one of "
                         f"{', '.join(kernels.names())} (was it written by `tuner study`?)")
    problem_attr = attrs.get("problem")
    if not isinstance(problem_attr, dict) or not isinstance(problem_attr.get("sizes"), dict):
        raise InputError(f"study {study.study_name}: user attr 'problem' (name, dtype, sizes) is missing")
    problem = space_mod.Problem(name=str(problem_attr.get("name", "problem")),
                                dtype=str(problem_attr.get("dtype", "float32")),
                                sizes={k: int(v) for k, v in problem_attr["sizes"].items()})
    ctx = StudyContext(kernel=kernel, family=kernels.get(kernel), problem=problem)
    space_path = attrs.get("space_path")
    if not space_path:
        ctx.space_note = "the study does not name its space file"
        return ctx
    candidates = [Path(space_path), space_mod.PACKAGE_ROOT / space_path]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        ctx.space_note = f"space file {space_path} not found"
        return ctx
    space = space_mod.load(path)
    recorded = str(attrs.get("space_hash") or "")
    if recorded and space.content_hash() != recorded:
        ctx.space_note = f"space file {path} changed since the study ran (sha256 differs from 'space_hash')"
        return ctx
    template = Path(TEMPLATES_DIR) / ctx.family.template
    recorded = str(attrs.get("templates_hash") or "")
    if recorded and hashlib.sha256(template.read_bytes()).hexdigest() != recorded:
        ctx.space_note = f"kernel template {template} changed since the study ran (sha256 differs from " \
                         "'templates_hash')"
        return ctx
    ctx.space = space
    return ctx


def render_trial(ctx: StudyContext, trial: FrozenTrial):
    """The rendered `Source` of a trial's config. InputError when the space is unavailable (see
    `ctx.space_note`)."""
    from tuner.render import render

    if ctx.space is None:
        raise InputError(f"cannot render trial {trial.number}: {ctx.space_note}")
    params = {name: trial.params[name] for name in ctx.space.params if name in trial.params}
    return render(ctx.family, params, ctx.space.resolve(params, ctx.problem), ctx.problem.env)


def render_command(study: optuna.Study, trial: FrozenTrial) -> str:
    """The `tuner render` command line that prints a trial's source."""
    attrs = study.user_attrs
    problem = (attrs.get("problem") or {}).get("name")
    words = ["tuner", "render", str(attrs.get("space_path") or attrs.get("kernel") or "SPACE")]
    if problem:
        words += ["--problem", str(problem)]
    for name, value in trial.params.items():
        text = json.dumps(value) if isinstance(value, bool) else str(value)
        words += ["--set", f"{name}={text}"]
    return shlex.join(words)


def compile_ptx(source, arch: str = "compute_90") -> bytes:
    """PTX of a rendered source for a virtual arch (NVRTC; no GPU needed). Raises InputError with NVRTC's first
    error line when it does not compile."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source.text, f"{source.uri}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [f"--gpu-architecture={arch}", "-std=c++17"])
        except nvrtc.NVRTCError:
            log = nvrtc.getProgramLog(prog)
            first = next((ln.strip() for ln in log.splitlines() if "error" in ln), "NVRTC failed")
            raise InputError(f"{source.uri}: {first}") from None
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return ptx if isinstance(ptx, bytes) else ptx.encode()


def virtual_arch(study: optuna.Study) -> str:
    """compute_XX for the study's "arch" (sm_XX), compute_90 where it has none."""
    arch = str(study.user_attrs.get("arch") or "sm_90")
    return arch.replace("sm_", "compute_", 1) if arch.startswith("sm_") else "compute_90"


# ---------------------------------------------------------------------------------------------------------------
# Artifacts for optuna-dashboard


@dataclass
class AttachReport:
    """What `attach_artifacts` did."""

    artifact_dir: Path
    attached: list[int] = field(default_factory=list)  # trial numbers that got source + PTX
    constraints_mirrored: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)  # trial number → why no artifacts


class _FinishedTrialAttrs:
    """Writes trial attributes of finished trials (which Optuna's storage API refuses to update) straight into
    the RDB tables, in Optuna's format: delete-then-insert of (trial_id, key, JSON value), in one transaction.
    Also what `optuna.artifacts.upload_artifact` is given as its storage, so artifact metadata is recorded
    exactly as Optuna records it for running trials."""

    def __init__(self, rdb: optuna.storages.RDBStorage):
        self._rdb = rdb

    def set_attrs(self, trial_id: int, user: dict[str, Any] | None = None,
                  system: dict[str, Any] | None = None) -> None:
        from optuna.storages._rdb import models

        session = self._rdb.scoped_session()
        try:
            for model, attrs in ((models.TrialUserAttributeModel, user or {}),
                                 (models.TrialSystemAttributeModel, system or {})):
                for key, value in attrs.items():
                    session.query(model).filter(model.trial_id == trial_id, model.key == key).delete()
                    session.add(model(trial_id=trial_id, key=key, value_json=json.dumps(value)))
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.set_attrs(trial_id, system={key: value})


def attach_artifacts(study: optuna.Study, artifact_dir: str | Path | None = None,
                     jobs: int | None = None) -> AttachReport:
    """Give every measured, original trial that lacks them two artifacts: its rendered CUDA source
    (``<uri>.cu``) and its PTX for the study's virtual arch (``<uri>.ptx``, NVRTC ``compute_XX``, -std=c++17),
    uploaded with `optuna.artifacts.upload_artifact` into a `FileSystemArtifactStore` at `artifact_dir`
    (default: `<db stem>.artifacts/` beside a SQLite database; created if missing). The artifact ids go into
    the trial's "artifacts" user attr ({"source": id, "ptx": id}). Every finished trial with Optuna constraints
    and no "constraint" user attr gets one (the largest constraint value), since optuna-dashboard 0.21 reads
    only the pre-5 constraints format.

    The attrs are written behind Optuna's in-process cache: open the study again to read them.
    Trials are skipped, with the reason in the report, when the space file is gone or changed (the source would
    not be what was measured) or NVRTC rejects the source. Idempotent: a second call attaches nothing.
    """
    from optuna.artifacts import FileSystemArtifactStore, upload_artifact

    rdb = _rdb(study)
    if artifact_dir is None:
        artifact_dir = artifact_dir_for(str(rdb.url))
        if artifact_dir is None:
            raise InputError(f"study {study.study_name}: not in a SQLite file; give an artifact folder")
    artifact_dir = Path(artifact_dir)
    try:
        artifact_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create artifact folder {artifact_dir}: {exc.strerror}") from None
    report = AttachReport(artifact_dir=artifact_dir)
    writer = _FinishedTrialAttrs(rdb)
    trials = study.get_trials(deepcopy=False)

    for t in trials:
        if t.state.is_finished() and t.constraints and "constraint" not in t.user_attrs:
            writer.set_attrs(t._trial_id, user={"constraint": max(t.constraints.values())})
            report.constraints_mirrored.append(t.number)

    todo = [t for t in trials if is_measured(t) and not is_duplicate(t) and "artifacts" not in t.user_attrs]
    if not todo:
        return report
    try:
        ctx = study_context(study)
    except InputError as exc:
        report.skipped.update({t.number: str(exc) for t in todo})
        return report
    if ctx.space is None:
        report.skipped.update({t.number: ctx.space_note for t in todo})
        return report
    arch = virtual_arch(study)

    def build(t: FrozenTrial) -> tuple[FrozenTrial, Any, bytes | str]:
        try:
            source = render_trial(ctx, t)
            return t, source, compile_ptx(source, arch)
        except InputError as exc:
            return t, None, str(exc)

    store = FileSystemArtifactStore(artifact_dir)
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool, \
            tempfile.TemporaryDirectory() as tmp:
        for t, source, ptx in pool.map(build, todo):  # NVRTC releases the GIL: compiles overlap
            if source is None:
                report.skipped[t.number] = str(ptx)
                continue
            folder = Path(tmp) / str(t.number)
            folder.mkdir()
            (folder / f"{source.uri}.cu").write_text(source.text)
            (folder / f"{source.uri}.ptx").write_bytes(ptx)
            ids = {kind: upload_artifact(artifact_store=store, file_path=str(folder / f"{source.uri}.{ext}"),
                                         study_or_trial=t, storage=writer, mimetype="text/plain")
                   for kind, ext in (("source", "cu"), ("ptx", "ptx"))}
            writer.set_attrs(t._trial_id, user={"artifacts": ids})
            report.attached.append(t.number)
    return report


# ---------------------------------------------------------------------------------------------------------------
# C++ header


CPP_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template
this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t
while xor xor_eq
""".split())
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Names the generated code uses itself; a size named like one of them gets a trailing underscore.
_RESERVED = frozenset({"arch", "launch", "p", "want", "best", "c", "d", "a", "b", "distance", "ratio"})


def check_namespace(namespace: str) -> str:
    """A C++ namespace name: an identifier, or identifiers joined by ``::``, none a keyword. Else InputError."""
    parts = namespace.split("::")
    for part in parts:
        if not _IDENT.match(part) or part in CPP_KEYWORDS or "__" in part:
            raise InputError(f"--namespace {namespace!r}: not a C++ identifier (letters, digits, _, not a "
                             "keyword; nested with ::)")
    return namespace


def _cpp_name(name: str) -> str:
    name = re.sub(r"[^0-9A-Za-z_]", "_", name)
    name = re.sub(r"__+", "_", name)
    if not name or name[0].isdigit():
        name = f"c_{name}"
    return f"{name}_" if name in CPP_KEYWORDS or name in _RESERVED else name


def _cpp_type(values: Iterable[Any]) -> str:
    values = list(values)
    if all(isinstance(v, bool) for v in values):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "long long"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return "double"
    return "const char*"


def _cpp_value(value: Any, ctype: str) -> str:
    if ctype == "bool":
        return "true" if value else "false"
    if ctype == "long long":
        return str(int(value))
    if ctype == "double":
        value = float(value)
        return repr(value) if math.isfinite(value) else "0.0"
    return c_string(str(value))


def c_string(text: str) -> str:
    """A C/C++ string literal for any text: printable ASCII as is, quotes and backslashes escaped, everything
    else as octal escapes of its UTF-8 bytes (never \\u escapes, which C++17 forbids for basic characters)."""
    out = []
    for byte in text.encode():
        char = chr(byte)
        if char in '"\\?':  # '?' too: no trigraphs
            out.append("\\" + char)
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return '"' + "".join(out) + '"'


def _raw_string(text: str) -> str:
    for delimiter in ("cuda", "cuda_src", "cuda_src_0", "cuda_src_1"):
        if f"){delimiter}\"" not in text:
            return f'R"{delimiter}({text}){delimiter}"'
    return c_string(text)  # pathological: fall back to an escaped literal


@dataclass
class _LaunchSpec:
    entry: str
    block: tuple[int, int, int]
    smem_dynamic: int
    args: tuple[str, ...]
    grid: list[str]  # three C++ expressions over `p`
    grid_text: list[str]  # the same, readable


@dataclass
class _Exported:
    name: str
    study: optuna.Study
    trial: FrozenTrial
    ctx: StudyContext
    params: dict[str, Any]
    derived: dict[str, Any]
    launches: list[_LaunchSpec]
    grid_note: str
    source: str | None


def _fit_dim(values: list[tuple[dict[str, int], int]], sizes: list[str]) -> tuple[str, str] | None:
    """A formula g = c or g = ceil_div(product of some sizes, q) that reproduces every (sizes, g) probe; as
    (C++ expression over `p`, readable text). None when none fits."""
    base_sizes, g0 = values[0]
    if all(g == g0 for _, g in values):
        return f"{g0}u", str(g0)
    subsets: list[tuple[str, ...]] = [(s,) for s in sizes]
    subsets += [(a, b) for i, a in enumerate(sizes) for b in sizes[i + 1:]]
    if len(sizes) > 2:
        subsets.append(tuple(sizes))
    for subset in subsets:
        product0 = math.prod(base_sizes[s] for s in subset)
        if g0 <= 0:
            continue
        for q in dict.fromkeys((product0 // g0, ceil_div(product0, g0))):
            if q <= 0:
                continue
            if all(ceil_div(math.prod(sz[s] for s in subset), q) == g for sz, g in values):
                operand = " * ".join(f"p.{_cpp_name(s)}" for s in subset)
                readable = " * ".join(subset)
                if q == 1:
                    return f"static_cast<unsigned>({operand})", readable
                return f"static_cast<unsigned>(ceil_div({operand}, {q}))", f"ceil({readable} / {q})"
    return None


def _launch_specs(ctx: StudyContext, trial: FrozenTrial, params: dict[str, Any], derived: dict[str, Any],
                  entry: str) -> tuple[list[_LaunchSpec], str]:
    """The launches of a config with grid formulas in the problem sizes.

    `family.launches` is evaluated on the tuned problem and, one size at a time, on that size ×2 and ×3 (the
    config's derived values re-resolved for each, when the space file is available); each grid dimension is
    then the constant, or ceil_div(size or product of sizes, q), that reproduces every probe. A dimension that
    no such formula fits keeps the tuned problem's value, and the note says so.
    """
    from tuner import space as space_mod

    family, problem = ctx.family, ctx.problem
    sizes = list(problem.sizes)

    def config_for(p) -> dict[str, Any]:
        if ctx.space is not None:
            return ctx.space.resolve(params, p)
        return {**params, **derived}

    try:
        base = family.launches(entry, config_for(problem), problem.env)
    except (ValueError, ArithmeticError, KeyError, TypeError) as exc:
        raise InputError(f"trial {trial.number}: {family.name}.launches() fails on the tuned problem: "
                         f"{_first_line(exc)}") from None
    probes: list[tuple[dict[str, int], list]] = [(dict(problem.sizes), base)]
    if ctx.space is not None:
        for name in sizes:
            for factor in (2, 3):
                scaled = {**problem.sizes, name: problem.sizes[name] * factor}
                p = space_mod.Problem(problem.name, problem.dtype, scaled)
                try:
                    launches = family.launches(entry, config_for(p), p.env)
                except (ValueError, ArithmeticError, KeyError, TypeError):
                    continue  # e.g. a tile that does not divide the scaled size
                if len(launches) == len(base):
                    probes.append((scaled, launches))
    notes = []
    if len(probes) == 1:
        notes.append("grid is the tuned problem's only (no probes: "
                     + (ctx.space_note or "launches() failed on every scaled problem") + ")")
    specs = []
    for i, launch in enumerate(base):
        grid, text = [], []
        for d in range(3):
            fit = _fit_dim([(sz, ls[i].grid[d]) for sz, ls in probes], sizes)
            if fit is None:
                fit = (f"{launch.grid[d]}u", f"{launch.grid[d]} (tuned problem only)")
                notes.append(f"launch {i} grid.{'xyz'[d]}: no ceil_div formula fits; tuned problem only")
            grid.append(fit[0])
            text.append(fit[1])
        specs.append(_LaunchSpec(entry=launch.entry, block=tuple(launch.block),
                                 smem_dynamic=launch.smem_dynamic, args=tuple(launch.args), grid=grid,
                                 grid_text=text))
    return specs, "; ".join(notes)


def _exported_configs(studies: Sequence[optuna.Study], pick: str, with_source: bool) -> list[_Exported]:
    out: list[_Exported] = []
    for study in studies:
        trials = [best_trial(study)] if pick == "fastest" else pareto_trials(study)
        ctx = study_context(study)
        if with_source and ctx.space is None:
            raise InputError(f"study {study.study_name}: cannot embed sources: {ctx.space_note}")
        for t in trials:
            order = list(ctx.space.params) if ctx.space is not None else list(t.params)
            params = {name: t.params[name] for name in order if name in t.params}
            derived = _derived(t)
            if ctx.space is not None:
                resolved = ctx.space.resolve(params, ctx.problem)
                derived = {k: v for k, v in resolved.items() if k not in params}
            source = render_trial(ctx, t) if with_source else None
            entry = source.entry if source is not None else str(t.user_attrs.get("uri") or "")
            if not entry:
                from tuner.render import uri

                entry = uri(ctx.family, params)
            launches, note = _launch_specs(ctx, t, params, derived, entry)
            out.append(_Exported(name="", study=study, trial=t, ctx=ctx, params=params, derived=derived,
                                 launches=launches, grid_note=note, source=source.text if source else None))
    kernels_seen = {e.ctx.kernel for e in out}
    if len(kernels_seen) > 1:
        raise InputError(f"the studies are of several kernels ({', '.join(sorted(kernels_seen))}); name one")
    size_sets = {tuple(e.ctx.problem.sizes) for e in out}
    if len(size_sets) > 1:
        raise InputError(f"the studies name different problem sizes: {sorted(size_sets)}")
    param_sets = {tuple(e.params) for e in out}
    if len(param_sets) > 1:
        raise InputError(f"the studies have different params: {sorted(param_sets)}")
    # unique C++ names: the uri, then + problem, + arch, + a counter
    taken: set[str] = set()
    for e in out:
        uri = str(e.trial.user_attrs.get("uri") or e.launches[0].entry)
        arch = str(e.study.user_attrs.get("arch") or "")
        for candidate in (uri, f"{uri}_{e.ctx.problem.name}", f"{uri}_{e.ctx.problem.name}_{arch}"):
            name = _cpp_name(candidate)
            if name not in taken:
                break
        else:
            n = 2
            while f"{name}_{n}" in taken:
                n += 1
            name = f"{name}_{n}"
        taken.add(name)
        e.name = name
    return out


def header_text(studies: optuna.Study | Sequence[optuna.Study], pick: str = "fastest", namespace: str = "tuned",
                with_source: bool = False) -> str:
    """The text `write_header` writes (see there)."""
    if isinstance(studies, optuna.Study):
        studies = [studies]
    if pick not in ("fastest", "pareto"):
        raise InputError(f"--pick {pick!r}: expected fastest or pareto")
    check_namespace(namespace)
    configs = _exported_configs(studies, pick, with_source)
    kernel = configs[0].ctx.kernel
    sizes = list(configs[0].ctx.problem.sizes)
    size_names = [_cpp_name(s) for s in sizes]
    param_names = list(configs[0].params)
    derived_names = list(dict.fromkeys(k for e in configs for k in e.derived))
    param_types = {}
    for name in param_names:
        values = []
        for e in configs:
            dist = e.trial.distributions.get(name)
            values += list(getattr(dist, "choices", ())) or [e.params[name]]
        param_types[name] = _cpp_type(values)
    derived_types = {n: _cpp_type(e.derived[n] for e in configs if n in e.derived) for n in derived_names}
    gemm_like = any(throughput_unit(e.study) == "TFLOP/s" for e in configs)
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    from tuner import __version__

    lines: list[str] = ["#pragma once", "//"]
    lines.append(f"// {kernel}: tuned configs (pick: {pick}) exported by `tuner export` (tuner {__version__})")
    lines.append(f"// on {now}. Generated: do not edit.")
    lines.append("// Figures are medians measured by the study on the GPU named; fractions are of the")
    lines.append("// device-to-device copy bandwidth measured on that GPU with the same protocol.")
    for study in studies:
        attrs = study.user_attrs
        problem = attrs.get("problem") or {}
        size_text = " ".join(f"{k}={v}" for k, v in (problem.get("sizes") or {}).items())
        lines.append("//")
        lines.append(f"// study {study.study_name}: {attrs.get('gpu', '?')} ({attrs.get('arch', '?')}), "
                     f"problem {problem.get('name', '?')} {problem.get('dtype', '')} {size_text}")
        for e in (c for c in configs if c.study is study):
            a = e.trial.user_attrs
            when = e.trial.datetime_complete.strftime("%Y-%m-%d") if e.trial.datetime_complete else "?"
            tput = f"{float(a.get('tbps') or 0):.3f} TB/s"
            if gemm_like:
                tput += f", {float(a.get('tflops') or 0):.2f} TFLOP/s"
            fraction = float(a.get("fraction_of_ceiling") or 0)
            ceiling = float(a.get("ceiling_tbps") or 0)
            lines.append(f"//   {e.name}: {tput} = {fraction:.3f} of the {ceiling:.2f} TB/s ceiling, "
                         f"median {float(a.get('median_ms') or 0):.4g} ms;")
            lines.append(f"//     {a.get('registers', '?')} registers, {a.get('smem_bytes', '?')} B SMEM, "
                         f"{a.get('blocks_per_sm', '?')} blocks/SM; trial {e.trial.number}, measured {when}")
            if e.grid_note:
                lines.append(f"//     note: {e.grid_note}")
    lines += [
        "//",
        "// Grid formulas come from tuner.kernels launches(), evaluated on each tuned problem and on each",
        "// size x2 and x3. `select` returns the config tuned for the problem nearest in log space (exact",
        "// match first). A config's source (when embedded) has its tuned problem's sizes compiled in:",
        "// check with `tuned_for` before launching it on another shape.",
        "",
        f"namespace {namespace}::{_cpp_name(kernel)} {{",
        "",
        "struct Dim3 {",
        "    unsigned x, y, z;",
        "#if defined(__CUDACC__)",
        "    operator dim3() const { return dim3(x, y, z); }",
        "#endif",
        "};",
        "",
        "constexpr long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }",
        "",
        "// Problem sizes, in the family's order.",
        "struct Problem {",
        *[f"    long long {n};" for n in size_names],
        "};",
        "",
        "// The tuned knobs (the study's params).",
        "struct Params {",
        *[f"    {param_types[n]} {_cpp_name(n)};" for n in param_names],
        "};",
        "",
        "// Values derived from the params (and the tuned problem) by the search space.",
        "struct Derived {",
        *[f"    {derived_types[n]} {_cpp_name(n)};" for n in derived_names],
        "};",
        "",
        "struct Launch {",
        "    const char* entry;            // extern \"C\" kernel name in the source",
        "    Dim3 block;",
        "    unsigned smem_dynamic_bytes;",
        "};",
        "",
        "struct Config {",
        "    const char* uri;              // readable name: the same in logs, caches and the dashboard",
        "    const char* study;",
        "    const char* gpu;              // the GPU it was measured on",
        "    const char* arch;             // e.g. \"sm_90\"",
        "    const char* problem_name;",
        "    const char* dtype;",
        "    Problem problem;              // the sizes it was tuned for (and its source compiled for)",
        "    Params params;",
        "    Derived derived;",
        "    int threads;                  // threads per block (largest over its launches)",
        "    int registers;                // per thread",
        "    int smem_bytes;               // per block, static + dynamic",
        "    int spill_bytes;",
        "    int blocks_per_sm;            // resident blocks per SM (occupancy) as measured",
        "    double tbps;                  // measured useful bandwidth",
        "    double tflops;",
        "    double fraction_of_ceiling;   // of the device-to-device copy bandwidth on that GPU",
        "    double median_ms;",
        "    int launch_count;",
        "    const Launch* launches;",
        "    Dim3 (*grid_fn)(const Problem& p, int launch);",
        "    const char* source;           // rendered CUDA (nullptr unless exported --with-source)",
        "",
        "    constexpr Dim3 grid(const Problem& p, int launch = 0) const { return grid_fn(p, launch); }",
        f"    constexpr Dim3 grid({', '.join(f'long long {n}' for n in size_names)}, int launch = 0) const {{",
        f"        return grid_fn(Problem{{{', '.join(size_names)}}}, launch);",
        "    }",
        f"    constexpr bool tuned_for({', '.join(f'long long {n}' for n in size_names)}) const {{",
        f"        return {' && '.join(f'problem.{n} == {n}' for n in size_names)};",
        "    }",
        "};",
        "",
    ]
    for e in configs:
        a = e.trial.user_attrs
        attrs = e.study.user_attrs
        threads = max(math.prod(spec.block) for spec in e.launches)
        lines.append(f"// {e.name}")
        lines.append(f"inline constexpr Launch {e.name}_launches[] = {{")
        for spec in e.launches:
            block = ", ".join(f"{b}u" for b in spec.block)
            lines.append(f"    {{{c_string(spec.entry)}, {{{block}}}, {spec.smem_dynamic}u}},  "
                         f"// args: {', '.join(spec.args)}")
        lines.append("};")
        lines.append(f"constexpr Dim3 {e.name}_grid(const Problem& p, int launch) {{")
        for i, spec in enumerate(e.launches):
            lines.append(f"    // launch {i}: grid ({', '.join(spec.grid_text)})")
            lines.append(f"    if (launch == {i}) {{")
            lines.append("        return Dim3{" + (",\n                    ".join(spec.grid)) + "};")
            lines.append("    }")
        lines.append("    (void)p;")
        lines.append("    return Dim3{0u, 0u, 0u};")
        lines.append("}")
        problem_init = ", ".join(str(e.ctx.problem.sizes[s]) for s in sizes)
        params_init = ", ".join(_cpp_value(e.params[n], param_types[n]) for n in param_names)
        derived_init = ", ".join(_cpp_value(e.derived.get(n, 0), derived_types[n]) for n in derived_names)
        fields = [
            (c_string(str(str(a.get("uri") or e.launches[0].entry))), "uri"),
            (c_string(str(e.study.study_name)), "study"),
            (c_string(str(str(attrs.get("gpu") or ""))), "gpu"),
            (c_string(str(str(attrs.get("arch") or ""))), "arch"),
            (c_string(str(e.ctx.problem.name)), "problem_name"),
            (c_string(str(e.ctx.problem.dtype)), "dtype"),
            (f"Problem{{{problem_init}}}", "problem"),
            (f"Params{{{params_init}}}", "params"),
            (f"Derived{{{derived_init}}}", "derived"),
            (str(threads), "threads"),
            (str(int(a.get("registers") or 0)), "registers"),
            (str(int(a.get("smem_bytes") or 0)), "smem_bytes"),
            (str(int(a.get("spill_bytes") or 0)), "spill_bytes"),
            (str(int(a.get("blocks_per_sm") or 0)), "blocks_per_sm"),
            (_cpp_value(a.get("tbps") or 0.0, "double"), "tbps"),
            (_cpp_value(a.get("tflops") or 0.0, "double"), "tflops"),
            (_cpp_value(a.get("fraction_of_ceiling") or 0.0, "double"), "fraction_of_ceiling"),
            (_cpp_value(a.get("median_ms") or 0.0, "double"), "median_ms"),
            (str(len(e.launches)), "launch_count"),
            (f"{e.name}_launches", "launches"),
            (f"&{e.name}_grid", "grid_fn"),
            (_raw_string(e.source) if e.source is not None else "nullptr", "source"),
        ]
        lines.append(f"inline constexpr Config {e.name} = {{")
        for value, name in fields:
            if name == "source" and e.source is not None:
                lines.append(f"    /* source */ {value},")
            else:
                lines.append(f"    {value},  // {name}")
        lines.append("};")
        lines.append("")
    lines += [
        "// Every exported config; for each study, fastest first.",
        "inline constexpr const Config* configs[] = {",
        *[f"    &{e.name}," for e in configs],
        "};",
        f"inline constexpr int config_count = {len(configs)};",
        "",
        "constexpr bool same_text(const char* a, const char* b) {",
        "    while (*a != '\\0' && *a == *b) { ++a; ++b; }",
        "    return *a == *b;",
        "}",
        "",
        "constexpr double ratio(long long a, long long b) {",
        "    return a <= 0 || b <= 0 ? 1e300 : a > b ? double(a) / double(b) : double(b) / double(a);",
        "}",
        "",
        "// Distance of two problems in log space: the product of the max/min ratios of their sizes",
        "// (1.0: the same problem).",
        "constexpr double distance(const Problem& a, const Problem& b) {",
        "    return " + " * ".join(f"ratio(a.{n}, b.{n})" for n in size_names) + ";",
        "}",
        "",
        "// The config tuned for the problem nearest to the given sizes (an exact match wins; ties go to the",
        "// earlier, i.e. faster, config) among those tuned on `arch` (e.g. \"sm_90\"), or on any arch when",
        "// arch is nullptr. nullptr only when no config was tuned on that arch.",
        f"constexpr const Config* select({', '.join(f'long long {n}' for n in size_names)}, "
        "const char* arch = nullptr) {",
        f"    const Problem want{{{', '.join(size_names)}}};",
        "    const Config* best = nullptr;",
        "    double best_distance = 0.0;",
        "    for (const Config* c : configs) {",
        "        if (arch != nullptr && !same_text(c->arch, arch)) continue;",
        "        const double d = distance(c->problem, want);",
        "        if (best == nullptr || d < best_distance) { best = c; best_distance = d; }",
        "    }",
        "    return best;",
        "}",
        "",
        f"}}  // namespace {namespace}::{_cpp_name(kernel)}",
        "",
    ]
    return "\n".join(lines)


def write_header(studies: optuna.Study | Sequence[optuna.Study], path: str | Path, pick: str = "fastest",
                 namespace: str = "tuned", with_source: bool = False) -> Path:
    """Write a self-contained C++17 header of the tuned configs of one or more studies of one kernel.

    Layout: ``#pragma once``; a comment block (per study: name, GPU, arch, problem; per config: TB/s — and
    TFLOP/s for TFLOP/s families — fraction of the copy ceiling, median time, registers, SMEM, trial number and
    date); then ``namespace <namespace>::<kernel>`` with one `Config` type and one ``inline constexpr Config``
    per exported trial (named by its uri; + problem/arch when two would clash) holding every param, the derived
    values, threads per block, registers, SMEM, its launches (entry, block, dynamic SMEM) and a constexpr
    ``grid(sizes...)`` formula; ``configs[]``; and ``select(sizes..., arch = nullptr)``, the config tuned for
    the nearest problem (on that arch). `pick`: "fastest" (one config per study) or "pareto" (its Pareto front,
    fastest first). `with_source` embeds each config's rendered CUDA as a raw string literal.

    InputError — before anything is written — for a namespace that is not a C++ identifier, an unknown `pick`,
    an unwritable path, studies with nothing measured or of different kernels, or (with sources) a space file
    that is gone or changed since the study ran.
    """
    check_namespace(namespace)
    if pick not in ("fastest", "pareto"):
        raise InputError(f"--pick {pick!r}: expected fastest or pareto")
    path = check_writable(path, None, "--header")
    return atomic_write(path, header_text(studies, pick, namespace, with_source))


# ---------------------------------------------------------------------------------------------------------------
# Best trial, summarized


def best_summary(study: optuna.Study, artifact_dir: str | Path | None = None) -> dict[str, Any]:
    """The fastest measured trial as a dict: study, number, uri, params, throughput (+unit), tbps, tflops,
    fraction_of_ceiling, registers, smem_bytes, spill_bytes, blocks_per_sm, warps_per_sm, occupancy
    (warps_per_sm / 64), and where its source is: "source_path" (its artifact, when attached and present) or
    "render_command" (a `tuner render` command line that prints it)."""
    t = best_trial(study)
    a = t.user_attrs
    warps = a.get("warps_per_sm")
    out: dict[str, Any] = {
        "study": study.study_name,
        "gpu": study.user_attrs.get("gpu"),
        "number": t.number,
        "uri": a.get("uri"),
        "params": dict(t.params),
        "throughput": throughput(study, t),
        "throughput_unit": throughput_unit(study),
        **{k: a.get(k) for k in ("tbps", "tflops", "fraction_of_ceiling", "median_ms", "registers",
                                 "smem_bytes", "spill_bytes", "blocks_per_sm", "warps_per_sm")},
        "occupancy": (float(warps) / MAX_WARPS_PER_SM) if warps is not None else None,
        "threads": _threads(t),
    }
    final = finalist(study, t.number)
    if final is not None:
        # Report the longer re-timing, and say so; the screening figure stays alongside.
        out["screening_tbps"] = out["tbps"]
        out.update({k: final[k] for k in ("tbps", "tflops", "fraction_of_ceiling", "median_ms") if k in final})
        out["throughput"] = out["tflops"] if throughput_unit(study) == "TFLOP/s" else out["tbps"]
        out["timing"] = f"re-timed at the end of the study ({final.get('repetitions')} repetitions)"
    else:
        out["timing"] = "screening"
    ids = a.get("artifacts") if isinstance(a.get("artifacts"), dict) else {}
    if artifact_dir is None:
        try:
            artifact_dir = artifact_dir_for(storage_url(study))
        except InputError:
            artifact_dir = None
    source_path = Path(artifact_dir) / ids["source"] if artifact_dir and ids.get("source") else None
    if source_path is not None and source_path.is_file():
        out["source_path"] = str(source_path)
    else:
        out["render_command"] = render_command(study, t)
    return out


__all__ = [
    "AttachReport",
    "StudyContext",
    "artifact_dir_for",
    "atomic_write",
    "attach_artifacts",
    "best_summary",
    "best_trial",
    "c_string",
    "check_namespace",
    "check_writable",
    "compile_ptx",
    "get_storage",
    "header_text",
    "is_duplicate",
    "is_feasible",
    "is_measured",
    "measured_trials",
    "open_studies",
    "open_study",
    "pareto_frame",
    "pareto_trials",
    "plot_pareto",
    "register_budget",
    "render_command",
    "render_trial",
    "resolve_storage",
    "smem_budget",
    "storage_url",
    "study_context",
    "throughput",
    "throughput_unit",
    "trial_record",
    "trials_frame",
    "virtual_arch",
    "write_header",
    "write_pareto",
    "write_trials",
]
