"""The family a space file names: shipped or registered by name, a user's class, or a declarative block.

A space file chooses its family with one of

* ``kernel: NAME`` — a shipped family or one an installed package registers (entry point group
  ``tuner.build.families``);
* ``family: FILE.py:Class`` (a file next to the space) or ``family: package.module:Class`` (importable from the
  space's directory or the environment) — importing it runs the user's code, by the user's choice;
* ``kernel: {name: ..., arguments: [...], launch: {...}, ...}`` — a declarative family
  (`tuner.kernels.declarative`): data only, no code runs but AST-checked expressions (the reference and any
  init function it names are read from their source here and imported only where they run, by the user's choice).

``template: FILE.cu.j2`` (next to the space) gives the family a template of its own (``template: FILE.cu``, a plain
source whose config arrives as ``#define``s: `tuner.kernels.plain`; it must declare the ``__global__`` function
named as the family), and ``compile_options:``
NVRTC options of its own (checked: `tuner.kernels.compile_options`). A family a space defines searches the space's
folder (and its ``-I`` folders) for local ``#include`` files. Every fault is an InputError that names the file
and, where there is one, the line.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

from tuner import kernels
from tuner.core.errors import InputError, SpaceError
from tuner.kernels import plain
from tuner.kernels.base import Family, ReferenceFailed
from tuner.kernels.usercode import guarded, import_user, user_error


def space_family(data: dict[str, Any], path: Path, fail) -> Family:
    """The family of the space loaded from `path` (its YAML mapping `data`), registered under its reference.
    `fail(message, *keys)` builds the SpaceError that names the space file and the line of `keys`."""
    from tuner.kernels import compile_options

    directory = path.resolve().parent
    kernel, spec, template = data.get("kernel"), data.get("family"), data.get("template")
    # checked before any of the user's code is imported: a refused option costs nothing to report
    options = compile_options.parse(data.get("compile_options"), directory, fail)
    if spec is not None:
        if isinstance(kernel, dict):
            raise fail("a space has either a 'family:' line or a declarative 'kernel:' block, not both", "family")
        if not isinstance(spec, str):
            raise fail("'family' expects FILE.py:Class or package.module:Class", "family")
        family = load_class(spec, directory, fail)
        if kernel is not None and kernel != family.name:
            raise fail(f"kernel {kernel!r} does not match the family's name {family.name!r}", "kernel")
        if family.template_dir is None and template is None:
            family.template_dir = str(directory)
    elif isinstance(kernel, dict):
        from tuner.kernels.declarative import DeclarativeFamily

        family = DeclarativeFamily.from_block(kernel, directory, fail)
    elif isinstance(kernel, str):
        if kernel not in kernels.names():
            raise fail(
                f"unknown kernel {kernel!r} (known: {', '.join(kernels.names())}; or name a family with "
                "'family:', or describe one with a 'kernel:' block)",
                "kernel",
            )
        family = kernels.get(kernel)
        if template is None and options == compile_options.CompileOptions():
            return family
        family = copy.copy(family)  # the registered instance stays as it is for other spaces
    else:
        raise fail("'kernel' must be a family name or a mapping (a declarative family)", "kernel")

    if template is not None:
        if not isinstance(template, str) or Path(template).name != template or not template:
            raise fail("'template' names a file next to the space (no directories)", "template")
        family.template, family.template_dir = template, str(directory)
    if not family.template:
        raise fail(
            f"family {family.name!r} names no template (add 'template: FILE.cu.j2')",
            "kernel" if spec is None else "family",
        )
    if family.template_dir is not None and not (Path(family.template_dir) / family.template).is_file():
        raise fail(
            f"template {family.template!r} not found in {family.template_dir}",
            "template" if template is not None else ("family" if spec is not None else "kernel"),
        )
    if family.template_dir is not None and plain.is_plain(family.template):
        plain.check_entry(Path(family.template_dir) / family.template, family.name)
    family.compile_options = (*family.compile_options, *options.options)
    family.include_dirs = tuple(dict.fromkeys([*family.include_dirs, *options.include_dirs, str(directory)]))
    return kernels.register(kernels.SPACE_PREFIX + str(path.resolve()), family)


# ---------------------------------------------------------------------------------------------------------------
# importing the user's code


def load_class(spec: str, directory: Path, fail) -> Family:
    """An instance of the Family subclass `spec` names (FILE.py:Class or package.module:Class)."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr.isidentifier():
        raise fail(f"family {spec!r}: expected FILE.py:Class or package.module:Class", "family")
    module = import_user(target, directory, fail, "family")
    obj = getattr(module, attr, None)
    if obj is None:
        raise fail(f"family {spec!r}: {target} has no {attr!r}", "family")
    if not (isinstance(obj, type) and issubclass(obj, Family)):
        raise fail(f"family {spec!r}: {attr} is not a subclass of tuner.kernels.base.Family", "family")
    try:
        family = obj()
    except Exception as exc:  # user code
        raise user_error(exc, f"family {spec!r}: {attr}() raised", directory) from None
    if not family.name or not plain.C_IDENTIFIER.fullmatch(str(family.name)):
        raise fail(
            f"family {spec!r}: {attr}.name must be a C identifier ({plain.C_IDENTIFIER_RULE}), got {family.name!r}",
            "family",
        )
    # The instance's reference turns the user's exceptions into ReferenceFailed: a failed trial, not a crash.
    family.reference = functools.partial(  # type: ignore[method-assign]
        guarded, family.reference, f"{target}:{attr}.reference", directory
    )
    return family


# ---------------------------------------------------------------------------------------------------------------
# the reference, tried once before any GPU work


def check_reference(space, problem=None, required: bool = False, run: bool = True) -> None:
    """Run a user family's reference once with NumPy on `problem` (default: the space's first) for the default
    config, and check it returns every checked output with its declared shape. InputError naming the reference's
    file (and line) otherwise; also when `required` (a study on a GPU) and a declarative family has none.
    With `run` False the reference itself is not run nor imported (a study on a GPU: its worker imports it and
    runs it once per input set, where the data is); loading the space has read its signature from its source.
    Running it allocates the problem's arrays on the host (GBs at LLM sizes), so only a replay, which has no
    worker to run it, asks for that. Shipped and registered families are not checked (their own tests do that)."""
    import numpy as np

    family = space.family
    if not family.ref.startswith(kernels.SPACE_PREFIX):
        return
    if getattr(family, "has_reference", True) is False:
        if required:
            raise InputError(
                f"kernel {family.name!r} declares no reference, so its results cannot be verified: "
                "add 'reference: FILE.py:function' to its block (without one, render and check work)",
                str(space.path),
            )
        return
    if not run:
        return
    problem = problem or space.problem()
    config = space.resolve(space.default, problem)
    env = problem.env
    inputs = family.inputs(np, env, np.random.default_rng(0))
    where = str(space.path)
    try:
        expected = family.reference(np, inputs, env, config=config)
    except ReferenceFailed as exc:
        raise InputError(str(exc), where) from None
    if not isinstance(expected, dict):
        raise InputError(f"{family.name}: reference returned {type(expected).__name__}, not a dict of outputs", where)
    # what the kernel writes: its outputs, and the inputs it updates in place (checked names that are inputs)
    written = {name: tuple(shape) for name, (shape, _) in family.outputs(env, config).items()}
    written.update((n, tuple(np.shape(inputs[n]))) for n in family.checked() if n not in written and n in inputs)
    for name in family.checked() or tuple(expected):
        if name not in expected:
            raise InputError(f"{family.name}: reference returned no {name!r} (returned: {sorted(expected)})", where)
        if name not in written:
            raise InputError(f"{family.name}: reference returned {name!r}, which is not an output", where)
        shape = tuple(np.shape(expected[name]))
        if shape != written[name]:
            raise InputError(
                f"{family.name}: reference output {name!r} has shape {shape}, the kernel writes {written[name]}",
                where,
            )


__all__ = ["SpaceError", "check_reference", "load_class", "space_family"]
