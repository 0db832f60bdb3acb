"""tuner: auto-tuning search for memory-bound CUDA kernels.

The public surface: load a space, render a config, compile it, and the result types every stage returns.
"""

import time as _time

#: When the package was first imported: for `python -m tuner` and the `tuner` script, the start of the command
#: (give or take the interpreter's own start-up). Cold-start figures are measured from here.
IMPORTED_AT = _time.perf_counter()

from tuner.errors import InputError, SpaceError, TemplateError  # noqa: E402
from tuner.result import CompileFailed, Invalid, LaunchFailed, Measurement, TimedOut, WrongResult  # noqa: E402
from tuner.space import SearchSpace, load  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CompileFailed",
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
