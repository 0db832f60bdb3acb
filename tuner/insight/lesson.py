"""The memory-hierarchy lesson's hands-on exercises, one `tuner lesson NAME` each, and `tuner explain`.

Each lesson times its configs with the project's one protocol (`tuner.gpu.evaluate.evaluate_config` on a GPU worker,
which verifies each config first), optionally profiles them under Nsight Compute (``--ncu``, see `tuner.insight.ncu`),
prints the lesson's prediction beside the measurement, and writes ``<out>/<name>.png`` and ``<name>.json`` (the
rows, the GPU, the command), plus ``<name>-<config>.csv`` for each ncu capture.

- ``coalescing``: the copy family, one float per thread, stride 1..32. The lesson predicts useful bandwidth
  falling as 1/min(stride, 32) (128-byte lines). Hopper moves 32-byte sectors and this copy's writes stay
  coalesced, so the sector model predicts 8 useful bytes per (4·min(stride, 8) + 4) moved: 2/(min(stride,8)+1),
  a floor of 2/9, not 1/32; sectors per request min(4·stride, 32). ncu's DRAM bytes per element say how many
  bytes DRAM really moved per strided load (the project measured a floor near 1/9 of the ceiling).
- ``bank-conflicts``: the transpose family, tile 32, SMEM pitch 32 vs 33 floats at vec 1 and vec 4 (the vec 4,
  pad 1 tile is the space's tuned default). The prediction is the bank model of the template's column read.
- ``registers``: the GEMM family's default 8×8 thread tile (256 threads) under ``__launch_bounds__(256, N)``,
  N = 0 (none) .. 8: the register cap 65536 / (256·N) predicts where ptxas must spill. Registers and spill bytes
  come from NVRTC (works without a GPU: ``--compile-only``); time from the GPU.
- ``fusion``: the elementwise chain bias → GELU → scale at fusion depth 1, 2, 3: one, two or three DRAM round
  trips of the tensor; the lesson predicts the fused chain ~3× faster than three kernels.
- ``ncu``: ``tuner lesson ncu STUDY --trial N`` is ``tuner explain`` with the full report.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError

if TYPE_CHECKING:
    from tuner.gpu.worker import IsolatedEvaluator

LESSONS = ("coalescing", "bank-conflicts", "registers", "fusion", "ncu")


# ---------------------------------------------------------------------------------------------------------------
# Predictions (pure functions: tested on the CPU)


def lesson_copy_fraction(stride: int) -> float:
    """The lesson's prediction for a strided copy: 1/min(stride, 32) of peak (128-byte lines)."""
    return 1.0 / min(stride, 32)


def sector_copy_fraction(stride: int, elem_bytes: int = 4, sector: int = 32) -> float:
    """Useful fraction of DRAM traffic with `sector`-byte sectors when the reads are strided and the writes
    coalesced: (read + write useful bytes) / (sectors' bytes read per element + bytes written)."""
    read = min(stride * elem_bytes, sector)
    return 2 * elem_bytes / (read + elem_bytes)


def copy_sectors_per_request(stride: int, elem_bytes: int = 4, sector: int = 32) -> float:
    """Sectors a warp's strided load touches: 32 lanes, `stride` × `elem_bytes` apart, one sector each at most."""
    return float(min(32, math.ceil(32 * stride * elem_bytes / sector)))


def transpose_read_ways(tile: int, vec: int, rows_per_thread: int, pad: int) -> int:
    """Bank-conflict degree of the transpose template's SMEM column read: lane (tx, ty) of a warp reads word
    (tx·vec + k)·(tile + pad) + ty + j·BY; the degree is the most distinct words any one of the 32 banks gets."""
    bx, by = tile // vec, tile // rows_per_thread
    pitch = tile + pad
    worst = 1
    for j in range(rows_per_thread):
        for k in range(vec):
            banks: dict[int, set[int]] = {}
            for lane in range(min(32, bx * by)):
                tx, ty = lane % bx, lane // bx
                word = (tx * vec + k) * pitch + ty + j * by
                banks.setdefault(word % 32, set()).add(word)
            worst = max(worst, max(len(words) for words in banks.values()))
    return worst


def register_cap(
    threads: int, min_blocks: int, file_registers: int = 65536, unit: int = 8, max_per_thread: int = 255
) -> int:
    """Registers per thread ptxas may use under ``__launch_bounds__(threads, min_blocks)`` (0: no second
    argument, so only the per-thread maximum): the register file shared by min_blocks blocks, in steps of 8."""
    if min_blocks <= 0:
        return max_per_thread
    return min(max_per_thread, file_registers // (threads * min_blocks) // unit * unit)


def fusion_kernels(fusion: int) -> int:
    """Kernels (DRAM round trips of the tensor) of the 3-stage chain at fusion depth `fusion`."""
    return math.ceil(3 / fusion)


# ---------------------------------------------------------------------------------------------------------------
# Running


@dataclass
class Row:
    """One config of a lesson: its label and params, the lesson's prediction and what was measured."""

    label: str
    params: dict[str, Any]
    predicted: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)


@dataclass
class LessonResult:
    name: str
    title: str
    rows: list[Row]
    notes: list[str] = field(default_factory=list)
    gpu: str = ""
    ceiling_tbps: float | None = None
    csvs: dict[str, str] = field(default_factory=dict)  # config label → raw ncu CSV
    ncu_failures: list[str] = field(default_factory=list)  # one line per config whose profile failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "lesson": self.name,
            "title": self.title,
            "gpu": self.gpu,
            "ceiling_tbps": self.ceiling_tbps,
            "notes": self.notes,
            "ncu_failures": self.ncu_failures,
            "rows": [dataclasses.asdict(r) for r in self.rows],
        }


class Bench:
    """Times configs through `evaluate_config` on one GPU worker (started on first use) and, with `ncu`,
    profiles them (`tuner.insight.ncu.profile_config`). Keeps the GPU name and copy ceiling for the report."""

    def __init__(self, gpu: int = 0, ncu: bool = False, budget_ms: float = 25.0, timeout_s: float = 120.0):
        self.gpu, self.use_ncu, self.budget_ms, self.timeout_s = gpu, ncu, budget_ms, timeout_s
        self._evaluator: IsolatedEvaluator | None = None
        self.info: dict[str, Any] = {}
        if ncu:
            from tuner.insight.ncu import find_ncu

            find_ncu()  # absent: one line before any GPU time is spent

    def start(self) -> dict[str, Any]:
        from tuner.gpu import discovery
        from tuner.gpu.worker import IsolatedEvaluator, WorkerError

        if self._evaluator is None:
            discovery.require_gpu(self.gpu)  # in the words of bench and ceiling, before a worker starts only to fail
            self._evaluator = IsolatedEvaluator(gpu=self.gpu, timeout_s=self.timeout_s)
            try:
                self.info = self._evaluator.start()
            except WorkerError as exc:
                self._evaluator = None
                raise InputError(
                    f"GPU {self.gpu} is not usable: {str(exc).splitlines()[0].split(': ', 1)[-1]}"
                ) from None
        return self.info

    def close(self) -> None:
        if self._evaluator is not None:
            self._evaluator.close()
            self._evaluator = None

    def time(self, space, params: dict[str, Any], problem) -> dict[str, Any]:
        from tuner.gpu.evaluate import evaluate_config

        self.start()
        result = evaluate_config(space, params, problem, evaluator=self._evaluator, budget_ms=self.budget_ms)
        if not result.ok:
            return {"failure": result.kind, "reason": result.reason}
        return {
            "median_ms": result.median_ms,
            "tbps": result.tbps,
            "tflops": result.tflops,
            "fraction_of_ceiling": result.fraction_of_ceiling,
            "registers": result.registers,
            "spill_bytes": result.spill_bytes,
        }

    def profile(self, space, params: dict[str, Any], problem, label: str, result: LessonResult, row: Row):
        """The Explanation of one config under ncu (None without --ncu); the raw CSV goes into `result`. A config
        whose own profile fails (its target exits with an error, ncu times out or profiles nothing) is marked
        in `row` (measured ``ncu: failed``) and in `result.ncu_failures`, and the lesson goes on; ncu absent or
        not permitted still ends the lesson (no config could be profiled)."""
        if not self.use_ncu:
            return None
        from tuner.build.render import render
        from tuner.insight.explain import explain
        from tuner.insight.ncu import NcuConfigError, fp32_peak_tflops, parse_raw_csv

        family = space.family
        resolved = space.resolve(params, problem)
        source = render(family, params, resolved, problem.env)
        launches = len(family.launches(source.entry, resolved, problem.env))
        try:
            csv_text, report = self.capture(space, params, problem, source.uri, launches, label, result)
            profile = parse_raw_csv(csv_text, where=f"ncu on {source.uri}")
        except NcuConfigError as exc:
            row.measured["ncu"] = "failed"
            result.ncu_failures.append(f"{row.label}: {exc}")
            return None
        result.csvs[label] = csv_text
        return explain(
            profile,
            label,
            family.bytes_moved(problem.env),
            ceiling_tbps=self.info.get("ceiling_tbps"),
            peak_tflops=fp32_peak_tflops(report.get("device", {})),
            access_bytes=int(params.get("vec", 1)) * family.elem_bytes(problem.env),
            measured_tbps=row.measured.get("tbps"),
        )

    def capture(
        self, space, params: dict[str, Any], problem, uri: str, launches: int, label: str, result: LessonResult
    ) -> tuple[str, dict[str, Any]]:
        """Run ncu on one config: (the raw CSV, the target's report). A lesson's configs may lie outside the
        shipped space's lists (the registers sweep), so the target is told to accept them."""
        from tuner.insight.ncu import profile_config

        run = profile_config(
            space.path, problem.name, params, uri, launches, timeout_s=self.timeout_s * 2, outside_space=True
        )
        return run.csv_text, run.report


def _space(name: str):
    from tuner.space import space as space_mod

    return space_mod.load(name)


def _merge(params: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**params, **changes}


def coalescing(bench: Bench) -> LessonResult:
    space = _space("copy")
    problem = space.problem("n64M")
    result = LessonResult("coalescing", "Strided copy: useful bandwidth vs stride (one float per thread)", [])
    base = _merge(space.default, vec=1, block=256, items=4)
    for stride in (1, 2, 4, 8, 16, 32):
        params = _merge(base, stride=stride)
        row = Row(
            label=f"stride {stride}",
            params=params,
            predicted={
                "lesson": lesson_copy_fraction(stride),
                "sector_model": sector_copy_fraction(stride),
                "sectors_per_request": copy_sectors_per_request(stride),
            },
        )
        row.measured = bench.time(space, params, problem)
        e = bench.profile(space, params, problem, f"stride{stride}", result, row)
        if e is not None:
            row.measured.update(
                sectors_per_request=e.ld_sectors_per_request,
                dram_bytes_per_element=e.dram_read_bytes / problem.sizes["n"],
                useful_fraction=e.useful_fraction,
                bound=e.bound,
            )
        result.rows.append(row)
    result.notes = [
        "lesson: 1/min(stride, 32), from 128-byte lines; sector model: 2/(min(stride, 8) + 1), from 32-byte "
        "sectors with the writes still coalesced (4 useful bytes written per 4·min(stride, 8) read).",
        "Where the measurement falls below the sector model past stride 8, DRAM is moving more than one 32-byte "
        "sector per strided load (see the DRAM bytes per element that ncu measures).",
    ]
    return result


def bank_conflicts(bench: Bench) -> LessonResult:
    space = _space("transpose")
    problem = space.problem()
    result = LessonResult("bank-conflicts", "Transpose through SMEM: tile pitch 32 vs 33 floats", [])
    for vec, pad in ((1, 0), (1, 1), (4, 0), (4, 1)):
        params = _merge(space.default, tile=32, rows_per_thread=8, vec=vec, pad=pad)
        tuned = params == space.default
        label = f"[32][{32 + pad}] vec{vec}" + (" (tuned)" if tuned else "")
        row = Row(label=label, params=params, predicted={"read_ways": transpose_read_ways(32, vec, 8, pad)})
        row.measured = bench.time(space, params, problem)
        e = bench.profile(space, params, problem, f"pad{pad}_vec{vec}", result, row)
        if e is not None:
            row.measured.update(
                smem_ld_ways=e.smem_ld_ways,
                smem_st_ways=e.smem_st_ways,
                smem_ld_conflicts=e.smem_ld_conflicts,
                smem_st_conflicts=e.smem_st_conflicts,
                bound=e.bound,
            )
        result.rows.append(row)
    result.notes = [
        "read_ways: the bank model of the template's column read, (tx·vec + k)·pitch + ty + j·BY "
        "mod 32; a k-way conflict costs k shared-memory wavefronts per instruction."
    ]
    return result


def registers(bench: Bench | None) -> LessonResult:
    """`bench` None: registers and spills from NVRTC only (no GPU)."""
    from tuner import kernels
    from tuner.build.compile import compile_source
    from tuner.build.render import render

    space = _space("gemm")
    # The shipped space offers min_blocks 0, 1, 2, 4; the sweep wants every N up to 8 (8 × 256 threads fill an SM).
    space = dataclasses.replace(space, params={**space.params, "min_blocks": tuple(range(9))})
    problem = space.problem()
    family = kernels.get("gemm")
    result = LessonResult("registers", "Launch-bounds sweep on the 8x8 GEMM thread tile (256 threads)", [])
    threads = space.resolve(space.default, problem)["threads"]
    arch = bench.start()["arch"] if bench is not None else "sm_90"
    for n in range(9):
        params = _merge(space.default, min_blocks=n)
        source = render(family, params, space.resolve(params, problem), problem.env)
        compiled = compile_source(source, arch)
        if not compiled.ok:
            raise InputError(f"{source.uri}: does not compile: {compiled.reason}")
        row = Row(
            label=f"__launch_bounds__({threads}{f', {n}' if n else ''})",
            params=params,
            predicted={"register_cap": register_cap(threads, n)},
            measured={
                "registers": compiled.main.registers,
                "spill_bytes": compiled.main.spill_store_bytes + compiled.main.spill_load_bytes,
            },
        )
        if bench is not None:
            timed = bench.time(space, params, problem)
            # A compute-bound GEMM: its bytes per second (and their share of the copy ceiling) say nothing.
            row.measured.update(
                {k: v for k, v in timed.items() if k not in ("registers", "spill_bytes", "tbps", "fraction_of_ceiling")}
            )
            if n in (2, 8):  # the default and the tightest bound: the spill traffic ncu sees
                e = bench.profile(space, params, problem, f"lb{n}", result, row)
                if e is not None:
                    row.measured.update(
                        local_bytes=e.local_bytes, bound=e.bound, achieved_occupancy_pct=e.achieved_occupancy_pct
                    )
        result.rows.append(row)
    result.notes = [
        "register_cap = 65536 / (256·N), in steps of 8, at most 255: past the thread tile's needs "
        "(64 accumulators + 16 fragments + addresses), ptxas spills to local memory (DRAM)."
    ]
    if bench is None:
        result.notes.append("compiled only (no GPU): registers and spills from ptxas; run on a GPU for the times.")
    return result


def fusion(bench: Bench) -> LessonResult:
    space = _space("elementwise")
    problem = space.problem("r32768_c8192_bf16")
    result = LessonResult("fusion", "bias → GELU → scale, bf16 32768x8192, at fusion depth 1, 2, 3", [])
    elements = problem.sizes["rows"] * problem.sizes["cols"]
    elem = 2
    for depth in (1, 2, 3):
        params = _merge(space.default, fusion=depth)
        k = fusion_kernels(depth)
        row = Row(
            label=f"fusion {depth} ({k} kernel{'s' if k > 1 else ''})",
            params=params,
            predicted={"dram_bytes": k * 2 * elements * elem, "time_vs_fused": float(k)},
        )
        row.measured = bench.time(space, params, problem)
        e = bench.profile(space, params, problem, f"fusion{depth}", result, row)
        if e is not None:
            row.measured.update(dram_bytes=e.dram_bytes, bound=e.bound, of_ceiling=e.of_ceiling)
        result.rows.append(row)
    fused = result.rows[-1].measured.get("median_ms")
    for row in result.rows:
        if fused and row.measured.get("median_ms"):
            row.measured["time_vs_fused"] = row.measured["median_ms"] / fused
    return result


# ---------------------------------------------------------------------------------------------------------------
# Output


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    return str(value)


def print_table(result: LessonResult) -> None:
    """The lesson's rows, each prediction beside each measurement, fitted to the terminal as every table of the
    CLI is (`tuner.results.console.print_table`): a table wider than the window is printed as several, each beginning
    with the config; a pipe gets plain rows, the title and notes on stderr."""
    from tuner.results.console import Column
    from tuner.results.console import print_table as print_rows

    pred_keys = list(dict.fromkeys(k for r in result.rows for k in r.predicted))
    meas_keys = list(dict.fromkeys(k for r in result.rows for k in r.measured if k != "reason"))
    title = result.title + (f" — {result.gpu}" if result.gpu else "")
    if result.ceiling_tbps:
        title += f", copy ceiling {result.ceiling_tbps:.2f} TB/s"
    # Headers in words (not snake_case), so a narrow column wraps between them.
    columns = [
        Column("config"),
        *(Column(f"predicted {k.replace('_', ' ')}", "right") for k in pred_keys),
        *(Column(k.replace("_", " "), "right") for k in meas_keys),
    ]
    rows = [
        [r.label, *(_cell(r.predicted.get(k)) for k in pred_keys), *(_cell(r.measured.get(k)) for k in meas_keys)]
        for r in result.rows
    ]
    notes = [f"  {note}" for note in result.notes]
    notes += [f"  no ncu profile: {failure}" for failure in result.ncu_failures]
    print_rows(title, columns, rows, notes=notes, key_columns=1, wrap_notes=True)


def lesson_png(result: LessonResult) -> bytes:
    """One plot per lesson: the prediction as a line, the measurement as points."""

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    labels = [r.label for r in result.rows]
    xs = list(range(len(labels)))

    def series(where: str, key: str) -> list[float]:
        return [float(getattr(r, where).get(key, math.nan) or math.nan) for r in result.rows]

    if result.name == "coalescing":
        strides = [r.params["stride"] for r in result.rows]
        ax.plot(strides, series("predicted", "lesson"), "k--", label="lesson: 1/min(stride, 32)")
        ax.plot(strides, series("predicted", "sector_model"), "b:", label="32-byte sectors, coalesced writes")
        ax.plot(strides, series("measured", "fraction_of_ceiling"), "ro-", label="measured (useful / copy ceiling)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("stride (elements)")
        ax.set_ylabel("useful bandwidth / copy ceiling")
    elif result.name == "registers":
        ns = [r.params["min_blocks"] for r in result.rows]
        ax.plot(ns, series("predicted", "register_cap"), "k--", label="register cap 65536/(256·N)")
        ax.plot(ns, series("measured", "registers"), "bo-", label="registers (ptxas)")
        ax.bar(ns, series("measured", "spill_bytes"), alpha=0.3, color="red", label="spill bytes (ptxas)")
        ax.set_xlabel("N in __launch_bounds__(256, N) (0: none)")
        ax.set_ylabel("registers / spill bytes")
        times = series("measured", "median_ms")
        if any(not math.isnan(t) for t in times):
            ax2 = ax.twinx()
            ax2.plot(ns, times, "gs-", label="time (ms)")
            ax2.set_ylabel("median ms")
            ax2.legend(loc="upper right", fontsize=8)
    else:
        times = series("measured", "median_ms")
        ax.bar(xs, times, color="tab:blue", alpha=0.7, label="measured median ms")
        if result.name == "fusion":
            fused = times[-1]
            ax.plot(
                xs,
                [fused * r.predicted["time_vs_fused"] for r in result.rows],
                "k--o",
                label="predicted: fused time × kernels",
            )
        if result.name == "bank-conflicts":
            for x, r in zip(xs, result.rows, strict=True):
                ax.annotate(
                    f"{r.predicted['read_ways']}-way predicted",
                    (x, times[x] if not math.isnan(times[x]) else 0),
                    ha="center",
                    fontsize=8,
                )
        ax.set_xticks(xs, labels, fontsize=8)
        ax.set_ylabel("median ms per call")
    ax.set_title(result.title + (f"\n{result.gpu}" if result.gpu else ""), fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    from tuner.results.plots import png_bytes

    return png_bytes(fig)


def write_outputs(result: LessonResult, out_dir: Path, command: str) -> list[Path]:
    from tuner.results.export import atomic_write

    written = [
        atomic_write(out_dir / f"{result.name}.png", lesson_png(result)),
        atomic_write(
            out_dir / f"{result.name}.json",
            json.dumps(
                {**result.to_dict(), "command": command, "date": time.strftime("%Y-%m-%d")}, indent=2, default=str
            ),
        ),
    ]
    for label, text in result.csvs.items():
        written.append(atomic_write(out_dir / f"{result.name}-{label}.csv", text))
    return written


# ---------------------------------------------------------------------------------------------------------------
# Commands
