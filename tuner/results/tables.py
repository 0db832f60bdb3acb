"""Tables out of a study: the Pareto front and every trial as DataFrames and files (CSV, JSON, Parquet), and the
best trial summarized (what `tuner best` prints). Outputs are checked before any work and written atomically.
"""

from __future__ import annotations

import io
import json
import math
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial

from tuner.build.files import atomic_write, check_writable
from tuner.core.errors import InputError
from tuner.core.gpufacts import fp32_peak_tflops
from tuner.core.result import TrialAttr
from tuner.results.studies import (
    best_trial,
    finalist,
    gpu_facts,
    pareto_trials,
    render_command,
    threads,
    throughput,
)
from tuner.space.objective import RECORDED_FIGURES, Goal, figure, has_throughput
from tuner.store.artifacts import artifact_dir_for
from tuner.store.reading import get_storage, study_url
from tuner.store.schema import goal, is_feasible, objective_value, replay_only, throughput_unit

if TYPE_CHECKING:  # pandas is imported where it is used: it costs ~0.3 s at startup
    import pandas as pd

PARETO_COLUMNS = (
    "objective",
    "throughput",
    "tbps",
    "tflops",
    "fraction_of_ceiling",
    "registers",
    "smem_bytes",
    "spill_bytes",
    "blocks_per_sm",
    "warps_per_sm",
    "threads",
    "median_ms",
)


def trial_record(study: optuna.Study, trial: FrozenTrial, target: Goal | None = None) -> dict[str, Any]:
    """One measured trial as a flat dict: number, uri, params (under their own names), the metrics of
    `PARETO_COLUMNS` ("objective": the figure of the study's first objective, `goal`; None where the study did not
    record a figure, such as the throughput, registers and SMEM of a config imported from a Kernel Tuner cache)."""
    attrs = trial.user_attrs
    record: dict[str, Any] = {"number": trial.number, "uri": attrs.get("uri", "")}
    for name, value in trial.params.items():
        record[name if name not in PARETO_COLUMNS and name not in record else f"param_{name}"] = value
    record["objective"] = objective_value(study, trial, target)
    record["throughput"] = throughput(study, trial)
    for key in PARETO_COLUMNS[2:]:
        record[key] = (
            threads(trial) if key == "threads" else figure(attrs, key) if key != "median_ms" else attrs.get(key)
        )
    return record


def pareto_frame(study: optuna.Study) -> pd.DataFrame:
    """The Pareto front as a DataFrame, best first (by the study's first objective): number, uri, each param,
    then `PARETO_COLUMNS`. ``frame.attrs`` carries the study name, GPU, throughput unit, and the objective
    (metric, unit, direction)."""
    import pandas as pd

    target = goal(study)
    frame = pd.DataFrame([trial_record(study, t, target) for t in pareto_trials(study)])
    frame.attrs.update(
        study=study.study_name,
        gpu=study.user_attrs.get("gpu", ""),
        unit=throughput_unit(study),
        objective=target.metric,
        objective_unit=target.unit,
        direction="minimize" if target.minimize else "maximize",
    )
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
        attrs=("number", "value", "datetime_start", "datetime_complete", "duration", "params", "state")
    )
    rows = []
    for t in trials:
        row: dict[str, Any] = {}
        for key, value in t.user_attrs.items():
            _flatten(key, value, row)
        for key in RECORDED_FIGURES:  # a figure the trial does not have is empty, never 0
            if key in row:
                row[key] = figure(t.user_attrs, key)
        if "constraint" not in row:
            row["constraint"] = max(t.constraints.values()) if t.constraints else None
        row["feasible"] = is_feasible(t)
        rows.append(row)
    extra = pd.DataFrame(rows, index=base.index)
    clash = [c for c in extra.columns if c in base.columns]
    extra = extra.rename(columns={c: f"user_attrs_{c}" for c in clash})
    return pd.concat([base, extra], axis=1)


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
    target = goal(study)
    for t in pareto_trials(study):
        record = trial_record(study, t, target)
        record = {
            "number": record["number"],
            "uri": record["uri"],
            "params": dict(t.params),
            **{k: record[k] for k in PARETO_COLUMNS},
        }
        trials.append(record)
    attrs = study.user_attrs
    doc = {
        "study": study.study_name,
        "gpu": attrs.get("gpu"),
        "arch": attrs.get("arch"),
        "throughput_unit": throughput_unit(study),
        "objective": {"metric": target.metric, "unit": target.unit, "minimize": target.minimize},
        "problem": attrs.get("problem"),
        "trials": trials,
    }
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
# Best trial, summarized


def best_summary(study: optuna.Study, artifact_dir: str | Path | None = None) -> dict[str, Any]:
    """The best measured trial for the study's first objective (`best_trial`) as a dict: study, number, uri,
    params, objective (its metric), direction, value and unit (that objective's figure), throughput (+unit; None
    for a study without one), tbps, tflops, fraction_of_ceiling, ceiling_tbps (the copy ceiling that fraction is
    of), registers, smem_bytes, spill_bytes, blocks_per_sm, warps_per_sm, occupancy (warps_per_sm over the GPU's
    max warps per SM), for a TFLOP/s family fp32_peak_tflops (its roof, from the GPU's facts:
    `tuner.core.gpufacts.fp32_peak_tflops`; None where unknown), and where its source is: "source_path" (its artifact,
    when attached and present) or "render_command" (a `tuner render` command line that prints it). A figure the
    study did not record is None, never 0."""
    t = best_trial(study)
    a = t.user_attrs
    target = goal(study)
    warps = figure(a, "warps_per_sm")
    out: dict[str, Any] = {
        "study": study.study_name,
        "gpu": study.user_attrs.get("gpu"),
        "number": t.number,
        "uri": a.get("uri"),
        "params": dict(t.params),
        "objective": target.metric,
        "direction": "minimize" if target.minimize else "maximize",
        "value": objective_value(study, t, target),
        "unit": target.unit,
        "throughput": throughput(study, t),
        "throughput_unit": throughput_unit(study),
        **{
            k: figure(a, k) if k != "median_ms" else a.get(k)
            for k in (
                "tbps",
                "tflops",
                "fraction_of_ceiling",
                "ceiling_tbps",
                "median_ms",
                "registers",
                "smem_bytes",
                "spill_bytes",
                "blocks_per_sm",
                "warps_per_sm",
            )
        },
        "occupancy": (float(warps) / gpu_facts(study).max_warps_per_sm) if warps is not None else None,
        "threads": threads(t),
    }
    for k in ("registers", "smem_bytes", "spill_bytes", "blocks_per_sm", "warps_per_sm"):
        if out[k] is not None:
            out[k] = int(out[k])
    if throughput_unit(study) == "TFLOP/s":
        # A compute-bound family's roof: the FP32 peak from the GPU's facts and the trial's max SM clock (None
        # where the study did not record facts read from its GPU), never the copy ceiling.
        clock = (a.get("clocks") or {}).get("sm_clock_max_mhz")
        out["fp32_peak_tflops"] = fp32_peak_tflops(gpu_facts(study), clock)
    _add_finalist_timing(out, study, t, target)
    out.update(_where_source(study, t, artifact_dir))
    return out


def stored_best(summary: dict[str, Any]) -> dict[str, Any]:
    """The best config of a study that was complete before a run of several problems (its summary, which names
    the study and its storage, holds none), as ``tuner best --json`` gives it; {} for one with none measured."""

    study = optuna.load_study(study_name=summary["study"], storage=get_storage(summary["storage"]))
    try:
        return best_summary(study)
    except InputError:
        return {}


def _add_finalist_timing(out: dict[str, Any], study: optuna.Study, t: FrozenTrial, target: Goal) -> None:
    """Where `t` was re-timed as a finalist: its figures in `out` become the longer re-timing's, and say so; the
    screening figures stay alongside."""
    final = finalist(study, t.number)
    if final is None:
        out["timing"] = "screening"
        return
    out["screening_tbps"] = out["tbps"]
    out["screening_value"] = out["value"]
    out.update({k: figure(final, k) for k in ("tbps", "tflops", "fraction_of_ceiling") if k in final})
    out["median_ms"] = final.get("median_ms", out["median_ms"])
    out["throughput"] = out["tflops"] if throughput_unit(study) == "TFLOP/s" else out["tbps"]
    if not has_throughput(throughput_unit(study)):
        out["throughput"] = None
    retimed = target.value(final)
    out["value"] = retimed if retimed is not None else out["value"]
    out["timing"] = f"re-timed at the end of the study ({final.get('repetitions')} repetitions)"


def _where_source(study: optuna.Study, t: FrozenTrial, artifact_dir: str | Path | None) -> dict[str, str]:
    """Where the source of `t` is: its artifact ("source_path", when attached and present), else a command that
    renders it ("render_command"), or for a kernel that can only be replayed, a note that there is none."""
    recorded = t.user_attrs.get(TrialAttr.ARTIFACTS)
    ids = recorded if isinstance(recorded, dict) else {}
    if artifact_dir is None:
        try:
            artifact_dir = artifact_dir_for(study_url(study))
        except InputError:
            artifact_dir = None
    source_path = Path(artifact_dir) / ids["source"] if artifact_dir and ids.get("source") else None
    if source_path is not None and source_path.is_file():
        return {"source_path": str(source_path)}
    if replay_only(study):
        kernel = study.user_attrs.get("kernel")
        return {"source_note": f"none: kernel {kernel} has no template and can only be replayed"}
    return {"render_command": render_command(study, t)}
