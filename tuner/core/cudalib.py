"""The one door to CUDA: CuPy's bindings of the CUDA runtime, the driver and NVRTC, for every module of tuner.

    from tuner.core.cudalib import runtime, driver, nvrtc

CuPy documents the runtime and driver bindings as `cupy.cuda.runtime` and `cupy.cuda.driver`; NVRTC it binds
only in `cupy_backends.cuda.libs.nvrtc` (what `cupy.cuda.compiler` calls). All three are taken from
`cupy_backends`, where `cupy.cuda` takes them too: importing them does not import `cupy` itself, which a
compile child and the command line's start-up would otherwise pay for. Each binding is imported when it is
first named (a machine without CuPy fails there, not on importing tuner). A CuPy release that moves them is
mended here, once; tuner imports `cupy_backends` nowhere else.
"""

from __future__ import annotations

from typing import Any

#: the names this module gives → the CuPy module behind each
_BINDINGS = {
    "runtime": "cupy_backends.cuda.api.runtime",
    "driver": "cupy_backends.cuda.api.driver",
    "nvrtc": "cupy_backends.cuda.libs.nvrtc",
}


def __getattr__(name: str) -> Any:
    """`runtime`, `driver` or `nvrtc`: CuPy's binding, imported on first use."""
    if name not in _BINDINGS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    module = importlib.import_module(_BINDINGS[name])
    globals()[name] = module  # the next lookup is a plain attribute
    return module
