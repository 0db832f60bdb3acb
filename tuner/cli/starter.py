"""`tuner new NAME`: a starter kernel of your own in the current directory.

Three files that work as they are — ``tuner check NAME.yaml`` compiles every config, ``tuner study NAME --space
NAME.yaml`` tunes it on a GPU — and that show where the knobs of a memory-bound kernel go: vector width, launch
bounds, the tile of work per thread and block, and shared-memory padding.

* ``NAME.cu.j2``: the kernel template (Jinja2; every knob is a template variable);
* ``NAME.yaml``: the search space with a declarative ``kernel:`` block (arguments, launch geometry, tolerance);
* ``NAME_ref.py``: the NumPy reference the GPU's output is checked against.
"""

from __future__ import annotations

from pathlib import Path

from tuner.core.errors import InputError
from tuner.kernels.plain import C_IDENTIFIER, C_IDENTIFIER_RULE

TEMPLATE = """\
{#
  __NAME__.cu.j2: y = 2 * x over n floats. Replace the body with your kernel; keep the entry point's name
  ({{ entry }}) and the argument order of the `arguments:` list in __NAME__.yaml.

  Knobs (params in __NAME__.yaml) and what they teach:
    vec         vector width: each access moves vec floats (float2/float4: 8/16-byte loads), fewer
                instructions per byte and wider memory transactions.
    block       threads per block; with `items` it sets the tile of work each block owns.
    items       accesses in flight per thread: more independent loads per thread hide HBM latency.
    min_blocks  __launch_bounds__(block, min_blocks) asks the compiler to fit that many blocks per SM: fewer
                registers per thread, more warps; too many and it spills (tuner check shows spills).
  Padding: a kernel that stages data through shared memory declares its tile one column wider,
      __shared__ float tile[TILE][TILE + {{ pad }}];   // pad = 1 removes the 32-way bank conflict
  and adds `pad: [0, 1]` to the params.
#}
// {{ entry }}: y = 2 * x, vec {{ vec }}, block {{ block }}, items {{ items }}, min_blocks {{ min_blocks }}
using V = {{ "float" if vec == 1 else "float%d" % vec }};

extern "C" __global__ void __launch_bounds__({{ block }}{{ ", %d" % min_blocks if min_blocks else "" }})
{{ entry }}(const V* __restrict__ x, V* __restrict__ y, long long n)
{
    long long i = (long long)blockIdx.x * {{ block * items }} + threadIdx.x;
#pragma unroll
    for (int k = 0; k < {{ items }}; ++k, i += {{ block }}) {
        if (i >= n / {{ vec }}) return;
        V a = x[i];
        float* p = (float*)&a;
#pragma unroll
        for (int j = 0; j < {{ vec }}; ++j) p[j] = 2.0f * p[j];
        y[i] = a;
    }
}
"""

SPACE = """\
# __NAME__: a search space with a declarative kernel (no Python class needed).
#   tuner check __NAME__.yaml                      compile every config (no GPU needed)
#   tuner study __NAME__ --space __NAME__.yaml --trials 100        tune it on this machine's GPUs
kernel:
  name: __NAME__
  arguments:                        # the entry point's arguments, in order
    - {name: x, role: input, shape: [n]}          # dtype: the problem's (float32 here)
    - {name: y, role: output, shape: [n]}         # poisoned with NaN before each checked launch
    - {name: n, role: scalar, dtype: int64}       # value: the problem size n
  launch:                           # expressions of problem sizes, params and derived values
    grid: ["ceil_div(n, block * items * vec)"]
    block: [block]
  # bytes: 2 * n * elem_bytes       # minimal traffic; the default counts each input once and each output once
  tolerance: 1.0e-6                 # max |y - ref| / max(|ref|, 1)
  reference: __NAME___ref.py:reference
template: __NAME__.cu.j2
problem: {name: n64M, n: 67108864, dtype: float32}   # far larger than the 60 MiB L2: HBM, not cache
params:
  vec: [1, 2, 4]                    # vector width (floats per access)
  block: [128, 256, 512, 1024]      # threads per block
  items: [1, 2, 4, 8]               # accesses in flight per thread (the per-thread tile)
  min_blocks: [0, 2, 4]             # __launch_bounds__ minimum blocks per SM (0: no hint)
constraints:
  - n % vec == 0
objectives:
  - throughput: maximize
  - registers: minimize
"""

REFERENCE = """\
\"\"\"The reference for __NAME__: NumPy float64 arrays in (inputs by name, then scalars), the expected output
out (or a dict of outputs by name). Runs on the CPU before a study and on every checked config.\"\"\"


def reference(x, n):
    return 2.0 * x
"""


def write_starter(name: str, directory: Path | str = ".") -> list[Path]:
    """Write NAME.cu.j2, NAME.yaml and NAME_ref.py into `directory`. InputError when `name` is not an identifier
    or a file exists (nothing is written then)."""
    if not C_IDENTIFIER.fullmatch(name) or name.startswith("__"):
        raise InputError(
            f"tuner new {name}: the name must be a C identifier ({C_IDENTIFIER_RULE}): it names the CUDA kernel"
        )
    directory = Path(directory)
    files = {
        directory / f"{name}.cu.j2": TEMPLATE,
        directory / f"{name}.yaml": SPACE,
        directory / f"{name}_ref.py": REFERENCE,
    }
    for path in files:
        if path.exists():
            raise InputError("exists; not overwritten (choose another name or directory)", str(path))
    for path, text in files.items():
        path.write_text(text.replace("__NAME__", name))
    return list(files)


__all__ = ["write_starter"]
