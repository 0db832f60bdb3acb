"""LayerNorm, bf16 in and out, fp32 math: y = (h - mean) / sqrt(var + 1e-5) * weight + bias over each row
(var biased, as torch.nn.LayerNorm).

h = x, or, when the problem names a nonzero ``residual`` size, h = bf16(x + r), also written out as a second
output (the new residual stream) — see tuner/kernels/rmsnorm.py, whose launch geometry, residual handling and
accounting this family shares (plus a bias vector).

Knobs (templates/layernorm.cu.j2): rmsnorm's, plus `algo`: two_pass (mean reduction, then a reduction of
the squared deviations from it over the on-chip row: 2 barriers) or welford (each thread's exact two-pass
(mean, M2), merged across the row with Chan et al.'s pairwise rule in one reduction: 1 barrier). Neither
uses E[h^2] - E[h]^2.

Inputs: rows s_r * (z + c_r) with z ~ N(0, 1) plus 4 spikes of +-32 per row (as rmsnorm's), s_r
log-uniform in [1e-4, 10) (rows whose variance is far below eps expose a misplaced eps) and c_r = +-2^(10u),
u uniform in [0, 1): offsets of 1 to 1024 standard deviations. Beyond a few hundred, E[h^2] - E[h]^2 in fp32
cancels catastrophically (tens of % off), so a naive variance fails the check; a two-pass or Chan/Welford
variance stays within ~1e-4. (bf16 rounds such rows coarsely — the reference uses the rounded values.)
weight is 1 + N(0, 1) / 2, bias N(0, 1) / 2.
"""

from __future__ import annotations

from tuner.kernels import bf16
from tuner.kernels.base import Problem
from tuner.kernels.rmsnorm import RMSNorm, has_residual
from tuner.kernels.softmax import add_spikes, row_scales


class LayerNorm(RMSNorm):
    name = "layernorm"
    template = "layernorm.cu.j2"
    # the persistent grid and its look-ahead are RMSNorm's knobs only
    uri_names = {"algo": "", **{k: v for k, v in RMSNorm.uri_names.items() if k not in ("persist", "prefetch")}}
    eps = 1e-5
    params_vectors = ("weight", "bias")

    def inputs(self, xp, problem: Problem, rng) -> dict:
        rows, cols = problem["rows"], problem["cols"]
        scale = row_scales(xp, rng, rows, 1e-4, 10.0)
        z = rng.standard_normal((rows, cols), dtype=xp.float32)
        add_spikes(xp, rng, z, 32.0, count=4)
        # offsets of +-2^(10u) standard deviations, u uniform in [0, 1): up to 1024
        sign = (rng.random((rows, 1), dtype=xp.float32) < 0.5).astype(xp.float32) * 2 - 1
        z += sign * xp.exp2(rng.random((rows, 1), dtype=xp.float32) * 10).astype(xp.float32)
        out = {"x": bf16.encode(xp, z * scale)}
        del z
        if has_residual(problem):
            out["r"] = bf16.encode(xp, rng.standard_normal((rows, cols), dtype=xp.float32) * scale)
        out["weight"] = bf16.encode(xp, 1 + 0.5 * rng.standard_normal(cols, dtype=xp.float32))
        out["bias"] = bf16.encode(xp, 0.5 * rng.standard_normal(cols, dtype=xp.float32))
        return out

    def reference(self, xp, inputs: dict, problem: Problem, config=None) -> dict:
        h, h_out = self.normalized_rows(xp, inputs, problem)
        w = bf16.decode(xp, inputs["weight"]).astype(xp.float64)
        b = bf16.decode(xp, inputs["bias"]).astype(xp.float64)
        d = h - h.mean(axis=1, keepdims=True)
        y = d / xp.sqrt((d * d).mean(axis=1, keepdims=True) + self.eps) * w + b
        return {"y": y} if h_out is None else {"y": y, "h": h_out}

    def flops(self, problem: Problem) -> int:
        # per element: sum (1), deviation-square-accumulate (3), normalize-scale-shift (3); + 1 residual add
        return (7 + has_residual(problem)) * problem["rows"] * problem["cols"]


FAMILY = LayerNorm()
