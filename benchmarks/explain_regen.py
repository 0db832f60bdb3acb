"""Re-explain an `explain_capture.sh` bundle with the current code, on the CPU: no GPU, no ncu.

    PYTHONPATH=. python benchmarks/explain_regen.py CAPTURE_DIR OUT_DIR

CAPTURE_DIR is the extracted explain_capture.tgz. For each lesson with a ``lessons/<name>.json``, the lesson
runs again with a replaying bench: the times are the ones the GPU recorded in that JSON, the ncu profiles are
the raw CSVs of the bundle, parsed and explained by the current `tuner.insight.ncu` / `tuner.insight.explain` (the GPU
facts for the FP32 peak come from the CSVs' device columns). It prints each table and writes ``OUT_DIR/<name>.png`` and
``<name>.json``.

The explain step: with ``explain-profiles.json`` (the study's stored profiles, written by the capture since the
units fix) the study's verdicts are recomputed from the profiles. A bundle with only ``explain.json`` (the
derived figures of an older run, whose parser read ncu's ``ns`` as seconds) is re-judged from those figures with
the time converted from ns; everything else in them (bytes, sectors, conflicts, percentages) was read in its own
unit and is kept. Prints the findings and the --compare lines, writes ``OUT_DIR/roofline.png`` and ``.html``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError
from tuner.insight import lesson
from tuner.insight.explain import Explanation, bound, compare, explain_study, findings
from tuner.insight.ncu import NcuConfigError, device_facts_from_csv, fp32_peak_tflops
from tuner.insight.roofline import write_roofline

REPO = Path(__file__).resolve().parent.parent
STUDY_DB = REPO / "tests" / "data" / "transpose_h200.db"
TIMED = ("median_ms", "tbps", "tflops", "fraction_of_ceiling", "registers", "spill_bytes", "failure", "reason")


class ReplayBench(lesson.Bench):
    """A lesson bench that replays a capture: times from the lesson's JSON, profiles from its CSVs."""

    def __init__(self, capture: Path, name: str):
        super().__init__(ncu=False)
        self.use_ncu = True
        self.capture_dir, self.name = capture, name
        self.recorded = json.loads((capture / "lessons" / f"{name}.json").read_text())
        self.info = {"gpu": self.recorded["gpu"], "ceiling_tbps": self.recorded["ceiling_tbps"], "arch": "sm_90"}

    def start(self) -> dict[str, Any]:
        return self.info

    def close(self) -> None:
        pass

    def time(self, space, params, problem) -> dict[str, Any]:
        for row in self.recorded["rows"]:
            if row["params"] == params:
                return {k: v for k, v in row["measured"].items() if k in TIMED}
        return {"failure": "NotCaptured", "reason": "this config is not in the capture"}

    def capture(self, space, params, problem, uri, launches, label, result):
        path = self.capture_dir / "lessons" / f"{self.name}-{label}.csv"
        if not path.is_file():
            raise NcuConfigError(f"{path}: no capture of {uri}")
        text = path.read_text()
        return text, {"device": device_facts_from_csv(text)}


def regen_lessons(capture: Path, out: Path) -> None:
    runners = {
        "coalescing": lesson.coalescing,
        "bank-conflicts": lesson.bank_conflicts,
        "fusion": lesson.fusion,
        "registers": lesson.registers,
    }
    for name, run in runners.items():
        if not (capture / "lessons" / f"{name}.json").is_file():
            print(f"== {name}: not in the capture")
            continue
        bench = ReplayBench(capture, name)
        result = run(bench)
        result.gpu, result.ceiling_tbps = bench.info["gpu"], bench.info["ceiling_tbps"]
        command, date = bench.recorded.get("command", "(command not recorded)"), bench.recorded.get("date", "?")
        print(f"== {name}: {command} ({date})")
        lesson.print_table(result)
        (out / f"{name}.png").write_bytes(lesson.lesson_png(result))
        (out / f"{name}.json").write_text(
            json.dumps(
                {**result.to_dict(), "command": command, "date": date},
                indent=2,
                default=str,
            )
        )


def _from_old_json(item: dict[str, Any]) -> Explanation:
    """An Explanation from an older explain.json entry: its time was ncu's ns read as seconds."""
    fields = {k: (math.nan if v is None else v) for k, v in item.items() if k in Explanation.__dataclass_fields__}
    for name, spec in Explanation.__dataclass_fields__.items():  # figures the older run did not derive
        if name not in fields and spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
            fields[name] = math.nan
    e = Explanation(**fields)
    e.time_s = item["time_s"] * 1e-9
    e.dram_tbps = e.dram_bytes / e.time_s / 1e12
    e.of_ceiling = e.dram_tbps / e.ceiling_tbps if e.ceiling_tbps else math.nan
    e.tflops = e.flops / e.time_s / 1e12
    e.missing = []
    e.bound = bound(e)
    e.findings = findings(e)
    return e


def regen_explain(capture: Path, out: Path, compare_pair: tuple[int, int]) -> None:
    profiles = capture / "explain-profiles.json"
    if profiles.is_file():
        import optuna

        records = json.loads(profiles.read_text())
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "study.db"
            sqlite3.connect(f"file:{STUDY_DB}?mode=ro", uri=True).backup(sqlite3.connect(db))
            study = optuna.load_study(study_name=None, storage=f"sqlite:///{db}")
            for key, record in records.items():
                study.set_user_attr(key, record)
            numbers = [int(k.split(":", 1)[1]) for k in records]
            explained = explain_study(study, trials=numbers)
        points = {x.number: x.explanation for x in explained}
        peak = next((fp32_peak_tflops(x.device) for x in explained if fp32_peak_tflops(x.device)), None)
        print("== explain (from the study's stored profiles)")
    else:
        items = json.loads((capture / "explain.json").read_text())
        points = {item["trial"]: _from_old_json(item) for item in items}
        peak = next((item.get("peak_tflops") for item in items if item.get("peak_tflops")), None)
        print("== explain (re-judged from explain.json, time converted from ns)")
    for e in points.values():
        print(e.label)
        for line in e.findings[:4]:
            print(f"  {line}")
    for line in compare(points[compare_pair[0]], points[compare_pair[1]]):
        print(line)
    ceiling = next(e.ceiling_tbps for e in points.values() if e.ceiling_tbps)
    title = "transpose-n16384_float32-NVIDIA_H200: roofline"
    for path in write_roofline(out / "roofline.png", list(points.values()), ceiling, peak, title):
        print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("capture", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--compare", type=int, nargs=2, default=(36, 103))
    args = parser.parse_args(argv)
    try:
        if not (args.capture / "lessons").is_dir():
            raise InputError(f"{args.capture}: not an extracted explain_capture.tgz (no lessons/ folder)")
        args.out.mkdir(parents=True, exist_ok=True)
        regen_lessons(args.capture, args.out)
        regen_explain(args.capture, args.out, tuple(args.compare))
    except InputError as exc:
        print(f"explain_regen: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
