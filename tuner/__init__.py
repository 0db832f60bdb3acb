"""tuner: auto-tuning search for memory-bound CUDA kernels.

The public surface: load a space, run a study and read its result (`tuner.api`), the family contract for a kernel
of your own (`tuner.kernels.base.Family`), and the result types every stage returns.
"""

import time as _time

#: When the package was first imported: for `python -m tuner` and the `tuner` script, the start of the command
#: (give or take the interpreter's own start-up). Cold-start figures are measured from here.
IMPORTED_AT = _time.perf_counter()

# `tuner.study` is the API function, not the submodule of that name: the submodule is loaded first, so later
# `from tuner.study import ...` statements find it in sys.modules and leave the attribute alone.
import tuner.study as _study_module  # noqa: E402, F401, I001
from tuner.api import StudyResult, bench, load_space, study  # noqa: E402
from tuner.errors import InputError, SpaceError, TemplateError  # noqa: E402
from tuner.kernels.base import Family, Launch  # noqa: E402
from tuner.result import CompileFailed, Invalid, LaunchFailed, Measurement, TimedOut, WrongResult  # noqa: E402
from tuner.space import SearchSpace, load  # noqa: E402

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
