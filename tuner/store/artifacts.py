"""Each measured trial's rendered CUDA source and PTX, stored as Optuna artifacts for optuna-dashboard.

`ArtifactWriter` uploads them while a trial runs (the study driver calls it before `tell`), into the artifact
folder beside a SQLite study (`artifact_dir_for`: ``<db stem>.artifacts/``, where ``tuner dashboard`` serves them
from). `FinishedTrialAttrs` writes the attributes of trials that have finished (which Optuna's storage API refuses
to change), in Optuna's own format: what `tuner.results.artifacts.attach_artifacts` needs to back-fill a study
recorded without artifacts.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.result import TrialAttr
from tuner.store.dbfiles import sqlite_path
from tuner.store.reading import get_storage

if TYPE_CHECKING:
    from tuner.build.render import Source


def artifact_dir_for(url: str) -> Path | None:
    """Default artifact folder of a storage: `<db stem>.artifacts/` next to a SQLite file; None otherwise."""
    path = sqlite_path(url, in_memory_ok=True)
    return None if path is None else path.with_name(f"{path.stem}.artifacts")


class FinishedTrialAttrs:
    """Writes trial attributes of finished trials (which Optuna's storage API refuses to update) into the
    storage's trial_user_attributes / trial_system_attributes tables, reflected with SQLAlchemy: delete-then-
    insert of (trial_id, key, JSON value), in one transaction. Also what `optuna.artifacts.upload_artifact` is
    given as its storage, so artifact metadata is recorded exactly as Optuna records it for running trials."""

    def __init__(self, url: str, study_name: str):
        import sqlalchemy

        self.rdb = get_storage(url)
        self.study_id = self.rdb.get_study_id_from_name(study_name)
        self.engine = sqlalchemy.create_engine(url)
        meta = sqlalchemy.MetaData()
        self.tables = {
            kind: sqlalchemy.Table(f"trial_{kind}_attributes", meta, autoload_with=self.engine)
            for kind in ("user", "system")
        }

    def trial_id(self, number: int) -> int:
        return self.rdb.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def set_attrs(
        self, trial_id: int, user: dict[str, Any] | None = None, system: dict[str, Any] | None = None
    ) -> None:
        with self.engine.begin() as conn:
            for kind, attrs in (("user", user or {}), ("system", system or {})):
                table = self.tables[kind]
                for key, value in attrs.items():
                    conn.execute(table.delete().where(table.c.trial_id == trial_id, table.c.key == key))
                    conn.execute(table.insert().values(trial_id=trial_id, key=key, value_json=json.dumps(value)))

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self.set_attrs(trial_id, system={key: value})

    def close(self) -> None:
        self.engine.dispose()


def upload_source_and_ptx(
    store: Any, folder: Path, source: Source, ptx: bytes, trial: Any, storage: Any = None
) -> dict[str, str]:
    """Write a trial's ``<uri>.cu`` and ``<uri>.ptx`` into `folder` and upload each to `store` for `trial` (a
    FrozenTrial also needs the `storage` that records its artifact attrs); their artifact ids, by kind."""
    from optuna.artifacts import upload_artifact

    ids = {}
    for kind, ext, data in (("source", "cu", source.text.encode()), ("ptx", "ptx", ptx)):
        path = folder / f"{source.uri}.{ext}"
        path.write_bytes(data)
        ids[kind] = upload_artifact(
            artifact_store=store, file_path=str(path), study_or_trial=trial, storage=storage, mimetype="text/plain"
        )
    return ids


class ArtifactWriter:
    """Uploads a measured trial's rendered source (``<uri>.cu``) and PTX (``<uri>.ptx``) with
    `optuna.artifacts.upload_artifact` while the trial still runs (before `tell`), into the artifact folder
    beside a SQLite study (`<db stem>.artifacts/`, where `tuner dashboard` serves them from); the ids go into
    the trial's "artifacts" user attr. Nothing is attached for a storage that is not a SQLite file."""

    def __init__(self, url: str):
        self.folder = artifact_dir_for(url)
        self.store = None
        if self.folder is not None:
            from optuna.artifacts import FileSystemArtifactStore

            self.folder.mkdir(parents=True, exist_ok=True)
            self.store = FileSystemArtifactStore(self.folder)

    def attach(self, trial, source, compiled) -> None:
        if self.store is None or not compiled.ptx:
            return
        with tempfile.TemporaryDirectory() as tmp:
            ids = upload_source_and_ptx(self.store, Path(tmp), source, compiled.ptx, trial)
        trial.set_user_attr(TrialAttr.ARTIFACTS, ids)
