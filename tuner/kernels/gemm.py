"""gemm: FP32 C = gelu(A·B + bias) + R with a fusable epilogue (templates/gemm.cu.j2).

A is M×K, B is K×N, R and C are M×N, bias has N entries; all float32, row-major. The config's `fusion`
(0..3) says how many epilogue stages (bias → GELU → residual) the GEMM kernel applies itself; each remaining
stage is its own elementwise kernel (`{entry}_bias`, `{entry}_gelu`, `{entry}_residual`) that reads and
writes C in place, so every config computes the same C and `launches` returns 4 - fusion launches.

Kernel signatures (scalars are 32-bit `int`, looked up by name in the problem):
    {entry}(A, B, [bias if fusion >= 1], [R if fusion >= 3], C, M, N, K)
    {entry}_bias(C, bias, M, N)    {entry}_gelu(C, M, N)    {entry}_residual(C, R, M, N)

Accounting: `flops` is the GEMM's 2·M·N·K only (the epilogue's O(M·N) work is left out), so TFLOP/s compare
directly with cuBLAS SGEMM figures; `bytes_moved` is A, B, bias and R read once and C written once.
"""

from __future__ import annotations

import math
from typing import Any

from tuner.expr.ops import ceil_div
from tuner.kernels.base import Config, Family, Launch, Problem

GELU_C = 0.7978845608  # sqrt(2 / pi), as the template writes it
GELU_A = 0.044715

#: The unfused epilogue stages, in order; fusion depth k leaves STAGES[k:] to separate kernels.
EPILOGUE_STAGES = ("bias", "gelu", "residual")
#: Static SMEM a kernel may declare; the template's tiles go dynamic past it.
STATIC_SMEM_LIMIT = 48 * 1024
#: Threads per block of the elementwise epilogue kernels (fixed in the template).
ELEMENTWISE_THREADS = 256


def gelu(xp, x):
    """GELU, tanh approximation, in the dtype of `x` (float64 for the reference)."""
    return 0.5 * x * (1.0 + xp.tanh(GELU_C * (x + GELU_A * x * x * x)))


class Gemm(Family):
    name = "gemm"
    template = "gemm.cu.j2"
    dtypes = ("float32",)
    problem_sizes = ("M", "N", "K")
    throughput_unit = "TFLOP/s"
    uri_names = {
        "tile_m": "tm",
        "tile_n": "tn",
        "tile_k": "tk",
        "thread_m": "rm",
        "thread_n": "rn",
        "pad": "pad",
        "vec": "vec",
        "min_blocks": "lb",
        "fusion": "fuse",
        "stages": "st",
        "k_unroll": "ku",
    }
    #: 0: the K tile's loop fully unrolled, the kernel as it was before the knob existed
    uri_defaults = {"k_unroll": 0}

    # -- launching ---------------------------------------------------------------------------------------
    @staticmethod
    def smem_bytes(config: Config, problem: Problem) -> int:
        """Dynamic SMEM of the GEMM kernel: its SMEM tiles when they are over 48 KiB (the template then declares
        them dynamic), else 0 (static tiles, which the compile reports)."""
        tiles = config["stages"] * config["tile_k"] * (config["tile_m"] + config["tile_n"] + 2 * config["pad"]) * 4
        return tiles if tiles > STATIC_SMEM_LIMIT else 0

    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        M, N = problem["M"], problem["N"]
        fusion = int(config["fusion"])
        threads = config["tile_m"] * config["tile_n"] // (config["thread_m"] * config["thread_n"])
        gemm_args = ("A", "B") + (("bias",) if fusion >= 1 else ()) + (("R",) if fusion >= 3 else ())
        out = [
            Launch(
                entry=entry,
                grid=(N // config["tile_n"], M // config["tile_m"], 1),
                block=(threads, 1, 1),
                args=(*gemm_args, "C", "M", "N", "K"),
                smem_dynamic=self.smem_bytes(config, problem),
            )
        ]
        ew_vec = 4 if N % 4 == 0 else 1  # the template's EW_VEC
        ew_grid = (ceil_div(M * N // ew_vec, ELEMENTWISE_THREADS), 1, 1)
        stage_args = {
            "bias": ("C", "bias", "M", "N"),
            "gelu": ("C", "M", "N"),
            "residual": ("C", "R", "M", "N"),
        }
        for stage in EPILOGUE_STAGES[fusion:]:
            out.append(
                Launch(
                    entry=f"{entry}_{stage}",
                    grid=ew_grid,
                    block=(ELEMENTWISE_THREADS, 1, 1),
                    args=stage_args[stage],
                )
            )
        return out

    # -- data --------------------------------------------------------------------------------------------
    def inputs(self, xp, problem: Problem, rng) -> dict[str, Any]:
        """A ~ N(0, 1), B ~ N(0, 1/K) so that A·B ~ N(0, 1) (GELU sees both signs), bias and R ~ N(0, 1)."""
        M, N, K = problem["M"], problem["N"], problem["K"]
        f32 = xp.float32
        return {
            "A": rng.standard_normal((M, K), dtype=f32),
            "B": rng.standard_normal((K, N), dtype=f32) * f32(1.0 / math.sqrt(K)),
            "bias": rng.standard_normal((N,), dtype=f32),
            "R": rng.standard_normal((M, N), dtype=f32),
        }

    def outputs(self, problem: Problem, config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
        # Unfused stages update C in place: no scratch buffers.
        return {"C": ((problem["M"], problem["N"]), "float32")}

    def reference(self, xp, inputs: dict[str, Any], problem: Problem, config: Config | None = None) -> dict[str, Any]:
        f64 = xp.float64
        a, b = inputs["A"].astype(f64), inputs["B"].astype(f64)
        x = a @ b + inputs["bias"].astype(f64)[None, :]
        return {"C": gelu(xp, x) + inputs["R"].astype(f64)}

    def tolerance(self, problem: Problem) -> float:
        """FP32 accumulation over K terms of an O(1) result errs by about 2^-24 · sqrt(K/2) (a few 1e-6 at
        K = 4096, some 1e-5 at the worst of 16M outputs); allow 1e-4, growing as sqrt(K) beyond K = 1024.
        TF32 or a dropped K tile errs by 1e-3 or more and fails."""
        return 1e-4 * max(1.0, math.sqrt(problem["K"] / 1024))

    # -- accounting --------------------------------------------------------------------------------------
    def bytes_moved(self, problem: Problem) -> int:
        M, N, K = problem["M"], problem["N"], problem["K"]
        return 4 * (M * K + K * N + N + M * N + M * N)  # A, B, bias, R read; C written

    def flops(self, problem: Problem) -> int:
        return 2 * problem["M"] * problem["N"] * problem["K"]  # GEMM only; the epilogue is not counted


FAMILY = Gemm()
