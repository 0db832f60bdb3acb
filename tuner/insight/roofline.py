"""The roofline of explained configs: where each sits against the GPU's measured copy ceiling and its FP32 peak,
as a PNG (matplotlib), an HTML page around it, or both written beside each other (`write_roofline`).
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuner.insight.explain import HBM_BOUND, UNIT_BOUND, Explanation, known


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

    placed = [p for p in points if p.flops > 0 and known(p.arithmetic_intensity) and p.arithmetic_intensity > 0]
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
            if known(value):
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
    return format(value, spec) if known(value) else ""


def write_roofline(
    path: str | Path, points: Sequence[Explanation], ceiling_tbps: float, peak_tflops: float | None, title: str
) -> list[Path]:
    """Write the roofline as `path` (.png) and the same name with .html; atomically. Returns both paths."""
    from tuner.results.export import atomic_write

    path = Path(path)
    png = roofline_png(points, ceiling_tbps, peak_tflops, title)
    html_path = path.with_suffix(".html")
    return [atomic_write(path, png), atomic_write(html_path, roofline_html(png, points, title))]
