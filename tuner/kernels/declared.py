"""The arrays a ``kernel:`` block declares: their dtypes, and how each input is made.

Dtypes. An array's dtype is a name (float32, float16, bfloat16, float64, int8, int16, int32, int64, uint8, uint16,
uint32, uint64, bool) or the CUDA type the kernel takes (``__nv_bfloat16``, ``__half``, ``float``, ``int``,
``int64_t``, ``uint8_t``, ``unsigned int``, ``std::uint32_t``, ...; `CUDA_TYPES`). bfloat16 travels as uint16 bits
(`tuner.kernels.bf16`); bool as one byte.

Inputs. ``init:`` says how an input (or an in-place argument) is made, from the problem's sizes; every number is
an expression of them (`tuner.expr`)::

    init: normal                              # the default for floats: mean 0, scale 1
    init: {kind: normal, mean: 1, scale: 0.1}
    init: {kind: uniform, low: -1, high: 1}   # floats in [low, high)
    init: {kind: integers, low: 0, high: vocab}   # integers in [low, high): the default for ints is [0, 100)
    init: {kind: permutation, size: tokens}   # distinct values of a permutation of range(size) (default: the
                                              #   array's element count), as many as the array holds
    init: {kind: arange, start: 0, step: 1}   # start, start + step, ... over the array's elements (row-major)
    init: zeros | ones | {kind: constant, value: 3}
    init: gen.py:make_slots                   # anything else: fn(xp, rng, shape, dtype, problem) -> array

Random kinds draw from `rng`: the GPU worker's seeded generator (`tuner.gpu.devicekernels.DeviceRng`), so the same
seed gives the same arrays and the verification pool can draw an input set again; a user's function must draw from
`rng` alone for the same reason. Every draw runs on `xp` (CuPy's current stream on the GPU). A user's function is
found in its file's source when the space loads and imported only where it first runs (`usercode.UserFunction`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tuner.expr import Expr, ExprError
from tuner.kernels import bf16, usercode

#: Bytes per element of every array dtype a kernel may take.
ARRAY_DTYPES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "bool": 1,
}
FLOATS = ("float32", "float16", "bfloat16", "float64")
#: The CUDA types a kernel's pointer arguments name, as the array dtypes that launch them (64-bit Linux sizes).
CUDA_TYPES = {
    "__nv_bfloat16": "bfloat16",
    "__half": "float16",
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "int8_t": "int8",
    "signed char": "int8",
    "char": "int8",
    "int16_t": "int16",
    "short": "int16",
    "int32_t": "int32",
    "int": "int32",
    "int64_t": "int64",
    "long long": "int64",
    "long": "int64",
    "uint8_t": "uint8",
    "unsigned char": "uint8",
    "uint16_t": "uint16",
    "unsigned short": "uint16",
    "uint32_t": "uint32",
    "unsigned int": "uint32",
    "unsigned": "uint32",
    "uint64_t": "uint64",
    "unsigned long long": "uint64",
    "unsigned long": "uint64",
    "size_t": "uint64",
    "bool": "bool",
}


def array_dtype(spelled: Any) -> str | None:
    """The array dtype `spelled` names (a dtype name or a CUDA type, ``std::`` and ``cuda::std::`` allowed), or
    None."""
    if not isinstance(spelled, str):
        return None
    text = " ".join(spelled.split())
    for prefix in ("cuda::std::", "::std::", "std::", "::"):
        text = text.removeprefix(prefix)
    return text if text in ARRAY_DTYPES else CUDA_TYPES.get(text)


def storage(dtype: str) -> np.dtype:
    """The NumPy/CuPy dtype that stores `dtype` (bfloat16 as uint16 bits)."""
    return np.dtype(bf16.STORAGE if dtype == "bfloat16" else dtype)


def limits(dtype: str) -> tuple[int, int] | None:
    """The smallest and largest value of an integer or bool `dtype`; None for floats."""
    if dtype == "bool":
        return 0, 1
    if dtype in FLOATS:
        return None
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


# ---------------------------------------------------------------------------------------------------------------
# how an input is made

#: Each kind's fields and their defaults (None: required).
KINDS: dict[str, dict[str, Any]] = {
    "normal": {"mean": 0, "scale": 1},
    "uniform": {"low": 0, "high": 1},
    "integers": {"low": 0, "high": None},
    "permutation": {"size": None},
    "arange": {"start": 0, "step": 1},
    "zeros": {},
    "ones": {},
    "constant": {"value": None},
}
#: The default ``high`` of integers for an integer array with no ``init:`` (fits every integer dtype).
DEFAULT_INT_HIGH = 100


@dataclass(frozen=True)
class Init:
    """How one array is made: a kind of `KINDS` with its fields (expressions of problem sizes), or a user's
    function (`function`). ``size`` of a permutation may be None: the array's element count."""

    kind: str
    fields: dict[str, Expr] = field(default_factory=dict)
    function: usercode.UserFunction | None = None

    @staticmethod
    def default(dtype: str) -> Init:
        """Standard normal for floats, integers in [0, 100) for ints, both values for bool."""
        if dtype in FLOATS:
            return Init("normal", {"mean": Expr.parse(0), "scale": Expr.parse(1)})
        high = 2 if dtype == "bool" else DEFAULT_INT_HIGH
        return Init("integers", {"low": Expr.parse(0), "high": Expr.parse(high)})

    @classmethod
    def parse(cls, spec: Any, dtype: str | None, directory: Path, fail, keys: tuple) -> Init:
        """The ``init:`` of one argument (`dtype` None: the problem's, a float). `fail(message, *keys)` makes the
        error naming the space file and line."""
        if isinstance(spec, str) and ":" in spec:
            function = usercode.find(spec, directory, fail, "kernel: init", *keys, "init")
            return cls("function", function=function)
        if isinstance(spec, str):
            spec = {"kind": spec}
        if not isinstance(spec, dict) or "kind" not in spec:
            raise fail(
                "kernel: init: expected a kind (normal, uniform, integers, ...), {kind: ..., fields}, or "
                "FILE.py:function",
                *keys,
                "init",
            )
        kind = spec["kind"]
        if kind not in KINDS:
            raise fail(
                f"kernel: init: unknown kind {kind!r} (known: {', '.join(KINDS)}, or FILE.py:function)",
                *keys,
                "init",
            )
        known = KINDS[kind]
        fields: dict[str, Expr] = {}
        for name, value in spec.items():
            if name == "kind":
                continue
            if name not in known:
                allowed = ", ".join(known) or "none"
                raise fail(f"kernel: init {kind}: unknown field {name!r} (allowed: {allowed})", *keys, "init", name)
            try:
                fields[name] = Expr.parse(int(value) if isinstance(value, bool) else value)
            except ExprError as exc:
                raise fail(f"kernel: init {kind}: {name}: {exc}", *keys, "init", name) from None
        for name, default in known.items():
            if name not in fields and default is not None:
                fields[name] = Expr.parse(default)
            elif name not in fields and not (kind == "permutation" and name == "size"):
                raise fail(f"kernel: init {kind}: missing field {name!r}", *keys, "init")
        if kind in ("normal", "uniform") and dtype is not None and dtype not in FLOATS:
            raise fail(
                f"kernel: init {kind} draws floats, but the array is {dtype}: use integers, permutation, arange "
                "or constant",
                *keys,
                "init",
            )
        return cls(kind, fields)

    def names(self) -> set[str]:
        """The symbols its expressions read."""
        return set().union(*(e.names for e in self.fields.values())) if self.fields else set()

    def fault(self, problem: dict[str, Any], dtype: str, count: int) -> str | None:
        """Why this init cannot fill `count` elements of `dtype` on `problem` (an empty range, a value out of
        the dtype), or None."""
        try:
            values = {name: expr(problem) for name, expr in self.fields.items()}
        except (ArithmeticError, TypeError, ValueError) as exc:
            return f"fails: {type(exc).__name__}: {exc}"
        for name, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                return f"{name} = {value!r} is not a finite number"
        bounds = limits(dtype)

        def outside(*numbers) -> str | None:
            if bounds is None:
                return None
            bad = [n for n in numbers if not (bounds[0] <= n <= bounds[1]) or n != int(n)]
            return None if not bad else f"gives {bad[0]!r}, outside {dtype} ({bounds[0]}..{bounds[1]})"

        if self.kind == "normal" and values["scale"] < 0:
            return f"scale {values['scale']!r} is negative"
        if self.kind in ("uniform", "integers") and not values["low"] < values["high"]:
            return f"the range [{values['low']!r}, {values['high']!r}) is empty"
        if self.kind == "integers":
            if any(v != int(v) for v in (values["low"], values["high"])):
                return f"low and high must be integers, got {values['low']!r} and {values['high']!r}"
            if not (-(2**63) <= values["low"] and values["high"] <= 2**63):
                return "the range must lie within int64"
            return outside(values["low"], values["high"] - 1)
        if self.kind == "permutation":
            size = values.get("size", count)
            if size != int(size) or size < count:
                return f"a permutation of {size!r} values cannot fill {count} elements"
            return outside(0, size - 1) if size else None
        if self.kind == "arange":
            return outside(values["start"], values["start"] + (count - 1) * values["step"]) if count else None
        if self.kind == "constant":
            return outside(values["value"])
        if self.kind in ("zeros", "ones"):
            return outside(0 if self.kind == "zeros" else 1)
        return None

    def draw(self, xp, rng, shape: tuple[int, ...], dtype: str, problem: dict[str, Any]):
        """A fresh array of `shape` and `dtype` (bf16 as bits) on `xp`, random kinds drawn from `rng`."""
        count = math.prod(shape)
        if self.function is not None:
            return _stored(xp, _user_array(self.function, xp, rng, shape, dtype, problem), dtype)
        values = {name: expr(problem) for name, expr in self.fields.items()}
        wide = xp.float64 if dtype == "float64" else xp.float32
        if self.kind == "normal":
            mean, scale = values["mean"], values["scale"]
            if dtype == "bfloat16" and mean == 0:
                return bf16.random(xp, rng, shape, float(scale))  # one kernel on the GPU
            x = rng.standard_normal(shape, dtype=xp.float32)
            if scale != 1:
                x *= xp.float32(scale)
            if mean != 0:
                x += xp.float32(mean)
            return _stored(xp, x, dtype)
        if self.kind == "uniform":
            low, high = values["low"], values["high"]
            return _stored(xp, rng.random(shape, dtype=wide) * wide(high - low) + wide(low), dtype)
        if self.kind == "integers":
            return _stored(xp, rng.integers(int(values["low"]), int(values["high"]), shape, dtype=xp.int64), dtype)
        if self.kind == "permutation":
            size = int(values.get("size", count))
            order = xp.argsort(rng.random(size, dtype=xp.float64), kind="stable")  # stable: ties resolve alike
            return _stored(xp, order[:count].reshape(shape), dtype)
        if self.kind == "arange":
            start, step = values["start"], values["step"]
            integral = all(isinstance(v, int) for v in (start, step)) and dtype not in FLOATS
            base = xp.arange(count, dtype=xp.int64 if integral else xp.float64)
            return _stored(xp, (base * step + start).reshape(shape), dtype)
        value = {"zeros": 0, "ones": 1}.get(self.kind, values.get("value"))
        integral = isinstance(value, int) and dtype not in FLOATS
        return _stored(xp, xp.full(shape, value, dtype=xp.int64 if integral else xp.float64), dtype)


def _user_array(function: usercode.UserFunction, xp, rng, shape, dtype: str, problem: dict[str, Any]):
    """What a user's init returns, checked for its shape; their faults are ReferenceFailed naming their file."""
    from tuner.kernels.base import ReferenceFailed

    value = usercode.guarded(function, f"init {function.spec}", function.directory, xp, rng, shape, dtype, problem)
    got = tuple(getattr(value, "shape", ()))
    if got != tuple(shape):
        raise ReferenceFailed(f"init {function.spec} returned shape {got}, the argument has {tuple(shape)}")
    return xp.asarray(value)


def _stored(xp, values, dtype: str):
    """`values` as the array the kernel takes: bf16 encoded to bits, any other dtype cast (bool: nonzero)."""
    if dtype == "bfloat16":
        if values.dtype == xp.uint16:
            return values  # bits already
        return bf16.encode(xp, values.astype(xp.float32, copy=False))
    if dtype == "bool":
        return values != 0
    return xp.ascontiguousarray(values.astype(storage(dtype), copy=False))
