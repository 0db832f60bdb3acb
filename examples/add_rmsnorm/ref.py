"""The fused residual add + RMSNorm's reference, in torch as a model's code writes it: the sum rounded to fp16
(the next layer's residual), normalized in fp32 and scaled by the weight."""

import torch


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, tokens: int):
    h = x + residual
    hf = h.float()
    out = hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return {"out": out.to(h.dtype), "residual_out": h}
