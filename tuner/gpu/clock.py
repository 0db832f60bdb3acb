"""Start-up stamps: seconds from the command's start; and durations as a person reads them (`human_seconds`).

The command starts when the tuner package is first imported (`IMPORTED_AT`, on `time.perf_counter`'s clock).
On Linux that clock is the host's monotonic clock, shared by every process of the host, so a GPU worker's or the
writer's own `perf_counter()` stamps convert the same way as the driver's.
"""

from __future__ import annotations

import time

#: When the tuner package was first imported (its own module imports this one at its start; `tuner.IMPORTED_AT`):
#: for `python -m tuner` and the `tuner` script, the start of the command (give or take the interpreter's own
#: start-up). Cold-start figures are measured from here.
IMPORTED_AT = time.perf_counter()


def since_command(t: float | None = None) -> float:
    """Seconds, to the millisecond, from the command's start to `t` (a `time.perf_counter()` value; default now)."""
    return round((time.perf_counter() if t is None else t) - IMPORTED_AT, 3)


def human_seconds(seconds: float | None) -> str:
    """A duration as a person reads it: 0.42 s, 5.9 s, 13.6 s, 2 min 05 s; "?" for None."""
    if seconds is None:
        return "?"
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 59.95:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"
