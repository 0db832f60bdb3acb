"""benchmarks/README.md, written from the recorded results in benchmarks/results/.

    python benchmarks/readme_tables.py            # rewrite benchmarks/README.md
    python benchmarks/readme_tables.py --check    # exit 1 if it is not what the results say

Every figure in the file comes from a results JSON file, printed with the command, GPU and date recorded beside
it; the prose here says what each table is and names the files, never a figure. A new recording shows up once its
file is named below and the script is run again (tests/test_readme.py checks that the file is up to date).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "benchmarks" / "README.md"

# The close calls, round by round, with the stream hold (benchmarks/head_to_head.py).
HEAD_TO_HEAD = [
    "head_to_head-2026-12-01-hold-a.json",
    "head_to_head-2026-12-01-hold-b.json",
    "head_to_head-2026-12-01-hold-decode-attention.json",
]

# The studies of record: the read-flush calls of 2026-12-01, peers timed in the same call.
STUDIES = [
    "catalog-2026-12-01-transpose-order.json",
    "catalog-2026-12-01-readflush.json",
    "catalog-2026-12-01-readflush-b.json",
    "catalog-2026-12-01-rmsnorm-l2.json",
    "decode-2026-12-01-gemv-readflush-b.json",
    "decode-2026-12-01-readflush-gemv-m2-m4.json",
    "decode-2026-12-01-gemv-readflush.json",
    "decode-2026-12-01-gemv-grid-m16-m32.json",
    "decode-2026-12-01-gemv-mtile.json",
    "decode-2026-12-01-gemv-llama.json",
    "decode-2026-12-01-readflush-fp8-rope.json",
    "decode_b-2026-12-01-readflush.json",
    "decode_b-2026-12-01-readflush-b.json",
]

# The copy exercise and the 1 GiB copy beside cudaMemcpy (benchmarks/peers.py).
COPY = "peers-2026-12-01-copy.json"

# The main job, `tuner study gemm --space search_spaces/gemm.yaml --trials 500` (benchmarks/study_gemm.py), with
# empty caches: the latest code first, then the runs of 2026-12-01.
MAIN_JOB = [
    "study_gemm-2026-12-06-c/two-knob-run1.json",
    "study_gemm-2026-12-06-c/two-knob-run2.json",
    "study_gemm-2026-12-06-c/two-knob-run3.json",
    "study_gemm-2026-12-06-c/before-two-knob-run1.json",
    "study_gemm-2026-12-06-c/before-two-knob-run2.json",
    "study_gemm-2026-12-06-forest-b.json",
    "study_gemm-2026-12-06-forest.json",
    "study_gemm-2026-12-03-stages.json",
    "study_gemm-2026-12-03.json",
    "study_gemm-2026-12-02-compile-processes.json",
    "study_gemm-2026-12-01-final/final-code-seed4.json",
    "study_gemm-2026-12-01-final/listing-seed1.json",
    "study_gemm-2026-12-01-final/listing-seed2.json",
    "study_gemm-2026-12-01-final/listing-seed3.json",
    "study_gemm-2026-12-01-readflush/seed1-kernels-before-ceiling.json",
    "study_gemm-2026-12-01-readflush/seed1-prebuild.json",
    "study_gemm-2026-12-01-readflush/seed1-ptx-flush.json",
]

# Tuning throughput against Kernel Tuner 1.5 (benchmarks/vs_kernel_tuner.py).
VS_KERNEL_TUNER = "vs_kernel_tuner-2026-12-01-hold.json"

# A user's own bf16 kernel (benchmarks/own_kernel.py) and the README's example (benchmarks/example_scale_add.py).
OWN_KERNEL = "own_kernel-2026-12-03.json"
EXAMPLE = "example_scale_add-2026-11-30.json"

# The gallery under examples/, tuned as a user types it (benchmarks/gallery.py).
GALLERY = "gallery-2026-12-06.json"

# The GPU tests from cold, in fresh processes (benchmarks/gpu_suite_cold.sh): its summary file and its report.
GPU_SUITE = "gpu-suite-cold-2026-12-06/fourth-call.txt"
GPU_SUITE_REPORT = "gpu-suite-cold-2026-12-06.md"


def load(name: str) -> list[dict]:
    """A results file's records: a list of rows, a {"summaries": [...]} file, or a single record."""
    data = json.loads((RESULTS / name).read_text())
    if isinstance(data, dict):
        return data["summaries"] if "summaries" in data else [data]
    return data


def link(name: str) -> str:
    return f"[{name}](results/{name})"


def fmt(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def table(header: list[str], rows: Iterable[list[str]], right: Iterable[int] = ()) -> list[str]:
    align = ["---:" if i in set(right) else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def provenance(files: list[str]) -> list[str]:
    """One line per file: its command(s), GPU(s) and date(s), as recorded."""
    lines = []
    for name in files:
        records = [r for r in load(name) if isinstance(r, dict)]
        # a merged record lists the commands of its parts
        given = [
            r["command"] if isinstance(r["command"], list) else [r["command"]] for r in records if r.get("command")
        ]
        commands = sorted({c for cs in given for c in cs})
        gpus = sorted({r["gpu"] for r in records if r.get("gpu")})
        facts = gpus + sorted({r["date"] for r in records if r.get("date")})
        said = "; ".join(f"`{c}`" for c in commands)
        lines.append(f"- {link(name)}: {said} ({', '.join(facts)})")
    return lines


def problem_of(row: dict) -> str:
    return str(row.get("problem") or row.get("shape", "")).split(" ")[0]


# ---------------------------------------------------------------------------------------------------------------
# sections


def head_to_head() -> list[str]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for name in HEAD_TO_HEAD:
        for row in load(name):
            groups.setdefault((row["kernel"], row["problem"]), []).append(row)
    kernels = list(dict.fromkeys(kernel for kernel, _ in groups))

    def order(key: tuple[str, str]) -> tuple[int, str]:
        kernel, problem = key
        return kernels.index(kernel), re.sub(r"\d+", lambda m: m.group().zfill(6), problem)

    rows = []
    for kernel, problem in sorted(groups, key=order):
        peers = groups[kernel, problem]
        best = max(peers, key=lambda r: r["peer_TBps_median"])
        others = ", ".join(
            f"{r['peer']} {r['ratio_median']:.3f}×"
            for r in sorted(peers, key=lambda r: -r["ratio_median"])
            if r is not best
        )
        rows.append(
            [
                f"{kernel} {problem}",
                fmt(best["tuner_TBps_median"], 3),
                best["peer"],
                fmt(best["peer_TBps_median"], 3),
                f"{best['ratio_median']:.4f}",
                f"{best['rounds_ours_faster']}/{best['rounds_compared']}",
                f"{best['verdict']} (p {best['sign_test_p']})",
                others,
            ]
        )
    header = ["kernel, problem", "ours TB/s", "best peer", "peer TB/s", "ours / peer", "ours faster", "verdict"]
    return [
        "## Against the best peer, round by round",
        "",
        "`benchmarks/head_to_head.py` times our config of record and each peer once per round, in a shuffled order,",
        "ten rounds in one process, our config re-verified every round, every timing behind the stream hold; a peer",
        "is ahead or behind only when a sign test over the rounds says so (p < 0.05). TB/s are the medians of the",
        "rounds, the ratio the median of the rounds' ratios. The best peer is the one with the highest median; the",
        "last column has the ratio against every other peer.",
        "",
        *table([*header, "other peers, ours / peer"], rows, right=(1, 3, 4, 5)),
        "",
        *provenance(HEAD_TO_HEAD),
        "",
    ]


def studies() -> list[str]:
    rows = []
    for name in STUDIES:
        records = load(name)
        for row in records:
            if row.get("impl") != "tuner":
                continue
            peers = [
                r
                for r in records
                if r.get("kernel") == row["kernel"]
                and problem_of(r) == problem_of(row)
                and not str(r.get("impl", "")).startswith("tuner")
                and r.get("TBps") is not None
            ]
            best = max(peers, key=lambda r: r["TBps"]) if peers else None
            copy = row.get("copy_same_bytes_TBps")
            rows.append(
                [
                    f"{row['kernel']} {problem_of(row)}",
                    fmt(row["TBps"]),
                    fmt(row.get("fraction_of_ceiling"), 3),
                    fmt(row["TBps"] / copy if copy else None, 2),
                    str(row.get("trials", "")),
                    fmt(row.get("study_wall_s"), 1),
                    f"{best['impl']} {best['TBps']:.2f}" if best else "",
                    f"`{row['uri']}`",
                    link(name),
                ]
            )
    header = ["kernel, problem", "TB/s", "× ceiling", "× copy", "trials", "study s", "best peer, same call", "config"]
    return [
        "## The studies of record",
        "",
        "Each row is the best config of a `tuner study` (TPE, or `--sampler grid` where the trials run into the",
        "thousands; each file's command names the space), re-timed, and the peers timed in the same call without",
        "the stream hold, so a peer whose host-side dispatch is heavy may show host time here; the verdicts are in",
        "the table above. × ceiling is the fraction of the device-to-device copy ceiling measured at the study's",
        "start; × copy is against a cudaMemcpy of the same byte count in the same call.",
        "",
        *table([*header, "file"], rows, right=(1, 2, 3, 4, 5)),
        "",
        *provenance(STUDIES),
        "",
    ]


def copy_exercise() -> list[str]:
    records = load(COPY)
    by_problem: dict[str, dict[str, dict]] = {}
    for row in records:
        by_problem.setdefault(row["shape"], {})[row["impl"]] = row
    impls = [i for i in dict.fromkeys(r["impl"] for r in records if "stride" in r["shape"])]
    rows = []
    for shape, impl_rows in by_problem.items():
        if "stride" not in shape:
            continue
        rows.append([shape, *[fmt(impl_rows[i]["TBps"]) if i in impl_rows else "" for i in impls]])
    ceiling = [r for r in records if r["impl"] == "cudaMemcpy"]
    lines = [
        "## The copy exercise",
        "",
        "The coalesced vs strided copy (`copy` family) over stride 1..32, each peer copying the same elements; TB/s",
        "count the useful bytes.",
        "",
        *table(["problem", *impls], rows, right=range(1, len(impls) + 1)),
        "",
    ]
    if ceiling:
        lines += [f"The copy ceiling of the call: {ceiling[0]['shape']} {fmt(ceiling[0]['TBps'], 3)} TB/s.", ""]
    return [*lines, *provenance([COPY]), ""]


def main_job() -> list[str]:
    rows = []
    for name in MAIN_JOB:
        records = {r["impl"]: r for r in load(name)}
        study, best, cublas = records["tuner study (main job)"], records["tuner"], records["cublas"]
        seed = re.search(r"--seed (\d+)", study["study_command"])
        rows.append(
            [
                link(name),
                study["date"],
                study.get("gpu", "").removeprefix("NVIDIA ").split(" ")[0],
                seed.group(1) if seed else "",
                study["caches"],
                str(study["trials"]),
                fmt(study["wall_s"], 1),
                fmt(study["cold_start_s"], 1),
                fmt(study["gpu_busy_fraction"], 2),
                fmt(best["TFLOPs"], 1),
                fmt(cublas["TFLOPs"], 1),
                f"{best['ratio_vs_cublas']:.3f}",
                f"`{best['uri']}`",
            ]
        )
    header = ["file", "date", "GPU", "seed", "caches", "trials", "wall s", "first result s", "GPU busy", "TFLOP/s"]
    return [
        "## The main job",
        "",
        "`tuner study gemm --space search_spaces/gemm.yaml --trials 500` on one GPU, run by `benchmarks/study_gemm.py`",
        "with empty tuner and CuPy caches, timed from before the process starts to its exit; its best config and",
        "cuBLAS SGEMM (TF32 off) are then re-timed side by side. The kernel is FP32 GEMM 4096³ with a fused",
        "bias → GELU → residual epilogue; TFLOP/s count 2MNK. A seed does not fix the path of an asynchronous",
        "search: results that arrive in another order change the next proposals.",
        "",
        *table([*header, "cuBLAS TFLOP/s", "× cuBLAS", "best config"], rows, right=(3, 5, 6, 7, 8, 9, 10, 11)),
        "",
        *provenance(MAIN_JOB),
        "",
    ]


def vs_kernel_tuner() -> list[str]:
    records = {r["impl"]: r for r in load(VS_KERNEL_TUNER)}
    ours = records["tuner"]
    rows = [
        [
            "tuner (every config verified on the GPU)",
            fmt(ours["wall_s"], 1),
            fmt(ours["subprocess_wall_s"], 1),
            fmt(ours["TBps"], 3),
            fmt(ours["trials_per_gpu_minute_full_wall"], 0),
        ]
    ]
    for impl in ("kernel_tuner unverified", "kernel_tuner answer"):
        row = records[impl]
        rows.append(
            [
                f"Kernel Tuner {row['kernel_tuner']}, {impl.split()[1]} ({row['verification']})",
                fmt(row["wall_s"], 1),
                fmt(row["subprocess_wall_s"], 1),
                fmt(row["TBps"], 3),
                fmt(row["trials_per_gpu_minute"], 0),
            ]
        )
    comparison = records["comparison"]
    return [
        "## Tuning throughput against Kernel Tuner",
        "",
        f"The same {ours['trials']} transpose configs ({ours['shape']}), empty caches. Our wall is the whole command,",
        "from its start to the last write to the database; Kernel Tuner's is `tune_kernel`'s, call to return; the",
        "process walls include the interpreter's start and exit on both sides.",
        "",
        *table(["tuner", "wall s", "process wall s", "best TB/s", "trials per GPU-minute"], rows, right=(1, 2, 3, 4)),
        "",
        f"Ours / Kernel Tuner's trials per GPU-minute over our whole wall: "
        f"{comparison['trials_per_gpu_minute_ratio_vs_kernel_tuner_unverified_full_wall']:.2f}× unverified, "
        f"{comparison['trials_per_gpu_minute_ratio_vs_kernel_tuner_full_wall']:.1f}× with `answer`; process to "
        f"process {comparison['trials_per_gpu_minute_ratio_process_to_process_unverified']:.1f}× and "
        f"{comparison['trials_per_gpu_minute_ratio_process_to_process']:.1f}×.",
        "",
        *provenance([VS_KERNEL_TUNER]),
        "",
    ]


def own_kernels() -> list[str]:
    rows = []
    for row in load(OWN_KERNEL):
        kt = (
            fmt(row["kernel_tuner_wall_s"], 1)
            if row["kernel_tuner_wall_s"] is not None
            else f"{row['kernel_tuner_configs_done']} configs in {row['kernel_tuner_stopped_after_s']} s"
        )
        rows.append(
            [
                f"SwiGLU bf16 {row['problem']}",
                f"{row['problem_bytes'] / 1e6:.0f} MB",
                str(row["configs"]),
                fmt(row["wall_s"], 1),
                fmt(row["per_config_overhead_s"], 4),
                kt,
                fmt(row["triton_s_per_config"], 3),
                f"{row['vs_torch_compile']:.4f} ({row['vs_torch_compile_verdict']})",
            ]
        )
    example = load(EXAMPLE)[0]
    commands = ", ".join(f"`{c}`" for c in example["commands"])
    best = example["best"]
    header = [
        "kernel",
        "bytes",
        "configs",
        "tuner whole wall s",
        "tuner overhead s/config",
        "Kernel Tuner s",
        "Triton s/config",
    ]
    return [
        "## Your own kernel",
        "",
        "A user's bf16 SwiGLU written against `cuda_bf16.h` with a NumPy reference (`benchmarks/own_kernel/`),",
        "every config of its space by tuner (whole wall, start-up included), by Kernel Tuner 1.5 and by Triton's",
        "`@autotune`, then ours beside torch.compile's fused kernel.",
        "",
        *table([*header, "ours / torch.compile"], rows, right=(1, 2, 3, 4, 6, 7)),
        "",
        f"The README's example (`examples/scale_add`, {example['problem']}): {example['trials']} configs in "
        f"{fmt(example['study_wall_s'], 1)} s of study, best `{best['uri']}` at {fmt(best['tbps'], 3)} TB/s, "
        f"{fmt(best['fraction_of_ceiling'], 3)}× the copy ceiling ({example['gpu']}, {example['date']}, "
        f"`{example['script']}`, which runs {commands}; {link(EXAMPLE)}).",
        "",
        f"The table summarises {link(OWN_KERNEL)}, which names the runs it is drawn from:",
        "",
        # a record merged by hand names its source files; one merged by `own_kernel.py --merge` is its own source
        *provenance(list(load(OWN_KERNEL)[0].get("sources", {}).values()) or [OWN_KERNEL]),
        "",
    ]


def gallery() -> list[str]:
    rows = []
    records = load(GALLERY)
    for row in records:
        rows.append(
            [
                f"{row['example']} {row['problem']}",
                row["reference"],
                f"{row['trials']} ({row['configs_valid']})",
                fmt(row["wall_s"], 1),
                fmt(row["first_result_s"], 2),
                fmt(row["s_per_config_after_first"], 3),
                f"`{row['best']['uri']}`",
                f"{row['ours_vs_torch_compile']:.3f} ({row['vs_torch_compile_verdict']})",
                f"{row['ours_vs_copy']:.3f}",
            ]
        )
    header = ["example, problem", "reference", "configs (valid)", "wall s", "first result s", "s/config after"]
    return [
        "## The gallery",
        "",
        "Each example under `examples/` tuned as a user types it (`tuner study NAME --space",
        "examples/NAME/NAME.yaml --trials N`, every valid config up to N), in a fresh directory with empty caches,",
        "timed from before the process starts; the first result and the pace after it from the trials' completion",
        "times. Its best config is then timed beside torch.compile of the same op written in torch and a copy of the",
        "same bytes, round by round in one process (the verdict is the sign test's, p < 0.05).",
        "",
        *table([*header, "best config", "ours / torch.compile", "ours / copy"], rows, right=(2, 3, 4, 5, 7, 8)),
        "",
        *provenance([GALLERY]),
        "",
    ]


def gpu_suite() -> list[str]:
    """The summary gpu_suite_cold.sh writes: `key: value` lines, then `run N: exit RC, S s, pytest's last line`."""
    facts, rows = {}, []
    for line in (RESULTS / GPU_SUITE).read_text().splitlines():
        run = re.match(r"run (\d+): exit (\d+), (\d+) s, (.*)$", line)
        if run:
            rows.append([run.group(1), run.group(2), run.group(3), run.group(4)])
        elif ": " in line:
            key, value = line.split(": ", 1)
            facts[key] = value
    return [
        "## The GPU suite from cold",
        "",
        "`bash benchmarks/gpu_suite_cold.sh` runs the GPU tests (`pytest -m gpu`) in fresh processes, the first on a",
        "freshly started machine with no compile, CuPy or ceiling cache.",
        "",
        *table(["run", "exit", "s", "pytest"], rows, right=(0, 1, 2)),
        "",
        f"- {link(GPU_SUITE)}: `{facts['command']}` ({facts['gpu']}, {facts['date'][:10]}, the tree at "
        f"{facts['commit']}); the report of the day's calls: {link(GPU_SUITE_REPORT)}",
        "",
    ]


def purpose(path: Path) -> str:
    """A script's first sentence about itself: its docstring's, or a shell script's first comment."""
    if path.suffix == ".py":
        text = ast.get_docstring(ast.parse(path.read_text())) or ""
    else:
        comments = [line[1:].strip() for line in path.read_text().splitlines()[1:] if line.startswith("#")]
        text = " ".join(comments)
    paragraph = " ".join(text.split("\n\n")[0].split())
    sentence = re.split(r"(?<=[.?])\s", paragraph)[0]
    return sentence.rstrip(".")


def scripts() -> list[str]:
    paths = sorted(p for p in (ROOT / "benchmarks").glob("*.*") if p.suffix in (".py", ".sh"))
    rows = [[f"`{p.name}`", purpose(p)] for p in paths if p.name != Path(__file__).name]
    return [
        "## The scripts",
        "",
        "Each backs a table above or a figure in the docs, and says what it measures in its first line, quoted here.",
        "Those that need a GPU run as one device call and write their results, with the command, GPU and date, to",
        "`benchmarks/results/`. The one-off experiments behind a default, each with what it decided, are in",
        "[experiments/](experiments/README.md).",
        "",
        *table(["script", "what"], rows),
        "",
    ]


def index() -> list[str]:
    """Every recorded report in benchmarks/results/, by its title line."""
    rows = []
    for path in sorted(RESULTS.rglob("*.md")):
        first = path.read_text().splitlines()[0] if path.stat().st_size else ""
        title = first.lstrip("# ").strip()
        rows.append([link(str(path.relative_to(RESULTS))), title])
    return [
        "## Every recorded report",
        "",
        "<details><summary>benchmarks/results/*.md, by title</summary>",
        "",
        *table(["file", "title"], rows),
        "",
        "</details>",
        "",
    ]


def render() -> str:
    lines = [
        "# Benchmarks",
        "",
        "<!-- Written by benchmarks/readme_tables.py from benchmarks/results/: edit the script, not this file. -->",
        "",
        "What tuner's kernels and searches measured on the GPU, and against what. Every figure below is read from a",
        "results file in `benchmarks/results/`, named beside its table with the command that produced it, the GPU",
        "and the date; `python benchmarks/readme_tables.py` writes this page again from them. How a figure is",
        "measured (the L2 flush, the stream hold, the copy ceiling): [docs/timing.md](../docs/timing.md).",
        "",
    ]
    sections = (head_to_head, studies, copy_exercise, main_job, vs_kernel_tuner, own_kernels, gallery, gpu_suite)
    for section in (*sections, scripts, index):
        lines += section()
    return "\n".join(lines).rstrip("\n") + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if benchmarks/README.md is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if README.read_text() != text:
            print(f"{README.relative_to(ROOT)} is out of date: run python benchmarks/readme_tables.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(text)
    print(f"wrote {README.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
