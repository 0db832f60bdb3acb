"""Plain CUDA sources: a ``.cu`` file whose knobs arrive as ``#define`` lines, as Kernel Tuner writes them.

A template whose name does not end in ``.j2`` (``kernel.cu``, ``kernel.cuh``) is not rendered by Jinja2: NVRTC gets
the file's text unchanged (its ``{``, ``}`` and ``#`` untouched) behind one ``#define NAME value`` line for each of,
in Kernel Tuner's order (its ``prepare_kernel_string``)::

    #define grid_size_x 2048       // the launch's grid, x y z
    #define block_size_x 128       // the launch's block, x y z (a param of that name has the same value)
    #define tile_size_x 4          // each param, then each derived value
    #define kernel_tuner 1
    extern "C" {                   // only where the file names no extern "C" itself, as Kernel Tuner's CUDA
    #line 1                        //   backends do; #line keeps NVRTC's line numbers the file's own
    ...the file...
    }

The entry point is the file's ``__global__`` function named as the family (a declarative block's ``name:``,
Kernel Tuner's ``kernel_name``): the same name for every config, whose sources differ by their defines, so the
compile cache still tells them apart. A bool is defined as 1 or 0, a float as Python writes it, a string (an
identifier: `tuner.build.render` checks) as it is.

Names that are defines must be C identifiers (ASCII letters, digits, ``_``), and not one of the names tuner
defines itself (`RESERVED`); a file without the named ``__global__`` function is refused when its space loads.
Each fault is an InputError naming the file (and line).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError

#: Template names rendered by Jinja2; any other is a plain source.
JINJA_SUFFIXES = (".j2", ".jinja", ".jinja2")
GRID_NAMES = ("grid_size_x", "grid_size_y", "grid_size_z")
BLOCK_NAMES = ("block_size_x", "block_size_y", "block_size_z")
#: Defined by tuner for every config, so no param or derived value may take the name (Kernel Tuner refuses
#: grid_size_* as tunable params too); block_size_* may be params: they set the launch's block.
RESERVED = (*GRID_NAMES, "kernel_tuner")
C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: `C_IDENTIFIER` in words, for the messages that refuse a name
C_IDENTIFIER_RULE = "ASCII letters, digits and _, not starting with a digit"
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
#: ``__global__``, then anything but a statement's or a body's end (a return type, ``__launch_bounds__(...)``), the name
_GLOBAL = re.compile(r"\b__global__\b[^;{}]*?\b(?!__launch_bounds__\b)([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def is_plain(template: str) -> bool:
    """Whether the template file `template` is a plain source (its config as defines), not a Jinja2 template."""
    return bool(template) and not template.endswith(JINJA_SUFFIXES)


def define_name_fault(name: str) -> str | None:
    """Why `name` cannot be a ``#define``d name of a plain source, or None."""
    if not C_IDENTIFIER.fullmatch(name):
        return f"{name!r} is not a C identifier (ASCII letters, digits and _), so it cannot be #defined"
    if name in RESERVED:
        return f"{name!r} is #defined by tuner itself ({', '.join(RESERVED)}): choose another name"
    return None


def check_define_names(params: Iterable[str], derived: Iterable[str], fail) -> None:
    """Refuse a param or derived value whose name cannot be a define; `fail(message, *keys)` makes the error
    naming the space file and the line of the name."""
    for what, key, names in (("parameter", "params", params), ("derived value", "derived", derived)):
        for name in names:
            fault = define_name_fault(name)
            if fault is not None:
                raise fail(f"{what} {fault} (the template is a plain source: each {what} is #defined)", key, name)


def global_functions(text: str) -> list[str]:
    """The names of the ``__global__`` functions that `text` (CUDA source) declares, comments left out."""
    return [m.group(1) for m in _GLOBAL.finditer(_COMMENTS.sub(" ", text))]


def check_entry(path: Path, name: str) -> None:
    """InputError naming `path` when the plain source there declares no ``__global__`` function `name`."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", str(path)) from None
    found = global_functions(text)
    if name in found:
        return
    has = f"it has {', '.join(dict.fromkeys(found))}" if found else "it has none"
    hint = " (a Jinja2 template's name ends in .j2)" if "{{" in text else ""
    raise InputError(
        f"no __global__ function {name!r} (the kernel's name, Kernel Tuner's kernel_name); {has}{hint}", str(path)
    )


def define_value(value: Any) -> str:
    """A config value as the text of its ``#define``: ints and identifiers as they are, bools as 1 or 0, floats
    as Python writes them. ValueError for a float that is not finite (C has no literal for it)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no C literal")
        return repr(value)
    return str(value)


def defines(config: Mapping[str, Any], grid: tuple[int, int, int], block: tuple[int, int, int]) -> dict[str, str]:
    """The defines of one config, in Kernel Tuner's order: grid, block, the config (params, then derived
    values), ``kernel_tuner``. A config value named ``block_size_x`` (the launch's block) keeps its place."""
    out = dict(zip(GRID_NAMES, map(str, grid), strict=True))
    out.update(zip(BLOCK_NAMES, map(str, block), strict=True))
    for name, value in config.items():
        out[name] = define_value(value)
    out["kernel_tuner"] = "1"
    return out


def source_text(text: str, named: Mapping[str, str]) -> str:
    """The text NVRTC compiles: the defines, then `text` unchanged after ``#line 1`` (wrapped in ``extern "C"``
    where it names none, so its entry keeps its name in the cubin)."""
    prefix = "".join(f"#define {name} {value}\n" for name, value in named.items())
    if 'extern "C"' in text:
        return f"{prefix}#line 1\n{text}"
    return f'{prefix}extern "C" {{\n#line 1\n{text}\n}}\n'
