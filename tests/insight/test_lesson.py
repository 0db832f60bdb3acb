"""The lessons (`tuner.insight.lesson`) on the CPU: their plots and predictions, a lesson that goes on when one
config's profile fails, its table in a terminal 100 columns wide, and the bad-input paths of `tuner lesson`."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from tests.insight.captures import CEILING, DATA, one_line_exit_2
from tuner.cli.main import main
from tuner.insight import lesson
from tuner.insight.ncu import NcuConfigError


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
        "from tests.insight.test_lesson import coalescing_lesson\nfrom tuner.insight import lesson\n"
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
    one_line_exit_2(capsys, ["lesson", "coalescing", "--ncu", "--out", str(tmp_path)], "ncu not found")
    one_line_exit_2(capsys, ["lesson", "ncu"], "name a study")
    one_line_exit_2(capsys, ["lesson", "nope"], "invalid choice")
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
