"""What a person sees of a study: the running figures (`Stats`), the progress bar (`Progress`), and the summary's
lines (where the time went: start-up stages, GPU busy, check and timing).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from tuner.core.gpufacts import GpuFacts
from tuner.core.result import TrialAttr
from tuner.gpu.clock import human_seconds, since_command
from tuner.gpu.protocol import CHECK_PHASES, PHASES, Spent

if TYPE_CHECKING:
    pass


class Stats:
    def __init__(self, unit: str, past, gpu: GpuFacts | None = None, objectives=None):
        from tuner.space.objective import goal_of

        self.unit = unit
        self.goal = goal_of(objectives, unit)  # the best so far is the best for the first objective
        self.gpu = gpu  # the facts of the GPU measured on (the FP32 peak of a compute-bound family's live line)
        self.measured = 0
        self.duplicates = 0
        self.failures: Counter[str] = Counter()
        self.screened: Counter[str] = Counter()
        self.cut_short = 0  # measurements cut off after the estimate (fewer than the protocol's 10 repetitions)
        self.best: dict[str, Any] | None = None
        self.sm_clock_mhz: float | None = None  # the max SM clock the measurements report: the FP32 peak's
        for t in past:
            if t.state.name == "COMPLETE" and TrialAttr.DUPLICATE_OF not in t.user_attrs:
                self._consider(t.number, t.params, t.user_attrs)

    def _consider(self, number, params, figures) -> None:
        self.sm_clock_mhz = (figures.get("clocks") or {}).get("sm_clock_max_mhz") or self.sm_clock_mhz
        value = self.goal.value(figures)
        if self.best is None or self.goal.better(value, self.best["value"]):
            self.best = {
                "trial": number,
                "params": dict(params),
                "uri": figures.get("uri"),
                "tbps": figures["tbps"],
                "tflops": figures["tflops"],
                "median_ms": figures["median_ms"],
                "fraction_of_ceiling": figures["fraction_of_ceiling"],
                "registers": figures["registers"],
                "smem_bytes": figures["smem_bytes"],
                "value": value,
            }

    def add(self, number, params, result) -> None:
        self.measured += 1
        self.cut_short += result.repetitions < 10
        self._consider(number, params, result.to_dict())

    def fail(self, kind: str) -> None:
        self.failures[kind] += 1

    def fp32_peak(self) -> float | None:
        """The FP32 peak in TFLOP/s of the GPU measured on, at the max SM clock its measurements report
        (`tuner.core.gpufacts.fp32_peak_tflops`); None where either is unknown."""
        from tuner.core.gpufacts import fp32_peak_tflops

        return fp32_peak_tflops(self.gpu, self.sm_clock_mhz) if self.gpu is not None else None


def study_location(study: str, url: str) -> str:
    """The line that says where a study's trials go, printed as it starts."""
    from tuner.store.dbfiles import sqlite_path

    path = sqlite_path(url)
    return f"study {study}: trials go to {path if path is not None else url}"


#: the stages of `summary["startup"]` that run one after the other until the GPU workers are up, for people (the
#: others overlap them, or are moments counted from the command's start)
_STAGES = {"imports_s": "imports", "ray_init_s": "Ray", "gpu_workers_s": "workers"}


def _first_seconds(summary: dict[str, Any], replay: bool) -> str:
    """What the seconds before the first result went to: start-up (its stages), then the first config."""
    cold = summary.get("cold_start_s")
    stages = {
        k: float(v) for k, v in (summary.get("startup") or {}).items() if k in _STAGES and isinstance(v, (int, float))
    }
    startup = sum(stages.values())
    order = sorted(stages, key=lambda k: (list(_STAGES).index(k) if k in _STAGES else len(_STAGES), k))
    parts = ", ".join(
        f"{_STAGES.get(k, k.removesuffix('_s').replace('_', ' '))} {human_seconds(stages[k])}" for k in order
    )
    text = f"start-up {human_seconds(startup)}" + (f" ({parts})" if parts else "")
    if cold is None:
        return text + "; no result came back"
    first = (
        "opening the study and answering the first config"
        if replay
        else "opening the study, compiling and measuring the first config"
    )
    return f"first result at {human_seconds(cold)}: {text}, then {human_seconds(max(cold - startup, 0.0))} {first}"


def time_split(
    spent: Spent, wall_s: float, window_s: float, gpus: int, compile_threads: int | None, measures: bool
) -> dict[str, Any]:
    """The summary's account of where the search's time went (finalists excluded), from the pool's `Spent`.

    * "gpu_busy_fraction": the GPU time of the configs' own launches (Σ `Measurement.gpu_ms`: checked launch and
      timed repetitions) over the GPU window × GPUs: the time the GPUs ran work, not the time a worker held them.
      None for a replay (its GPU time is the recording's, not this run's) and where no measurement reported its
      GPU time; a lower bound where "gpu_time_missing" (measurements that reported none) is above 0. "gpu_s" is
      the sum itself.
    * "workers_busy_fraction": the time the workers spent inside ``evaluate`` (GPU work, host work and waits
      alike) over the same window × GPUs; for a replay, the only figure of the three. "gpu_window_s": the window,
      from the first evaluation (a GPU may measure before the search starts) to the end of the search.
    * "phases_s": seconds summed over this run's results: "compile" (every compile, over the pool's
      "compile_threads") and the evaluation's stages (`tuner.gpu.protocol.PHASES`, where the evaluator reports them;
      the checks' failures included). None for a replay.
    * "phases_share": "compile" of the wall × compile threads; "check" (`tuner.gpu.protocol.CHECK_PHASES`) and
      "timing" of the GPU window × GPUs, the denominator of the busy fractions. None for a replay.
    """
    lanes = window_s * gpus
    out: dict[str, Any] = {
        "gpu_busy_fraction": None,
        "gpu_s": None,
        "gpu_time_missing": None,
        "workers_busy_fraction": round(spent.occupied_s / lanes, 3) if lanes > 0 else None,
        "gpu_window_s": round(window_s, 3),
        "compile_threads": compile_threads,
        "phases_s": None,
        "phases_share": None,
    }
    if not measures:
        return out
    out["gpu_time_missing"] = spent.gpu_untimed
    if spent.gpu_timed:
        out["gpu_s"] = round(spent.gpu_s, 3)
        out["gpu_busy_fraction"] = round(spent.gpu_s / lanes, 3) if lanes > 0 else None
    stages = [k for k in PHASES if k in spent.phases_s] + sorted(set(spent.phases_s) - set(PHASES))
    out["phases_s"] = {"compile": round(spent.compile_s, 3), **{k: round(spent.phases_s[k], 3) for k in stages}}
    share: dict[str, float] = {}
    if compile_threads and wall_s > 0:
        share["compile"] = round(spent.compile_s / (wall_s * compile_threads), 3)
    if stages and lanes > 0:
        share["check"] = round(sum(spent.phases_s.get(k, 0.0) for k in CHECK_PHASES) / lanes, 3)
        share["timing"] = round(spent.phases_s.get("timing", 0.0) / lanes, 3)
    out["phases_share"] = share
    return out


def progress_display(enabled: bool):
    """The rich progress display of one study's bar, or of several studies' bars side by side (a line each: its
    label, the bar, trials done/N, time, best so far, trials/s, failures)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=Console(stderr=True),
        disable=not enabled,
    )


class Progress:
    """A rich progress bar: trials done/N, best so far, trials/s, failures by kind; `where` (where the trials
    go) is printed above it as the study starts."""

    def __init__(
        self, enabled: bool, total: int, done: int, stats: Stats, where: str = "", label: str = "study", bar: Any = None
    ):
        """`bar`: a display made by `progress_display` that this study's bar joins as one line (studies side by
        side share one); None: a display of its own, shown while the study runs."""
        from rich.markup import escape

        self.stats, self.started, self.done0 = stats, time.perf_counter(), done
        self.enabled, self.where = enabled, where
        self.shared = bar is not None
        self.bar = bar if bar is not None else progress_display(enabled)
        self.console = self.bar.console
        self.task = self.bar.add_task(escape(label), total=total, completed=done, info="")

    def __enter__(self):
        if self.enabled and self.where:
            self.console.print(self.where, soft_wrap=True, highlight=False, markup=False)
        if not self.shared:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if not self.shared:
            self.bar.__exit__(*exc)

    def set_total(self, total: int) -> None:
        """The study's target, once the valid set has capped it."""
        self.bar.update(self.task, total=total)

    def update(self, done: int) -> None:
        s = self.stats
        rate = (done - self.done0) / max(time.perf_counter() - self.started, 1e-9)
        best = f"best {_live_figure(s.unit, s.best, s.fp32_peak())}" if s.best else ""
        fails = " ".join(f"{k}:{v}" for k, v in sorted(s.failures.items()))
        self.bar.update(self.task, completed=done, info=f"{best}  {rate:.1f} trials/s  {fails}")

    def final(self, summary: dict[str, Any]) -> None:
        """The end-of-study table: where, how many, what the time went to, the best config in the family's own
        unit against its own roof (`_summary_figure`)."""
        from rich.table import Table
        from rich.text import Text

        if not self.enabled:
            return
        replay = any(str(g.get("gpu", "")).startswith("replay:") for g in summary.get("gpus") or [])
        table = Table(title=f"study {summary['study']}", show_header=False)
        table.add_column(no_wrap=True)
        table.add_column(overflow="fold")
        table.add_row("stored in", Text(summary["storage"]))
        table.add_row(
            "trials",
            f"{summary['trials']} ({summary['measured_this_run']} measured this run, "
            f"{summary['duplicates_this_run']} answered from earlier trials)",
        )
        if summary["failures_this_run"]:
            table.add_row("failures", ", ".join(f"{k}: {v}" for k, v in summary["failures_this_run"].items()))
        # the whole wall a user waited, from the command's start (imports included); the study's own loop beside it
        whole = summary.get("command_wall_s") or summary["wall_s"]
        loop = f" (the study's loop {human_seconds(summary['wall_s'])})" if summary.get("command_wall_s") else ""
        table.add_row("wall time", f"{human_seconds(whole)}{loop}; {_first_seconds(summary, replay)}")
        if replay:
            occupied = summary.get("workers_busy_fraction")
            if occupied:  # an in-process replay has no workers to be busy
                table.add_row("replay workers busy", f"{occupied:.0%}")
        elif "gpu_busy_fraction" in summary:
            table.add_row("GPU busy", _gpu_busy_text(summary))
            if summary.get("phases_s"):
                table.add_row("time in", _time_in_text(summary))
        best = summary["best"]
        if best:
            figure = _summary_figure(self.stats.unit, best, summary, self.stats.sm_clock_mhz)
            table.add_row("best", Text(best["uri"] or str(best["params"])))
            resources = f", {best['registers']} registers, {best['smem_bytes']} B SMEM" if best.get("registers") else ""
            table.add_row("", figure + resources)  # no registers: not recorded (a Kernel Tuner cache's configs)
        # Wide enough for the uri and the storage whole: they are copied from here.
        width = max(self.console.width, len(str(best["uri"] if best else "")) + 30, len(summary["storage"]) + 30)
        self.console.print(table, width=width)


def _live_figure(unit: str, best: dict[str, Any], fp32_peak: float | None = None) -> str:
    """The best config's figure on the live line, against its own roof: a memory-bound family's TB/s with its
    share of the copy ceiling; a compute-bound family's TFLOP/s with its share of the FP32 peak (`fp32_peak`,
    from the GPU's facts; alone where that is unknown: a byte ceiling says nothing of FLOPs); a family without a
    throughput, its time."""
    if unit == "TB/s":
        return f"{_best_figure(unit, best)} ({best['fraction_of_ceiling']:.2f}× ceiling)"
    if unit == "TFLOP/s":
        share = f" ({best['tflops'] / fp32_peak:.2f}× FP32 peak)" if fp32_peak else ""
        return f"{_best_figure(unit, best)}{share}"
    return _best_figure(unit, best)


def _best_figure(unit: str, best: dict[str, Any]) -> str:
    """The best config's figure alone, in the family's unit (its time for a family without a throughput)."""
    if unit == "TB/s":
        return f"{best['tbps']:.2f} TB/s"
    if unit == "TFLOP/s":
        return f"{best['tflops']:.1f} TFLOP/s"
    return f"{best['median_ms']:.4g} ms"


def _summary_figure(unit: str, best: dict[str, Any], summary: dict[str, Any], sm_clock_mhz: float | None) -> str:
    """The summary's figure of the best config, against its own roof: a memory-bound family's TB/s with its share
    of the copy ceiling measured on the GPU; a compute-bound family's TFLOP/s with its share of the FP32 peak that
    the GPU's facts (`summary["gpus"]`: SM count, arch) and the measurements' max SM clock give, said to be from
    the facts (no peak is measured), or no share where the facts were not read from a GPU."""
    from tuner.core.gpufacts import GpuFacts, fp32_peak_tflops

    if unit == "TB/s":
        return f"{best['tbps']:.3f} TB/s, {best['fraction_of_ceiling']:.2f}× the copy ceiling"
    if unit != "TFLOP/s":
        return f"{best['median_ms']:.4g} ms"
    facts = GpuFacts.from_dict(next((g.get("gpu_facts") for g in summary.get("gpus") or []), None))
    peak = fp32_peak_tflops(facts, sm_clock_mhz)
    if peak is None:
        return f"{best['tflops']:.1f} TFLOP/s (no FP32 peak to compare with: the GPU's facts or clock are unknown)"
    return (
        f"{best['tflops']:.1f} TFLOP/s, {best['tflops'] / peak:.2f}× the FP32 peak ({peak:.1f} TFLOP/s from the "
        f"GPU's facts: {facts.sm_count} SMs at {sm_clock_mhz:g} MHz, not measured)"
    )


def _gpu_busy_text(summary: dict[str, Any]) -> str:
    """The summary's "GPU busy" row: the GPUs' share of work, beside the workers' share of occupied time."""
    busy, occupied = summary.get("gpu_busy_fraction"), summary.get("workers_busy_fraction")
    workers = f"workers occupied {occupied:.0%}" if occupied is not None else ""
    if busy is None:
        return "n/a: no measurement reported its GPU time" + (f" ({workers})" if workers else "")
    missing = summary.get("gpu_time_missing") or 0
    text = (f"≥ {busy:.0%}" if missing else f"{busy:.0%}") + f" ({summary['gpu_s']:.3g} s running the configs"
    text += f"; {missing} measurements reported no GPU time" if missing else ""
    return text + (f"; {workers})" if workers else ")")


def _time_in_text(summary: dict[str, Any]) -> str:
    """The summary's "time in" row: compile, check (by stage) and timing, in seconds and as shares (see
    `time_split`)."""
    phases, share = summary["phases_s"], summary.get("phases_share") or {}
    threads = summary.get("compile_threads")
    compile_share = f" ({share['compile']:.0%} of {threads} threads)" if "compile" in share else ""
    parts = [f"compile {human_seconds(phases['compile'])}{compile_share}"]
    if "check" in share:
        stages = ", ".join(f"{k} {human_seconds(phases[k])}" for k in CHECK_PHASES if k in phases)
        check = sum(phases.get(k, 0.0) for k in CHECK_PHASES)
        parts.append(f"check {human_seconds(check)} ({share['check']:.0%} of the GPU window: {stages})")
        parts.append(f"timing {human_seconds(phases.get('timing', 0.0))} ({share['timing']:.0%})")
    else:
        parts.append("check and timing n/a (the evaluator reported no stages)")
    return " · ".join(parts)


def problems_table(out: dict[str, Any], unit: str, kernel: str) -> None:
    """The end of a study over several problems (`tuner.study.shapes.run_problems`'s result): a row per problem
    (its best in the family's unit and, for a memory-bound family, its share of the GPU worker's copy ceiling,
    its trials, its wall, how many first configs came from other problems' studies), printed to stderr."""
    from rich.console import Console
    from rich.table import Table

    rows = out["problems"]
    table = Table(title=f"{kernel}: {len(rows)} problems in {human_seconds(out['command_wall_s'])}")
    table.add_column("problem", no_wrap=True)
    table.add_column("sizes", no_wrap=True)
    table.add_column("best", justify="right", no_wrap=True)
    table.add_column("× ceiling", justify="right")
    for name in ("trials", "wall", "from others"):
        table.add_column(name, justify="right")
    for row in rows:
        best = row["best"] or {}
        figure = _best_figure(unit, best) if best else "-"
        share = row["fraction_of_ceiling"]
        table.add_row(
            row["problem"],
            " ".join(f"{k}={v}" for k, v in row["sizes"].items()),
            figure,
            f"{share:.3f}" if share is not None and unit == "TB/s" else "-",
            str(row["trials"]),
            "complete before" if row["complete_before_run"] else human_seconds(row["wall_s"]),
            str(row["first_from_other_problems"] + row.get("taken_from_other_problems", 0)),
        )
    Console(stderr=True).print(table)


# ---------------------------------------------------------------------------------------------------------------
# the summary's figures from other processes


def writer_summary(stats: dict[str, Any]) -> dict[str, Any]:
    """The writer process's timings (`_writer_main`) in seconds from the command's start, with its cost per trial
    written."""
    out = stamps_from_command({k: v for k, v in stats.items() if k.endswith("_at")})
    out["trials_written"] = stats["trials"]
    out["ms_per_trial"] = round(1000 * stats["write_s"] / stats["trials"], 2) if stats["trials"] else None
    return out


def stamps_from_command(stamps: dict[str, Any]) -> dict[str, Any]:
    """Another process's "<stage>_at" `perf_counter` stamps as "<stage>_s" from the command's start
    (`tuner.gpu.clock`); other entries as they are."""
    return {
        (k.removesuffix("_at") + "_s" if k.endswith("_at") else k): (since_command(v) if k.endswith("_at") else v)
        for k, v in stamps.items()
    }


def worker_startup(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """The first GPU worker's own start-up stages (context, CuPy warm-up, ceiling: measured or cached)."""
    stages = gpus[0].get("startup") if gpus else None
    if not stages:
        return {}
    # "<stage>_at": the worker's perf_counter stamps (`tuner.gpu.clock`) → "<stage>_s" from the command
    return {"gpu_worker": stamps_from_command(stages)}
