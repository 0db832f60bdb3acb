"""The ncu raw-CSV parser, the verdict rules, `compare`, the roofline and lesson plots, the lessons' predictions
and the bad-input paths of `tuner explain` / `tuner lesson`, all on the CPU (fixtures: tests/data/ncu/)."""

from __future__ import annotations

import math
import os
import re
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from tuner.cli.main import main
from tuner.errors import InputError
from tuner.insight import lesson
from tuner.insight.explain import Explanation, compare, explain
from tuner.insight.ncu import (
    METRICS,
    PROFILE_FORMAT,
    NcuConfigError,
    NcuError,
    Profile,
    device_facts_from_csv,
    kernel_regex,
    ncu_command,
    parse_raw_csv,
    target_command,
)
from tuner.insight.roofline import roofline_figure, roofline_html, roofline_png

DATA = Path(__file__).resolve().parents[1] / "data" / "ncu"
CEILING = 4.26  # the copy ceiling the H200 lessons measured beside these captures
PEAK = 66.9
STUDY = "transpose-n16384_float32-NVIDIA_H200"


def load(name: str) -> Profile:
    return parse_raw_csv((DATA / name).read_text(), where=name)


def explained(name: str, minimal: float, access: int = 4, label: str | None = None) -> Explanation:
    return explain(load(name), label or name, minimal, ceiling_tbps=CEILING, peak_tflops=PEAK, access_bytes=access)


COPY_MIN = 2 * 67108864 * 4
TRANSPOSE_MIN = 2 * 16384 * 16384 * 4
CHAIN_MIN = (2 * 32768 * 8192 + 8192) * 2
GEMM_MIN = 4 * (3 * 4096 * 4096 + 4096 + 4096 * 4096)


# -- parser (real captures: ncu 2025.3.1 on an H200) -------------------------------------------------------------


def test_parser_reads_a_real_capture_in_its_units():
    p = load("coalescing-stride8.csv")
    assert len(p.kernels) == 1 and p.missing == ()
    k = p.kernels[0]
    assert k.kernel == "copy_stride8_vec1_block256_items4" and k.block == "(256, 1, 1)"
    assert set(k.values) == set(METRICS)  # only the requested metrics, every one of them
    assert k.values["gpu__time_duration.sum"] == pytest.approx(552_672e-9)  # "552,672" in unit "ns"
    assert k.values["dram__bytes_read.sum"] == 2_147_521_280  # "2,147,521,280" byte
    assert k.values["smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.pct"] == 12.5  # "%"
    assert k.values["launch__registers_per_thread"] == 18  # "register/thread"


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.csv")))
def test_every_capture_reports_every_metric(name):
    p = load(name)
    assert p.missing == () and all(set(k.values) == set(METRICS) for k in p.kernels)
    assert 1e-5 < p.total("gpu__time_duration.sum") < 1.0  # seconds, not ns (the spilling GEMM takes 0.14 s)


def test_parser_scales_units_and_reports_missing_metrics():
    text = (
        'noise\n"ID","Kernel Name","dram__bytes_read.sum","gpu__time_duration.sum","lts__t_sector_hit_rate.pct"\n'
        '"","","Mbyte","usecond","%"\n"0","k","1,024.5","2.5","n/a"\n'
    )
    p = parse_raw_csv(text)
    assert p.kernels[0].values == {
        "dram__bytes_read.sum": pytest.approx(1.0245e9),
        "gpu__time_duration.sum": pytest.approx(2.5e-6),
    }
    assert "dram__bytes_write.sum" in p.missing and "lts__t_sector_hit_rate.pct" in p.missing
    e = explain(p, "k", 1e9)
    last = e.findings[-1]
    assert last.startswith("not measured (ncu gave no value): ") and "lts__t_sector_hit_rate.pct" in last


def test_parser_sums_and_weights_over_launches():
    p = load("fusion-fusion1.csv")
    assert [k.kernel.rsplit("_", 1)[-1] for k in p.kernels] == ["mathtanh", "gelu", "scale"]
    times = [k.values["gpu__time_duration.sum"] for k in p.kernels]
    assert p.total("gpu__time_duration.sum") == pytest.approx(sum(times)) == pytest.approx(787_968e-9)
    hits = [k.values["lts__t_sector_hit_rate.pct"] for k in p.kernels]
    assert min(hits) <= p.weighted("lts__t_sector_hit_rate.pct") <= max(hits)
    assert Profile.from_dict(p.to_dict()) == p and p.to_dict()["format"] == PROFILE_FORMAT


@pytest.mark.parametrize(
    "text, fault",
    [
        ("==ERROR== ERR_NVGPUCTRPERM\n", "no ncu raw CSV table"),
        ('"ID","Kernel Name","x"\n"","",""\n', "profiled no kernel"),
        ('"ID","Kernel Name","x"\n"0","k","1"\n"1","k","2"\n', "not a row of units"),
        ('"ID","Kernel Name","x"\n"","","byte"\n"0","k"\n', "a row has 2 fields"),
        (
            '"ID","Kernel Name","gpu__time_duration.sum"\n"","","cycle"\n"0","k","5"\n',
            "metric gpu__time_duration.sum comes in unit 'cycle', expected a time unit",
        ),
        (
            '"ID","Kernel Name","dram__bytes_read.sum"\n"","","furlong"\n"0","k","5"\n',
            "comes in unit 'furlong', expected a bytes unit",
        ),
    ],
)
def test_parser_bad_input_is_one_line(text, fault):
    with pytest.raises(NcuError, match=fault) as info:
        parse_raw_csv(text, where="capture.csv")
    assert str(info.value).startswith("capture.csv: ") and "\n" not in str(info.value)


def test_device_facts_from_a_capture():
    facts = device_facts_from_csv((DATA / "fusion-fusion3.csv").read_text())
    assert facts == {"gpu": "NVIDIA H200", "sm_count": 132, "sm_clock_mhz": 1980, "cc": "9.0"}
    assert device_facts_from_csv("nothing") == {}


def test_ncu_command_profiles_the_second_call_only():
    target = target_command("copy", "n64M", {"stride": 8, "vec": 1})
    assert target[1:] == ["-m", "tuner.insight.ncu", "copy", "--problem", "n64M", "--set", "stride=8", "--set", "vec=1"]
    assert "--outside-space" in target_command("gemm", "mnk4096", {"min_blocks": 8}, outside_space=True)
    argv = ncu_command(target, "elementwise_fuse1_vec8", 3, "/tmp/x.csv")
    joined = " ".join(argv)
    assert "--clock-control none" in joined and "--csv --page raw --print-units base" in joined
    assert argv[argv.index("--launch-skip") + 1] == "3" and argv[argv.index("--launch-count") + 1] == "3"
    assert argv[argv.index("--metrics") + 1] == ",".join(METRICS)
    assert argv[-len(target) :] == target
    import re

    pattern = kernel_regex("elementwise_fuse1_vec8").removeprefix("regex:")
    assert re.match(pattern, "elementwise_fuse1_vec8_gelu") and re.match(pattern, "elementwise_fuse1_vec8")
    assert not re.match(pattern, "elementwise_fuse1_vec81")


def test_profile_target_takes_a_lessons_value_outside_the_space(capsys):
    from tuner.insight.ncu import _target_main, widen
    from tuner.space import space as space_mod

    # Without --outside-space the shipped GEMM space refuses min_blocks=8: the target exits 2 before the GPU.
    assert _target_main(["gemm", "--set", "min_blocks=8"]) == 2
    assert "min_blocks=8: value outside the space" in capsys.readouterr().err
    space = widen(space_mod.load("gemm"), ["min_blocks=8", "nope=1", "pad=[1]"])
    assert space.config_from_assignments(["min_blocks=8"])["min_blocks"] == 8
    with pytest.raises(InputError, match="constraint failed"):  # the constraints still hold
        widen(space, ["min_blocks=16"]).config_from_assignments(["min_blocks=16"])


# -- verdicts (pinned on the H200 captures) ------------------------------------------------------------------------


def test_verdict_strided_copy_is_uncoalesced_and_hbm_bound():
    e = explained("coalescing-stride8.csv", COPY_MIN)
    assert e.bound == "HBM bandwidth" and e.of_ceiling > 0.95
    assert e.ld_sectors_per_request == pytest.approx(32) and e.ideal_sectors_per_request == 4
    assert e.useful_fraction == pytest.approx(0.223, abs=0.001)
    assert any(f.startswith("uncoalesced loads: 32.0 sectors per request (ideal 4), 12% of") for f in e.findings)
    assert not any(f.startswith(("shared-memory", "spills", "DRAM over-fetch")) for f in e.findings)
    far = explained("coalescing-stride32.csv", COPY_MIN)  # one lone sector per load: DRAM reads 64 bytes for it
    assert any(f.startswith("DRAM over-fetch: 64 bytes read from DRAM per 32-byte sector") for f in far.findings)
    coalesced = explained("coalescing-stride1.csv", COPY_MIN)
    assert coalesced.bound == "HBM bandwidth" and coalesced.findings[1:3] == [
        "moves 0.512 GB through DRAM for 0.537 GB of useful data: useful fraction 1.05",
        "occupancy: 81% achieved of 100% theoretical, 16 registers/thread",
    ]


def test_verdict_unpadded_transpose_is_bank_conflicted():
    e = explained("bank-conflicts-pad0_vec1.csv", TRANSPOSE_MIN)
    assert e.bound == "L1 / shared memory" and e.of_ceiling < 0.5
    assert e.smem_ld_ways == pytest.approx(32.1, abs=0.05) and e.smem_st_ways < 1.1
    assert any(f.startswith("shared-memory bank conflicts: 32.1-way on loads (261 M") for f in e.findings)
    assert not any(f.startswith("uncoalesced") for f in e.findings)
    padded = explained("bank-conflicts-pad1_vec1.csv", TRANSPOSE_MIN)
    assert padded.bound == "HBM bandwidth" and not any("bank conflicts" in f for f in padded.findings)


def test_verdict_spilling_gemm_names_the_spills():
    # GEMM 4096³ under __launch_bounds__(256, 8): 32 registers/thread, 674 GB of spill traffic keep the L2 73%
    # busy; the bound is the spills, not the L2, and DRAM bytes per load sector are not called over-fetch.
    e = explained("registers-lb8.csv", GEMM_MIN, access=16)
    assert e.local_bytes == pytest.approx(674e9, rel=1e-3)
    assert e.bound == "local memory (spills)"
    assert e.findings[0] == "bound: local memory (spills) (DRAM 2.94 TB/s = 69% of the 4.26 TB/s copy ceiling)"
    assert any(f.startswith("spills: 674 GB of local-memory traffic at 32 registers/thread") for f in e.findings)
    assert not any(f.startswith(("DRAM over-fetch", "bound: L2")) for f in e.findings)
    assert e.flops == pytest.approx(2 * 4096**3, rel=5e-3)


def test_verdict_gemm_that_spills_a_little_stays_compute_bound():
    # __launch_bounds__(256, 2): 128 registers/thread, 0.54 GB of spills, the FMA pipe 72% busy.
    e = explained("registers-lb2.csv", GEMM_MIN, access=16)
    assert e.bound == "compute (FP32)"
    assert any(f.startswith("spills: 0.537 GB of local-memory traffic at 128 registers/thread") for f in e.findings)


def test_verdict_fused_chain_is_hbm_bound_near_the_ceiling():
    e = explained("fusion-fusion3.csv", CHAIN_MIN, access=16)
    assert e.bound == "HBM bandwidth" and e.of_ceiling > 0.9
    assert e.useful_fraction == pytest.approx(1.02, abs=0.01)
    assert e.findings[0] == "bound: HBM bandwidth (DRAM 4.03 TB/s = 95% of the 4.26 TB/s copy ceiling)"
    assert not any(f.startswith(("uncoalesced", "shared-memory", "spills", "DRAM over-fetch")) for f in e.findings)


def test_bound_falls_back_to_latency_when_nothing_is_busy():
    p = load("coalescing-stride8.csv")
    quiet = {
        **p.kernels[0].values,
        "dram__bytes_read.sum": 1e6,
        "dram__bytes_write.sum": 1e6,
        "lts__throughput.avg.pct_of_peak_sustained_elapsed": 5.0,
    }
    e = explain(Profile(kernels=(type(p.kernels[0])("k", "", "", quiet),)), "k", 2e6, CEILING, PEAK)
    assert e.bound == "latency / occupancy"


def test_compare_names_the_cause():
    fused = explained("fusion-fusion3.csv", CHAIN_MIN, 16, "fusion 3")
    unfused = explained("fusion-fusion1.csv", CHAIN_MIN, 16, "fusion 1")
    assert compare(fused, unfused) == [
        "fusion 1 takes 3.03× the time of fusion 3 (0.788 ms vs 0.26 ms)",
        "fusion 1 moves 3.00× the DRAM bytes: 3 kernels, each a DRAM round trip, vs 1",
    ]
    s1 = explained("coalescing-stride1.csv", COPY_MIN, label="stride 1")
    s8 = explained("coalescing-stride8.csv", COPY_MIN, label="stride 8")
    s32 = explained("coalescing-stride32.csv", COPY_MIN, label="stride 32")
    assert compare(s1, s8)[1] == "stride 8 moves 4.70× the DRAM bytes: 32.0 sectors per request on the loads vs 4.0"
    assert compare(s32, s8)[1] == (
        "stride 32 moves 1.89× the DRAM bytes: DRAM reads 64 bytes per 32-byte sector loaded vs 32"
    )


def test_compare_bank_conflicts_when_bytes_match():
    conflicted = explained("bank-conflicts-pad0_vec1.csv", TRANSPOSE_MIN, label="pad 0")
    padded = explained("bank-conflicts-pad1_vec1.csv", TRANSPOSE_MIN, label="pad 1")
    assert compare(padded, conflicted) == [
        "pad 0 takes 2.13× the time of pad 1 (1.23 ms vs 0.577 ms)",
        "the same DRAM bytes (1.00×), but pad 0's shared loads are 32.1-way bank-conflicted vs 1.0-way",
    ]


# -- plots ----------------------------------------------------------------------------------------------------------


def test_roofline_png_and_html():
    points = [explained("fusion-fusion3.csv", CHAIN_MIN, 16), explained("coalescing-stride8.csv", COPY_MIN)]
    png = roofline_png(points, CEILING, PEAK, "t")
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    page = roofline_html(png, points, "t")
    assert "data:image/png;base64," in page and "coalescing-stride8.csv" in page and "HBM bandwidth" in page


@pytest.mark.parametrize("name", ["coalescing", "registers", "fusion", "bank-conflicts"])
def test_lesson_png(name):
    rows = {
        "coalescing": [
            lesson.Row(f"s{s}", {"stride": s}, {"lesson": 1 / s, "sector_model": 0.5}, {"fraction_of_ceiling": 0.9 / s})
            for s in (1, 2, 4)
        ],
        "registers": [
            lesson.Row(
                f"n{n}",
                {"min_blocks": n},
                {"register_cap": 255 - n},
                {"registers": 100, "spill_bytes": 8 * n, "median_ms": 3.0 + n},
            )
            for n in range(3)
        ],
        "fusion": [
            lesson.Row(f"f{d}", {"fusion": d}, {"time_vs_fused": 3 / d}, {"median_ms": 0.25 * 3 / d}) for d in (1, 2, 3)
        ],
        "bank-conflicts": [
            lesson.Row("a", {}, {"read_ways": 32}, {"median_ms": 1.2}),
            lesson.Row("b", {}, {"read_ways": 1}, {}),
        ],
    }[name]
    png = lesson.lesson_png(lesson.LessonResult(name, "title", rows))
    assert png.startswith(b"\x89PNG")


# -- the lessons' predictions ------------------------------------------------------------------------------------------


def test_copy_predictions():
    assert [lesson.lesson_copy_fraction(s) for s in (1, 8, 32, 64)] == [1, 1 / 8, 1 / 32, 1 / 32]
    assert [lesson.copy_sectors_per_request(s) for s in (1, 2, 4, 8, 16, 32)] == [4, 8, 16, 32, 32, 32]
    assert lesson.sector_copy_fraction(1) == 1.0
    assert lesson.sector_copy_fraction(8) == lesson.sector_copy_fraction(32) == pytest.approx(2 / 9)


def test_transpose_bank_model_matches_the_lesson_and_the_space_comment():
    assert lesson.transpose_read_ways(32, 1, 8, 0) == 32  # float tile[32][32]: a column is one bank
    assert lesson.transpose_read_ways(32, 1, 8, 1) == 1  # [32][33]: conflict-free
    assert lesson.transpose_read_ways(32, 4, 8, 0) == 8  # the space: "pad 0 is 8-way conflicted" at vec 4
    assert lesson.transpose_read_ways(32, 4, 8, 1) == 1


def test_register_cap_and_fusion_kernels():
    assert [lesson.register_cap(256, n) for n in range(9)] == [255, 255, 128, 80, 64, 48, 40, 32, 32]
    assert [lesson.fusion_kernels(d) for d in (1, 2, 3)] == [3, 2, 1]


def test_registers_lesson_compiles_without_a_gpu(tmp_path, capsys):
    assert main(["lesson", "registers", "--compile-only", "--out", str(tmp_path)]) == 0
    import json

    data = json.loads((tmp_path / "registers.json").read_text())
    by_n = {r["params"]["min_blocks"]: r for r in data["rows"]}
    assert by_n[2]["measured"]["spill_bytes"] == 0 and by_n[8]["measured"]["spill_bytes"] > 0
    assert all(r["measured"]["registers"] <= r["predicted"]["register_cap"] for r in data["rows"])
    assert (tmp_path / "registers.png").read_bytes().startswith(b"\x89PNG")


# -- bad input ------------------------------------------------------------------------------------------------------


@pytest.fixture
def study_db(tmp_path):
    db = tmp_path / "t.db"
    src = sqlite3.connect(f"file:{DATA.parent / 'transpose_h200.db'}?mode=ro", uri=True)
    src.backup(sqlite3.connect(db))
    return db


def _one_line_exit_2(capsys, argv, fault):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fault in err, err


def _no_ncu_attrs(db):
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db}")
    return not any(k.startswith("ncu:") for k in study.user_attrs)


def test_explain_without_ncu_is_one_line_and_writes_nothing(study_db, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu anywhere
    monkeypatch.delenv("TUNER_NCU", raising=False)
    plot = tmp_path / "r.png"
    _one_line_exit_2(capsys, ["explain", str(study_db), "--best", "--plot", str(plot)], "ncu not found")
    assert not plot.exists() and _no_ncu_attrs(study_db)


def test_explain_unknown_and_unmeasured_trials(study_db, capsys):
    _one_line_exit_2(capsys, ["explain", str(study_db), "--trial", "9999"], "no trial 9999")
    _one_line_exit_2(capsys, ["explain", str(study_db), "--trial", "-1"], "trial numbers are ≥ 0")


def test_explain_fake_ncu_not_permitted_and_timeout(study_db, tmp_path, capsys, monkeypatch):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM - The user does not have permission'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TUNER_NCU", str(fake))
    _one_line_exit_2(capsys, ["explain", str(study_db), "--best"], "not permitted")
    fake.write_text("#!/bin/sh\nsleep 5\n")
    _one_line_exit_2(capsys, ["explain", str(study_db), "--best", "--timeout", "0.5"], "did not finish within 0.5 s")
    assert _no_ncu_attrs(study_db)


def test_explain_config_that_no_longer_renders(study_db, capsys, monkeypatch):
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{study_db}")
    study.set_user_attr("space_hash", "0" * 64)  # the space file "changed" since the study ran
    monkeypatch.setenv("TUNER_NCU", shutil.which("true") or "/bin/true")
    _one_line_exit_2(capsys, ["explain", str(study_db), "--best"], "changed since the study ran")
    assert _no_ncu_attrs(study_db)


def test_explain_uses_the_profile_stored_on_the_study(study_db, tmp_path, capsys, monkeypatch):
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{study_db}")
    record = {
        "uri": "transpose_tile32_rpt1_pad0_vec1",
        "profile": load("bank-conflicts-pad0_vec1.csv").to_dict(),
        "device": {"gpu": "NVIDIA H200", "sm_count": 132, "sm_clock_mhz": 1980, "cc": "9.0"},
    }
    study.set_user_attr("ncu:36", record)
    monkeypatch.setenv("PATH", str(tmp_path))  # ncu absent: must not be needed
    plot = tmp_path / "r.png"
    assert main(["explain", str(study_db), "--trial", "36", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "profile from the study" in out and "32.1-way on loads" in out
    assert plot.read_bytes().startswith(b"\x89PNG") and "transpose" in plot.with_suffix(".html").read_text()


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


def test_explain_profiles_again_a_record_of_the_old_format(study_db, tmp_path, capsys, monkeypatch):
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{study_db}")
    old = load("bank-conflicts-pad0_vec1.csv").to_dict()
    del old["format"]  # read before the units row was honoured: its time is ns taken for seconds
    study.set_user_attr("ncu:36", {"uri": "transpose_tile32_rpt1_pad0_vec1", "profile": old, "device": {}})
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("TUNER_NCU", raising=False)
    _one_line_exit_2(capsys, ["explain", str(study_db), "--trial", "36"], "ncu not found")


def test_lesson_goes_on_when_one_configs_profile_fails(capsys):
    class FailingBench(lesson.Bench):
        def start(self):
            self.info = {"gpu": "test", "ceiling_tbps": CEILING, "arch": "sm_90"}
            return self.info

        def time(self, space, params, problem):
            return {"median_ms": 0.3 * (4 - params["fusion"])}

        def capture(self, space, params, problem, uri, launches, label, result):
            if params["fusion"] == 2:
                raise NcuConfigError(f"ncu on {uri}: ncu profiled no kernel (tuner.insight.ncu: error: boom)")
            return (DATA / f"fusion-fusion{params['fusion']}.csv").read_text(), {}

    bench = FailingBench()
    bench.use_ncu = True
    bench.start()
    result = lesson.fusion(bench)
    by_depth = {r.params["fusion"]: r.measured for r in result.rows}
    assert by_depth[2]["ncu"] == "failed" and "dram_bytes" not in by_depth[2]
    assert by_depth[1]["bound"] == by_depth[3]["bound"] == "HBM bandwidth"
    assert set(result.csvs) == {"fusion1", "fusion3"}
    assert len(result.ncu_failures) == 1 and "tuner.insight.ncu: error: boom" in result.ncu_failures[0]
    lesson.print_table(result)  # to a pipe: the rows on stdout, the title and notes on stderr
    printed = capsys.readouterr()
    assert "no ncu profile: fusion 2 (2 kernels): ncu on elementwise_fuse2" in printed.err
    header, *rows = printed.out.splitlines()
    assert header.split("\t")[:3] == ["config", "predicted dram bytes", "predicted time vs fused"]
    assert [row.split("\t")[0] for row in rows] == [r.label for r in result.rows]


class CapturedBench(lesson.Bench):
    """The coalescing lesson without a GPU: times in the shape an H200 gives (invented figures), and the real
    ncu captures of strides 1, 8 and 32 (tests/data/ncu); the other strides' profiles fail, as one may."""

    def start(self):
        self.info = {"gpu": "NVIDIA H200", "ceiling_tbps": CEILING, "arch": "sm_90"}
        return self.info

    def time(self, space, params, problem):
        slower = min(params["stride"], 9)
        return {
            "median_ms": 0.126 * slower,
            "tbps": 4.1 / slower,
            "tflops": 0.0,
            "fraction_of_ceiling": 0.96 / slower,
            "registers": 16,
            "spill_bytes": 0,
        }

    def capture(self, space, params, problem, uri, launches, label, result):
        if params["stride"] not in (1, 8, 32):
            raise NcuConfigError(f"ncu on {uri}: ncu profiled no kernel")
        return (DATA / f"coalescing-stride{params['stride']}.csv").read_text(), {}


def coalescing_lesson() -> lesson.LessonResult:
    """The widest lesson table: three predictions and ten measured columns per stride."""
    bench = CapturedBench()
    bench.use_ncu = True
    result = lesson.coalescing(bench)
    result.gpu, result.ceiling_tbps = bench.start()["gpu"], CEILING
    return result


def test_a_lesson_table_fits_a_terminal_100_columns_wide(tmp_path):
    """In a terminal of 100 columns, the 14 columns of the coalescing lesson come out as tables no wider than
    the window, each beginning with the config, with every value whole (no cell cut short with "…")."""
    pexpect = pytest.importorskip("pexpect")
    result = coalescing_lesson()
    code = (
        "from tests.insight.test_explain import coalescing_lesson\nfrom tuner.insight import lesson\n"
        "lesson.print_table(coalescing_lesson())\n"
    )
    root = Path(__file__).resolve().parents[2]
    child = pexpect.spawn(
        sys.executable,
        ["-c", code],
        cwd=str(tmp_path),
        dimensions=(60, 100),
        encoding="utf-8",
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root), "TERM": "xterm-256color", "COLUMNS": "100"},
    )
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    lines = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", child.before).replace("\r\n", "\n").splitlines()
    assert max(len(line) for line in lines) <= 100, "\n".join(lines)
    assert "…" not in child.before
    tables = [line for line in lines if line.startswith("│")]  # the rows of every table printed
    cells = {cell.strip() for line in tables for cell in line.strip("│").split("│")}
    for row in result.rows:
        assert sum(line.startswith(f"│ {row.label} ") for line in tables) == 2  # in each of the two tables
        for value in [*row.predicted.values(), *row.measured.values()]:
            text = lesson._cell(value)
            assert text in cells or text in {"HBM bandwidth", "failed"}, text
    assert any("bandwidth" in line for line in tables)
    assert any(line.startswith("  no ncu profile: stride 2") for line in lines)


def test_lesson_bad_input(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("TUNER_NCU", raising=False)
    _one_line_exit_2(capsys, ["lesson", "coalescing", "--ncu", "--out", str(tmp_path)], "ncu not found")
    _one_line_exit_2(capsys, ["lesson", "ncu"], "name a study")
    _one_line_exit_2(capsys, ["lesson", "nope"], "invalid choice")
    assert not any(tmp_path.iterdir())


def test_lesson_without_a_usable_gpu_says_what_bench_and_ceiling_say(tmp_path):
    """Without a driver (this CI), `tuner lesson` names the cause in the words of the other GPU commands, not a
    CUDA status; on a machine with a GPU the GPUs are hidden, so the same words are checked there too."""
    import subprocess

    from tuner.gpu import discovery

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    if discovery.local_gpus():
        env["CUDA_VISIBLE_DEVICES"] = ""

    def tuner(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "tuner", *args]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    taught, ceiling = tuner("lesson", "coalescing", "--out", "out"), tuner("ceiling")
    assert (taught.returncode, taught.stdout) == (2, "")
    (line,) = taught.stderr.splitlines()
    assert line.startswith("tuner: error: GPU 0: nothing to measure on: ") and "cudaError" not in line
    assert ceiling.returncode == 2 and ceiling.stderr.splitlines() == [line]
    assert not any(tmp_path.iterdir())


def test_fp32_peak_from_device_facts():
    from tuner.insight.ncu import fp32_peak_tflops

    assert fp32_peak_tflops({"sm_count": 132, "sm_clock_mhz": 1980, "cc": "9.0"}) == pytest.approx(66.9, abs=0.1)
    assert fp32_peak_tflops({"cc": "9.0"}) is None
    assert math.isnan(explained("coalescing-stride8.csv", COPY_MIN).arithmetic_intensity) is False
