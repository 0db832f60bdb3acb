"""Comparing a config's outputs with their reference, on the device that holds them.

Element-wise ``|out - ref| / max(|ref|, 1) <= tolerance``; any NaN in the output fails (outputs are poisoned with
NaN before each checked launch, so an element the kernel did not write is caught).
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tuner.gpu import verify
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


#: Threads that compute host references ahead (`tuner.gpu.verify`): the pool's second set and the finalists' at once.
AHEAD_THREADS = 2


class Verification:
    """The verification half of `tuner.gpu.evaluator.GpuEvaluator`: inputs drawn from the problem's pool, references
    computed once per input set (ahead, in threads, where they run on the host), launches on poisoned outputs,
    comparisons on the device, and the finalists' re-check on a fresh input set."""

    # set by the evaluator (its constructor, and `tuner.gpu.device.Device` at start)
    stream: Any
    _kernels: Any
    _pool: Any
    _ahead: ThreadPoolExecutor | None

    def _sync(self) -> None:  # the evaluator's wait for the GPU, with its hang deadline
        raise NotImplementedError

    def _after_user_code(self) -> None:
        """Wait until what a family's own code enqueued is done: our stream (with its hang deadline), then every
        stream of the device. Inputs and references are the user's code, and may compute on a stream of their
        own (torch's current stream, a stream they made, the legacy default stream) that nothing orders with
        ours; what they produced is read next on ours. Once per input set or check: microseconds."""
        from tuner.cudalib import runtime

        self._sync()
        runtime.deviceSynchronize()

    def _check(self, name: str, out, ref, tolerance: float, dtype: str | None = None) -> OutputCheck:
        """`check_output` on the device in one pass, with our own kernel (no CuPy JIT); `dtype` names what `out`
        stores where its array dtype does not say (bf16 bits). CuPy's path for what the kernel does not cover."""
        import cupy

        ref = cupy.asarray(ref)
        counted = self._kernels.check(out, ref, tolerance, dtype) if out.size else None
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
        inputs = family.inputs(cupy, problem, self._kernels.rng(seed))
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
                self._pool.keep(key, pooled, reference)
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
        for key, later in self._pool.pending():
            if later.pending.done():
                self._settle(key, later, phases)

    def _settle(self, key, later: verify.InputSet, phases) -> None:
        started = time.perf_counter()
        self._pool.settle(key, later)
        self._sync()
        phases["reference"] += time.perf_counter() - started

    def _checked_launch(
        self, family, problem, outputs_spec, arrays, outputs, reference, run, phase, phases
    ) -> list[OutputCheck]:
        """Poison the outputs, run every launch of the config once, compare with `reference`."""

        started = time.perf_counter()
        for array in outputs.values():
            if array.nbytes:
                array.data.memset_async(0xFF, array.nbytes, self.stream)  # NaN in every IEEE float format
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
            self._pool.forget(key, "its inputs did not come back from their seed: drawn afresh for every check")
        return again
