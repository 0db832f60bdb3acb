"""decode_attention: one decode step of attention over a KV cache, split over S (templates/decode_attention.cu.j2).

    out[b, hq, :] = softmax(q[b, hq, :] · K[b, :, hkv, :]ᵀ / sqrt(D)) · V[b, :, hkv, :],   hkv = hq // (HQ / HKV)

q and out are [B, HQ, D], K and V are [B, S, HKV, D], all bfloat16 (uint16 bit arrays on the host); the math is
fp32. Grouped-query attention: HQ / HKV query heads read the same KV head, and a block with q_per_pass equal to
that ratio reads each K/V element once for all of them.

Launches: the main kernel, grid (splits, HQ / q_per_pass, B). With splits == 1 it writes ``out``; otherwise it
writes each split's unnormalized output and its (max, sum) to the fp32 workspaces ``ws_acc`` [B, HQ, splits, D]
and ``ws_ml`` [B, HQ, splits, 2] (scratch outputs: every element written exactly once), and with
``combine: launch`` ``{entry}_combine`` (grid B·HQ, D threads) merges them into ``out``; with ``combine: fused``
the last block of each (b, query-head group) to finish merges them in the same launch, counting arrivals in the
int32 input ``counters`` [B, HQ] (zero on entry, left zero on exit); with ``combine: cluster`` (splits <= 8) the
splits of one (b, query-head group) are one thread block cluster that merges its partials through distributed
shared memory (no workspace: the launch takes q, k, v, out). A lost or doubled split shows up as a wrong or
unwritten ``out``: a failed trial.

``stages`` >= 2 streams K and V through a cp.async ring of that many tiles in SMEM (dynamic SMEM grows by
stages · 2 · (threads / lanes) · tile · D · 2 bytes); 0 loads them into registers.

Inputs: q has a per-(b, hq) scale, log-uniform in [1, 4), so that scores have a standard deviation of 1 to 4:
the peaky heads put most of the weight on a few positions (a lost split moves their output by O(1), where an
all-N(0, 1) input gives outputs ~ 1/sqrt(S) that a 1e-2 tolerance could not tell from zero), the flat ones
test the sum over every position.

Accounting: `bytes_moved` is K and V read once, q read once and out written once (the workspace round trip of
splits > 1 is overhead, not counted); `flops` is 4·B·HQ·S·D (q·Kᵀ and p·V).
"""

from __future__ import annotations

import math
from typing import Any

from tuner.kernels import bf16
from tuner.kernels.base import Config, Family, Launch, Outputs, Problem


class DecodeAttention(Family):
    name = "decode_attention"
    template = "decode_attention.cu.j2"
    dtypes = ("bfloat16",)
    problem_sizes = ("B", "S", "heads_q", "heads_kv", "head_dim")
    throughput_unit = "TB/s"
    uri_names = {
        "splits": "sp",
        "threads": "t",
        "lanes": "ln",
        "vec": "v",
        "tile": "tl",
        "q_per_pass": "qh",
        "hint": "",
        "min_blocks": "mb",
        "stages": "st",
        "combine": "",
    }

    def problem_fault(self, problem: Problem) -> str | None:
        hq, hkv = problem.get("heads_q"), problem.get("heads_kv")
        if hq is not None and hkv is not None and hq % hkv:
            return f"heads_q={hq} is not a multiple of heads_kv={hkv} (grouped-query attention)"
        return None

    def check(self, config: Config, problem: Problem) -> None:
        """Raise ValueError when the config does not tile this problem exactly (the space's constraints rule such
        configs out; this guards direct callers)."""
        S, hq, hkv, D = problem["S"], problem["heads_q"], problem["heads_kv"], problem["head_dim"]
        splits, threads, lanes, vec = config["splits"], config["threads"], config["lanes"], config["vec"]
        faults = []
        if fault := self.problem_fault(problem):
            faults.append(fault)
        elif (hq // hkv) % config["q_per_pass"]:
            faults.append(f"q_per_pass={config['q_per_pass']} does not divide the group of {hq // hkv} q heads")
        if threads % 32 or 32 % lanes or D % (lanes * vec):
            faults.append(f"{threads} threads in groups of {lanes} lanes x vec {vec} do not tile head_dim={D}")
        elif S % splits or (S // splits) % ((threads // lanes) * config["tile"]):
            faults.append(
                f"S={S} is not a multiple of splits*groups*tile={splits * (threads // lanes) * config['tile']}"
            )
        stages = config.get("stages", 0)
        if stages == 1 or stages < 0:
            faults.append(f"stages={stages}: 0 (registers) or a ring of at least 2 tiles")
        combine = config.get("combine", "launch")
        if combine not in ("launch", "fused", "cluster"):
            faults.append(f"combine={combine!r} is not 'launch', 'fused' or 'cluster'")
        elif combine == "cluster" and not 1 < splits <= 8:
            faults.append(f"combine='cluster' takes 2 to 8 splits (a portable cluster), not {splits}")
        if faults:
            raise ValueError("decode_attention: " + "; ".join(faults))

    @staticmethod
    def smem_bytes(config: Config, problem: Problem) -> int:
        """Dynamic SMEM of the main kernel: one (acc, m, l) slot per warp and query head of the block (rounded up
        to 16 bytes), then with stages >= 2 the cp.async ring: stages slots of (threads / lanes) · tile rows of K
        and of V, bf16; then with the cluster combine the block's partial (QH · (D + 2) floats, rounded up to 16
        bytes)."""
        D = problem["head_dim"]
        red = -(-(config["threads"] // 32) * config["q_per_pass"] * (D + 2) // 4) * 16
        rows = (config["threads"] // config["lanes"]) * config["tile"]
        part = -(-config["q_per_pass"] * (D + 2) // 4) * 16 if DecodeAttention.clustered(config) else 0
        return red + config.get("stages", 0) * 2 * rows * D * 2 + part

    @staticmethod
    def fused(config: Config) -> bool:
        """Whether the splits are merged inside the main launch (no combine launch)."""
        return config["splits"] > 1 and config.get("combine", "launch") == "fused"

    @staticmethod
    def clustered(config: Config) -> bool:
        """Whether the splits are merged through distributed shared memory (one cluster per head group)."""
        return config["splits"] > 1 and config.get("combine", "launch") == "cluster"

    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        self.check(config, problem)
        B, hq, D = problem["B"], problem["heads_q"], problem["head_dim"]
        splits = config["splits"]
        grid = (splits, hq // config["q_per_pass"], B)
        if splits == 1 or self.clustered(config):
            main_out: tuple[str, ...] = ("out",)
        elif self.fused(config):
            main_out = ("ws_acc", "ws_ml", "counters", "out")
        else:
            main_out = ("ws_acc", "ws_ml")
        out = [
            Launch(
                entry=entry,
                grid=grid,
                block=(config["threads"], 1, 1),
                args=("q", "k", "v", *main_out),
                smem_dynamic=self.smem_bytes(config, problem),
            )
        ]
        if splits > 1 and config.get("combine", "launch") == "launch":
            out.append(
                Launch(entry=f"{entry}_combine", grid=(B * hq, 1, 1), block=(D, 1, 1), args=("ws_acc", "ws_ml", "out"))
            )
        return out

    def inputs(self, xp, problem: Problem, rng) -> dict[str, Any]:
        B, S, hq, hkv, D = (problem[k] for k in self.problem_sizes)
        u = rng.random((B, hq, 1), dtype=xp.float32)
        scale = xp.exp(u * math.log(4.0)).astype(xp.float32)  # log-uniform in [1, 4)
        q = rng.standard_normal((B, hq, D), dtype=xp.float32) * scale
        return {
            "q": bf16.encode(xp, q),
            "k": bf16.random(xp, rng, (B, S, hkv, D)),
            "v": bf16.random(xp, rng, (B, S, hkv, D)),
            # arrival counts of the fused combine, one per (b, query-head group); the kernel leaves them zero
            "counters": xp.zeros((B, hq), dtype=xp.int32),
        }

    def outputs(self, problem: Problem, config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
        B, hq, D = problem["B"], problem["heads_q"], problem["head_dim"]
        out: Outputs = {"out": ((B, hq, D), "bfloat16")}
        if config["splits"] > 1 and not self.clustered(config):
            out["ws_acc"] = ((B, hq, config["splits"], D), "float32")
            out["ws_ml"] = ((B, hq, config["splits"], 2), "float32")
        return out

    def checked(self) -> tuple[str, ...]:
        return ("out",)

    def reference(self, xp, inputs: dict[str, Any], problem: Problem, config: Config | None = None) -> dict[str, Any]:
        """out in fp32 from the exact bf16 inputs (float64 would need 8 bytes per K/V element: 34 GB for the
        largest problem); batched matmuls over (b, kv head), the group's query heads as rows."""
        B, S, hq, hkv, D = (problem[k] for k in self.problem_sizes)
        g = hq // hkv
        q = bf16.decode(xp, inputs["q"]).reshape(B, hkv, g, D)
        out = xp.empty((B, hkv, g, D), dtype=xp.float32)
        for b in range(B):  # one batch row at a time bounds the fp32 copies of K and V to S·HKV·D each
            k = bf16.decode(xp, inputs["k"][b]).transpose(1, 2, 0)  # [HKV, D, S]
            scores = xp.matmul(q[b], k) * xp.float32(1.0 / math.sqrt(D))  # [HKV, G, S]
            del k
            scores -= scores.max(axis=-1, keepdims=True)
            p = xp.exp(scores)
            p /= p.sum(axis=-1, keepdims=True)
            v = bf16.decode(xp, inputs["v"][b]).transpose(1, 0, 2)  # [HKV, S, D]
            out[b] = xp.matmul(p, v)
        return {"out": out.reshape(B, hq, D)}

    def tolerance(self, problem: Problem) -> float:
        """out is at most max|V| ~ 4 and rounded once to bf16 (2^-9 relative); fp32 sums over S and ex2.approx
        add ~1e-5. 1e-2 of max(|ref|, 1) leaves room for both, while a lost split moves peaky heads by O(1)."""
        return 1e-2

    def bytes_moved(self, problem: Problem) -> int:
        B, S, hq, hkv, D = (problem[k] for k in self.problem_sizes)
        return 2 * (2 * B * S * hkv * D + 2 * B * hq * D)  # K, V read; q read, out written; bf16

    def flops(self, problem: Problem) -> int:
        B, S, hq, _, D = (problem[k] for k in self.problem_sizes)
        return 4 * B * hq * S * D


FAMILY = DecodeAttention()
