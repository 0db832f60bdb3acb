"""Do NVRTC compiles run in parallel in threads of one process? CuPy's binding against a ctypes call of the same
library, 1 and N threads.

    python benchmarks/nvrtc_threads.py [--threads 8] [--configs 32]

Compiles `--configs` distinct configs of the own-kernel benchmark's SwiGLU (benchmarks/own_kernel/swiglu.cu, with
cuda_bf16.h) for sm_90, uncached, through (a) `cupy_backends.cuda.libs.nvrtc` and (b) ctypes on the same libnvrtc
(`tuner.nvrtc`: a foreign call through ctypes releases the GIL), each with 1 thread and with `--threads` threads,
then (c) in `--threads` processes, and prints seconds per compile: whether a thread pool of compiles scales with
the host's cores, and how far from processes it stays.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _compile_in_process(job) -> int:
    from tuner.build.compile import nvrtc_compile

    text, options = job
    return nvrtc_compile(text, "swiglu.cu", options)[0]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--configs", type=int, default=32)
    args = parser.parse_args()

    from tuner.build.compile import nvrtc_compile
    from tuner.build.includes import system_include_dirs

    text = (ROOT / "benchmarks" / "own_kernel" / "swiglu.cu").read_text()
    include = [f"-I{d}" for d in system_include_dirs()]
    configs = [(v, b, i) for v in (1, 2, 4, 8) for b in (128, 256, 512, 1024) for i in (1, 2, 4)][: args.configs]

    def options(config) -> list[str]:
        vec, block, items = config
        knobs = [f"-Dvec={vec}", f"-Dblock_size_x={block}", f"-Ditems={items}", "-Dmin_blocks=0"]
        return ["-arch=sm_90", *knobs, *include]

    def via_cupy(config) -> int:
        return nvrtc_compile(text, "swiglu.cu", options(config), binding="cupy")[0]

    def via_ctypes(config) -> int:
        return nvrtc_compile(text, "swiglu.cu", options(config), binding="ctypes")[0]

    out: dict[str, object] = {"cpus": os.cpu_count(), "configs": len(configs), "threads": args.threads}
    for name, fn in (("cupy", via_cupy), ("ctypes", via_ctypes)):
        fn(configs[0])  # load the library, warm the headers' pages
        for threads in (1, args.threads):
            started = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                statuses = list(pool.map(fn, configs))
            out[f"{name}_{threads}_threads_s_per_compile"] = round((time.perf_counter() - started) / len(configs), 4)
            out[f"{name}_{threads}_threads_failed"] = sum(1 for s in statuses if s != 0)
    # the same compiles in processes (one interpreter each): what NVRTC does when nothing in-process is shared
    import multiprocessing

    with ProcessPoolExecutor(args.threads, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile_in_process, [(text, options(c)) for c in configs[: args.threads]]))  # warm
        started = time.perf_counter()
        statuses = list(pool.map(_compile_in_process, [(text, options(c)) for c in configs]))
        out[f"processes_{args.threads}_s_per_compile"] = round((time.perf_counter() - started) / len(configs), 4)
        out[f"processes_{args.threads}_failed"] = sum(1 for s in statuses if s != 0)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
