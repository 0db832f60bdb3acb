"""Render a kernel template for one config: (kernel, config, problem) → `Source`.

One strict Jinja2 environment over the shipped templates (``templates/``, package data in a wheel: see
`tuner.core.shipped`), plus the directory of a family's own template when it has one (``Family.template_dir``: a
space's directory, or an installed package's): an undefined variable is an error naming the template and line,
never an empty string that turns into a baffling compile error later.

A `Source` carries what NVRTC needs besides the text: the folders to search for the template's local
``#include "..."`` files (the template's own folder first, then `Family.include_dirs`) and the family's checked
compile options (`Family.compile_options`).

What a template sees: every param and derived value of the config, the problem's sizes, ``dtype``, ``ctype``
(the C type of the dtype), ``elem_bytes``, and ``entry``, the name its ``extern "C" __global__`` entry point must
have (extra kernels of the same config are named ``entry`` + "_" + suffix).

A template whose name does not end in ``.j2`` is a plain source (`tuner.kernels.plain`, Kernel Tuner's convention):
no Jinja2 runs over it; the config arrives as ``#define`` lines ahead of the file's text, and its entry point is the
``__global__`` function named as the family, the same for every config (`entry_name`).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from tuner.core.errors import TemplateError
from tuner.core.shipped import shipped_dir
from tuner.kernels import base as kbase
from tuner.kernels import plain

#: The shipped templates (`tuner.core.shipped`): an installed wheel finds them from any directory.
TEMPLATES_DIR = Path(os.environ.get("TUNER_TEMPLATES") or shipped_dir("templates"))


@dataclass(frozen=True)
class Source:
    """Rendered CUDA source. `uri` is readable and unique per (kernel, params, problem): the same name shows in
    logs, the compile cache, exported headers and the dashboard; `entry` is the C identifier of the kernel."""

    kernel: str
    text: str
    entry: str
    uri: str
    template: str
    #: folders for local ``#include``s, absolute, the template's own folder first (empty: none)
    include_dirs: tuple[str, ...] = ()
    #: NVRTC options of the family's, after the tuner's own (`tuner.build.compile.BASE_OPTIONS`)
    options: tuple[str, ...] = ()


def environment(templates_dir: Path | str = TEMPLATES_DIR, *extra_dirs: Path | str) -> jinja2.Environment:
    """The strict environment. `extra_dirs` (a family's own template directory) are searched first, so a user's
    template may include the shipped ones and its own files alike."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([*(str(d) for d in extra_dirs), str(templates_dir)]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


#: template directory → its Jinja environment: process-wide, a cache of what each directory's templates compile to
_ENVS: dict[str, jinja2.Environment] = {}


def _env(family: kbase.Family | None = None) -> jinja2.Environment:
    """One environment per template directory (the shipped one, or a family's own plus the shipped one)."""
    own = getattr(family, "template_dir", None)
    key = str(own or "")
    if key not in _ENVS:
        _ENVS[key] = environment(TEMPLATES_DIR, *([own] if own else []))
    return _ENVS[key]


def template_file(family: kbase.Family) -> Path:
    """The file `family.template` renders from: its own directory first, then the shipped templates."""
    own = getattr(family, "template_dir", None)
    for directory in ([Path(own)] if own else []) + [TEMPLATES_DIR]:
        if (directory / family.template).is_file():
            return directory / family.template
    raise TemplateError(f"template {family.template!r} not found in {own or TEMPLATES_DIR}")


def include_dirs(family: kbase.Family, template: str | Path | None) -> tuple[str, ...]:
    """The folders NVRTC searches for the local includes of a source rendered from the file `template`: the
    template's own folder (as a C compiler looks beside the including file), then `Family.include_dirs`, each
    once. `template` None (a template not read from a file) contributes no folder."""
    folders = [str(Path(template).resolve().parent)] if template else []
    return tuple(dict.fromkeys([*folders, *family.include_dirs]))


def templates_hash(family: kbase.Family, templates_dir: Path | str | None = None) -> str:
    """sha256 of the family's template file (`template_file`, or the one in `templates_dir`): a study records it,
    so a source rendered later can be trusted to be the one that was measured. A replay-only family has no
    template: the hash of nothing."""
    if not family.template:
        return hashlib.sha256(b"").hexdigest()
    path = Path(templates_dir) / family.template if templates_dir is not None else template_file(family)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _token(value: Any) -> str:
    text = str(value).replace(".", "p").replace("-", "m")
    return re.sub(r"[^0-9A-Za-z]", "", text)


def uri(family: kbase.Family, params: dict[str, Any]) -> str:
    """``transpose_tile32_rpt8_pad1_vec4``: the kernel name and each param under its short name (but a later knob
    at its `Family.uri_defaults` value, so that configs recorded before it keep their uris)."""
    omit = family.uri_defaults
    parts = [family.name] + [
        f"{family.uri_names.get(k, k)}{_token(v)}" for k, v in params.items() if k not in omit or omit[k] != v
    ]
    return "_".join(parts)


def entry_name(family: kbase.Family, params: dict[str, Any]) -> str:
    """The C name of a config's entry point: its uri, or a plain source's one ``__global__`` function (named as
    the family) for every config."""
    return family.name if plain.is_plain(family.template) else uri(family, params)


def render(
    family: kbase.Family,
    params: dict[str, Any],
    config: dict[str, Any],
    problem_env: dict[str, Any],
    env: jinja2.Environment | None = None,
) -> Source:
    """Render `family.template` with the resolved `config` (params + derived) and the problem.

    `params` (the raw knobs, in declared order) name the uri; `config` is what the template sees. Raises
    TemplateError (template:line: fault) on a Jinja syntax error or an undefined variable.
    """
    env = env or _env(family)
    for key, value in {**config, "dtype": problem_env.get("dtype")}.items():
        if isinstance(value, str) and not _IDENTIFIER.fullmatch(value):
            raise TemplateError(
                f"{key}={value!r} is not an identifier: string values select a variant and are never pasted into CUDA",
                family.template,
            )
    name = uri(family, params)
    if plain.is_plain(family.template):
        return _plain_source(family, name, config, problem_env)
    context = {
        **problem_env,
        **config,
        "ctype": kbase.DTYPES[problem_env["dtype"]][0],
        "entry": name,
    }
    try:
        template = env.get_template(family.template)
        text = template.render(**context)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(
            f"template syntax error: {exc.message}", exc.filename or family.template, exc.lineno
        ) from None
    except jinja2.TemplateNotFound as exc:
        # environment() builds a FileSystemLoader; a caller's own environment may hold another loader
        loader = env.loader
        searched = loader.searchpath if isinstance(loader, jinja2.FileSystemLoader) else loader
        raise TemplateError(f"template {exc.name!r} not found in {searched}") from None
    except jinja2.UndefinedError as exc:
        where, line = _template_frame(sys.exc_info()[2], family.template)
        raise TemplateError(f"undefined variable: {exc.message}", where, line) from None
    except (TypeError, ValueError, ArithmeticError) as exc:
        # A value of the wrong type for what the template does with it (a string param in arithmetic).
        where, line = _template_frame(sys.exc_info()[2], family.template)
        if line is None:  # not raised by template code: a bug of ours, keep the traceback
            raise
        raise TemplateError(
            f"cannot render with {_describe(params)}: {type(exc).__name__}: {exc}", where, line
        ) from None
    return Source(
        kernel=family.name,
        text=text,
        entry=name,
        uri=name,
        template=family.template,
        include_dirs=include_dirs(family, template.filename),
        options=tuple(family.compile_options),
    )


def _plain_source(family: kbase.Family, name: str, config: dict[str, Any], problem_env: dict[str, Any]) -> Source:
    """A plain source's `Source`: the config's defines (with the grid and block of its first launch) ahead of the
    file's text, as `tuner.kernels.plain` says. TemplateError for a value that has no C literal."""
    path = template_file(family)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TemplateError(f"cannot read: {exc}", str(path)) from None
    launch = family.launches(family.name, config, problem_env)[0]
    try:
        named = plain.defines(config, launch.grid, launch.block)
    except ValueError as exc:
        raise TemplateError(f"cannot define the config {_describe(config)}: {exc}", str(path)) from None
    return Source(
        kernel=family.name,
        text=plain.source_text(text, named),
        entry=family.name,
        uri=name,
        template=family.template,
        include_dirs=include_dirs(family, path),
        options=tuple(family.compile_options),
    )


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _describe(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in params.items())


def _template_frame(tb, template: str) -> tuple[str, int | None]:
    """The innermost traceback frame inside a template file; Jinja rewrites frames to template lines."""
    where, line = template, None
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if filename.endswith(".j2"):
            where, line = filename, tb.tb_lineno
        tb = tb.tb_next
    return where, line
