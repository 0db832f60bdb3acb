"""The ncu raw-CSV parser and the profiling command (`tuner.insight.ncu`), on the CPU: real captures (ncu 2025.3.1 on an
H200, tests/data/ncu/), their units and launches, bad input as one line, the device facts and FP32 peak a capture
gives."""

from __future__ import annotations

import math
import re

import pytest

from tests.insight.captures import COPY_MIN, DATA, explained, load
from tuner.core.errors import InputError
from tuner.insight.explain import explain
from tuner.insight.ncu import (
    METRICS,
    PROFILE_FORMAT,
    NcuError,
    Profile,
    device_facts_from_csv,
    kernel_regex,
    ncu_command,
    parse_raw_csv,
    target_command,
)


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


def test_fp32_peak_from_device_facts():
    from tuner.insight.ncu import fp32_peak_tflops

    assert fp32_peak_tflops({"sm_count": 132, "sm_clock_mhz": 1980, "cc": "9.0"}) == pytest.approx(66.9, abs=0.1)
    assert fp32_peak_tflops({"cc": "9.0"}) is None
    assert math.isnan(explained("coalescing-stride8.csv", COPY_MIN).arithmetic_intensity) is False
