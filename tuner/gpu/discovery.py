"""This machine's GPUs, found before any worker starts: how many this process may use and their model (read from
CUDA_VISIBLE_DEVICES, the driver's /proc entries and device nodes, without initialising CUDA where those answer),
why there are none (decided by CUDA's status codes), and the refusals of a GPU count or index that cannot be met.

Each refusal raises `InputError` with one line naming the flag and the fault, before Ray, a GPU worker or a storage
is touched.
"""

from __future__ import annotations

import os
from pathlib import Path

from tuner.core.errors import InputError
from tuner.space.limits import max_replay_workers


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


def local_gpu_model() -> str | None:
    """The model of this machine's GPUs as the NVIDIA driver lists them (the ``Model:`` line of each
    /proc/driver/nvidia/gpus/*/information, the board name CUDA reports too), read without CUDA; None where the
    driver lists none, or GPUs of more than one model (which of them a worker gets is CUDA's to say)."""
    models = set()
    try:
        for info in Path("/proc/driver/nvidia/gpus").glob("*/information"):
            for line in info.read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "Model":
                    models.add(value.strip())
    except OSError:
        return None
    return models.pop() if len(models) == 1 else None


#: CUDA runtime statuses (``cudaError_t``) that mean "no GPU here", not a fault of ours
CUDA_INSUFFICIENT_DRIVER = 35
CUDA_NO_DEVICE = 100


def _cuda_version(number: int) -> str:
    return f"{number // 1000}.{number % 1000 // 10}"


def no_gpu_reason() -> str:
    """Why this process can use no NVIDIA GPU, in words a user can act on (no driver, a driver too old for this
    CUDA runtime, no device, CUDA_VISIBLE_DEVICES hiding them); decided by CUDA's status codes."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and local_gpus() == 0:
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    try:
        from tuner.core.cudalib import runtime
    except ImportError:
        return "CuPy (cupy-cuda13x) is not installed"
    driver = runtime.driverGetVersion()  # 0 where no driver is loaded; needs none to answer
    if driver == 0:
        return "no NVIDIA driver is installed (or loaded) on this machine"
    try:
        count = runtime.getDeviceCount()
    except runtime.CUDARuntimeError as exc:
        if exc.status == CUDA_INSUFFICIENT_DRIVER:
            return (
                f"the NVIDIA driver (CUDA {_cuda_version(driver)}) is older than this CUDA runtime needs "
                f"(CUDA {_cuda_version(runtime.runtimeGetVersion())})"
            )
        if exc.status != CUDA_NO_DEVICE:
            return f"CUDA cannot start ({exc})"
        count = 0
    return "the NVIDIA driver finds no GPU" if count == 0 else f"the NVIDIA driver finds {count} GPU(s)"


def require_gpu(gpu: int) -> None:
    """Refuse, in words, to start a GPU worker on GPU `gpu` where this machine has no usable GPU or fewer GPUs
    (`tuner bench`, `tuner ceiling`); where the count is unknown, the worker's start decides."""
    have = local_gpus()
    if have == 0:
        raise InputError(
            f"GPU {gpu}: nothing to measure on: {no_gpu_reason()} (`tuner check` compiles and reports resources "
            f"without a GPU)"
        )
    if have is not None and gpu >= have:
        raise InputError(f"--gpu {gpu}: this machine has {have} GPU(s) (0 to {have - 1})")


def gpus(requested: int | None, replay: bool, ray_address: str | None, engine: str = "local") -> None:
    """Refuse a GPU count that cannot be met, before any worker or Ray starts (a cluster is checked once
    joined); `engine` ("local" or "ray") names what needs the GPUs."""
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
        if engine == "ray":
            raise InputError(
                f"the Ray cluster this study would start here has no GPU: {no_gpu_reason()} (join a cluster "
                f"with --ray-address, or use --replay PATH to run without a GPU)"
            )
        raise InputError(
            f"the local engine runs on this machine's GPUs, and it has none: {no_gpu_reason()} (use --replay "
            f"PATH to run without one, or --engine ray --ray-address for a cluster's)"
        )
    if have is not None and requested is not None and requested > have:
        raise InputError(f"--gpus {requested}: this machine has {have} GPU(s)")
