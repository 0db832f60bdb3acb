"""What a stored study and its trials say: which trials count, and what "best" means for the study.

The names of the attributes are `tuner.core.result.TrialAttr` and `tuner.core.result.StudyAttr` (a failure's record is
part of the result every evaluator returns); this module holds the rules that read them, each written once:

- **counted** (`counts`): a trial counts towards ``--trials`` when it finished and is neither a leftover of a
  killed driver (failure "interrupted") nor a proposal answered without evaluation (`SCREENED`: a constraint
  violation, a duplicate, a known failure). `counted_trials` applies the same rule in SQL to a SQLite file,
  read-only and without Optuna, so that a study that holds its trials is said to be complete before anything
  starts; that SQL reads Optuna's tables, so it runs only on a schema revision it was written for
  (`SCHEMA_REVISIONS`) and otherwise leaves the count to Optuna.
- **measured** (`is_measured`): state COMPLETE and no "failure" user attr;
- **original** (not `is_duplicate`): no "duplicate_of" user attr (a duplicate re-proposed a measured config and
  was answered from it without GPU time; it must not show up twice in a front or be exported as if measured);
- **feasible** (`is_feasible`): every Optuna constraint <= 0 and the "constraint" user attr (its mirror), where
  present, <= 0;
- **goal**: the study's first objective and its direction (`tuner.space.objective.Goal`): the shortest time of a
  time-only study (one imported from a Kernel Tuner cache), the highest throughput of a throughput one.

This module imports nothing heavy at its top (``tuner study`` reads `counted_trials` before Optuna is imported).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError
from tuner.core.result import INTERRUPTED, StudyAttr, TrialAttr
from tuner.space.objective import Goal, goal_of
from tuner.store.dbfiles import connect_readonly, is_busy

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

#: user attr of a proposal answered without evaluation; its value says why (invalid, duplicate, known_failure)
SCREENED = "screened"

#: the revisions of Optuna's RDB schema (its ``alembic_version`` row) whose tables `counted_trials` and
#: `studies_of` read with their own SQL: v3.2.0.a is the schema of Optuna 3.2 to 5.1. tests/store/test_schema.py fails
#: when the installed Optuna's schema is another, so that the SQL is checked against it before it is added here.
SCHEMA_REVISIONS = frozenset({"v3.2.0.a"})


# ---------------------------------------------------------------------------------------------------------------
# which trials count


def counts(trial) -> bool:
    """Trials that count towards --trials: configs evaluated, not the leftovers of a killed driver nor proposals
    answered without evaluation (``screened``: a constraint violation, a duplicate, a known failure)."""
    return (
        trial.state.is_finished()
        and trial.user_attrs.get(TrialAttr.FAILURE) != INTERRUPTED
        and SCREENED not in trial.user_attrs
    )


def is_measured(trial: FrozenTrial) -> bool:
    """COMPLETE, verified and timed (no "failure" attr)."""
    from optuna.trial import TrialState

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
    counted: dict[str, int] = {}
    for t in trials:
        counted[t.state.name] = counted.get(t.state.name, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counted.items()))


# ---------------------------------------------------------------------------------------------------------------
# what best means


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
    """The study's first objective, its direction and unit (`tuner.space.objective.Goal`): what "best" means for it.
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


# ---------------------------------------------------------------------------------------------------------------
# the same rules in SQL, on a SQLite file, before Optuna is imported


def schema_revision(conn: sqlite3.Connection) -> str | None:
    """The Optuna schema revision of the database behind `conn`; None where it has no ``alembic_version`` row
    (not an Optuna database, or one being created at this moment)."""
    try:
        row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None
    return None if row is None else str(row[0])


def _readable(conn: sqlite3.Connection) -> bool:
    """Whether this module's SQL may read the database behind `conn`: its schema revision is one of
    `SCHEMA_REVISIONS`."""
    return schema_revision(conn) in SCHEMA_REVISIONS


def counted_trials(path: Path, name: str) -> tuple[int, dict[str, Any]] | None:
    """(trials of study `name` that count towards ``--trials`` (the rule of `counts`), the study's user attrs)
    from the SQLite file `path`, read-only and without Optuna. None where the count is left to Optuna once the
    study is open: the file or the study is not there, the file is not an Optuna database (the storage's own
    checks say so), or its schema revision is not one this SQL was written for (`SCHEMA_REVISIONS`; Optuna
    itself refuses a schema it does not know). A database of a known revision that this SQL cannot read is an
    InputError naming the file; one that another process holds this moment is left to Optuna too."""
    if not path.is_file():
        return None
    try:
        with connect_readonly(path) as conn:
            if not _readable(conn):
                return None
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
    except sqlite3.Error as exc:
        if is_busy(exc):
            return None  # another process holds the file this moment: Optuna counts once the study is open
        raise InputError(f"cannot count the trials of study {name!r}: {exc}", str(path)) from None
    except ValueError as exc:  # an attribute that is not JSON
        raise InputError(f"cannot count the trials of study {name!r}: {exc}", str(path)) from None
    return int(count), attrs


def studies_of(path: Path, kernel: str, gpu: str) -> list[str]:
    """The studies of `kernel` run on GPU model `gpu` in the SQLite file `path`, read-only and without Optuna;
    none where the file is no Optuna database of a revision this SQL was written for (`SCHEMA_REVISIONS`)."""
    try:
        with connect_readonly(path) as conn:
            if not _readable(conn):
                return []
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
