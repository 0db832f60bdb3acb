"""Artifacts for optuna-dashboard: each measured trial's rendered CUDA source and its PTX.

The study driver attaches them while a trial runs, before `tell`. `attach_artifacts` back-fills studies recorded
without them (older studies, or ones written by other tools): Optuna's storage API refuses to change a finished
trial, so it writes the trial attributes it needs ("artifacts:<id>" system attrs, the "artifacts"/"constraint"
user attrs) into the storage's attribute tables through SQLAlchemy, in Optuna's own format.
"""

from __future__ import annotations

import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial

from tuner.build.compile import first_error, include_options, nvrtc_compile, nvrtc_options, program_name, target_arch
from tuner.errors import InputError
from tuner.gpufacts import DEFAULT_ARCH
from tuner.result import StudyAttr, TrialAttr
from tuner.results.studies import (
    artifact_dir_for,
    get_storage,
    is_duplicate,
    is_measured,
    render_trial,
    storage_url,
    study_context,
)

if TYPE_CHECKING:
    from tuner.build.render import Source


def compile_ptx(source: Source, arch: str = "compute_90") -> bytes:
    """PTX of a rendered source for a virtual arch (NVRTC; no GPU needed). Raises InputError with NVRTC's first
    error line when it does not compile."""
    arch = target_arch(source.text, arch)
    # the source's own options and include folders, as for its cubin; no ptxas report, no line table
    options = [o for o in nvrtc_options(source, arch) if o not in ("-Xptxas=-v", "-lineinfo")]
    status, log, _, ptx = nvrtc_compile(source.text, program_name(source), [*options, *include_options(source)])
    if status != 0:
        raise InputError(f"{source.uri}: {first_error(log, status)}")
    return ptx


def virtual_arch(study: optuna.Study) -> str:
    """compute_XX for the study's "arch" (sm_XX); for a study without one, that of `tuner.gpufacts.DEFAULT_ARCH`."""
    arch = str(study.user_attrs.get(StudyAttr.ARCH) or DEFAULT_ARCH)
    return arch.replace("sm_", "compute_", 1) if arch.startswith("sm_") else DEFAULT_ARCH.replace("sm_", "compute_")


# Artifacts for optuna-dashboard


@dataclass
class AttachReport:
    """What `attach_artifacts` did."""

    artifact_dir: Path
    attached: list[int] = field(default_factory=list)  # trial numbers that got source + PTX
    constraints_mirrored: list[int] = field(default_factory=list)
    skipped: dict[int, str] = field(default_factory=dict)  # trial number → why no artifacts


class _FinishedTrialAttrs:
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


def attach_artifacts(
    study: optuna.Study, artifact_dir: str | Path | None = None, jobs: int | None = None
) -> AttachReport:
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
    from optuna.artifacts import FileSystemArtifactStore

    url = storage_url(study)
    report = AttachReport(artifact_dir=_artifact_folder(study, url, artifact_dir))
    writer = _FinishedTrialAttrs(url, study.study_name)
    trials = study.get_trials(deepcopy=False)
    _mirror_constraints(trials, writer, report)

    todo = [t for t in trials if is_measured(t) and not is_duplicate(t) and TrialAttr.ARTIFACTS not in t.user_attrs]
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

    def build(t: FrozenTrial) -> tuple[FrozenTrial, tuple[Source, bytes] | str]:
        """The trial with its source and PTX, or with the reason it cannot have them."""
        try:
            source = render_trial(ctx, t)
            return t, (source, compile_ptx(source, arch))
        except InputError as exc:
            return t, str(exc)

    store = FileSystemArtifactStore(report.artifact_dir)
    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool, tempfile.TemporaryDirectory() as tmp:
        for t, built in pool.map(build, todo):  # NVRTC releases the GIL: compiles overlap
            if isinstance(built, str):
                report.skipped[t.number] = built
                continue
            folder = Path(tmp) / str(t.number)
            folder.mkdir()
            # The writer as the storage: for a trial, upload_artifact calls only set_trial_system_attr, which the
            # writer provides for finished trials (Optuna's storages refuse to update those).
            ids = _upload_source_and_ptx(store, folder, *built, t, storage=writer)
            writer.set_attrs(writer.trial_id(t.number), user={TrialAttr.ARTIFACTS: ids})
            report.attached.append(t.number)
    return report


def _artifact_folder(study: optuna.Study, url: str, artifact_dir: str | Path | None) -> Path:
    """`artifact_dir`, or the default folder beside the study's SQLite file; created if missing."""
    if artifact_dir is None:
        artifact_dir = artifact_dir_for(url)
        if artifact_dir is None:
            raise InputError(f"study {study.study_name}: not in a SQLite file; give an artifact folder")
    artifact_dir = Path(artifact_dir)
    try:
        artifact_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create artifact folder {artifact_dir}: {exc.strerror}") from None
    return artifact_dir


def _mirror_constraints(trials: list[FrozenTrial], writer: _FinishedTrialAttrs, report: AttachReport) -> None:
    """Give every finished trial with Optuna constraints and no "constraint" user attr one: the largest value."""
    for t in trials:
        if t.state.is_finished() and t.constraints and TrialAttr.CONSTRAINT not in t.user_attrs:
            writer.set_attrs(writer.trial_id(t.number), user={TrialAttr.CONSTRAINT: max(t.constraints.values())})
            report.constraints_mirrored.append(t.number)


def _upload_source_and_ptx(
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
            ids = _upload_source_and_ptx(self.store, Path(tmp), source, compiled.ptx, trial)
        trial.set_user_attr(TrialAttr.ARTIFACTS, ids)
