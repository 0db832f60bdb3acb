"""The results subcommands of `tuner`: pareto, export, dashboard, trials, best.

`add_commands(sub)` registers them on the `tuner` parser's subparsers (created with ``parser_class=_Parser``, so
argparse complaints become InputError). Each handler takes the parsed args and returns an exit code; bad input
raises InputError (one line, exit 2, from `tuner.cli.main`). Outputs are checked before any work is done and
written atomically: a bad --out/--plot/--header leaves nothing behind.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

STUDY_HELP = "a study name, a kernel name (studies/<kernel>.db) or a .db path"


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {value}")
    return value


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return ""
    if isinstance(value, float) and spec:
        return format(value, spec)
    return str(value)


# ---------------------------------------------------------------------------------------------------------------
# handlers


def cmd_pareto(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from tuner import export

    if args.out:
        export.check_writable(args.out, (".csv", ".json"), "--out")
    if args.plot:
        export.check_writable(args.plot, (".png", ".html"), "--plot")
    study = export.open_study(args.study, args.storage)
    front = export.pareto_trials(study)
    unit = export.throughput_unit(study)
    measured = len(export.measured_trials(study))
    table = Table(title=f"{study.study_name}: Pareto front, {len(front)} of {measured} measured configs "
                        f"({study.user_attrs.get('gpu', '')})")
    for col, justify in (("#", "right"), ("uri", "left"), (unit, "right"), ("of ceiling", "right"),
                         ("regs", "right"), ("SMEM B", "right"), ("spills", "right"), ("blocks/SM", "right")):
        table.add_column(col, justify=justify)
    for t in front:
        a = t.user_attrs
        table.add_row(str(t.number), str(a.get("uri", "")), f"{export.throughput(study, t):.3f}",
                      _fmt(a.get("fraction_of_ceiling"), ".3f"), _fmt(a.get("registers")),
                      _fmt(a.get("smem_bytes")), _fmt(a.get("spill_bytes")), _fmt(a.get("blocks_per_sm")))
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped: keep each row on one line, whole uris included
    console.print(table)
    if args.out:
        console.print(f"wrote {export.write_pareto(study, args.out)}")
    if args.plot:
        console.print(f"wrote {export.plot_pareto(study, args.plot)}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tuner import export

    export.check_namespace(args.namespace)
    export.check_writable(args.header, None, "--header")
    studies = export.open_studies(args.study, args.storage)
    path = export.write_header(studies, args.header, pick=args.pick, namespace=args.namespace,
                               with_source=args.with_source)
    print(f"wrote {path}: {args.pick} config(s) of {len(studies)} "
          f"stud{'y' if len(studies) == 1 else 'ies'} ({', '.join(s.study_name for s in studies)})")
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from tuner import dashboard

    dashboard.serve(args.study, port=args.port, host=args.host, storage=args.storage,
                    artifact_dir=args.artifacts)
    return 0


def cmd_trials(args: argparse.Namespace) -> int:
    from tuner import export

    export.check_writable(args.out, (".csv", ".parquet"), "--out")
    study = export.open_study(args.study, args.storage)
    path = export.write_trials(study, args.out)
    print(f"wrote {path}: {len(study.get_trials(deepcopy=False))} trials of {study.study_name}")
    return 0


def cmd_best(args: argparse.Namespace) -> int:
    from tuner import export

    study = export.open_study(args.study, args.storage)
    best = export.best_summary(study)
    if args.json:
        print(json.dumps(best, indent=2, default=str))
        return 0
    from rich.console import Console

    unit = best["throughput_unit"]
    fraction = best.get("fraction_of_ceiling")
    lines = [
        f"[bold]{best['uri']}[/bold]  (trial {best['number']} of {best['study']}, {best.get('gpu') or '?'})",
        "params:     " + ", ".join(f"{k}={v}" for k, v in best["params"].items()),
        f"throughput: {best['throughput']:.3f} {unit}"
        + (f" = {fraction:.3f} of the copy ceiling" if fraction else "")
        + (f"; median {best['median_ms']:.4g} ms" if best.get("median_ms") else ""),
        f"resources:  {_fmt(best.get('registers'))} registers/thread, {_fmt(best.get('smem_bytes'))} B "
        f"SMEM/block, {_fmt(best.get('spill_bytes'))} B spills, {_fmt(best.get('threads'))} threads/block",
        f"occupancy:  {_fmt(best.get('blocks_per_sm'))} blocks/SM, {_fmt(best.get('warps_per_sm'))} warps/SM"
        + (f" ({best['occupancy']:.0%} of 64)" if best.get("occupancy") is not None else ""),
        ("source:     " + best["source_path"]) if "source_path" in best else
        ("source:     " + best["render_command"]),
    ]
    console = Console(highlight=False)
    for line in lines:
        console.print(line)
    return 0


# ---------------------------------------------------------------------------------------------------------------
# registration


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register pareto, export, dashboard, trials and best on `sub`; each sets ``func`` to its handler."""
    p = sub.add_parser("pareto", help="the Pareto front of a study: table, --out CSV/JSON, --plot PNG/HTML")
    p.add_argument("study", help=STUDY_HELP)
    p.add_argument("--storage", help="a storage URL (default: studies/<kernel>.db)")
    p.add_argument("--out", metavar="FILE.csv|.json")
    p.add_argument("--plot", metavar="FILE.png|.html")
    p.set_defaults(func=cmd_pareto)

    p = sub.add_parser("export", help="write the tuned configs as a C++17 header")
    p.add_argument("study", help=STUDY_HELP + "; a kernel or .db exports every study of that kernel in it")
    p.add_argument("--header", required=True, metavar="PATH")
    p.add_argument("--pick", choices=("fastest", "pareto"), default="fastest",
                   help="the fastest config per study, or its whole Pareto front (default: fastest)")
    p.add_argument("--namespace", default="tuned", help="C++ namespace (default: tuned)")
    p.add_argument("--with-source", action="store_true", help="embed each config's CUDA source as a raw string")
    p.add_argument("--storage")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("dashboard", help="serve optuna-dashboard for a study database, with sources and PTX")
    p.add_argument("study", nargs="?", help=STUDY_HELP + " (default: the only database in studies/)")
    p.add_argument("--port", type=_port, default=8080)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--storage")
    p.add_argument("--artifacts", metavar="DIR",
                   help="artifact folder (default: <db stem>.artifacts/ beside the database)")
    p.set_defaults(func=cmd_dashboard)

    p = sub.add_parser("trials", help="every trial of a study as a flat table (CSV or Parquet)")
    p.add_argument("study", help=STUDY_HELP)
    p.add_argument("--out", required=True, metavar="FILE.csv|.parquet")
    p.add_argument("--storage")
    p.set_defaults(func=cmd_trials)

    p = sub.add_parser("best", help="the fastest verified config of a study")
    p.add_argument("study", help=STUDY_HELP)
    p.add_argument("--storage")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_best)


def main(argv: list[str] | None = None) -> int:
    """`python -m tuner.results_cli ...` is `tuner ...`: tuner.cli registers these commands beside the others."""
    from tuner.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
