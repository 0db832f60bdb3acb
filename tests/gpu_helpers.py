"""A kernel that keeps a stream busy, for the tests of stream ordering: work enqueued behind it lands late, so a
consumer that is not ordered after it reads too early, every time, not only on a cold machine.

Loading a module synchronizes the CUDA context (it waits for the spin): a test warms every kernel it uses before it
spins, or the load orders the race it means to show."""

from __future__ import annotations

import functools

SPIN_SOURCE = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


@functools.cache
def _spin_kernel():
    import cupy

    return cupy.RawKernel(SPIN_SOURCE, "spin")  # one object, so its module loads once


def spin(stream, seconds: float) -> None:
    """Enqueue on `stream` one thread that returns after `seconds` of GPU time."""
    import numpy as np

    _spin_kernel()((1,), (1,), (np.uint64(int(seconds * 1e9)),), stream=stream)
