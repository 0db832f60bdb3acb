"""Writing trials into an Optuna RDB study in bulk: a list of trials in one transaction.

Optuna's public API writes one trial at a time: `RDBStorage.create_new_trial(study_id, template_trial=...)`
issues about three statements per attribute (a SELECT of the trial, the check that it is still updatable, the
INSERT), 81 for a trial of this tuner's 27 user attributes, 25-50 ms each on SQLite; `Study.add_trials` loops
over it. `TrialWriter.write` writes a whole list in one session and one commit: one INSERT per trial row (its
id is read back) and about a dozen statements besides, whatever the list's length (the other rows go in as one
executemany per table; benchmarks/bulk_writer.py). It builds the rows with the storage's own SQLAlchemy models
(`optuna.storages._rdb.models`) and encodings (`json.dumps` for attributes, `distribution_to_json` and
`to_internal_repr` for params, `TrialValueModel.value_to_stored_repr` for values), so that the rows are the ones
`create_new_trial` would write.

`TrialWriter.finish` completes trials written RUNNING the same way: Optuna's `set_trial_user_attr`,
`set_trial_system_attr` and `set_trial_state_values` take two or three statements and a commit per attribute
(25-55 ms a trial); `finish` reads the trials' rows and existing attributes once, then inserts the new attributes
and updates the existing ones, one executemany per table, in one transaction for the whole list.

Those models are private to Optuna. The bulk path is taken only when the database's schema is the one the
installed models describe (its alembic revision is Optuna's head) and the installed Optuna is a release this
module was tested with (`TESTED_OPTUNA`); otherwise each trial goes through `create_new_trial`, and each
completion through Optuna's per-attribute calls.
"""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

#: Optuna releases (major, minor) whose RDB models this module was checked against, field by field, by
#: tests/store/test_trialwriter.py
TESTED_OPTUNA = frozenset({(5, 0), (5, 1)})

#: the models of `optuna.storages._rdb.models` the bulk path writes through
_MODELS_USED = (
    "StudyModel",
    "TrialModel",
    "TrialParamModel",
    "TrialValueModel",
    "TrialIntermediateValueModel",
    "TrialUserAttributeModel",
    "TrialSystemAttributeModel",
)

#: how often a transaction that fails in the database (SQLite busy, a deadlock elsewhere) is tried, as Optuna
#: tries `create_new_trial`
_ATTEMPTS = 5


def optuna_release() -> tuple[int, int]:
    """The installed Optuna's (major, minor)."""
    import optuna

    major, minor = optuna.__version__.split(".")[:2]
    return int(major), int(minor)


class TrialWriter:
    """Writes trials (`optuna.trial.FrozenTrial`s of any state) into the studies of one `RDBStorage`.

    `bulk` says which path `write` takes, decided once, when the writer is made: True when the storage's schema
    revision is the installed Optuna's head and that Optuna's release is in `TESTED_OPTUNA`."""

    def __init__(self, storage: Any):
        self.storage = storage
        self.bulk = bulk_supported(storage)

    def write(self, study_id: int, trials: Sequence[Any]) -> list[int]:
        """Append `trials` to study `study_id`, in order, numbered on from the study's existing trials; their
        trial ids, in order. The bulk path writes all or nothing (one transaction); the fallback writes one
        trial after another. A param whose distribution is incompatible with the one the study already records
        for that name raises ValueError, as in `create_new_trial`."""
        if not trials:
            return []
        if not self.bulk:
            return [self.storage.create_new_trial(study_id, template_trial=t) for t in trials]
        return _retrying(_write_in_one_transaction, self.storage, study_id, trials)

    def finish(self, study_id: int, trials: Sequence[tuple[int, Any]]) -> None:
        """Complete the unfinished trials of study `study_id` named by `(trial_id, frozen)` pairs with what each
        finished `frozen` holds: its user and system attributes (added, or overwriting the value of a key the trial
        already has), its values and intermediate values (likewise, by objective and step), its state and
        datetime_complete, as Optuna's `set_trial_user_attr`, `set_trial_system_attr`, `set_trial_intermediate_value`
        and `set_trial_state_values` would leave them. Params and datetime_start are left as written.

        Raises ValueError, before writing anything, where a `frozen` is not in a finished state or a trial id comes
        twice; `optuna.exceptions.UpdateFinishedTrialError` where a trial is already finished in the storage, and
        KeyError where a trial id is not in the storage (the bulk path: not in study `study_id`). The bulk path
        completes all or nothing (one transaction) and records `frozen.datetime_complete` (the time the trial was
        told, as `write` does; now where it is None); the fallback completes one trial after another, and Optuna
        records the time of its call."""
        ids = [trial_id for trial_id, _ in trials]
        if len(set(ids)) != len(ids):
            raise ValueError(f"finish: trial ids {sorted(i for i in set(ids) if ids.count(i) > 1)} come twice")
        unfinished = [trial_id for trial_id, frozen in trials if not frozen.state.is_finished()]
        if unfinished:
            raise ValueError(f"finish: trials {unfinished} are given in an unfinished state")
        if not trials:
            return
        if self.bulk:
            _retrying(_finish_in_one_transaction, self.storage, study_id, trials)
            return
        for trial_id, frozen in trials:
            for key, value in frozen.user_attrs.items():
                self.storage.set_trial_user_attr(trial_id, key, value)
            for key, value in frozen.system_attrs.items():
                self.storage.set_trial_system_attr(trial_id, key, value)
            for step, value in frozen.intermediate_values.items():
                self.storage.set_trial_intermediate_value(trial_id, step, value)
            self.storage.set_trial_state_values(trial_id, frozen.state, frozen.values)


def _retrying(transaction, storage: Any, *args: Any) -> Any:
    """`transaction(storage, *args)`, tried again after a random wait when it fails in the database (it rolled
    back whole), up to `_ATTEMPTS` times."""
    from optuna.exceptions import StorageInternalError

    for attempt in range(1, _ATTEMPTS + 1):
        try:
            return transaction(storage, *args)
        except StorageInternalError:  # what Optuna makes of an OperationalError (busy, deadlock)
            if attempt == _ATTEMPTS:
                raise
            time.sleep(random.random() * 2.0)  # as Optuna waits before trying a trial again
    raise AssertionError("unreachable")


def bulk_supported(storage: Any) -> bool:
    """Whether `storage` may be written by `_write_in_one_transaction`: an `RDBStorage` whose schema revision is
    the installed Optuna's alembic head (the schema its models describe), under a tested Optuna release."""
    from optuna.storages import RDBStorage

    if not isinstance(storage, RDBStorage) or optuna_release() not in TESTED_OPTUNA:
        return False
    try:  # the private names the bulk path uses: any that moved sends every write down the public path
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session  # noqa: F401

        for name in _MODELS_USED:
            getattr(models, name)
    except (ImportError, AttributeError):
        return False
    return storage.get_current_version() == storage.get_head_version()


def _write_in_one_transaction(storage: Any, study_id: int, trials: Sequence[Any]) -> list[int]:
    """The rows of `RDBStorage._get_prepared_new_trial` for each of `trials`, written in one session. The
    study's row is locked first (FOR UPDATE where the database has it), as Optuna does, so that no other writer
    numbers a trial of this study meanwhile; the trials are inserted before they are counted, so that on SQLite
    the count is taken under the write lock the inserts hold."""
    from optuna import distributions
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session
    from sqlalchemy import insert

    with _create_scoped_session(storage.scoped_session) as session:
        models.StudyModel.find_or_raise_by_id(study_id, session, for_update=True)
        _check_distributions(session, models, distributions, study_id, trials)
        rows = [
            models.TrialModel(
                study_id=study_id,
                number=None,
                state=frozen.state,
                datetime_start=frozen.datetime_start,
                datetime_complete=frozen.datetime_complete,
            )
            for frozen in trials
        ]
        session.add_all(rows)
        session.flush()  # the trial ids, for the rows below
        first = rows[0].count_past_trials(session)
        # The other rows go in as one executemany per table (no primary keys read back, unlike ORM objects).
        children: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for offset, (row, frozen) in enumerate(zip(rows, trials, strict=True)):
            row.number = first + offset
            trial_id = int(row.trial_id)
            for name, value in frozen.params.items():
                distribution = frozen.distributions[name]
                children[models.TrialParamModel].append(
                    {
                        "trial_id": trial_id,
                        "param_name": name,
                        "param_value": distribution.to_internal_repr(value),
                        "distribution_json": distributions.distribution_to_json(distribution),
                    }
                )
            for model, records in _result_rows(models, trial_id, frozen).items():
                children[model] += records
        for model, values in children.items():
            if values:
                session.execute(insert(model), values)
        return [int(row.trial_id) for row in rows]


def _result_rows(models, trial_id: int, frozen: Any) -> dict[Any, list[dict[str, Any]]]:
    """The rows of what a trial holds besides its params, by model, as Optuna stores them: values (by objective,
    inf and nan in their stored form), user and system attributes (JSON), intermediate values (by step)."""
    values, steps = [], []
    for objective, value in enumerate(frozen.values or ()):
        stored, value_type = models.TrialValueModel.value_to_stored_repr(value)
        values.append({"trial_id": trial_id, "objective": objective, "value": stored, "value_type": value_type})
    for step, value in frozen.intermediate_values.items():
        stored, step_type = models.TrialIntermediateValueModel.intermediate_value_to_stored_repr(value)
        steps.append(
            {"trial_id": trial_id, "step": step, "intermediate_value": stored, "intermediate_value_type": step_type}
        )
    return {
        models.TrialValueModel: values,
        models.TrialUserAttributeModel: [
            {"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in frozen.user_attrs.items()
        ],
        models.TrialSystemAttributeModel: [
            {"trial_id": trial_id, "key": k, "value_json": json.dumps(v)} for k, v in frozen.system_attrs.items()
        ],
        models.TrialIntermediateValueModel: steps,
    }


def _check_distributions(session, models, distributions, study_id: int, trials: Sequence[Any]) -> None:
    """Raise ValueError where a param's distribution is incompatible with the one recorded first for that name
    in the study, or in an earlier trial of `trials` (Optuna's check in `_set_trial_param_without_commit`)."""
    seen: dict[str, Any] = {}
    for frozen in trials:
        for name, distribution in frozen.distributions.items():
            if name not in seen:
                record = (
                    session.query(models.TrialParamModel)
                    .join(models.TrialModel)
                    .filter(models.TrialModel.study_id == study_id)
                    .filter(models.TrialParamModel.param_name == name)
                    .first()
                )
                seen[name] = distributions.json_to_distribution(record.distribution_json) if record else distribution
            distributions.check_distribution_compatibility(seen[name], distribution)


def _finish_in_one_transaction(storage: Any, study_id: int, trials: Sequence[tuple[int, Any]]) -> None:
    """What Optuna's per-attribute calls leave for each of `trials` (see `TrialWriter.finish`), in one session.
    The trials' rows are read first (FOR UPDATE where the database has it, as `set_trial_state_values` reads its
    trial) and checked before anything is written."""
    from datetime import datetime

    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.storages._rdb import models
    from optuna.storages._rdb.storage import _create_scoped_session

    ids = [trial_id for trial_id, _ in trials]
    with _create_scoped_session(storage.scoped_session) as session:
        query = session.query(models.TrialModel).filter(models.TrialModel.trial_id.in_(ids)).with_for_update()
        rows: dict[int, Any] = {int(row.trial_id): row for row in query}
        for trial_id in ids:
            row = rows.get(trial_id)
            if row is None or row.study_id != study_id:
                raise KeyError(f"No trial with trial id {trial_id} in study {study_id}")
            if row.state.is_finished():  # Optuna's check_trial_is_updatable, with its message
                raise UpdateFinishedTrialError(f"Trial#{row.number} has already finished and can not be updated.")
        results: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for trial_id, frozen in trials:
            for model, records in _result_rows(models, trial_id, frozen).items():
                results[model] += records
            row = rows[trial_id]
            row.state = frozen.state
            row.datetime_complete = frozen.datetime_complete or datetime.now()
        # by (trial_id, this column) a record updates the row that the trial already has, as Optuna's calls do
        for model, key in (
            (models.TrialUserAttributeModel, "key"),
            (models.TrialSystemAttributeModel, "key"),
            (models.TrialValueModel, "objective"),
            (models.TrialIntermediateValueModel, "step"),
        ):
            _upsert(session, model, key, ids, results[model])


def _upsert(session, model, key: str, trial_ids: Sequence[int], records: list[dict[str, Any]]) -> None:
    """Write `records` (dicts of `model`'s columns, its primary key aside) into `model`'s table: a record whose
    (trial_id, `key`) the table already holds updates that row, as Optuna's `find_by_trial_and_...` then update
    does; the others are inserted. One SELECT of the existing keys of `trial_ids`, then one executemany each."""
    from sqlalchemy import insert, select, update

    if not records:
        return
    column = model.__mapper__.primary_key[0]
    primary = model.__mapper__.get_property_by_column(column).key
    found = session.execute(
        select(column, model.trial_id, getattr(model, key)).where(model.trial_id.in_(trial_ids))
    ).all()
    existing = {(trial_id, name): pk for pk, trial_id, name in found}
    inserts, updates = [], []
    for record in records:
        pk = existing.get((record["trial_id"], record[key]))
        if pk is None:
            inserts.append(record)
        else:
            updates.append({primary: pk} | {k: v for k, v in record.items() if k not in ("trial_id", key)})
    if inserts:  # the table's, not the model's, insert: the ORM's would split the rows where a value is None
        session.execute(insert(model.__table__), inserts)
    if updates:
        session.execute(update(model), updates)  # SQLAlchemy's bulk UPDATE by primary key, one executemany
