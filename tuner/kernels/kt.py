"""A kernel tuned by Kernel Tuner, known only from its cache file: a replay-only family.

Kernel Tuner tunes arbitrary user kernels, which are none of our families. `tuner import-kt CACHE` writes a space
for such a kernel with ``kernel: kt``; a study over it must be answered from the cache (``--replay CACHE``), so
samplers can be compared on Kernel Tuner's recorded spaces. There is no template, so nothing can be rendered,
compiled or run: every method that would need one raises.
"""

from __future__ import annotations

from tuner.kernels.base import Family


class KernelTunerCache(Family):
    name = "kt"
    template = ""
    dtypes = ("float32",)
    problem_sizes = ()
    #: no bytes or FLOPs are known: the study's objective is time_ms
    throughput_unit = "ms"

    def launches(self, entry, config, problem):
        raise NotImplementedError("the kt family is replay-only: answer it with --replay CACHE")


FAMILY = KernelTunerCache()
