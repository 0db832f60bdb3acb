"""benchmarks/head_to_head.py's statistics and target parsing (CPU only: the GPU rounds run on the device)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("head_to_head", ROOT / "benchmarks" / "head_to_head.py")
h2h = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(h2h)


def test_sign_test_is_the_two_sided_binomial_tail():
    assert h2h.sign_test(6, 12) == 1.0
    assert math.isclose(h2h.sign_test(10, 12), 2 * (1 + 12 + 66) / 4096)
    assert h2h.sign_test(2, 12) == h2h.sign_test(10, 12)
    assert h2h.sign_test(0, 0) == 1.0
    assert math.isclose(h2h.sign_test(12, 12), 2 / 4096)


def test_verdict_needs_a_consistent_lead_not_a_larger_median():
    steady = ([4.31] * 10, [4.30] * 10)  # 0.2% ahead in every round
    assert h2h.verdict(*steady)[0] == "ahead"
    assert h2h.verdict(steady[1], steady[0])[0] == "behind"
    noisy = ([4.40, 4.20] * 5, [4.30] * 10)  # a larger mean, faster in half the rounds
    assert h2h.verdict(*noisy) == ("tie", 5, 10, 1.0)
    assert h2h.verdict([4.3] * 6, [4.3] * 6) == ("tie", 0, 0, 1.0)  # equal figures are not compared


def test_targets_read_the_tuner_records_of_every_results_format():
    results = ROOT / "benchmarks" / "results"
    paths = [
        str(results / "catalog-2026-12-01-rmsnorm-l2.json"),  # catalog.py: the problem leads `shape`
        str(results / "decode-2026-12-01-gemv-readflush.json"),  # decode.py: a `problem` field
        str(results / "decode_b-2026-12-01-readflush-b.json"),  # decode_b.py
    ]
    found = {(t["kernel"], t["problem"]): t for t in h2h.targets(paths, None, None)}
    assert {("rmsnorm", "r32768_c8192_bf16"), ("gemv", "m16"), ("decode_attention", "b16_s8192")} <= set(found)
    assert found["rmsnorm", "r32768_c8192_bf16"]["config"]["cache"] == "l2"
    assert [t["problem"] for t in h2h.targets(paths, ["gemv"], ["m32"])] == ["m32"]
