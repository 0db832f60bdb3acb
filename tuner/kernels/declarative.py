"""A family described as data: the ``kernel:`` block of a space file.

Most memory-bound kernels need no Python class: their arguments, launch geometry, traffic and tolerance are
expressions of the problem's sizes and the config. A space file says so in its ``kernel:`` block::

    kernel:
      name: scale_add                      # the kernel's name (readable uris start with it)
      dtypes: [float32]                    # problem dtypes it supports (default [float32])
      arguments:                           # in the order of the template's entry point
        - {name: x, role: input, shape: [n]}             # dtype: the problem's, unless given
        - {name: y, role: input, shape: [n], init: {kind: uniform, low: -1, high: 1}}
        - {name: ids, role: input, dtype: int32_t, shape: [n], init: {kind: permutation}}
        - {name: out, role: output, shape: [n]}
        - {name: count, role: inout, dtype: int, shape: [1], init: zeros}   # read and written in place
        - {name: alpha, role: scalar, dtype: float32, value: "2"}   # value: expression of problem sizes
        - {name: n, role: scalar, dtype: int64}                      # value defaults to the name
      launch:
        grid: ["ceil_div(n, block * vec)"]   # expressions of problem sizes, params and derived values
        block: [block]
        smem: 0                              # dynamic shared memory, bytes (default 0)
        # or Kernel Tuner's form instead of grid: problem_size: [n], grid_div_x: [block_size_x, vec], and no
        # block (block_size_x/y/z of the config, else 256, 1, 1): `tuner.kernels.ktgeometry`
      bytes: 3 * n * elem_bytes              # minimal traffic (default: each input read once, each output
      flops: 2 * n                           #   written once); useful FLOPs (default 0)
      tolerance: 1.0e-5                      # default: by dtype (1e-4 float32, 5e-3 float16, 2e-2 bfloat16)
      reference: ref.py:scale_add            # optional: FILE.py:function or module:function
      reference_arrays: numpy                # optional: numpy | xp | torch (default: read from the function)

Shapes, scalar values, bytes and FLOPs read only the problem (sizes, ``dtype``, ``elem_bytes``); the launch may
also read params and derived values. Every expression goes through `tuner.expr` (AST-checked, no code runs).

An array's dtype is the problem's (``dtype``), a name (float32, float16, bfloat16, float64, int8 ... int64,
uint8 ... uint64, bool) or the CUDA type the kernel takes (``__nv_bfloat16``, ``__half``, ``float``, ``int``,
``int64_t``, ``uint8_t``, ``unsigned int``, ...: `tuner.kernels.declared`): a kernel written with ``cuda_bf16.h``
types takes ``const __nv_bfloat16*`` and is launched with 2-byte arrays of bf16 bits.

Each input is made as its ``init:`` says (`tuner.kernels.declared`: normal, uniform, integers, permutation,
arange, zeros, ones, constant, or ``FILE.py:function``; standard normal for floats and integers in [0, 100) for
ints by default), drawn on the GPU from the study's seeded generator (`tuner.gpu.verify`: a pool of input sets whose
references are computed once); outputs are NaN-poisoned before each checked launch. An ``inout`` array is made as
an input, read and written by the kernel, and checked after the launch against what the reference returns for it
from its values before the launch (the reference gets a copy). The reference receives every input, inout and
scalar by name (keyword arguments) and returns the expected output (one output) or a dict name → array; it runs
the user's code, by the user's choice. Loading the space reads its module's source (its signature is checked)
but never imports it: that happens where the reference first runs, the GPU worker (or a replay's host check), so
``tuner render``, ``tuner check`` and a study's driver run none of its code. Integer and bool arrays reach it as
they are; float arrays as ``reference_arrays`` says (read from the function when not given):

* ``numpy`` (the default): NumPy arrays on the host — the inputs travel to the host once per input set — in
  float64, or in float32 when every output is 16 bits wide (bf16/fp16 kernels: exact for 16-bit inputs, far
  below such an output's tolerance, and half the bytes and time of float64 at LLM sizes);
* ``xp`` (the function has a parameter named ``xp``): arrays of the module it is passed as ``xp`` — CuPy on the
  GPU, NumPy where there is none — in float32 (bf16 and fp16 decoded; float64 inputs stay float64), so the
  reference runs where the data is;
* ``torch`` (a parameter annotated ``torch.Tensor``): torch tensors of the declared dtype on the GPU through
  DLPack (bf16 as ``torch.bfloat16``, no bit patterns), CPU tensors where there is no GPU; it may return
  tensors. Without a reference, ``tuner render`` and ``tuner check`` work, but results cannot be verified, so a
study on a GPU refuses to start.

Several launches (a split then its combine) are a list under ``launch:``, run in order, each with the fields of
one launch and its ``entry`` and ``arguments``::

      launch:
        - {grid: [splits], block: [block], arguments: [x, partial, n]}          # the config's entry
        - {entry: combine, grid: [1], block: [32], arguments: [partial, out]}   # {{ entry }}_combine

A launch's ``entry`` is a suffix of the config's entry in a Jinja2 template, the ``__global__`` function itself
in a plain source; its ``arguments`` name declared arguments, in call order (default: all of them). An array one
launch writes for another is ``role: scratch``: allocated and poisoned like an output, never checked nor counted
in the default bytes, its shape may read params and derived values.

The template is a Jinja2 template (``kernel.cu.j2``) whose entry point is ``{{ entry }}``, or a plain source
(``kernel.cu``) whose ``__global__`` function is the block's ``name`` and whose config arrives as ``#define``s
(`tuner.kernels.plain`): a Kernel Tuner kernel runs as it is, with ``arguments`` for Kernel Tuner's argument list and
Kernel Tuner's launch form.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tuner.expr import Expr, ExprError
from tuner.kernels import bf16, declared, ktgeometry, plain, usercode
from tuner.kernels.base import DTYPES, Config, Family, Launch, Problem, ReferenceFailed

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
#: How a reference receives its arrays (see the module docstring).
REFERENCE_ARRAYS = ("numpy", "xp", "torch")
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


class DeclarativeFamily(Family):
    """A `Family` built from a ``kernel:`` block (see the module docstring)."""

    def __init__(
        self,
        name: str,
        dtypes: tuple[str, ...],
        arguments: tuple[Argument, ...],
        launch_specs: tuple[LaunchSpec, ...],
        bytes_expr: Expr | None,
        flops_expr: Expr | None,
        tolerance_value: float | None,
        reference_fn=None,
        reference_name: str = "",
        reference_arrays: str = "numpy",
    ):
        self.name, self.dtypes, self.arguments = name, dtypes, arguments
        self.launch_specs = launch_specs
        self.bytes_expr, self.flops_expr, self.tolerance_value = bytes_expr, flops_expr, tolerance_value
        self.reference_fn, self.reference_name = reference_fn, reference_name
        self.reference_arrays = reference_arrays
        self.has_reference = reference_fn is not None
        self.uri_names = {}

    # -- loading ----------------------------------------------------------------------------------------------
    @classmethod
    def from_block(cls, block: dict[str, Any], directory: Path, fail) -> DeclarativeFamily:
        """Check and build the block; `fail(message, *keys)` makes the SpaceError naming the space file:line."""
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
        family = cls(
            name,
            tuple(dtypes),
            arguments,
            launch_specs,
            bytes_expr,
            flops_expr,
            None if tolerance is None else float(tolerance),
            reference_fn,
            reference_name,
            arrays or "numpy",
        )
        family.template_dir = str(directory)
        return family

    def validate_space(self, space, fail) -> None:
        """Check every expression reads only names the space defines, that shapes and the default config's
        launch evaluate to positive integers on every problem, and that the reference (if any) can be called
        with the arguments `reference` passes it (by its signature: it is not run)."""
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

        for i, arg in enumerate(self.arguments):
            for expr in arg.shape:  # a scratch array's shape may read the config (a split count)
                check(expr, config_names if arg.role == "scratch" else problem_names, "shape", "arguments", i, "shape")
            if arg.value is not None:
                check(arg.value, problem_names, "value", "arguments", i, "value")
            for key, expr in (arg.init.fields if arg.init is not None else {}).items():
                check(expr, problem_names, f"init {key}", "arguments", i, "init", key)
        for spec in self.launch_specs:
            for key, expr in _launch_expressions(spec):
                check(expr, config_names, key, *spec.keys, key)
        for key, optional in (("bytes", self.bytes_expr), ("flops", self.flops_expr)):
            if optional is not None:
                check(optional, problem_names, key, key)

        for problem in space.problems:
            env = problem.env
            config = space.resolve(space.default or next(space.enumerate(problem)), problem)
            launch_env = {**env, **config}
            for i, arg in enumerate(self.arguments):
                for expr in arg.shape:
                    what = f"shape of {arg.name!r} on problem {problem.name!r}"
                    _positive(expr, launch_env if arg.role == "scratch" else env, fail, what, "arguments", i, "shape")
                if arg.init is not None:
                    dtype, count = arg.dtype_of(env), math.prod(arg.shape_of(env))
                    fault = arg.init.fault(env, dtype, count)
                    if fault is not None:
                        raise fail(
                            f"kernel: init {arg.init.kind} of {arg.name!r} ({dtype}) on problem {problem.name!r}: "
                            f"{fault}",
                            "kernel",
                            "arguments",
                            i,
                            "init",
                        )
            for spec in self.launch_specs:
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
        fault = self._reference_call_fault()
        if fault is not None:
            raise fail(f"kernel: reference {self.reference_name!r} {fault}", "kernel", "reference")

    def _reference_call_fault(self) -> str | None:
        """Why the reference cannot take, by name, the arguments `reference` passes it, or None."""
        if self.reference_fn is None:
            return None
        names = [a.name for a in self.arguments if a.role in (*MADE, "scalar")]
        names += ["xp"] if self.reference_arrays == "xp" else []
        fn = self.reference_fn.args[0] if isinstance(self.reference_fn, functools.partial) else self.reference_fn
        fault = _call_fault(fn.signature if isinstance(fn, usercode.UserFunction) else fn, names)  # inside guarded
        return None if fault is None else f"cannot be called with its arguments ({', '.join(names)}): {fault}"

    # -- the Family contract ------------------------------------------------------------------------------------
    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        """One launch per entry of the block's ``launch:`` list, in order. A launch's ``entry:`` is a suffix of
        the config's entry in a Jinja2 template (``combine`` launches ``{{ entry }}_combine``, as
        `tuner.build.render` names extra kernels), the ``__global__`` function itself in a plain source."""
        env = {**problem, **config}
        everything = tuple(a.name for a in self.arguments)
        out = []
        for spec in self.launch_specs:
            grid = spec.grid(env, config) if isinstance(spec.grid, ktgeometry.KtGrid) else _dim3(spec.grid, env)
            block = ktgeometry.default_block(config) if spec.block is None else _dim3(spec.block, env)
            name = entry
            if spec.entry is not None:
                name = spec.entry if plain.is_plain(self.template) else f"{entry}_{spec.entry}"
            out.append(Launch(name, grid, block, spec.args or everything, smem_dynamic=int(spec.smem(env))))
        return out

    def inputs(self, xp, problem: Problem, rng) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for arg in self.arguments:
            if arg.role in MADE:
                shape, dtype = arg.shape_of(problem), arg.dtype_of(problem)
                init = arg.init or declared.Init.default(dtype)
                out[arg.name] = init.draw(xp, rng, shape, dtype, problem)
            elif arg.role == "scalar" and arg.value is not None:  # every scalar has one (default: its name)
                out[arg.name] = SCALAR_DTYPES[arg.dtype](arg.value(problem))
        return out

    def outputs(self, problem: Problem, config: Config) -> dict[str, tuple[tuple[int, ...], str]]:
        """The outputs, then the scratch arrays one launch writes for a later one (poisoned too, never checked)."""
        env = {**problem, **config}
        return {
            a.name: (a.shape_of(env), a.dtype_of(problem)) for a in self.arguments if a.role in ("output", "scratch")
        }

    def checked(self) -> tuple[str, ...]:
        """Every output, then every inout argument (compared as the kernel left it)."""
        return tuple(a.name for a in self.arguments if a.role == "output") + self._in_place()

    def _in_place(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.arguments if a.role == "inout")

    def checked_value(self, xp, name: str, array, dtype: str | None):
        return super().checked_value(xp, name, array, self._checked_dtype(name, array, dtype))

    def checked_stored(self, name: str, array, dtype: str | None) -> str | None:
        """Every declared array is compared as stored (bf16 bits as bfloat16)."""
        return "bfloat16" if self._checked_dtype(name, array, dtype) == "bfloat16" else np.dtype(array.dtype).name

    def _checked_dtype(self, name: str, array, dtype: str | None) -> str | None:
        """`dtype`, or for an inout argument (None) its declared dtype, which says how to read it."""
        if dtype is None and name in self._in_place():
            dtype = next(a for a in self.arguments if a.name == name).dtype
            if dtype == PROBLEM_DTYPE:
                dtype = "bfloat16" if array.dtype == np.uint16 else None
        return dtype

    def reference(self, xp, inputs: dict[str, Any], problem: Problem, config: Config | None = None) -> dict:
        if self.reference_fn is None:
            raise ReferenceFailed(f"kernel {self.name!r} declares no reference: results cannot be verified")
        kwargs = {}
        host = np.float32 if self._narrow_outputs(problem) else np.float64
        for arg in self.arguments:
            if arg.role in MADE:
                value = inputs[arg.name]
                if arg.role == "inout":  # the kernel updates it after this: the reference gets its own copy
                    value = value.copy()
                kwargs[arg.name] = self._reference_array(xp, value, arg.dtype_of(problem), host)
            elif arg.role == "scalar":
                kwargs[arg.name] = inputs[arg.name]
        if self.reference_arrays == "xp":
            kwargs["xp"] = xp
        elif self.reference_arrays == "torch" and xp is not np:
            xp.cuda.get_current_stream().synchronize()  # torch reads on its own stream what ours wrote
        result = self.reference_fn(**kwargs)
        if self.reference_arrays == "torch":
            result = (
                {k: _from_torch(xp, v) for k, v in result.items()}
                if isinstance(result, dict)
                else _from_torch(xp, result)
            )
        written = {a.name: a.shape_of(problem) for a in self.arguments if a.name in self.checked()}
        if not isinstance(result, dict):
            if len(written) != 1:
                raise ReferenceFailed(
                    f"reference {self.reference_name} returned {type(result).__name__}; with "
                    f"{len(written)} outputs it must return a dict of {', '.join(written)}"
                )
            result = {next(iter(written)): result}
        expected = {}
        for name, value in result.items():
            if name not in written:
                raise ReferenceFailed(
                    f"reference {self.reference_name} returned {name!r}, which is not an output "
                    f"(outputs: {', '.join(written)})"
                )
            shape = tuple(np.shape(value))
            if shape != written[name]:
                raise ReferenceFailed(
                    f"reference {self.reference_name} returned {name!r} with shape {shape}, "
                    f"but the kernel writes {written[name]}"
                )
            expected[name] = xp.asarray(value)
        return expected

    def reference_imports(self) -> tuple[usercode.UserFunction, ...]:
        """The reference's function, where it is a user's (``FILE.py:function`` or ``module:function``)."""
        fn = self.reference_fn.args[0] if isinstance(self.reference_fn, functools.partial) else self.reference_fn
        return (fn,) if isinstance(fn, usercode.UserFunction) else ()

    def reference_on_host(self) -> bool:
        return self.reference_fn is not None and self.reference_arrays == "numpy"

    def _narrow_outputs(self, problem: Problem) -> bool:
        """Whether every output is 16 bits wide (a NumPy reference then computes in float32)."""
        return all(a.dtype_of(problem) in ("float16", "bfloat16") for a in self.arguments if a.name in self.checked())

    def _reference_array(self, xp, value, dtype: str, host=np.float64):
        """One input as the reference receives it (`reference_arrays`; a NumPy reference's arrays as `host`)."""
        if self.reference_arrays == "torch":
            return _to_torch(xp, value, dtype)
        if dtype == "bfloat16":
            value = bf16.decode(xp, value)
        elif dtype not in declared.FLOATS:  # indices, masks, counts: as they are, never widened to floats
            return value.get() if hasattr(value, "get") and xp is not np and self.reference_arrays == "numpy" else value
        if self.reference_arrays == "xp":
            return value if value.dtype.kind == "f" and value.dtype.itemsize >= 4 else value.astype(xp.float32)
        value = value.get() if hasattr(value, "get") and not isinstance(value, np.ndarray) else value
        return np.asarray(value, dtype=np.float64 if value.dtype == np.float64 else host)

    def tolerance(self, problem: Problem) -> float | dict[str, float]:
        return self.tolerance_value if self.tolerance_value is not None else super().tolerance(problem)

    def bytes_moved(self, problem: Problem) -> int:
        if self.bytes_expr is not None:
            return int(self.bytes_expr(problem))
        return sum(
            math.prod(a.shape_of(problem)) * ARRAY_DTYPES[a.dtype_of(problem)] * (2 if a.role == "inout" else 1)
            for a in self.arguments
            if a.role not in ("scalar", "scratch")
        )

    def flops(self, problem: Problem) -> int:
        return int(self.flops_expr(problem)) if self.flops_expr is not None else 0


# ---------------------------------------------------------------------------------------------------------------
# parsing helpers


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


def _dim3(exprs: tuple[Expr, ...], env: dict[str, Any]) -> tuple[int, int, int]:
    x, y, z = (*(int(e(env)) for e in exprs), 1, 1, 1)[:3]
    return x, y, z


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


def _call_fault(fn, names: list[str]) -> str | None:
    """Why `fn` (a function or its `inspect.Signature`) cannot be called with keyword arguments `names` (its
    signature binds them or not), or None; also None where the signature is unknown (a builtin, a function its
    module's source does not show): the first call will say."""
    if fn is None:
        return None
    try:
        signature = fn if isinstance(fn, inspect.Signature) else inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(**dict.fromkeys(names))
    except TypeError as exc:
        return str(exc)
    return None


def reference_arrays_of(fn) -> str:
    """How `fn` (a function or its `inspect.Signature`) wants its arrays, read from its signature: "xp" when it
    has a parameter named ``xp``, "torch" when a parameter is annotated ``torch.Tensor`` (or ``Tensor``), else
    "numpy"."""
    try:
        parameters = (fn if isinstance(fn, inspect.Signature) else inspect.signature(fn)).parameters
    except (TypeError, ValueError):
        return "numpy"
    if "xp" in parameters:
        return "xp"
    for parameter in parameters.values():
        note = parameter.annotation
        text = (
            note.strip("'\"")  # a string annotation (`from __future__ import annotations` makes every one a string)
            if isinstance(note, str)
            else f"{getattr(note, '__module__', '')}.{getattr(note, '__name__', '')}"
        )
        if text in ("Tensor", "torch.Tensor") or text.endswith("torch.Tensor"):
            return "torch"
    return "numpy"


def _to_torch(xp, value, dtype: str):
    """An input array as a torch tensor of its declared dtype: through DLPack on the GPU, from NumPy on the host;
    bf16 bits reinterpreted as torch.bfloat16."""
    import torch

    bits = dtype in ("bfloat16",)
    if xp is np:
        array = np.ascontiguousarray(value)
        tensor = torch.from_numpy(array.view(np.int16) if bits else array)
    else:
        tensor = torch.from_dlpack(value.view(xp.int16) if bits else value)
    return tensor.view(torch.bfloat16) if bits else tensor


def _from_torch(xp, value):
    """A reference's tensor as an array of `xp` (bf16 widened to float32); anything else as it is."""
    if not type(value).__module__.startswith("torch"):
        return value
    import torch

    value = value.detach()
    if value.dtype == torch.bfloat16:
        value = value.float()
    if xp is np or value.device.type != "cuda":
        return xp.asarray(value.cpu().numpy())
    torch.cuda.current_stream().synchronize()  # torch computed on its stream; ours reads next
    return xp.from_dlpack(value.contiguous())
