"""Synthetic Kernel Tuner caches: small spaces of few, unevenly spaced integer knobs, for the search benchmark.

Kernel Tuner's own example spaces (point-in-polygon, convolution, ...) are small Cartesian products of integer
knobs with uneven steps (tile sizes 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, ...; block sizes 32 to 1024 in steps of 32)
and a few method switches written as integers. This writes caches of that shape with a time landscape made from a
simple model of a memory-bound kernel on an RTX 3090-like GPU (82 SMs): wave quantization of the grid, occupancy
from threads and registers per block, work per thread, a per-method cost that interacts with the tile size (a
register-hungry method pays off only at larger tiles and spills past a tile of 20), and a seeded multiplicative
noise of about 1%. Configs that break a restriction are absent from the cache (Kernel Tuner never runs them); some
failed, as in real caches: ``CompilationFailedConfig`` (static shared memory past 48 KiB; 1% at random) and
``RuntimeFailedConfig`` (too many registers for the block; 1-1.5% at random).

Deterministic: the same `--seed` writes the same files.

    python benchmarks/kt_synthetic.py                    # writes benchmarks/data/kt/{pnpoly_like,stencil_like}.json.gz
    python benchmarks/search.py benchmarks/data/kt/stencil_like.json.gz --samplers tpe --seeds 20 --jobs 2
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

SMS = 82  # RTX 3090
MAX_THREADS_PER_SM = 1536
MAX_BLOCKS_PER_SM = 16
REGISTERS_PER_SM = 65536

TILES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32)
BLOCKS = tuple(range(32, 1025, 32))


def _occupancy(block: int, registers: int) -> float:
    """Resident threads per SM over the maximum (0 when one block does not fit)."""
    by_threads = MAX_THREADS_PER_SM // block
    by_registers = REGISTERS_PER_SM // (registers * block)
    blocks = min(by_threads, by_registers, MAX_BLOCKS_PER_SM)
    return blocks * block / MAX_THREADS_PER_SM


def _entry(keys: list[str], config: dict[str, int], time: float | str) -> dict[str, Any]:
    return {**{k: config[k] for k in keys}, "time": time}


def pnpoly_like(rng: np.random.Generator) -> dict[str, Any]:
    """Point-in-polygon: points per thread (tile_size), block size, how the crossing test is written
    (between_method 0..3), precomputed slopes (0/1), the loop's method (use_method 0..2). 20M points."""
    points = 20_000_000
    params = {
        "block_size_x": list(BLOCKS),
        "tile_size": list(TILES),
        "between_method": [0, 1, 2, 3],
        "use_precomputed_slopes": [0, 1],
        "use_method": [0, 1, 2],
    }
    keys = list(params)
    between_cost = {0: 1.00, 1: 0.96, 2: 1.07, 3: 0.99}
    cache: dict[str, Any] = {}
    for values in itertools.product(*params.values()):
        c = dict(zip(keys, values, strict=True))
        block, tile, method, slopes = c["block_size_x"], c["tile_size"], c["use_method"], c["use_precomputed_slopes"]
        if block * tile > 4096 or (slopes and c["between_method"] == 2):
            continue  # the restrictions: never run
        key = ",".join(map(str, values))
        # Method 2 keeps a tile's crossing counts in registers: fastest per point, but only once a tile is large
        # enough to amortize its set-up, and it spills past a tile of 20. Methods 0 and 1 want small tiles.
        registers = 24 + 2 * tile + (5 * tile if method == 2 else 0) + 6 * slopes
        if registers * block > REGISTERS_PER_SM:
            cache[key] = _entry(keys, c, "InvalidConfig")
            continue
        spills = max(0, registers - 168)
        occupancy = _occupancy(block, registers)
        blocks = math.ceil(points / (block * tile))
        resident = SMS * max(1, round(occupancy * MAX_THREADS_PER_SM / block))
        waves = blocks / resident
        quantization = math.ceil(waves) / waves  # the last wave's idle SMs
        latency_hidden = min(1.0, occupancy / 0.5) ** 0.6
        if method == 2:
            per_point = 0.80 * (1.0 + 2.4 / tile) * (1.0 + 0.01 * spills)
        else:
            per_point = (1.0 if method == 0 else 0.97) * (1.0 + 0.5 / tile) * (1.0 + 0.02 * max(0, tile - 4))
        slope = (0.93 if method == 2 else 0.97) if slopes else 1.0
        cost = per_point * between_cost[c["between_method"]] * slope
        time = 0.35 * cost * quantization / latency_hidden * (1.0 + 0.0006 * abs(block - 256) / 32)
        time *= float(np.exp(rng.normal(0.0, 0.01)))
        u = rng.random()
        if u < 0.01:
            cache[key] = _entry(keys, c, "CompilationFailedConfig")
        elif u < 0.02:
            cache[key] = _entry(keys, c, "RuntimeFailedConfig")
        else:
            cache[key] = _entry(keys, c, round(time, 6))
    return _header("pnpoly_like", [points], params, cache)


def stencil_like(rng: np.random.Generator) -> dict[str, Any]:
    """A 2-D stencil: block_size_x (32..256 step 32), block_size_y (1, 2, 4, 8, 16), outputs per thread in x
    and y (uneven integer steps), shared-memory staging (0/1). 4096² grid, radius 4."""
    params = {
        "block_size_x": list(range(32, 257, 32)),
        "block_size_y": [1, 2, 4, 8, 16],
        "tile_size_x": [1, 2, 3, 4, 6, 8],
        "tile_size_y": [1, 2, 3, 4, 5, 6, 8, 10, 12, 16],
        "use_shared": [0, 1],
    }
    keys = list(params)
    n, radius = 4096, 4
    cache: dict[str, Any] = {}
    for values in itertools.product(*params.values()):
        c = dict(zip(keys, values, strict=True))
        bx, by, tx, ty, shared = values
        threads = bx * by
        if threads > 1024 or threads < 64 or tx * ty > 64:
            continue
        key = ",".join(map(str, values))
        registers = 20 + 3 * tx * ty // 2 + (8 if shared else 0)
        smem = (bx * tx + 2 * radius) * (by * ty + 2 * radius) * 4 if shared else 0
        if smem > 48 * 1024:  # static shared memory past 48 KiB: ptxas refuses it
            cache[key] = _entry(keys, c, "CompilationFailedConfig")
            continue
        occupancy = _occupancy(threads, registers)
        if occupancy == 0:  # too many registers for the block: the launch fails
            cache[key] = _entry(keys, c, "RuntimeFailedConfig")
            continue
        if shared:
            occupancy = min(occupancy, (100 * 1024 // max(smem, 1)) * threads / MAX_THREADS_PER_SM)
        tile_w, tile_h = bx * tx, by * ty
        halo = ((tile_w + 2 * radius) * (tile_h + 2 * radius)) / (tile_w * tile_h)
        reads = halo if shared else 1.0 + 0.35 * (2 * radius + 1) / min(ty, 4)  # L1 hits soften the re-reads
        coalesced = min(1.0, tx * bx / 128) ** 0.5 if not shared else 1.0
        blocks = math.ceil(n / tile_w) * math.ceil(n / tile_h)
        resident = SMS * max(1, round(occupancy * MAX_THREADS_PER_SM / threads))
        waves = blocks / resident
        quantization = math.ceil(waves) / waves
        latency_hidden = min(1.0, occupancy / 0.4) ** 0.5
        time = 0.12 * (reads + 1.0) / (coalesced * latency_hidden) * quantization**0.3
        time *= float(np.exp(rng.normal(0.0, 0.01)))
        u = rng.random()
        if u < 0.015:
            cache[key] = _entry(keys, c, "RuntimeFailedConfig")
        else:
            cache[key] = _entry(keys, c, round(time, 6))
    return _header("stencil_like", [n, n], params, cache)


def _header(name: str, size: list[int], params: dict[str, list[int]], cache: dict[str, Any]) -> dict[str, Any]:
    return {
        "device_name": "NVIDIA GeForce RTX 3090 (synthetic)",
        "kernel_name": name,
        "problem_size": size,
        "tune_params_keys": list(params),
        "tune_params": params,
        "objective": "time",
        "cache": cache,
    }


SPACES = {"pnpoly_like": pnpoly_like, "stencil_like": stencil_like}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "data" / "kt"))
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--spaces", default=",".join(SPACES))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(args.spaces.split(",")):
        data = SPACES[name](np.random.default_rng([args.seed, i]))
        entries = data["cache"].values()
        valid = sum(1 for e in entries if e["time"] != "InvalidConfig")
        measured = sum(1 for e in entries if isinstance(e["time"], float))
        path = out / f"{name}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(data).encode(), mtime=0))
        print(f"{path}: {len(data['cache'])} entries, {valid} valid, {measured} measured")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
