"""fp8_quant: per-token FP8 (e4m3) quantization of a bf16 [T, H] activation, and its inverse
(templates/fp8_quant.cu.j2).

quant (problem size ``op: 1``): x bf16 [T, H] → q e4m3 [T, H] + scale fp32 [T], where
``scale[t] = amax_t / 448`` (amax_t = max |x[t, :]|, 448 the largest finite e4m3) and ``q = e4m3(x · 448 /
amax_t)``, rounded to nearest even and saturated to ±448 (amax_t = 0 gives scale 0 and q = 0).
dequant (``op: 2``): q, scale → y bf16 [T, H] = bf16(float(q) · scale[t]).

On the host, e4m3 tensors are uint8 arrays of bit patterns (`encode_e4m3` / `decode_e4m3`, exact in NumPy and
CuPy alike). The check compares q as *signed code ordinals* (sign · (code & 0x7f), consecutive finite e4m3 values
are consecutive ordinals) divided by 256: with that view the bench's ``|out - ref| / max(|ref|, 1)`` is
|Δordinal| / 256, so the tolerance 1/256 admits at most one e4m3 ulp (the kernel multiplies by the fp32
reciprocal where the reference divides exactly; the two can straddle a rounding boundary) and nothing more. The
scale must match exactly (tolerance 0): both sides divide fp32 amax by 448 with one IEEE rounding.

Kernel signatures: quant ``{entry}(x, q, scale, T, H)``; dequant ``{entry}(q, scale, y, T, H)``; one launch,
grid T / rows_per_block. Accounting: quant reads 2·T·H and writes T·H + 4·T bytes; dequant the reverse.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tuner.kernels import bf16
from tuner.kernels.base import Config, Family, Launch, Problem

E4M3_MAX = 448.0
#: Ordinal divisor of the q view (> 126, the largest finite ordinal, so that max(|ref|, 1) is 1).
ORDINAL_SCALE = 256.0


def is_dequant(problem: Problem) -> bool:
    return problem["op"] == 2


def encode_e4m3(xp, x):
    """float → e4m3 code (uint8), round to nearest even, saturated to ±448 (what cvt.rn.satfinite does); NaN
    → 0x7f. Exact for any float32/float64 input: the rounding works on the value's binade in float64."""
    v = xp.asarray(x, dtype=xp.float64)
    sign = xp.signbit(v)
    a = xp.minimum(xp.abs(xp.where(xp.isnan(v), 0.0, v)), E4M3_MAX)  # NaN: code set at the end
    # The spacing of e4m3 values around a: 2^(e-3) for normals (e = floor(log2 a) >= -6), 2^-9 below 2^-6.
    safe = xp.where(a > 0, a, 1.0)
    e = xp.maximum(xp.floor(xp.log2(safe)), -6.0)
    ulp = xp.exp2(e - 3)
    r = xp.rint(a / ulp) * ulp  # rint: ties to even on the mantissa count; multiplying back is exact
    r = xp.minimum(r, E4M3_MAX)
    # Value → code: normals 8·(e + 7) + mantissa; subnormals (r < 2^-6) r / 2^-9.
    safe_r = xp.where(r > 0, r, 1.0)
    er = xp.maximum(xp.floor(xp.log2(safe_r)), -6.0)
    normal = r >= 2.0**-6
    code = xp.where(normal, 8 * (er + 7) + (r / xp.exp2(er) - 1) * 8, r / 2.0**-9)
    code = xp.rint(code).astype(xp.uint8) | (sign.astype(xp.uint8) << 7)
    return xp.where(xp.isnan(v), xp.uint8(0x7F), code).astype(xp.uint8)


def decode_e4m3(xp, codes):
    """e4m3 code → float32, exactly (0x7f / 0xff are NaN)."""
    c = xp.asarray(codes).astype(xp.int32)
    mag = c & 0x7F
    e, m = mag >> 3, mag & 7
    value = xp.where(e == 0, m.astype(xp.float64) * 2.0**-9, (1 + m / 8.0) * xp.exp2(e.astype(xp.float64) - 7))
    value = xp.where((c & 0x80) != 0, -value, value)
    return xp.where(mag == 0x7F, xp.nan, value).astype(xp.float32)


def ordinal(xp, codes):
    """Signed ordinal of e4m3 codes as float64: sign · (code & 0x7f), NaN for the NaN codes."""
    c = xp.asarray(codes).astype(xp.int32)
    mag = (c & 0x7F).astype(xp.float64)
    out = xp.where((c & 0x80) != 0, -mag, mag)
    return xp.where((c & 0x7F) == 0x7F, xp.nan, out)


class Fp8Quant(Family):
    name = "fp8_quant"
    template = "fp8_quant.cu.j2"
    dtypes = ("bfloat16",)
    problem_sizes = ("T", "H", "op")
    throughput_unit = "TB/s"
    uri_names = {"vec": "v", "threads": "t", "rows_per_block": "rpb", "cache": "", "hint": "", "min_blocks": "lb"}

    def problem_fault(self, problem: Problem) -> str | None:
        if problem["op"] not in (1, 2):
            return f"op must be 1 (quantize) or 2 (dequantize), got {problem['op']}"
        if problem["H"] % 4:
            return f"H={problem['H']} is not a multiple of 4 (rows of e4m3 codes are read as 32-bit words)"
        return None

    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        T, H = problem["T"], problem["H"]
        threads, rpb, vec = config["threads"], config["rows_per_block"], config["vec"]
        tpr = threads // rpb
        if threads % rpb or tpr % 32 or T % rpb or H % (tpr * vec):
            raise ValueError(
                f"fp8_quant: threads={threads}, rows_per_block={rpb}, vec={vec} do not tile "
                f"T={T} x H={H} (whole warps per row, H a multiple of threads/row x vec)"
            )
        args = ("q", "scale", "y", "T", "H") if is_dequant(problem) else ("x", "q", "scale", "T", "H")
        return [Launch(entry=entry, grid=(T // rpb, 1, 1), block=(threads, 1, 1), args=args)]

    def inputs(self, xp, problem: Problem, rng) -> dict[str, Any]:
        """x: rows z · s_t with z ~ N(0, 1) and s_t log-uniform in [1e-3, 1e2) (each row's scale matters), one
        spike of ±8·s_t per row at a random column (amax comes from one element, so a chunk left out of the max
        changes the row's scale). dequant: q = the exact quantization of such an x, and its scales."""
        T, H = problem["T"], problem["H"]
        scale = xp.exp(rng.uniform(np.log(1e-3), np.log(1e2), size=(T, 1))).astype(xp.float32)
        z = rng.standard_normal((T, H), dtype=xp.float32)
        cols = rng.integers(0, H, size=T)
        z[xp.arange(T), cols] = xp.where(rng.uniform(size=T) < 0.5, -8.0, 8.0).astype(xp.float32)
        x = bf16.encode(xp, z * scale)
        del z
        if not is_dequant(problem):
            return {"x": x}
        ref = self._quantize(xp, x)
        return {"q": ref["codes"], "scale": ref["scale"]}

    @staticmethod
    def _quantize(xp, x_bits) -> dict[str, Any]:
        """The exact quantization: fp32 scale, e4m3 codes of x / scale (float64 division, one rounding)."""
        x = bf16.decode(xp, x_bits)
        amax = xp.abs(x).max(axis=1)
        scale = (amax / xp.float32(E4M3_MAX)).astype(xp.float32)  # IEEE fp32 division, as __fdiv_rn
        safe = xp.where(scale > 0, scale, 1.0).astype(xp.float64)[:, None]
        codes = encode_e4m3(xp, xp.where(scale[:, None] > 0, x.astype(xp.float64) / safe, 0.0))
        return {"scale": scale, "codes": codes}

    def outputs(self, problem: Problem, config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
        T, H = problem["T"], problem["H"]
        if is_dequant(problem):
            return {"y": ((T, H), "bfloat16")}
        return {"q": ((T, H), "uint8"), "scale": ((T,), "float32")}

    def checked_value(self, xp, name: str, array, dtype: str | None):
        if name == "q":
            return ordinal(xp, array) / ORDINAL_SCALE
        return super().checked_value(xp, name, array, dtype)

    def reference(self, xp, inputs: dict[str, Any], problem: Problem, config: Config | None = None) -> dict[str, Any]:
        if is_dequant(problem):
            # fp32 product (exact operands, one rounding, as the kernel), compared after bf16 rounding.
            prod = decode_e4m3(xp, inputs["q"]) * inputs["scale"][:, None]
            return {"y": prod.astype(xp.float64)}
        ref = self._quantize(xp, inputs["x"])
        return {"q": ordinal(xp, ref["codes"]) / ORDINAL_SCALE, "scale": ref["scale"].astype(xp.float64)}

    def tolerance(self, problem: Problem) -> dict[str, float]:
        """q: one e4m3 ulp (one ordinal / 256; two ulps fail); scale: exact; y: the bf16 rounding of an fp32
        product (2^-9 relative) with room, while a wrong row scale (a factor of >= 1e-3 between rows) fails."""
        if is_dequant(problem):
            return {"y": 2.0**-8}
        return {"q": 1.0 / ORDINAL_SCALE, "scale": 0.0}

    def bytes_moved(self, problem: Problem) -> int:
        T, H = problem["T"], problem["H"]
        return 2 * T * H + T * H + 4 * T  # bf16 side, e4m3 side, fp32 scales (either direction)


FAMILY = Fp8Quant()
