"""What -lineinfo costs NVRTC, and that it leaves the code alone: GEMM configs of the main job compiled with and
without it.

    python benchmarks/experiments/nvrtc_lineinfo.py [--configs 24] [--seed 0] [--order lineinfo,plain] [--out DIR]

Samples `--configs` valid configs of the shipped GEMM space (the main job's kernel), renders each, and compiles it
for sm_90 through `tuner.build.compile.nvrtc_compile` (no cache) twice: with tuner's options plus ``-lineinfo``
and with them alone (they held ``-lineinfo`` until 2026-12-03), one after the other in `--order`
(``plain,lineinfo`` reverses it; ``plain,plain`` compiles the same thing twice: whether a second compile of one
source is cheaper). For each config: both compile
times and whether every ``.text.*`` section (the SASS) of the two cubins is byte for byte the same. Needs no GPU.
Writes ``nvrtc_lineinfo-<date>.json`` under --out (default: $OUT, else benchmarks/results) and prints a summary.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def text_sections(cubin: bytes) -> dict[str, bytes]:
    """The ``.text.*`` sections of an ELF64 little-endian cubin, by name."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize) for i in range(count)]
    names_at = headers[names_index][4]

    def name(offset: int) -> str:
        start = names_at + offset
        return cubin[start : cubin.index(b"\0", start)].decode()

    sections = {name(h[0]): cubin[h[4] : h[4] + h[5]] for h in headers}
    return {k: v for k, v in sections.items() if k.startswith(".text.")}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--order", default="lineinfo,plain", choices=("lineinfo,plain", "plain,lineinfo", "plain,plain")
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()

    from tuner.build.compile import include_options, nvrtc_compile, nvrtc_options, program_name, versions
    from tuner.build.render import render
    from tuner.space import space as space_mod

    s = space_mod.load("gemm")
    problem = s.problems[0]
    rows = []
    warmed = False
    for params in s.sample(args.configs, seed=args.seed, problem=problem):
        source = render(s.family, params, s.resolve(params, problem), problem.env)
        options = [*nvrtc_options(source, "sm_90"), *include_options(source)]
        plain = [o for o in options if o != "-lineinfo"]
        if not warmed:  # the first compile of a process also loads NVRTC's own data: untimed
            nvrtc_compile(source.text, program_name(source), plain)
            warmed = True
        times: list[float] = []
        cubins: list[bytes] = []
        for label in args.order.split(","):
            options = [*plain, "-lineinfo"] if label == "lineinfo" else plain
            start = time.perf_counter()
            status, log, cubin, _ = nvrtc_compile(source.text, program_name(source), options)
            times.append(time.perf_counter() - start)
            if status != 0:
                raise SystemExit(f"{source.uri}: NVRTC status {status}: {log[:300]}")
            cubins.append(cubin)
        same = text_sections(cubins[0]) == text_sections(cubins[1])
        rows.append({"uri": source.uri, "first_s": times[0], "second_s": times[1], "same_sass": same})
        print(f"{source.uri:64s} {times[0]:.3f} s  {times[1]:.3f} s  same SASS: {same}", flush=True)

    first_s = sum(r["first_s"] for r in rows)
    second_s = sum(r["second_s"] for r in rows)
    record = {
        "command": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *sys.argv[1:]]),
        "date": dt.date.today().isoformat(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "versions": versions(),
        "configs": len(rows),
        "order": args.order,
        "first_s_total": first_s,
        "second_s_total": second_s,
        "second_over_first": second_s / first_s,
        "median_ratio": statistics.median(r["second_s"] / r["first_s"] for r in rows),
        "all_same_sass": all(r["same_sass"] for r in rows),
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"nvrtc_lineinfo-{record['date']}-{args.order.replace(',', '-')}.json").write_text(
        json.dumps(record, indent=1) + "\n"
    )
    print(
        f"{len(rows)} configs, {args.order}: {first_s:.2f} s first, {second_s:.2f} s second "
        f"({record['second_over_first']:.2f}x), SASS the same in all: {record['all_same_sass']}"
    )
    return 0 if record["all_same_sass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
