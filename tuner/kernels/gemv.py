"""gemv: bf16 GEMV / skinny GEMM, y (M×N) = x (M×K) · Wᵀ (templates/gemv.cu.j2).

W is N×K row-major (the nn.Linear layout: output n reads the contiguous row n of W); x is M×K row-major, y is
M×N row-major. All three are bfloat16 (uint16 bit arrays on the host, ``__nv_bfloat16*`` in the kernels); the
kernels accumulate in fp32 and round once to bf16.

A block computes an m_rows × rows_per_block tile of y over the K range of one split, where m_rows is m_tile
capped at M (with mma: at M rounded up to 8, the rows past M being zeros): grid (ceil(M / m_rows),
N / rows_per_block, split_k). With split_k = 1 it writes y itself (one launch); otherwise it writes fp32
partial sums to the scratch output ``part`` (split_k × M × N, every element written exactly once, so no
zeroing is needed under NaN-poisoned outputs) and ``{entry}_reduce`` sums the slices in order and rounds to
bf16 (grid ceil(M·N / 1024), 256 threads, 4 elements a thread) — unless `cluster` is 1: then the split_k blocks
of a tile form a thread-block cluster (compile-time ``__cluster_dims__(1, 1, split_k)``, so a plain launch) and
sum their partials through distributed shared memory into y; one launch, no ``part``. Engine 2 (mma 2: tensor
cores fed by a cp.async ring of W and x tiles) and engine 3 (mma 3: tensor cores on W straight from HBM into
registers and the block's x slice resident in SMEM) and engine 4 (mma 4: wgmma, Hopper's warpgroup tensor-core
instruction, reading engine 2's ring laid out with the 128-byte swizzle; compiled for sm_90a) take
`smem_dynamic` bytes of dynamic SMEM; engines 0 and 1 take none.

Kernel signatures (scalars are 32-bit ``int``, looked up by name in the problem):
    {entry}(x, W, y or part, M, N, K)        {entry}_reduce(part, y, M, N)

Accounting: `bytes_moved` is W, x read once and y written once, 2 bytes each (the way cuBLAS GEMV figures are
quoted; the fp32 partials of split_k > 1 are overhead, not counted); `flops` is 2·M·N·K.
"""

from __future__ import annotations

import math
from typing import Any

from tuner.expr.ops import ceil_div
from tuner.kernels import bf16
from tuner.kernels.base import Config, Family, Launch, Outputs, Problem

#: Threads per block of the split-K reduction kernel (fixed in the template), and elements per thread.
REDUCE_THREADS = 256
REDUCE_VEC = 4
#: Engine 4 aligns its ring to the 128-byte swizzle's period (the launch adds this much dynamic SMEM).
WGMMA_ALIGN = 1024
#: Engine 3 pads each row of its SMEM x slice by this many bf16 (64 bytes: rows g and g + 1 of a 128-bit SMEM
#: phase fall on different banks).
X_PAD = 32


class Gemv(Family):
    name = "gemv"
    template = "gemv.cu.j2"
    dtypes = ("bfloat16",)
    problem_sizes = ("M", "N", "K")
    throughput_unit = "TB/s"
    uri_names = {
        "mma": "mma",
        "split_k": "sk",
        "threads": "t",
        "k_warps": "kw",
        "rows_per_warp": "rw",
        "m_tile": "mt",
        "vec": "v",
        "unroll": "u",
        "prefetch": "pf",
        "w_cache": "wc",
        "min_blocks": "lb",
        "stages": "st",
        "cluster": "cl",
    }

    # -- geometry --------------------------------------------------------------------------------------------
    @staticmethod
    def rows_per_block(config: Config) -> int:
        warps = config["threads"] // 32
        return (warps // config["k_warps"]) * config["rows_per_warp"]

    @staticmethod
    def m_rows(config: Config, problem: Problem) -> int:
        """Rows of x per block (the template's M_TILE): m_tile capped at M (mma: at M rounded up to 8)."""
        M = problem["M"]
        cap = 8 * ceil_div(M, 8) if config["mma"] else M
        return min(config["m_tile"], cap)

    @staticmethod
    def smem_dynamic(config: Config, problem: Problem) -> int:
        """Dynamic SMEM of the main kernel: engine 2's cp.async ring (stages tiles of rows_per_block W rows and
        m_rows x rows, k_warps·chunk bf16 each) or engine 3's x slice (m_rows rows of K / split_k + 32 bf16),
        which red[m_rows][rows_per_block] (fp32) aliases after the loop; 0 for engines 0 and 1 (their red is
        static)."""
        mma, m_rows = config["mma"], Gemv.m_rows(config, problem)
        red = m_rows * Gemv.rows_per_block(config) * 4
        if mma in (2, 4):  # engine 4: and 1 KiB to align the ring to the 1024-byte swizzle period
            k_tile = config["k_warps"] * Gemv.chunk(config)
            ring = config["stages"] * (Gemv.rows_per_block(config) + m_rows) * k_tile * 2
            return max(ring + (WGMMA_ALIGN if mma == 4 else 0), red)
        if mma == 3:
            return max(m_rows * (problem["K"] // config["split_k"] + X_PAD) * 2, red)
        return 0

    @staticmethod
    def chunk(config: Config) -> int:
        """K elements one warp covers per loop iteration (the template's CHUNK)."""
        step = 32 if config["mma"] else 32 * config["vec"]
        return step * config["unroll"]

    def check(self, config: Config, problem: Problem) -> None:
        """Raise ValueError when the config cannot cover this problem exactly (the space's constraints rule
        such configs out; this guards direct callers and scaled problems)."""
        M, N, K = problem["M"], problem["N"], problem["K"]
        threads, k_warps, split_k = config["threads"], config["k_warps"], config["split_k"]
        rpb = self.rows_per_block(config)
        faults = []
        if threads % 32 or (threads // 32) % k_warps:
            faults.append(f"threads={threads} do not split into k_warps={k_warps} groups of whole warps")
        if rpb == 0 or N % rpb:
            faults.append(f"N={N} is not a multiple of rows_per_block={rpb}")
        if K % (split_k * k_warps) or (K // (split_k * k_warps)) % self.chunk(config):
            need = split_k * k_warps * self.chunk(config)
            faults.append(f"K={K} is not a multiple of split_k*k_warps*chunk={need}")
        if config["mma"] not in (0, 1, 2, 3, 4):
            faults.append(
                f"mma={config['mma']} is not an engine (0 FMA, 1 tensor cores, 2 tensor cores + cp.async ring, "
                "3 tensor cores + x resident in SMEM, 4 wgmma + cp.async ring)"
            )
        if config["mma"] in (2, 4) and config.get("stages", 0) < 2:
            faults.append(f"mma {config['mma']} needs stages >= 2 (got {config.get('stages')})")
        if config["mma"] == 4 and (
            config["k_warps"] != 1 or config["rows_per_warp"] != 16 or threads % 128 or self.chunk(config) % 64
        ):
            faults.append("mma 4 needs k_warps 1, rows_per_warp 16, whole warpgroups and unroll 2 or 4")
        if config["mma"]:
            if config["vec"] != 8 or config["rows_per_warp"] % 16 or config["m_tile"] % 8:
                faults.append("mma needs vec 8, rows_per_warp % 16 == 0 and m_tile % 8 == 0")
        elif M % self.m_rows(config, problem):
            faults.append(f"M={M} is not a multiple of m_rows={self.m_rows(config, problem)}")
        if config.get("cluster", 0) and not 2 <= split_k <= 8:
            faults.append(f"cluster needs 2 <= split_k <= 8 (a portable cluster of split blocks; got {split_k})")
        if split_k > 1 and not config.get("cluster", 0) and (M * N) % REDUCE_VEC:
            faults.append(f"M*N={M * N} is not a multiple of {REDUCE_VEC} (split-K reduction)")
        if faults:
            raise ValueError("gemv: " + "; ".join(faults))

    # -- launching -------------------------------------------------------------------------------------------
    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        self.check(config, problem)
        M, N = problem["M"], problem["N"]
        split_k = config["split_k"]
        grid = (ceil_div(M, self.m_rows(config, problem)), N // self.rows_per_block(config), split_k)
        reduce_kernel = split_k > 1 and not config.get("cluster", 0)
        main_out = "part" if reduce_kernel else "y"
        out = [
            Launch(
                entry=entry,
                grid=grid,
                block=(config["threads"], 1, 1),
                args=("x", "W", main_out, "M", "N", "K"),
                smem_dynamic=self.smem_dynamic(config, problem),
            )
        ]
        if reduce_kernel:
            out.append(
                Launch(
                    entry=f"{entry}_reduce",
                    grid=(ceil_div(M * N, REDUCE_THREADS * REDUCE_VEC), 1, 1),
                    block=(REDUCE_THREADS, 1, 1),
                    args=("part", "y", "M", "N"),
                )
            )
        return out

    # -- data ------------------------------------------------------------------------------------------------
    def inputs(self, xp, problem: Problem, rng) -> dict[str, Any]:
        """x ~ N(0, 1), W ~ N(0, 1/K), both rounded to bf16: y ~ N(0, 1)."""
        M, N, K = problem["M"], problem["N"], problem["K"]
        return {
            "x": bf16.random(xp, rng, (M, K), 1.0),
            "W": bf16.random(xp, rng, (N, K), 1.0 / math.sqrt(K)),
        }

    def outputs(self, problem: Problem, config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
        M, N = problem["M"], problem["N"]
        out: Outputs = {"y": ((M, N), "bfloat16")}
        if config["split_k"] > 1 and not config.get("cluster", 0):
            out["part"] = ((config["split_k"], M, N), "float32")  # scratch: fp32 partial sums per split
        return out

    def checked(self) -> tuple[str, ...]:
        return ("y",)

    def reference(self, xp, inputs: dict[str, Any], problem: Problem, config: Config | None = None) -> dict[str, Any]:
        """y in float64 from the exact bf16 inputs."""
        x = bf16.decode(xp, inputs["x"]).astype(xp.float64)
        w = bf16.decode(xp, inputs["W"]).astype(xp.float64)
        return {"y": x @ w.T}

    def tolerance(self, problem: Problem) -> float:
        """y is O(1) and rounded once to bf16 (at most half an ulp: 2^-8 = 0.004 relative); fp32 accumulation
        (FMA or tensor core) adds ~1e-6. 1e-2 leaves a 2.5x margin, while dropping a 32-element chunk of K (an
        error ~ sqrt(32/K) = 0.06 at K = 8192) or even one term (~1/sqrt(K) = 0.011, over thousands of
        outputs) fails."""
        return 1e-2

    # -- accounting ------------------------------------------------------------------------------------------
    def bytes_moved(self, problem: Problem) -> int:
        M, N, K = problem["M"], problem["N"], problem["K"]
        return 2 * (N * K + M * K + M * N)  # W and x read, y written, bf16

    def flops(self, problem: Problem) -> int:
        return 2 * problem["M"] * problem["N"] * problem["K"]


FAMILY = Gemv()
