"""Why is a config fast (or slow)? Nsight Compute counters turned into the lesson's terms, and a verdict.

`explain(profile, ...)` reads a `tuner.ncu.Profile` (the launches of one call of a config) against what the
family says the call needs (its minimal bytes) and what the GPU can do (the measured copy ceiling, the FP32
peak) and returns an `Explanation`: DRAM bytes and the useful fraction, DRAM throughput against the ceiling,
global load/store sectors per request and bytes used per sector (coalescing), DRAM bytes read per requested
load sector (over-fetch: an H200 reads 64 bytes from DRAM for a lone 32-byte sector), shared-memory bank
conflicts per instruction, L2 hit rate, achieved vs theoretical occupancy, registers, local-memory (spill) traffic and
arithmetic intensity, then the bound, named by the rules below, and findings in plain words.

The bound (first rule that holds):

- **local memory (spills)**: the FMA pipe is not the busiest unit at >= `UNIT_BOUND`, and the local-memory
  (spill) traffic is at least `SPILL_BOUND` of the DRAM traffic: the memory units are busy with spills, whatever
  unit the counters show near its peak (a GEMM spilling at 32 registers/thread keeps the L2 busy);
- **HBM bandwidth**: DRAM throughput >= `HBM_BOUND` of the measured copy ceiling;
- **compute (FP32)**, **L2 bandwidth**, **L1 / shared memory**: the busiest of the FMA pipe, the L2 and L1TEX
  is >= `UNIT_BOUND` of its peak (ncu's speed-of-light percentages);
- **latency / occupancy**: nothing is near a peak; the warps in flight cannot cover the memory latency.

`compare(a, b)` names what explains the difference between two configs: DRAM bytes (with their cause: sectors
per request, DRAM over-fetch, spills, extra kernels), bank conflicts, spills, occupancy or DRAM throughput, in
that order.
`tuner explain` (`explain_study`) runs this over a study's trials; `roofline_figure` (`roofline_png`,
`write_roofline`) draws them: on the roofline where they do FP32 work, else their bytes against the memory roof
and their memory units' throughput.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tuner.ncu import Profile

#: DRAM throughput at or above this fraction of the measured copy ceiling is HBM-bound.
HBM_BOUND = 0.70
#: A unit at or above this fraction of its peak (ncu speed of light) bounds the kernel.
UNIT_BOUND = 0.60
#: Local-memory (spill) bytes at or above this fraction of the DRAM bytes make the spills the bound (unless
#: the FMA pipe is the bound: a compute-bound GEMM may spill a little and stay compute-bound).
SPILL_BOUND = 0.5
#: Below this share of each fetched sector used, loads (stores) are called uncoalesced.
COALESCED_EFFICIENCY = 0.80
#: DRAM bytes read per requested global-load sector above this many sectors' worth is over-fetch.
OVERFETCH = 1.5
#: A useful fraction below this is worth a finding.
USEFUL_FRACTION_OK = 0.80
#: Shared accesses with more wavefronts per instruction than this are called bank-conflicted.
CONFLICT_WAYS = 1.5

SECTOR_BYTES = 32


def _div(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) and not math.isnan(a) else math.nan


@dataclass
class Explanation:
    """One config, explained. Bytes in bytes, time in seconds, rates in TB/s and TFLOP/s, percentages 0..100."""

    label: str
    kernels: int
    time_s: float
    dram_read_bytes: float
    dram_write_bytes: float
    minimal_bytes: float
    useful_fraction: float
    dram_tbps: float
    ceiling_tbps: float | None
    of_ceiling: float
    ld_sectors_per_request: float
    st_sectors_per_request: float
    ideal_sectors_per_request: float
    ld_efficiency_pct: float
    st_efficiency_pct: float
    dram_read_per_ld_sector: float  # DRAM bytes read per 32-byte global-load sector (> 32: DRAM over-fetch)
    smem_ld_conflicts: float
    smem_st_conflicts: float
    smem_ld_ways: float
    smem_st_ways: float
    l2_hit_pct: float
    achieved_occupancy_pct: float
    theoretical_occupancy_pct: float
    registers: float
    local_bytes: float
    flops: float
    tflops: float
    peak_tflops: float | None
    arithmetic_intensity: float
    lts_pct: float
    l1tex_pct: float
    fma_pct: float
    bound: str = ""
    findings: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # requested counters ncu gave no value for
    #: the config's useful bytes over its median time as the tuner measured it (not under ncu), where known
    measured_tbps: float | None = None

    @property
    def dram_bytes(self) -> float:
        return self.dram_read_bytes + self.dram_write_bytes

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def explain(
    profile: Profile,
    label: str,
    minimal_bytes: float,
    ceiling_tbps: float | None = None,
    peak_tflops: float | None = None,
    access_bytes: int = 4,
    measured_tbps: float | None = None,
) -> Explanation:
    """Explain one profiled call. `minimal_bytes`: the family's minimal traffic for the problem; `ceiling_tbps`:
    the copy ceiling measured on that GPU; `peak_tflops`: its FP32 peak; `access_bytes`: bytes per thread of
    the config's widest global access (vec × element size), which sets the ideal sectors per request;
    `measured_tbps`: the config's TB/s as the tuner timed it (the roofline draws it against the ceiling)."""
    time_s = profile.total("gpu__time_duration.sum")
    read, write = profile.total("dram__bytes_read.sum"), profile.total("dram__bytes_write.sum")
    dram = read + write
    flops = (
        2 * _nz(profile.total("sm__sass_thread_inst_executed_op_ffma_pred_on.sum"))
        + _nz(profile.total("sm__sass_thread_inst_executed_op_fadd_pred_on.sum"))
        + _nz(profile.total("sm__sass_thread_inst_executed_op_fmul_pred_on.sum"))
    )
    dram_tbps = _div(dram, time_s) / 1e12
    e = Explanation(
        label=label,
        kernels=len(profile.kernels),
        time_s=time_s,
        dram_read_bytes=read,
        dram_write_bytes=write,
        minimal_bytes=float(minimal_bytes),
        useful_fraction=_div(minimal_bytes, dram),
        dram_tbps=dram_tbps,
        ceiling_tbps=ceiling_tbps,
        of_ceiling=_div(dram_tbps, ceiling_tbps or math.nan),
        ld_sectors_per_request=_div(
            profile.total("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"),
            profile.total("l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"),
        ),
        st_sectors_per_request=_div(
            profile.total("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"),
            profile.total("l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"),
        ),
        ideal_sectors_per_request=32 * access_bytes / SECTOR_BYTES,
        dram_read_per_ld_sector=_div(read, profile.total("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum")),
        ld_efficiency_pct=profile.weighted("smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct"),
        st_efficiency_pct=profile.weighted("smsp__sass_average_data_bytes_per_sector_mem_global_op_st.pct"),
        smem_ld_conflicts=profile.total("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"),
        smem_st_conflicts=profile.total("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"),
        smem_ld_ways=1
        + _div(
            profile.total("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"),
            profile.total("smsp__inst_executed_op_shared_ld.sum"),
        ),
        smem_st_ways=1
        + _div(
            profile.total("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"),
            profile.total("smsp__inst_executed_op_shared_st.sum"),
        ),
        l2_hit_pct=profile.weighted("lts__t_sector_hit_rate.pct"),
        achieved_occupancy_pct=profile.weighted("sm__warps_active.avg.pct_of_peak_sustained_active"),
        theoretical_occupancy_pct=profile.weighted("sm__maximum_warps_per_active_cycle_pct"),
        registers=profile.maximum("launch__registers_per_thread"),
        local_bytes=_nz(profile.total("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"))
        + _nz(profile.total("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum")),
        flops=flops,
        tflops=_div(flops, time_s) / 1e12,
        peak_tflops=peak_tflops,
        arithmetic_intensity=_div(flops, dram),
        lts_pct=profile.weighted("lts__throughput.avg.pct_of_peak_sustained_elapsed"),
        l1tex_pct=profile.weighted("l1tex__throughput.avg.pct_of_peak_sustained_active"),
        fma_pct=profile.weighted("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
        missing=list(profile.missing),
        measured_tbps=measured_tbps,
    )
    e.bound = bound(e)
    e.findings = findings(e)
    return e


def _nz(value: float) -> float:
    return 0.0 if math.isnan(value) else value


def _ok(value: float | None) -> bool:
    return value is not None and not math.isnan(value)


def bound(e: Explanation) -> str:
    """The unit that limits the config, by the rules in the module docstring."""
    fp32 = e.fma_pct / 100 if _ok(e.fma_pct) else _div(e.tflops, e.peak_tflops or math.nan)
    units = [("compute (FP32)", fp32), ("L2 bandwidth", e.lts_pct / 100), ("L1 / shared memory", e.l1tex_pct / 100)]
    units = [(name, u) for name, u in units if _ok(u)]
    compute_bound = bool(units) and max(units, key=lambda nu: nu[1]) == ("compute (FP32)", fp32) and fp32 >= UNIT_BOUND
    if not compute_bound and e.local_bytes > 0 and e.local_bytes >= SPILL_BOUND * _nz(e.dram_bytes):
        return "local memory (spills)"
    if _ok(e.of_ceiling) and e.of_ceiling >= HBM_BOUND:
        return "HBM bandwidth"
    if units:
        name, busiest = max(units, key=lambda nu: nu[1])
        if busiest >= UNIT_BOUND:
            return name
    return "latency / occupancy"


def _gb(n: float) -> str:
    return f"{n / 1e9:.3g} GB" if n >= 1e8 else f"{n / 1e6:.3g} MB"


def findings(e: Explanation) -> list[str]:
    """The verdict in plain words: the bound first, then each problem the counters show."""
    out = []
    head = f"bound: {e.bound}"
    if _ok(e.of_ceiling):
        head += f" (DRAM {e.dram_tbps:.2f} TB/s = {e.of_ceiling:.0%} of the {e.ceiling_tbps:.2f} TB/s copy ceiling)"
    elif _ok(e.dram_tbps):
        head += f" (DRAM {e.dram_tbps:.2f} TB/s)"
    if e.bound == "latency / occupancy" and _ok(e.achieved_occupancy_pct):
        head += f"; {e.achieved_occupancy_pct:.0f}% of warp slots active"
    out.append(head)
    if _ok(e.useful_fraction):
        line = (
            f"moves {_gb(e.dram_bytes)} through DRAM for {_gb(e.minimal_bytes)} of useful data: useful "
            f"fraction {e.useful_fraction:.2f}"
        )
        if e.useful_fraction < USEFUL_FRACTION_OK:
            line += f" ({1 / e.useful_fraction:.1f}× the minimal traffic)"
        out.append(line)
    ld_bad = _ok(e.ld_efficiency_pct) and e.ld_efficiency_pct < 100 * COALESCED_EFFICIENCY
    if not _ok(e.ld_efficiency_pct):  # the bytes-per-sector counter is missing: judge by sectors per request
        ld_bad = _ok(e.ld_sectors_per_request) and e.ld_sectors_per_request > 1.25 * e.ideal_sectors_per_request
    if ld_bad:
        out.append(
            f"uncoalesced loads: {e.ld_sectors_per_request:.1f} sectors per request (ideal "
            f"{e.ideal_sectors_per_request:g}), {_pct(e.ld_efficiency_pct)} of each 32-byte sector used"
        )
    # Spill misses reach DRAM as well: while spills are the bound, DRAM bytes per load sector are not over-fetch.
    if (
        _ok(e.dram_read_per_ld_sector)
        and e.dram_read_per_ld_sector > OVERFETCH * SECTOR_BYTES
        and e.bound != "local memory (spills)"
    ):
        out.append(
            f"DRAM over-fetch: {e.dram_read_per_ld_sector:.0f} bytes read from DRAM per 32-byte sector the loads "
            "asked for (the L2 fetches more than the sector when each one sits alone)"
        )
    if _ok(e.st_efficiency_pct) and e.st_efficiency_pct < 100 * COALESCED_EFFICIENCY:
        out.append(
            f"uncoalesced stores: {e.st_sectors_per_request:.1f} sectors per request, "
            f"{_pct(e.st_efficiency_pct)} of each sector used"
        )
    for side, ways, conflicts in (
        ("load", e.smem_ld_ways, e.smem_ld_conflicts),
        ("store", e.smem_st_ways, e.smem_st_conflicts),
    ):
        if _ok(ways) and ways > CONFLICT_WAYS:
            advice = (
                "harmless while HBM-bound"
                if e.bound == "HBM bandwidth"
                else "pad the tile so a column falls in distinct banks"
            )
            out.append(
                f"shared-memory bank conflicts: {ways:.1f}-way on {side}s ({conflicts / 1e6:.3g} M "
                f"extra wavefronts); {advice}"
            )
    if e.local_bytes > 0:
        out.append(
            f"spills: {_gb(e.local_bytes)} of local-memory traffic at {e.registers:.0f} registers/thread "
            "(local memory is DRAM, cached in L1/L2)"
        )
    if _ok(e.achieved_occupancy_pct) and _ok(e.theoretical_occupancy_pct):
        line = f"occupancy: {e.achieved_occupancy_pct:.0f}% achieved of {e.theoretical_occupancy_pct:.0f}% theoretical"
        if _ok(e.registers):
            line += f", {e.registers:.0f} registers/thread"
        if e.theoretical_occupancy_pct < 50 and _ok(e.registers) and e.registers > 64:
            line += " (registers cap the warps per SM)"
        out.append(line)
    if _ok(e.l2_hit_pct):
        out.append(f"L2 hit rate {e.l2_hit_pct:.1f}%")
    if e.flops > 0 and _ok(e.arithmetic_intensity):
        line = f"arithmetic intensity {e.arithmetic_intensity:.3g} FLOP/byte, {e.tflops:.3g} TFLOP/s FP32"
        if e.peak_tflops:
            line += f" ({e.tflops / e.peak_tflops:.0%} of {e.peak_tflops:.1f} peak)"
        out.append(line)
    if e.missing:
        out.append(f"not measured (ncu gave no value): {', '.join(e.missing)}")
    return out


def _pct(value: float) -> str:
    return f"{value:.0f}%" if _ok(value) else "?"


def compare(a: Explanation, b: Explanation) -> list[str]:
    """What explains the time difference between `a` and `b`, slower one first in the sentence."""
    fast, slow = (a, b) if a.time_s <= b.time_s else (b, a)
    ratio = _div(slow.time_s, fast.time_s)
    lines = [
        f"{slow.label} takes {ratio:.2f}× the time of {fast.label} "
        f"({slow.time_s * 1e3:.3g} ms vs {fast.time_s * 1e3:.3g} ms)"
    ]
    bytes_ratio = _div(slow.dram_bytes, fast.dram_bytes)
    if _ok(bytes_ratio) and bytes_ratio >= 1.3:
        cause = ""
        if _ok(slow.ld_sectors_per_request) and slow.ld_sectors_per_request > 1.3 * _nz(fast.ld_sectors_per_request):
            cause = (
                f": {slow.ld_sectors_per_request:.1f} sectors per request on the loads vs "
                f"{fast.ld_sectors_per_request:.1f}"
            )
        elif (
            _ok(slow.dram_read_per_ld_sector)
            and slow.dram_read_per_ld_sector > 1.3 * _nz(fast.dram_read_per_ld_sector)
            and slow.dram_read_per_ld_sector > OVERFETCH * SECTOR_BYTES
        ):
            cause = (
                f": DRAM reads {slow.dram_read_per_ld_sector:.0f} bytes per 32-byte sector loaded vs "
                f"{fast.dram_read_per_ld_sector:.0f}"
            )
        elif slow.local_bytes > 2 * fast.local_bytes + 1e6:
            cause = f": {_gb(slow.local_bytes)} of spill (local-memory) traffic"
        elif slow.kernels > fast.kernels:
            cause = f": {slow.kernels} kernels, each a DRAM round trip, vs {fast.kernels}"
        lines.append(f"{slow.label} moves {bytes_ratio:.2f}× the DRAM bytes{cause}")
    elif _ok(slow.smem_ld_ways) and slow.smem_ld_ways > max(CONFLICT_WAYS, 1.5 * _nz(fast.smem_ld_ways)):
        lines.append(
            f"the same DRAM bytes ({bytes_ratio:.2f}×), but {slow.label}'s shared loads are "
            f"{slow.smem_ld_ways:.1f}-way bank-conflicted vs {_nz(fast.smem_ld_ways):.1f}-way"
        )
    elif _ok(slow.smem_st_ways) and slow.smem_st_ways > max(CONFLICT_WAYS, 1.5 * _nz(fast.smem_st_ways)):
        lines.append(
            f"the same DRAM bytes ({bytes_ratio:.2f}×), but {slow.label}'s shared stores are "
            f"{slow.smem_st_ways:.1f}-way bank-conflicted vs {_nz(fast.smem_st_ways):.1f}-way"
        )
    elif slow.local_bytes > 2 * fast.local_bytes + 1e6:
        lines.append(
            f"{slow.label} spills: {_gb(slow.local_bytes)} of local-memory traffic at "
            f"{slow.registers:.0f} registers/thread vs {_gb(fast.local_bytes)} at {fast.registers:.0f}"
        )
    elif (
        _ok(slow.achieved_occupancy_pct)
        and _ok(fast.achieved_occupancy_pct)
        and slow.achieved_occupancy_pct < 0.75 * fast.achieved_occupancy_pct
    ):
        lines.append(
            f"{slow.label} keeps {slow.achieved_occupancy_pct:.0f}% of warp slots active vs "
            f"{fast.achieved_occupancy_pct:.0f}%: fewer loads in flight to cover DRAM latency"
        )
    elif _ok(slow.dram_tbps) and _ok(fast.dram_tbps):
        lines.append(
            f"similar bytes ({bytes_ratio:.2f}×); {slow.label} draws {slow.dram_tbps:.2f} TB/s from DRAM "
            f"vs {fast.dram_tbps:.2f}"
        )
    return lines


# ---------------------------------------------------------------------------------------------------------------
# Roofline


def roofline_png(
    points: Sequence[Explanation], ceiling_tbps: float, peak_tflops: float | None, title: str = "roofline"
) -> bytes:
    """`roofline_figure` as PNG bytes."""
    from tuner.results.plots import png_bytes

    return png_bytes(roofline_figure(points, ceiling_tbps, peak_tflops, title))


def roofline_figure(
    points: Sequence[Explanation], ceiling_tbps: float, peak_tflops: float | None, title: str = "roofline"
):
    """What bounds each explained config, drawn (a matplotlib Figure, no pyplot). Configs with FP32 work get the
    log-log roofline: the measured copy ceiling as the memory roof, the FP32 peak as the compute roof, one point
    per config at (FLOP per DRAM byte, achieved TFLOP/s). Configs without (a copy, a transpose: most memory-bound
    kernels) have no place on it, so they get what bounds them instead: their bytes against the memory roof
    (the TB/s the tuner measured and the DRAM TB/s under ncu, against the copy ceiling) and the memory units'
    throughput from the profile (DRAM as a share of the ceiling, L2 and L1/shared memory of their peaks, with
    the shares at which `bound` calls a unit the bound). A panel is drawn only for configs it fits."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    placed = [p for p in points if p.flops > 0 and _ok(p.arithmetic_intensity) and p.arithmetic_intensity > 0]
    unplaced = [p for p in points if p not in placed]
    panels = (1 if placed else 0) + (2 if unplaced else 0)
    fig = Figure(figsize=(8, 1.2 + 4.3 * panels), dpi=110)
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(panels, 1, squeeze=False)[:, 0])
    if placed:
        _draw_roofline(axes.pop(0), placed, unplaced, ceiling_tbps, peak_tflops)
    if unplaced:
        _draw_memory_roof(axes.pop(0), unplaced, ceiling_tbps)
        _draw_units(axes.pop(0), unplaced)
    fig.suptitle(title, fontsize=11)
    return fig


def _draw_roofline(ax, placed: Sequence[Explanation], unplaced: Sequence[Explanation], ceiling_tbps, peak_tflops):
    xs = [p.arithmetic_intensity for p in placed]
    peak = peak_tflops or 0.0
    lo = min([0.01] + [x / 4 for x in xs])
    ridge = peak / ceiling_tbps if peak else 100.0
    hi = max([ridge * 20, 100.0] + [x * 4 for x in xs])
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    roof = [min(ceiling_tbps * x, peak) if peak else ceiling_tbps * x for x in grid]
    ax.plot(
        grid,
        roof,
        color="black",
        lw=1.5,
        label=f"roof: copy ceiling {ceiling_tbps:.2f} TB/s" + (f", FP32 peak {peak:.1f} TFLOP/s" if peak else ""),
    )
    for p in placed:
        ax.scatter(
            [p.arithmetic_intensity],
            [p.tflops],
            s=45,
            zorder=3,
            label=f"{p.label}: {p.arithmetic_intensity:.3g} FLOP/B, {p.tflops:.3g} TFLOP/s ({p.bound})",
        )
    for p in unplaced:
        ax.plot([], [], " ", label=f"{p.label}: no FP32 work (below: its bytes and memory units)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FP32 FLOP per DRAM byte)")
    ax.set_ylabel("TFLOP/s (FP32)")
    ax.set_title("roofline", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def _bar_groups(ax, points: Sequence[Explanation], series: Sequence[tuple[str, Any]]) -> float:
    """Horizontal bars, one group per config (top to bottom in the given order), one bar per named series whose
    value (`series`: label, Explanation -> value) is known, each labelled with its value; y ticks name the config
    and its bound. Returns the largest value drawn (0 for none)."""
    height = 0.8 / len(series)
    largest = 0.0
    for k, (label, value_of) in enumerate(series):
        ys, widths = [], []
        for i, p in enumerate(points):
            value = value_of(p)
            if _ok(value):
                ys.append(len(points) - 1 - i + 0.4 - (k + 0.5) * height)
                widths.append(value)
        if ys:
            bars = ax.barh(ys, widths, height=height * 0.9, label=label)
            ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
            largest = max(largest, *widths)
    ax.set_yticks(
        [len(points) - 1 - i for i in range(len(points))], [f"{p.label}\n({p.bound})" for p in points], fontsize=7
    )
    return largest


def _draw_memory_roof(ax, points: Sequence[Explanation], ceiling_tbps: float) -> None:
    largest = _bar_groups(
        ax,
        points,
        [
            ("measured: useful bytes / median time", lambda p: p.measured_tbps),
            ("DRAM under ncu: bytes moved / kernel time", lambda p: p.dram_tbps),
        ],
    )
    ax.axvline(ceiling_tbps, color="black", lw=1.5, label=f"memory roof: copy ceiling {ceiling_tbps:.2f} TB/s")
    ax.set_xlim(0, max(ceiling_tbps, largest) * 1.25)  # an L2-resident problem may beat the DRAM copy
    ax.set_xlabel("TB/s")
    ax.set_title("bytes against the memory roof (no FP32 work: not on the roofline)", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)  # below: bars fill the panel


def _draw_units(ax, points: Sequence[Explanation]) -> None:
    largest = _bar_groups(
        ax,
        points,
        [
            ("DRAM: % of the copy ceiling", lambda p: 100 * p.of_ceiling),
            ("L2: % of peak (ncu)", lambda p: p.lts_pct),
            ("L1 / shared memory: % of peak (ncu)", lambda p: p.l1tex_pct),
        ],
    )
    ax.axvline(100 * HBM_BOUND, color="tab:blue", ls="--", lw=1, label=f"HBM-bound from {HBM_BOUND:.0%}")
    ax.axvline(100 * UNIT_BOUND, color="gray", ls=":", lw=1, label=f"a unit bounds from {UNIT_BOUND:.0%}")
    ax.set_xlim(0, max(100.0, largest) * 1.25)
    ax.set_xlabel("% of the unit's peak")
    ax.set_title("memory units' throughput (Nsight Compute)", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)  # below: bars fill the panel


def roofline_html(png: bytes, points: Sequence[Explanation], title: str) -> str:
    """The roofline PNG inline, and a table of the points with their bound and findings."""
    rows = "\n".join(
        f"<tr><td>{html.escape(p.label)}</td><td>{p.time_s * 1e3:.4g}</td><td>{p.dram_bytes / 1e9:.4g}</td>"
        f"<td>{_fmt(p.useful_fraction, '.2f')}</td><td>{_fmt(p.dram_tbps, '.3f')}</td>"
        f"<td>{_fmt(p.arithmetic_intensity, '.3g')}</td><td>{html.escape(p.bound)}</td>"
        f"<td>{'<br>'.join(html.escape(f) for f in p.findings[1:])}</td></tr>"
        for p in points
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
        f"<h1>{html.escape(title)}</h1><img src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        "<table border='1' cellpadding='4'><tr><th>config</th><th>ms</th><th>DRAM GB</th><th>useful</th>"
        f"<th>DRAM TB/s</th><th>FLOP/B</th><th>bound</th><th>findings</th></tr>{rows}</table></body></html>\n"
    )


def _fmt(value: float | None, spec: str) -> str:
    return format(value, spec) if _ok(value) else ""


def write_roofline(
    path: str | Path, points: Sequence[Explanation], ceiling_tbps: float, peak_tflops: float | None, title: str
) -> list[Path]:
    """Write the roofline as `path` (.png) and the same name with .html; atomically. Returns both paths."""
    from tuner.results.export import atomic_write

    path = Path(path)
    png = roofline_png(points, ceiling_tbps, peak_tflops, title)
    html_path = path.with_suffix(".html")
    return [atomic_write(path, png), atomic_write(html_path, roofline_html(png, points, title))]


# ---------------------------------------------------------------------------------------------------------------
# A study's trials


ATTR_PREFIX = "ncu:"
"""Study user attr ``ncu:<trial number>`` holds a trial's profile (Optuna keeps finished trials read-only, so
the profiles live on the study, where optuna-dashboard shows them too)."""


@dataclass
class ExplainedTrial:
    number: int
    uri: str
    explanation: Explanation
    cached: bool
    device: dict[str, Any]


def _pick(
    study, measured, args_trials: Sequence[int], best: bool, worst: bool, compare_pair: Sequence[int] | None
) -> list[int]:
    from tuner.errors import InputError
    from tuner.results import export

    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    wanted: list[int] = list(args_trials) + list(compare_pair or [])
    if best:
        wanted.append(export.best_trial(study).number)
    if worst:
        wanted.append(min(measured, key=lambda t: export.throughput(study, t)).number)
    if not wanted:
        wanted.append(export.best_trial(study).number)
    measured_numbers = {t.number for t in measured}
    for n in wanted:
        if n not in by_number:
            raise InputError(f"study {study.study_name}: no trial {n} (trials 0..{max(by_number)})")
        if n not in measured_numbers:
            t = by_number[n]
            why = t.user_attrs.get("failure") or (
                "a duplicate" if t.user_attrs.get("duplicate_of") is not None else t.state.name
            )
            raise InputError(f"study {study.study_name}: trial {n} was not measured ({why})")
    return list(dict.fromkeys(wanted))


def _current(record: Any) -> bool:
    """A stored profile this version reads: one of an older format (ns taken for seconds) is profiled again."""
    from tuner.ncu import PROFILE_FORMAT

    return isinstance(record, dict) and (record.get("profile") or {}).get("format") == PROFILE_FORMAT


def explain_study(
    study,
    trials: Sequence[int] = (),
    best: bool = False,
    worst: bool = False,
    compare_pair: Sequence[int] | None = None,
    reprofile: bool = False,
    timeout_s: float = 240.0,
) -> list[ExplainedTrial]:
    """Explain the chosen measured trials of `study` (default: the best). Trials profiled before (study user
    attr ``ncu:<n>``, in the current `PROFILE_FORMAT`) are not profiled again unless `reprofile`. Every profile
    runs before anything is written: an InputError (unknown or unmeasured trial, a config that no longer
    renders, ncu absent, not permitted or timing out) leaves the study as it was."""
    from tuner import ncu as ncu_mod
    from tuner.results import export

    measured = export.measured_trials(study)
    numbers = _pick(study, measured, trials, best, worst, compare_pair)
    by_number = {t.number: t for t in measured}
    stored = {n: study.user_attrs.get(f"{ATTR_PREFIX}{n}") for n in numbers}
    todo = [n for n in numbers if reprofile or not _current(stored[n])]
    fresh: dict[int, dict[str, Any]] = {}
    ctx = export.study_context(study)
    if todo:
        ncu_mod.find_ncu()  # absent: say so before rendering or running anything
        for n in todo:
            t = by_number[n]
            source = export.render_trial(ctx, t)  # InputError when the space or template changed
            params = {name: t.params[name] for name in ctx.space.params if name in t.params}
            resolved = ctx.space.resolve(params, ctx.problem)
            launches = len(ctx.family.launches(source.entry, resolved, ctx.problem.env))
            run = ncu_mod.profile_config(
                ctx.space.path, ctx.problem.name, params, source.uri, launches, timeout_s=timeout_s
            )
            fresh[n] = {
                "uri": source.uri,
                "profile": run.profile.to_dict(),
                "device": run.report.get("device", {}),
                "command": run.command,
            }
    out = []
    for n in numbers:
        record = fresh.get(n) or stored[n]
        t = by_number[n]
        profile = Profile.from_dict(record["profile"])
        device = record.get("device") or {}
        params = t.params
        access = int(params.get("vec", 1)) * ctx.family.elem_bytes(ctx.problem.env)
        e = explain(
            profile,
            label=f"#{n} {record['uri']}",
            minimal_bytes=ctx.family.bytes_moved(ctx.problem.env),
            ceiling_tbps=t.user_attrs.get("ceiling_tbps"),
            peak_tflops=ncu_mod.fp32_peak_tflops(device),
            access_bytes=access,
            measured_tbps=t.user_attrs.get("tbps"),
        )
        out.append(ExplainedTrial(number=n, uri=record["uri"], explanation=e, cached=n not in fresh, device=device))
    for n, record in fresh.items():
        study.set_user_attr(f"{ATTR_PREFIX}{n}", record)
    return out
