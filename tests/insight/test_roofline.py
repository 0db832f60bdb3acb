"""The roofline and memory plots (`tuner.insight.roofline`): a PNG and its HTML page, a trial without FP32 work drawn
against the memory roof, configs with and without flops side by side (captures: tests/data/ncu/)."""

from __future__ import annotations

import pytest

from tests.insight.captures import CEILING, CHAIN_MIN, COPY_MIN, GEMM_MIN, PEAK, STUDY, explained, load
from tuner.cli.main import main
from tuner.insight.roofline import roofline_figure, roofline_html, roofline_png


def test_roofline_png_and_html():
    points = [explained("fusion-fusion3.csv", CHAIN_MIN, 16), explained("coalescing-stride8.csv", COPY_MIN)]
    png = roofline_png(points, CEILING, PEAK, "t")
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    page = roofline_html(png, points, "t")
    assert "data:image/png;base64," in page and "coalescing-stride8.csv" in page and "HBM bandwidth" in page


def _bars(ax) -> dict[str, list[float]]:
    """Each labelled bar series of a panel: its label → the bars' widths (horizontal bars)."""
    return {c.get_label(): [bar.get_width() for bar in c] for c in ax.containers}


def test_the_plot_of_a_trial_without_flops_draws_what_bounds_it(study_db, tmp_path, capsys, monkeypatch):
    """A transpose does no FP32 work, so it has no place on a roofline; the plot draws its bytes against the
    memory roof (the TB/s the study measured, the DRAM TB/s under ncu, the copy ceiling) and its memory units'
    throughput from the profile stored on the study, and `tuner explain --plot` writes it without ncu."""
    import optuna

    from tuner.insight.explain import explain_study
    from tuner.insight.roofline import roofline_figure
    from tuner.results import export

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{study_db}")
    device = {"gpu": "NVIDIA H200", "sm_count": 132, "sm_clock_mhz": 1980, "cc": "9.0"}
    for number, capture in ((36, "bank-conflicts-pad0_vec1.csv"), (37, "bank-conflicts-pad1_vec1.csv")):
        record = {"uri": f"trial{number}", "profile": load(capture).to_dict(), "device": device}
        study.set_user_attr(f"ncu:{number}", record)
    monkeypatch.setenv("PATH", str(tmp_path))  # ncu absent: the stored profiles serve
    explained = explain_study(export.open_study(str(study_db)), trials=[36, 37])
    points = [x.explanation for x in explained]
    assert all(p.flops == 0 for p in points)
    trials = {t.number: t for t in study.trials}
    ceiling = trials[36].user_attrs["ceiling_tbps"]

    fig = roofline_figure(points, ceiling, PEAK, "t")
    memory, units = fig.axes  # no roofline panel: nothing to place on it
    bars = _bars(memory)
    assert bars["measured: useful bytes / median time"] == pytest.approx(
        [trials[36].user_attrs["tbps"], trials[37].user_attrs["tbps"]]
    )
    assert bars["DRAM under ncu: bytes moved / kernel time"] == pytest.approx([p.dram_tbps for p in points])
    assert all(0 < width < 5 for widths in bars.values() for width in widths)
    (roof,) = [line for line in memory.lines if line.get_label().startswith("memory roof")]
    assert roof.get_xdata()[0] == pytest.approx(ceiling)
    shares = _bars(units)
    assert shares["DRAM: % of the copy ceiling"] == pytest.approx([100 * p.of_ceiling for p in points])
    assert shares["L2: % of peak (ncu)"] == pytest.approx([p.lts_pct for p in points])
    assert shares["L1 / shared memory: % of peak (ncu)"] == pytest.approx([p.l1tex_pct for p in points])
    assert [t.get_text() for t in memory.get_yticklabels()] == [f"{p.label}\n({p.bound})" for p in points]

    plot = tmp_path / "r.png"
    assert main(["explain", str(study_db), "--trial", "36", "--trial", "37", "--plot", str(plot)]) == 0
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_a_plot_of_configs_with_and_without_flops_has_both_views():
    gemm = explained("registers-lb2.csv", GEMM_MIN, label="gemm")
    copy = explained("coalescing-stride8.csv", COPY_MIN, label="copy")
    fig = roofline_figure([gemm, copy], CEILING, PEAK, "t")
    roofline, memory, units = fig.axes
    assert [list(c.get_offsets()[0]) for c in roofline.collections] == [
        pytest.approx([gemm.arithmetic_intensity, gemm.tflops])
    ]
    assert _bars(memory)["DRAM under ncu: bytes moved / kernel time"] == pytest.approx([copy.dram_tbps])
    assert "measured: useful bytes / median time" not in _bars(memory)  # a capture alone: nothing measured
