"""benchmarks/gallery.py's figures from a stored study and its results file (CPU only: the runs are on the device)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
_spec = importlib.util.spec_from_file_location("gallery", ROOT / "benchmarks" / "gallery.py")
gallery = importlib.util.module_from_spec(_spec)
sys.modules["gallery"] = gallery  # its dataclass looks its module up there
_spec.loader.exec_module(gallery)

RECORDED = ROOT / "benchmarks" / "results" / "kt_kernel-2026-12-04-stencil2d.db"


def test_first_result_and_pace_come_from_the_trials_completion_times():
    trials = gallery.stored_trials(RECORDED, "stencil2d-g8192_float32-NVIDIA_H200")
    assert len(trials) == 60 and all(t["complete"] for t in trials)
    first = min(t["complete"] for t in trials)
    figures = gallery.trial_figures(trials, spawned_epoch=first - 2.5)
    assert figures["first_result_s"] == 2.5 and figures["configs_measured"] == 60
    last = max(t["complete"] for t in trials)
    assert abs(figures["s_per_config_after_first"] - (last - first) / 59) < 1e-4
    # a failed config counts in the pace, never as the first result; a duplicate counts in neither
    changed = [
        {**trials[0], "failure": "wrong_result", "median_ms": None, "complete": first - 1},
        {**trials[1], "duplicate_of": 0, "complete": last + 100},
        *trials[2:],
    ]
    again = gallery.trial_figures(changed, spawned_epoch=first - 2.5)
    assert again["configs_evaluated"] == 59 and again["configs_measured"] == 58 and again["first_result_s"] > 2.5
    assert gallery.trial_figures([], 0.0)["first_result_s"] is None


def test_every_example_has_a_torch_version_and_the_results_file_says_what_failed():
    assert [e.name for e in gallery.EXAMPLES] == list(gallery.PORTS)
    assert all(e.space.is_file() for e in gallery.EXAMPLES)
    example = gallery.BY_NAME["add_rmsnorm"]
    facts = {"problem": "llama3_16k", "bytes": 537_141_248, "configs_valid": 41, "trials": 41}
    study = {"wall_s": 9.0, "first_result_s": 6.5, "s_per_config_after_first": 0.05, "configs_evaluated": 41}
    record = gallery.build_record(example, facts, {"study": study, "peers": {"error": "x"}}, "2026-12-07", "cmd")
    assert record["failed"] == {"side_by_side": "x"} and record["first_result_goal_s"] == 8.0
    text = gallery.markdown([record], "2026-12-07", "cmd")
    assert "| add_rmsnorm | torch | 537 | 41 (41) | 9.0 | 6.50 | 0.050 |" in text and "side_by_side: x" in text
