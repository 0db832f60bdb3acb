"""A catalog peer's own kernels, for a profiler: one peer of one (family, problem) launched a few times.

    python benchmarks/experiments/peer_kernels.py rmsnorm r32768_c8192_bf16 [--impl torch.compile] [--launches 5]

The peers are benchmarks/catalog.py's (same inputs, same torch calls). With ``TORCH_LOGS=output_code`` the
Triton source torch.compile generates for the problem goes to stderr; under ``ncu --nvtx --nvtx-include
"peer/"`` the launches (inside an NVTX range "peer", after the compile) are what Nsight Compute profiles, beside
``tuner bench`` of our config.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kernel", help="a shipped family, e.g. rmsnorm")
    parser.add_argument("problem", help="a problem of its shipped space, e.g. r32768_c8192_bf16")
    parser.add_argument("--impl", default="torch.compile", help="the peer, as catalog.py names it")
    parser.add_argument("--launches", type=int, default=5)
    args = parser.parse_args()

    import catalog
    import torch

    from tuner.space import space as space_mod

    problem = space_mod.load(ROOT / "search_spaces" / f"{args.kernel}.yaml").problem(args.problem)
    found = dict(catalog.peers(args.kernel, problem, torch))
    if args.impl not in found:
        print(f"peer_kernels.py: {args.kernel} has no peer {args.impl!r} (it has {', '.join(found)})", file=sys.stderr)
        return 2
    fn = found[args.impl]
    fn()  # compiles (and autotunes) outside the range below
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("peer")  # profile only these: ncu --nvtx --nvtx-include "peer/"
    for _ in range(args.launches):
        fn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    print(f"{args.kernel} {args.problem}: {args.impl} launched {args.launches} times")
    return 0


if __name__ == "__main__":
    sys.exit(main())
