"""Reading and checking a space file's ``kernel:`` block, the data a `tuner.kernels.declarative.DeclarativeFamily`
is built from (that module's docstring describes the block's fields).

`read(block, directory, fail)` checks each field's form and parses every expression (`tuner.expr`: AST-checked,
no code runs), and returns the family's constructor arguments: the arguments as `Argument`, the launches as
`LaunchSpec`, the reference found in its module's source (read, never imported: `tuner.kernels.usercode`).
`validate(space, fail, ...)` checks them against the space once it is known: every expression reads only names
the space defines, and the shapes, inits and the default config's launch evaluate on every problem. Every fault
raises what `fail(message, *keys)` makes: the SpaceError naming the space file and the line of `keys`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tuner.expr import Expr, ExprError
from tuner.kernels import declared, ktgeometry, plain, usercode
from tuner.kernels.base import DTYPES, Problem
from tuner.kernels.refarrays import REFERENCE_ARRAYS, reference_arrays_of

FIELDS = ("name", "dtypes", "arguments", "launch", "bytes", "flops", "tolerance", "reference", "reference_arrays")
REQUIRED = ("name", "arguments", "launch")
ARGUMENT_FIELDS = ("name", "role", "dtype", "shape", "value", "init")
ROLES = ("input", "output", "inout", "scratch", "scalar")
#: roles whose arrays the family makes before a launch (`inputs`): read by the kernel, and for inout written too
MADE = ("input", "inout")
LAUNCH_FIELDS = ("grid", "block", "smem", *ktgeometry.KEYS)
#: what one launch of a ``launch:`` list adds: its entry (a suffix of the config's entry, or a plain source's
#: ``__global__`` function) and the names of its arguments, in call order (default: every declared argument)
LIST_LAUNCH_FIELDS = ("entry", "arguments", *LAUNCH_FIELDS)
ARRAY_DTYPES, CUDA_TYPES = declared.ARRAY_DTYPES, declared.CUDA_TYPES
SCALAR_DTYPES = {
    **{name: np.dtype(name).type for name in ARRAY_DTYPES if name not in ("bfloat16", "float16")},
    "bool": np.bool_,
}
PROBLEM_DTYPE = "dtype"  # an argument whose dtype is the problem's


@dataclass(frozen=True)
class Argument:
    """One kernel argument. `dtype` is a concrete dtype or "dtype" (the problem's); arrays have a `shape`,
    scalars a `value`; inputs and inout arrays an `init` (None: `declared.Init.default` of their dtype)."""

    name: str
    role: str
    dtype: str
    shape: tuple[Expr, ...] = ()
    value: Expr | None = None
    init: declared.Init | None = None

    def dtype_of(self, problem: Problem) -> str:
        return problem["dtype"] if self.dtype == PROBLEM_DTYPE else self.dtype

    def shape_of(self, problem: Problem) -> tuple[int, ...]:
        return tuple(int(e(problem)) for e in self.shape)


@dataclass(frozen=True)
class LaunchSpec:
    """One launch of the block: its entry (None: the config's entry), geometry expressions and argument names
    (None: every declared argument); `keys` locate it in the space file."""

    entry: str | None
    grid: tuple[Expr, ...] | ktgeometry.KtGrid
    block: tuple[Expr, ...] | None
    smem: Expr
    args: tuple[str, ...] | None = None
    keys: tuple = ("launch",)


def read(block: dict[str, Any], directory: Path, fail) -> dict[str, Any]:
    """The keyword arguments of `tuner.kernels.declarative.DeclarativeFamily` for a ``kernel:`` block, checked;
    `fail(message, *keys)` makes the SpaceError naming the space file:line."""
    for key in block:
        if key not in FIELDS:
            raise fail(f"kernel: unknown field {key!r} (allowed: {', '.join(FIELDS)})", "kernel", key)
    for key in REQUIRED:
        if key not in block:
            raise fail(f"kernel: missing field {key!r}", "kernel")
    name = block["name"]
    if not isinstance(name, str) or not plain.C_IDENTIFIER.fullmatch(name):
        raise fail(f"kernel: name {name!r} is not a C identifier ({plain.C_IDENTIFIER_RULE})", "kernel", "name")
    dtypes = block.get("dtypes", ["float32"])
    if not isinstance(dtypes, list) or not dtypes or any(d not in DTYPES for d in dtypes):
        raise fail(f"kernel: dtypes must be a list of {', '.join(DTYPES)}", "kernel", "dtypes")
    arguments = _arguments(block["arguments"], directory, fail)
    launch_specs = _launches(block["launch"], arguments, fail)
    bytes_expr = _expr(block["bytes"], fail, "kernel", "bytes") if "bytes" in block else None
    flops_expr = _expr(block["flops"], fail, "kernel", "flops") if "flops" in block else None
    tolerance = block.get("tolerance")
    if tolerance is not None and (
        isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or tolerance < 0
    ):
        raise fail(f"kernel: tolerance must be a number ≥ 0, got {tolerance!r}", "kernel", "tolerance")
    reference_fn, reference_name, arrays = None, "", block.get("reference_arrays")
    if arrays is not None and arrays not in REFERENCE_ARRAYS:
        raise fail(
            f"kernel: reference_arrays {arrays!r}: choose {', '.join(REFERENCE_ARRAYS)}",
            "kernel",
            "reference_arrays",
        )
    if block.get("reference") is not None:
        reference_name = block["reference"]
        reference_fn, arrays = _reference(reference_name, directory, fail, arrays)
    return {
        "name": name,
        "dtypes": tuple(dtypes),
        "arguments": arguments,
        "launch_specs": launch_specs,
        "bytes_expr": bytes_expr,
        "flops_expr": flops_expr,
        "tolerance_value": None if tolerance is None else float(tolerance),
        "reference_fn": reference_fn,
        "reference_name": reference_name,
        "reference_arrays": arrays or "numpy",
    }


def validate(
    space,
    fail,
    arguments: tuple[Argument, ...],
    launch_specs: tuple[LaunchSpec, ...],
    bytes_expr: Expr | None,
    flops_expr: Expr | None,
) -> None:
    """Check every expression reads only names the space defines, and that shapes, inits and the default config's
    launch evaluate to positive integers (valid draws) on every problem."""
    problem_names = set.intersection(*(set(p.env) for p in space.problems))
    config_names = problem_names | set(space.params) | set(space.derived)

    def check(expr: Expr, known: set[str], what: str, *keys) -> None:
        unknown = sorted(expr.names - known)
        if unknown:
            allowed = "problem sizes" if known is problem_names else "problem sizes, params and derived values"
            raise fail(
                f"kernel: {what} {expr.text!r} names unknown symbol(s) {', '.join(unknown)} "
                f"(it may read {allowed}: {', '.join(sorted(known))})",
                "kernel",
                *keys,
            )

    for i, arg in enumerate(arguments):
        for expr in arg.shape:  # a scratch array's shape may read the config (a split count)
            check(expr, config_names if arg.role == "scratch" else problem_names, "shape", "arguments", i, "shape")
        if arg.value is not None:
            check(arg.value, problem_names, "value", "arguments", i, "value")
        for key, expr in (arg.init.fields if arg.init is not None else {}).items():
            check(expr, problem_names, f"init {key}", "arguments", i, "init", key)
    for spec in launch_specs:
        for key, expr in _launch_expressions(spec):
            check(expr, config_names, key, *spec.keys, key)
    for key, optional in (("bytes", bytes_expr), ("flops", flops_expr)):
        if optional is not None:
            check(optional, problem_names, key, key)

    for problem in space.problems:
        env = problem.env
        config = space.resolve(space.default or next(space.enumerate(problem)), problem)
        launch_env = {**env, **config}
        for i, arg in enumerate(arguments):
            for expr in arg.shape:
                what = f"shape of {arg.name!r} on problem {problem.name!r}"
                _positive(expr, launch_env if arg.role == "scratch" else env, fail, what, "arguments", i, "shape")
            if arg.init is not None:
                dtype, count = arg.dtype_of(env), math.prod(arg.shape_of(env))
                fault = arg.init.fault(env, dtype, count)
                if fault is not None:
                    raise fail(
                        f"kernel: init {arg.init.kind} of {arg.name!r} ({dtype}) on problem {problem.name!r}: {fault}",
                        "kernel",
                        "arguments",
                        i,
                        "init",
                    )
        for spec in launch_specs:
            for key, expr in _launch_expressions(spec):
                if key != "smem":
                    what = f"launch {key} for the default config on problem {problem.name!r}"
                    _positive(expr, launch_env, fail, what, *spec.keys, key)
            for name in ktgeometry.BLOCK_NAMES if spec.block is None else ():
                value = config.get(name, 1)
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise fail(
                        f"kernel: launch: the block is block_size_x/y/z, but {name}={value!r} in the default "
                        "config is not a positive integer (or give 'block:')",
                        "kernel",
                        *spec.keys,
                    )


def _expr(text: Any, fail, *keys) -> Expr:
    try:
        return Expr.parse(text)
    except ExprError as exc:
        raise fail(f"{': '.join(str(k) for k in keys if isinstance(k, str))}: {exc}", *keys) from None


def _launches(spec: Any, arguments: tuple[Argument, ...], fail) -> tuple[LaunchSpec, ...]:
    """The launches of a ``launch:`` mapping (one launch of every argument) or list (each with its ``entry``
    and ``arguments``, names of declared arguments)."""
    if not isinstance(spec, list):
        return (LaunchSpec(None, *_launch(spec, fail)),)
    if not spec:
        raise fail("kernel: launch: a list of launches needs at least one", "kernel", "launch")
    declared_names = [a.name for a in arguments]
    out: list[LaunchSpec] = []
    for i, item in enumerate(spec):

        def item_fail(message: str, *keys, index=i):  # the same faults, at this item's line
            keys = (*keys[:2], index, *keys[2:]) if keys[:2] == ("kernel", "launch") else keys
            return fail(message.replace("kernel: launch:", f"kernel: launch {index}:", 1), *keys)

        if not isinstance(item, dict):
            raise fail(
                f"kernel: launch {i}: expected a mapping of entry, grid, block, arguments", "kernel", "launch", i
            )
        for key in item:
            if key not in LIST_LAUNCH_FIELDS:
                raise item_fail(
                    f"kernel: launch: unknown field {key!r} (allowed: {', '.join(LIST_LAUNCH_FIELDS)})",
                    "kernel",
                    "launch",
                    key,
                )
        entry = item.get("entry")
        if entry is not None and (not isinstance(entry, str) or not plain.C_IDENTIFIER.fullmatch(entry)):
            raise item_fail(f"kernel: launch: entry {entry!r} is not a C identifier", "kernel", "launch", "entry")
        names = item.get("arguments")
        if names is not None:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise item_fail(
                    "kernel: launch: arguments is a list of argument names", "kernel", "launch", "arguments"
                )
            unknown = [n for n in names if n not in declared_names]
            if unknown:
                raise item_fail(
                    f"kernel: launch: arguments {', '.join(map(repr, unknown))} name nothing declared "
                    f"(declared: {', '.join(declared_names)})",
                    "kernel",
                    "launch",
                    "arguments",
                )
        geometry = {k: v for k, v in item.items() if k not in ("entry", "arguments")}
        grid, block, smem = _launch(geometry, item_fail)
        out.append(LaunchSpec(entry, grid, block, smem, None if names is None else tuple(names), ("launch", i)))
    return tuple(out)


def _launch_expressions(spec: LaunchSpec) -> list[tuple[str, Expr]]:
    """(launch key, expression) of every expression of one launch."""
    grid = spec.grid.expressions() if isinstance(spec.grid, ktgeometry.KtGrid) else [("grid", e) for e in spec.grid]
    return [*grid, *(("block", e) for e in spec.block or ()), ("smem", spec.smem)]


def _launch(launch: Any, fail) -> tuple[tuple[Expr, ...] | ktgeometry.KtGrid, tuple[Expr, ...] | None, Expr]:
    """(grid, block, smem) of a ``launch:`` mapping: ``grid`` and ``block`` expressions, or Kernel Tuner's
    ``problem_size`` and ``grid_div_x/y/z`` with an optional ``block`` (None: the config's block_size_x/y/z)."""
    if not isinstance(launch, dict):
        raise fail("kernel: launch must be a mapping of grid, block (and smem), or problem_size", "kernel", "launch")
    for key in launch:
        if key not in LAUNCH_FIELDS:
            raise fail(
                f"kernel: launch: unknown field {key!r} (allowed: {', '.join(LAUNCH_FIELDS)})", "kernel", "launch", key
            )
    smem = _expr(launch.get("smem", 0), fail, "kernel", "launch", "smem")
    if "problem_size" in launch:
        if "grid" in launch:
            raise fail(
                "kernel: launch: either grid or problem_size (Kernel Tuner's, with grid_div_x/y/z), not both",
                "kernel",
                "launch",
                "grid",
            )
        block = _dims(launch["block"], fail, "kernel", "launch", "block") if "block" in launch else None
        return ktgeometry.from_launch(launch, fail), block, smem
    for key in ktgeometry.GRID_DIV_KEYS:
        if key in launch:
            raise fail(f"kernel: launch: {key} divides problem_size, which the launch lacks", "kernel", "launch", key)
    for key in ("grid", "block"):
        if key not in launch:
            also = " (or Kernel Tuner's problem_size)" if key == "grid" else ""
            raise fail(f"kernel: launch: missing field {key!r}{also}", "kernel", "launch")
    return (
        _dims(launch["grid"], fail, "kernel", "launch", "grid"),
        _dims(launch["block"], fail, "kernel", "launch", "block"),
        smem,
    )


def _dims(spec: Any, fail, *keys) -> tuple[Expr, ...]:
    items = spec if isinstance(spec, list) else [spec]
    if not 1 <= len(items) <= 3:
        raise fail(f"{keys[-1]}: expected 1 to 3 expressions (x, y, z)", *keys)
    return tuple(_expr(item, fail, *keys) for item in items)


def _positive(expr: Expr, env: dict[str, Any], fail, what: str, *keys) -> int:
    try:
        value = expr(env)
    except (ArithmeticError, TypeError, ValueError) as exc:
        raise fail(f"kernel: {what}: {expr.text!r} fails: {type(exc).__name__}: {exc}", "kernel", *keys) from None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise fail(f"kernel: {what}: {expr.text!r} gives {value!r}, not a positive integer", "kernel", *keys)
    return value


def _arguments(spec: Any, directory: Path, fail) -> tuple[Argument, ...]:
    if not isinstance(spec, list) or not spec:
        raise fail("kernel: arguments must be a non-empty list of {name, role, shape, dtype}", "kernel", "arguments")
    out: list[Argument] = []
    for i, item in enumerate(spec):
        keys = ("kernel", "arguments", i)
        if not isinstance(item, dict):
            raise fail("kernel: each argument is a mapping {name, role, shape, dtype, value}", *keys)
        for key in item:
            if key not in ARGUMENT_FIELDS:
                raise fail(
                    f"kernel: argument: unknown field {key!r} (allowed: {', '.join(ARGUMENT_FIELDS)})", *keys, key
                )
        for key in ("name", "role"):
            if key not in item:
                raise fail(f"kernel: argument: missing field {key!r}", *keys)
        name, role = item["name"], item["role"]
        if not isinstance(name, str) or not plain.C_IDENTIFIER.fullmatch(name):
            raise fail(
                f"kernel: argument name {name!r} is not a C identifier ({plain.C_IDENTIFIER_RULE})", *keys, "name"
            )
        if any(a.name == name for a in out):
            raise fail(f"kernel: argument {name!r} is listed twice", *keys, "name")
        if role not in ROLES:
            raise fail(f"kernel: argument {name!r}: role must be one of {', '.join(ROLES)}", *keys, "role")
        if role == "inout" and "shape" not in item:
            raise fail(
                f"kernel: inout {name!r} is updated in place, so it must be an array: give it a shape "
                "(a scalar is role: scalar)",
                *keys,
                "role",
            )
        if "init" in item and role not in MADE:
            raise fail(f"kernel: {role} {name!r} takes no init (only input and inout arrays do)", *keys, "init")
        if role == "scalar":
            if "shape" in item:
                raise fail(f"kernel: scalar {name!r} has no shape", *keys, "shape")
            dtype = declared.array_dtype(item.get("dtype", "int64"))
            if dtype not in SCALAR_DTYPES:
                raise fail(
                    f"kernel: scalar {name!r}: dtype must be one of {', '.join(SCALAR_DTYPES)} or their CUDA types",
                    *keys,
                    "dtype",
                )
            out.append(Argument(name, role, dtype, value=_expr(item.get("value", name), fail, *keys, "value")))
            continue
        if "value" in item:
            raise fail(f"kernel: array {name!r} takes no value (only scalars do)", *keys, "value")
        if "shape" not in item:
            raise fail(f"kernel: argument: missing field 'shape' for array {name!r}", *keys)
        spelled = item.get("dtype", PROBLEM_DTYPE)
        dtype = PROBLEM_DTYPE if spelled == PROBLEM_DTYPE else declared.array_dtype(spelled)
        if dtype is None:
            raise fail(
                f"kernel: array {name!r}: dtype {spelled!r} must be 'dtype' (the problem's), one of "
                f"{', '.join(ARRAY_DTYPES)} or a CUDA type (int, int64_t, uint8_t, unsigned int, __half, ...)",
                *keys,
                "dtype",
            )
        shape = item["shape"]
        shape = shape if isinstance(shape, list) else [shape]
        if not shape:
            raise fail(f"kernel: array {name!r}: shape needs at least one dimension", *keys, "shape")
        init = None
        if "init" in item:
            init = declared.Init.parse(item["init"], None if dtype == PROBLEM_DTYPE else dtype, directory, fail, keys)
        shape_exprs = tuple(_expr(s, fail, *keys, "shape") for s in shape)
        out.append(Argument(name, role, dtype, shape=shape_exprs, init=init))
    if not any(a.role in ("output", "inout") for a in out):
        raise fail("kernel: arguments name no output (role: output or inout)", "kernel", "arguments")
    return tuple(out)


def _reference(spec: Any, directory: Path, fail, arrays: str | None):
    """(the reference `spec` names, guarded: `usercode.guarded`; how it receives its arrays: `arrays`, else read
    from its signature). Reads the user's module's source, never imports it: the module is imported where the
    reference first runs (`usercode.UserFunction`), so render, check and a study's driver run none of its code."""

    def ref_fail(message: str, *_keys):
        return fail(f"kernel: reference: {message}", "kernel", "reference")

    fn = usercode.find(spec, directory, ref_fail, "reference")
    read = "numpy" if fn.signature is None else reference_arrays_of(fn.signature)
    return functools.partial(usercode.guarded, fn, f"reference {spec}", directory), arrays or read
