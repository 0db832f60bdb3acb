"""RMSNorm, bf16 in and out, fp32 math: y = h / sqrt(mean(h^2) + 1e-6) * weight over each row.

h = x, or, when the problem names a nonzero ``residual`` size, h = bf16(x + r): the fused residual add of an
LLM block, which also writes h (the new residual stream) as a second output and normalizes that rounded h.
`residual` is a problem property (it changes the arguments and bytes_moved), given as ``residual: 1``;
a problem without residual leaves the key out (space files take positive integer sizes only).

Knobs (templates/rmsnorm.cu.j2) as softmax's — `vec`, `threads`, `rows_per_block`, `cache` (reg/smem, or l2:
two passes, the row re-read from L2 for the normalization), `keep` (bf16 bits / fp32 values of a
register-resident row), `hint` (plain __ldg/__stwb, streaming __ldcs/__stcs for the row data, or evict: loads
with L2 eviction priorities, evict_first for data read for the last time, evict_last for the weight and l2's
first pass), `min_blocks` — plus `weight_early` (load the weight chunks with the row,
or after the reduction), `persist` (0: one block per `rows_per_block` rows; k > 0: a persistent grid of k blocks
per SM, the space's derived ``blocks``) and `prefetch` (with persist: the block's next row is loaded before the
current row's reduction). Configs recorded before `persist` and `prefetch` existed mean 0 for both.

Inputs: rows z * s_r with z ~ N(0, 1) plus 4 spikes of +-32 per row (at random columns), s_r log-uniform
in [1e-4, 10): rows with mean(x^2) far below eps make a misplaced eps visible (sqrt(ms) + eps vs
sqrt(ms + eps)), and each spike carries ~8% of the sum of squares, so an element or thread left out of the
sum changes the outputs of a row with a spike there by ~4% (the tolerance is 1e-2); with 4 spikes per row,
32768 rows put a spike at every column (all but e^-16 of them). r has the same row scales, no spikes; the
weight is 1 + N(0, 1) / 2.
"""

from __future__ import annotations

from tuner.kernels import bf16
from tuner.kernels.base import Config, Family, Launch, Outputs, Problem
from tuner.kernels.softmax import add_spikes, geometry, row_scales


def has_residual(problem: Problem) -> bool:
    return bool(problem.get("residual", 0))


class RMSNorm(Family):
    name = "rmsnorm"
    template = "rmsnorm.cu.j2"
    dtypes = ("bfloat16",)
    problem_sizes = ("rows", "cols")
    throughput_unit = "TB/s"
    uri_names = {
        "vec": "vec",
        "threads": "t",
        "rows_per_block": "rpb",
        "cache": "",
        "keep": "",
        "hint": "",
        "weight_early": "we",
        "min_blocks": "mb",
        "persist": "persist",
        "prefetch": "pf",
    }
    eps = 1e-6
    #: per-row parameter vectors (cols elements each) besides the rows themselves
    params_vectors: tuple[str, ...] = ("weight",)

    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        res = has_residual(problem)
        grid, threads, smem = geometry(config, problem, buffers=2 if res else 1)
        if config.get("persist", 0):
            # the persistent grid depends on the GPU's SM count: the space's derived `blocks` carries it
            if config["cache"] != "reg" or "blocks" not in config or not 1 <= config["blocks"] <= grid[0]:
                raise ValueError(f"persist {config['persist']} needs cache reg and the resolved `blocks`, 1..{grid[0]}")
            grid = (config["blocks"], 1, 1)
        vectors = self.params_vectors
        args = ("x", "r", *vectors, "y", "h") if res else ("x", *vectors, "y")
        return [Launch(entry=entry, grid=grid, block=(threads, 1, 1), args=(*args, "rows", "cols"), smem_dynamic=smem)]

    def inputs(self, xp, problem: Problem, rng) -> dict:
        rows, cols = problem["rows"], problem["cols"]
        scale = row_scales(xp, rng, rows, 1e-4, 10.0)
        z = rng.standard_normal((rows, cols), dtype=xp.float32)
        add_spikes(xp, rng, z, 32.0, count=4)
        out = {"x": bf16.encode(xp, z * scale)}
        del z
        if has_residual(problem):
            out["r"] = bf16.encode(xp, rng.standard_normal((rows, cols), dtype=xp.float32) * scale)
        out["weight"] = bf16.encode(xp, 1 + 0.5 * rng.standard_normal(cols, dtype=xp.float32))
        return out

    def outputs(self, problem: Problem, config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
        shape = (problem["rows"], problem["cols"])
        out: Outputs = {"y": (shape, problem["dtype"])}
        if has_residual(problem):
            out["h"] = (shape, problem["dtype"])
        return out

    @staticmethod
    def normalized_rows(xp, inputs: dict, problem: Problem):
        """(h as float64, the h output or None): h = x, or bf16(x + r) when the problem has a residual."""
        x = bf16.decode(xp, inputs["x"])
        if not has_residual(problem):
            return x.astype(xp.float64), None
        h32 = x + bf16.decode(xp, inputs["r"])  # exact in fp32 for bf16 inputs of similar size
        h = bf16.decode(xp, bf16.encode(xp, h32))  # the kernel normalizes the rounded h it writes out
        return h.astype(xp.float64), h32.astype(xp.float64)

    def reference(self, xp, inputs: dict, problem: Problem, config: Config | None = None) -> dict:
        h, h_out = self.normalized_rows(xp, inputs, problem)
        w = bf16.decode(xp, inputs["weight"]).astype(xp.float64)
        y = h / xp.sqrt((h * h).mean(axis=1, keepdims=True) + self.eps) * w
        return {"y": y} if h_out is None else {"y": y, "h": h_out}

    def tolerance(self, problem: Problem) -> float:
        # bf16 output rounding is <= 2^-8 relative; fp32 math (rsqrt, 8192-term sums) adds ~1e-6.
        return 1e-2

    def bytes_moved(self, problem: Problem) -> int:
        rows, cols = problem["rows"], problem["cols"]
        streams = 2 if has_residual(problem) else 1  # x (+ r) read, y (+ h) written
        return (2 * streams * rows * cols + len(self.params_vectors) * cols) * self.elem_bytes(problem)

    def flops(self, problem: Problem) -> int:
        # per element: square-accumulate (2), normalize (1), scale (1); + 1 for the residual add
        return (4 + has_residual(problem)) * problem["rows"] * problem["cols"]


FAMILY = RMSNorm()
