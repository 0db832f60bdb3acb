"""What a GPU offers a kernel: SM count, registers and shared memory per SM and per block, thread limits, L2.

`GpuFacts.from_device` reads them from the GPU itself (``cudaDeviceGetAttribute``); the worker that measured a
study reports them and the driver stores them in the study's user attr "gpu_facts", so plots and occupancy
figures read the facts of the GPU the study ran on. Space expressions see them under `EXPRESSION_NAMES`
(``blocks >= sm_count``).

`DEFAULT` holds the facts of an H100/H200 (sm_90): used only where no GPU answered (compiling or replaying on a
machine without one, without ``--arch``) and for studies recorded before they stored "gpu_facts".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEFAULT",
    "DEFAULT_ARCH",
    "EXPRESSION_NAMES",
    "FP32_LANES_PER_SM",
    "GpuFacts",
    "compute_capability",
    "fp32_peak_tflops",
]

#: The arch compiled for where no GPU and no --arch say otherwise: H100/H200.
DEFAULT_ARCH = "sm_90"


@dataclass(frozen=True)
class GpuFacts:
    """Per-device limits, named as space expressions see them."""

    arch: str = DEFAULT_ARCH
    sm_count: int = 132
    regs_per_sm: int = 65_536
    smem_per_sm: int = 228 * 1024
    smem_per_block: int = 48 * 1024  # without opting in through cudaFuncSetAttribute
    smem_per_block_max: int = 227 * 1024  # opt-in limit
    smem_reserved_per_block: int = 1024  # kept by the driver in every block on sm_80+
    max_threads_per_block: int = 1024
    max_warps_per_sm: int = 64
    l2_bytes: int = 50 * 1024 * 1024
    #: True when read from a GPU, False for `DEFAULT` (or a study that did not record its GPU's facts)
    measured: bool = False

    @classmethod
    def from_device(cls, device: int = 0) -> GpuFacts:
        """Read the facts of CUDA device `device` (of the current process's visible devices)."""
        import cupy

        from tuner.core.cudalib import runtime

        def attr(name: str) -> int:
            return int(runtime.deviceGetAttribute(getattr(runtime, name), device))

        return cls(
            arch=f"sm_{cupy.cuda.Device(device).compute_capability}",
            sm_count=attr("cudaDevAttrMultiProcessorCount"),
            regs_per_sm=attr("cudaDevAttrMaxRegistersPerMultiprocessor"),
            smem_per_sm=attr("cudaDevAttrMaxSharedMemoryPerMultiprocessor"),
            smem_per_block=attr("cudaDevAttrMaxSharedMemoryPerBlock"),
            smem_per_block_max=attr("cudaDevAttrMaxSharedMemoryPerBlockOptin"),
            smem_reserved_per_block=attr("cudaDevAttrReservedSharedMemoryPerBlock"),
            max_threads_per_block=attr("cudaDevAttrMaxThreadsPerBlock"),
            max_warps_per_sm=attr("cudaDevAttrMaxThreadsPerMultiProcessor") // 32,
            l2_bytes=attr("cudaDevAttrL2CacheSize"),
            measured=True,
        )

    @classmethod
    def from_dict(cls, data: Any) -> GpuFacts:
        """Facts from a study's "gpu_facts" attr; `DEFAULT` for anything missing (older studies)."""
        if not isinstance(data, dict):
            return DEFAULT
        known = {f.name for f in dataclasses.fields(cls)}
        return dataclasses.replace(DEFAULT, **{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def expression_env(self) -> dict[str, int]:
        """The names space expressions may read (`EXPRESSION_NAMES`) and their values."""
        return {name: getattr(self, name) for name in EXPRESSION_NAMES}


DEFAULT = GpuFacts()

#: FP32 lanes per SM by compute capability (architecture fact, CUDA Programming Guide's throughput table).
FP32_LANES_PER_SM = {
    "7.0": 64,
    "7.5": 64,
    "8.0": 64,
    "8.6": 128,
    "8.7": 128,
    "8.9": 128,
    "9.0": 128,
    "10.0": 128,
    "10.3": 128,
    "12.0": 128,
}


def compute_capability(arch: str) -> str:
    """``sm_90`` (or ``sm_90a``, ``compute_90``) → ``9.0``; ``sm_100`` → ``10.0``; "" for anything else."""
    digits = "".join(c for c in arch.rpartition("_")[2] if c.isdigit())
    return f"{digits[:-1]}.{digits[-1]}" if len(digits) >= 2 else ""


def fp32_peak_tflops(facts: GpuFacts, sm_clock_mhz: float | None) -> float | None:
    """The FP32 FMA peak (2 FLOPs per lane per clock) of the GPU `facts` describe at `sm_clock_mhz` (its max SM
    clock, as a measurement records it): a figure from the facts, not a measurement. None where the facts were
    not read from a GPU (`DEFAULT` stands in), or the arch's lanes or the clock are unknown."""
    lanes = FP32_LANES_PER_SM.get(compute_capability(facts.arch))
    if not facts.measured or not lanes or not sm_clock_mhz:
        return None
    return facts.sm_count * lanes * 2 * float(sm_clock_mhz) * 1e6 / 1e12


#: GPU facts a space expression may name: ``blocks >= sm_count``, ``smem <= smem_per_block_max``, ...
EXPRESSION_NAMES = (
    "sm_count",
    "regs_per_sm",
    "smem_per_sm",
    "smem_per_block",
    "smem_per_block_max",
    "max_threads_per_block",
    "max_warps_per_sm",
    "l2_bytes",
)
