"""Compile rendered sources with NVRTC (through CuPy): `Source`, arch → `Compiled` or `CompileFailed`.

No GPU is needed: NVRTC writes an sm_XX cubin and the ptxas report (``-Xptxas=-v``), from which we read
registers, static shared memory, stack frame and spill bytes per entry point.

A source may include CUDA's own headers (``cuda_bf16.h``, ``cuda_fp16.h``, ``cuda_fp8.h``, ``cooperative_groups.h``,
``cuda/pipeline``, ``cuda/barrier``: the folders `tuner.build.includes.system_include_dirs` finds) and local files
beside its template or in the space's ``-I`` folders (`Source.include_dirs`). The program is named as if it lay
in its template's folder, so that ``#include "x.cuh"`` looks there first, never in the process's working folder.

Results are cached on disk, content-addressed: the key is sha256 over the rendered source, the bytes of every
local file it can include (`tuner.build.includes.local_includes`), the NVRTC options (include folders apart: where a
file lies does not change what it holds), the arch, the CuPy/NVRTC versions and CUDA's header folders and
versions, so any change to any of them is a miss. Files are written to a temporary
name and `os.replace`d into place (`tuner.build.files.atomic_write`), so concurrent workers never see half a file, and a
per-key lock file makes a second process wait for the first's compile instead of repeating it. Compile failures
are cached too, with their log: a broken config costs NVRTC once. A cache folder that cannot be written (a
read-only home) is replaced by one under the temporary folder where a command or an API call starts
(`tuner.build.cachedirs`); one that cannot be written all the same costs the caching, with one warning, not the
compile. The PTX of each compile is kept beside its cubin: it is what the dashboard shows.

`nvrtc_compile` is the package's one call into NVRTC; everything that compiles CUDA goes through it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from tuner.build import includes
from tuner.build.cachedirs import ensure_writable, tuner_root
from tuner.build.files import atomic_write, locked
from tuner.build.render import Source
from tuner.core.errors import InputError
from tuner.core.gpufacts import DEFAULT_ARCH
from tuner.core.result import CompileFailed

#: 2: keys cover local includes, CUDA's header folders and versions, and a source's own options
CACHE_VERSION = "2"
#: every compile's options: C++17 and ptxas's resource report (registers, spills). No -lineinfo: tuner's profiles
#: read metrics, not source lines, and line tables cost NVRTC 1-9% of its time for the same SASS
#: (benchmarks/results/nvrtc_lineinfo-2026-12-03.md); a space asks for them with ``compile_options: [-lineinfo]``
BASE_OPTIONS = ("-std=c++17", "-Xptxas=-v")


@dataclass(frozen=True)
class FunctionResources:
    """What ptxas reports for one entry point."""

    registers: int = 0
    smem_static_bytes: int = 0
    stack_frame_bytes: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0


@dataclass(frozen=True)
class Compiled:
    """A cubin plus its resources. The config-level figures are the worst over its entry points (a config may
    launch several kernels, e.g. unfused epilogue stages); `functions` keeps them one by one."""

    uri: str
    entry: str
    arch: str
    cubin: bytes
    log: str
    functions: dict[str, FunctionResources] = field(default_factory=dict)
    key: str = ""
    cached: bool = False
    ptx: bytes = b""

    #: always True, as `Failure.ok` is always False: ``if not result.ok`` tells the two apart
    ok: ClassVar[Literal[True]] = True

    @property
    def main(self) -> FunctionResources:
        return self.functions.get(self.entry) or next(iter(self.functions.values()), FunctionResources())

    @property
    def registers(self) -> int:
        return max((f.registers for f in self.functions.values()), default=0)

    @property
    def smem_static_bytes(self) -> int:
        return max((f.smem_static_bytes for f in self.functions.values()), default=0)

    @property
    def spill_bytes(self) -> int:
        return sum(f.spill_store_bytes + f.spill_load_bytes for f in self.functions.values())

    @property
    def stack_frame_bytes(self) -> int:
        return max((f.stack_frame_bytes for f in self.functions.values()), default=0)


# ---------------------------------------------------------------------------------------------------------------
# ptxas report

_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def parse_ptxas(log: str) -> dict[str, FunctionResources]:
    """Per-entry resources from an ``-Xptxas=-v`` report. Non-entry functions (device functions that were not
    inlined) report properties too; they are folded into nothing: only entries are launched."""
    out: dict[str, dict[str, int]] = {}
    current: str | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1)
            out.setdefault(current, {})
        elif m := _PROPS.search(line):
            current = m.group(1) if m.group(1) in out else None
        elif current and (m := _FRAME.search(line)):
            out[current].update(stack_frame_bytes=int(m[1]), spill_store_bytes=int(m[2]), spill_load_bytes=int(m[3]))
        elif current and (m := _USED.search(line)):
            out[current].update(registers=int(m[1]), smem_static_bytes=int(m[2] or 0))
    return {name: FunctionResources(**vals) for name, vals in out.items()}


# ---------------------------------------------------------------------------------------------------------------
# versions and cache


def nvrtc_version() -> str:
    from tuner.core.cudalib import nvrtc

    major, minor = nvrtc.getVersion()
    return f"{major}.{minor}"


def versions() -> dict[str, str]:
    """CuPy's and NVRTC's versions, and those of CUDA's headers where they are found
    (`tuner.build.includes.header_versions`): what a compiled config depends on besides its source and options."""
    ensure_writable(cupy_only=True)  # CuPy makes its kernel cache folder on import, and raises where it cannot
    import cupy

    return {"cupy": cupy.__version__, "nvrtc": nvrtc_version(), **includes.header_versions()}


def default_arch() -> str:
    """The arch of GPU 0 when there is one, else `tuner.core.gpufacts.DEFAULT_ARCH` (sm_90, H100/H200)."""
    ensure_writable(cupy_only=True)
    import cupy

    from tuner.core.cudalib import runtime

    try:
        return f"sm_{cupy.cuda.Device(0).compute_capability}"
    except runtime.CUDARuntimeError:  # no driver, no device: compiling still works, for the default arch
        return DEFAULT_ARCH


def nvrtc_compile(text: str, name: str, options: Iterable[str]) -> tuple[int, str, bytes, bytes]:
    """Compile CUDA `text` (file name `name` in messages) with NVRTC: (status, log, cubin, ptx). Status 0 is
    success; otherwise NVRTC's error status, with the log and no binaries. The cubin is empty for a virtual
    arch (compute_XX)."""
    from tuner.core.cudalib import nvrtc

    opts = list(options)
    prog = nvrtc.createProgram(text, name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as exc:
            return exc.status, nvrtc.getProgramLog(prog), b"", b""
        log = nvrtc.getProgramLog(prog)
        virtual = any("compute_" in o for o in opts if o.startswith(("--gpu-architecture", "-arch")))
        cubin = b"" if virtual else nvrtc.getCUBIN(prog)
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return 0, log, cubin, ptx if isinstance(ptx, bytes) else ptx.encode()


def first_error(log: str, status: int) -> str:
    """NVRTC's first error line of a failed compile's log."""
    return next((ln.strip() for ln in log.splitlines() if "error" in ln), f"NVRTC status {status}")


def cache_dir() -> Path:
    """tuner's cache folder (`tuner.build.cachedirs.tuner_root`: ``$TUNER_CACHE_DIR``, ``$XDG_CACHE_HOME/tuner`` or
    ``~/.cache/tuner``) under `CACHE_VERSION`."""
    return tuner_root() / CACHE_VERSION


def cache_key(
    source: Source,
    options: Iterable[str],
    arch: str,
    vers: dict[str, str],
    local: Iterable[tuple[str, str]] = (),
    system_dirs: Iterable[str] = (),
) -> str:
    """sha256 of what a compile's result depends on: the source text, the NVRTC `options` (include folders
    apart), `arch`, `vers` (`versions`), `local` ((name, sha256) of each local include:
    `tuner.build.includes.local_includes`) and the folders of CUDA's headers."""
    blob = json.dumps(
        {
            "source": source.text,
            "options": list(options),
            "arch": arch,
            "versions": vers,
            "includes": [list(item) for item in local],
            "system_include_dirs": list(system_dirs),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def program_name(source: Source) -> str:
    """The name NVRTC gives the program (in its messages, and for the folder it searches first for a quoted
    include): ``URI.cu`` in the template's folder, or plain ``URI.cu`` for a source that has none."""
    name = f"{source.uri}.cu"
    return os.path.join(source.include_dirs[0], name) if source.include_dirs else name


def nvrtc_options(source: Source, arch: str) -> tuple[str, ...]:
    """The options every compile of `source` for `arch` gets, include folders apart: `BASE_OPTIONS` (less its
    ``-std`` where the source names another), the target, the source's own options."""
    base: tuple[str, ...] = BASE_OPTIONS
    if any(o.startswith(("--std=", "-std=")) for o in source.options):
        base = tuple(o for o in base if not o.startswith("-std="))
    return (*base, f"--gpu-architecture={arch}", *source.options)


def include_options(source: Source) -> list[str]:
    """``-I`` options: the source's local folders, then CUDA's header folders, in NVRTC's search order."""
    return [f"-I{d}" for d in dict.fromkeys([*source.include_dirs, *includes.system_include_dirs()])]


#: cache folders found unusable (warned once) and usable in this process: process-wide, as the folders are the
#: machine's and the warning is said once per process, whatever compiles
_UNCACHED: set[Path] = set()
_CACHEABLE: set[Path] = set()


def _cache_folder(arch: str) -> Path | None:
    """The cache folder for `arch`, made if missing; None (warned once) where it cannot be made or written."""
    folder = cache_dir() / arch
    if folder in _CACHEABLE:
        return folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        usable = os.access(folder, os.W_OK | os.X_OK)
    except OSError:
        usable = False
    if usable:
        _CACHEABLE.add(folder)
        return folder
    if folder not in _UNCACHED:
        _UNCACHED.add(folder)
        warnings.warn(
            f"compile cache {folder} cannot be written: compiling without it (set TUNER_CACHE_DIR)",
            RuntimeWarning,
            stacklevel=3,
        )
    return None


def _load_cached(meta_path: Path, cubin_path: Path, source: Source) -> Compiled | CompileFailed | None:
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not meta.get("ok"):
        return CompileFailed(reason=meta["reason"], details={"log": meta["log"], "uri": source.uri})
    try:
        cubin = cubin_path.read_bytes()
        ptx = cubin_path.with_suffix(".ptx").read_bytes()
    except OSError:
        return None
    functions = {k: FunctionResources(**v) for k, v in meta["functions"].items()}
    return Compiled(
        uri=source.uri,
        entry=source.entry,
        arch=meta["arch"],
        cubin=cubin,
        log=meta["log"],
        functions=functions,
        key=meta["key"],
        cached=True,
        ptx=ptx,
    )


# ---------------------------------------------------------------------------------------------------------------
# compile


#: PTX instructions that only the arch-specific target of an arch has (sm_90a: wgmma, setmaxnreg).
_ARCH_SPECIFIC = re.compile(r"\b(?:wgmma|setmaxnreg)\.")


def target_arch(text: str, arch: str) -> str:
    """The target a source compiles for on `arch`: `arch` itself, or its arch-specific variant (sm_90 -> sm_90a,
    compute_90 -> compute_90a) when the source uses PTX only that variant accepts. An sm_90a cubin runs on the
    sm_90 GPUs only (H100/H200), which is where such a config was tuned."""
    if _ARCH_SPECIFIC.search(text) and re.fullmatch(r"(?:sm|compute)_9\d", arch):
        return arch + "a"
    return arch


def compile_source(
    source: Source,
    arch: str = DEFAULT_ARCH,
    options: Iterable[str] = (),
    use_cache: bool = True,
) -> Compiled | CompileFailed:
    """Compile one source to a cubin for `arch` (its arch-specific variant where the source needs it:
    `target_arch`), with the source's own options and then `options`, its include folders and CUDA's searched
    for its includes. Never raises for a bad kernel: NVRTC's refusal is a CompileFailed with the log (decided by
    NVRTC's status code, not its message)."""
    arch = target_arch(source.text, arch)
    opts = (*nvrtc_options(source, arch), *options)
    vers = versions()
    system_dirs = includes.system_include_dirs()
    local = includes.local_includes(source.text, source.include_dirs, system_dirs)
    key = cache_key(source, opts, arch, vers, local, system_dirs)
    searched = (*opts, *include_options(source))
    folder = _cache_folder(arch) if use_cache else None
    if folder is None:
        return _compile(source, arch, searched, key, vers, None)
    meta_path, cubin_path = folder / f"{key}.json", folder / f"{key}.cubin"
    if (hit := _load_cached(meta_path, cubin_path, source)) is not None:
        return hit
    with locked(folder / f"{key}.lock"):  # a second process waits here, then finds the first's result
        if (hit := _load_cached(meta_path, cubin_path, source)) is not None:
            return hit
        return _compile(source, arch, searched, key, vers, (meta_path, cubin_path))


#: numbers the compile retries of this process: process-wide, so that no two retries share a name
_RETRIES = itertools.count()


def _compile(
    source: Source, arch: str, opts: tuple[str, ...], key: str, vers: dict[str, str], paths: tuple[Path, Path] | None
) -> Compiled | CompileFailed:
    """Compile, and where `paths` (meta, cubin) are given, fill the cache entry: binaries first, the meta file
    last, since a reader takes the meta file's presence to mean the entry is whole."""
    name = program_name(source)
    status, log, cubin, ptx = nvrtc_compile(source.text, name, opts)
    if status == 0 and cubin and not _ENTRY.search(log):
        # NVRTC 13.0 (seen on the H200 host) answers a program it compiled earlier in this process (e.g. under
        # another cache dir) from a cache of its own: the cubin, but no ptxas report, so no registers or spills.
        # The same code under a name and text it has not seen (a trailing comment) brings the report back.
        nonce = f"{os.getpid()}-{next(_RETRIES)}"
        status, log, cubin, ptx = nvrtc_compile(f"{source.text}\n// {nonce}\n", f"{name[:-3]}-{nonce}.cu", opts)
    if status != 0:
        reason = first_error(log, status)
        if os.path.dirname(name):  # files named as the template's folder sees them: "URI.cu(12): error: ..."
            reason = reason.replace(os.path.dirname(name) + os.sep, "")
        failed = CompileFailed(reason=f"NVRTC: {reason}", details={"log": log, "uri": source.uri})
        if paths is not None:
            meta = {"ok": False, "reason": failed.reason, "log": log, "key": key, "arch": arch, "uri": source.uri}
            atomic_write(paths[0], json.dumps(meta), make_parents=True)
        return failed

    functions = parse_ptxas(log)
    if paths is not None:
        meta_path, cubin_path = paths
        atomic_write(cubin_path, cubin, make_parents=True)
        atomic_write(cubin_path.with_suffix(".ptx"), ptx)
        meta = {
            "ok": True,
            "log": log,
            "key": key,
            "arch": arch,
            "uri": source.uri,
            "options": list(opts),
            "versions": vers,
            "functions": {k: asdict(v) for k, v in functions.items()},
        }
        atomic_write(meta_path, json.dumps(meta))
    return Compiled(
        uri=source.uri, entry=source.entry, arch=arch, cubin=cubin, log=log, functions=functions, key=key, ptx=ptx
    )


# ---------------------------------------------------------------------------------------------------------------
# the pre-flight: a missing include is the space's fault, said once


def check_includes(space, problem=None, arch: str = DEFAULT_ARCH) -> None:
    """Compile the default config of `space` (a `tuner.space.space.SearchSpace`) on `problem` (default: its first)
    once, through the cache, and raise InputError when NVRTC cannot open one of its includes: one line naming
    the template (and the template's line, where the include is written there), the include and every folder
    searched. Any other compile failure is left to the configs' trials, where it belongs (another config may
    compile). A template fault raises its TemplateError here, before any trial. Only a family a space defines
    (``space:`` reference) is checked: the shipped and registered ones' templates are tested with them."""
    from tuner.build.render import render, template_file
    from tuner.kernels import SPACE_PREFIX

    family = space.family
    if not family.ref.startswith(SPACE_PREFIX):
        return
    problem = problem or space.problem()
    source = render(family, space.default, space.resolve(space.default, problem), problem.env)
    result = compile_source(source, arch)
    if result.ok:
        return
    missing = includes.missing_include(result.details.get("log", ""))
    if missing is None:
        return
    template = template_file(family)
    message = describe_missing(source, missing)
    in_template = os.path.basename(missing.file) == os.path.basename(program_name(source))
    line = _template_line(template, missing.name) if in_template else None
    raise InputError(message, str(template), line)


def describe_missing(source: Source, missing: includes.MissingInclude) -> str:
    """``#include "x.cuh" not found (searched: A, B, C)`` for an include the rendered `source` makes, or
    ``#include "x.cuh" in common.cuh:3 not found (...)`` for one a local header makes: the folders in NVRTC's
    order, with a hint where CUDA's own headers were not found at all."""
    system_dirs = includes.system_include_dirs()
    program = program_name(source)
    beside: list[str] = []
    where = ""
    if os.path.basename(missing.file) != os.path.basename(program):  # a header's include: it looks beside itself
        beside = [os.path.dirname(missing.file)] if os.path.dirname(missing.file) else []
        where = f" in {os.path.basename(missing.file)}:{missing.line}"
    folders = list(dict.fromkeys([*beside, *source.include_dirs, *system_dirs]))
    text = f'#include "{missing.name}"{where} not found (searched: {", ".join(folders) or "no folders"})'
    if missing.name in includes.NO_STD_EQUIVALENT:  # a C++ standard header device code has no equivalent of
        instead = includes.NO_STD_EQUIVALENT[missing.name]
        text = f"#include <{missing.name}>{where} has no equivalent under NVRTC: {instead}"
    if not system_dirs:
        text += (
            "; CUDA's headers were not found: install nvidia-cuda-runtime and nvidia-cuda-cccl "
            "(pip install 'tuner[cuda13]')"
        )
    return text


def _template_line(template: Path, name: str) -> int | None:
    """The 1-based line of `template` that writes ``#include "name"`` (or ``<name>``), if exactly one does."""
    pattern = re.compile(rf'^\s*#\s*include\s*["<]{re.escape(name)}[">]')
    try:
        lines = template.read_text(errors="replace").splitlines()
    except OSError:
        return None
    hits = [i + 1 for i, text in enumerate(lines) if pattern.match(text)]
    return hits[0] if len(hits) == 1 else None
