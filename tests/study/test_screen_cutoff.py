"""Multi-fidelity screening: the study times a config in full only while it could be a contender.

The real driver and local engine (real NVRTC compiles in threads) run over an evaluator that answers from the H200
transpose recording (tests/data/README.md) but, like a GPU evaluator, `measures` (so configs are compiled, the
cut-off applies and the finalists are re-timed) and honours `cutoff_ms` as `tuner.gpu.timing.benchmark` does: a config
whose recorded time is over the cut-off comes back with the 3 repetitions of the estimate.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

from tuner.gpu import discovery
from tuner.study import local
from tuner.study.driver import Driver
from tuner.study.options import StudyOptions
from tuner.study.replay import ReplayEvaluator

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"
SPACE = ROOT / "search_spaces" / "transpose.yaml"


class CutoffProbe(ReplayEvaluator):
    """A recorded answer, cut short as the GPU evaluator would cut it; every call's cut-off is kept."""

    measures = True
    calls: list[tuple[str, float | None, float]] = []
    lock = threading.Lock()

    def evaluate(self, request):
        assert request.compiled is not None and request.compiled.ok  # a measuring evaluator gets the real cubin
        budget_ms, min_reps, cutoff_ms = request.budget_ms, request.min_reps, request.cutoff_ms
        result = super().evaluate(request)
        if result.ok and result.repetitions < min_reps:
            # the recording was made with the cut-off on: its cut-short configs stand for full timings here
            result = dataclasses.replace(result, repetitions=min_reps)
        with self.lock:
            self.calls.append((result.uri if result.ok else "", cutoff_ms, budget_ms))
        if result.ok and cutoff_ms is not None and result.median_ms > cutoff_ms:
            return dataclasses.replace(result, repetitions=3)
        return result


@pytest.fixture
def probe(monkeypatch, tmp_path):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    CutoffProbe.calls = []
    monkeypatch.setattr(local, "isolated_gpu_evaluator", lambda i, timeout_s=60.0, ahead=None: CutoffProbe(RECORDING))
    monkeypatch.setattr(discovery, "local_gpus", lambda: 1)  # the probe stands in for one GPU
    return CutoffProbe


def _study(tmp_path, **kw):
    opts = dict(
        kernel="transpose",
        space=str(SPACE),
        trials=30,
        storage=f"sqlite:///{tmp_path / 'cut.db'}",
        seed=0,
        gpus=1,
        progress=False,
        finalists=3,
    )
    opts.update(kw)
    return Driver(StudyOptions(**opts)).run()


def test_configs_behind_the_best_are_cut_short_and_finalists_never(probe, tmp_path):
    summary = _study(tmp_path)
    screening, finals = probe.calls[:-3], probe.calls[-3:]
    assert len(screening) == summary["trials"] == 30
    # The space default goes out before anything is known: no cut-off.
    assert screening[0][1] is None
    cutoffs = [c for _, c, _ in screening if c is not None]
    assert cutoffs and all(b <= a for a, b in zip(cutoffs, cutoffs[1:], strict=False))  # only tightens
    # Each cut-off is 1.05x a median measured in this study, never below the study's best.
    medians = {_median(probe, uri) for uri, _, _ in screening if uri}
    assert all(any(c == pytest.approx(1.05 * m) for m in medians) for c in set(cutoffs))
    assert min(cutoffs) >= 1.05 * summary["best"]["screening"]["median_ms"] * (1 - 1e-9)
    assert summary["cut_short_this_run"] > 0
    assert summary["cut_short_this_run"] == sum(
        1 for uri, c, _ in screening if c is not None and _median(probe, uri) > c
    )
    # The finalists are timed in full, with the long budget: 300 ms, or 200 repetitions where that is less.
    assert all(c is None for _, c, _ in finals)
    assert [budget for _, _, budget in finals] == [
        pytest.approx(min(300.0, 200 * _median(probe, uri))) for uri, _, _ in finals
    ]
    assert any(budget < 300.0 for _, _, budget in finals)  # transpose's 0.15 ms configs: the repetitions bind


def test_cutoff_off_times_every_config_in_full(probe, tmp_path):
    summary = _study(tmp_path, screen_cutoff=None)
    assert all(c is None for _, c, _ in probe.calls)
    assert summary["cut_short_this_run"] == 0


def _median(probe, uri: str) -> float:
    replay = ReplayEvaluator(RECORDING)
    for _, attrs in replay.records.values():
        if attrs.get("uri") == uri:
            return attrs["median_ms"]
    raise KeyError(uri)


def test_the_command_sets_the_cutoff(probe, tmp_path):
    """`tuner study --screen-cutoff X` reaches the driver; `off` times every config in full."""
    from tuner.cli.main import main

    storage = f"sqlite:///{tmp_path / 'cli.db'}"
    base = ["study", "transpose", "--space", str(SPACE), "--trials", "12", "--seed", "0", "--json", "--gpus", "1"]
    assert main([*base, "--storage", storage, "--screen-cutoff", "1.5"]) == 0
    cutoffs = {c for _, c, budget in probe.calls if c is not None and budget == 5.0}  # screening's default budget
    assert cutoffs and all(
        any(c == pytest.approx(1.5 * _median(probe, u)) for u, _, _ in probe.calls if u) for c in cutoffs
    )
    probe.calls.clear()
    assert main([*base, "--storage", storage + "2", "--screen-cutoff", "off"]) == 0
    assert probe.calls and all(c is None for _, c, _ in probe.calls)


def test_the_command_sets_the_screening_budget(probe, tmp_path):
    """`tuner study --screen-ms X` is the timed work of every screening evaluation; the finalists keep theirs."""
    from tuner.cli.main import main

    args = ["study", "transpose", "--space", str(SPACE), "--trials", "12", "--seed", "0", "--json", "--gpus", "1"]
    assert main([*args, "--storage", f"sqlite:///{tmp_path / 'ms.db'}", "--screen-ms", "7"]) == 0
    screening = [budget for _, _, budget in probe.calls if budget < 50]
    finals = [budget for _, _, budget in probe.calls if budget >= 50]  # min(300 ms, 200 x a ~0.5 ms median)
    assert len(screening) >= 12 and set(screening) == {7.0}
    assert len(finals) == 5
