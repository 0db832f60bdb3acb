"""Shared fixtures: every test gets its own compile cache so runs never share state through ~/.cache."""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path

import pytest

from tuner.build.compile import CACHE_VERSION

#: Modules (by their names in the `tests` package) whose tests run many studies and inspect no cache: their tests
#: share two of the cache's folders, the valid-set listings and the replay recordings read into JSON (each keyed by
#: the content it was derived from, written atomically), so that each study does not list the transpose space and
#: read the H200 recording through Optuna afresh (a second or more of CPU a study). Compiles stay private to each
#: test everywhere.
WARM_LISTINGS = {
    "tests.cli.test_cli",
    "tests.cli.test_hostile_inputs",
    "tests.cli.test_terminal",
    "tests.gpu.test_deadline",
    "tests.kernels.test_custom",
    "tests.kernels.test_kt",
    "tests.study.test_concurrency",
    "tests.study.test_driver",
    "tests.study.test_forest",
    "tests.study.test_local",
    "tests.study.test_preflight",
    "tests.study.test_ray_cluster",
    "tests.study.test_screen_cutoff",
    "tests.study.test_shapes",
    "tests.study.test_sidebyside",
    "tests.study.test_study_summary",
    "tests.results.test_best_finalists",
    "tests.results.test_dashboard",
    "tests.test_api",
    "tests.test_install",
    "tests.test_tune",
}
SHARED_FOLDERS = ("valid", "recordings")


@pytest.fixture(scope="session")
def _shared_listings(tmp_path_factory):
    """One folder per test session for the shared listings: under the session's base folder, which the xdist
    workers' own base folders sit in."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    shared = base / "shared-listings"
    for name in SHARED_FOLDERS:
        (shared / name).mkdir(parents=True, exist_ok=True)
    return shared


@pytest.fixture(autouse=True)
def _isolated_cache(request, tmp_path_factory, monkeypatch):
    cache = tmp_path_factory.mktemp("cache")
    if request.module.__name__ in WARM_LISTINGS:
        shared = request.getfixturevalue("_shared_listings")
        (cache / CACHE_VERSION).mkdir()
        for name in SHARED_FOLDERS:
            (cache / CACHE_VERSION / name).symlink_to(shared / name, target_is_directory=True)
    monkeypatch.setenv("TUNER_CACHE_DIR", str(cache))


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: two workers a core (4 on 2 cores). Part of the suite's time is spent waiting on children (GPU
    worker and writer processes, Ray's start, pseudo-terminals, deadlines running out), which more workers fill: on
    2 cores, one tree took 494 s with 3 workers (1.77 cores busy) and 431 s with 4, every test passing."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, 2 * cores)


#: Held by the test that uses the GPU: every xdist worker takes it around a GPU test, its fixtures included.
GPU_LOCK = Path(tempfile.gettempdir()) / "tuner-gpu-tests.lock"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """One GPU test at a time across the xdist workers: GPU tests time kernels and measure the copy ceiling, and
    two at once on one GPU time each other's traffic (on a fresh H100, a copy config timed at 1.43 of a ceiling
    measured while other tests ran). CPU tests still run side by side."""
    if item.get_closest_marker("gpu") is None:
        yield
        return
    with open(GPU_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
