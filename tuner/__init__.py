"""tuner: auto-tuning search for memory-bound CUDA kernels.

The public surface: load a space, render a config, compile it, and the result types every stage returns.
"""

from tuner.errors import InputError, SpaceError, TemplateError
from tuner.result import CompileFailed, Invalid, LaunchFailed, Measurement, TimedOut, WrongResult
from tuner.space import SearchSpace, load

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
