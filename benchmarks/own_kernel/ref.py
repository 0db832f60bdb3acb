"""The reference of swiglu.yaml: out = silu(gate) * up, where gate and up are the two halves of each row of x."""

import numpy as np


def swiglu(x, H):
    """x: M x 2H NumPy array (float32: the output is bf16), H: the width of out; returns M x H. Plain NumPy, as
    a user first writes it: the tuner runs it once per input set of its pool."""
    gate, up = x[:, :H], x[:, H:]
    return gate / (1.0 + np.exp(-gate)) * up
