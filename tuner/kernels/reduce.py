"""reduce: row-wise sum and/or max of a rows×cols tensor (templates/reduce.cu.j2).

The input is bfloat16 (uint16 bits on the host, see `tuner.kernels.bf16`) or float32; the results are
float32 whatever the input dtype (a bf16 sum of 8192 values would lose most of its digits; a bf16 max is
exact in float32 too). Which outputs a call computes is part of the problem, not a knob, because it changes
the work and `bytes_moved`: the problem's ``op`` is 1 (row sum → ``sum``), 2 (row max → ``max``) or 3 (both,
in one pass). A tuning study therefore never trades one computation for another.

Knobs: `vec` (elements per load, up to 16 bytes), `threads` per block, `rows_per_block` (rows a block reduces;
threads / rows_per_block threads, whole warps, per row: 1 row per block up to 1 row per warp), `items`
(independent loads in flight per thread per iteration), `min_blocks` (second `__launch_bounds__` argument, 0:
none), `hint` ("stream": ``__ldcs`` evict-first loads; "none": ``__ldg``; "noalloc":
``ld.global.nc.L1::no_allocate``), `persist` (0: one block per `rows_per_block` rows; k > 0: a persistent grid
of k blocks per SM, the space's derived ``blocks``, walking the rows with a grid stride) and `prefetch` (1: the
next step's loads are issued before the current step is summed). Configs recorded before `persist` and
`prefetch` existed mean 0 for both.

Kernel signature (rows/cols are 32-bit `int`, unused by the code):
    {entry}(x, [sum if op & 1], [max if op & 2], rows, cols)

Accounting: `bytes_moved` is the input read once plus each output written once.
"""

from __future__ import annotations

from typing import Any

from tuner.kernels import bf16
from tuner.kernels.base import Config, Family, Launch, Problem

#: op code → the outputs it computes, in argument order.
OPS = {1: ("sum",), 2: ("max",), 3: ("sum", "max")}


def op_outputs(problem: Problem) -> tuple[str, ...]:
    op = problem.get("op")
    if op not in OPS:
        raise ValueError(f"reduce: problem op must be 1 (sum), 2 (max) or 3 (both), got {op!r}")
    return OPS[op]


class Reduce(Family):
    name = "reduce"
    template = "reduce.cu.j2"
    dtypes = ("bfloat16", "float32")
    problem_sizes = ("rows", "cols", "op")
    throughput_unit = "TB/s"
    uri_names = {
        "vec": "vec",
        "threads": "t",
        "rows_per_block": "rpb",
        "items": "it",
        "min_blocks": "mb",
        "hint": "hint",
        "persist": "persist",
        "prefetch": "pf",
    }

    # -- launching ---------------------------------------------------------------------------------------
    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        rows, cols = problem["rows"], problem["cols"]
        vec, threads, rpb, items = config["vec"], config["threads"], config["rows_per_block"], config["items"]
        tpr = threads // rpb
        if threads % rpb or tpr % 32 or rows % rpb or cols % (vec * tpr * items) or vec * self.elem_bytes(problem) > 16:
            raise ValueError(
                f"reduce: vec {vec} x threads {threads} / rows_per_block {rpb} x items {items} does not tile "
                f"{rows}x{cols} {problem['dtype']}"
            )
        grid = rows // rpb
        if config.get("persist", 0):
            # the persistent grid depends on the GPU's SM count: the space's derived `blocks` carries it
            if "blocks" not in config or not 1 <= config["blocks"] <= grid:
                raise ValueError(f"reduce: persist {config['persist']} needs the resolved `blocks`, 1..{grid}")
            grid = config["blocks"]
        return [
            Launch(
                entry=entry,
                grid=(grid, 1, 1),
                block=(threads, 1, 1),
                args=("x", *op_outputs(problem), "rows", "cols"),
            )
        ]

    # -- data --------------------------------------------------------------------------------------------
    def inputs(self, xp, problem: Problem, rng) -> dict[str, Any]:
        """x ~ N(0, 1): row sums of about ±sqrt(cols), both signs, some near 0."""
        shape = (problem["rows"], problem["cols"])
        if problem["dtype"] == "bfloat16":
            return {"x": bf16.random(xp, rng, shape)}
        return {"x": rng.standard_normal(shape, dtype=xp.float32)}

    def outputs(self, problem: Problem, config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
        return {name: ((problem["rows"],), "float32") for name in op_outputs(problem)}

    def reference(self, xp, inputs: dict[str, Any], problem: Problem, config: Config | None = None) -> dict:
        # `config` is accepted (and unused): every config computes the same outputs.
        x = inputs["x"]
        x = bf16.decode(xp, x) if problem["dtype"] == "bfloat16" else x
        x = x.astype(xp.float64)
        ref = {}
        for name in op_outputs(problem):
            ref[name] = x.sum(axis=1) if name == "sum" else x.max(axis=1)
        return ref

    def tolerance(self, problem: Problem) -> float:
        """|out - ref| / max(|ref|, 1). The max is exact (tolerance 0 when it is the only output). The fp32
        sum of 8192 N(0, 1) values errs by at most ~1.2e-4 absolute over 32768 rows in the worst summation
        order the space allows (vec 1: serial chains of 256; NumPy emulation of the kernel's order), bf16
        input by ~5e-5; allow 5e-4, growing with cols beyond 8192 (the serial chains grow with it). A row
        that misses one element (|x| ~ 0.8) or one vector is off by far more in all but a few % of rows: a
        systematic miss fails."""
        if op_outputs(problem) == ("max",):
            return 0.0
        return 5e-4 * max(1.0, problem["cols"] / 8192)

    # -- accounting --------------------------------------------------------------------------------------
    def bytes_moved(self, problem: Problem) -> int:
        rows, cols = problem["rows"], problem["cols"]
        return rows * cols * self.elem_bytes(problem) + 4 * rows * len(op_outputs(problem))

    def flops(self, problem: Problem) -> int:
        return 0  # memory-bound: throughput is TB/s


FAMILY = Reduce()
