# PYTHON_ARGCOMPLETE_OK
"""The `tuner` command line. Each subcommand is a thin layer over the Python API (`tuner.api`: study, bench, best)
or one stage module: spaces, render, check (space, render, compile); ceiling (worker); pareto, export, dashboard,
trials (export's rooms).

Bad input of any kind (an `InputError`, or an argparse complaint) is one line on stderr and exit code 2, with no
traceback; anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from tuner.errors import InputError

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    """argparse prints usage plus a message; we want one line and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{self.prog}: {message}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def _number(text: str, expected: str, ok: Callable[[float], bool], must: str) -> float:
    """A float flag's value; an ArgumentTypeError (argparse's one-line error, exit 2) unless `ok(value)`."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {must}, got {text}")
    return value


def _seconds(text: str) -> float:
    return _number(text, "a number of seconds", lambda v: 0 <= v < float("inf"), "a finite number ≥ 0")


def _positive_float(text: str) -> float:
    return _number(text, "a positive number", lambda v: v > 0, "> 0")


def _screen_cutoff(text: str) -> float | None:
    """--screen-cutoff: a factor above 1, or 0 / off for none."""
    if text.strip().lower() in ("0", "off", "none"):
        return None
    return _number(
        text, "a factor above 1 or off", lambda v: v > 1, "above 1 or off (at 1 or below even a new best would be cut)"
    )


# ---------------------------------------------------------------------------------------------------------------
# spaces / render / check


def cmd_spaces(args: argparse.Namespace) -> int:
    from tuner.results.console import Column, print_table
    from tuner.space import space as space_mod

    rows = _space_rows(space_mod.shipped_spaces())
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    columns = [
        Column("name", copy=True),
        Column("kernel"),
        Column("problems"),
        Column("cartesian", "right"),
        Column("valid", "right"),
    ]
    print_table(
        "shipped search spaces",
        columns,
        [
            [
                r["name"],
                r["kernel"],
                ", ".join(r["problems"]),
                f"{r['cartesian']:,}",
                f"{r['valid']:,}" if r["valid_exact"] else f"≥ {r['valid']:,}",
            ]
            for r in rows
        ],
    )
    return 0


def _space_rows(paths) -> list[dict[str, Any]]:
    """One listing row per space file. Counting valid configs walks the space (seconds for the larger ones), so
    rows are kept in ``spaces.json`` under the tuner cache dir, keyed by the file's bytes and the code that
    reads and counts it: an edited space, or another tuner, counts again."""
    import hashlib
    from pathlib import Path

    from tuner.build.compile import cache_dir
    from tuner.build.files import atomic_write
    from tuner.space import space as space_mod

    code = hashlib.sha256(b"".join(path.read_bytes() for path in space_mod.code_files()))
    cache_path = cache_dir() / "spaces.json"
    try:
        cache = json.loads(cache_path.read_text())
        cache = cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        cache = {}
    rows, changed = [], False
    for path in paths:
        key = hashlib.sha256(code.digest() + Path(path).read_bytes()).hexdigest()
        row = cache.get(key)
        if not isinstance(row, dict):
            from tuner.space import space as space_mod

            s = space_mod.load(path)
            valid, exact = s.count_valid_bounded()  # a bounded walk: a huge space must not stall the listing
            row = {
                "name": s.name,
                "kernel": s.kernel,
                "cartesian": s.cartesian,
                "valid": valid,
                "valid_exact": exact,
                "problems": [p.name for p in s.problems],
            }
            cache[key], changed = row, True
        rows.append({**row, "path": str(path)})
    if changed:
        try:
            atomic_write(cache_path, json.dumps(cache), make_parents=True)
        except (OSError, InputError):  # a read-only cache dir: count again next time
            pass
    return rows


def _load_space_and_problem(args: argparse.Namespace):
    from tuner.space import space as space_mod

    s = space_mod.load(args.space)
    problem = s.problem(getattr(args, "problem", None))
    return s, problem


def cmd_render(args: argparse.Namespace) -> int:
    from tuner.build.render import render

    s, problem = _load_space_and_problem(args)
    params = s.config_from_assignments(args.set or [], problem)
    source = render(s.family, params, s.resolve(params, problem), problem.env)
    sys.stdout.write(source.text)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.text import Text

    from tuner.build import compile as compile_mod
    from tuner.build.render import render
    from tuner.results.console import Column, human_seconds, print_table
    from tuner.space import limits

    # Loading the space imports a user's reference and checks it can take its arguments; it is not run here
    # (that allocates the problem's arrays at full size: seconds and GBs for a compile-only command).
    s, problem = _load_space_and_problem(args)
    family = s.family
    configs = s.sample(args.sample, args.seed, problem) if args.sample else s.valid_configs(problem)
    started = time.perf_counter()
    # Rendered before the arch is asked of the GPU (which imports CuPy): a template's fault is said at once.
    sources = [render(family, c, s.resolve(c, problem), problem.env) for c in configs]
    arch = limits.arch(args.arch) if args.arch else compile_mod.default_arch()
    compile_mod.check_includes(s, problem, arch)  # a missing include: one line, not one failure per config
    records: list[dict[str, Any]] = []
    console = Console(stderr=True)
    with Progress(console=console, disable=args.json or not console.is_terminal, transient=True) as progress:
        task = progress.add_task(f"compiling {len(sources)} configs for {arch}", total=len(sources))
        for config, (source, result) in zip(
            configs, compile_mod.compile_many(sources, arch=arch, jobs=args.jobs), strict=True
        ):
            progress.advance(task)
            if result.ok:
                records.append(
                    {
                        "params": config,
                        "uri": source.uri,
                        "registers": result.registers,
                        "smem_bytes": result.smem_static_bytes,
                        "spill_bytes": result.spill_bytes,
                        "stack_frame_bytes": result.stack_frame_bytes,
                        "cached": result.cached,
                    }
                )
            else:
                records.append({"params": config, "uri": source.uri, "failure": result.kind, "reason": result.reason})
    elapsed = time.perf_counter() - started
    failed = [r for r in records if "failure" in r]
    errors = distinct_errors(failed)
    summary = {
        "space": str(s.path),
        "arch": arch,
        "compiled": len(records) - len(failed),
        "failed": len(failed),
        "seconds": round(elapsed, 3),
        "configs_per_s": round(len(records) / elapsed, 1) if elapsed else None,
        "errors": errors,
        "configs": records,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        columns = [
            Column("uri", copy=True),
            Column("registers", "right"),
            Column("smem", "right"),
            Column("spills", "right"),
            Column("status"),
        ]
        rows = [
            [
                r["uri"],
                str(r["registers"]),
                str(r["smem_bytes"]),
                str(r["spill_bytes"]),
                Text("spills", style="yellow") if r["spill_bytes"] else "ok",
            ]
            for r in records
            if "failure" not in r
        ]
        print_table(
            f"{s.name}: {len(records)} configs, {arch}",
            columns,
            rows,
            notes=[
                f"compiled {summary['compiled']}, failed {summary['failed']} in {human_seconds(elapsed)} "
                f"({summary['configs_per_s']} configs/s)",
                *(
                    f"{e['configs']} config{'s' if e['configs'] > 1 else ''}: {e['reason']}"
                    + (f" (first: {e['first']})" if e["configs"] > 1 else "")
                    for e in errors
                ),
            ],
        )
    return 1 if failed else 0


def distinct_errors(failed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The check's failed records (each with "uri" and "reason") as one entry per distinct error, most configs
    first: {"configs": how many share it, "reason": the error, "first": the first config's uri}. NVRTC names each
    config's file after its uri (``URI.cu(12): error: ...``), so errors are compared with the uri written
    ``<uri>``; an error only one config has keeps its own name."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in failed:
        groups.setdefault(record["reason"].replace(record["uri"], "<uri>"), []).append(record)
    return [
        {"configs": len(group), "reason": key if len(group) > 1 else group[0]["reason"], "first": group[0]["uri"]}
        for key, group in sorted(groups.items(), key=lambda item: -len(item[1]))
    ]


# ---------------------------------------------------------------------------------------------------------------
# bench / ceiling (one GPU, in a worker process so a faulting kernel cannot take the CLI down)


def _start_gpu(evaluator, gpu: int) -> dict[str, Any]:
    """Start the GPU worker; no usable GPU or driver is a one-line error, not a traceback."""
    from tuner.gpu.worker import WorkerError
    from tuner.space import limits

    limits.require_gpu(gpu)  # in words, before a worker process starts only to fail
    try:
        return evaluator.start()
    except WorkerError as exc:
        raise InputError(f"GPU {gpu} is not usable: {str(exc).splitlines()[0].split(': ', 1)[-1]}") from None


def cmd_bench(args: argparse.Namespace) -> int:
    from tuner.api import run_bench
    from tuner.results.console import Column, print_table

    s, problem = _load_space_and_problem(args)
    params = s.config_from_assignments(args.set or [], problem)
    result, info = run_bench(s, params, problem, gpu=args.gpu, timeout_s=args.timeout, budget_ms=args.budget_ms)
    record = {
        "space": str(s.path),
        "problem": problem.name,
        "params": params,
        "gpu": info.get("gpu"),
        **result.to_dict(),
    }
    if args.json:
        print(json.dumps(record, indent=2, default=str))
        return 0 if result.ok else 1
    print_table(
        f"{s.name} on {info.get('gpu')}",
        [Column("field"), Column("value", copy=True)],
        [
            [key, f"{value:.4g}" if isinstance(value, float) else str(value)]
            for key, value in record.items()
            if key not in ("clocks", "versions", "log")
        ],
    )
    return 0 if result.ok else 1


def cmd_ceiling(args: argparse.Namespace) -> int:
    from tuner.gpu.worker import IsolatedEvaluator

    # Measured afresh (never the cached figure), and stored for the studies that follow.
    with IsolatedEvaluator(gpu=args.gpu, timeout_s=120.0, evaluator_kwargs={"ceiling": "measure"}) as evaluator:
        info = _start_gpu(evaluator, args.gpu)
    record = {
        "gpu": info["gpu"],
        "ceiling_tbps": info["ceiling_tbps"],
        "method": (
            "cudaMemcpyAsync D2D, 2 GiB, read + write counted, median of event-timed repetitions with L2 flushed "
            "(a read of twice the L2)"
        ),
    }
    print(
        json.dumps(record, indent=2)
        if args.json
        else f"{record['gpu']}: {record['ceiling_tbps']:.3f} TB/s ({record['method']})"
    )
    return 0


# ---------------------------------------------------------------------------------------------------------------
# study


def _start_gpu_workers_early(args: argparse.Namespace, kernel: str | None) -> None:
    """Start the local engine's GPU worker processes before the study's own imports and set-up (Optuna, the
    space, the storage), which they overlap; a study refused meanwhile stops them on exit. First the checks that
    take milliseconds (`tuner.study.preflight`: the study's name; a SQLite file's storage, which must take a write), so
    that a study refused by them starts no worker; and none start for a study that may hold its trials already:
    the driver's exact check then comes first (it starts them itself otherwise)."""
    from tuner.gpu.worker import launch_gpu_workers
    from tuner.results.dbfiles import default_storage_url, plain_sqlite_file, storage_url
    from tuner.space import limits
    from tuner.study import preflight

    preflight.check_study_name(args.study_name)
    url = storage_url(args.storage) if args.storage is not None else kernel and default_storage_url(kernel)
    if url and plain_sqlite_file(url) is not None:  # another URL needs SQLAlchemy, or a server: the driver's
        preflight.check_storage(url, given=args.storage is not None)
    if kernel and preflight.maybe_complete(args.storage, kernel, args.trials, args.study_name):
        return
    available = limits.local_gpus() or 0
    launch_gpu_workers(min(args.gpus or available, available), timeout_s=args.timeout)


def cmd_study(args: argparse.Namespace) -> int:
    kernel = args.kernel
    if args.space is None and kernel.endswith((".yaml", ".yml")):
        # `tuner study my_space.yaml ...`: the space file names its kernel
        args.space, kernel = kernel, None
    if (args.engine in (None, "local") and not args.ray_address) and not (args.replay or args.in_process):
        _start_gpu_workers_early(args, kernel)
    from tuner.api import study

    summary = study(
        args.space or kernel,
        args.trials,
        kernel=kernel,
        sampler=args.sampler,
        storage=args.storage,
        study_name=args.study_name,
        seed=args.seed,
        gpus=args.gpus,
        ray_address=args.ray_address,
        engine=args.engine,
        timeout=args.timeout,
        replay=args.replay,
        replay_study=args.replay_study,
        replay_delay=args.replay_delay,
        in_process=args.in_process,
        problem=args.problem,
        objectives=args.objectives,
        repair=args.repair,
        ordered=not args.categorical,
        screen_cutoff=args.screen_cutoff,
        screen_ms=args.screen_ms,
        takeover=args.takeover,
        progress=not args.json,
    ).summary
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    # The study has closed its GPU workers, its writer and its database; without Ray (whose exit handler stops the
    # cluster it started) nothing is left for the interpreter's teardown to do but spend a few tenths of a second.
    args.exit_at_once = "ray" not in sys.modules
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    from tuner.starter import write_starter

    for path in write_starter(args.name):
        print(f"wrote {path}")
    print(
        f"next: tuner check {args.name}.yaml   (then, on a GPU: tuner study {args.name} --space {args.name}.yaml "
        "--trials 100)"
    )
    return 0


# ---------------------------------------------------------------------------------------------------------------
# results

STUDY_HELP = "a study's name or its kernel's (found in studies/*.db, or in --storage), or a .db path"
STORAGE_HELP = "a storage URL or .db path to look in (default: every studies/*.db under the current directory)"


def _complete_study(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """Shell completion of STUDY: the study names in --storage, else in studies/*.db."""
    from tuner.results.studies import study_names

    try:
        names = study_names(getattr(parsed_args, "storage", None))
    except InputError:
        return []
    return [name for name in names if name.startswith(prefix)]


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
# results: pareto / export / dashboard / trials / best (outputs are checked before any work, written atomically)


def cmd_studies(args: argparse.Namespace) -> int:
    from tuner.results import studies
    from tuner.results.console import Column, print_table

    rows = studies.list_studies(args.storage)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    where = args.storage or f"{studies.STUDIES_DIR}/*.db"
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
                f"{r['best']:.3f} {r['unit']}" if r["best"] is not None else "",
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

    from tuner.results.dbfiles import sqlite_path

    path = sqlite_path(url)
    if path is None:
        return url
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def cmd_pareto(args: argparse.Namespace) -> int:
    from tuner.results import export
    from tuner.results.console import Column, print_table

    if args.out:
        export.check_writable(args.out, (".csv", ".json"), "--out")
    if args.plot:
        export.check_writable(args.plot, (".png", ".html"), "--plot")
    study = export.open_study(args.study, args.storage)
    front = export.pareto_trials(study)
    unit = export.throughput_unit(study)
    measured = len(export.measured_trials(study))
    columns = [
        Column("#", "right"),
        Column("uri", copy=True),
        Column(unit, "right"),
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
                str(a.get("uri", "")),
                f"{export.throughput(study, t):.3f}",
                _fmt(a.get("fraction_of_ceiling"), ".3f"),
                _fmt(a.get("registers")),
                _fmt(a.get("smem_bytes")),
                _fmt(a.get("spill_bytes")),
                _fmt(a.get("blocks_per_sm")),
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


def cmd_import_kt(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tuner.results import kt

    out = Path(args.out)
    if out.suffix not in (".yaml", ".yml"):
        raise InputError("-o: the space file must end in .yaml or .yml", args.out)
    text, valid = kt.space_text(kt.read_cache(args.cache), args.cache)
    out.write_text(text)
    print(
        f"wrote {out}: {valid} valid configs; run it with tuner study kt --space {out} --replay {args.cache} --trials N"
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from tuner.results import export

    if args.kt_cache:
        from tuner.results import kt

        study = export.open_study(args.study, args.storage)
        print(f"wrote {kt.write_cache(study, args.kt_cache)}: study {study.study_name} as a Kernel Tuner cache")
        if not args.header:
            return 0
    if not args.header:
        raise InputError("tuner export: give --header PATH, --kt-cache PATH, or both")
    export.check_namespace(args.namespace)
    export.check_writable(args.header, None, "--header")
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
    print(f"wrote {path}: {len(study.get_trials(deepcopy=False))} trials of {study.study_name}")
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


def cmd_best(args: argparse.Namespace) -> int:
    from tuner.api import open_study

    best = open_study(args.study, args.storage).best
    if args.json:
        print(json.dumps(best, indent=2, default=str))
        return 0
    from rich.text import Text

    from tuner.results.console import Cell, print_lines

    unit = best["throughput_unit"]
    lines: list[Cell] = [
        Text.assemble(
            (str(best["uri"]), "bold"), f"  (trial {best['number']} of {best['study']}, {best.get('gpu') or '?'})"
        ),
        "params:     " + ", ".join(f"{k}={v}" for k, v in best["params"].items()),
        f"throughput: {best['throughput']:.3f} {unit}"
        + _of_roof(best)
        + (f"; median {best['median_ms']:.4g} ms" if best.get("median_ms") else ""),
        f"resources:  {_fmt(best.get('registers'))} registers/thread, {_fmt(best.get('smem_bytes'))} B "
        f"SMEM/block, {_fmt(best.get('spill_bytes'))} B spills, {_fmt(best.get('threads'))} threads/block",
        f"occupancy:  {_fmt(best.get('blocks_per_sm'))} blocks/SM, {_fmt(best.get('warps_per_sm'))} warps/SM"
        + (f" ({best['occupancy']:.0%} of 64)" if best.get("occupancy") is not None else ""),
    ]
    # The source's path or the command that prints it on a line of its own, so it copies whole.
    if "source_path" in best:
        lines += ["source:", "    " + best["source_path"]]
    else:
        lines += ["source (prints it):", "    " + best["render_command"]]
    print_lines(lines)
    return 0


# ---------------------------------------------------------------------------------------------------------------
# registration


def _add_results_commands(sub: argparse._SubParsersAction) -> None:
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
    p.add_argument("--port", type=_port, default=8080)
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

    p = sub.add_parser("best", help="the fastest verified config of a study")
    p.add_argument("study", help=STUDY_HELP).completer = _complete_study  # type: ignore[attr-defined]
    p.add_argument("--storage", help=STORAGE_HELP)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_best)


# ---------------------------------------------------------------------------------------------------------------
# parser and entry point


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tuner", description="Auto-tune memory-bound CUDA kernels.")
    parser.add_argument("--version", action="version", version=f"tuner {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("spaces", help="list the shipped search spaces with their sizes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_spaces)

    p = sub.add_parser("render", help="print the CUDA source of one config")
    p.add_argument("space", help="a space file or the name of a shipped space")
    p.add_argument("--set", action="append", metavar="NAME=VALUE", help="override a param of the default config")
    p.add_argument("--problem", help="problem name (default: the space's first)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("check", help="render and compile all valid configs (or a sample); report resources")
    p.add_argument("space")
    p.add_argument("--sample", type=_positive_int, help="compile a seeded sample of N valid configs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=_positive_int, help="parallel compiles (default: all cores)")
    p.add_argument("--arch", help="e.g. sm_90 (default: GPU 0's, else sm_90)")
    p.add_argument("--problem")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("bench", help="verify and time one config on a GPU")
    p.add_argument("space")
    p.add_argument("--set", action="append", metavar="NAME=VALUE")
    p.add_argument("--problem")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--timeout", type=_positive_float, default=60.0, help="seconds before the kernel is a hang")
    p.add_argument("--budget-ms", type=_positive_float, default=100.0, help="timed work per config")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("ceiling", help="measure the device-to-device copy bandwidth")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ceiling)

    p = sub.add_parser("new", help="write a starter kernel (template, space, reference) into this directory")
    p.add_argument("name", help="the kernel's name (an identifier)")
    p.set_defaults(func=cmd_new)

    from tuner.space.limits import ENGINES, SAMPLERS

    p = sub.add_parser("study", help="run (or resume) an Optuna study over the GPUs Ray sees")
    p.add_argument("kernel", help="kernel family, e.g. gemm, or a space file (.yaml), whose kernel is then the family")
    p.add_argument("--space", help="space file (default: the shipped space named after the kernel)")
    p.add_argument("--trials", type=_positive_int, required=True, help="trials the study should end with")
    p.add_argument(
        "--storage",
        help="a .db path or SQLAlchemy URL (default sqlite:///studies/KERNEL.db, relative to the current directory)",
    )
    p.add_argument("--study-name", help="default: KERNEL-PROBLEM-GPU, so the same command resumes")
    p.add_argument("--sampler", choices=SAMPLERS, default="tpe")
    p.add_argument("--seed", type=int)
    p.add_argument("--gpus", type=_positive_int, help="GPU workers (default: every GPU Ray sees)")
    p.add_argument("--ray-address", help="join an existing Ray cluster (default: start one locally)")
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=60.0,
        help="the most seconds a config may take before it is a hang (its deadline fits it: tuner.gpu.deadline)",
    )
    p.add_argument(
        "--engine",
        choices=ENGINES,
        help="local: GPU worker processes and compile threads on this machine, no Ray (the default "
        "without --ray-address); ray: Ray actors and tasks (the default with --ray-address)",
    )
    p.add_argument("--replay", metavar="PATH", help="answer from a recorded study instead of a GPU")
    p.add_argument(
        "--replay-delay",
        type=_seconds,
        default=0.0,
        metavar="S",
        help="seconds each replayed answer takes, standing in for GPU time",
    )
    p.add_argument(
        "--takeover",
        action="store_true",
        help="take the study over from a driver that holds it (after that driver's host crashed)",
    )
    p.add_argument("--replay-study", metavar="NAME", help="the study to replay when the file holds several")
    p.add_argument(
        "--in-process", action="store_true", help="with --replay: answer in this process (no Ray), one config in flight"
    )
    p.add_argument(
        "--repair",
        choices=("nearest", "random"),
        default="nearest",
        help="after a proposal that cannot be measured, measure the nearest unexplored valid config "
        "(default) or a uniform draw among them",
    )
    p.add_argument(
        "--objectives",
        choices=("first", "all"),
        default="first",
        help="search the space's first objective (throughput; default; the Pareto front of registers "
        "and SMEM comes from all measured trials) or all of them (multi-objective)",
    )
    p.add_argument(
        "--categorical",
        action="store_true",
        help="show the sampler every param as categorical (default: numeric params are ordered)",
    )
    p.add_argument(
        "--screen-cutoff",
        type=_screen_cutoff,
        default=1.05,
        metavar="X",
        help="stop timing a config after its 3-repetition estimate when that is over X times the best median "
        "so far (default 1.05; off: every config gets the full budget)",
    )
    p.add_argument(
        "--screen-ms",
        type=_positive_float,
        default=5.0,
        metavar="MS",
        help="timed work per config while screening, at least 10 launches (default 5); finalists get more",
    )
    p.add_argument("--problem")
    p.add_argument("--json", action="store_true", help="print the summary as JSON, no progress bar")
    p.set_defaults(func=cmd_study)

    p = sub.add_parser("import-kt", help="write a space YAML for a Kernel Tuner cache file (replay only)")
    p.add_argument("cache", help="a Kernel Tuner cache, .json or .json.gz")
    p.add_argument("-o", "--out", required=True, metavar="SPACE.yaml")
    p.set_defaults(func=cmd_import_kt)

    _add_results_commands(sub)  # studies, pareto, export, dashboard, trials, best

    from tuner.lesson import add_commands as add_lesson_commands

    add_lesson_commands(sub)  # explain, lesson
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tuner")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from tuner import __version__

        return __version__


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if words[:1] == ["study"] and not {"-h", "--help", "--in-process"} & set(words):
        # A study will need its writer process (tuner.study.writer): start it before this process builds its parser,
        # so that the writer's imports (a second or two) overlap everything after. Bad flags end it with us.
        from tuner.study.writer import launch_writer

        launch_writer()
    parser = build_parser()
    if "_ARGCOMPLETE" in os.environ:  # a shell asking for completions (register-python-argcomplete tuner)
        import argcomplete

        argcomplete.autocomplete(parser)
    try:
        args = parser.parse_args(argv)
        from tuner.build.cachedirs import ensure_writable
        from tuner.build.child import profiled

        ensure_writable()  # before anything imports CuPy or starts a process that will (they inherit the choice)
        code = int(profiled(f"tuner-{words[0] if words else 'help'}", args.func, args) or 0)
        sys.stdout.flush()  # inside the try: a reader that went away is a BrokenPipeError caught below
        if argv is None and getattr(args, "exit_at_once", False):  # the command line's own process, not a caller's
            sys.stderr.flush()
            os._exit(code)
        return code
    except InputError as exc:
        print(f"tuner: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tuner: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`tuner spaces --json | head`): nothing more to say, and Python must not
        # complain again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
