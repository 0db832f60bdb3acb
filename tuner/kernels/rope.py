"""rope: rotary position embedding applied in place to q and k (templates/rope.cu.j2).

NeoX style (rotate halves, as HF Llama's ``rotate_half``): for each head vector x of D elements and i < D/2,
``x'[i] = x[i]·cos[t, i] − x[i + D/2]·sin[t, i]`` and ``x'[i + D/2] = x[i + D/2]·cos[t, i] + x[i]·sin[t, i]``.
q is [T, Hq, D] and k is [T, Hkv, D], bf16, updated in place; the tables cos and sin are [T, D/2] fp32 (one row
per token position, as a decode step's gather of the position table gives them). GQA: Hq is a multiple of Hkv
(a problem where it is not is refused when the space loads).

Problem sizes: T, Hq, Hkv, D. Knobs: vec (pairs per thread per head), heads_per_thread (heads that reuse one
load of the table from registers), tokens_per_block, hint (plain or streaming loads/stores) and min_blocks.

Inputs: q, k ~ N(0, 1) in bf16; the tables hold cos/sin of angles uniform in [π/6, 5π/6] (|sin| ≥ 1/2, so a
pair the kernel skips or rotates the wrong way is off by O(1) — real positions start at angle 0, the identity,
which would hide a skipped token). The check compares q and k after the launch with the float64 rotation of
the inputs; one bf16 rounding is 2^-9 relative, the tolerance 2^-7.

Accounting: q and k read once and written once (bf16), both tables read once (fp32).
"""

from __future__ import annotations

import math
from typing import Any

from tuner.kernels import bf16
from tuner.kernels.base import Config, Family, Launch, Problem


class Rope(Family):
    name = "rope"
    template = "rope.cu.j2"
    dtypes = ("bfloat16",)
    problem_sizes = ("T", "Hq", "Hkv", "D")
    throughput_unit = "TB/s"
    uri_names = {"vec": "v", "heads_per_thread": "hpt", "tokens_per_block": "tpb", "hint": "", "min_blocks": "lb"}

    def problem_fault(self, problem: Problem) -> str | None:
        Hq, Hkv, D = problem["Hq"], problem["Hkv"], problem["D"]
        if Hq % Hkv:
            return f"GQA ratio Hq/Hkv = {Hq}/{Hkv} does not divide (each kv head serves a whole group of q heads)"
        if D % 4:
            return f"head dim D={D} is not a multiple of 4 (two halves of whole 32-bit words)"
        return None

    @staticmethod
    def threads(config: Config, problem: Problem) -> int:
        groups = (problem["Hq"] + problem["Hkv"]) // config["heads_per_thread"]
        return config["tokens_per_block"] * groups * (problem["D"] // 2 // config["vec"])

    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        T, Hq, Hkv, D = problem["T"], problem["Hq"], problem["Hkv"], problem["D"]
        vec, hpt, tpb = config["vec"], config["heads_per_thread"], config["tokens_per_block"]
        if (D // 2) % vec or Hq % hpt or Hkv % hpt or T % tpb or self.threads(config, problem) > 1024:
            raise ValueError(
                f"rope: vec={vec}, heads_per_thread={hpt}, tokens_per_block={tpb} do not tile "
                f"T={T}, Hq={Hq}, Hkv={Hkv}, D={D} in blocks of at most 1024 threads"
            )
        return [
            Launch(
                entry=entry,
                grid=(T // tpb, 1, 1),
                block=(self.threads(config, problem), 1, 1),
                args=("q", "k", "cos", "sin", "T"),
            )
        ]

    def inputs(self, xp, problem: Problem, rng) -> dict[str, Any]:
        T, Hq, Hkv, D = problem["T"], problem["Hq"], problem["Hkv"], problem["D"]
        angle = rng.uniform(math.pi / 6, 5 * math.pi / 6, size=(T, D // 2))
        return {
            "q": bf16.random(xp, rng, (T, Hq, D)),
            "k": bf16.random(xp, rng, (T, Hkv, D)),
            "cos": xp.cos(angle).astype(xp.float32),
            "sin": xp.sin(angle).astype(xp.float32),
        }

    def outputs(self, problem: Problem, config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
        return {}  # q and k are updated in place

    def checked(self) -> tuple[str, ...]:
        return ("q", "k")

    def checked_value(self, xp, name: str, array, dtype: str | None):
        return bf16.decode(xp, array)  # q and k: inputs updated in place, bf16 bits

    def reference(self, xp, inputs: dict[str, Any], problem: Problem, config: Config | None = None) -> dict[str, Any]:
        """The rotation in float64 of the exact inputs (computed before the launch changes them)."""
        half = problem["D"] // 2
        cos = inputs["cos"].astype(xp.float64)[:, None, :]
        sin = inputs["sin"].astype(xp.float64)[:, None, :]
        out = {}
        for name in ("q", "k"):
            x = bf16.decode(xp, inputs[name]).astype(xp.float64)
            x1, x2 = x[..., :half], x[..., half:]
            out[name] = xp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        return out

    def tolerance(self, problem: Problem) -> float:
        return 2.0**-7

    def bytes_moved(self, problem: Problem) -> int:
        T, Hq, Hkv, D = problem["T"], problem["Hq"], problem["Hkv"], problem["D"]
        return 2 * 2 * T * (Hq + Hkv) * D + 2 * 4 * T * (D // 2)

    def flops(self, problem: Problem) -> int:
        return 6 * problem["T"] * (problem["Hq"] + problem["Hkv"]) * (problem["D"] // 2)  # 4 mul + 2 add a pair


FAMILY = Rope()
