"""FP32 out-of-place transpose through a shared-memory tile: dst (cols × rows) = src (rows × cols)ᵀ.

Knobs (templates/transpose.cu.j2): `tile` (square tile side), `rows_per_thread` (tile rows each thread moves,
so that many independent global loads are in flight per thread), `pad` (SMEM row padding, floats) and `vec`
(global access width, floats), `order` (which tile each block moves: along src rows, down src
columns, or diagonally). The block is (tile/vec, tile/rows_per_thread) threads; one block per tile.
"""

from __future__ import annotations

from tuner.kernels.base import Config, Family, Launch, Problem


class Transpose(Family):
    name = "transpose"
    template = "transpose.cu.j2"
    dtypes = ("float32",)
    problem_sizes = ("rows", "cols")
    throughput_unit = "TB/s"
    uri_names = {
        "tile": "tile",
        "rows_per_thread": "rpt",
        "pad": "pad",
        "vec": "vec",
        "min_blocks": "mb",
        "order": "ord",
    }
    uri_defaults = {"order": "row"}  # the kernel before the order knob: recorded configs keep their uris

    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        tile, rpt, vec = config["tile"], config["rows_per_thread"], config["vec"]
        rows, cols = problem["rows"], problem["cols"]
        if rows % tile or cols % tile or tile % vec or tile % rpt:
            raise ValueError(f"transpose: tile {tile} (vec {vec}, rows_per_thread {rpt}) does not divide {rows}x{cols}")
        return [
            Launch(
                entry=entry,
                grid=(cols // tile, rows // tile, 1),
                block=(tile // vec, tile // rpt, 1),
                args=("src", "dst", "rows", "cols"),
            )
        ]

    def inputs(self, xp, problem: Problem, rng) -> dict:
        return {"src": rng.standard_normal((problem["rows"], problem["cols"]), dtype=xp.float32)}

    def outputs(self, problem: Problem, config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
        return {"dst": ((problem["cols"], problem["rows"]), problem["dtype"])}

    def reference(self, xp, inputs: dict, problem: Problem, config: Config | None = None) -> dict:
        # `config` is part of the contract; a transpose is the same for every config.
        return {"dst": xp.ascontiguousarray(inputs["src"].T)}

    def tolerance(self, problem: Problem) -> float:
        return 0.0  # pure data movement: every element must arrive bit for bit

    def bytes_moved(self, problem: Problem) -> int:
        return 2 * problem["rows"] * problem["cols"] * self.elem_bytes(problem)

    def flops(self, problem: Problem) -> int:
        return 0


FAMILY = Transpose()
