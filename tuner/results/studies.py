"""Reading studies: the first room of the results stage.

`list_studies` lists the studies of a storage; `best_trial`, `pareto_trials` and `finalist` choose trials by the
rules of `tuner.store.schema` (measured, original, feasible, best for the study's goal); `study_context` rebuilds
what rendering a trial's config needs, and `gpu_facts` the facts of the GPU the study ran on. Everything reads a
study that the study stage wrote (its user attrs: `StudyAttr`; per trial: `TrialAttr` and every field of a
Measurement), opened with `tuner.store.reading`. Bad input (an unknown study or database, an empty study) raises
`InputError` with a one-line message.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial

from tuner.core.errors import InputError
from tuner.core.gpufacts import GpuFacts
from tuner.core.result import StudyAttr, TrialAttr
from tuner.space.objective import figure, has_throughput
from tuner.store.reading import remember_url, storages
from tuner.store.schema import (
    goal,
    is_duplicate,
    is_feasible,
    is_measured,
    measured_trials,
    objective_value,
    throughput_unit,
)

if TYPE_CHECKING:
    from tuner.build.render import Source


def list_studies(storage: str | None = None) -> list[dict[str, Any]]:
    """One row per study in `storage` (a URL or .db path), or in the default storage (every `databases()`
    file) when None: name, kernel, problem, gpu, trials (all states), measured, objective and direction (the
    study's first, `goal`), best (that objective's figure of `best_trial`, re-timed where the study re-timed it;
    None with nothing measured), unit (the figure's), last_change (the
    latest start or end of a trial, ISO 8601; None for an empty study), storage (its URL). Oldest first per
    storage. InputError for a `storage` that is missing or not a study database; files under `studies/`
    that are not study databases are skipped."""
    rows: list[dict[str, Any]] = []
    for url, rdb in storages(storage):
        summaries = sorted(rdb.get_all_studies(), key=lambda s: rdb.get_study_id_from_name(s.study_name))
        for summary in summaries:
            study = optuna.load_study(study_name=summary.study_name, storage=rdb)
            remember_url(study, url)
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


def gpu_facts(study: optuna.Study) -> GpuFacts:
    """The facts of the GPU the study ran on (its "gpu_facts" attr); for a study recorded before studies stored
    them, `tuner.core.gpufacts.DEFAULT` (H100/H200), whose `measured` is False."""
    return GpuFacts.from_dict(study.user_attrs.get(StudyAttr.GPU_FACTS))


# ---------------------------------------------------------------------------------------------------------------
# The best trials


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
    from tuner import kernels
    from tuner.build import families
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
