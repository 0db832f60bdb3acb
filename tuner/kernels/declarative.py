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

This module holds the family itself, `DeclarativeFamily`: the `Family` contract (launches, inputs, outputs, the
reference's call, bytes, FLOPs, tolerance) answered from the block. Reading and checking the block is
`tuner.kernels.kernelblock`; how the reference receives its arrays and returns its results, `tuner.kernels.refarrays`.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np

from tuner.expr import Expr
from tuner.kernels import declared, kernelblock, ktgeometry, plain, refarrays, usercode
from tuner.kernels.base import Config, Family, Launch, Problem, ReferenceFailed
from tuner.kernels.kernelblock import ARRAY_DTYPES, MADE, PROBLEM_DTYPE, SCALAR_DTYPES, Argument, LaunchSpec


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
        """Check and build the block (`tuner.kernels.kernelblock.read`); `fail(message, *keys)` makes the
        SpaceError naming the space file:line."""
        family = cls(**kernelblock.read(block, directory, fail))
        family.template_dir = str(directory)
        return family

    def validate_space(self, space, fail) -> None:
        """Check every expression reads only names the space defines, that shapes and the default config's
        launch evaluate to positive integers on every problem, and that the reference (if any) can be called
        with the arguments `reference` passes it (by its signature: it is not run)."""
        kernelblock.validate(space, fail, self.arguments, self.launch_specs, self.bytes_expr, self.flops_expr)
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
        signature = fn.signature if isinstance(fn, usercode.UserFunction) else fn  # the function inside guarded
        fault = refarrays.call_fault(signature, names)
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
                kwargs[arg.name] = refarrays.reference_array(
                    self.reference_arrays, xp, value, arg.dtype_of(problem), host
                )
            elif arg.role == "scalar":
                kwargs[arg.name] = inputs[arg.name]
        if self.reference_arrays == "xp":
            kwargs["xp"] = xp
        elif self.reference_arrays == "torch" and xp is not np:
            xp.cuda.get_current_stream().synchronize()  # torch reads on its own stream what ours wrote
        result = self.reference_fn(**kwargs)
        if self.reference_arrays == "torch":
            result = (
                {k: refarrays.from_torch(xp, v) for k, v in result.items()}
                if isinstance(result, dict)
                else refarrays.from_torch(xp, result)
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


def _dim3(exprs: tuple[Expr, ...], env: dict[str, Any]) -> tuple[int, int, int]:
    x, y, z = (*(int(e(env)) for e in exprs), 1, 1, 1)[:3]
    return x, y, z
