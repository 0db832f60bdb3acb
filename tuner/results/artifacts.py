"""Artifacts for optuna-dashboard: each measured trial's rendered CUDA source and its PTX.

The study driver attaches them while a trial runs, before `tell` (`tuner.store.artifacts.ArtifactWriter`).
`attach_artifacts` back-fills studies recorded without them (older studies, or ones written by other tools):
Optuna's storage API refuses to change a finished trial, so it writes the trial attributes it needs
("artifacts:<id>" system attrs, the "artifacts"/"constraint" user attrs) into the storage's attribute tables
through SQLAlchemy, in Optuna's own format (`tuner.store.artifacts.FinishedTrialAttrs`).
"""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from optuna.trial import FrozenTrial

from tuner.build.compile import first_error, include_options, nvrtc_compile, nvrtc_options, program_name, target_arch
from tuner.core.errors import InputError
from tuner.core.gpufacts import DEFAULT_ARCH
from tuner.core.result import StudyAttr, TrialAttr
from tuner.results.studies import render_trial, study_context
from tuner.store.artifacts import FinishedTrialAttrs, artifact_dir_for, upload_source_and_ptx
from tuner.store.reading import study_url
from tuner.store.schema import is_duplicate, is_measured

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
    """compute_XX for the study's "arch" (sm_XX); for a study without one, that of
    `tuner.core.gpufacts.DEFAULT_ARCH`."""
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

    url = study_url(study)
    report = AttachReport(artifact_dir=_artifact_folder(study, url, artifact_dir))
    writer = FinishedTrialAttrs(url, study.study_name)
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
            ids = upload_source_and_ptx(store, folder, *built, t, storage=writer)
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


def _mirror_constraints(trials: list[FrozenTrial], writer: FinishedTrialAttrs, report: AttachReport) -> None:
    """Give every finished trial with Optuna constraints and no "constraint" user attr one: the largest value."""
    for t in trials:
        if t.state.is_finished() and t.constraints and TrialAttr.CONSTRAINT not in t.user_attrs:
            writer.set_attrs(writer.trial_id(t.number), user={TrialAttr.CONSTRAINT: max(t.constraints.values())})
            report.constraints_mirrored.append(t.number)
