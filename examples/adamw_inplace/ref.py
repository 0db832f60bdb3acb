"""The AdamW step's reference, as torch.optim.AdamW computes it (decoupled weight decay, bias corrections), on
whichever array module holds the arrays."""

import math


def adamw(param, exp_avg, exp_avg_sq, grad, lr, beta1, beta2, eps, weight_decay, step, n, xp):
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad * grad
    denom = xp.sqrt(exp_avg_sq) / math.sqrt(1 - beta2**step) + eps
    param = param * (1 - lr * weight_decay) - lr / (1 - beta1**step) * exp_avg / denom
    return {"param": param, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
