"""Commands on spaces, before any GPU: ``tuner spaces`` (the shipped ones, with their sizes), ``tuner render`` (one
config's CUDA source), ``tuner check`` (render and compile every valid config, or a sample) and ``tuner new``
(a starter kernel of your own).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from tuner.cli.args import positive_int
from tuner.core.errors import InputError


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


def load_space_and_problem(args: argparse.Namespace, renders: bool = False):
    """The space and problem `args` name. With `renders` (a command that renders, compiles or runs configs), a
    space whose kernel has no template (one imported from a Kernel Tuner cache) is refused in one line."""
    from tuner.space import space as space_mod

    s = space_mod.load(args.space)
    problem = s.problem(getattr(args, "problem", None))
    if renders and not s.family.template:
        raise InputError(
            f"kernel {s.kernel!r} has no template: this space can only be replayed "
            f"(tuner study {s.kernel} --space {s.path} --replay CACHE)",
            str(s.path),
        )
    return s, problem


def cmd_render(args: argparse.Namespace) -> int:
    from tuner.build.render import render

    s, problem = load_space_and_problem(args, renders=True)
    params = s.config_from_assignments(args.set or [], problem)
    source = render(s.family, params, s.resolve(params, problem), problem.env)
    sys.stdout.write(source.text)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from tuner.build import compile as compile_mod
    from tuner.build import compilers
    from tuner.build.render import render
    from tuner.space import limits

    # Loading the space imports a user's reference and checks it can take its arguments; it is not run here
    # (that allocates the problem's arrays at full size: seconds and GBs for a compile-only command).
    s, problem = load_space_and_problem(args, renders=True)
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
            configs, compilers.compile_many(sources, arch=arch, jobs=args.jobs), strict=True
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
        _print_check(s.name, summary, elapsed)
    return 1 if failed else 0


def _print_check(name: str, summary: dict[str, Any], elapsed: float) -> None:
    """`tuner check`'s table: each compiled config's resources, then the counts and each distinct error once."""
    from rich.text import Text

    from tuner.gpu.clock import human_seconds
    from tuner.results.console import Column, print_table

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
        for r in summary["configs"]
        if "failure" not in r
    ]
    print_table(
        f"{name}: {len(summary['configs'])} configs, {summary['arch']}",
        columns,
        rows,
        notes=[
            f"compiled {summary['compiled']}, failed {summary['failed']} in {human_seconds(elapsed)} "
            f"({summary['configs_per_s']} configs/s)",
            *(
                f"{e['configs']} config{'s' if e['configs'] > 1 else ''}: {e['reason']}"
                + (f" (first: {e['first']})" if e["configs"] > 1 else "")
                for e in summary["errors"]
            ),
        ],
    )


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


def cmd_new(args: argparse.Namespace) -> int:
    from tuner.cli.starter import write_starter

    for path in write_starter(args.name):
        print(f"wrote {path}")
    print(
        f"next: tuner check {args.name}.yaml   (then, on a GPU: tuner study {args.name} --space {args.name}.yaml "
        "--trials 100)"
    )
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """spaces, render, check."""
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
    p.add_argument("--sample", type=positive_int, help="compile a seeded sample of N valid configs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=positive_int, help="parallel compiles (default: all cores)")
    p.add_argument("--arch", help="e.g. sm_90 (default: GPU 0's, else sm_90)")
    p.add_argument("--problem")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check)


def add_new_command(sub: argparse._SubParsersAction) -> None:
    """new."""
    p = sub.add_parser("new", help="write a starter kernel (template, space, reference) into this directory")
    p.add_argument("name", help="the kernel's name (an identifier)")
    p.set_defaults(func=cmd_new)
