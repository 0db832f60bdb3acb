"""``tuner lesson NAME`` and ``tuner explain``: thin layers over the insight stage (`tuner.insight.lesson`,
`tuner.insight.explain`, `tuner.insight.ncu`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.core.errors import InputError

if TYPE_CHECKING:
    pass
from tuner.cli.results import STUDY_HELP
from tuner.insight.lesson import (
    LESSONS,
    Bench,
    LessonResult,
    bank_conflicts,
    coalescing,
    fusion,
    print_table,
    registers,
    write_outputs,
)


def _check_out_dir(path: str) -> Path:
    import os

    out = Path(path)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: not a directory")
    parent = out if out.is_dir() else out.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--out {out}: cannot write there")
    return out


def cmd_lesson(args: argparse.Namespace) -> int:
    if args.name == "ncu":
        if not args.study:
            raise InputError("lesson ncu: name a study (tuner lesson ncu STUDY --trial N)")
        args.full = True
        return cmd_explain(args)
    if args.study:
        raise InputError(f"lesson {args.name}: takes no study (only `lesson ncu` does)")
    out = _check_out_dir(args.out)
    runners: dict[str, Callable[[Any], LessonResult]] = {
        "coalescing": coalescing,
        "bank-conflicts": bank_conflicts,
        "registers": registers,
        "fusion": fusion,
    }
    if args.name == "registers" and args.compile_only:
        result = registers(None)
    else:
        bench = Bench(gpu=args.gpu, ncu=args.ncu, budget_ms=args.budget_ms)
        try:
            bench.start()
            result = runners[args.name](bench)
        finally:
            bench.close()
        result.gpu, result.ceiling_tbps = bench.info.get("gpu", ""), bench.info.get("ceiling_tbps")
    print_table(result)
    out.mkdir(parents=True, exist_ok=True)
    command = (
        "tuner " + " ".join(sys.argv[1:])
        if sys.argv and sys.argv[0].endswith(("tuner", "__main__.py"))
        else f"tuner lesson {args.name}"
    )
    for path in write_outputs(result, out, command):
        print(f"wrote {path}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tuner.insight.explain import compare, explain_study
    from tuner.insight.ncu import fp32_peak_tflops
    from tuner.insight.roofline import write_roofline
    from tuner.results import export

    if args.plot:
        export.check_writable(args.plot, (".png",), "--plot")
    study = export.open_study(args.study, args.storage)
    explained = explain_study(
        study,
        trials=args.trial or (),
        best=args.best,
        worst=args.worst,
        compare_pair=args.compare,
        reprofile=args.reprofile,
        timeout_s=args.timeout,
    )
    if args.json:
        print(
            json.dumps(
                [{"trial": x.number, "uri": x.uri, "cached": x.cached, **x.explanation.to_dict()} for x in explained],
                indent=2,
                default=str,
            )
        )
    else:
        console = Console(highlight=False) if sys.stdout.isatty() else Console(highlight=False, width=200)
        for x in explained:
            e = x.explanation
            console.print(f"[bold]{e.label}[/bold]" + ("  (profile from the study)" if x.cached else ""))
            for line in e.findings if getattr(args, "full", False) else e.findings[:4]:
                console.print(f"  {line}")
            if getattr(args, "full", False):
                console.print(
                    f"  DRAM read {e.dram_read_bytes / 1e9:.4g} GB, written {e.dram_write_bytes / 1e9:.4g} GB"
                    f" in {e.time_s * 1e3:.4g} ms; sectors/request load {e.ld_sectors_per_request:.3g}, "
                    f"store {e.st_sectors_per_request:.3g}; L2 {e.lts_pct:.0f}%, L1 {e.l1tex_pct:.0f}%, "
                    f"FMA pipe {e.fma_pct:.0f}% of peak"
                )
        if args.compare:
            by_number = {x.number: x.explanation for x in explained}
            for line in compare(by_number[args.compare[0]], by_number[args.compare[1]]):
                console.print(line)
    if args.plot:
        points = [x.explanation for x in explained]
        ceiling = next((p.ceiling_tbps for p in points if p.ceiling_tbps), None)
        if ceiling is None:
            raise InputError(f"study {study.study_name}: its trials record no copy ceiling to draw the roof")
        peak = next((fp32_peak_tflops(x.device) for x in explained if fp32_peak_tflops(x.device)), None)
        for path in write_roofline(args.plot, points, ceiling, peak, f"{study.study_name}: roofline"):
            print(f"wrote {path}")
    return 0


def _trial_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a trial number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"trial numbers are ≥ 0, got {value}")
    return value


def _add_explain_args(p: argparse.ArgumentParser, study_required: bool) -> None:
    p.add_argument("--storage", help="a storage URL or .db path to look in (default: every studies/*.db here)")
    p.add_argument("--trial", type=_trial_number, action="append", metavar="N", help="a trial to explain (repeat)")
    p.add_argument("--best", action="store_true", help="the fastest measured trial (the default)")
    p.add_argument("--worst", action="store_true", help="the slowest measured trial")
    p.add_argument(
        "--compare", type=_trial_number, nargs=2, metavar=("A", "B"), help="explain what makes trials A and B differ"
    )
    p.add_argument("--plot", metavar="FILE.png", help="roofline PNG (and FILE.html beside it)")
    p.add_argument("--reprofile", action="store_true", help="profile again even where the study holds a profile")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds ncu may take per config")
    p.add_argument("--json", action="store_true")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register `explain` and `lesson` on the `tuner` subparsers."""
    p = sub.add_parser("explain", help="profile trials under Nsight Compute and say what bounds them")
    p.add_argument("study", help=STUDY_HELP)
    _add_explain_args(p, study_required=True)
    p.set_defaults(func=cmd_explain, full=False)

    p = sub.add_parser("lesson", help="the lesson's exercises: " + ", ".join(LESSONS))
    p.add_argument("name", choices=LESSONS)
    p.add_argument("study", nargs="?", help="for `lesson ncu`: " + STUDY_HELP)
    p.add_argument("--out", default="lessons", help="folder for NAME.png, NAME.json and ncu CSVs (default lessons/)")
    p.add_argument("--ncu", action="store_true", help="also profile each config under Nsight Compute")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--budget-ms", type=float, default=25.0, help="timed work per config")
    p.add_argument("--compile-only", action="store_true", help="registers: ptxas figures only, no GPU")
    _add_explain_args(p, study_required=False)
    p.set_defaults(func=cmd_lesson, full=True)
