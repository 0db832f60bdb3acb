"""Compile rendered sources with NVRTC (through CuPy): `Source`, arch → `Compiled` or `CompileFailed`.

No GPU is needed: NVRTC writes an sm_XX cubin and the ptxas report (``-Xptxas=-v``), from which we read
registers, static shared memory, stack frame and spill bytes per entry point.

Results are cached on disk, content-addressed: the key is sha256 over the rendered source, the NVRTC options,
the arch and the CuPy/NVRTC versions, so any change to any of them is a miss. Files are written to a temporary
name and `os.replace`d into place, so concurrent workers never see half a file. Compile failures are cached too,
with their log: a broken config costs NVRTC once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tuner.render import Source
from tuner.result import CompileFailed

CACHE_VERSION = "1"
DEFAULT_ARCH = "sm_90"
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

    ok = True

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
    """The arch of GPU 0 when there is one, else sm_90 (H100/H200)."""
    try:
        import cupy

        return f"sm_{cupy.cuda.Device(0).compute_capability}"
    except Exception:  # no driver, no device: compiling still works, for the default arch
        return DEFAULT_ARCH


def cache_dir() -> Path:
    root = os.environ.get("TUNER_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tuner"
    return Path(root) / CACHE_VERSION


def cache_key(source: Source, options: Iterable[str], arch: str, vers: dict[str, str]) -> str:
    blob = json.dumps({"source": source.text, "options": list(options), "arch": arch, "versions": vers},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _load_cached(meta_path: Path, cubin_path: Path, source: Source) -> Compiled | CompileFailed | None:
    try:
        meta = json.loads(meta_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if not meta.get("ok"):
        return CompileFailed(reason=meta["reason"], details={"log": meta["log"], "uri": source.uri})
    try:
        cubin = cubin_path.read_bytes()
    except FileNotFoundError:
        return None
    functions = {k: FunctionResources(**v) for k, v in meta["functions"].items()}
    return Compiled(uri=source.uri, entry=source.entry, arch=meta["arch"], cubin=cubin, log=meta["log"],
                    functions=functions, key=meta["key"], cached=True)


# ---------------------------------------------------------------------------------------------------------------
# compile


def compile_source(
    source: Source,
    arch: str = DEFAULT_ARCH,
    options: Iterable[str] = (),
    use_cache: bool = True,
) -> Compiled | CompileFailed:
    """Compile one source to a cubin for `arch`. Never raises for a bad kernel: NVRTC's refusal is a
    CompileFailed with the log (decided by NVRTC's status code, not its message)."""
    from cupy_backends.cuda.libs import nvrtc

    opts = (*BASE_OPTIONS, f"--gpu-architecture={arch}", *options)
    vers = versions()
    key = cache_key(source, opts, arch, vers)
    folder = cache_dir() / arch
    meta_path, cubin_path = folder / f"{key}.json", folder / f"{key}.cubin"
    if use_cache and (hit := _load_cached(meta_path, cubin_path, source)) is not None:
        return hit

    prog = nvrtc.createProgram(source.text, f"{source.uri}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(opts))
            status = 0
        except nvrtc.NVRTCError as exc:
            status = exc.status
        log = nvrtc.getProgramLog(prog)
        cubin = nvrtc.getCUBIN(prog) if status == 0 else b""
    finally:
        nvrtc.destroyProgram(prog)

    if status != 0:
        first = next((ln.strip() for ln in log.splitlines() if "error" in ln), f"NVRTC status {status}")
        failed = CompileFailed(reason=f"NVRTC: {first}", details={"log": log, "uri": source.uri})
        if use_cache:
            meta = {"ok": False, "reason": failed.reason, "log": log, "key": key, "arch": arch, "uri": source.uri}
            _atomic_write(meta_path, json.dumps(meta).encode())
        return failed

    functions = parse_ptxas(log)
    if use_cache:
        _atomic_write(cubin_path, cubin)
        meta = {"ok": True, "log": log, "key": key, "arch": arch, "uri": source.uri, "options": list(opts),
                "versions": vers, "functions": {k: asdict(v) for k, v in functions.items()}}
        _atomic_write(meta_path, json.dumps(meta).encode())
    return Compiled(uri=source.uri, entry=source.entry, arch=arch, cubin=cubin, log=log, functions=functions,
                    key=key)


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
