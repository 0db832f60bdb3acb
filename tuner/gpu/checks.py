"""Comparing a config's outputs with their reference, on the device that holds them.

Element-wise ``|out - ref| / max(|ref|, 1) <= tolerance``; any NaN in the output fails (outputs are poisoned with
NaN before each checked launch, so an element the kernel did not write is caught). `Verification` is the check of
a config as a whole, an object the GPU evaluator owns beside its `tuner.gpu.device.Device`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.core.cudalib import runtime as _runtime
from tuner.core.result import WrongResult
from tuner.gpu import verify
from tuner.gpu.device import Device
from tuner.gpu.protocol import EvaluateRequest, fresh_seed
from tuner.kernels import bf16
from tuner.kernels.base import Family, ReferenceFailed


@dataclass(frozen=True)
class OutputCheck:
    """One output compared with its reference. Errors: abs = |out - ref|, rel = |out - ref| / max(|ref|, 1),
    the figure the tolerance bounds; NaN elements count as mismatches and are left out of the maxima."""

    name: str
    elements: int
    mismatches: int
    nan_count: int
    max_abs_error: float
    max_rel_error: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.mismatches == 0

    def describe(self) -> str:
        text = (
            f"{self.name}: {self.mismatches} of {self.elements} elements off (max abs error "
            f"{self.max_abs_error:.3g}, max rel error {self.max_rel_error:.3g}, "
            f"tolerance {self.tolerance:g}"
        )
        return text + (f", {self.nan_count} NaN)" if self.nan_count else ")")


def check_output(xp, name: str, out, ref, tolerance: float) -> OutputCheck:
    """Compare `out` with `ref` on `xp` (numpy or cupy: the data never leaves the device)."""
    o = out.astype(xp.float64)
    r = xp.asarray(ref).astype(xp.float64)
    if o.shape != r.shape:
        raise ValueError(f"output {name!r} has shape {o.shape} but its reference has {r.shape}")
    if o.size == 0:
        return OutputCheck(name, 0, 0, 0, 0.0, 0.0, tolerance)
    diff = xp.abs(o - r)
    rel = diff / xp.maximum(xp.abs(r), 1.0)
    finite = ~xp.isnan(rel)
    mismatches = int((~(rel <= tolerance)).sum())  # NaN compares False: a NaN is a mismatch
    nan_count = int(xp.isnan(o).sum())
    max_abs = float(xp.where(finite, diff, 0.0).max())
    max_rel = float(xp.where(finite, rel, 0.0).max())
    return OutputCheck(name, int(o.size), mismatches, nan_count, max_abs, max_rel, tolerance)


def rounded(phases: dict[str, float]) -> dict[str, float]:
    return {name: round(seconds, 6) for name, seconds in phases.items()}


def np_dtype(name: str):
    """The array dtype that stores `name`: bfloat16 travels as uint16 bits (tuner.kernels.bf16)."""
    if name == "bfloat16":
        return np.dtype(bf16.STORAGE)
    return np.dtype(name)


@dataclass(frozen=True)
class Checked:
    """A config whose outputs matched their reference: its run (for the timing) and the checks."""

    run: Callable[[], None]
    checks: list[OutputCheck]
    verification: str  # how the check was made, as the Measurement records it


def _wrong_result(bad: list[OutputCheck], seed: int, verification: str, phases: dict[str, float]) -> WrongResult:
    """The WrongResult of the checks that failed, with the figures of the first."""
    worst = bad[0]
    return WrongResult(
        reason="; ".join(check.describe() for check in bad),
        details={
            "output": worst.name,
            "max_abs_error": worst.max_abs_error,
            "max_rel_error": worst.max_rel_error,
            "mismatches": worst.mismatches,
            "elements": worst.elements,
            "nan_count": worst.nan_count,
            "tolerance": worst.tolerance,
            "seed": seed,
            "verification": verification,
            "phases_s": rounded(phases),
        },
    )


#: Threads that compute host references ahead (`tuner.gpu.verify`): the pool's second set and the finalists' at once.
AHEAD_THREADS = 2


class Verification:
    """The correctness check of a config on one GPU, an object `tuner.gpu.evaluator.GpuEvaluator` holds: inputs
    drawn from the problem's pool, references computed once per input set (ahead, in threads, where they run on
    the host), launches on poisoned outputs, comparisons on the device, and the finalists' re-check on a fresh
    input set.

    Takes the `Device` it checks on (its stream and our device kernels), the input sets to keep per problem
    (`tuner.gpu.verify`; 0: fresh inputs for every check) and `sync`, the evaluator's wait for the GPU (bounded by
    its hang deadline). Owns the pool of input sets (made by `start`, after the device's), the seed reserved for a
    later check, and the threads that compute references ahead. `check` gives a `Checked` or a `WrongResult`."""

    def __init__(self, device: Device, input_sets: int, sync: Callable[[], None]):
        self.device = device
        self.input_sets = input_sets
        self._sync = sync
        self._pool: verify.InputPool | None = None  # made by `start`, once the device is
        self._reserved: int | None = None  # the seed a later check asks for (`reserve`)
        self._ahead: ThreadPoolExecutor | None = None  # computes host references ahead (`tuner.gpu.verify`)

    def start(self) -> None:
        """Make the pool of input sets for the device's memory (once; the device started first)."""
        if self._pool is None:
            self._pool = verify.InputPool.for_device(_runtime.memGetInfo()[1], self.input_sets)
            if self._reserved is not None:
                self._pool.reserve(self._reserved)

    def reserve(self, seed: int) -> None:
        """A later check with `seed` will come (the study's finalists): see `GpuEvaluator.reserve`."""
        self._reserved = seed
        if self._pool is not None:
            self._pool.reserve(seed)

    def close(self) -> None:
        """Drop the references still being computed ahead."""
        if self._ahead is not None:
            self._ahead.shutdown(wait=False, cancel_futures=True)

    @property
    def pool(self) -> verify.InputPool:
        """The pool of input sets (`start` made it)."""
        if self._pool is None:
            raise RuntimeError("Verification.start makes the pool before any check")
        return self._pool

    def check(
        self,
        request: EvaluateRequest,
        family: Family,
        problem: dict[str, Any],
        runner: Callable[[dict[str, Any]], Callable[[], None]],
        phase: list[str],
        phases: dict[str, float],
    ) -> Checked | WrongResult:
        """Run every launch of the config once on the inputs of an input set (the pool's, or a fresh one for the
        request's seed), its outputs poisoned, and compare them with the set's reference (a mismatch against a
        kept reference is checked again before the config is blamed). `runner(arrays)` gives the config's run on
        those arrays (inputs and outputs by name). The check passed, with the config's run for the timing; or the
        WrongResult of a mismatch or of a reference that failed. `phase[0]` names the stage under way."""
        import cupy

        config = request.config
        outputs_spec = family.outputs(problem, config)
        key = verify.pool_key(family, problem, config)
        explicit = request.seed is not None  # an explicit seed: a fresh set, beside the pool's (the finalists')
        pooled, seed = self._input_set(key, request.seed, phases)
        inputs = self._inputs(family, problem, seed, phases)
        # A checked name that is not an output is an input the kernel updates in place.
        checked_dtypes = {name: dtype for name, (_, dtype) in outputs_spec.items()}
        checked_dtypes.update(
            (name, np.dtype(inputs[name].dtype).name)
            for name in family.checked()
            if name not in outputs_spec and name in inputs
        )
        kept = pooled is not None and pooled.ready
        if not kept and not explicit and pooled is not None and family.reference_on_host():
            # The key's first set: the other sets' references (the pool's second, the finalists') start on
            # the host in the background now, so that all of them are ready about when this one is.
            for later in self.pool.ahead(key):
                self._compute_ahead(family, problem, config, checked_dtypes, later, phases)
        try:
            reference = self._reference(family, inputs, problem, config, checked_dtypes, pooled, key, phases)
        except ReferenceFailed as exc:  # the user's reference: the same for every config, so the study stops
            return WrongResult(
                reason=str(exc), details={"phase": "reference", "seed": seed, "phases_s": rounded(phases)}
            )
        outputs = {name: cupy.empty(shape, dtype=np_dtype(dtype)) for name, (shape, dtype) in outputs_spec.items()}
        arrays = {**inputs, **outputs}
        run = runner(arrays)
        checks = self._checked_launch(family, problem, outputs_spec, arrays, outputs, reference, run, phase, phases)
        if kept and not all(check.ok for check in checks):
            checks = self._recheck(family, problem, config, key, pooled, checks, arrays, checked_dtypes, phases)
        elif kept and pooled is not None:
            pooled.confirmed = True  # matched on inputs drawn again: the set comes back from its seed
        del reference
        verification = "fresh input set" if explicit else self.pool.protocol(key)
        bad = [check for check in checks if not check.ok]
        if bad:
            return _wrong_result(bad, seed, verification, phases)
        return Checked(run, checks, verification)

    def _input_set(self, key: tuple, seed: int | None, phases: dict[str, float]) -> tuple[verify.InputSet | None, int]:
        """The input set of this check and its seed: the fresh set of an explicit `seed` (its reference computed
        ahead where it was reserved), else the pool's next for `key`; None (with a seed of its own) where the
        pool keeps none for it."""
        self._settle_ahead(phases)
        pooled = self.pool.fresh(key, seed) if seed is not None else self.pool.draw(key)
        if pooled is not None and pooled.pending is not None:  # an explicit set computed ahead: wait for it
            self._settle(key, pooled, phases)
        return pooled, (pooled.seed if pooled is not None else fresh_seed())

    def _after_user_code(self) -> None:
        """Wait until what a family's own code enqueued is done: our stream (with its hang deadline), then every
        stream of the device. Inputs and references are the user's code, and may compute on a stream of their
        own (torch's current stream, a stream they made, the legacy default stream) that nothing orders with
        ours; what they produced is read next on ours. Once per input set or check: microseconds."""
        self._sync()
        _runtime.deviceSynchronize()

    def _check(self, name: str, out, ref, tolerance: float, dtype: str | None = None) -> OutputCheck:
        """`check_output` on the device in one pass, with our own kernel (no CuPy JIT); `dtype` names what `out`
        stores where its array dtype does not say (bf16 bits). CuPy's path for what the kernel does not cover."""
        import cupy

        ref = cupy.asarray(ref)
        counted = self.device.kernels.check(out, ref, tolerance, dtype) if out.size else None
        if counted is None:
            if dtype == "bfloat16":
                out = bf16.decode(cupy, out)
            return check_output(cupy, name, out, ref, tolerance)
        mismatches, nans, max_abs, max_rel = counted
        return OutputCheck(name, int(out.size), mismatches, nans, max_abs, max_rel, tolerance)

    def _inputs(self, family: Family, problem, seed: int, phases: dict[str, float]) -> dict[str, Any]:
        """The input set of `seed`, drawn on the GPU by our generator (the same arrays for the same seed)."""
        import cupy

        started = time.perf_counter()
        inputs = family.inputs(cupy, problem, self.device.kernels.rng(seed))
        self._after_user_code()
        phases["inputs"] += time.perf_counter() - started
        return inputs

    def _reference(self, family, inputs, problem, config, checked_dtypes, pooled, key, phases) -> dict[str, Any]:
        """The reference of this check: the pooled set's kept one, else computed (and kept, for a pooled set)."""
        import cupy

        started = time.perf_counter()
        try:
            if pooled is not None and pooled.ready:
                return pooled.reference()
            what = f"reference of {family.name}"
            try:
                expected = family.reference(cupy, inputs, problem, config=config)
                self._after_user_code()
            except (cupy.cuda.memory.OutOfMemoryError, MemoryError) as exc:
                raise ReferenceFailed(f"{what} ran out of memory: {exc}".splitlines()[0]) from None
            reference = verify.normalize_reference(expected, family, problem, config, checked_dtypes, what)
            if pooled is not None:
                self.pool.keep(key, pooled, reference)
            return reference
        finally:
            self._sync()
            phases["reference"] += time.perf_counter() - started

    def _compute_ahead(self, family, problem, config, checked_dtypes, later: verify.InputSet, phases) -> None:
        """Start computing `later`'s reference on the host in the background: its inputs drawn here (on the GPU,
        between configs) and copied to the host, the reference then run by a thread of host code only."""
        import cupy

        inputs = self._inputs(family, problem, later.seed, phases)
        started = time.perf_counter()
        host = {name: value.get() if isinstance(value, cupy.ndarray) else value for name, value in inputs.items()}
        del inputs
        phases["reference"] += time.perf_counter() - started
        if self._ahead is None:
            # A thread per set computed ahead (the pool's second and the finalists'): a NumPy reference runs on
            # one core, so both are ready one reference's time after the first, not two.
            self._ahead = ThreadPoolExecutor(AHEAD_THREADS, thread_name_prefix="tuner-reference")
        later.pending = self._ahead.submit(verify.host_reference, family, host, problem, config, checked_dtypes)
        later.finish = functools.partial(
            verify.normalize_reference,
            family=family,
            problem=problem,
            config=config,
            checked_dtypes=checked_dtypes,
            what=f"reference of {family.name}",
        )

    def _settle_ahead(self, phases) -> None:
        """Keep every reference computed ahead that is ready by now (uploaded between configs)."""
        for key, later in self.pool.pending():
            if later.pending.done():
                self._settle(key, later, phases)

    def _settle(self, key, later: verify.InputSet, phases) -> None:
        started = time.perf_counter()
        self.pool.settle(key, later)
        self._sync()
        phases["reference"] += time.perf_counter() - started

    def _checked_launch(
        self, family, problem, outputs_spec, arrays, outputs, reference, run, phase, phases
    ) -> list[OutputCheck]:
        """Poison the outputs, run every launch of the config once, compare with `reference`."""

        started = time.perf_counter()
        for array in outputs.values():
            if array.nbytes:
                array.data.memset_async(0xFF, array.nbytes, self.device.stream)  # NaN in every IEEE float format
        phase[0] = "launch"
        run()
        self._sync()
        phase[0] = "correctness check"
        phases["launch"] += time.perf_counter() - started
        return self._compare(family, problem, outputs_spec, arrays, reference, phases)

    def _compare(self, family, problem, outputs_spec, arrays, reference, phases) -> list[OutputCheck]:
        """Each checked output (or in-place input) of `arrays` against `reference`, within the family's tolerance."""
        import cupy

        started = time.perf_counter()
        tolerance = family.tolerance(problem)
        out_dtypes = {name: dtype for name, (_, dtype) in outputs_spec.items()}
        checks = []
        for name in family.checked() or tuple(reference):
            array, dtype = arrays[name], out_dtypes.get(name)
            bound = tolerance[name] if isinstance(tolerance, dict) else tolerance
            stored = family.checked_stored(name, array, dtype)
            if stored is not None:  # read as stored: one pass over the output, no decoded copy
                checks.append(self._check(name, array, reference[name], bound, stored))
            else:
                checks.append(self._check(name, family.checked_value(cupy, name, array, dtype), reference[name], bound))
        phases["compare"] += time.perf_counter() - started
        return checks

    def _recheck(self, family, problem, config, key, pooled, checks, arrays, checked_dtypes, phases):
        """A mismatch against a kept reference: before the config is blamed, compare again with the reference
        restored from its host copy (a kernel of an earlier config may have written over the device copy) and,
        while no config has matched this set yet, with a reference computed afresh from the inputs the kernel
        read (drawn again from the seed where the kernel updates some in place). A fresh reference that the output
        matches means the family's inputs do not come back from their seed: its key leaves the pool."""
        import cupy

        outputs_spec = family.outputs(problem, config)

        def compare(reference) -> list[OutputCheck]:
            return self._compare(family, problem, outputs_spec, arrays, reference, phases)

        restored = pooled.restore()
        if restored is not None:
            checks = compare(restored)
            if all(check.ok for check in checks):
                return checks
        if pooled.confirmed:
            return checks
        in_place = [name for name in family.checked() if name not in family.outputs(problem, config)]
        # The inputs the kernel read, unless it updated some in place: then drawn again from the seed.
        fresh_inputs = (
            self._inputs(family, problem, pooled.seed, phases)
            if in_place
            else {name: arrays[name] for name in arrays if name not in family.outputs(problem, config)}
        )
        started = time.perf_counter()
        expected = family.reference(cupy, fresh_inputs, problem, config=config)
        self._after_user_code()
        reference = verify.normalize_reference(expected, family, problem, config, checked_dtypes)
        self._sync()
        phases["reference"] += time.perf_counter() - started
        again = compare(reference)
        if all(check.ok for check in again):
            self.pool.forget(key, "its inputs did not come back from their seed: drawn afresh for every check")
        return again
