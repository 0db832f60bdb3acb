"""Why is a config fast (or slow)? Nsight Compute counters turned into the lesson's terms, and a verdict.

`explain(profile, ...)` reads a `tuner.insight.ncu.Profile` (the launches of one call of a config) against what the
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
`tuner explain` (`explain_study`) runs this over a study's trials; `tuner.insight.roofline` (`roofline_png`,
`write_roofline`) draws them: on the roofline where they do FP32 work, else their bytes against the memory roof
and their memory units' throughput.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tuner.insight.ncu import Profile

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


def known(value: float | None) -> bool:
    """A figure that was measured: neither missing nor NaN."""
    return value is not None and not math.isnan(value)


def bound(e: Explanation) -> str:
    """The unit that limits the config, by the rules in the module docstring."""
    fp32 = e.fma_pct / 100 if known(e.fma_pct) else _div(e.tflops, e.peak_tflops or math.nan)
    units = [("compute (FP32)", fp32), ("L2 bandwidth", e.lts_pct / 100), ("L1 / shared memory", e.l1tex_pct / 100)]
    units = [(name, u) for name, u in units if known(u)]
    compute_bound = bool(units) and max(units, key=lambda nu: nu[1]) == ("compute (FP32)", fp32) and fp32 >= UNIT_BOUND
    if not compute_bound and e.local_bytes > 0 and e.local_bytes >= SPILL_BOUND * _nz(e.dram_bytes):
        return "local memory (spills)"
    if known(e.of_ceiling) and e.of_ceiling >= HBM_BOUND:
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
    if known(e.of_ceiling):
        head += f" (DRAM {e.dram_tbps:.2f} TB/s = {e.of_ceiling:.0%} of the {e.ceiling_tbps:.2f} TB/s copy ceiling)"
    elif known(e.dram_tbps):
        head += f" (DRAM {e.dram_tbps:.2f} TB/s)"
    if e.bound == "latency / occupancy" and known(e.achieved_occupancy_pct):
        head += f"; {e.achieved_occupancy_pct:.0f}% of warp slots active"
    out.append(head)
    if known(e.useful_fraction):
        line = (
            f"moves {_gb(e.dram_bytes)} through DRAM for {_gb(e.minimal_bytes)} of useful data: useful "
            f"fraction {e.useful_fraction:.2f}"
        )
        if e.useful_fraction < USEFUL_FRACTION_OK:
            line += f" ({1 / e.useful_fraction:.1f}× the minimal traffic)"
        out.append(line)
    ld_bad = known(e.ld_efficiency_pct) and e.ld_efficiency_pct < 100 * COALESCED_EFFICIENCY
    if not known(e.ld_efficiency_pct):  # the bytes-per-sector counter is missing: judge by sectors per request
        ld_bad = known(e.ld_sectors_per_request) and e.ld_sectors_per_request > 1.25 * e.ideal_sectors_per_request
    if ld_bad:
        out.append(
            f"uncoalesced loads: {e.ld_sectors_per_request:.1f} sectors per request (ideal "
            f"{e.ideal_sectors_per_request:g}), {_pct(e.ld_efficiency_pct)} of each 32-byte sector used"
        )
    # Spill misses reach DRAM as well: while spills are the bound, DRAM bytes per load sector are not over-fetch.
    if (
        known(e.dram_read_per_ld_sector)
        and e.dram_read_per_ld_sector > OVERFETCH * SECTOR_BYTES
        and e.bound != "local memory (spills)"
    ):
        out.append(
            f"DRAM over-fetch: {e.dram_read_per_ld_sector:.0f} bytes read from DRAM per 32-byte sector the loads "
            "asked for (the L2 fetches more than the sector when each one sits alone)"
        )
    if known(e.st_efficiency_pct) and e.st_efficiency_pct < 100 * COALESCED_EFFICIENCY:
        out.append(
            f"uncoalesced stores: {e.st_sectors_per_request:.1f} sectors per request, "
            f"{_pct(e.st_efficiency_pct)} of each sector used"
        )
    for side, ways, conflicts in (
        ("load", e.smem_ld_ways, e.smem_ld_conflicts),
        ("store", e.smem_st_ways, e.smem_st_conflicts),
    ):
        if known(ways) and ways > CONFLICT_WAYS:
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
    if known(e.achieved_occupancy_pct) and known(e.theoretical_occupancy_pct):
        line = f"occupancy: {e.achieved_occupancy_pct:.0f}% achieved of {e.theoretical_occupancy_pct:.0f}% theoretical"
        if known(e.registers):
            line += f", {e.registers:.0f} registers/thread"
        if e.theoretical_occupancy_pct < 50 and known(e.registers) and e.registers > 64:
            line += " (registers cap the warps per SM)"
        out.append(line)
    if known(e.l2_hit_pct):
        out.append(f"L2 hit rate {e.l2_hit_pct:.1f}%")
    if e.flops > 0 and known(e.arithmetic_intensity):
        line = f"arithmetic intensity {e.arithmetic_intensity:.3g} FLOP/byte, {e.tflops:.3g} TFLOP/s FP32"
        if e.peak_tflops:
            line += f" ({e.tflops / e.peak_tflops:.0%} of {e.peak_tflops:.1f} peak)"
        out.append(line)
    if e.missing:
        out.append(f"not measured (ncu gave no value): {', '.join(e.missing)}")
    return out


def _pct(value: float) -> str:
    return f"{value:.0f}%" if known(value) else "?"


def compare(a: Explanation, b: Explanation) -> list[str]:
    """What explains the time difference between `a` and `b`, slower one first in the sentence."""
    fast, slow = (a, b) if a.time_s <= b.time_s else (b, a)
    ratio = _div(slow.time_s, fast.time_s)
    lines = [
        f"{slow.label} takes {ratio:.2f}× the time of {fast.label} "
        f"({slow.time_s * 1e3:.3g} ms vs {fast.time_s * 1e3:.3g} ms)"
    ]
    bytes_ratio = _div(slow.dram_bytes, fast.dram_bytes)
    if known(bytes_ratio) and bytes_ratio >= 1.3:
        cause = ""
        if known(slow.ld_sectors_per_request) and slow.ld_sectors_per_request > 1.3 * _nz(fast.ld_sectors_per_request):
            cause = (
                f": {slow.ld_sectors_per_request:.1f} sectors per request on the loads vs "
                f"{fast.ld_sectors_per_request:.1f}"
            )
        elif (
            known(slow.dram_read_per_ld_sector)
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
    elif known(slow.smem_ld_ways) and slow.smem_ld_ways > max(CONFLICT_WAYS, 1.5 * _nz(fast.smem_ld_ways)):
        lines.append(
            f"the same DRAM bytes ({bytes_ratio:.2f}×), but {slow.label}'s shared loads are "
            f"{slow.smem_ld_ways:.1f}-way bank-conflicted vs {_nz(fast.smem_ld_ways):.1f}-way"
        )
    elif known(slow.smem_st_ways) and slow.smem_st_ways > max(CONFLICT_WAYS, 1.5 * _nz(fast.smem_st_ways)):
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
        known(slow.achieved_occupancy_pct)
        and known(fast.achieved_occupancy_pct)
        and slow.achieved_occupancy_pct < 0.75 * fast.achieved_occupancy_pct
    ):
        lines.append(
            f"{slow.label} keeps {slow.achieved_occupancy_pct:.0f}% of warp slots active vs "
            f"{fast.achieved_occupancy_pct:.0f}%: fewer loads in flight to cover DRAM latency"
        )
    elif known(slow.dram_tbps) and known(fast.dram_tbps):
        lines.append(
            f"similar bytes ({bytes_ratio:.2f}×); {slow.label} draws {slow.dram_tbps:.2f} TB/s from DRAM "
            f"vs {fast.dram_tbps:.2f}"
        )
    return lines


# ---------------------------------------------------------------------------------------------------------------
# Roofline


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
    from tuner.core.errors import InputError
    from tuner.results import export

    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    wanted: list[int] = list(args_trials) + list(compare_pair or [])
    if best:
        wanted.append(export.best_trial(study).number)
    if worst:
        # the worst for the study's first objective: the slowest for a time or throughput objective
        target = export.goal(study)
        ranked = [t for t in measured if export.objective_value(study, t, target) is not None]
        wanted.append(
            max(ranked or measured, key=lambda t: target.rank(export.objective_value(study, t, target))).number
        )
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
    from tuner.insight.ncu import PROFILE_FORMAT

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
    from tuner.insight import ncu as ncu_mod
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
                ctx.space.path, ctx.problem.name, params, source.uri, launches, timeout_s=timeout_s, entry=source.entry
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
