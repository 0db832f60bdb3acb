"""adamw: one fused AdamW step over a list of parameter tensors, in one launch (templates/adamw.cu.j2).

Per tensor, in place: fp32 master weights p, bf16 gradients g, fp32 moments m (exp_avg) and v (exp_avg_sq):

    p ← p·(1 − lr·wd);  m ← β1·m + (1 − β1)·g;  v ← β2·v + (1 − β2)·g²
    p ← p − lr / (1 − β1^step) · m / (sqrt(v) / sqrt(1 − β2^step) + eps)

which is torch.optim.AdamW's math (decoupled weight decay, bias corrections; amsgrad and maximize off), in the
operation order of its fused CUDA kernel.

The tensors: those of `layers` transformer layers with hidden size `hidden`, MLP size `intermediate` and
grouped-query K/V projections of `kv_dim` rows — per layer two norm weights [hidden], q and o [hidden, hidden],
k and v [kv_dim, hidden], gate and up [intermediate, hidden], down [hidden, intermediate] (see `tensor_sizes`).

The kernel reads a table of addresses and counts, so the tensors may live anywhere. The test harness places
each kind (p, g, m, v) in one arena with a gap of at least `GAP` elements between tensors (each tensor starts
`ALIGN`-element aligned): the gaps hold random data that the reference leaves as it is, so a write past the
end of a tensor is a wrong result. The arenas ``p``, ``m``, ``v`` are checked in place (`checked`); the
hyper-parameters (`HYPER`) travel as kernel arguments, passed as NumPy scalars among the inputs.

Accounting: `bytes_moved` reads p, g, m, v and writes p, m, v once: 26 bytes per element; `flops` counts 14
per element (the operations of the formula above).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tuner.expr.ops import ceil_div
from tuner.kernels import bf16
from tuner.kernels.base import Config, Family, Launch, Problem

#: Hyper-parameters of the checked and timed step. lr and weight decay are larger than a typical run's so that
#: each term of the update is far above the fp32 tolerance (the decay term is lr·wd·p = 1e-3·p); step 10 makes
#: both bias corrections matter.
HYPER = {"lr": 1e-2, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.1, "step": 10}
#: Arena layout of the harness: tensors start at multiples of ALIGN elements, at least GAP elements apart.
ALIGN = 64
GAP = 64
#: 64-bit words per table row: addresses of p, g, m, v, then the element count.
ROW_WORDS = 5


def tensor_sizes(problem: Problem) -> list[int]:
    """Element counts of the problem's tensors, in table order."""
    h, f, kv = problem["hidden"], problem["intermediate"], problem["kv_dim"]
    layer = [h, h * h, kv * h, kv * h, h * h, h, f * h, f * h, h * f]
    return layer * problem["layers"]


def layout(problem: Problem) -> tuple[list[int], int]:
    """(offset of each tensor in its arena, arena length in elements)."""
    offsets, end = [], 0
    for n in tensor_sizes(problem):
        offsets.append(end)
        end = ceil_div(end + n + GAP, ALIGN) * ALIGN
    return offsets, end


def inside(xp, problem: Problem):
    """Boolean mask over an arena: True on tensor elements, False on the gaps."""
    offsets, length = layout(problem)
    mask = xp.zeros(length, dtype=bool)
    for offset, n in zip(offsets, tensor_sizes(problem), strict=True):
        mask[offset : offset + n] = True
    return mask


def address(array) -> int:
    """Device (cupy) or host (numpy) address of an array's first element."""
    data = array.data
    return int(data.ptr) if hasattr(data, "ptr") else int(array.ctypes.data)


def adamw_step(xp, p, g, m, v, lr, beta1, beta2, eps, weight_decay, step):
    """One AdamW step on arrays of one dtype (fp32 in the reference), in torch's fused order; new (p, m, v)."""
    dt = p.dtype.type
    bc1 = 1.0 - beta1**step  # Python floats: double, as torch computes them
    bc2_sqrt = (1.0 - beta2**step) ** 0.5
    p = p * dt(1.0 - lr * weight_decay)
    m = dt(beta1) * m + dt(1.0 - beta1) * g
    v = dt(beta2) * v + dt(1.0 - beta2) * g * g
    denom = xp.sqrt(v) / dt(bc2_sqrt) + dt(eps)
    p = p - dt(lr / bc1) * m / denom
    return p, m, v


class AdamW(Family):
    name = "adamw"
    template = "adamw.cu.j2"
    dtypes = ("float32",)
    problem_sizes = ("hidden", "intermediate", "kv_dim", "layers")
    throughput_unit = "TB/s"
    uri_names = {"vec": "v", "threads": "t", "unroll": "u", "hint": "", "min_blocks": "mb"}

    @staticmethod
    def chunk(config: Config) -> int:
        return config["threads"] * config["vec"] * config["unroll"]

    def blocks(self, config: Config, problem: Problem) -> int:
        """One block per chunk of every tensor."""
        return sum(ceil_div(n, self.chunk(config)) for n in tensor_sizes(problem))

    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        blocks = self.blocks(config, problem)
        if blocks > 2**31 - 1:
            raise ValueError(f"adamw: {blocks} chunks exceed the grid's x limit")
        return [
            Launch(
                entry=entry,
                grid=(blocks, 1, 1),
                block=(config["threads"], 1, 1),
                args=("table", "lr", "beta1", "beta2", "eps", "weight_decay", "step"),
            )
        ]

    def inputs(self, xp, problem: Problem, rng) -> dict[str, Any]:
        """Arenas p ~ N(0, 1), g ~ N(0, 1) (bf16), m ~ N(0, 0.1²), v ~ (N(0, 0.1²))² + 1e-4 (the update
        m / sqrt(v) stays O(1)), gaps included; the table of tensor addresses; the hyper-parameters."""
        offsets, length = layout(problem)
        p = rng.standard_normal(length, dtype=xp.float32)
        g = bf16.random(xp, rng, (length,))
        m = rng.standard_normal(length, dtype=xp.float32) * xp.float32(0.1)
        v = (rng.standard_normal(length, dtype=xp.float32) * xp.float32(0.1)) ** 2 + xp.float32(1e-4)
        rows = np.zeros((len(offsets), ROW_WORDS), dtype=np.int64)
        bases = [address(p), address(g), address(m), address(v)]
        for t, (offset, n) in enumerate(zip(offsets, tensor_sizes(problem), strict=True)):
            rows[t, :4] = [base + offset * size for base, size in zip(bases, (4, 2, 4, 4), strict=True)]
            rows[t, 4] = n
        hyper = {k: (np.int32(x) if k == "step" else np.float32(x)) for k, x in HYPER.items()}
        return {"p": p, "g": g, "m": m, "v": v, "table": xp.asarray(rows), **hyper}

    def outputs(self, problem: Problem, config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
        return {}  # in place: p, m, v are inputs

    def checked(self) -> tuple[str, ...]:
        return ("p", "m", "v")

    def reference(self, xp, inputs: dict[str, Any], problem: Problem, config: Config | None = None) -> dict[str, Any]:
        """p, m, v after one step, in fp32 (the kernel's precision) on every tensor element; the gaps unchanged.
        The hyper-parameters are the fp32 values the kernel receives."""
        hyper = {k: (int(inputs[k]) if k == "step" else float(inputs[k])) for k in HYPER}
        g = bf16.decode(xp, inputs["g"])
        p, m, v = adamw_step(xp, inputs["p"], g, inputs["m"], inputs["v"], **hyper)
        mask = inside(xp, problem)
        return {name: xp.where(mask, new, inputs[name]) for name, new in (("p", p), ("m", m), ("v", v))}

    def tolerance(self, problem: Problem) -> float:
        """fp32 in, fp32 out, a dozen operations in a possibly different order: a few ulp (~1e-7 relative).
        1e-5 of max(|ref|, 1) catches any missing term: the smallest, weight decay, moves p by 1e-3·|p|."""
        return 1e-5

    def bytes_moved(self, problem: Problem) -> int:
        return 26 * sum(tensor_sizes(problem))  # read p, m, v (4 B) and g (2 B); write p, m, v

    def flops(self, problem: Problem) -> int:
        return 14 * sum(tensor_sizes(problem))


FAMILY = AdamW()
