"""bfloat16 on the host side: stored as uint16 bit patterns.

Neither NumPy nor CuPy has a native bfloat16 array type, so bf16 tensors travel as uint16 arrays holding the
bits (the upper half of a float32). Kernels see them as ``__nv_bfloat16*``; references decode them to float32.
Both helpers work on numpy and cupy alike (`xp`).
"""

from __future__ import annotations

STORAGE = "uint16"


def encode(xp, x):
    """float32 → bf16 bits, rounding to nearest even (what __float2bfloat16_rn does); NaN stays NaN."""
    bits = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    out = ((bits + rounding) >> 16).astype(xp.uint16)
    return xp.where(xp.isnan(x), xp.uint16(0x7FC0), out)


def decode(xp, bits):
    """bf16 bits → float32, exactly."""
    return (xp.asarray(bits).astype(xp.uint32) << 16).view(xp.float32)


def random(xp, rng, shape, scale: float = 1.0):
    """Fresh normal bf16 data (bits) from `rng`, a Generator of `xp` (the GPU worker's generator draws the bits
    in one kernel, `tuner.gpu.devicekernels.DeviceRng.standard_normal_bf16`; the same values as encoding its float32
    draws)."""
    if hasattr(rng, "standard_normal_bf16"):
        return rng.standard_normal_bf16(shape, scale)
    return encode(xp, rng.standard_normal(shape, dtype=xp.float32) * xp.float32(scale))
