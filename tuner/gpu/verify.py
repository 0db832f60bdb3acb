"""Verification inputs: a small pool of input sets per problem, each with its reference computed once.

A reference is the same for every config of a problem, and at LLM sizes computing it is the costly part of a
check (a NumPy reference over a GB of inputs takes seconds on one core; the kernel, milliseconds). So the GPU
evaluator keeps, per (family, problem, the part of the config its reference reads — `Family.reference_key`),
`size` input sets (two by default) and checks the configs against them in turn:

* an input set is its *seed*: the inputs are drawn again from it on the GPU for every check (our counter-based
  generator, well under a millisecond per GB), so a kernel that writes its inputs — in place by design, or out of
  bounds by mistake — never leaves a later config a changed input;
* its reference is computed once, the first time the set is drawn, compacted (float64 → float32 where the
  checked output holds 32 bits or fewer, which changes the bound by < 1e-7 of a value) and kept: on the GPU while
  the pool's device budget allows, in pinned host memory otherwise (uploaded for each check), with a host copy
  kept while the host budget allows;
* a mismatch against a kept reference is not blamed on the config before the reference is restored from its host
  copy (a kernel of an earlier config may have written over it) and, while no config has yet matched the set,
  recomputed from the inputs (a family whose inputs do not come from the seeded generator alone cannot be
  pooled: that key falls back to fresh inputs and a reference per check, and says so);
* where neither budget holds a reference, the key uses the fresh protocol (a new input set and reference per
  check) and says so.

An explicit seed (the study's finalists) is a fresh set that no screened config has seen: its reference is
computed for it and kept beside the pool's sets while that seed is in use (`InputPool.fresh`), so the finalists,
which share one seed, share one reference.

A reference computed on the host (a NumPy reference: `Family.reference_on_host`) takes seconds at LLM sizes, once
per set. Only the first set's is waited for: the others' (the pool's second set, and the set of a seed the
evaluator was told a later check will ask for, `InputPool.reserve`) are computed *ahead*, in background threads
started beside the first one, from a host copy of their inputs, while the GPU checks configs against the first.
Such a set is `pending` until its reference is ready and is not drawn before (`draw` takes the ready sets in
turn); the threads run only host code, so no GPU work of theirs overlaps a timed launch.

This module holds the bookkeeping and the reference's normalization (shape and dtype checks, torch tensors and
NumPy arrays turned into CuPy arrays); `tuner.gpu.evaluator` draws and checks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.gpu.protocol import fresh_seed
from tuner.kernels.base import Family, ReferenceFailed

__all__ = [
    "POOL_SIZE",
    "InputPool",
    "InputSet",
    "host_reference",
    "normalize_reference",
    "pool_key",
    "reference_dtype",
]

#: Input sets kept per key: two, so that a config that happens to match one set's quirks still meets another.
POOL_SIZE = 2
#: The share of the GPU's memory the kept references may take (the rest is the kernels' and their inputs').
DEVICE_SHARE = 0.25
#: The share of the host's memory the host copies may take.
HOST_SHARE = 0.25


def pool_key(family: Family, problem: dict[str, Any], config: dict[str, Any]) -> tuple:
    """What identifies an input set's reference: the family, the problem (sizes and dtype) and the part of the
    config the family's reference reads (`Family.reference_key`, empty for most)."""
    return (
        family.ref or family.name,
        tuple(sorted((k, repr(v)) for k, v in problem.items())),
        tuple(family.reference_key(config)),
    )


@dataclass
class InputSet:
    """One pooled input set: its seed and, once computed, its reference (on the device, in pinned host memory,
        or both). `confirmed`: a config has matched its kept reference on inputs drawn again (so they come back from
    the seed)."""

    seed: int
    device: dict[str, Any] | None = None
    host: dict[str, np.ndarray] | None = None
    confirmed: bool = False
    uses: int = 0
    #: the reference being computed ahead (a `concurrent.futures.Future` of the raw answer) and what turns that
    #: answer into the kept reference (`InputPool.settle`); None for a set whose reference is computed when drawn
    pending: Any = None
    finish: Any = None

    @property
    def ready(self) -> bool:
        return self.device is not None or self.host is not None

    def reference(self) -> dict[str, Any]:
        """The kept reference as CuPy arrays (uploaded from pinned host memory when it lives only there)."""
        import cupy

        if self.device is not None:
            return self.device
        assert self.host is not None
        return {name: cupy.asarray(array) for name, array in self.host.items()}

    def restore(self) -> dict[str, Any] | None:
        """The reference uploaded afresh from its host copy (replacing the device copy), or None without one."""
        import cupy

        if self.host is None:
            return None
        if self.device is not None:
            for name, array in self.host.items():
                self.device[name].set(array)
            return self.device
        return {name: cupy.asarray(array) for name, array in self.host.items()}


@dataclass
class InputPool:
    """The pool of one GPU evaluator; see the module docstring. `device_budget` and `host_budget` are bytes."""

    size: int = POOL_SIZE
    device_budget: int = 0
    host_budget: int = 0
    sets: dict[tuple, list[InputSet]] = field(default_factory=dict)
    #: keys that use the fresh protocol, with the reason
    fresh_keys: dict[tuple, str] = field(default_factory=dict)
    #: per key, the set of the last explicit seed (`fresh`)
    explicit: dict[tuple, InputSet] = field(default_factory=dict)
    #: the explicit seed a later check will ask for (`reserve`): its set is computed ahead, beside the pool's
    reserved: int | None = None
    device_used: int = 0
    host_used: int = 0
    _turn: dict[tuple, int] = field(default_factory=dict)

    @classmethod
    def for_device(cls, total_device_bytes: int, size: int = POOL_SIZE) -> InputPool:
        try:
            host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            host = 0
        return cls(size=size, device_budget=int(DEVICE_SHARE * total_device_bytes), host_budget=int(HOST_SHARE * host))

    def draw(self, key: tuple) -> InputSet | None:
        """The input set the next check of `key` uses (in turn), or None where `key` uses the fresh protocol."""
        if key in self.fresh_keys or self.size < 1:
            return None
        sets = self.sets.setdefault(key, [])
        turn = self._turn.get(key, 0)
        self._turn[key] = turn + 1
        drawable = [kept for kept in sets if kept.pending is None]
        if len(sets) < self.size or not drawable:
            sets.append(InputSet(seed=fresh_seed()))
            chosen = sets[-1]
        else:
            chosen = drawable[turn % len(drawable)]
        chosen.uses += 1
        return chosen

    def reserve(self, seed: int) -> None:
        """A later check will ask for the explicit `seed` (the study's finalists): compute its set ahead. One seed
        at a time, as `explicit` keeps one set per key."""
        self.reserved = seed

    def ahead(self, key: tuple) -> list[InputSet]:
        """The sets of `key` to compute ahead, asked for as its first set is drawn: the pool's missing sets and
        the reserved seed's set (the caller marks each pending)."""
        if key in self.fresh_keys:
            return []
        sets = self.sets.setdefault(key, [])
        out = [InputSet(seed=fresh_seed()) for _ in range(self.size - len(sets))]
        sets.extend(out)
        kept = self.explicit.get(key)
        if self.reserved is not None and (kept is None or kept.seed != self.reserved):
            if kept is not None:
                self._release(kept)
            self.explicit[key] = InputSet(seed=self.reserved)
            out.append(self.explicit[key])
        return out

    def pending(self) -> list[tuple[tuple, InputSet]]:
        """Every (key, set) whose reference is being computed ahead."""
        out = [(key, kept) for key, sets in self.sets.items() for kept in sets if kept.pending is not None]
        return out + [(key, kept) for key, kept in self.explicit.items() if kept.pending is not None]

    def settle(self, key: tuple, chosen: InputSet) -> None:
        """Take `chosen`'s reference computed ahead (waiting for it, if it is not ready) and keep it. One that
        failed there drops the set: the next draw computes a set in the foreground, where a failure is reported."""
        future, finish = chosen.pending, chosen.finish
        chosen.pending = chosen.finish = None
        try:
            expected = future.result()
            reference = finish(expected)
        except Exception:
            sets = self.sets.get(key, [])
            if chosen in sets:
                sets.remove(chosen)
            return
        self.keep(key, chosen, reference, host=expected if isinstance(expected, dict) else None)

    def fresh(self, key: tuple, seed: int) -> InputSet:
        """The set of an explicit `seed` (a fresh set no screened config has seen): kept beside the pool's own, one
        per key, so that the configs checked on the same seed (a study's finalists) share its reference."""
        kept = self.explicit.get(key)
        if kept is None or kept.seed != seed:
            if kept is not None:
                self._release(kept)
            kept = self.explicit[key] = InputSet(seed=seed)
        kept.uses += 1
        return kept

    def keep(self, key: tuple, chosen: InputSet, reference: dict[str, Any], host: dict[str, Any] | None = None) -> None:
        """Keep `reference` (CuPy arrays, already normalized) as `chosen`'s, where the budgets allow; a key
        whose reference fits neither budget falls back to the fresh protocol (an explicit seed's set is then
        simply not kept). `host`: the same values on the host where the caller has them (a reference computed
        there), taken as the host copy instead of copying the device's back."""
        import cupy

        nbytes = sum(int(a.nbytes) for a in reference.values())
        on_device = self.device_used + nbytes <= self.device_budget
        on_host = self.host_used + nbytes <= self.host_budget
        if not on_device and not on_host:
            if self.explicit.get(key) is not chosen:
                self.forget(key, f"its reference ({nbytes / 1e9:.2f} GB) fits neither the device nor the host budget")
            return
        try:
            if on_host:
                # Pinned where the host copy is what every check uploads; pageable where it only restores.
                chosen.host = {name: _host_copy(host, name, array, on_device) for name, array in reference.items()}
                self.host_used += nbytes
            if on_device:
                chosen.device = reference
                self.device_used += nbytes
        except (cupy.cuda.memory.OutOfMemoryError, MemoryError) as exc:
            self.forget(key, f"keeping its reference ran out of memory ({type(exc).__name__})")

    def forget(self, key: tuple, why: str) -> None:
        """Drop `key`'s sets and check it with fresh inputs from now on, for the reason `why`."""
        for kept in self.sets.pop(key, []):
            self._release(kept)
        self.fresh_keys[key] = why

    def _release(self, kept: InputSet) -> None:
        if kept.device is not None:
            self.device_used -= sum(int(a.nbytes) for a in kept.device.values())
        if kept.host is not None:
            self.host_used -= sum(int(a.nbytes) for a in kept.host.values())
        kept.device = kept.host = None

    def protocol(self, key: tuple) -> str:
        """How `key` is verified, as recorded with a measurement."""
        if key in self.fresh_keys:
            return f"fresh inputs per check ({self.fresh_keys[key]})"
        return f"pool of {self.size} input sets, references kept"


def _host_copy(host: dict[str, Any] | None, name: str, array, on_device: bool) -> np.ndarray:
    """The host copy of the kept device `array`: pinned where the host copy is what every check uploads (kept
    on the host only); else `host[name]` where the caller computed it there (C-contiguous, same shape and dtype);
    else copied back from the device."""
    if not on_device:
        return array.get(out=_pinned_like(array))
    value = None if host is None else host.get(name)
    if (
        isinstance(value, np.ndarray)
        and value.flags.c_contiguous
        and value.shape == tuple(array.shape)
        and value.dtype == array.dtype
    ):
        return value
    return array.get()


def _pinned_like(array) -> np.ndarray:
    """A NumPy array in pinned host memory shaped like the CuPy `array` (fast uploads)."""
    import cupyx

    return cupyx.empty_pinned(array.shape, dtype=array.dtype)


# ---------------------------------------------------------------------------------------------------------------
# the reference's answer, made checkable


def normalize_reference(
    expected: Any,
    family: Family,
    problem: dict[str, Any],
    config: dict[str, Any],
    checked_dtypes: dict[str, str],
    what: str = "reference",
) -> dict[str, Any]:
    """`expected` (what `family.reference` returned: NumPy or CuPy arrays, torch tensors, numbers) as a dict of
    C-contiguous CuPy arrays, one per checked name, each of the shape the kernel writes and float32 or float64 (the
    reference dtypes of the one-pass check, `tuner.gpu.kernelsource`). Compacted: a float64 reference of an output
    that holds 32 bits or fewer becomes float32 (half the memory and traffic of a kept reference, an error below
    1e-7 of a value). Widened once, here: float16 to float32 (exactly), integers and bool to float64 (as the
    comparison reads them). `checked_dtypes` maps each checked name to the dtype of what the check compares (an
    output's declared dtype, an in-place input's array dtype). A missing name, a wrong shape, a non-numeric or
    complex dtype: ReferenceFailed naming `what`."""
    import cupy

    if not isinstance(expected, dict):
        raise ReferenceFailed(f"{what} returned {type(expected).__name__}, not a dict of outputs")
    names = family.checked() or tuple(expected)
    outputs = family.outputs(problem, config)
    out: dict[str, Any] = {}
    for name in names:
        if name not in expected:
            raise ReferenceFailed(f"{what} returned no {name!r} (returned: {', '.join(map(str, expected)) or 'none'})")
        array = _to_cupy(expected[name], what, name)
        if array.dtype.kind not in "fiub":
            raise ReferenceFailed(f"{what} returned {name!r} as {array.dtype}: expected real numbers")
        want = tuple(outputs[name][0]) if name in outputs else None
        if want is not None and tuple(array.shape) != want:
            raise ReferenceFailed(f"{what} returned {name!r} with shape {tuple(array.shape)}, the kernel writes {want}")
        kept = reference_dtype(array.dtype, checked_dtypes.get(name))
        out[name] = cupy.ascontiguousarray(array if array.dtype == kept else array.astype(kept))
    return out


def reference_dtype(dtype, checked: str | None) -> np.dtype:
    """The dtype `normalize_reference` keeps a reference of `dtype` in (a real NumPy/CuPy dtype), where what the
    check compares is of dtype `checked` (None: not known): float32 or float64, the reference dtypes of the
    one-pass check."""
    dtype = np.dtype(dtype)
    if dtype == np.float64 and checked not in ("float64", None):
        return np.dtype(np.float32)  # compacted
    if dtype.kind != "f":
        return np.dtype(np.float64)  # integers and bool, as the comparison reads them
    if dtype.itemsize < 4:
        return np.dtype(np.float32)  # float16, exactly: widened once here rather than in every check
    return dtype


def host_reference(
    family: Family, inputs: dict[str, Any], problem: dict[str, Any], config: dict[str, Any], checked_dtypes
) -> Any:
    """`family`'s reference run on the host (NumPy) over `inputs` (NumPy arrays: a host copy of an input set), as
    a set computed ahead runs it, in a thread of host code only. Compacted as `normalize_reference` would, here in
    the thread (float64 → float32 where the checked output holds 32 bits or fewer), so that only half the bytes
    cross to the GPU afterwards. Returns what the reference returned, else as is (checked when it is kept)."""
    expected = family.reference(np, inputs, problem, config=config)
    if isinstance(expected, dict):
        expected = {
            name: value.astype(np.float32)
            if isinstance(value, np.ndarray)
            and value.dtype == np.float64
            and checked_dtypes.get(name) not in ("float64", None)
            else value
            for name, value in expected.items()
        }
    return expected


def _to_cupy(value: Any, what: str, name: str):
    """A CuPy array of `value`: CuPy as is, torch through DLPack (bf16 as float32: CuPy has no bfloat16),
    anything NumPy reads through the host."""
    import cupy

    if isinstance(value, cupy.ndarray):
        return value
    module = type(value).__module__
    if module.startswith("torch"):
        import torch

        if value.dtype == torch.bfloat16:
            value = value.float()
        if value.device.type == "cuda":
            torch.cuda.current_stream().synchronize()  # torch computed on its stream; CuPy reads on ours
            return cupy.from_dlpack(value.detach().contiguous())
        return cupy.asarray(value.detach().numpy())
    try:
        return cupy.asarray(np.asarray(value))
    except (TypeError, ValueError) as exc:
        raise ReferenceFailed(f"{what} returned {name!r} as {type(value).__name__}: {exc}") from None
