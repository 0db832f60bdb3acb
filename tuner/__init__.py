"""tuner: auto-tuning search for memory-bound CUDA kernels.

The public surface: load a space, run a study and read its result (`tuner.api`), the family contract for a kernel
of your own (`tuner.kernels.base.Family`), and the result types every stage returns.
"""

import importlib as _importlib
import time as _time

#: When the package was first imported: for `python -m tuner` and the `tuner` script, the start of the command
#: (give or take the interpreter's own start-up). Cold-start figures are measured from here.
IMPORTED_AT = _time.perf_counter()

from tuner.errors import InputError, SpaceError, TemplateError  # noqa: E402

# `tuner.study` names the API call (`tuner.api.study`), and `tuner/study/` is the study stage's package. Importing a
# package binds it as an attribute of its parent when it first loads; the stage package (its __init__ is only a
# docstring) is loaded here, first, and that binding dropped, so that `tuner.study` resolves through `__getattr__`
# below to the call, and importing the stage's modules later (``from tuner.study.driver import Driver``) does not
# bind it again.
_importlib.import_module("tuner.study")
del globals()["study"]

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
    "ProblemsResult": "tuner.api",
    "load_space": "tuner.api",
    "open_study": "tuner.api",
    "tune": "tuner.api",
    "tune_space": "tuner.api",
    "bench": "tuner.api",
    "study": "tuner.api",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "CompileFailed",
    "Family",
    "Launch",
    "ProblemsResult",
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
