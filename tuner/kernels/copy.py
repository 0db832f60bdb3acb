"""Coalesced vs strided copy: dst[i] = src[i * stride] for i < n (templates/copy.cu.j2).

With `vec` > 1 the unit is a chunk of vec consecutive elements: chunk c is read from src[c*vec*stride ...] and
written to dst[c*vec ...]. Stride 1 is a plain coalesced copy; `bytes_moved` counts only the useful bytes
(n read, n written), so the useful bandwidth falls as the stride grows, which is what the exercise shows.

The stride and vec are knobs of the config, but `inputs` does not receive the config in base.Family's contract,
so it allocates src for the largest stride the problem allows (n * span elements, `span` a problem size, default
32: one input serves every config of the problem; the space requires stride <= span). `reference` needs the
config (the evaluator always passes it): without it there is no way to know which elements to expect.
"""

from __future__ import annotations

from tuner.kernels.base import Config, Family, Launch, Problem


class Copy(Family):
    name = "copy"
    template = "copy.cu.j2"
    dtypes = ("float32",)
    problem_sizes = ("n",)
    throughput_unit = "TB/s"
    uri_names = {"stride": "stride", "vec": "vec", "block": "block", "items": "items"}
    #: The span (src holds n * span elements) of a problem that names none: enough for every shipped stride.
    max_stride = 32

    def span(self, problem: Problem) -> int:
        return problem.get("span", self.max_stride)

    def src_elements(self, problem: Problem) -> int:
        return problem["n"] * self.span(problem)

    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        n, stride = problem["n"], config["stride"]
        block, items, vec = config["block"], config["items"], config["vec"]
        per_block = block * items * vec
        if n % per_block:
            raise ValueError(f"copy: n={n} is not a multiple of block*items*vec={per_block}")
        if stride > self.span(problem):
            raise ValueError(f"copy: stride {stride} > span {self.span(problem)} reads past src")
        return [Launch(entry=entry, grid=(n // per_block, 1, 1), block=(block, 1, 1), args=("src", "dst", "n"))]

    def inputs(self, xp, problem: Problem, rng) -> dict:
        return {"src": rng.standard_normal((self.src_elements(problem),), dtype=xp.float32)}

    def outputs(self, problem: Problem, config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
        return {"dst": ((problem["n"],), problem["dtype"])}

    def reference(self, xp, inputs: dict, problem: Problem, config: Config | None = None) -> dict:
        if config is None:
            raise TypeError("copy.reference needs the config: the expected output depends on its stride and vec")
        n, stride, vec = problem["n"], config["stride"], config["vec"]
        # chunk c of vec elements comes from src[c*vec*stride : c*vec*stride + vec]
        src = inputs["src"][: n * stride].reshape(n // vec, vec * stride)
        return {"dst": xp.ascontiguousarray(src[:, :vec]).reshape(n)}

    def reference_key(self, config: Config) -> tuple:
        return (config["stride"], config["vec"])

    def tolerance(self, problem: Problem) -> float:
        return 0.0  # pure data movement: every element must arrive bit for bit

    def bytes_moved(self, problem: Problem) -> int:
        return 2 * problem["n"] * self.elem_bytes(problem)

    def flops(self, problem: Problem) -> int:
        return 0


FAMILY = Copy()
