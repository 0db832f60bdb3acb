"""optuna-dashboard over a tuner study (tuner/results/dashboard.py): the real optuna-dashboard app on a free localhost
port, its JSON API and artifact routes, `tuner dashboard` as a subprocess, and a headless Chromium screenshot.

The study is the synthetic fixture of test_export.py (resources from real NVRTC compiles; timings invented).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.results.test_export import MAIN_STUDY, ROOT, attached, golden  # a sibling test module: its study fixture
from tuner.core.errors import InputError
from tuner.results import dashboard, export

CHROMIUM = "/usr/bin/chromium"


def get(url: str, timeout: float = 30) -> tuple[int, dict, bytes]:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, dict(resp.headers), resp.read()


def get_json(url: str) -> dict:
    status, _, body = get(url)
    assert status == 200
    return json.loads(body)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The dashboard for a private copy of the attached study, from a background thread on a free port."""
    db, _ = attached(tmp_path_factory)
    folder = tmp_path_factory.mktemp("served") / "studies"
    shutil.copytree(db.parent, folder)
    running = dashboard.start(str(folder / "transpose.db"))
    yield running
    running.stop()


def study_id(running: dashboard.Running) -> int:
    summaries = get_json(f"{running.url}/api/studies")["study_summaries"]
    return next(s["study_id"] for s in summaries if s["study_name"] == MAIN_STUDY)


def test_api_shows_metrics_user_attrs_and_artifacts(served):
    summaries = get_json(f"{served.url}/api/studies")["study_summaries"]
    assert [s["study_name"] for s in summaries] == [MAIN_STUDY]
    study_attrs = {a["key"]: a["value"] for a in summaries[0]["user_attrs"]}
    assert study_attrs["kernel"] == "transpose" and study_attrs["gpu"] == "NVIDIA H200"
    assert summaries[0]["directions"] == ["maximize", "minimize", "minimize"]

    sid = study_id(served)
    detail = get_json(f"{served.url}/api/studies/{sid}?after=0")
    assert detail["objective_names"] == ["throughput", "registers", "smem_bytes"]
    study = export.open_study(MAIN_STUDY, str(served.prepared.url))
    assert len(detail["trials"]) == len(study.trials)
    assert {t["state"] for t in detail["trials"]} == {"Complete", "Fail", "Pruned"}
    union = {a["key"] for a in detail["union_user_attrs"]}
    assert {
        "tbps",
        "fraction_of_ceiling",
        "registers",
        "smem_bytes",
        "uri",
        "artifacts",
        "constraint",
        "failure",
        "duplicate_of",
    } <= union

    best = export.best_trial(study)
    trial = next(t for t in detail["trials"] if t["number"] == best.number)
    attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
    assert attrs["uri"] == best.user_attrs["uri"]
    assert float(attrs["tbps"]) == pytest.approx(best.user_attrs["tbps"])
    assert float(attrs["constraint"]) == 0.0
    by_name = {a["filename"]: a for a in trial["artifacts"]}
    assert set(by_name) == {f"{best.user_attrs['uri']}.cu", f"{best.user_attrs['uri']}.ptx"}

    status, headers, body = get(
        f"{served.url}/artifacts/{sid}/{trial['trial_id']}/{by_name[best.user_attrs['uri'] + '.cu']['artifact_id']}"
    )
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert f"{best.user_attrs['uri']}(" in body.decode()
    status, _, body = get(
        f"{served.url}/artifacts/{sid}/{trial['trial_id']}/{by_name[best.user_attrs['uri'] + '.ptx']['artifact_id']}"
    )
    assert b".target sm_90" in body

    pruned = next(t for t in detail["trials"] if t["state"] == "Pruned")
    assert {a["key"]: a["value"] for a in pruned["user_attrs"]}["constraint"] == "1.0"


def test_start_rejects_unknown_study(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="unknown study 'gemm'"):
        dashboard.start("gemm")
    assert list(tmp_path.iterdir()) == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_dashboard_serves_until_stopped(tmp_path_factory):
    db, _ = attached(tmp_path_factory)
    folder = tmp_path_factory.mktemp("cli") / "studies"
    shutil.copytree(db.parent, folder)
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tuner", "dashboard", MAIN_STUDY, "--port", str(port)],
        cwd=folder.parent,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                meta = get_json(f"http://127.0.0.1:{port}/api/meta")
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "the dashboard did not come up within 60 s"
                time.sleep(0.2)
        assert "artifact_is_available" in meta and meta["artifact_is_available"]
        names = [s["study_name"] for s in get_json(f"http://127.0.0.1:{port}/api/studies")["study_summaries"]]
        assert names == [MAIN_STUDY]
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"optuna-dashboard: http://127.0.0.1:{port}/dashboard/" in out


def test_cli_dashboard_on_a_busy_port_is_one_line_before_anything_is_written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("busy") / "studies"
    folder.mkdir()
    shutil.copy(golden(tmp_path_factory), folder / "transpose.db")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "tuner", "dashboard", MAIN_STUDY, "--port", str(port)],
            cwd=folder.parent,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [f"tuner: error: cannot serve on 127.0.0.1:{port}: Address already in use"]
    assert sorted(p.name for p in folder.iterdir()) == ["transpose.db"]  # no transpose.artifacts/


def test_start_on_a_busy_port_writes_no_artifact_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("busy_start")
    shutil.copy(golden(tmp_path_factory), folder / "transpose.db")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(InputError, match="cannot serve on 127.0.0.1"):
            dashboard.start(str(folder / "transpose.db"), port=taken.getsockname()[1])
    assert sorted(p.name for p in folder.iterdir()) == ["transpose.db"]


@pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing (CI installs it with apt-get install chromium)"
)
def test_chromium_screenshot_shows_the_study(served, tmp_path):
    from PIL import Image, ImageStat

    sid = study_id(served)
    png = tmp_path / "dashboard.png"
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={png}",
            "--window-size=1400,900",
            "--virtual-time-budget=8000",
            f"{served.url}/dashboard/studies/{sid}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert png.exists(), proc.stderr[-2000:]
    assert png.stat().st_size > 10_000
    keep = os.environ.get("TUNER_KEEP_SCREENSHOT")  # a folder: keep the picture to look at it
    if keep:
        shutil.copy(png, Path(keep) / "dashboard.png")
    with Image.open(png) as image:
        assert image.size == (1400, 900)
        stddev = ImageStat.Stat(image.convert("L")).stddev[0]
        colors = len(image.convert("RGB").getcolors(maxcolors=1 << 20) or [])
    assert stddev > 10 and colors > 200, (stddev, colors)  # a rendered page with plots, not a blank one
