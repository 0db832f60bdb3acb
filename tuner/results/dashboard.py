"""optuna-dashboard for tuner studies, with each measured trial's CUDA source and PTX attached as artifacts.

`serve` is what ``tuner dashboard`` runs (blocks until interrupted); `start` runs the same dashboard app in a
background thread on a free port and returns a handle with its URL and a `stop()`, for tests and notebooks.

Before serving, every study in the storage gets `tuner.results.artifacts.attach_artifacts`, which back-fills what the
study driver did not attach while the trials ran (rendered source + PTX per measured trial, the "constraint"
user attr mirrored from Optuna 5's constraints, which optuna-dashboard 0.21 does not read).
Artifacts live in a `FileSystemArtifactStore`, by default `<db stem>.artifacts/` beside the database.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from tuner.core.errors import InputError
from tuner.results import studies
from tuner.results.artifacts import AttachReport, attach_artifacts
from tuner.store import reading
from tuner.store.artifacts import artifact_dir_for

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """A storage ready to serve: its URL, the artifact folder, and what attaching artifacts did per study."""

    url: str
    artifact_dir: Path
    reports: dict[str, AttachReport] = field(default_factory=dict)


def prepare(
    study_or_db: str | None, storage: str | None = None, artifact_dir: str | Path | None = None, attach: bool = True
) -> Prepared:
    """Resolve the storage that `study_or_db` names (see `reading.open_studies`; a study name must exist in it),
    and attach artifacts to every study in it. InputError for anything unknown or missing."""
    url, name = reading.resolve_storage(study_or_db, storage)
    if name is not None:
        reading.open_studies(study_or_db, storage)  # an unknown study name is an error, not an empty dashboard
    folder = Path(artifact_dir) if artifact_dir is not None else artifact_dir_for(url)
    if folder is None:
        raise InputError(f"{url} is not a SQLite file: give an artifact folder (--artifacts DIR)")
    prepared = Prepared(url=url, artifact_dir=folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create artifact folder {folder}: {exc.strerror}") from None
    if attach:
        for study in reading.open_studies(None, url):
            prepared.reports[study.study_name] = attach_artifacts(study, folder)
    return prepared


def best_line(row: dict | None) -> str:
    """The start of a study's line in the dashboard's summary: its best figure for its first objective
    (`studies.list_studies`), "" where nothing is measured."""
    from tuner.space.objective import format_figure

    if not row or row.get("best") is None:
        return ""
    aim = "minimized" if row["direction"] == "minimize" else "maximized"
    return f"best {format_figure(row['best'], row['unit'])} ({row['objective']} {aim}); "


def _artifact_store(folder: Path):
    from optuna.artifacts import FileSystemArtifactStore

    return FileSystemArtifactStore(folder)


def serve(
    study_or_db: str | None,
    port: int = 8080,
    host: str = "127.0.0.1",
    storage: str | None = None,
    artifact_dir: str | Path | None = None,
) -> None:
    """Bind host:port, attach artifacts, then serve optuna-dashboard (`optuna_dashboard.wsgi`) until interrupted.
    `study_or_db`: a study or kernel name, a .db path, or None with `storage` (a URL). A port that cannot be bound
    is an InputError before anything is written or printed."""
    import optuna_dashboard

    server = _bind(host, port)
    try:
        prepared = prepare(study_or_db, storage, artifact_dir)
        best = {row["name"]: row for row in studies.list_studies(prepared.url)}
        for name, report in prepared.reports.items():
            skipped = ""
            if report.skipped:
                skipped = f", {len(report.skipped)} skipped ({next(iter(report.skipped.values()))})"
            print(f"{name}: {best_line(best.get(name))}attached source+PTX to {len(report.attached)} trials{skipped}")
        server.set_app(optuna_dashboard.wsgi(prepared.url, artifact_store=_artifact_store(prepared.artifact_dir)))
        print(
            f"optuna-dashboard: http://{host}:{server.server_port}/dashboard/  (storage {prepared.url}, artifacts "
            f"{prepared.artifact_dir})",
            flush=True,
        )
        server.serve_forever()
    finally:
        server.server_close()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        log.debug("%s - %s", self.address_string(), format % args)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a browser's keep-alive connection must not hold up stop()


class _ThreadingServer6(_ThreadingServer):
    address_family = socket.AF_INET6


def _bind(host: str, port: int) -> WSGIServer:
    """A server listening on host:port with no app yet (`set_app` gives it one), or an InputError: the port is
    taken, or the host cannot be bound. Bound first, so a refusal leaves nothing written or printed."""
    try:
        server_class = _ThreadingServer6 if ":" in host else _ThreadingServer
        return make_server(host, port, _no_app, server_class=server_class, handler_class=_QuietHandler)
    except OSError as exc:
        raise InputError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None


def _no_app(environ, start_response):  # replaced by set_app before the server serves a request
    raise RuntimeError("the dashboard app was not set")


@dataclass
class Running:
    """A dashboard served from a background thread."""

    url: str  # e.g. http://127.0.0.1:40123
    prepared: Prepared
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def port(self) -> int:
        return self._server.server_port

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> Running:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start(
    study_or_db: str | None,
    port: int = 0,
    host: str = "127.0.0.1",
    storage: str | None = None,
    artifact_dir: str | Path | None = None,
    attach: bool = True,
) -> Running:
    """Serve the same optuna-dashboard app (`optuna_dashboard.wsgi`) from a background thread; port 0 picks a
    free port. Returns once the socket listens; `Running.stop()` shuts it down."""
    import optuna_dashboard

    server = _bind(host, port)
    try:
        prepared = prepare(study_or_db, storage, artifact_dir, attach=attach)
    except BaseException:
        server.server_close()
        raise
    server.set_app(optuna_dashboard.wsgi(prepared.url, artifact_store=_artifact_store(prepared.artifact_dir)))
    thread = threading.Thread(target=server.serve_forever, name="tuner-dashboard", daemon=True)
    thread.start()
    return Running(url=f"http://{host}:{server.server_port}", prepared=prepared, _server=server, _thread=thread)


__all__ = ["Prepared", "Running", "prepare", "serve", "start"]
