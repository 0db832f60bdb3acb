"""Start-up stamps: seconds from the command's start.

The command starts when the tuner package is first imported (`tuner.IMPORTED_AT`, on `time.perf_counter`'s clock).
On Linux that clock is the host's monotonic clock, shared by every process of the host, so a GPU worker's or the
writer's own `perf_counter()` stamps convert the same way as the driver's.
"""

from __future__ import annotations

import time


def since_command(t: float | None = None) -> float:
    """Seconds, to the millisecond, from the command's start to `t` (a `time.perf_counter()` value; default now)."""
    import tuner

    return round((time.perf_counter() if t is None else t) - tuner.IMPORTED_AT, 3)
