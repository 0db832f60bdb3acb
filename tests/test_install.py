"""A wheel, installed into a fresh virtual environment and run from an empty directory, finds its shipped
templates and spaces (package data): it lists every space, renders, compiles, runs a replay study and exports
its C++ header.

The fresh venv sees the test environment's packages (Optuna, Ray, CuPy, ...) through a path entry, so nothing is
downloaded; `tuner` itself comes only from the wheel (no PYTHONPATH, no editable install in sight).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """bin/ of a fresh venv holding the wheel built from this tree."""
    base = tmp_path_factory.mktemp("install")
    src = base / "src"  # build from a copy: the build leaves build/ and *.egg-info behind
    for folder in ("tuner", "templates", "search_spaces"):  # the wheel maps the last two into the package
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    wheels = base / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-w", str(wheels), "-q"], check=True, timeout=600
    )
    (wheel,) = wheels.glob("tuner-*.whl")
    venv = base / "venv"
    # No pip of its own (its bootstrap is most of a venv's start): this environment's pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=600)
    bin_dir = venv / "bin"
    purelib = subprocess.run(
        [bin_dir / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # A plain path line: the test env's packages become importable, but its .pth files (the editable tuner
    # finder among them) are not run.
    Path(purelib, "test_env_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "--no-deps", "--no-index", "-q"]
        + [str(wheel)],
        check=True,
        timeout=600,
    )
    return bin_dir


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TUNER_TEMPLATES")}
    # NVRTC's wheel is found by searching the interpreter's own site-packages; the fresh venv borrows the test
    # env's through a path line, so point the loader at the library directly.
    libs = sorted(Path(sysconfig.get_paths()["purelib"], "nvidia").glob("*/lib/libnvrtc.so*"))
    if libs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([str(libs[0].parent), env.get("LD_LIBRARY_PATH", "")]).rstrip(
            os.pathsep
        )
    return env


def run(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = _env()
    return subprocess.run(
        [str(bin_dir / "tuner"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def test_the_wheel_works_from_an_empty_directory(installed, tmp_path):
    where = subprocess.run(
        [installed / "python", "-c", "import tuner; print(tuner.__file__)"],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(installed.parent), where  # the wheel's copy, not this tree

    proc = run(installed, tmp_path, "spaces", "--json")
    assert proc.returncode == 0, proc.stderr
    shipped = sorted(p.stem for p in (ROOT / "search_spaces").glob("*.yaml"))
    assert sorted(row["name"] for row in json.loads(proc.stdout)) == shipped

    proc = run(installed, tmp_path, "render", "transpose", "--set", "tile=64")
    assert proc.returncode == 0, proc.stderr
    assert 'extern "C" __global__' in proc.stdout and "transpose_tile64" in proc.stdout
    # how the README and recorded studies name a shipped space
    assert run(installed, tmp_path, "render", "search_spaces/transpose.yaml").returncode == 0

    proc = run(installed, tmp_path, "check", "transpose", "--sample", "3", "--arch", "sm_90", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["compiled"] == 3

    proc = run(
        installed, tmp_path, "study", "transpose", "--trials", "8", "--replay", str(RECORDING), "--seed", "1", "--json"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["trials"] == 8
    assert (tmp_path / "studies" / "transpose.db").is_file()

    # the C++ header comes from a template that is package data too
    proc = run(installed, tmp_path, "export", "transpose", "--header", "tuned.h")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "tuned.h").read_text()
    assert text.startswith("#pragma once\n") and "namespace tuned::transpose {" in text
    if shutil.which("g++"):
        syntax = subprocess.run(
            ["g++", "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-x", "c++", str(tmp_path / "tuned.h")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert syntax.returncode == 0, syntax.stderr
