"""The reference of swiglu.yaml: out = silu(gate) * up, where gate and up are the two halves of each row of x."""

import numpy as np


def swiglu(x, H, xp=np):
    """x: M x 2H float64 array (NumPy; CuPy where the tuner passes `xp`), H: the width of out; returns M x H."""
    gate, up = x[:, :H], x[:, H:]
    return gate / (1.0 + xp.exp(-gate)) * up
