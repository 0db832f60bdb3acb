"""Kernel families: the shipped ones (one small module each), those that installed packages register, and those
that a space file names (see `base.Family` for the contract every one of them implements).

A family is found by a *reference*, a string that any process can resolve again on its own (the GPU worker and
the Ray actors receive references, never Family objects):

* a shipped family's name (``transpose``), or the name an installed package registers under the entry point
  group ``tuner.build.families`` (``[project.entry-points."tuner.build.families"] rope = "mypkg.rope:RopeFamily"``);
* ``space:/abs/path/to/space.yaml`` for a family defined by a space file (a ``family: file.py:Class`` or
  ``module:Class`` line, a declarative ``kernel:`` block, or a ``template:`` of its own): `get` answers it once
  the space is loaded in this process; `tuner.build.families.get` loads the space first where it is not.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from tuner.core.errors import InputError
from tuner.kernels.base import Family, Launch

ENTRY_POINT_GROUP = "tuner.build.families"
SPACE_PREFIX = "space:"

_REGISTRY: dict[str, str] = {
    "copy": "tuner.kernels.copy",
    "transpose": "tuner.kernels.transpose",
    "gemm": "tuner.kernels.gemm",
    "elementwise": "tuner.kernels.elementwise",
    "reduce": "tuner.kernels.reduce",
    "softmax": "tuner.kernels.softmax",
    "rmsnorm": "tuner.kernels.rmsnorm",
    "layernorm": "tuner.kernels.layernorm",
    "gemv": "tuner.kernels.gemv",
    "fp8_quant": "tuner.kernels.fp8_quant",
    "rope": "tuner.kernels.rope",
    "decode_attention": "tuner.kernels.decode_attention",
    "adamw": "tuner.kernels.adamw",
    "kt": "tuner.kernels.kt",
}
#: reference → family, as this process loaded it; process-wide as the imported modules it holds objects of are
_LOADED: dict[str, Family] = {}


def entry_points() -> dict[str, metadata.EntryPoint]:
    """Families that installed packages register (group ``tuner.build.families``); a shipped name takes precedence."""
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name not in _REGISTRY}


def names() -> list[str]:
    """The names a space's ``kernel:`` line may use: shipped families and registered entry points."""
    return sorted(set(_REGISTRY) | set(entry_points()))


def get(ref: str) -> Family:
    """The family a reference names (see the module docstring). KeyError for an unknown name and for a space's
    family whose space this process has not loaded; InputError (one line naming the file) when a registered
    family cannot be loaded."""
    if ref not in _LOADED:
        if ref in _REGISTRY:
            _LOADED[ref] = importlib.import_module(_REGISTRY[ref]).FAMILY
        elif ref.startswith(SPACE_PREFIX):
            # A space-defined family is registered when its space loads; loading it is `tuner.build.families.get`'s part
            # (the space stage sits above the kernels).
            raise KeyError(ref)
        else:
            point = entry_points().get(ref)
            if point is None:
                raise KeyError(ref)
            _LOADED[ref] = _from_entry_point(point)
    return _LOADED[ref]


def register(ref: str, family: Family) -> Family:
    """Make `family` what `get(ref)` answers in this process and record the reference on it."""
    family.ref = ref
    _LOADED[ref] = family
    return family


def _from_entry_point(point: metadata.EntryPoint) -> Family:
    where = f"entry point {ENTRY_POINT_GROUP}:{point.name} ({point.value})"
    try:
        obj = point.load()
    except Exception as exc:  # user code: any exception means "does not import"
        raise InputError(f"does not import: {type(exc).__name__}: {exc}", where) from None
    family = obj() if isinstance(obj, type) and issubclass(obj, Family) else obj
    if not isinstance(family, Family):
        raise InputError("is not a tuner.kernels.base.Family subclass or instance", where)
    if family.name != point.name:
        raise InputError(f"family is named {family.name!r}, not {point.name!r}", where)
    family.ref = point.name
    return family


__all__ = ["ENTRY_POINT_GROUP", "Family", "Launch", "get", "names", "register"]
