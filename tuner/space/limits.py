"""Checks on command-line values that must hold before any work starts, and the names the command line offers.

Each check raises `InputError` with one line naming the flag and the fault, and runs before Ray, a GPU worker
or a storage is touched, so a refused command leaves nothing running and nothing written.
"""

from __future__ import annotations

import math
import os
import re

from tuner.core.errors import InputError

_ARCH = re.compile(r"(sm|compute)_(\d+)([af]?)")

#: Names the command line offers before anything heavy is imported (the study module uses the same tuples).
SAMPLERS = ("forest", "tpe", "nsga2", "gp", "cmaes", "random", "grid")
ENGINES = ("local", "ray")


def replay_delay(value: float) -> float:
    """A replay delay is a finite number of seconds ≥ 0."""
    if not math.isfinite(value) or value < 0:
        raise InputError(f"--replay-delay {value}: must be a finite number of seconds ≥ 0")
    return value


def arch(value: str) -> str:
    """An NVRTC target such as sm_90 or sm_90a that this NVRTC can compile for."""
    m = _ARCH.fullmatch(value)
    if m is None:
        raise InputError(f"--arch {value}: expected sm_NN (e.g. sm_90)")
    try:
        from cupy.cuda import nvrtc

        supported = tuple(nvrtc.getSupportedArchs())
    except Exception:  # no NVRTC to ask: let the compile report it
        return value
    if int(m.group(2)) not in supported:
        known = ", ".join(f"sm_{a}" for a in supported)
        raise InputError(f"--arch {value}: NVRTC cannot compile for it (supported: {known})")
    return value


def max_replay_workers() -> int:
    """Logical GPUs a replay may ask for: each is a Ray actor process, so a bound on processes, not GPUs."""
    return (os.cpu_count() or 1) * 4
