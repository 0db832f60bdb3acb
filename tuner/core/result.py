"""What every evaluation returns: a `Measurement`, or one of the typed failures.

The evaluator protocol (DESIGN.md) is ``evaluate(config) -> Result``. The study driver records a Measurement as a
COMPLETE trial and a failure as a FAIL (or PRUNED, for `Invalid`) trial whose ``user_attrs["failure"]`` is the
failure's `kind` and whose ``user_attrs["reason"]`` is its reason. All results are plain frozen dataclasses so they
pickle across Ray and process boundaries.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Failure:
    """Base of the typed failures; `reason` is one human-readable line."""

    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    kind = "failure"

    @property
    def ok(self) -> Literal[False]:
        return False

    def to_dict(self) -> dict[str, Any]:
        return {TrialAttr.FAILURE: self.kind, TrialAttr.REASON: self.reason, **self.details}


@dataclass(frozen=True)
class Invalid(Failure):
    """The config violates a constraint of the space or a limit of the family; no work was done."""

    kind = "invalid"


@dataclass(frozen=True)
class CompileFailed(Failure):
    """NVRTC (or ptxas behind it) rejected the source; `details["log"]` holds the compiler log."""

    kind = "compile_failed"


@dataclass(frozen=True)
class LaunchFailed(Failure):
    """The launch itself failed: too many resources, a bad launch configuration, or a fault such as an
    illegal address (which poisons the CUDA context, so the worker that saw it is replaced)."""

    kind = "launch_failed"


@dataclass(frozen=True)
class WrongResult(Failure):
    """The kernel ran but its output differs from the reference; the reason carries max abs/rel error."""

    kind = "wrong_result"


@dataclass(frozen=True)
class TimedOut(Failure):
    """The kernel (or its compile) did not finish within the configured limit; its worker was replaced."""

    kind = "timed_out"


FAILURE_KINDS: dict[str, type[Failure]] = {
    cls.kind: cls for cls in (Invalid, CompileFailed, LaunchFailed, WrongResult, TimedOut)
}

#: The failure kind of a trial a killed driver left RUNNING (failed on the next run, its config run again).
INTERRUPTED = "interrupted"


class TrialAttr:
    """Names of the user attrs the study driver writes on a trial (besides every field of a Measurement)."""

    FAILURE = "failure"  # a Failure's kind, or INTERRUPTED
    REASON = "reason"  # a Failure's reason
    CONSTRAINT = "constraint"  # mirror of the Optuna constraint (optuna-dashboard 0.21 reads only this)
    DUPLICATE_OF = "duplicate_of"  # the number of the trial that measured this config
    DERIVED = "derived"  # derived values of the config
    WORKER_GPU_INDEX = "worker_gpu_index"  # the GPU whose worker answered
    WORKER = "worker"  # {"host", "pid", "node"} of the process that answered (node: the Ray node id, or "local")
    ARTIFACTS = "artifacts"  # {"source": artifact id, "ptx": artifact id}
    URI = "uri"
    #: the problem whose study found this config and queued it here (studies side by side: `tuner.study.sidebyside`)
    TAKEN_FROM = "taken_from"


class StudyAttr:
    """Names of the study's user attrs that more than one stage reads."""

    KERNEL = "kernel"
    FAMILY = "family"  # how any process finds the family again: its name, or space:PATH (tuner.build.families.get)
    PROBLEM = "problem"
    GPU = "gpu"
    ARCH = "arch"
    GPU_FACTS = "gpu_facts"  # tuner.core.gpufacts.GpuFacts.to_dict() of the GPU the study ran on
    SPACE_PATH = "space_path"
    SPACE_HASH = "space_hash"
    TEMPLATES_HASH = "templates_hash"
    THROUGHPUT_UNIT = "throughput_unit"
    FINALISTS = "finalists"  # re-timed fastest configs, fastest first


@dataclass(frozen=True)
class Measurement:
    """A verified, timed config.

    Times are milliseconds per call of the whole config (all of its launches). `bytes_moved` is the family's
    minimal traffic (each input read once, each output written once), so `tbps` is useful bandwidth, never
    inflated by re-reads. `ceiling_tbps` is the device-to-device copy measured on the same GPU with the same
    protocol; `fraction_of_ceiling` = tbps / ceiling_tbps. `holds_given_up` counts the batches of repetitions
    whose stream hold gave up before the host had enqueued them (`tuner.gpu.timing.LAUNCH_HOLD`): above 0, some
    repetitions may include time the GPU spent waiting for the host.

    `threads_per_block` is the threads of the config's main launch. `gpu_ms` is the GPU time the evaluation ran
    the config's own launches (the checked launch and every timed repetition, by CUDA events), so "GPU busy"
    counts work and not a worker's occupied time. `phases_s` is the host wall of the evaluation's stages, in
    seconds: "inputs" (drawing or taking the input set), "reference" (computing a reference: 0 when the pool's
    was reused), "compare" (the output check), "launch" (the checked launch and its wait), "timing" (all timed
    repetitions with their flushes). A failure found by the check carries the same dict in
    ``details["phases_s"]``.
    """

    median_ms: float
    p20_ms: float
    p80_ms: float
    repetitions: int
    bytes_moved: int
    flops: int
    tbps: float
    tflops: float
    ceiling_tbps: float
    fraction_of_ceiling: float
    registers: int
    smem_static_bytes: int
    smem_dynamic_bytes: int
    spill_bytes: int
    local_bytes: int = 0
    blocks_per_sm: int = 0
    warps_per_sm: int = 0
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    gpu: str = ""
    gpu_index: int = 0
    clocks: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    uri: str = ""
    holds_given_up: int = 0
    threads_per_block: int = 0
    gpu_ms: float = 0.0
    phases_s: dict[str, float] = field(default_factory=dict)

    kind = "ok"

    @property
    def ok(self) -> Literal[True]:
        return True

    @property
    def smem_bytes(self) -> int:
        return self.smem_static_bytes + self.smem_dynamic_bytes

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["smem_bytes"] = self.smem_bytes
        return out


Result = Measurement | Failure
