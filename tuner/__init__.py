"""tuner: auto-tuning search for memory-bound CUDA kernels.

The public surface: load a space, run a study and read its result (`tuner.api`), the family contract for a kernel
of your own (`tuner.kernels.base.Family`), and the result types every stage returns. This package's own module sits
with the faces (pyproject.toml's import contracts): it imports the API, and only the command line imports it.
"""

# `tuner.study` names the API call (`tuner.api.study`), and `tuner/study/` is the study stage's package. Importing a
# package binds it as an attribute of its parent when it first loads, and only then; the stage package (its __init__
# is only a docstring) is loaded here, first, and that binding dropped, so that `tuner.study` resolves through
# `__getattr__` below to the call, and importing the stage's modules later (``from tuner.study.driver import
# Driver``) does not bind it again.
from tuner import study as _stage
from tuner.core.errors import InputError, SpaceError, TemplateError
from tuner.core.shipped import VERSION as __version__  # noqa: F401 - the package's version

# The command's clock starts when the package is first imported.
from tuner.gpu.clock import IMPORTED_AT as IMPORTED_AT

del _stage, globals()["study"]

#: Names imported on first use, so that `tuner --help` does not pay for NumPy, PyYAML, Jinja2 and the stages; each
#: by the module that defines it (`__getattr__`).
_RESULT = frozenset({"CompileFailed", "Invalid", "LaunchFailed", "Measurement", "TimedOut", "WrongResult"})
_SPACE = frozenset({"SearchSpace", "load"})
_FAMILY = frozenset({"Family", "Launch"})
_API = frozenset({"StudyResult", "ProblemsResult", "load_space", "open_study", "tune", "tune_space", "bench", "study"})


def __getattr__(name: str):
    value = _lazy(name)
    globals()[name] = value
    return value


def _lazy(name: str):
    """`name` from the module that defines it, imported now."""
    if name in _RESULT:
        from tuner.core import result

        return getattr(result, name)
    if name in _SPACE:
        from tuner.space import space

        return getattr(space, name)
    if name in _FAMILY:
        from tuner.kernels import base

        return getattr(base, name)
    if name in _API:
        from tuner import api

        return getattr(api, name)
    raise AttributeError(f"module 'tuner' has no attribute {name!r}")


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
