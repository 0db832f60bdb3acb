"""tuner: auto-tuning search for memory-bound CUDA kernels.

The public surface: load a space, run a study and read its result (`tuner.api`), the family contract for a kernel
of your own (`tuner.kernels.base.Family`), and the result types every stage returns.
"""

import time as _time

#: When the package was first imported: for `python -m tuner` and the `tuner` script, the start of the command
#: (give or take the interpreter's own start-up). Cold-start figures are measured from here.
IMPORTED_AT = _time.perf_counter()

from tuner.errors import InputError, SpaceError, TemplateError  # noqa: E402

#: Names imported on first use, so that `tuner --help` does not pay for NumPy, PyYAML, Jinja2 and the stages.
_LAZY = {
    "CompileFailed": "tuner.result",
    "Invalid": "tuner.result",
    "LaunchFailed": "tuner.result",
    "Measurement": "tuner.result",
    "TimedOut": "tuner.result",
    "WrongResult": "tuner.result",
    "SearchSpace": "tuner.space.space",
    "load": "tuner.space.space",
    "Family": "tuner.kernels.base",
    "Launch": "tuner.kernels.base",
    "StudyResult": "tuner.api",
    "load_space": "tuner.api",
    "open_study": "tuner.api",
    "tune": "tuner.api",
    "tune_space": "tuner.api",
    "bench": "tuner.api",
}


def __getattr__(name: str):
    import importlib

    # `tuner.study` is still both a stage module and an API call (see `tuner.api.callable_module`)
    if name == "study":
        return importlib.import_module(f"tuner.{name}")
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "CompileFailed",
    "Family",
    "Launch",
    "StudyResult",
    "bench",
    "load_space",
    "open_study",
    "study",
    "tune",
    "tune_space",
    "InputError",
    "Invalid",
    "LaunchFailed",
    "Measurement",
    "SearchSpace",
    "SpaceError",
    "TemplateError",
    "TimedOut",
    "WrongResult",
    "load",
]
