"""The SQL that reads Optuna's tables before Optuna is imported (`tuner.store.schema`), guarded by the schema revision
it was written for."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from tuner.core.errors import InputError
from tuner.store import schema

RECORDING = Path(__file__).resolve().parents[1] / "data" / "transpose_h200.db"


def _recording(tmp_path: Path) -> tuple[Path, str]:
    db = tmp_path / "s.db"
    shutil.copy(RECORDING, db)
    with sqlite3.connect(db) as conn:
        (name,) = conn.execute("SELECT study_name FROM studies").fetchone()
    return db, name


def test_the_sql_is_written_for_the_installed_optunas_schema():
    """Fails when Optuna's schema moves: check `counted_trials` and `studies_of` against the new tables, then add
    the revision to `schema.SCHEMA_REVISIONS`."""
    import optuna

    storage = optuna.storages.RDBStorage("sqlite:///:memory:")
    assert storage.get_head_version() in schema.SCHEMA_REVISIONS


def test_counted_trials_reads_a_known_schema_and_leaves_another_to_optuna(tmp_path):
    db, name = _recording(tmp_path)
    counted, attrs = schema.counted_trials(db, name)
    assert counted > 0 and attrs["kernel"] == "transpose"
    assert schema.studies_of(db, "transpose", attrs["gpu"]) == [name]
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'v9.9.9.z'")
    assert schema.counted_trials(db, name) is None
    assert schema.studies_of(db, "transpose", attrs["gpu"]) == []


def test_counted_trials_of_a_known_schema_it_cannot_read_is_a_clear_failure(tmp_path):
    db, name = _recording(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE trial_user_attributes")
    with pytest.raises(InputError, match="cannot count the trials"):
        schema.counted_trials(db, name)
