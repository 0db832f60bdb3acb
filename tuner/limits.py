"""Checks on command-line values that must hold before any work starts.

Each check raises `InputError` with one line naming the flag and the fault, and runs before Ray, a GPU worker
or a storage is touched, so a refused command leaves nothing running and nothing written.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from tuner.errors import InputError

_ARCH = re.compile(r"(sm|compute)_(\d+)([af]?)")

#: Names the command line offers before anything heavy is imported (the study module uses the same tuples).
SAMPLERS = ("tpe", "nsga2", "gp", "cmaes", "random", "grid")
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


def local_gpus() -> int | None:
    """NVIDIA GPUs this process may use: from CUDA_VISIBLE_DEVICES, else the driver's /proc entries, else the CUDA
    runtime's device count (0 without a driver); None when none of them can say (Ray then decides)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e for e in visible.split(",") if e.strip()]
        # CUDA stops at the first invalid entry; "-1" is the common "no GPU" idiom.
        count = 0
        for e in entries:
            if e.strip().startswith("-"):
                break
            count += 1
        return count
    proc = Path("/proc/driver/nvidia/gpus")
    if proc.is_dir():
        return sum(1 for _ in proc.iterdir())
    # A container often has no /proc/driver/nvidia but holds a device node per GPU it was given: counted without
    # CUDA (asking the runtime imports CuPy and initialises the driver, ~0.5 s before any GPU worker could start).
    nodes = [p for p in Path("/dev").glob("nvidia[0-9]*") if p.name.removeprefix("nvidia").isdigit()]
    if nodes:
        return len(nodes)
    try:
        import cupy
    except ImportError:
        return None
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except cupy.cuda.runtime.CUDARuntimeError:  # no driver or no device
        return 0


def gpus(requested: int | None, replay: bool, ray_address: str | None) -> None:
    """Refuse a GPU count that cannot be met, before Ray starts (a cluster is checked once joined)."""
    if ray_address:
        return
    if replay:
        bound = max_replay_workers()
        if requested is not None and requested > bound:
            raise InputError(
                f"--gpus {requested}: a replay runs one process per logical GPU; at most {bound} "
                f"on this machine (4 × {os.cpu_count()} cores)"
            )
        return
    have = local_gpus()
    if have == 0:
        raise InputError("no GPU visible to Ray on this machine (use --replay PATH to run without one)")
    if have is not None and requested is not None and requested > have:
        raise InputError(f"--gpus {requested}: this machine has {have} GPU(s)")
