"""The Pareto plot: throughput against registers/thread and SMEM/block, with the occupancy budgets of the GPU
the study ran on (its stored "gpu_facts"; H100/H200 figures for studies recorded before they were stored).
"""

from __future__ import annotations

import base64
import io
import math
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from tuner.build.files import atomic_write, check_writable
from tuner.core.gpufacts import DEFAULT, GpuFacts
from tuner.expr.ops import ceil_div
from tuner.results.studies import gpu_facts, pareto_trials, threads
from tuner.results.tables import pareto_frame
from tuner.store.schema import goal, measured_trials, objective_value, throughput_unit

MAX_REGISTERS_PER_THREAD = 255
REGISTER_ALLOCATION_UNIT = 8  # registers per thread are allocated in steps of 8 (256 per warp)
RESIDENT_BLOCKS = (1, 2, 4, 8)
TYPICAL_THREADS = 256


# The Pareto plot


def register_budget(threads: int, blocks: int, facts: GpuFacts = DEFAULT) -> int:
    """The most registers per thread that let `blocks` blocks of `threads` threads reside on one SM (the GPU's
    registers per SM, allocated per warp in steps of 8 per thread), capped at 255."""
    warps = ceil_div(threads, 32)
    per_thread = facts.regs_per_sm // (blocks * warps * 32)
    return min(MAX_REGISTERS_PER_THREAD, per_thread // REGISTER_ALLOCATION_UNIT * REGISTER_ALLOCATION_UNIT)


def smem_budget(blocks: int, facts: GpuFacts = DEFAULT) -> int:
    """The most SMEM bytes per block that let `blocks` blocks reside on one SM (the GPU's SMEM per SM, part of
    it reserved per block, at most its opt-in limit per block)."""
    return min(facts.smem_per_block_max, facts.smem_per_sm // blocks - facts.smem_reserved_per_block)


def plot_pareto(study: optuna.Study, path: str | Path) -> Path:
    """Draw throughput against registers/thread and against SMEM bytes/block (each colored by the other), every
    measured original trial as a dot and the Pareto trials ringed, with dashed lines at the register and SMEM
    budgets that allow 1, 2, 4 and 8 resident blocks per SM on the study's GPU (`studies.gpu_facts`). The
    register budget depends on the block size: the lines are drawn for the fastest config's threads per
    block (its derived "threads"; 256 where the study did not record it), which the panel title states. Budgets
    far right of the data are listed in the panel instead of stretching its axis.

    Writes a PNG, or for ``.html`` a small page with the PNG inline (base64) and the Pareto table.
    """
    path = check_writable(path, (".png", ".html"), "--plot")
    png = _pareto_png(study)
    if path.suffix.lower() == ".png":
        return atomic_write(path, png)
    table = pareto_frame(study).to_html(index=False, float_format=lambda x: f"{x:.4g}", border=0)
    title = f"{study.study_name}: Pareto front"
    page = (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f"<title>{_html_escape(title)}</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:12px}"
        "td,th{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}</style></head><body>\n"
        f"<h1>{_html_escape(title)}</h1>\n"
        f'<img alt="Pareto plot" src="data:image/png;base64,{base64.b64encode(png).decode()}">\n'
        f"{table}\n</body></html>\n"
    )
    return atomic_write(path, page)


def _html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


@dataclass
class _Panel:
    """One panel of the Pareto plot: a resource on x, the objective on y, coloured by the other resource."""

    xs: list[float]  # the resource of every measured trial
    xs_front: list[float]  # ... of the Pareto trials
    colors: list[float]  # the other resource, of every measured trial
    color_label: str
    xlabel: str
    budgets: list[tuple[int, float]]  # (blocks per SM, the most of the resource that lets that many reside)
    note: str  # the panel's title: what its budget lines are
    budget_unit: str  # how an off-scale budget is written


def _pareto_png(study: optuna.Study) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    trials = measured_trials(study)
    front = pareto_trials(study)
    unit = throughput_unit(study)
    fastest = front[0]
    target = goal(study)

    def ys(ts: list[FrozenTrial]) -> list[float]:
        return [v if (v := objective_value(study, t, target)) is not None else math.nan for t in ts]

    fig = Figure(figsize=(13, 5.2), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    ceiling = fastest.user_attrs.get("ceiling_tbps") if unit == "TB/s" and target.unit == "TB/s" else None
    ylabel = f"{target.label} ({target.unit})" if target.unit else target.label
    y_all, y_front = ys(trials), ys(front)
    for ax, panel in zip(axes, _panels(study, trials, front, fastest), strict=True):
        _draw_panel(fig, ax, panel, y_all, y_front, ceiling, ylabel)
    gpu = study.user_attrs.get("gpu", "")
    fig.suptitle(
        f"{study.study_name} — {len(trials)} measured configs, {gpu}; best "
        f"{fastest.user_attrs.get('uri', '')} {target.format(objective_value(study, fastest, target))}",
        fontsize=11,
    )
    return png_bytes(fig)


def _panels(study: optuna.Study, trials: list[FrozenTrial], front: list[FrozenTrial], fastest: FrozenTrial):
    """The registers panel and the SMEM panel, with the budgets of the study's GPU (`studies.gpu_facts`); the
    register budgets are for the fastest config's threads per block."""
    facts = gpu_facts(study)
    block_threads = threads(fastest) or TYPICAL_THREADS
    threads_note = "the fastest config's" if threads(fastest) else "typical; not recorded"

    def column(ts: list[FrozenTrial], key: str) -> list[float]:
        return [float(t.user_attrs.get(key) or 0) for t in ts]

    regs, smem = column(trials, "registers"), column(trials, "smem_bytes")
    smem_kib = [v / 1024 for v in smem]
    registers = _Panel(
        regs,
        column(front, "registers"),
        smem_kib,
        "SMEM KiB/block",
        "registers / thread",
        [(k, register_budget(block_threads, k, facts)) for k in RESIDENT_BLOCKS],
        f"lines: registers for 1/2/4/8 blocks/SM at {block_threads} threads/block ({threads_note})",
        "",
    )
    shared = _Panel(
        smem_kib,
        [v / 1024 for v in column(front, "smem_bytes")],
        regs,
        "registers/thread",
        "SMEM KiB / block",
        [(k, smem_budget(k, facts) / 1024) for k in RESIDENT_BLOCKS],
        f"lines: SMEM/block for 1/2/4/8 blocks/SM ({facts.smem_per_sm // 1024} KiB/SM, "
        f"{facts.smem_reserved_per_block} B reserved/block{'' if facts.measured else ', H100/H200 figures'})",
        " KiB",
    )
    return [registers, shared]


def _draw_panel(fig, ax, panel: _Panel, y_all: list[float], y_front: list[float], ceiling, ylabel: str) -> None:
    """Every measured trial as a dot, the front ringed, a dashed line at each budget that fits the axis (the
    others listed in the title), and the copy ceiling where the objective is the throughput it bounds."""
    points = ax.scatter(panel.xs, y_all, c=panel.colors, cmap="viridis", s=28, alpha=0.85, linewidths=0, zorder=2)
    fig.colorbar(points, ax=ax, label=panel.color_label, pad=0.01)
    ax.scatter(
        panel.xs_front,
        y_front,
        s=130,
        facecolors="none",
        edgecolors="crimson",
        linewidths=1.8,
        zorder=3,
        label=f"Pareto front ({len(y_front)})",
    )
    hi = max(max(panel.xs, default=0.0) * 1.25, min(b for _, b in panel.budgets) * 1.1, 1.0)
    note = panel.note
    off_scale = _budget_lines(ax, panel, hi)
    if off_scale:
        note += "\noff scale: " + ", ".join(off_scale)
    if ceiling:
        ax.axhline(
            float(ceiling),
            color="tab:orange",
            linestyle=":",
            linewidth=1.2,
            label=f"copy ceiling {float(ceiling):.2f} TB/s",
        )
    ax.set_xlim(0, hi)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(note, fontsize=9)
    ax.grid(alpha=0.25)
    ax.legend(loc="best", fontsize=8, framealpha=0.85)


def _budget_lines(ax, panel: _Panel, hi: float) -> list[str]:
    """Draw the panel's budgets up to `hi` as labelled dashed lines; the ones beyond it, as words."""
    off_scale = []
    for k, budget in panel.budgets:
        if budget <= hi:
            ax.axvline(budget, color="0.45", linestyle="--", linewidth=1, zorder=1)
            ax.annotate(
                f"{k} blk/SM",
                (budget, 1.0),
                xycoords=("data", "axes fraction"),
                rotation=90,
                ha="right",
                va="top",
                fontsize=8,
                color="0.3",
            )
        else:
            off_scale.append(f"{k} blk ≤ {budget:g}{panel.budget_unit}")
    return off_scale


def png_bytes(fig) -> bytes:
    """A matplotlib figure as PNG bytes, its layout tightened first. A figure that pyplot manages (explain's
    roofline, the lessons' plots) is closed afterwards, so repeated plots do not pile up in pyplot's registry."""
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    if getattr(fig.canvas, "manager", None) is not None:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return buf.getvalue()
