"""CUDA status codes → typed failures, decided by the code and never by message text.

A refused launch (or a module that would not load) is a `LaunchFailed` with ``details["sticky"] = False``: nothing
ran and the context is fine. A fault that poisons the CUDA context (illegal address, misaligned address, launch
failure, ...) is a `LaunchFailed` with ``details["sticky"] = True``: the evaluator is `poisoned` and its process
must be replaced. A status we do not expect from a bad kernel is no failure of the kernel: the caller re-raises.
"""

from __future__ import annotations

from tuner.core.cudalib import driver as _driver
from tuner.core.cudalib import runtime as _runtime
from tuner.core.result import LaunchFailed

#: The exceptions CuPy raises for a failed CUDA call; both carry the CUDA status code as `.status`.
CUDA_ERRORS = (_driver.CUDADriverError, _runtime.CUDARuntimeError)


#: Status codes after which the CUDA context is unusable: every later call fails too, the process must go.
#: Driver (CUresult) and runtime (cudaError_t) use the same numbers for all of these (cuda.h, driver_types.h).
STICKY_STATUSES: dict[int, str] = {
    214: "ECC uncorrectable",
    226: "contained (hardware error)",
    700: "illegal address",
    702: "launch timeout",
    709: "context is destroyed",
    710: "device-side assert",
    714: "hardware stack error",
    715: "illegal instruction",
    716: "misaligned address",
    717: "invalid address space",
    718: "invalid program counter",
    719: "launch failed",
    721: "tensor memory leak",
    911: "external device",
    999: "unknown error",
}


#: Status codes of a refused launch (or a module that would not load): nothing ran, the context is fine.
LAUNCH_STATUSES: dict[int, str] = {
    1: "invalid value",
    2: "out of memory",
    98: "invalid device function",
    200: "invalid image",
    209: "no binary for this GPU",
    218: "invalid PTX",
    222: "unsupported PTX version",
    500: "entry point not found",
    701: "too many resources requested for launch",
    720: "cooperative launch too large",
}


class EvaluatorPoisoned(RuntimeError):
    """evaluate() was called on an evaluator whose CUDA context a sticky error has destroyed."""


def classify_status(status: int | None) -> str | None:
    """``"sticky"`` (context lost), ``"launch"`` (launch refused, context fine) or None (not ours: a bug)."""
    if status in STICKY_STATUSES:
        return "sticky"
    if status in LAUNCH_STATUSES:
        return "launch"
    return None


def status_name(status: int) -> str:
    return STICKY_STATUSES.get(status) or LAUNCH_STATUSES.get(status) or "unclassified"


def cuda_failure(exc: BaseException, phase: str) -> LaunchFailed | None:
    """The LaunchFailed for a CUDA error raised while `phase` ran, or None when its status is not one we
    expect from a bad kernel (then the caller re-raises: it is a bug)."""
    status = getattr(exc, "status", None)
    if status is None:
        return None
    kind = classify_status(status)
    if kind is None:
        return None
    sticky = kind == "sticky"
    reason = f"{phase}: CUDA error {status} ({status_name(status)})"
    if sticky:
        reason += "; the CUDA context is lost and the worker must be replaced"
    return LaunchFailed(
        reason=reason, details={"status": int(status), "sticky": sticky, "phase": phase, "message": str(exc)}
    )
