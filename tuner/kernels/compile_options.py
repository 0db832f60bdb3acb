"""A space's ``compile_options:``: NVRTC options checked against a known list before anything runs.

A space file is data: an option reaches NVRTC only when it is one of these (long or short spelling), and is
passed on in its long spelling, so that two spellings of one option are one cache key:

* ``-DNAME``, ``-DNAME=VALUE`` (``--define-macro=...``): a macro; NAME an identifier, VALUE an identifier or a
  number (a space file is data: a value selects or sizes, it is never CUDA text pasted into the source);
* ``-UNAME`` (``--undefine-macro=NAME``);
* ``-IDIR``, ``-I DIR`` (``--include-path=DIR``): a folder inside the space's folder, relative to it;
* ``--use_fast_math``, ``--extra-device-vectorization``, ``--restrict`` (or with one dash);
* ``--maxrregcount=N``, 1 ≤ N ≤ 255;
* ``--ftz=``, ``--prec-div=``, ``--prec-sqrt=``, ``--fmad=`` ``true`` or ``false``;
* ``--std=c++17`` (the default) or ``--std=c++20``;
* ``-lineinfo``, ``--generate-line-info``: line tables, for profiling the tuned kernels by source line (off by
  default: the same SASS for 1-9% more of NVRTC's time).

Refused with a reason: ``-G``/``--device-debug`` (unoptimized debug code: its timings say nothing about the
kernel), ``-arch``/``--gpu-architecture``/``-code`` (the tuner compiles for the GPU it measures on), and
anything else. Every fault is a SpaceError naming the space file and the option's line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CompileOptions", "MAX_OPTIONS", "parse"]

#: options a space may list (a space file is data and bounded like data)
MAX_OPTIONS = 64

_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_NUMBER = r"[+-]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[fFuUlL]*"
_MACRO_VALUE = re.compile(rf"{_IDENTIFIER}|{_NUMBER}")
_NAME = re.compile(_IDENTIFIER)

#: flags without a value: every spelling → the one passed on ("" : accepted, passed on as nothing)
_FLAGS = {
    "--use_fast_math": "--use_fast_math",
    "-use_fast_math": "--use_fast_math",
    "--extra-device-vectorization": "--extra-device-vectorization",
    "-extra-device-vectorization": "--extra-device-vectorization",
    "--restrict": "--restrict",
    "-restrict": "--restrict",
    "-lineinfo": "-lineinfo",
    "--generate-line-info": "-lineinfo",
}
#: options with a value: name (either spelling) → (long name, check of the value, what the value must be)
_VALUED = {
    "ftz": ("--ftz", re.compile(r"true|false"), "true or false"),
    "prec-div": ("--prec-div", re.compile(r"true|false"), "true or false"),
    "prec-sqrt": ("--prec-sqrt", re.compile(r"true|false"), "true or false"),
    "fmad": ("--fmad", re.compile(r"true|false"), "true or false"),
    "maxrregcount": ("--maxrregcount", re.compile(r"[1-9]\d{0,2}"), "a register count from 1 to 255"),
    "std": ("--std", re.compile(r"c\+\+(?:17|20)"), "c++17 or c++20"),
}
_REFUSED = {
    "-G": "builds unoptimized debug code, whose timings say nothing about the kernel (-lineinfo gives source lines)",
    "--device-debug": "builds unoptimized debug code, whose timings say nothing about the kernel",
    "-arch": "the tuner compiles for the GPU it measures on",
    "--gpu-architecture": "the tuner compiles for the GPU it measures on",
    "-code": "the tuner compiles for the GPU it measures on",
}


@dataclass(frozen=True)
class CompileOptions:
    """A space's checked options: `options`, NVRTC options in their long spelling (include folders apart), and
    `include_dirs`, absolute folders inside the space's folder, in the order given."""

    options: tuple[str, ...] = ()
    include_dirs: tuple[str, ...] = ()


def parse(spec: Any, folder: Path, fail, key: str = "compile_options") -> CompileOptions:
    """Check a space's ``compile_options:`` list (None: no options). `folder` is the space's folder, which
    ``-I`` folders must lie in; `fail(message, *keys)` builds the SpaceError naming the space file and the line
    of `keys`. Raises that SpaceError for a value that is not a list of strings, an unknown or refused option, a
    bad value, or one option (one macro) given twice."""
    if spec is None:
        return CompileOptions()
    if not isinstance(spec, list):
        raise fail(f"'{key}' must be a list of NVRTC options, e.g. [-DTILE=4, --use_fast_math]", key)
    if len(spec) > MAX_OPTIONS:
        raise fail(f"'{key}' lists {len(spec)} options, more than the limit of {MAX_OPTIONS}", key)
    options: list[str] = []
    include_dirs: list[str] = []
    given: dict[str, int] = {}  # what may appear once (an option's name, a macro's) → its index
    for i, item in enumerate(spec):

        def bad(message: str, i: int = i) -> Exception:
            return fail(f"{key}: {message}", key, i)

        if not isinstance(item, str) or not item.strip():
            raise bad(f"{item!r} is not an option (write each as a string, e.g. -DTILE=4)")
        text = item.strip()
        option, once = _one(text, folder, bad)
        if once in given:
            raise bad(f"{text!r}: {once} is given twice (items {given[once] + 1} and {i + 1})")
        given[once] = i
        if option.startswith("-I"):
            include_dirs.append(option[2:])
        elif option:
            options.append(option)
    return CompileOptions(tuple(options), tuple(include_dirs))


def _one(text: str, folder: Path, bad) -> tuple[str, str]:
    """(the option as passed on, what may not be given twice) for one item; `bad(message)` for a refusal."""
    if text in _FLAGS:
        return _FLAGS[text], _FLAGS[text]
    head = text.split("=", 1)[0]
    if head in _REFUSED or text.split()[0] in _REFUSED:
        raise bad(f"{text!r} is refused: {_REFUSED.get(head) or _REFUSED[text.split()[0]]}")
    for prefix in ("--define-macro=", "-D"):
        if text.startswith(prefix):
            return _macro(text, text[len(prefix) :], bad)
    for prefix in ("--undefine-macro=", "-U"):
        if text.startswith(prefix):
            name = text[len(prefix) :]
            if not _NAME.fullmatch(name):
                raise bad(f"{text!r}: the macro name {name!r} is not an identifier")
            return f"-U{name}", f"macro {name}"
    for prefix in ("--include-path=", "-I"):
        if text.startswith(prefix):
            directory = _inside(text[len(prefix) :].strip(), folder, text, bad)
            return f"-I{directory}", f"include folder {directory}"
    name = head.lstrip("-")
    if name in _VALUED and head in (f"-{name}", f"--{name}"):
        long, pattern, what = _VALUED[name]
        value = text[len(head) + 1 :] if "=" in text else ""
        if not pattern.fullmatch(value) or (name == "maxrregcount" and int(value) > 255):
            raise bad(f"{text!r}: {long} takes {what}")
        return f"{long}={value}", long
    raise bad(f"unknown or unsupported option {text!r} (known: {known()})")


def _macro(text: str, definition: str, bad) -> tuple[str, str]:
    name, sep, value = definition.partition("=")
    if not _NAME.fullmatch(name):
        raise bad(f"{text!r}: the macro name {name!r} is not an identifier")
    if sep and not _MACRO_VALUE.fullmatch(value):
        # A space file is data: a macro's value selects or sizes, it is never CUDA text pasted into the source.
        raise bad(f"{text!r}: the value {value!r} is not an identifier or a number")
    return f"-D{name}{sep}{value}", f"macro {name}"


def _inside(raw: str, folder: Path, text: str, bad) -> str:
    """The absolute folder `raw` names (relative to the space's `folder`), once it is an existing folder inside
    `folder`, symbolic links followed."""
    if not raw:
        raise bad(f"{text!r}: name the folder in the same item, e.g. '-I include'")
    root = folder.resolve()
    directory = (root / raw).resolve()
    if not directory.is_relative_to(root):
        raise bad(f"{text!r}: {directory} is outside the space's folder {root}")
    if not directory.is_dir():
        raise bad(f"{text!r}: no such folder {directory}")
    return str(directory)


def known() -> str:
    """The accepted options, in words, for messages."""
    return (
        "-DNAME[=VALUE], -UNAME, -I DIR, "
        + ", ".join(sorted({v for v in _FLAGS.values() if v}))
        + ", "
        + ", ".join(f"{long}=..." for long, _, _ in _VALUED.values())
    )
