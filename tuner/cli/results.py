"""Commands on stored studies: ``tuner studies``, ``pareto``, ``export``, ``dashboard``, ``trials``, ``best`` and
``import-kt``, thin layers over the results stage (`tuner.results.export`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tuner.cli.args import port
from tuner.core.errors import InputError

STUDY_HELP = "a study's name or its kernel's (found in studies/*.db, or in --storage), or a .db path"


STORAGE_HELP = "a storage URL or .db path to look in (default: every studies/*.db under the current directory)"


def _complete_study(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """Shell completion of STUDY: the study names in --storage, else in studies/*.db."""
    from tuner.store.reading import study_names

    try:
        names = study_names(getattr(parsed_args, "storage", None))
    except InputError:
        return []
    return [name for name in names if name.startswith(prefix)]


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return ""
    if isinstance(value, float) and spec:
        return format(value, spec)
    return str(value)


def cmd_studies(args: argparse.Namespace) -> int:
    from tuner.results import studies
    from tuner.results.console import Column, print_table
    from tuner.space.objective import format_figure
    from tuner.store.dbfiles import STUDIES_DIR

    rows = studies.list_studies(args.storage)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    where = args.storage or f"{STUDIES_DIR}/*.db"
    columns = [
        Column("name", copy=True),
        Column("kernel"),
        Column("problem"),
        Column("GPU"),
        Column("trials", "right"),
        Column("best", "right"),
        Column("last change"),
        Column("storage", copy=True),
    ]
    print_table(
        f"studies in {where}",
        columns,
        [
            [
                r["name"],
                r["kernel"] or "",
                r["problem"] or "",
                r["gpu"] or "",
                str(r["trials"]),
                format_figure(r["best"], r["unit"]),
                (r["last_change"] or "").replace("T", " "),
                _storage_label(r["storage"]),
            ]
            for r in rows
        ],
        notes=[] if rows else [f"no studies in {where}"],
    )
    return 0


def _storage_label(url: str) -> str:
    """A SQLite URL as its file's path (relative to here when below it), any other URL as it is."""
    from pathlib import Path

    from tuner.store.dbfiles import sqlite_path

    path = sqlite_path(url)
    if path is None:
        return url
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _params_text(params: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in params.items())


def _objective_header(target) -> str:
    """The Pareto table's column of the study's first objective: its unit for a throughput ("TB/s"), else the
    metric and its unit ("time (ms)")."""
    if target.label == "throughput" or not target.unit:
        return target.unit or target.label
    return f"{target.label} ({target.unit})"


def _whole(value: float | None) -> int | None:
    return None if value is None else int(value)


def cmd_pareto(args: argparse.Namespace) -> int:
    from tuner.results import export
    from tuner.results.console import Column, print_table
    from tuner.space.objective import figure, has_throughput

    if args.out:
        export.check_writable(args.out, (".csv", ".json"), "--out")
    if args.plot:
        export.check_writable(args.plot, (".png", ".html"), "--plot")
    study = export.open_study(args.study, args.storage)
    front = export.pareto_trials(study)
    target = export.goal(study)
    with_throughput = has_throughput(export.throughput_unit(study)) and target.key not in ("tbps", "tflops")
    measured = len(export.measured_trials(study))
    columns = [
        Column("#", "right"),
        Column("uri", copy=True),
        Column(_objective_header(target), "right"),
        *([Column(export.throughput_unit(study), "right")] if with_throughput else []),
        Column("of ceiling", "right"),
        Column("regs", "right"),
        Column("SMEM B", "right"),
        Column("spills", "right"),
        Column("blocks/SM", "right"),
    ]
    rows = []
    for t in front:
        a = t.user_attrs
        rows.append(
            [
                str(t.number),
                str(a.get("uri", "") or _params_text(t.params)),
                target.format(export.objective_value(study, t, target)).rsplit(" ", 1)[0],
                *([_fmt(export.throughput(study, t), ".3f")] if with_throughput else []),
                _fmt(figure(a, "fraction_of_ceiling"), ".3f"),
                _fmt(_whole(figure(a, "registers"))),
                _fmt(_whole(figure(a, "smem_bytes"))),
                _fmt(_whole(figure(a, "spill_bytes"))),
                _fmt(_whole(figure(a, "blocks_per_sm"))),
            ]
        )
    notes = []
    if args.out:
        notes.append(f"wrote {export.write_pareto(study, args.out)}")
    if args.plot:
        notes.append(f"wrote {export.plot_pareto(study, args.plot)}")
    print_table(
        f"{study.study_name}: Pareto front, {len(front)} of {measured} measured configs "
        f"({study.user_attrs.get('gpu', '')})",
        columns,
        rows,
        notes,
    )
    return 0


def _read_restrictions(path: str) -> list[str]:
    """Kernel Tuner restrictions from a file: a JSON list of strings, or one expression a line (# comments)."""
    from pathlib import Path

    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise InputError("no such restrictions file", path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", path) from None
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"not JSON (line {exc.lineno}): {exc.msg}", path) from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise InputError("expected a JSON list of expression strings", path)
        return items
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def cmd_import_kt(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tuner.build.files import check_writable
    from tuner.store import kt

    out = Path(args.out)
    if out.suffix not in (".yaml", ".yml"):
        raise InputError("-o: the space file must end in .yaml or .yml", args.out)
    check_writable(out)
    restrictions = None
    if args.restrictions:
        restrictions = _read_restrictions(args.restrictions)
    if args.restriction:
        restrictions = (restrictions or []) + list(args.restriction)
    valid, configs_path, notes = kt.write_space(kt.read_cache(args.cache), args.cache, out, restrictions)
    for note in notes:
        print(f"{args.cache}: {note}", file=sys.stderr)
    beside = f" (its valid configs listed in {configs_path})" if configs_path is not None else ""
    print(
        f"wrote {out}{beside}: {valid:,} valid configs; run it with tuner study kt --space {out} "
        f"--replay {args.cache} --trials N"
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tuner.results import export
    from tuner.store import kt

    if not (args.header or args.kt_cache):
        raise InputError("tuner export: give --header PATH, --kt-cache PATH, or both")
    # both outputs are checked before either is written
    if args.kt_cache:
        kt.check_cache_path(args.kt_cache)
    if args.header:
        export.check_namespace(args.namespace)
        export.check_writable(args.header, None, "--header")
    if args.kt_cache:
        study = export.open_study(args.study, args.storage)
        print(f"wrote {kt.write_cache(study, args.kt_cache)}: study {study.study_name} as a Kernel Tuner cache")
        if not args.header:
            return 0
    studies = export.open_studies(args.study, args.storage)
    path = export.write_header(
        studies, args.header, pick=args.pick, namespace=args.namespace, with_source=args.with_source
    )
    print(
        f"wrote {path}: {args.pick} config(s) of {len(studies)} "
        f"stud{'y' if len(studies) == 1 else 'ies'} ({', '.join(s.study_name for s in studies)})"
    )
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from tuner.results import dashboard

    dashboard.serve(args.study, port=args.port, host=args.host, storage=args.storage, artifact_dir=args.artifacts)
    return 0


def cmd_trials(args: argparse.Namespace) -> int:
    from tuner.results import export

    export.check_writable(args.out, (".csv", ".parquet"), "--out")
    study = export.open_study(args.study, args.storage)
    path = export.write_trials(study, args.out)
    best = ""
    if any(export.is_measured(t) for t in study.get_trials(deepcopy=False)):
        target, top = export.goal(study), export.best_trial(study)
        aim = "minimized" if target.minimize else "maximized"
        figure = target.format(export.objective_value(study, top, target))
        best = f"; best: trial {top.number}, {target.label} {figure} ({aim})"
    print(f"wrote {path}: {len(study.get_trials(deepcopy=False))} trials of {study.study_name}{best}")
    return 0


def _of_roof(best: dict[str, Any]) -> str:
    """`best`'s share of its own roof, for `tuner best`: the copy ceiling for a TB/s family, the FP32 peak from the
    GPU's facts for a TFLOP/s one ("" where there is none to compare with)."""
    if best["throughput_unit"] == "TFLOP/s":
        peak = best.get("fp32_peak_tflops")
        return (
            f" = {best['throughput'] / peak:.3f} of the FP32 peak ({peak:.1f} TFLOP/s from the GPU's facts)"
            if peak
            else ""
        )
    fraction = best.get("fraction_of_ceiling")
    return f" = {fraction:.3f} of the copy ceiling" if fraction else ""


#: how `tuner best` names an objective metric on its line
_OBJECTIVE_LABELS = {
    "time_ms": "time",
    "fraction_of_ceiling": "of ceiling",
    "smem_bytes": "SMEM",
    "spill_bytes": "spills",
}


def cmd_best(args: argparse.Namespace) -> int:
    from tuner.api import open_study

    best = open_study(args.study, args.storage).best
    if args.json:
        print(json.dumps(best, indent=2, default=str))
        return 0
    from rich.text import Text

    from tuner.results.console import Cell, print_lines
    from tuner.space.objective import format_figure

    unit = best["throughput_unit"]
    aim = "minimized" if best["direction"] == "minimize" else "maximized"
    label = _OBJECTIVE_LABELS.get(best["objective"], best["objective"])
    if best["objective"] == "throughput" and best["unit"] == "ms":
        label = "time"  # a family without a throughput is ranked by its time
    lines: list[Cell] = [
        Text.assemble(
            (str(best["uri"] or "best config"), "bold"),
            f"  (trial {best['number']} of {best['study']}, {best.get('gpu') or '?'})",
        ),
        "params:     " + ", ".join(f"{k}={v}" for k, v in best["params"].items()),
        f"objective:  {best['objective']}, {aim} ({best['timing']})",
    ]
    if label not in ("throughput", "time"):
        lines.append(f"{label + ':':<11} {format_figure(best['value'], best['unit']) or 'not recorded'}")
    if best.get("throughput") is not None:
        lines.append(
            f"throughput: {best['throughput']:.3f} {unit}"
            + _of_roof(best)
            + (f"; median {best['median_ms']:.4g} ms" if best.get("median_ms") else "")
        )
    elif best.get("median_ms"):
        lines.append(f"time:       {best['median_ms']:.4g} ms median")
    if best.get("registers") is not None:
        lines += [
            f"resources:  {_fmt(best.get('registers'))} registers/thread, {_fmt(best.get('smem_bytes'))} B "
            f"SMEM/block, {_fmt(best.get('spill_bytes'))} B spills, {_fmt(best.get('threads'))} threads/block",
            f"occupancy:  {_fmt(best.get('blocks_per_sm'))} blocks/SM, {_fmt(best.get('warps_per_sm'))} warps/SM"
            + (f" ({best['occupancy']:.0%} of 64)" if best.get("occupancy") is not None else ""),
        ]
    else:
        lines.append("resources:  not recorded (registers, SMEM and occupancy are unknown for these configs)")
    # The source's path or the command that prints it on a line of its own, so it copies whole.
    if "source_path" in best:
        lines += ["source:", "    " + best["source_path"]]
    elif "source_note" in best:
        lines.append("source:     " + best["source_note"])
    else:
        lines += ["source (prints it):", "    " + best["render_command"]]
    print_lines(lines)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register studies, pareto, export, dashboard, trials and best on `sub`; each sets ``func`` to its
    handler."""
    p = sub.add_parser("studies", help="list the studies in studies/*.db (or --storage): trials, best, last change")
    p.add_argument("--storage", help="a storage URL or .db path (default: every studies/*.db here)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_studies)

    p = sub.add_parser("pareto", help="the Pareto front of a study: table, --out CSV/JSON, --plot PNG/HTML")
    p.add_argument("study", help=STUDY_HELP).completer = _complete_study  # type: ignore[attr-defined]
    p.add_argument("--storage", help=STORAGE_HELP)
    p.add_argument("--out", metavar="FILE.csv|.json")
    p.add_argument("--plot", metavar="FILE.png|.html")
    p.set_defaults(func=cmd_pareto)

    p = sub.add_parser("export", help="write the tuned configs as a C++17 header")
    p.add_argument(
        "study", help=STUDY_HELP + "; a kernel or .db exports every study of that kernel in it"
    ).completer = _complete_study  # type: ignore[attr-defined]
    p.add_argument("--header", metavar="PATH", help="the C++17 header to write")
    p.add_argument(
        "--kt-cache",
        metavar="PATH.json[.gz]",
        help="also (or only) write the study as a Kernel "
        "Tuner cache file (its simulation mode and KTdashboard read it)",
    )
    p.add_argument(
        "--pick",
        choices=("fastest", "pareto"),
        default="fastest",
        help="the fastest config per study, or its whole Pareto front (default: fastest)",
    )
    p.add_argument(
        "--namespace", default="tuned", help="C++ namespace, nested with :: as in prod::kernels (default: tuned)"
    )
    p.add_argument("--with-source", action="store_true", help="embed each config's CUDA source as a raw string")
    p.add_argument("--storage", help=STORAGE_HELP)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("dashboard", help="serve optuna-dashboard for a study database, with sources and PTX")
    p.add_argument(
        "study", nargs="?", help=STUDY_HELP + " (default: the only database in studies/)"
    ).completer = _complete_study  # type: ignore[attr-defined]
    p.add_argument("--port", type=port, default=8080)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--storage", help=STORAGE_HELP)
    p.add_argument(
        "--artifacts", metavar="DIR", help="artifact folder (default: <db stem>.artifacts/ beside the database)"
    )
    p.set_defaults(func=cmd_dashboard)

    p = sub.add_parser("trials", help="every trial of a study as a flat table (CSV or Parquet)")
    p.add_argument("study", help=STUDY_HELP).completer = _complete_study  # type: ignore[attr-defined]
    p.add_argument("--out", required=True, metavar="FILE.csv|.parquet")
    p.add_argument("--storage", help=STORAGE_HELP)
    p.set_defaults(func=cmd_trials)

    p = sub.add_parser("best", help="the best verified config of a study, by its first objective")
    p.add_argument("study", help=STUDY_HELP).completer = _complete_study  # type: ignore[attr-defined]
    p.add_argument("--storage", help=STORAGE_HELP)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_best)


def add_import_command(sub: argparse._SubParsersAction) -> None:
    """import-kt."""
    p = sub.add_parser("import-kt", help="write a space YAML for a Kernel Tuner cache file (replay only)")
    p.add_argument("cache", help="a Kernel Tuner cache, .json or .json.gz")
    p.add_argument("-o", "--out", required=True, metavar="SPACE.yaml")
    p.add_argument(
        "--restrictions",
        metavar="FILE",
        help="Kernel Tuner's restrictions (a JSON list of strings, or one a line): those that parse as "
        "expressions become the space's constraints",
    )
    p.add_argument("--restriction", action="append", metavar="EXPR", help="one such restriction (repeat)")
    p.set_defaults(func=cmd_import_kt)
