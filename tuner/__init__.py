"""tuner: auto-tuning search for memory-bound CUDA kernels.

The public surface: load a space, run a study and read its result (`tuner.api`), the family contract for a kernel
of your own (`tuner.kernels.base.Family`), and the result types every stage returns.
"""

import time as _time

#: When the package was first imported: for `python -m tuner` and the `tuner` script, the start of the command
#: (give or take the interpreter's own start-up). Cold-start figures are measured from here.
IMPORTED_AT = _time.perf_counter()

# `tuner.study` and `tuner.bench` are both a stage module and an API call (see `tuner.api.callable_module`).
# study.py is light and loads here; bench.py needs CuPy, so it loads (and becomes callable) on first use.
import tuner.study as study  # noqa: E402, I001
from tuner.api import StudyResult, callable_module, load_space  # noqa: E402
from tuner.errors import InputError, SpaceError, TemplateError  # noqa: E402
from tuner.kernels.base import Family, Launch  # noqa: E402
from tuner.result import CompileFailed, Invalid, LaunchFailed, Measurement, TimedOut, WrongResult  # noqa: E402
from tuner.space import SearchSpace, load  # noqa: E402

callable_module("tuner.study")


def __getattr__(name: str):
    if name == "bench":
        import importlib

        return callable_module(importlib.import_module("tuner.bench").__name__)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = [
    "CompileFailed",
    "Family",
    "Launch",
    "StudyResult",
    "bench",
    "load_space",
    "study",
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
