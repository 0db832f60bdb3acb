"""A kernel that keeps a stream busy, for the tests of stream ordering: work enqueued behind it lands late, so a
consumer that is not ordered after it reads too early, every time, not only on a cold machine."""

from __future__ import annotations

SPIN_SOURCE = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


def spin(stream, seconds: float) -> None:
    """Enqueue on `stream` one thread that returns after `seconds` of GPU time."""
    import cupy
    import numpy as np

    kernel = cupy.RawKernel(SPIN_SOURCE, "spin")
    kernel((1,), (1,), (np.uint64(int(seconds * 1e9)),), stream=stream)
