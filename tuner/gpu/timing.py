"""The timing protocol, written once: warm-up, a first estimate, repetitions sized to a budget, CUDA events.

Before each repetition a read of twice the L2 empties it (`L2_FLUSH`), outside the timed region; one CUDA event
pair per repetition around all of a config's launches, on one stream; the repetitions are enqueued behind a
stream hold in batches (`LAUNCH_HOLD`), so that no timed region contains a wait for the host; the median and
p20/p80 are reported. `time_launches` is the only place in the package that records CUDA events.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

#: How the L2 is emptied before each timed launch (recorded with every measurement, in `versions`): a read of
#: twice the L2 (`tuner.gpu.timingkernels.ReadFlush`). A memset of the same size left the L2 full of dirty lines
#: whose write-back the next launch paid (benchmarks/results/launch_gap-2026-12-01.md).
L2_FLUSH = "read 2x L2"


#: How the host's enqueue time is kept out of the timings (recorded with every measurement, in `versions`): the
#: repetitions are enqueued in batches behind a kernel that holds the stream until the whole batch is in
#: (`tuner.gpu.timingkernels.Hold`). Without it, a call whose host side takes longer than the GPU's flush and kernel
#: (a peer library's dispatch, or any call while the CPUs are busy) is timed with the GPU idle inside its event
#: pair, waiting for the launch.
LAUNCH_HOLD = "hold per batch of up to 16"


HOLD_BATCH = 16


@dataclass(frozen=True)
class Timing:
    """Per-call milliseconds over `repetitions` timed repetitions; `total_ms` sums every repetition timed on the
    way (the estimate's too): the GPU time the protocol spent on the call."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    repetitions: int
    total_ms: float = 0.0


def summarize(times_ms: list[float]) -> Timing:
    p20, median, p80 = np.percentile(np.asarray(times_ms, dtype=np.float64), [20, 50, 80])
    return Timing(
        median_ms=float(median),
        p20_ms=float(p20),
        p80_ms=float(p80),
        repetitions=len(times_ms),
        total_ms=float(np.sum(times_ms)),
    )


def repetitions(estimate_ms: float, budget_ms: float, min_reps: int = 10, max_reps: int = 10_000) -> int:
    """How many repetitions fill `budget_ms` of timed work, given one takes about `estimate_ms`; clamped to
    [min_reps, max_reps]."""
    if not math.isfinite(estimate_ms) or estimate_ms < 0:
        return min_reps
    if estimate_ms == 0:  # below the events' resolution
        return max(min_reps, max_reps)
    return int(min(max_reps, max(min_reps, round(budget_ms / estimate_ms))))


def enqueue_behind(hold, n: int, enqueue: Callable[[int], None]) -> list[int]:
    """Call ``enqueue(i)`` for i = 0 .. n-1 in order. Without a hold, in one go; with one
    (`tuner.gpu.timingkernels.Hold`), in batches of up to HOLD_BATCH, each between ``hold.hold()`` and
    ``hold.release()`` (released also when `enqueue` raises, so the stream is never left held); a batch the hold
    gave up on (``hold.gave_up()``: the host took longer than its timeout) halves the next one. Returns the
    batch sizes."""
    sizes: list[int] = []
    batch = HOLD_BATCH if hold is not None else n
    i = 0
    while i < n:
        size = min(batch, n - i)
        if hold is not None:
            hold.hold()
        try:
            for j in range(i, i + size):
                enqueue(j)
        finally:
            if hold is not None:
                hold.release()
        sizes.append(size)
        i += size
        if hold is not None and hold.gave_up():
            batch = max(1, batch // 2)
    return sizes


def time_launches(
    run: Callable[[], None],
    *,
    stream,
    reps: int,
    flush: Callable[[], None] | None = None,
    sync: Callable[[], None] | None = None,
    hold=None,
) -> list[float]:
    """Time `reps` calls of `run` (which enqueues its work on `stream`): for each, `flush` (outside the
    timed region), then a CUDA event pair around `run`. Everything is enqueued first and synchronized once at
    the end (`sync`, default ``stream.synchronize()``), so the host never waits between repetitions. With a
    `hold` (`tuner.gpu.timingkernels.Hold` on `stream`) the repetitions are enqueued behind it in batches
    (`enqueue_behind`), so that the GPU never waits for the host inside an event pair. Returns the
    per-repetition milliseconds. The only place in the package that records CUDA events."""
    import cupy

    events = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(reps)]

    def repetition(i: int) -> None:
        start, end = events[i]
        if flush is not None:
            flush()
        start.record(stream)
        run()
        end.record(stream)

    enqueue_behind(hold, reps, repetition)
    (sync or stream.synchronize)()
    if hold is not None:
        hold.gave_up()  # count a give-up of the last batch too
    return [cupy.cuda.get_elapsed_time(start, end) for start, end in events]


def benchmark(
    run: Callable[[], None],
    *,
    stream,
    budget_ms: float,
    min_reps: int = 10,
    max_reps: int = 10_000,
    flush: Callable[[], None] | None = None,
    sync: Callable[[], None] | None = None,
    cutoff_ms: float | None = None,
    warm: bool = False,
    hold=None,
) -> Timing:
    """The protocol around `time_launches`: one warm-up (skipped when `warm`: the caller has just run it), an
    estimate from 3 repetitions, then the budget, each behind `hold` when given (`LAUNCH_HOLD`). When the
    estimate's median exceeds `cutoff_ms`, the estimate is the result (3 repetitions) and the budget is not
    spent."""
    if not warm:
        run()
        (sync or stream.synchronize)()
    first = summarize(time_launches(run, stream=stream, reps=3, flush=flush, sync=sync, hold=hold))
    if cutoff_ms is not None and first.median_ms > cutoff_ms:
        return first
    estimate = first.median_ms
    reps = repetitions(estimate, budget_ms, min_reps, max_reps)
    timing = summarize(time_launches(run, stream=stream, reps=reps, flush=flush, sync=sync, hold=hold))
    return dataclasses.replace(timing, total_ms=timing.total_ms + first.total_ms)
