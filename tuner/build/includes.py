"""What a rendered source may include, and what of it the compile cache must see.

Two kinds of headers reach NVRTC:

* **CUDA's own** (``cuda_bf16.h``, ``cuda_fp16.h``, ``cuda_fp8.h``, ``cooperative_groups.h``, ``cuda/pipeline``,
  ``cuda/barrier``, ``cuda/std/...``): the folders `system_include_dirs` gets from ``cuda.pathfinder`` — the
  nvidia-cuda-runtime and nvidia-cuda-cccl wheels where they are installed, else a CUDA toolkit (CUDA_PATH,
  CUDA_HOME, /usr/local/cuda). They are big and change only with an install, so the cache key covers them by
  their folders and versions (`header_versions`), not their bytes.
* **local ones** (``#include "common.cuh"`` beside the template, or in a folder the space's ``-I`` names):
  small, edited by the user between runs, so `local_includes` finds every one the source can open, transitively,
  and the key covers each one's bytes.

The C++ standard headers a CUDA programmer includes (``<cstdint>``, ``<type_traits>``, ``<limits>``, ``<cmath>``,
``<utility>``, ...: `STD_HEADERS`) are not NVRTC's; each is answered by a one-line header of ours that includes
CCCL's ``cuda/std`` equivalent and makes its names visible in ``std`` (`std_header_dir`), so ``uint32_t``,
``std::numeric_limits`` and ``std::is_same_v`` work as under nvcc. Those with no equivalent in device code
(`NO_STD_EQUIVALENT`: ``<cstdio>``, ``<vector>``, ...) stay missing, and the fault names what to use instead.

`missing_include` reads NVRTC's log of a failed compile for the one fault that is about includes rather than
about the kernel: a file NVRTC cannot open.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "NO_STD_EQUIVALENT",
    "STD_HEADERS",
    "MissingInclude",
    "header_versions",
    "local_includes",
    "missing_include",
    "std_header_dir",
    "system_include_dirs",
]

#: the pathfinder's names of the header sets a kernel may use: the runtime's (cuda_bf16.h, cuda_fp16.h,
#: cuda_fp8.h, cooperative_groups.h) and CCCL's (cuda/pipeline, cuda/barrier, cuda/std/...)
HEADER_SETS = ("cudart", "cccl")


@functools.cache
def system_include_dirs() -> tuple[str, ...]:
    """The folders of CUDA's own headers, as ``cuda.pathfinder.find_nvidia_header_directory`` finds them for
    `HEADER_SETS` (its search order: pip wheels, conda, CUDA_PATH/CUDA_HOME, the system's CUDA toolkit), runtime
    first. Empty when the pathfinder is not installed or finds none: a source that includes nothing of CUDA's
    still compiles (NVRTC's built-in definitions suffice), one that does fails with a missing include. Looked up
    once per process."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory
    except ImportError:
        return ()
    found: list[str] = []
    for name in HEADER_SETS:
        try:
            directory = find_nvidia_header_directory(name)
        except RuntimeError:  # a pathfinder too old to know this header set
            directory = None
        if directory and directory not in found:
            found.append(directory)
    if any((Path(d) / "cuda" / "std" / "cstdint").is_file() for d in found):  # the standard headers need CCCL's
        std_dir = std_header_dir()
        found += [std_dir] if std_dir else []
    return tuple(found)


#: C++ standard headers answered under NVRTC by CCCL's ``cuda/std/<name>``.
STD_HEADERS = (
    *("algorithm", "array", "atomic", "bit", "bitset", "cassert", "cfloat", "climits", "cmath", "complex"),
    *("concepts", "cstddef", "cstdint", "cstdlib", "cstring", "functional", "initializer_list", "iterator"),
    *("limits", "memory", "numbers", "numeric", "optional", "ratio", "span", "string_view", "tuple"),
    *("type_traits", "utility", "variant"),
)
#: C++ standard headers device code has no equivalent of, with what to write instead.
NO_STD_EQUIVALENT = {
    "cstdio": "printf is built into device code: drop the include",
    "stdio.h": "printf is built into device code: drop the include",
    "iostream": "device code has no streams: printf is built in",
    "vector": "use a fixed-size array or std::array (<array>, CCCL's cuda::std::array)",
    "string": "use std::string_view (<string_view>, CCCL's cuda::std::string_view)",
    "map": "device code has no node containers: a sorted array and a binary search",
    "unordered_map": "device code has no node containers: a hash table in an array",
    "set": "device code has no node containers: a sorted array",
    "stdexcept": "device code cannot throw: assert (<cassert>) or a status flag",
    "exception": "device code cannot throw: assert (<cassert>) or a status flag",
    "thread": "device code has no threads of the host: the launch's threads are the kernel's",
    "mutex": "use cuda::std::atomic (<atomic>) or cuda::barrier (<cuda/barrier>)",
}
#: One of `STD_HEADERS` as we answer it (``cuda::std`` declared first: cassert, cfloat and climits hold macros only).
_STD_HEADER = (
    "#pragma once\n#include <cuda/std/{name}>\nnamespace cuda {{ namespace std {{}} }}\n"
    "namespace std {{ using namespace ::cuda::std; }}\n"
)


@functools.cache
def std_header_dir() -> str | None:
    """The folder of our `STD_HEADERS`, written once under the temporary folder and named by its content's
    sha256 (so the compile cache key, which names the include folders, covers their text); None where it cannot
    be written (those includes then stay missing, as without them)."""
    import os
    import tempfile

    texts = {name: _STD_HEADER.format(name=name) for name in STD_HEADERS}
    digest = hashlib.sha256("".join(f"{k}\0{v}\0" for k, v in sorted(texts.items())).encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"tuner-std-headers-{digest}"
    if all((folder / name).is_file() for name in texts):
        return str(folder)
    try:
        staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        for name, text in texts.items():
            (staging / name).write_text(text)
        try:
            os.replace(staging, folder)  # atomic: another process never sees half a folder
        except OSError:  # another process made it first
            for name in texts:
                (staging / name).unlink()
            staging.rmdir()
    except OSError:
        return None
    return str(folder) if all((folder / name).is_file() for name in texts) else None


_CUDART_VERSION = re.compile(rb"#define\s+CUDART_VERSION\s+(\d+)")
_CCCL_VERSION = re.compile(rb"#define\s+CCCL_VERSION\s+(\d+)")


def _cudart_version(number: int) -> str:
    return f"{number // 1000}.{number % 1000 // 10}"  # 13050 → 13.5


def _cccl_version(number: int) -> str:
    return f"{number // 10**6}.{number // 1000 % 1000}.{number % 1000}"  # 3005000 → 3.5.0


@functools.cache
def header_versions() -> dict[str, str]:
    """The versions of the headers in `system_include_dirs`, read from the headers themselves (so a toolkit and
    a wheel of one release agree): ``cudart_headers`` (CUDART_VERSION as major.minor) and ``cccl_headers``
    (CCCL_VERSION as major.minor.patch). A header set not found is absent; one whose version line cannot be read
    is named by the sha256 of its version header instead."""
    out: dict[str, str] = {}
    probes = (
        ("cudart_headers", "cuda_runtime_api.h", _CUDART_VERSION, _cudart_version),
        ("cccl_headers", "cuda/std/__cccl/version.h", _CCCL_VERSION, _cccl_version),
    )
    for key, header, pattern, spell in probes:
        for directory in system_include_dirs():
            try:
                data = (Path(directory) / header).read_bytes()
            except OSError:
                continue
            match = pattern.search(data)
            out[key] = spell(int(match[1])) if match else "sha256:" + hashlib.sha256(data).hexdigest()[:16]
            break
    return out


# ---------------------------------------------------------------------------------------------------------------
# local includes

#: an ``#include "name"`` or ``#include <name>`` line (the forms a template writes; an include through a macro
#: is not followed)
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*(["<])([^">\n]+)[">]', re.MULTILINE)


def _find(name: str, folders: Iterable[str | Path]) -> Path | None:
    if Path(name).is_absolute():
        return Path(name) if Path(name).is_file() else None
    for folder in folders:
        candidate = Path(folder) / name
        if candidate.is_file():
            return candidate
    return None


def local_includes(
    text: str, include_dirs: Sequence[str], system_dirs: Sequence[str] = ()
) -> tuple[tuple[str, str], ...]:
    """Every local file `text` can include, transitively: (the name as written, sha256 of its bytes), in the
    order first met, each file once.

    A name is looked up as NVRTC does: for ``"name"`` first beside the file that includes it (for `text` itself,
    the first of `include_dirs`, where `tuner.build.compile` places the program), then in `include_dirs`, then in
    `system_dirs`. One found in `system_dirs` is CUDA's, covered by its version and not read; one found nowhere
    is NVRTC's built-in or missing (NVRTC says which). Every ``#include`` line is followed, also one that an
    ``#if`` leaves out: hashing a file more than the compile reads costs a cache miss at worst, never a stale hit.
    """
    found: list[tuple[str, str]] = []
    seen: set[Path] = set()
    stack: list[tuple[str, str | Path | None]] = [(text, include_dirs[0] if include_dirs else None)]
    while stack:
        body, here = stack.pop()
        for match in _INCLUDE.finditer(body):
            quoted, name = match[1] == '"', match[2].strip()
            beside = [here] if quoted and here is not None else []
            path = _find(name, [*beside, *include_dirs])
            if path is None:
                continue  # CUDA's own header (system_dirs), NVRTC's built-in, or missing: none is a local file
            resolved = path.resolve()
            if resolved in seen or any(resolved.is_relative_to(Path(d).resolve()) for d in system_dirs):
                continue
            seen.add(resolved)
            try:
                data = resolved.read_bytes()
            except OSError:
                continue  # NVRTC cannot read it either and says so
            found.append((name, hashlib.sha256(data).hexdigest()))
            stack.append((data.decode("utf-8", errors="replace"), resolved.parent))
    return tuple(found)


# ---------------------------------------------------------------------------------------------------------------
# NVRTC's word for a missing include


@dataclass(frozen=True)
class MissingInclude:
    """An include NVRTC could not open: `name` as written, in `file` (as NVRTC names it: the program's name for
    the rendered source itself, a header's path otherwise) at `line`."""

    name: str
    file: str
    line: int


#: NVRTC's (EDG's) message for an include it cannot open, in both of its forms: "cannot open source file" when
#: it has folders to search, "could not open source file ... (no directories in search list)" when it has none.
_MISSING = re.compile(
    r'^(?P<file>.+?)\((?P<line>\d+)\): catastrophic error: (?:cannot|could not) open source file "(?P<name>[^"]+)"',
    re.MULTILINE,
)


def missing_include(log: str) -> MissingInclude | None:
    """The include a failed compile could not open, read from NVRTC's log, or None when the log reports another
    fault. NVRTC's status for this is the generic NVRTC_ERROR_COMPILATION, so its message is the only signal
    there is; the fault is fatal, so a log holds at most one."""
    match = _MISSING.search(log)
    if match is None:
        return None
    return MissingInclude(name=match["name"], file=match["file"], line=int(match["line"]))
