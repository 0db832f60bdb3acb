"""Compile rendered sources with NVRTC (through CuPy): `Source`, arch → `Compiled` or `CompileFailed`.

No GPU is needed: NVRTC writes an sm_XX cubin and the ptxas report (``-Xptxas=-v``), from which we read
registers, static shared memory, stack frame and spill bytes per entry point.

Results are cached on disk, content-addressed: the key is sha256 over the rendered source, the NVRTC options,
the arch and the CuPy/NVRTC versions, so any change to any of them is a miss. Files are written to a temporary
name and `os.replace`d into place (`tuner.files.atomic_write`), so concurrent workers never see half a file, and a
per-key lock file makes a second process wait for the first's compile instead of repeating it. Compile failures
are cached too, with their log: a broken config costs NVRTC once. The PTX of each compile is kept beside its
cubin: it is what the dashboard shows.

`nvrtc_compile` is the package's one call into NVRTC; everything that compiles CUDA goes through it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from tuner.files import atomic_write, locked
from tuner.gpu import DEFAULT_ARCH
from tuner.render import Source
from tuner.result import CompileFailed

CACHE_VERSION = "1"
BASE_OPTIONS = ("-std=c++17", "-Xptxas=-v", "-lineinfo")


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
    from cupy_backends.cuda.libs import nvrtc

    major, minor = nvrtc.getVersion()
    return f"{major}.{minor}"


def versions() -> dict[str, str]:
    import cupy

    return {"cupy": cupy.__version__, "nvrtc": nvrtc_version()}


def default_arch() -> str:
    """The arch of GPU 0 when there is one, else `tuner.gpu.DEFAULT_ARCH` (sm_90, H100/H200)."""
    import cupy
    from cupy_backends.cuda.api import runtime

    try:
        return f"sm_{cupy.cuda.Device(0).compute_capability}"
    except runtime.CUDARuntimeError:  # no driver, no device: compiling still works, for the default arch
        return DEFAULT_ARCH


def nvrtc_compile(text: str, name: str, options: Iterable[str]) -> tuple[int, str, bytes, bytes]:
    """Compile CUDA `text` (file name `name` in messages) with NVRTC: (status, log, cubin, ptx). Status 0 is
    success; otherwise NVRTC's error status, with the log and no binaries. The cubin is empty for a virtual
    arch (compute_XX)."""
    from cupy_backends.cuda.libs import nvrtc

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
    root = os.environ.get("TUNER_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tuner"
    return Path(root) / CACHE_VERSION


def cache_key(source: Source, options: Iterable[str], arch: str, vers: dict[str, str]) -> str:
    blob = json.dumps({"source": source.text, "options": list(options), "arch": arch, "versions": vers}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _load_cached(meta_path: Path, cubin_path: Path, source: Source) -> Compiled | CompileFailed | None:
    try:
        meta = json.loads(meta_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if not meta.get("ok"):
        return CompileFailed(reason=meta["reason"], details={"log": meta["log"], "uri": source.uri})
    try:
        cubin = cubin_path.read_bytes()
        ptx = cubin_path.with_suffix(".ptx").read_bytes()
    except FileNotFoundError:
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
    `target_arch`). Never raises for a bad kernel: NVRTC's refusal is a CompileFailed with the log (decided by
    NVRTC's status code, not its message)."""
    arch = target_arch(source.text, arch)
    opts = (*BASE_OPTIONS, f"--gpu-architecture={arch}", *options)
    vers = versions()
    key = cache_key(source, opts, arch, vers)
    folder = cache_dir() / arch
    meta_path, cubin_path = folder / f"{key}.json", folder / f"{key}.cubin"
    if not use_cache:
        return _compile(source, arch, opts, key, vers, None)
    if (hit := _load_cached(meta_path, cubin_path, source)) is not None:
        return hit
    with locked(folder / f"{key}.lock"):  # a second process waits here, then finds the first's result
        if (hit := _load_cached(meta_path, cubin_path, source)) is not None:
            return hit
        return _compile(source, arch, opts, key, vers, (meta_path, cubin_path))


_RETRIES = itertools.count()


def _compile(
    source: Source, arch: str, opts: tuple[str, ...], key: str, vers: dict[str, str], paths: tuple[Path, Path] | None
) -> Compiled | CompileFailed:
    """Compile, and where `paths` (meta, cubin) are given, fill the cache entry: binaries first, the meta file
    last, since a reader takes the meta file's presence to mean the entry is whole."""
    status, log, cubin, ptx = nvrtc_compile(source.text, f"{source.uri}.cu", opts)
    if status == 0 and cubin and not _ENTRY.search(log):
        # NVRTC 13.0 (seen on the H200 host) answers a program it compiled earlier in this process (e.g. under
        # another cache dir) from a cache of its own: the cubin, but no ptxas report, so no registers or spills.
        # The same code under a name and text it has not seen (a trailing comment) brings the report back.
        nonce = f"{os.getpid()}-{next(_RETRIES)}"
        status, log, cubin, ptx = nvrtc_compile(f"{source.text}\n// {nonce}\n", f"{source.uri}-{nonce}.cu", opts)
    if status != 0:
        failed = CompileFailed(reason=f"NVRTC: {first_error(log, status)}", details={"log": log, "uri": source.uri})
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


def compile_many(
    sources: Iterable[Source],
    arch: str = DEFAULT_ARCH,
    jobs: int | None = None,
    use_cache: bool = True,
    on_done: Callable[[Source, Compiled | CompileFailed], None] | None = None,
) -> Iterator[tuple[Source, Compiled | CompileFailed]]:
    """Compile many sources in parallel, yielding (source, result) in input order.

    Threads suffice: CuPy's NVRTC binding releases the GIL while NVRTC and ptxas work, so J threads keep J cores
    busy without the cost of starting processes.
    """
    jobs = jobs or os.cpu_count() or 1
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        items = list(sources)
        futures = [pool.submit(compile_source, s, arch, (), use_cache) for s in items]
        for src, fut in zip(items, futures, strict=True):
            result = fut.result()
            if on_done:
                on_done(src, result)
            yield src, result
