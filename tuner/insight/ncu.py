"""Nsight Compute (`ncu`) for one config: the command line, running it, and reading its raw CSV.

A config is profiled by re-running it through the project's own single-config path (`python -m tuner.insight.ncu
SPACE --problem P --set k=v ...`, the profile target below): render, compile, check against the reference and
time it with `tuner.gpu.evaluate.evaluate_config` on an in-process `GpuEvaluator`. Under ncu only the config's own
kernels are selected (``--kernel-name regex:^URI(_suffix)?$``), and the first call of them (the correctness
check, cold) is skipped with ``--launch-skip``: ncu profiles the next call, the timing protocol's warm-up, once
(``--launch-count`` = the config's launches per call). ``--clock-control none`` leaves the clocks as the
timing found them; ncu's default cache control flushes the caches before each profiled kernel, as the timing
protocol flushes L2 before each repetition. Only the metrics in `METRICS` are collected (a few replay passes,
not ``--set full``'s forty).

`parse_raw_csv` reads ``--csv --page raw --print-units base`` output: a header row of column names (ids and
launch facts, then one column per metric), a row of units, then one row per profiled kernel; every field is
quoted and numbers may carry thousands separators. Anything ncu prints around the table (``==PROF==`` lines,
warnings) is skipped.

Failures are `NcuError` (an `InputError`: one line, exit 2 from the CLI): ncu absent, counters not permitted
(``ERR_NVGPUCTRPERM``, the code ncu prints), timed out, or no kernel profiled.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError
from tuner.core.gpufacts import FP32_LANES_PER_SM

#: The counters `tuner explain` reads, why, and the kind of unit each must come in (checked against the units
#: row of the capture: a value is converted to base units by its own unit, never assumed). Names as Nsight Compute
#: 2025 spells them for sm_70 and later; all of them come back from ncu 2025.3 on an H200 (tests/data/ncu/).
METRIC_KINDS: dict[str, str] = {
    # time and DRAM traffic
    "gpu__time_duration.sum": "time",
    "dram__bytes_read.sum": "bytes",
    "dram__bytes_write.sum": "bytes",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "pct",
    # the other units' speed of light, to name the bound
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "pct",
    "l1tex__throughput.avg.pct_of_peak_sustained_active": "pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "pct",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": "pct",
    # coalescing: sectors per request, and bytes used per sector fetched
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "count",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "count",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": "count",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": "count",
    "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct": "pct",
    "smsp__sass_average_data_bytes_per_sector_mem_global_op_st.pct": "pct",
    # shared memory: bank conflicts per instruction
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "count",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "count",
    "smsp__inst_executed_op_shared_ld.sum": "count",
    "smsp__inst_executed_op_shared_st.sum": "count",
    # L2
    "lts__t_sector_hit_rate.pct": "pct",
    # occupancy and registers
    "sm__warps_active.avg.pct_of_peak_sustained_active": "pct",
    "sm__maximum_warps_per_active_cycle_pct": "pct",
    "launch__registers_per_thread": "count",
    "launch__occupancy_limit_registers": "count",
    # spills: local-memory traffic
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": "bytes",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": "bytes",
    # FP32 work (thread-level, predicated-on)
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum": "count",
    "sm__sass_thread_inst_executed_op_fadd_pred_on.sum": "count",
    "sm__sass_thread_inst_executed_op_fmul_pred_on.sum": "count",
}
METRICS: tuple[str, ...] = tuple(METRIC_KINDS)

#: The columns of the raw page that describe a launch rather than a metric.
ID_COLUMNS = (
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
)

#: Unit (lower case, as in the capture's units row) → (kind, factor to the base unit: second, byte, percent,
#: count). ``--print-units base`` gives ``ns`` and ``byte`` (ncu 2025.3); ncu's scaled units (``usecond``,
#: ``Mbyte``...) read correctly too. A metric of `METRIC_KINDS` in any other unit is refused, not guessed.
_UNITS: dict[str, tuple[str, float]] = {
    **{u: ("time", 1.0) for u in ("s", "second")},
    **{u: ("time", 1e-3) for u in ("ms", "msecond")},
    **{u: ("time", 1e-6) for u in ("us", "usecond")},
    **{u: ("time", 1e-9) for u in ("ns", "nsecond")},
    "byte": ("bytes", 1.0),
    "kbyte": ("bytes", 1e3),
    "mbyte": ("bytes", 1e6),
    "gbyte": ("bytes", 1e9),
    "tbyte": ("bytes", 1e12),
    "kibyte": ("bytes", 1024.0),
    "mibyte": ("bytes", 1024.0**2),
    "gibyte": ("bytes", 1024.0**3),
    "%": ("pct", 1.0),
    **{
        u: ("count", 1.0)
        for u in ("", "sector", "request", "inst", "warp", "block", "thread", "register/thread", "cycle")
    },
}

#: Stored profiles carry this; a record without it was read before the units row was honoured (time in ns
#: taken for seconds) and is profiled again rather than trusted.
PROFILE_FORMAT = 2

DEFAULT_TIMEOUT_S = 240.0


class NcuError(InputError):
    """ncu could not profile: absent, not permitted, timed out, or it profiled no kernel."""


class NcuConfigError(NcuError):
    """ncu ran but this one config gave no profile (its target failed, timed out, or no kernel was profiled);
    other configs may still profile. Absence of ncu and ERR_NVGPUCTRPERM stay plain NcuErrors."""


# ---------------------------------------------------------------------------------------------------------------
# Parsing


def _number(text: str) -> float | None:
    """ncu's number text → float: thousands separators dropped; "n/a" and blanks → None."""
    text = text.strip().replace(",", "")
    if not text or text.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class KernelMetrics:
    """One profiled kernel launch: its name, geometry and metric values in base units (seconds, bytes, %)."""

    kernel: str
    block: str
    grid: str
    values: dict[str, float]

    def get(self, name: str, default: float = math.nan) -> float:
        return self.values.get(name, default)


@dataclass(frozen=True)
class Profile:
    """The profiled launches of one call of a config, in launch order, with sums and weighted averages."""

    kernels: tuple[KernelMetrics, ...]
    missing: tuple[str, ...] = ()  # requested metrics ncu did not report (unknown name, or blank in every row)

    def total(self, name: str) -> float:
        """Sum over the launches; NaN when no launch reported it."""
        values = [k.values[name] for k in self.kernels if name in k.values]
        return sum(values) if values else math.nan

    def weighted(self, name: str) -> float:
        """Time-weighted average over the launches (for percentages and ratios); NaN when none reported it."""
        pairs = [(k.values[name], k.get("gpu__time_duration.sum", 0.0)) for k in self.kernels if name in k.values]
        if not pairs:
            return math.nan
        weight = sum(w for _, w in pairs)
        if weight <= 0:
            return sum(v for v, _ in pairs) / len(pairs)
        return sum(v * w for v, w in pairs) / weight

    def maximum(self, name: str) -> float:
        values = [k.values[name] for k in self.kernels if name in k.values]
        return max(values) if values else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernels": [
                {"kernel": k.kernel, "block": k.block, "grid": k.grid, "values": k.values} for k in self.kernels
            ],
            "missing": list(self.missing),
            "format": PROFILE_FORMAT,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        return cls(
            kernels=tuple(
                KernelMetrics(
                    kernel=k["kernel"],
                    block=k.get("block", ""),
                    grid=k.get("grid", ""),
                    values={n: float(v) for n, v in k["values"].items()},
                )
                for k in data["kernels"]
            ),
            missing=tuple(data.get("missing", ())),
        )


def parse_raw_csv(text: str, where: str = "ncu output", metrics: Sequence[str] = METRICS) -> Profile:
    """Parse ``ncu --csv --page raw`` text into a Profile (one KernelMetrics per data row, in order).

    The header is the first line whose first field is ``ID``; the line after it holds the units. Only `metrics`
    are kept, each converted to base units (seconds, bytes, percent, counts) by its own entry in the units row.
    Raises NcuError naming `where` when there is no header or no data row, or a metric comes in a unit that is
    not of its kind (`METRIC_KINDS`)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        raise NcuError(f'{where}: no ncu raw CSV table (no header row starting with "ID")')
    rows = list(csv.reader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"')))))
    if len(rows) < 3:
        raise NcuError(f"{where}: ncu profiled no kernel (the table has no data row)")
    header, units, data = rows[0], rows[1], rows[2:]
    if len(units) != len(header) or any(units[header.index(c)] for c in ID_COLUMNS if c in header):
        raise NcuError(f"{where}: the row after the header is not a row of units (was --page raw used?)")
    col = {name: i for i, name in enumerate(header)}
    wanted = [(name, col[name]) for name in metrics if name in col]
    scale: dict[str, float] = {}
    for name, i in wanted:
        unit = units[i].strip()
        kind, factor = _UNITS.get(unit.lower(), ("?", math.nan))
        expected = METRIC_KINDS.get(name)
        if kind == "?" or (expected is not None and kind != expected):
            raise NcuError(
                f"{where}: metric {name} comes in unit {unit!r}, expected "
                f"{'a ' + expected + ' unit' if expected else 'a known unit'}"
            )
        scale[name] = factor
    kernels = []
    for row in data:
        if len(row) != len(header):
            raise NcuError(f"{where}: a row has {len(row)} fields, the header {len(header)}")
        values: dict[str, float] = {}
        for name, i in wanted:
            value = _number(row[i])
            if value is not None:
                values[name] = value * scale[name]
        kernels.append(
            KernelMetrics(
                kernel=row[col["Kernel Name"]] if "Kernel Name" in col else "",
                block=row[col["Block Size"]] if "Block Size" in col else "",
                grid=row[col["Grid Size"]] if "Grid Size" in col else "",
                values=values,
            )
        )
    # A name ncu does not know is absent from the header; one it knows but cannot read here is blank ("n/a").
    missing = tuple(m for m in metrics if not any(m in k.values for k in kernels))
    return Profile(kernels=tuple(kernels), missing=missing)


# ---------------------------------------------------------------------------------------------------------------
# Command lines


def target_command(
    space: str | Path, problem: str, params: dict[str, Any], python: str | None = None, outside_space: bool = False
) -> list[str]:
    """The profile target's argv for one config: ``python -m tuner.insight.ncu SPACE --problem P --set k=v ...``.
    `outside_space`: the values may lie outside the space's lists (a lesson's sweep past the shipped choices);
    the space's constraints still apply."""
    argv = [python or sys.executable, "-m", "tuner.insight.ncu", str(space), "--problem", problem]
    if outside_space:
        argv.append("--outside-space")
    for name, value in params.items():
        text = json.dumps(value) if isinstance(value, bool) else str(value)
        argv += ["--set", f"{name}={text}"]
    return argv


def kernel_regex(entry: str) -> str:
    """The config's kernels: its entry and the entry's suffixed extra entries (``uri_gelu``, ``uri_scale``). The
    entry is the config's uri, or a plain source's fixed ``__global__`` name (`tuner.build.render.entry_name`)."""
    return f"regex:^{re.escape(entry)}(_[A-Za-z0-9]+)?$"


def ncu_command(
    target: Sequence[str],
    entry: str,
    launches_per_call: int,
    log_file: str | Path,
    ncu: str = "ncu",
    metrics: Sequence[str] = METRICS,
) -> list[str]:
    """The ncu argv that profiles the second call of the config (its timing warm-up) and writes the raw CSV to
    `log_file`. `entry` is the config's entry point (`kernel_regex`); `launches_per_call` =
    len(family.launches(...))."""
    return [
        ncu,
        "--clock-control",
        "none",
        "--kernel-name",
        kernel_regex(entry),
        "--launch-skip",
        str(launches_per_call),
        "--launch-count",
        str(launches_per_call),
        "--metrics",
        ",".join(metrics),
        "--csv",
        "--page",
        "raw",
        "--print-units",
        "base",
        "--log-file",
        str(log_file),
        *target,
    ]


def find_ncu() -> str:
    """The ncu executable (``$TUNER_NCU``, else ``ncu`` on PATH). NcuError when there is none."""
    name = os.environ.get("TUNER_NCU", "ncu")
    path = shutil.which(name)
    if path is None:
        raise NcuError(
            f"ncu not found ({name!r} is not on PATH; set TUNER_NCU to its path): it would have "
            "measured DRAM bytes, sectors per request, bank conflicts, occupancy and spills"
        )
    return path


def run_ncu(
    argv: Sequence[str], log_file: str | Path, timeout_s: float = DEFAULT_TIMEOUT_S, where: str = "ncu"
) -> tuple[str, str]:
    """Run an ncu argv built by `ncu_command`; return (the CSV it wrote to `log_file`, the target's stdout).
    NcuError on a timeout, on ``ERR_NVGPUCTRPERM`` (no permission for the GPU's counters), on a target that
    reports a failed config, or when ncu profiled nothing."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise NcuConfigError(f"{where}: ncu did not finish within {timeout_s:g} s") from None
    except OSError as exc:
        raise NcuError(f"{where}: cannot run {argv[0]}: {exc.strerror}") from None
    log = Path(log_file).read_text(errors="replace") if Path(log_file).is_file() else ""
    everything = "\n".join((proc.stdout, proc.stderr, log))
    if "ERR_NVGPUCTRPERM" in everything:  # the one stable token ncu gives for this fault; no status code exists
        raise NcuError(
            f"{where}: ncu is not permitted to read the GPU's performance counters "
            "(ERR_NVGPUCTRPERM; see NVIDIA's note on NVreg_RestrictProfilingToAdminUsers)"
        )
    report = target_report(proc.stdout)
    if report.get("ok") is False:
        result = report.get("result") or {}
        raise NcuConfigError(
            f"{where}: the config did not pass its check under ncu ({result.get('failure')}: "
            f"{str(result.get('reason', ''))[:200]})"
        )
    if '"ID",' not in log:
        # The target's own one-line error (``tuner.insight.ncu: error: ...``) says why better than ncu's exit-code note.
        lines = everything.splitlines()
        tail = next(
            (ln.strip() for ln in reversed(lines) if ln.startswith("tuner.insight.ncu: error:")),
            next(
                (ln.strip() for ln in reversed(lines) if "error" in ln.lower() or "==WARNING==" in ln),
                f"exit status {proc.returncode}",
            ),
        )
        raise NcuConfigError(f"{where}: ncu profiled no kernel ({tail[:300]})")
    return log, proc.stdout


def target_report(stdout: str) -> dict[str, Any]:
    """The profile target's JSON report (its last stdout line that parses as a JSON object), or {}."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return {}


@dataclass
class ProfileRun:
    """A profiled config: the Profile, the raw CSV and the target's JSON report (device facts, measurement)."""

    profile: Profile
    csv_text: str
    report: dict[str, Any] = field(default_factory=dict)
    command: list[str] = field(default_factory=list)


def profile_config(
    space_path: str | Path,
    problem: str,
    params: dict[str, Any],
    uri: str,
    launches_per_call: int,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    outside_space: bool = False,
    entry: str = "",
) -> ProfileRun:
    """Profile one config under ncu (see the module docstring). NcuError on any failure; NcuConfigError when
    the failure is this config's own (see `target_command` for `outside_space`). `entry`: the config's entry
    point where it is not its `uri` (a plain source's fixed name)."""
    ncu = find_ncu()
    with tempfile.TemporaryDirectory(prefix="tuner-ncu-") as tmp:
        log_file = Path(tmp) / "raw.csv"
        target = target_command(space_path, problem, params, outside_space=outside_space)
        argv = ncu_command(target, entry or uri, launches_per_call, log_file, ncu=ncu)
        where = f"ncu on {uri}"
        text, stdout = run_ncu(argv, log_file, timeout_s=timeout_s, where=where)
    profile = parse_raw_csv(text, where=where)
    report = target_report(stdout)
    return ProfileRun(profile=profile, csv_text=text, report=report, command=argv)


# ---------------------------------------------------------------------------------------------------------------
# The profile target


def device_facts() -> dict[str, Any]:
    """Facts about GPU 0 that the roofline needs, read from the GPU: name, SM count, max SM clock, arch."""
    from tuner.core.cudalib import runtime

    props = runtime.getDeviceProperties(0)
    name = props.get("name", b"")
    return {
        "gpu": name.decode() if isinstance(name, bytes) else str(name),
        "sm_count": int(props["multiProcessorCount"]),
        "sm_clock_mhz": int(props.get("clockRate", 0)) // 1000,
        "cc": f"{props['major']}.{props['minor']}",
    }


def device_facts_from_csv(text: str) -> dict[str, Any]:
    """The `device_facts` of the GPU a raw capture was made on, read from the device columns ncu adds to the raw
    page (``device__attribute_*``, ``CC``); {} when the capture lacks them. Lets a saved capture be explained
    again without the GPU."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID",')), None)
    if start is None:
        return {}
    rows = list(csv.reader(io.StringIO("\n".join(line for line in lines[start:] if line.startswith('"')))))
    if len(rows) < 3:
        return {}
    row = dict(zip(rows[0], rows[2], strict=False))
    sm_count = _number(row.get("device__attribute_multiprocessor_count", ""))
    clock_khz = _number(row.get("device__attribute_max_gpu_frequency_khz", "")) or _number(
        row.get("device__attribute_clock_rate", "")
    )
    if not sm_count or not clock_khz or "CC" not in row:
        return {}
    return {
        "gpu": row.get("device__attribute_display_name", ""),
        "sm_count": int(sm_count),
        "sm_clock_mhz": int(clock_khz) // 1000,
        "cc": row["CC"],
    }


def fp32_peak_tflops(facts: dict[str, Any]) -> float | None:
    """FP32 FMA peak (2 FLOPs per lane per clock) from the GPU's SM count and max clock as ncu reports them
    (`device_facts_from_csv`: "cc", "sm_count", "sm_clock_mhz"); None if unknown."""
    lanes = FP32_LANES_PER_SM.get(str(facts.get("cc")))
    if not lanes or not facts.get("sm_count") or not facts.get("sm_clock_mhz"):
        return None
    return facts["sm_count"] * lanes * 2 * facts["sm_clock_mhz"] * 1e6 / 1e12


def widen(space, assignments: Sequence[str]):
    """`space` with each ``NAME=VALUE`` of `assignments` added to NAME's values (YAML scalars only; names and
    text that do not parse are left for `config_from_assignments` to refuse)."""
    import dataclasses

    import yaml

    params = dict(space.params)
    for item in assignments:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in params:
            continue
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            continue
        if not isinstance(value, dict | list) and value not in params[key]:
            params[key] = (*params[key], value)
    return dataclasses.replace(space, params=params)


def _target_main(argv: list[str] | None = None) -> int:
    """``python -m tuner.insight.ncu SPACE [--problem P] [--set k=v ...]``: check and time one config on GPU 0 with the
    project's protocol (a short budget: the point is the launches ncu selects), print a JSON report."""
    parser = argparse.ArgumentParser(prog="python -m tuner.insight.ncu")
    parser.add_argument("space")
    parser.add_argument("--problem")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--outside-space", action="store_true", help="accept values outside the space's lists")
    args = parser.parse_args(argv)
    from tuner.gpu.evaluate import evaluate_config
    from tuner.gpu.evaluator import GpuEvaluator
    from tuner.space import space as space_mod

    try:
        space = space_mod.load(args.space)
        if args.outside_space:
            space = widen(space, args.set)
        problem = space.problem(args.problem)
        params = space.config_from_assignments(args.set, problem)
    except InputError as exc:
        print(f"tuner.insight.ncu: error: {exc}", file=sys.stderr)
        return 2
    # A small ceiling copy: the profile does not use it, and the target should start fast.
    evaluator = GpuEvaluator(0, ceiling_bytes=64 << 20, ceiling_budget_ms=5.0)
    result = evaluate_config(space, params, problem, evaluator=evaluator, budget_ms=1.0, min_reps=1)
    print(json.dumps({"device": device_facts(), "ok": result.ok, "result": result.to_dict()}, default=str))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(_target_main())
