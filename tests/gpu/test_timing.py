"""The timing arithmetic (`tuner.gpu.timing`) on the CPU: repetitions that fill the budget, the median and
percentiles, and launches enqueued behind a hold in batches."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.gpu import timing as gpu_timing


@pytest.mark.parametrize(
    ("estimate_ms", "budget_ms", "expected"),
    [
        (0.1, 25.0, 250),
        (1.0, 25.0, 25),
        (5.0, 25.0, 10),
        (1e-5, 25.0, 10_000),
        (0.0, 25.0, 10_000),
        (float("nan"), 25.0, 10),
        (0.07, 25.0, 357),
    ],
)
def test_repetitions_fill_the_budget_within_bounds(estimate_ms, budget_ms, expected):
    assert gpu_timing.repetitions(estimate_ms, budget_ms, min_reps=10, max_reps=10_000) == expected


def test_summarize_reports_median_and_p20_p80():
    times = [5.0, 1.0, 4.0, 2.0, 3.0, 10.0, 6.0, 8.0, 7.0, 9.0]
    timing = gpu_timing.summarize(times)
    assert timing.median_ms == pytest.approx(5.5)
    assert timing.p20_ms == pytest.approx(np.percentile(times, 20))
    assert timing.p80_ms == pytest.approx(np.percentile(times, 80))
    assert timing.repetitions == 10


class ScriptedHold:
    """Stands in for `tuner.gpu.timingkernels.Hold`: logs hold/release and gives up on the batches it is told to."""

    def __init__(self, gives_up_after: set[int]):
        self.log: list[str] = []
        self.gives_up_after = gives_up_after  # batch numbers (from 0) the hold gives up on
        self.batches = 0

    def hold(self) -> None:
        self.log.append("hold")

    def release(self) -> None:
        self.log.append("release")

    def gave_up(self) -> bool:
        self.batches += 1
        return self.batches - 1 in self.gives_up_after


def test_launches_are_enqueued_in_order_in_held_batches_that_halve_after_a_give_up():
    hold = ScriptedHold(gives_up_after={1, 2})
    enqueued: list[int] = []
    sizes = gpu_timing.enqueue_behind(hold, 50, lambda i: (enqueued.append(i), hold.log.append("launch")))
    assert enqueued == list(range(50))
    assert sizes == [16, 16, 8, 4, 4, 2] and sum(sizes) == 50
    # each batch: hold, its launches, release
    expected = [entry for size in sizes for entry in ["hold", *["launch"] * size, "release"]]
    assert hold.log == expected


def test_without_a_hold_every_launch_goes_in_one_batch():
    enqueued: list[int] = []
    assert gpu_timing.enqueue_behind(None, 40, enqueued.append) == [40]
    assert enqueued == list(range(40))
    assert gpu_timing.enqueue_behind(None, 0, enqueued.append) == []


def test_a_launch_that_raises_still_releases_the_stream():
    hold = ScriptedHold(gives_up_after=set())

    def enqueue(i: int) -> None:
        if i == 20:
            raise RuntimeError("launch refused")

    with pytest.raises(RuntimeError, match="launch refused"):
        gpu_timing.enqueue_behind(hold, 40, enqueue)
    assert hold.log == ["hold", "release", "hold", "release"]
