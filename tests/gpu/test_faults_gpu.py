"""A user's kernel whose configs fault on purpose, studied on a real GPU: each fault ends as its typed failure, the
study finishes, and a hung config costs its deadline (about a second), not the minute of ``--timeout``.

The space is tests/data/faults (a declarative family: out = x, broken one way per config: a thread that spins
forever, an illegal address, a trap, a misaligned store, a wrong result, an out-of-memory device allocation, too
many registers and too much shared memory for the launch). `benchmarks/faults.py` runs the same study and records
what each hang cost. Skipped where there is no CUDA GPU::

    python3 -m pytest -q tests/gpu/test_faults_gpu.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAULTS = ROOT / "tests" / "data" / "faults"

#: What each config's mode must end as: a trial's ``user_attrs["failure"]`` (None: measured).
EXPECTED = {
    "ok": None,
    "hang": "timed_out",
    "illegal": "launch_failed",
    "trap": "launch_failed",
    "misaligned": "launch_failed",
    "wrong": "wrong_result",
    "oom": "launch_failed",
    "regs": "launch_failed",
    "smem": "launch_failed",
}


def _gpu_count() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device: all mean "no GPU here"
        return 0


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_gpu_count() == 0, reason="needs a CUDA GPU")]


def run_fault_study(folder: Path, timeout_s: float = 60.0) -> tuple[dict, dict[str, dict]]:
    """Copy the fault space into `folder`, study all its configs (a grid) on GPU 0; return the study's summary and,
    by mode, each trial's failure kind (None: measured) and reason."""
    from tuner.api import study

    work = Path(folder) / "faults"
    shutil.copytree(FAULTS, work)
    result = study(
        work / "faults.yaml",
        trials=len(EXPECTED),
        sampler="grid",
        storage=f"sqlite:///{work}/faults.db",
        gpus=1,
        timeout=timeout_s,
        screen_cutoff=None,
    )
    by_mode = {
        t.params["mode"]: {
            "failure": t.user_attrs.get("failure"),
            "reason": t.user_attrs.get("reason"),
            "state": t.state.name,
            "number": t.number,
        }
        for t in result.study.trials
    }
    return result.summary, by_mode


def test_every_fault_ends_as_its_typed_failure_and_the_study_finishes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    summary, by_mode = run_fault_study(tmp_path)
    assert set(by_mode) == set(EXPECTED), by_mode
    assert {mode: trial["failure"] for mode, trial in by_mode.items()} == EXPECTED, by_mode
    assert "CUDA error 716" in by_mode["misaligned"]["reason"]  # misaligned address: decided by its status code
    assert "threads per block" in by_mode["regs"]["reason"] and "shared memory" in by_mode["smem"]["reason"]
    # The hang is caught at its deadline (about a second), not at the 60 s ceiling; its cost is recorded.
    (hang,) = summary["hangs"]
    assert hang["trial"] == by_mode["hang"]["number"] and hang["deadline_s"] < 5.0
    assert hang["cost_s"] < 30.0, hang  # loose here: benchmarks/faults.py records it and holds it to 2 s
    print(f"hang: {hang}; replacements: {summary['replacements_s']}")
