"""The gemv family: its space, template and host-side contract, with real NVRTC (no GPU needed).

`emulate` re-traces templates/gemv.cu.j2 in NumPy, thread by thread, with element *indices* in place of
values: every product the kernel would form is recorded as the pair (x index, W index) of the accumulator it
lands in, through the FMA lanes and shuffle butterfly or the mma.sync fragment layout (as the PTX ISA defines
it for m16n8k16 .bf16), the SMEM reduction over k_warps, the y / fp32-partials stores and the split-K
reduction. The tests then demand that every y[m, n] is written exactly once and holds x[m, k]·W[n, k] for each
k exactly once.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from tuner import kernels
from tuner.build import compile as tcompile
from tuner.build import compilers, render
from tuner.kernels import bf16
from tuner.results import header
from tuner.space import space

MNK = {"N": 8192, "K": 8192, "dtype": "bfloat16"}


@pytest.fixture(scope="module")
def gemv_space() -> space.SearchSpace:
    return space.load("gemv")


@pytest.fixture(scope="module")
def family():
    return kernels.get("gemv")


# ------------------------------------------------------------------------------------------------------------
# The emulator


def _lane_words(base, words):
    """Element indices of the low halves of `words` 32-bit words loaded from element `base` (any shape)."""
    return [np.asarray(base) + 2 * e for e in range(words)]


def emulate(family, config: dict, problem: dict, skip_iteration: int | None = None) -> dict:
    """Trace one call of the config on `problem`. Returns {"y": terms, "y_writes": counts} where terms[(m, n)]
    is the array of (x index, W index) pairs summed into y[m, n] (x index -1: a zero row of an mma tile).
    `skip_iteration` drops one K iteration of every warp (to show that the checks notice)."""
    M, N, K = problem["M"], problem["N"], problem["K"]
    launches = family.launches("e", config, problem)
    main = launches[0]
    mma, split_k, cluster = config["mma"], config["split_k"], config["cluster"]
    threads, k_warps = config["threads"], config["k_warps"]
    warps = threads // 32
    n_warps = warps // k_warps
    rpw = config["rows_per_warp"]
    rpb = n_warps * rpw
    m_tile = family.m_rows(config, problem)
    vec, unroll, prefetch = config["vec"], config["unroll"], config["prefetch"]
    words = vec // 2
    k_block = K // split_k
    k_warp = k_block // k_warps
    step = 32 if mma else 32 * vec
    chunk = step * unroll
    iters = k_warp // chunk
    row_loads = rpw // 8 if mma else rpw
    row_stride = 8 if mma else 1
    loads = row_loads * unroll
    assert main.block == (threads, 1, 1)
    assert iters >= 1 and iters * chunk == k_warp and k_warp * k_warps * split_k == K

    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    out_terms: dict[tuple[int, int], list] = {}
    part_terms: dict[tuple[int, int, int], np.ndarray] = {}
    y_writes = np.zeros((M, N), dtype=int)
    part_writes = np.zeros((split_k, M, N), dtype=int)
    cluster_red: dict[tuple[int, int, int], dict] = {}  # (bx, by, rank) -> that block's red

    def iteration_order():
        """The (buffer, iteration) pairs of the template's K loop in execution order: loads then computes."""
        events = []
        if prefetch:
            events.append(("load", "a", 0))
            for it in range(0, iters, 2):
                if it + 1 < iters:
                    events.append(("load", "c", it + 1))
                events.append(("compute", "a", it))
                if it + 2 < iters:
                    events.append(("load", "a", it + 2))
                if it + 1 < iters:
                    events.append(("compute", "c", it + 1))
        else:
            for it in range(iters):
                events += [("load", "a", it), ("compute", "a", it)]
        return events

    gx, gy, gz = main.grid
    for bx in range(gx):
        for by in range(gy):
            for bz in range(gz):
                m0, n0, split = bx * m_tile, by * rpb, bz
                red = {}
                warp_results = []
                if mma == 2:
                    warp_results = _pipe_block(config, problem, m_tile, m0, n0, split, skip_iteration)
                elif mma == 4:
                    warp_results = _wgmma_block(config, problem, m_tile, m0, n0, split, skip_iteration)
                else:
                    if mma == 3:
                        xs = _resident_slice(config, problem, m_tile, m0, split)
                    for warp in range(warps):
                        wn, wk = warp % n_warps, warp // n_warps
                        k0 = split * k_block + wk * k_warp
                        if mma:  # engines 1 and 3 (engine 3 reads x from the slice instead of x_lane)
                            w_lane = (n0 + wn * rpw + g) * K + k0 + 8 * t
                            x_lane = (m0 + g) * K + k0 + 8 * t
                            m_frags = m_tile // 8
                            x_ok = [(m0 + 8 * j + g) < M for j in range(m_frags)]
                            # D[q][j]: 16×8 matrix of term lists (pairs of index arrays).
                            acc = [
                                [[[[] for _ in range(8)] for _ in range(16)] for _ in range(m_frags)]
                                for _ in range(rpw // 16)
                            ]
                        else:
                            w_lane = (n0 + wn * rpw) * K + k0 + lane * vec
                            x_lane = m0 * K + k0 + lane * vec
                            acc = [[[] for _ in range(m_tile)] for _ in range(rpw)]  # lists of (x, w) lane arrays
                        buffers = {}
                        for kind, buf, it in iteration_order():
                            if kind == "load":
                                p = w_lane + it * chunk
                                buffers[buf] = [
                                    _lane_words(p + (li // unroll) * row_stride * K + (li % unroll) * step, words)
                                    for li in range(loads)
                                ]
                                continue
                            if it == skip_iteration:
                                continue
                            wv = buffers[buf]
                            xp = x_lane + it * chunk
                            for u in range(unroll):
                                if mma:
                                    if mma == 3:  # the SMEM slice: chunk kc of rows 8j + g
                                        kc = (wk * k_warp + it * chunk + u * step) // 8 + t
                                        xv = [_slice_words(xs, 8 * j + g, kc) for j in range(m_frags)]
                                    else:
                                        xv = []
                                        for j in range(m_frags):
                                            w_ = _lane_words(xp + 8 * j * K + u * step, 4)
                                            xv.append([np.where(x_ok[j], a, -1) for a in w_])
                                    for s in range(2):
                                        for q in range(rpw // 16):
                                            lo = wv[(2 * q) * unroll + u]
                                            hi = wv[(2 * q + 1) * unroll + u]
                                            regs_a = (lo[2 * s], hi[2 * s], lo[2 * s + 1], hi[2 * s + 1])
                                            for j in range(m_frags):
                                                regs_b = (xv[j][2 * s], xv[j][2 * s + 1])
                                                _mma(acc[q][j], regs_a, regs_b, g, t)
                                else:
                                    xv = [_lane_words(xp + m * K + u * step, words) for m in range(m_tile)]
                                    for e in range(words):
                                        for m in range(m_tile):
                                            for r in range(rpw):
                                                w_lo = wv[r * unroll + u][e]
                                                acc[r][m].append((xv[m][e], w_lo))
                                                acc[r][m].append((xv[m][e] + 1, w_lo + 1))
                        warp_results.append((wn, wk, acc))

                # red[m][nl] = sum over warp slices wk = 0, 1, ... (the first slice stores, the rest add).
                for w in range(k_warps):
                    written = set()
                    for wn, wk, acc in warp_results:
                        if wk != w:
                            continue
                        if mma:
                            for q in range(rpw // 16):
                                for j in range(m_tile // 8):
                                    for lane_id in range(32):
                                        for i in range(4):
                                            gg, tt = lane_id // 4, lane_id % 4
                                            m = 8 * j + 2 * tt + (i % 2)
                                            nl = wn * rpw + 16 * q + gg + 8 * (i // 2)
                                            value = _terms(acc[q][j][gg + 8 * (i // 2)][2 * tt + (i % 2)])
                                            _store(red, written, (m, nl), value, w)
                        else:
                            for r in range(rpw):
                                for m in range(m_tile):
                                    # Shuffle butterfly: lane l adds lane l ^ off, for off = 16, 8, 4, 2, 1.
                                    xs = np.stack([x for x, _ in acc[r][m]], axis=1)  # (32 lanes, terms)
                                    ws = np.stack([w_ for _, w_ in acc[r][m]], axis=1)
                                    for off in (16, 8, 4, 2, 1):
                                        xs = np.concatenate([xs, xs[lane ^ off]], axis=1)
                                        ws = np.concatenate([ws, ws[lane ^ off]], axis=1)
                                    value = np.stack([xs[0], ws[0]], axis=1)  # lane 0 stores
                                    _store(red, written, (m, wn * rpw + r), value, w)
                    if w == 0:
                        assert written == {(m, nl) for m in range(m_tile) for nl in range(rpb)}, (
                            "slice 0 must write every cell of red before anyone reads it"
                        )

                if cluster:
                    cluster_red[(bx, by, split)] = red
                    continue
                # The block's tile: consecutive threads on consecutive n.
                for tid in range(threads):
                    for idx in range(tid, m_tile * rpb, threads):
                        m, n = m0 + idx // rpb, n0 + idx % rpb
                        if m < M:
                            value = red[(idx // rpb, idx % rpb)]
                            if split_k == 1:
                                y_writes[m, n] += 1
                                out_terms[(m, n)] = value
                            else:
                                part_writes[split, m, n] += 1
                                part_terms[(split, m, n)] = value

    if cluster:
        # Rank r of each cluster sums quads (4 cells) r·share .. of the tile over the red of ranks 0, 1, ... in
        # order.
        assert len(launches) == 1 and main.args == ("x", "W", "y", "M", "N", "K") and gz == split_k
        assert rpb % 4 == 0
        quads = m_tile * rpb // 4
        share = -(-quads // split_k)
        for bx in range(gx):
            for by in range(gy):
                for rank in range(split_k):
                    end = min((rank + 1) * share, quads)
                    for tid in range(threads):
                        for q4 in range(rank * share + tid, end, threads):
                            idx = 4 * q4
                            m, n = bx * m_tile + idx // rpb, by * rpb + idx % rpb
                            if m < M:
                                for e in range(4):  # the quad: 4 consecutive n of row m
                                    y_writes[m, n + e] += 1
                                    cell = (idx // rpb, idx % rpb + e)
                                    out_terms[(m, n + e)] = np.concatenate(
                                        [cluster_red[(bx, by, r)][cell] for r in range(split_k)]
                                    )
    elif split_k > 1:
        assert (part_writes == 1).all(), "every fp32 partial is written exactly once"
        reduce_launch = launches[1]
        assert reduce_launch.args == ("part", "y", "M", "N")
        total = M * N
        for bx in range(reduce_launch.grid[0]):
            for tid in range(reduce_launch.block[0]):
                i = (bx * 256 + tid) * 4
                if i >= total:
                    continue
                for e in range(4):
                    m, n = divmod(i + e, N)
                    y_writes[m, n] += 1
                    out_terms[(m, n)] = np.concatenate([part_terms[(s, m, n)] for s in range(split_k)])
    return {"y": out_terms, "y_writes": y_writes}


def _resident_slice(config, problem, m_tile, m0, split):
    """mma 3, one block: the SMEM x slice as {"chunks": {chunk offset: element index of its first bf16 (-1: a
    zero-filled row past M)}, "pitch", "row_chunks"}, filled by the template's staging loop (each chunk exactly
    once, none in the pad)."""
    M, K = problem["M"], problem["K"]
    k_block = K // config["split_k"]
    row_chunks, pitch = k_block // 8, (k_block + 32) // 8
    chunks: dict[int, int] = {}
    for tid in range(config["threads"]):
        for c in range(tid, m_tile * row_chunks, config["threads"]):
            r, kc = divmod(c, row_chunks)
            dst = r * pitch + kc
            assert dst not in chunks, "a slice chunk written twice"
            m = m0 + r
            chunks[dst] = (m * K + split * k_block + 8 * kc) if m < M else -1
    assert len(chunks) == m_tile * row_chunks
    return {"chunks": chunks, "pitch": pitch, "row_chunks": row_chunks}


def _slice_words(xs, rows, kc):
    """The 4 words (low-half element indices, -1 for zeros) lanes read from chunk kc of slice rows `rows` (one
    per lane). The read stays inside the row (not in the pad), and every 8-lane phase of the 128-bit load
    covers 128 distinct bytes of the 32 banks (rows g, g + 1 are 64 bytes apart modulo 128)."""
    rows, kc = np.broadcast_to(rows, (32,)), np.broadcast_to(kc, (32,))
    assert (kc < xs["row_chunks"]).all(), "a read past the slice row"
    offsets = rows * xs["pitch"] + kc
    for phase in range(4):
        banks = {(16 * int(o)) % 128 for o in offsets[8 * phase : 8 * phase + 8]}
        assert len(banks) == 8, "bank conflict in a 128-bit SMEM phase"
    first = np.array([xs["chunks"][int(o)] for o in offsets])
    return [np.where(first >= 0, first + 2 * e, -1) for e in range(4)]


def _multistage(stages, iters, load_tile, compute_tile, skip_iteration):
    """The ring engines' K loop in the template's order (CUTLASS's multistage): tiles 0 .. stages - 2 in flight
    first; then for each tile it, refill the slot tile it - 1 used with tile it + stages - 1 and compute tile
    it (`skip_iteration`: not computed)."""
    for s in range(stages - 1):
        if s < iters:
            load_tile(s, s)
    for it in range(iters):
        if it + stages - 1 < iters:
            load_tile((it + stages - 1) % stages, it + stages - 1)
        if it != skip_iteration:
            compute_tile(it % stages, it)


def _wgmma_block(config, problem, m_tile, m0, n0, split, skip_iteration):
    """mma 4, one block: the ring as a dict {SMEM byte offset of a 16-byte chunk (ring-relative, 1024-byte
    aligned base): element index of its first bf16, -1 for a zero-filled x row}, filled by the template's
    load_tile formulas (128-byte swizzle: chunk c of row r at c ^ (r % 8)), and read back the way the PTX ISA
    defines wgmma's operand fetch for a 128-byte-swizzled K-major descriptor: the element (row r, k e) of an
    operand whose descriptor starts at S lies at L = S + (r // 8)·SBO + (r % 8)·128 + 2e with address bits 4-6
    XORed with bits 7-9 (SBO 1024; the template's k16 steps add 32 bytes to S). Returns [(wn, wk, acc)] in
    engine 1's fragment format (warp w of warpgroup wg holds rows 16·(4wg + w) ..)."""
    M, K = problem["M"], problem["K"]
    threads, unroll, stages, split_k = config["threads"], config["unroll"], config["stages"], config["split_k"]
    warps = threads // 32
    rpb = warps * 16
    k_block = K // split_k
    kt = 32 * unroll
    ka, rc = kt // 64, kt // 8
    iters = k_block // kt
    w_chunks, x_chunks = rpb * rc, m_tile * rc
    stage_bytes = (w_chunks + x_chunks) * 16
    round_rows = threads // rc
    assert kt % 64 == 0 and threads % 128 == 0 and stage_bytes % 1024 == 0
    ring: dict[int, int] = {}
    in_slot: dict[int, int] = {}

    def load_tile(slot, it):
        stage = slot * stage_bytes
        for tid in range(threads):
            row0, c0 = tid // rc, tid % rc
            atom0, cc0 = c0 // 8, c0 % 8
            for i in range(w_chunks // threads):
                r = row0 + i * round_rows
                dst = stage + 16 * (atom0 * rpb * 8 + r * 8 + (cc0 ^ (r & 7)))
                ring[dst] = (n0 + r) * K + split * k_block + 8 * c0 + it * kt
            for i in range(-(-x_chunks // threads)):
                r = row0 + i * round_rows
                if r < m_tile:
                    m = m0 + r
                    dst = stage + 16 * (w_chunks + atom0 * m_tile * 8 + r * 8 + (cc0 ^ (r & 7)))
                    ring[dst] = m * K + split * k_block + 8 * c0 + it * kt if m < M else -1
        in_slot[slot] = it

    def fetch(start, rows):
        """Element indices [rows][16] of the k16 operand whose descriptor starts at byte `start`."""
        assert start % 16 == 0
        out = np.empty((rows, 16), dtype=np.int64)
        for r in range(rows):
            for e in range(16):
                logical = start + (r // 8) * 1024 + (r % 8) * 128 + 2 * e
                physical = logical ^ (((logical >> 7) & 7) << 4)
                first = ring[physical - physical % 16]
                out[r, e] = -1 if first < 0 else first + (physical % 16) // 2
        return out

    accs = {warp: [[[[[] for _ in range(8)] for _ in range(16)] for _ in range(m_tile // 8)]] for warp in range(warps)}

    def compute_tile(slot, it):
        assert in_slot[slot] == it, f"slot {slot} holds tile {in_slot[slot]} when tile {it} is computed"
        stage = slot * stage_bytes
        for wg in range(threads // 128):
            for a in range(ka):
                for kk in range(4):
                    A = fetch(stage + a * rpb * 128 + wg * 64 * 128 + kk * 32, 64)  # W rows of the warpgroup
                    B = fetch(stage + w_chunks * 16 + a * m_tile * 128 + kk * 32, m_tile)  # x rows
                    for row in range(64):
                        warp, r16 = 4 * wg + row // 16, row % 16
                        for m in range(m_tile):
                            accs[warp][0][m // 8][r16][m % 8].append((B[m], A[row]))

    _multistage(stages, iters, load_tile, compute_tile, skip_iteration)
    return [(warp, 0, accs[warp]) for warp in range(warps)]


def _pipe_block(config, problem, m_tile, m0, n0, split, skip_iteration):
    """mma 2, one block: the cp.async ring as a dict (slot, chunk) -> element index of the chunk's first bf16
    (-1: a zero-filled x row), filled by the template's load_tile formulas in the order of its loop, and each
    warp's fragments read back with compute_tile's formulas. Returns [(wn, wk, acc)] as for engine 1."""
    M, K = problem["M"], problem["K"]
    threads, k_warps, unroll = config["threads"], config["k_warps"], config["unroll"]
    stages, split_k, rpw = config["stages"], config["split_k"], config["rows_per_warp"]
    warps = threads // 32
    n_warps = warps // k_warps
    rpb = n_warps * rpw
    k_block = K // split_k
    kt = k_warps * 32 * unroll
    iters = k_block // kt
    rc = kt // 8
    swz = 4 if rc >= 8 else 0
    w_chunks, x_chunks = rpb * rc, m_tile * rc
    round_rows = threads // rc
    assert threads % rc == 0 and round_rows % 2 == 0 and w_chunks % threads == 0
    w_rounds, x_rounds = w_chunks // threads, -(-x_chunks // threads)
    ring: dict[tuple[int, int], int] = {}
    in_slot: dict[int, int] = {}

    def load_tile(slot, it):
        for tid in range(threads):
            row0, c0 = tid // rc, tid % rc
            dst0 = row0 * rc + (c0 ^ (swz * (row0 & 1)))
            w_src = (n0 + row0) * K + split * k_block + 8 * c0
            x_src = split * k_block + 8 * c0
            for i in range(w_rounds):
                ring[(slot, dst0 + i * round_rows * rc)] = w_src + i * round_rows * K + it * kt
            for i in range(x_rounds):
                if row0 + i * round_rows < m_tile:
                    m = m0 + row0 + i * round_rows
                    ring[(slot, w_chunks + dst0 + i * round_rows * rc)] = m * K + x_src + it * kt if m < M else -1
        in_slot[slot] = it

    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    m_frags, n_frags = m_tile // 8, rpw // 16
    accs = {
        warp: [[[[[] for _ in range(8)] for _ in range(16)] for _ in range(m_frags)] for _ in range(n_frags)]
        for warp in range(warps)
    }

    def words(slot, chunk):
        """The 4 words of each lane's 16-byte chunk as arrays of low-half element indices (-1 stays -1)."""
        base = np.array([ring[(slot, int(c))] for c in chunk])
        return [np.where(base < 0, -1, base + 2 * e) for e in range(4)]

    def compute_tile(slot, it):
        assert in_slot[slot] == it, f"slot {slot} holds tile {in_slot[slot]} when tile {it} is computed"
        for warp in range(warps):
            wn, wk = warp % n_warps, warp // n_warps
            for u in range(unroll):
                c = ((wk * unroll + u) * 4 + t) ^ (swz * (g & 1))
                xv = [words(slot, (rpb + 8 * j + g) * rc + c) for j in range(m_frags)]
                for q in range(n_frags):
                    lo = words(slot, (wn * rpw + 16 * q + g) * rc + c)
                    hi = words(slot, (wn * rpw + 16 * q + 8 + g) * rc + c)
                    for j in range(m_frags):
                        for s in range(2):
                            regs_a = (lo[2 * s], hi[2 * s], lo[2 * s + 1], hi[2 * s + 1])
                            _mma(accs[warp][q][j], regs_a, (xv[j][2 * s], xv[j][2 * s + 1]), g, t)

    _multistage(stages, iters, load_tile, compute_tile, skip_iteration)
    return [(warp % n_warps, warp // n_warps, accs[warp]) for warp in range(warps)]


def _mma(d, regs_a, regs_b, g, t):
    """d[16][8] += A·B for one mma.m16n8k16 .row.col bf16, given each lane's registers as arrays over the 32
    lanes of the low-half element index (the high half is index + 1). PTX ISA fragment layout (groupID
    g = lane / 4, threadID_in_group t = lane % 4): A a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),
    a3 = (g+8, 2t+8..); B b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)."""
    A = np.full((16, 16), -2, dtype=np.int64)
    B = np.full((16, 8), -2, dtype=np.int64)
    for lane_id in range(32):
        gg, tt = lane_id // 4, lane_id % 4
        for e in range(2):

            def half(reg, e=e, lane_id=lane_id):
                lo = int(reg[lane_id])
                return -1 if lo < 0 else lo + e

            A[gg, 2 * tt + e] = half(regs_a[0])
            A[gg + 8, 2 * tt + e] = half(regs_a[1])
            A[gg, 2 * tt + 8 + e] = half(regs_a[2])
            A[gg + 8, 2 * tt + 8 + e] = half(regs_a[3])
            B[2 * tt + e, gg] = half(regs_b[0])
            B[2 * tt + 8 + e, gg] = half(regs_b[1])
    assert (A != -2).all() and (B != -2).all(), "every fragment element comes from exactly one lane register"
    for r in range(16):
        for c in range(8):
            d[r][c].append((B[:, c], A[r, :]))  # (x index, W index) for kk = 0..15


def _terms(pairs) -> np.ndarray:
    xs = np.concatenate([x for x, _ in pairs])
    ws = np.concatenate([w for _, w in pairs])
    return np.stack([xs, ws], axis=1)


def _store(red, written, cell, value, w):
    assert cell not in written, f"two lanes of slice {w} write red{cell}"
    written.add(cell)
    red[cell] = value if w == 0 else np.concatenate([red[cell], value])


def check_emulation(family, config, problem, skip_iteration=None):
    """Every y[m, n] written once, holding x[m, k]·W[n, k] for k = 0..K-1 exactly once (and nothing else)."""
    M, N, K = problem["M"], problem["N"], problem["K"]
    result = emulate(family, config, problem, skip_iteration)
    assert (result["y_writes"] == 1).all(), f"y written {np.unique(result['y_writes'])} times"
    k = np.arange(K)
    for m in range(M):
        for n in range(N):
            terms = result["y"][(m, n)]
            expected = np.stack([m * K + k, n * K + k], axis=1)
            got = terms[np.lexsort((terms[:, 1], terms[:, 0]))]
            ok = got.shape == expected.shape and (got == expected).all()
            assert ok, f"y[{m}, {n}] sums the wrong terms"


BASE = {
    "mma": 0,
    "split_k": 1,
    "threads": 128,
    "k_warps": 1,
    "rows_per_warp": 2,
    "m_tile": 16,
    "vec": 8,
    "unroll": 1,
    "prefetch": 0,
    "w_cache": "na",
    "min_blocks": 1,
    "stages": 2,
    "cluster": 0,
}

EMULATED = [
    # (problem M, N, K), overrides of BASE
    ((2, 16, 256), {}),
    ((2, 16, 512), {"unroll": 2, "prefetch": 1}),  # 1 iteration of 2 steps; prefetch guards
    ((2, 32, 2048), {"prefetch": 1, "vec": 4, "unroll": 2}),  # 4 iterations, double buffer
    ((3, 16, 1536), {"prefetch": 1, "vec": 2, "rows_per_warp": 4}),  # 3 iterations (odd)
    ((2, 16, 1024), {"split_k": 2, "k_warps": 2, "rows_per_warp": 4}),
    ((4, 8, 2048), {"split_k": 4, "k_warps": 4, "threads": 256, "rows_per_warp": 2, "vec": 2}),
    ((6, 16, 512), {"m_tile": 16, "rows_per_warp": 1, "threads": 256, "k_warps": 2, "vec": 2}),
    ((2, 32, 256), {"mma": 1, "rows_per_warp": 16, "m_tile": 8, "k_warps": 2, "unroll": 2}),
    ((3, 32, 512), {"mma": 1, "rows_per_warp": 32, "m_tile": 64, "k_warps": 4, "unroll": 1}),  # M tail
    (
        (9, 16, 1024),
        {"mma": 1, "rows_per_warp": 16, "m_tile": 16, "k_warps": 4, "split_k": 2, "prefetch": 1, "unroll": 2},
    ),  # 2 M fragments, rows 9..15 zero
    ((16, 32, 512), {"mma": 1, "rows_per_warp": 16, "m_tile": 8, "k_warps": 2, "split_k": 2, "unroll": 4}),
    (
        (8, 64, 384),
        {"mma": 1, "rows_per_warp": 16, "m_tile": 8, "threads": 128, "k_warps": 1, "unroll": 4, "prefetch": 1},
    ),  # 3 iterations, 4 warps on rows
    # mma 2 (cp.async ring): rows of 64 bytes (no swizzle) and of 128+ bytes (swizzled), ring deeper and
    # shallower than the tiles, zero-filled x rows, k_warps slices of a tile, split-K.
    ((2, 64, 256), {"mma": 2, "rows_per_warp": 16, "m_tile": 8, "k_warps": 1, "stages": 2}),
    ((3, 64, 1024), {"mma": 2, "rows_per_warp": 16, "m_tile": 64, "k_warps": 2, "unroll": 2, "stages": 3}),
    (
        (9, 128, 2048),
        {"mma": 2, "rows_per_warp": 32, "m_tile": 16, "k_warps": 1, "unroll": 4, "stages": 4, "split_k": 2},
    ),  # 4 tiles per split: the ring wraps
    ((16, 32, 1536), {"mma": 2, "rows_per_warp": 16, "m_tile": 16, "threads": 256, "k_warps": 4, "stages": 6}),
    # cluster split-K: the split blocks of a tile sum through DSMEM (shares that do not divide the tile, M tail,
    # eight ranks with k_warps 8).
    (
        (3, 64, 1536),
        {"mma": 2, "rows_per_warp": 16, "m_tile": 8, "k_warps": 1, "split_k": 3, "cluster": 1, "stages": 2},
    ),
    (
        (9, 32, 4096),
        {"mma": 2, "rows_per_warp": 16, "m_tile": 16, "threads": 256, "k_warps": 8, "split_k": 8, "cluster": 1},
    ),
    (
        (4, 128, 2048),
        {"mma": 2, "rows_per_warp": 64, "m_tile": 8, "threads": 128, "k_warps": 2, "split_k": 2, "cluster": 1},
    ),
    # mma 4 (wgmma on the swizzled ring): one and two warpgroups, atoms of 64 and 128 k, zero x rows past M,
    # the ring wrapping, split-K with partials and with a cluster.
    ((3, 64, 512), {"mma": 4, "rows_per_warp": 16, "m_tile": 8, "unroll": 2, "stages": 2}),
    ((9, 128, 1024), {"mma": 4, "rows_per_warp": 16, "m_tile": 16, "threads": 256, "unroll": 4, "stages": 3}),
    (
        (16, 64, 2048),
        {"mma": 4, "rows_per_warp": 16, "m_tile": 16, "unroll": 2, "stages": 4, "split_k": 2, "cluster": 1},
    ),
    ((5, 64, 1024), {"mma": 4, "rows_per_warp": 16, "m_tile": 8, "unroll": 4, "stages": 2, "split_k": 2}),
    # two M tiles (the shipped space's split of M = 32 and 64): blockIdx.x picks x rows 16..31
    ((32, 128, 1024), {"mma": 4, "rows_per_warp": 16, "m_tile": 16, "threads": 256, "unroll": 4, "stages": 3}),
    # mma 3 (x slice resident in SMEM): zero rows past M, k_warps slices of the block's K range, the register
    # double buffer, split-K with fp32 partials and with a cluster.
    ((3, 32, 512), {"mma": 3, "rows_per_warp": 16, "m_tile": 8, "k_warps": 2, "unroll": 2}),
    (
        (9, 128, 1024),
        {"mma": 3, "rows_per_warp": 32, "m_tile": 16, "k_warps": 1, "unroll": 2, "prefetch": 1, "split_k": 2},
    ),
    (
        (16, 32, 4096),
        {"mma": 3, "rows_per_warp": 16, "m_tile": 16, "threads": 256, "k_warps": 4, "split_k": 4, "cluster": 1},
    ),
]


@pytest.mark.parametrize("shape, overrides", EMULATED)
def test_emulated_index_math_sums_each_term_once(family, shape, overrides):
    M, N, K = shape
    problem = {"M": M, "N": N, "K": K, "dtype": "bfloat16"}
    check_emulation(family, {**BASE, **overrides}, problem)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"mma": 1, "rows_per_warp": 16, "m_tile": 8, "k_warps": 2},
        {"mma": 2, "rows_per_warp": 16, "m_tile": 8, "k_warps": 2, "stages": 3},
        {"mma": 2, "rows_per_warp": 16, "m_tile": 8, "k_warps": 2, "stages": 2, "split_k": 2, "cluster": 1},
        {"mma": 3, "rows_per_warp": 16, "m_tile": 8, "k_warps": 2, "prefetch": 1, "split_k": 2, "cluster": 1},
        {"mma": 4, "rows_per_warp": 16, "m_tile": 8, "unroll": 2, "stages": 3},
    ],
)
def test_emulator_catches_a_dropped_iteration(family, overrides):
    """The emulation check is not vacuous: a kernel that skips one K iteration fails it."""
    problem = {"M": 2, "N": 64, "K": 512, "dtype": "bfloat16"}
    config = {**BASE, **overrides}
    check_emulation(family, config, problem)
    with pytest.raises(AssertionError, match="wrong terms"):
        check_emulation(family, config, problem, skip_iteration=1)


def test_emulator_catches_an_uncovered_row_block(family, monkeypatch):
    """... and a grid that misses a block of rows fails it too."""
    problem = {"M": 2, "N": 16, "K": 512, "dtype": "bfloat16"}
    config = {**BASE, "unroll": 1}
    real = family.launches

    def fewer_blocks(entry, cfg, prob):
        launches = real(entry, cfg, prob)
        main = launches[0]
        grid = (main.grid[0], main.grid[1] - 1, main.grid[2])
        return [main.__class__(main.entry, grid, main.block, main.args)]

    monkeypatch.setattr(family, "launches", fewer_blocks)
    with pytest.raises(AssertionError, match="y written"):
        check_emulation(family, config, problem)


# ------------------------------------------------------------------------------------------------------------
# Space, compile, launches, reference, accounting


def test_family_contract(family):
    assert family.name == "gemv" and family.template == "gemv.cu.j2"
    assert family.dtypes == ("bfloat16",) and family.problem_sizes == ("M", "N", "K")
    assert family.throughput_unit == "TB/s"
    assert kernels.get("gemv") is family


def test_space_problems_and_counts(gemv_space, family):
    assert gemv_space.kernel == "gemv"
    names = [p.name for p in gemv_space.problems]
    assert names == ["m1", "m2", "m4", "m8", "m16", "m32", "m64", "up_m1", "up_m64", "down_m1", "down_m64"]
    assert [p.sizes["M"] for p in gemv_space.problems[:7]] == [1, 2, 4, 8, 16, 32, 64]
    assert {(p.sizes["N"], p.sizes["K"]) for p in gemv_space.problems[7:]} == {(28672, 8192), (8192, 28672)}
    assert set(family.uri_names) == set(gemv_space.params)
    for problem in gemv_space.problems:
        M = problem.sizes["M"]
        configs = gemv_space.valid_configs(problem)
        assert 200 <= len(configs) <= 9000
        # W crosses HBM once: one M tile covers all of M, or engine 4 takes two tiles of half of M (their
        # blocks of a W row range are launch-order neighbours sharing W in the L2), and each effective tile is
        # listed once (m_tile 64 for one tile)
        tiles = {(c["mma"], c["m_tile"], gemv_space.resolve(c, problem)["m_blocks"]) for c in configs}
        assert all(blocks == 1 and m_tile == 64 or mma == 4 and blocks == 2 for mma, m_tile, blocks in tiles)
        assert {(m_tile, blocks) for mma, m_tile, blocks in tiles if blocks == 2} == (
            {(M // 2, 2)} if M in (32, 64) else set()
        )
        engines = {c["mma"] for c in configs}
        # FMAs up to M = 16; engine 3 only in benchmarks/spaces/gemv_engine3.yaml
        assert engines == ({0, 1, 2, 4} if M <= 16 else {1, 2, 4})
        if M <= 16:
            assert gemv_space.validate(gemv_space.default, problem) is None


@pytest.mark.parametrize("problem_name", ["m1", "m8", "m16"])
def test_default_compiles_without_spills(family, gemv_space, problem_name):
    problem = gemv_space.problem(problem_name)
    config = gemv_space.resolve(gemv_space.default, problem)
    source = render.render(family, gemv_space.default, config, problem.env)
    result = tcompile.compile_source(source)
    assert result.ok, result.reason
    assert set(result.functions) == {source.entry}  # split_k 1: one kernel
    assert 0 < result.registers <= 255
    assert result.spill_bytes == 0
    assert result.smem_static_bytes == config["red_bytes"]


def test_split_k_and_mma_compile(family, gemv_space):
    problem = gemv_space.problem("m64")
    params = {
        **gemv_space.default,
        "mma": 1,
        "split_k": 2,
        "threads": 256,
        "k_warps": 4,
        "rows_per_warp": 32,
        "m_tile": 64,
        "unroll": 1,
        "w_cache": "na256",
    }
    assert gemv_space.validate(params, problem) is None
    source = render.render(family, params, gemv_space.resolve(params, problem), problem.env)
    result = tcompile.compile_source(source)
    assert result.ok, result.reason
    assert set(result.functions) == {source.entry, source.entry + "_reduce"}
    assert result.spill_bytes == 0 and result.main.registers > 0


def test_sampled_configs_compile(family, gemv_space):
    """For M = 1, 16, 64 and the down projection, one seeded valid config per (engine, split-K or not) compiles
    without spills."""
    rng = random.Random(1)
    sources = []
    n_groups = {"m1": 8, "m16": 8, "m64": 6, "down_m64": 6}  # engines 0-2 and 4 (M <= 16) or 1, 2, 4; split or not
    for problem in map(gemv_space.problem, n_groups):
        groups: dict[tuple, list] = {}
        for config in gemv_space.valid_configs(problem):
            groups.setdefault((config["mma"], config["split_k"] > 1), []).append(config)
        assert len(groups) == n_groups[problem.name]
        for configs in groups.values():
            config = rng.choice(configs)
            sources.append(render.render(family, config, gemv_space.resolve(config, problem), problem.env))
    for source, result in compilers.compile_many(sources, jobs=1):  # in this process: see tests/README.md
        assert result.ok, (source.uri, result.reason)
        assert result.main.registers > 0 and source.entry in result.functions
        assert result.spill_bytes == 0, source.uri


# Engine 2 (the cp.async ring) at M = 64: 8 warps of 32 W rows (256 rows a block, one block an SM) and 16 warps of
# 16 rows, as the space resolves them for 8192² and the down projection.
PIPE = {
    "mma": 2,
    "threads": 256,
    "k_warps": 1,
    "rows_per_warp": 32,
    "m_tile": 64,
    "vec": 8,
    "unroll": 2,
    "prefetch": 0,
    "w_cache": "na",
    "min_blocks": 1,
    "stages": 4,
}


@pytest.mark.parametrize(
    "problem_name, overrides",
    [
        ("m64", {"split_k": 4}),
        ("m64", {"split_k": 4, "threads": 512, "rows_per_warp": 16, "stages": 3}),
        ("down_m64", {"split_k": 4, "stages": 3, "w_cache": "na256"}),
        ("m8", {"split_k": 4, "k_warps": 2, "unroll": 4, "stages": 3, "w_cache": "cs"}),
        # 64-row warp tiles (x read from SMEM once per 64 W rows); cluster split-K with 128 and 256 rows a block
        ("m64", {"split_k": 1, "threads": 256, "k_warps": 8, "rows_per_warp": 64, "unroll": 1, "stages": 3}),
        ("m64", {"split_k": 2, "k_warps": 4, "rows_per_warp": 64, "unroll": 1, "stages": 3, "cluster": 1}),
        ("down_m64", {"split_k": 4, "stages": 4, "cluster": 1, "w_cache": "cs"}),
    ],
)
def test_pipe_engine_compiles_within_its_budgets(family, gemv_space, problem_name, overrides):
    """mma 2 configs are valid, compile for sm_90 without spills and within est_regs + 24 registers, take no
    static SMEM and launch with the derived ring size as dynamic SMEM (over 48 KiB: the evaluator opts in)."""
    problem = gemv_space.problem(problem_name)
    params = {**gemv_space.default, **PIPE, **overrides}
    assert gemv_space.validate(params, problem) is None
    config = gemv_space.resolve(params, problem)
    launches = family.launches("e", config, problem.env)
    assert launches[0].smem_dynamic == config["smem_dynamic"] == family.smem_dynamic(config, problem.env)
    k_tile = params["k_warps"] * 32 * params["unroll"]
    ring = params["stages"] * (config["rows_per_block"] + config["m_rows"]) * k_tile * 2
    assert config["smem_dynamic"] == max(ring, config["red_bytes"]) > 48 * 1024
    source = render.render(family, params, config, problem.env)
    assert "cp.async.cg.shared.global" in source.text and "cp.async.wait_group" in source.text
    assert ("mapa.shared::cluster" in source.text) == bool(params["cluster"])
    result = tcompile.compile_source(source)
    assert result.ok, result.reason
    if params["cluster"]:  # one launch: the split blocks reduce in the cluster, no partials buffer
        assert [launch.entry for launch in launches] == ["e"] and launches[0].args[2] == "y"
        assert set(result.functions) == {source.entry} and "part" not in family.outputs(problem.env, config)
        assert f"__cluster_dims__(1, 1, {params['split_k']})" in source.text
    assert result.spill_bytes == 0 and result.smem_static_bytes == 0
    assert 0 < result.main.registers <= config["est_regs"] + 24


def test_pipe_engine_constraints(family, gemv_space):
    """The space screens engine-2 configs that cannot work or duplicate others; engines 0 and 1 keep stages 2."""
    problem = gemv_space.problem("m64")
    ok = {**gemv_space.default, **PIPE, "split_k": 4}
    assert gemv_space.validate(ok, problem) is None

    def reason(on=problem, **changes):
        why = gemv_space.validate({**ok, **changes}, on)
        assert why is not None, changes
        return why

    assert "prefetch == 0" in reason(prefetch=1)  # the ring is the prefetch
    assert "smem_dynamic <= smem_per_block_max" in reason(stages=6, unroll=4)  # 6 · 320 rows · 256 B = 480 KiB
    # M = 8, 16 W rows a block, tiles of 512: 4 tiles per split, fewer than 6 stages (3 pass)
    small = {"unroll": 4, "rows_per_warp": 16, "k_warps": 4, "threads": 128}
    assert gemv_space.validate({**ok, **small, "stages": 3}, gemv_space.problem("m8")) is None
    assert "iters >= stages" in reason(gemv_space.problem("m8"), **small, stages=6)
    assert "stages == 2" in reason(mma=1, rows_per_warp=16, unroll=2)  # one config per engine-1 kernel
    # 128 blocks of 256 rows (7/8 of the SMs or more) are allowed for engine 2 only
    assert gemv_space.resolve(ok, problem)["blocks"] == 128
    rows128 = {"threads": 128, "rows_per_warp": 32, "split_k": 2}  # 64 blocks of 128 rows × 2 splits
    assert gemv_space.validate({**ok, **rows128, "stages": 3}, problem) is None
    assert "blocks >= sm_count" in reason(**rows128, mma=1, stages=2, unroll=1)
    # cluster: engine 2 with 2 to 8 splits; it lifts the bound on the (now SMEM-resident) partials
    assert "cluster == 0 or (split_k >= 2" in reason(cluster=1, split_k=1)
    assert "cluster == 0 or mma >= 2" in reason(cluster=1, mma=1, rows_per_warp=16, unroll=2, stages=2)
    wide = {"k_warps": 1, "rows_per_warp": 32, "unroll": 1, "split_k": 8, "stages": 3}
    assert "split_k * M * 32 <= K" in reason(**wide)  # 8 splits: 16 MiB of fp32 partials in HBM
    assert gemv_space.validate({**ok, **wide, "cluster": 1}, problem) is None
    with pytest.raises(ValueError, match="cluster needs"):
        family.launches("e", {**gemv_space.resolve(ok, problem), "split_k": 1, "cluster": 1}, problem.env)
    with pytest.raises(ValueError, match="stages >= 2"):
        family.launches("e", {**gemv_space.resolve(ok, problem), "stages": 1}, problem.env)
    with pytest.raises(ValueError, match="not an engine"):
        family.launches("e", {**gemv_space.resolve(ok, problem), "mma": 5}, problem.env)
    # engines 0 and 1 take no dynamic SMEM
    for engine in (0, 1):
        config = {**gemv_space.resolve(ok, problem), "mma": engine}
        assert family.smem_dynamic(config, problem.env) == 0


# Engine 4 (wgmma on the swizzled ring) as the grid of benchmarks/results/decode-2026-12-01-gemv-wgmma-grid.md
# measured it: one or two warpgroups, atoms of 64 or 128 k, cluster split-K and plain.
WGMMA = {"mma": 4, "m_tile": 64, "vec": 8, "min_blocks": 1, "k_warps": 1, "rows_per_warp": 16, "prefetch": 0}


@pytest.mark.parametrize(
    "problem_name, overrides",
    [
        ("m64", {"split_k": 2, "cluster": 1, "threads": 128, "unroll": 4, "stages": 3}),
        ("m64", {"split_k": 4, "threads": 256, "unroll": 2, "stages": 6, "w_cache": "na256"}),
        ("m16", {"split_k": 2, "cluster": 1, "threads": 128, "unroll": 4, "stages": 4}),
        ("m1", {"split_k": 1, "threads": 128, "unroll": 4, "stages": 6, "w_cache": "cs"}),
        ("down_m64", {"split_k": 4, "cluster": 1, "threads": 256, "unroll": 4, "stages": 3}),
        # two M tiles of 32 rows at M = 64 (the H200's pick, benchmarks/results/decode-2026-12-01-gemv-mtile.md)
        ("m64", {"m_tile": 32, "split_k": 1, "threads": 256, "unroll": 4, "stages": 4, "w_cache": "cs"}),
        # four warpgroups (256 W rows) at M = 64: red (64 KiB) aliases the ring, past the 48 KiB of static SMEM
        ("m64", {"split_k": 4, "cluster": 1, "threads": 512, "unroll": 2, "stages": 4, "w_cache": "cs"}),
    ],
)
def test_wgmma_engine_compiles_for_sm90a(family, gemv_space, problem_name, overrides):
    """mma 4 configs are valid, compile for sm_90a (wgmma exists only there) into PTX that carries the
    m64nNk16 wgmma with N = m_rows and the async-proxy fence, without spills, and launch with the ring plus
    1 KiB of alignment slack as dynamic SMEM."""
    problem = gemv_space.problem(problem_name)
    params = {**gemv_space.default, **WGMMA, **overrides}
    assert gemv_space.validate(params, problem) is None
    config = gemv_space.resolve(params, problem)
    ring = params["stages"] * (config["rows_per_block"] + config["m_rows"]) * 32 * params["unroll"] * 2
    assert config["smem_dynamic"] == max(ring + 1024, config["red_bytes"])
    assert family.launches("e", config, problem.env)[0].smem_dynamic == config["smem_dynamic"]
    source = render.render(family, params, config, problem.env)
    assert tcompile.target_arch(source.text, "sm_90") == "sm_90a"
    # an exported header says so beside the config (its host program must pass sm_90a to NVRTC)
    assert header.compile_target_note(source.text, "sm_90").startswith("compile for sm_90a:")
    result = tcompile.compile_source(source)
    assert result.ok, result.reason
    assert result.arch == "sm_90a"
    ptx = result.ptx.decode()
    assert f"wgmma.mma_async.sync.aligned.m64n{config['m_rows']}k16.f32.bf16.bf16" in ptx
    assert "fence.proxy.async.shared::cta" in ptx and "wgmma.wait_group.sync.aligned" in ptx
    assert result.spill_bytes == 0 and result.smem_static_bytes == 0 and result.main.registers > 0


def test_wgmma_space_has_the_shipped_rules(gemv_space):
    """benchmarks/spaces/gemv_wgmma.yaml (engine 4 alone, for grids) differs from the shipped space only in its
    lists."""
    probe = space.load(Path(__file__).resolve().parents[2] / "benchmarks" / "spaces" / "gemv_wgmma.yaml")
    assert [c.text for c in probe.constraints] == [c.text for c in gemv_space.constraints]
    assert set(probe.params["mma"]) == {4}


def test_wgmma_engine_constraints(family, gemv_space):
    """Engine 4 takes whole warpgroups of 16-row warps over one K range, tiles of whole 128-byte atoms."""
    problem = gemv_space.problem("m64")
    ok = {**gemv_space.default, **WGMMA, "split_k": 2, "cluster": 1, "threads": 128, "unroll": 4, "stages": 3}
    assert gemv_space.validate(ok, problem) is None
    rule = "mma != 4 or (k_warps == 1"
    for change in ({"rows_per_warp": 32}, {"k_warps": 2, "threads": 256}):
        assert rule in gemv_space.validate({**ok, **change}, problem), change
    assert gemv_space.validate({**ok, "unroll": 1}, problem) is not None  # tiles of 32 k: half an atom
    with pytest.raises(ValueError, match="mma 4 needs"):
        family.launches("e", {**gemv_space.resolve(ok, problem), "unroll": 1}, problem.env)


# Engine 3 (x slice resident in SMEM) as the grids of benchmarks/results/decode-2026-12-01-gemv-engine3-grid.md
# measured it: M = 64 takes 8 cluster splits of 1024 (a 132 KiB slice), M = 16 / 32 16 warps of 16 rows.
RESIDENT = {"mma": 3, "m_tile": 64, "vec": 8, "min_blocks": 1, "stages": 2, "k_warps": 1, "rows_per_warp": 16}


@pytest.fixture(scope="module")
def resident_space() -> space.SearchSpace:
    """The engine-3 space: gemv.yaml's rules with mma 3 listed (the shipped space does not list it)."""
    return space.load(Path(__file__).resolve().parents[2] / "benchmarks" / "spaces" / "gemv_engine3.yaml")


@pytest.mark.parametrize(
    "problem_name, overrides",
    [
        ("m64", {"split_k": 8, "cluster": 1, "threads": 256, "rows_per_warp": 32, "unroll": 2, "prefetch": 1}),
        ("m64", {"split_k": 8, "cluster": 1, "threads": 512, "unroll": 2, "prefetch": 1, "w_cache": "cs"}),
        ("m32", {"split_k": 4, "m_tile": 32, "threads": 512, "unroll": 4, "prefetch": 1, "w_cache": "na256"}),
        (
            "m16",
            {
                "split_k": 2,
                "m_tile": 16,
                "cluster": 1,
                "threads": 512,
                "k_warps": 2,
                "unroll": 4,
                "prefetch": 0,
                "w_cache": "cs",
            },
        ),
    ],
)
def test_resident_engine_compiles_within_its_budgets(family, resident_space, problem_name, overrides):
    """mma 3 configs are valid, stage x with cp.async into a slice the launch sizes as dynamic SMEM (the larger
    of the padded slice and red), and compile for sm_90 without spills within est_regs + 16 registers."""
    problem = resident_space.problem(problem_name)
    params = {**resident_space.default, **RESIDENT, **overrides}
    assert resident_space.validate(params, problem) is None
    config = resident_space.resolve(params, problem)
    M, K = problem.sizes["M"], problem.sizes["K"]
    slice_bytes = M * (K // params["split_k"] + 32) * 2
    assert config["slice_bytes"] == slice_bytes and config["smem_dynamic"] == max(slice_bytes, config["red_bytes"])
    launches = family.launches("e", config, problem.env)
    assert launches[0].smem_dynamic == config["smem_dynamic"] == family.smem_dynamic(config, problem.env)
    source = render.render(family, params, config, problem.env)
    # x reaches the mma only through the slice: staged by cp.async, never loaded per warp from global memory
    assert "cp.async.cg.shared.global" in source.text and "xs[" in source.text and "x_lane" not in source.text
    assert tcompile.target_arch(source.text, "sm_90") == "sm_90" and header.compile_target_note(source.text, "") == ""
    result = tcompile.compile_source(source)
    assert result.ok, result.reason
    assert result.spill_bytes == 0 and result.smem_static_bytes == 0
    assert 0 < result.main.registers <= config["est_regs"] + 16


def test_resident_engine_constraints(gemv_space, resident_space):
    """Engine 3 needs its slice to fit (M = 64: split_k 8 with a cluster); the shipped space's rules are the
    engine-3 space's (only the lists differ), and the shipped space does not offer it."""
    m64 = resident_space.problem("m64")
    ok = {**resident_space.default, **RESIDENT, "split_k": 8, "cluster": 1, "threads": 256, "unroll": 2}
    assert resident_space.validate(ok, m64) is None
    assert "smem_dynamic <= smem_per_block_max" in resident_space.validate({**ok, "split_k": 4}, m64)  # 264 KiB
    assert "split_k * M * 32 <= K" in resident_space.validate({**ok, "cluster": 0}, m64)  # 16 MiB fp32 partials
    assert "mma=3 is not one of" in gemv_space.validate(ok, gemv_space.problem("m64"))
    # the engine-3 space's own rules: several M tiles for engine 3, one m_tile per effective tile
    own = {"m_blocks == 1 or M > 64 or mma == 3", "m_rows == m_tile or (m_tile == 16 and m_rows < 16)"}
    shipped = [c.text for c in gemv_space.constraints if "m_blocks ==" not in c.text]
    assert [c.text for c in resident_space.constraints if c.text not in own] == shipped
    assert own <= {c.text for c in resident_space.constraints}


@pytest.mark.parametrize("M", [1, 8, 64])
@pytest.mark.parametrize("split_k", [1, 4])
def test_launch_grids_cover_the_problem(family, gemv_space, M, split_k):
    problem = {**MNK, "M": M}
    base = {**gemv_space.default, "split_k": split_k}
    for params in (base, {**base, "mma": 1, "rows_per_warp": 16, "m_tile": 64, "k_warps": 2}):
        config = gemv_space.resolve(params, space.Problem("p", "bfloat16", {"M": M, "N": 8192, "K": 8192}))
        launches = family.launches("e", config, problem)
        main = launches[0]
        rows = family.m_rows(config, problem)
        assert main.entry == "e" and main.block == (params["threads"], 1, 1)
        assert main.grid[0] * rows >= M > (main.grid[0] - 1) * rows  # M tiles cover M, none empty
        assert main.grid[1] * config["rows_per_block"] == 8192
        assert main.grid[2] == split_k
        names = set(family.inputs(np, {**problem, "N": 4, "K": 8}, np.random.default_rng(0)))
        names |= set(family.outputs(problem, config)) | {"M", "N", "K"}
        assert all(arg in names for launch in launches for arg in launch.args)
        if split_k == 1:
            assert len(launches) == 1 and main.args == ("x", "W", "y", "M", "N", "K")
            assert family.outputs(problem, config) == {"y": ((M, 8192), "bfloat16")}
        else:
            assert main.args == ("x", "W", "part", "M", "N", "K")
            reduce = launches[1]
            assert reduce.entry == "e_reduce" and reduce.block == (256, 1, 1)
            assert reduce.grid == (math.ceil(M * 8192 / 1024), 1, 1)
            assert family.outputs(problem, config)["part"] == ((split_k, M, 8192), "float32")


def test_launches_refuse_uncovered_shapes(family, gemv_space):
    config = gemv_space.resolve(gemv_space.default)
    with pytest.raises(ValueError, match="rows_per_block"):
        family.launches("e", config, {**MNK, "M": 1, "N": 8200})
    with pytest.raises(ValueError, match="K="):
        family.launches("e", config, {**MNK, "M": 1, "K": 8192 + 64})


def test_reference_matches_numpy_and_tolerance_catches_errors(family):
    problem = {"M": 4, "N": 48, "K": 8192, "dtype": "bfloat16"}
    inputs = family.inputs(np, problem, np.random.default_rng(0))
    assert {k: (v.shape, v.dtype) for k, v in inputs.items()} == {
        "x": ((4, 8192), np.uint16),
        "W": ((48, 8192), np.uint16),
    }
    x = bf16.decode(np, inputs["x"]).astype(np.float64)
    w = bf16.decode(np, inputs["W"]).astype(np.float64)
    ref = family.reference(np, inputs, problem)["y"]
    assert ref.shape == (4, 48) and ref.dtype == np.float64
    np.testing.assert_allclose(ref, np.einsum("mk,nk->mn", x, w), rtol=1e-12, atol=1e-12)
    assert 0.5 < ref.std() < 2  # O(1) outputs

    tol = family.tolerance(problem)

    def err(out):
        return np.max(np.abs(out - ref) / np.maximum(np.abs(ref), 1))

    # fp32 accumulation, in any order, rounded to bf16: passes.
    fp32 = (bf16.decode(np, inputs["x"]) @ bf16.decode(np, inputs["W"]).T).astype(np.float32)
    assert err(bf16.decode(np, bf16.encode(np, fp32))) < tol / 2
    # a dropped 32-element chunk of K fails.
    dropped = x[:, 32:] @ w[:, 32:].T
    assert err(dropped) > tol
    assert family.checked() == ("y",)


def test_accounting(family):
    for M in (1, 8, 64):
        problem = {**MNK, "M": M}
        assert family.flops(problem) == 2 * M * 8192 * 8192
        assert family.bytes_moved(problem) == 2 * (8192 * 8192 + M * 8192 + M * 8192)
    assert family.bytes_moved({**MNK, "M": 1}) == 134_250_496
    assert family.bytes_moved({**MNK, "M": 8}) == 134_479_872
    assert family.bytes_moved({**MNK, "M": 64}) == 136_314_880
    assert family.flops({**MNK, "M": 64}) == 8_589_934_592
    assert family.tolerance({**MNK, "M": 1}) == 1e-2
