"""elementwise: y = SCALE * gelu(x + bias), GELU tanh approximation (templates/elementwise.cu.j2).

x and y are rows×cols, bias has cols entries, all of the problem's dtype (bfloat16 or float32; bf16 tensors
are uint16 bit arrays on the host, see `tuner.kernels.bf16`); the math is fp32. SCALE is a fixed constant of
the family, 1.5 (exact in bf16 and fp32, and not a power of two, so a dropped or doubled scale fails),
written into the template as a literal; `tests/kernels/test_families_elementwise_reduce.py` checks the two agree.

Knobs: `fusion` (1, 2, 3) splits the chain bias → GELU → scale into ceil(3 / fusion) kernels, each a full
read and write of the tensor through a scratch buffer (`t1`, `t2`, outputs of the tensor's dtype that are
not checked); `vec` (elements per access, up to 16 bytes), `threads` per block, `items` (independent vectors
in flight per thread), `min_blocks` (second `__launch_bounds__` argument, 0: none), `hint` ("stream":
``__ldcs``/``__stcs`` evict-first accesses for the data touched once; "none": ``__ldg`` and plain stores)
and `math` (GELU as h·sigmoid(2u) with ex2.approx + rcp.approx, ~1e-6 relative, or tanh.approx.f32, 2^-11
relative, which the space allows for bf16 only).

Kernel signatures (entry is the rendered source's entry name; rows/cols are 32-bit `int`, unused by the code):
    fusion 3: {entry}(x, bias, y, rows, cols)
    fusion 2: {entry}(x, bias, t1, rows, cols)   {entry}_scale(t1, y, rows, cols)
    fusion 1: {entry}(x, bias, t1, rows, cols)   {entry}_gelu(t1, t2, rows, cols)   {entry}_scale(t2, y, ...)

Accounting: `bytes_moved` is the fused computation's minimal traffic (x read once, bias read once, y written
once) for every config, so unfused configs show a lower useful TB/s: that gap is the lesson.
"""

from __future__ import annotations

from typing import Any

from tuner.kernels import bf16
from tuner.kernels.base import Config, Family, Launch, Outputs, Problem

#: y = SCALE * gelu(x + bias); the template writes the same literal.
SCALE = 1.5
GELU_C = 0.7978845608  # sqrt(2 / pi)
GELU_A = 0.044715
#: The chain's stages in order; fusion depth k groups them k at a time into ceil(3 / k) kernels.
STAGES = ("bias", "gelu", "scale")


def gelu(xp, h):
    """GELU, tanh approximation, in the dtype of `h` (float64 for the reference)."""
    return 0.5 * h * (1.0 + xp.tanh(GELU_C * (h + GELU_A * h * h * h)))


def kernel_stages(fusion: int) -> list[tuple[str, ...]]:
    """The stages each kernel of a config applies, in launch order: fusion 1 → [(bias,), (gelu,), (scale,)],
    2 → [(bias, gelu), (scale,)], 3 → [(bias, gelu, scale)]."""
    if fusion not in (1, 2, 3):
        raise ValueError(f"elementwise: fusion must be 1, 2 or 3, got {fusion!r}")
    return [STAGES[i : i + fusion] for i in range(0, len(STAGES), fusion)]


class Elementwise(Family):
    name = "elementwise"
    template = "elementwise.cu.j2"
    dtypes = ("bfloat16", "float32")
    problem_sizes = ("rows", "cols")
    throughput_unit = "TB/s"
    uri_names = {
        "fusion": "fuse",
        "vec": "vec",
        "threads": "t",
        "items": "it",
        "min_blocks": "mb",
        "hint": "hint",
        "math": "math",
    }

    # -- launching ---------------------------------------------------------------------------------------
    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        rows, cols = problem["rows"], problem["cols"]
        vec, threads, items = config["vec"], config["threads"], config["items"]
        per_block = threads * items * vec
        if cols % vec or (rows * cols) % per_block or vec * self.elem_bytes(problem) > 16:
            raise ValueError(
                f"elementwise: vec {vec} x threads {threads} x items {items} does not tile {rows}x{cols} "
                f"{problem['dtype']}"
            )
        grid = (rows * cols // per_block, 1, 1)
        groups = kernel_stages(int(config["fusion"]))
        scratch = ["t1", "t2"]
        out: list[Launch] = []
        src = "x"
        for i, stages in enumerate(groups):
            dst = "y" if i == len(groups) - 1 else scratch[i]
            name = entry if i == 0 else f"{entry}_{stages[0]}"
            args = (src, "bias", dst) if "bias" in stages else (src, dst)
            out.append(Launch(entry=name, grid=grid, block=(threads, 1, 1), args=(*args, "rows", "cols")))
            src = dst
        return out

    # -- data --------------------------------------------------------------------------------------------
    def inputs(self, xp, problem: Problem, rng) -> dict[str, Any]:
        """x and bias ~ N(0, 1): x + bias ~ N(0, 2), so GELU sees both signs and its whole curve."""
        rows, cols = problem["rows"], problem["cols"]
        if problem["dtype"] == "bfloat16":
            return {"x": bf16.random(xp, rng, (rows, cols)), "bias": bf16.random(xp, rng, (cols,))}
        f32 = xp.float32
        return {
            "x": rng.standard_normal((rows, cols), dtype=f32),
            "bias": rng.standard_normal((cols,), dtype=f32),
        }

    def outputs(self, problem: Problem, config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
        shape = (problem["rows"], problem["cols"])
        n_scratch = len(kernel_stages(int(config["fusion"]))) - 1
        out: Outputs = {"y": (shape, problem["dtype"])}
        for name in ("t1", "t2")[:n_scratch]:
            out[name] = (shape, problem["dtype"])
        return out

    def checked(self) -> tuple[str, ...]:
        return ("y",)  # t1 / t2 are scratch

    @staticmethod
    def _as_float64(xp, array, problem: Problem):
        if problem["dtype"] == "bfloat16":
            return bf16.decode(xp, array).astype(xp.float64)
        return array.astype(xp.float64)

    def reference(self, xp, inputs: dict[str, Any], problem: Problem, config: Config | None = None) -> dict:
        # `config` is accepted (and unused): every fusion depth computes the same y.
        x = self._as_float64(xp, inputs["x"], problem)
        bias = self._as_float64(xp, inputs["bias"], problem)
        return {"y": SCALE * gelu(xp, x + bias[None, :])}

    def tolerance(self, problem: Problem) -> float:
        """|y - ref| / max(|ref|, 1). fp32: the kernel's exp2/reciprocal form of the same GELU errs by ~1e-6
        relative; allow 1e-4 (tanh.approx, 2^-11, is bf16-only for that reason). bf16: rounding y costs up
        to 2^-8 (half an ulp at the bottom of a binade); fusion 1 also rounds x + bias (times |gelu'| <=
        1.13) and gelu to bf16: at most ~0.005 + 0.004 + 0.004, plus 5e-4 for tanh.approx, about 0.0135
        (NumPy emulation of the kernels' order: 0.0094 on 16K elements); allow 2e-2. A wrong bias column, a
        dropped or doubled stage, or a missed element (NaN poison) fails."""
        return {"float32": 1e-4, "bfloat16": 2e-2}[problem["dtype"]]

    # -- accounting --------------------------------------------------------------------------------------
    def bytes_moved(self, problem: Problem) -> int:
        rows, cols = problem["rows"], problem["cols"]
        # The fused computation's traffic: x and bias read once, y written once.
        return (2 * rows * cols + cols) * self.elem_bytes(problem)

    def flops(self, problem: Problem) -> int:
        return 0  # memory-bound: throughput is TB/s


FAMILY = Elementwise()
