"""The verdicts and `compare` (`tuner.insight.explain`), pinned on the H200 captures of tests/data/ncu/, and the
bad-input paths of `tuner explain`, all on the CPU."""

from __future__ import annotations

import shutil

import pytest

from tests.insight.captures import (
    CEILING,
    CHAIN_MIN,
    COPY_MIN,
    GEMM_MIN,
    PEAK,
    STUDY,
    TRANSPOSE_MIN,
    explained,
    load,
    one_line_exit_2,
)
from tuner.cli.main import main
from tuner.insight.explain import compare, explain
from tuner.insight.ncu import Profile


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


def _no_ncu_attrs(db):
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{db}")
    return not any(k.startswith("ncu:") for k in study.user_attrs)


def test_explain_without_ncu_is_one_line_and_writes_nothing(study_db, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no ncu anywhere
    monkeypatch.delenv("TUNER_NCU", raising=False)
    plot = tmp_path / "r.png"
    one_line_exit_2(capsys, ["explain", str(study_db), "--best", "--plot", str(plot)], "ncu not found")
    assert not plot.exists() and _no_ncu_attrs(study_db)


def test_explain_unknown_and_unmeasured_trials(study_db, capsys):
    one_line_exit_2(capsys, ["explain", str(study_db), "--trial", "9999"], "no trial 9999")
    one_line_exit_2(capsys, ["explain", str(study_db), "--trial", "-1"], "trial numbers are ≥ 0")


def test_explain_fake_ncu_not_permitted_and_timeout(study_db, tmp_path, capsys, monkeypatch):
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM - The user does not have permission'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("TUNER_NCU", str(fake))
    one_line_exit_2(capsys, ["explain", str(study_db), "--best"], "not permitted")
    fake.write_text("#!/bin/sh\nsleep 5\n")
    one_line_exit_2(capsys, ["explain", str(study_db), "--best", "--timeout", "0.5"], "did not finish within 0.5 s")
    assert _no_ncu_attrs(study_db)


def test_explain_config_that_no_longer_renders(study_db, capsys, monkeypatch):
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{study_db}")
    study.set_user_attr("space_hash", "0" * 64)  # the space file "changed" since the study ran
    monkeypatch.setenv("TUNER_NCU", shutil.which("true") or "/bin/true")
    one_line_exit_2(capsys, ["explain", str(study_db), "--best"], "changed since the study ran")
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


def test_explain_profiles_again_a_record_of_the_old_format(study_db, tmp_path, capsys, monkeypatch):
    import optuna

    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{study_db}")
    old = load("bank-conflicts-pad0_vec1.csv").to_dict()
    del old["format"]  # read before the units row was honoured: its time is ns taken for seconds
    study.set_user_attr("ncu:36", {"uri": "transpose_tile32_rpt1_pad0_vec1", "profile": old, "device": {}})
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("TUNER_NCU", raising=False)
    one_line_exit_2(capsys, ["explain", str(study_db), "--trial", "36"], "ncu not found")
