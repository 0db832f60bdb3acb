"""What the insight tests share: the ncu captures of tests/data/ncu/ (ncu 2025.3.1 on an H200), the figures the
H200 lessons measured beside them, the minimal bytes of each captured kernel, and a command that must fail in one
line."""

from __future__ import annotations

from pathlib import Path

from tuner.cli.main import main
from tuner.insight.explain import Explanation, explain
from tuner.insight.ncu import Profile, parse_raw_csv

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


def one_line_exit_2(capsys, argv, fault):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fault in err, err
