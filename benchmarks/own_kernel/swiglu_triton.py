"""SwiGLU in Triton, as a Triton user writes it: one program per BLOCK_SIZE columns of one row of out, fp32 math,
autotuned with ``@triton.autotune`` over the configs benchmarks/own_kernel.py gives it (BLOCK_SIZE x num_warps).

Imports torch and triton (benchmarks/own_kernel.py --dry-run only parses this file where they are missing).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def swiglu_kernel(x_ptr, out_ptr, M, H, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(1).to(tl.int64)
    cols = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = cols < H
    gate = tl.load(x_ptr + row * 2 * H + cols, mask=mask).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * H + H + cols, mask=mask).to(tl.float32)
    tl.store(out_ptr + row * H + cols, (gate * tl.sigmoid(gate) * up).to(tl.bfloat16), mask=mask)


def autotuned(configs):
    """`swiglu_kernel` under ``@triton.autotune`` over (BLOCK_SIZE, num_warps) pairs, re-tuned per (M, H)."""
    return triton.autotune(
        configs=[triton.Config({"BLOCK_SIZE": block}, num_warps=warps) for block, warps in configs],
        key=["M", "H"],
    )(swiglu_kernel)


def swiglu(x, out=None, kernel=swiglu_kernel, **meta):
    """out = silu(x[:, :H]) * x[:, H:] for a contiguous M x 2H bf16 tensor; `meta` (BLOCK_SIZE, num_warps) for the
    plain kernel, nothing for an `autotuned` one."""
    M, H = x.shape[0], x.shape[1] // 2
    if out is None:
        out = torch.empty((M, H), device=x.device, dtype=x.dtype)
    kernel[lambda m: (triton.cdiv(H, m["BLOCK_SIZE"]), M)](x, out, M, H, **meta)
    return out
