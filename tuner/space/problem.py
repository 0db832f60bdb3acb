"""What a space runs on and what it optimizes: its problems (named sizes, a dtype, a GPU) and its objectives."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from tuner.core.gpufacts import DEFAULT, GpuFacts
from tuner.kernels import base as kbase

Direction = Literal["maximize", "minimize"]


@dataclass(frozen=True)
class Problem:
    """A named problem: integer sizes and a dtype, on a GPU. `env` is what templates and kernel families see:
    the sizes, ``dtype`` and ``elem_bytes``; `expression_env`, what space expressions see, adds the GPU's facts
    (`tuner.core.gpufacts.EXPRESSION_NAMES`: ``sm_count``, ``smem_per_block_max``, ...). `gpu` is
    `tuner.core.gpufacts.DEFAULT` (H100/H200) until the study driver learns the facts of the GPU its workers own."""

    name: str
    dtype: str
    sizes: dict[str, int]
    gpu: GpuFacts = field(default=DEFAULT, compare=False)

    @property
    def env(self) -> dict[str, Any]:
        return {**self.sizes, "dtype": self.dtype, "elem_bytes": kbase.DTYPES[self.dtype][1]}

    @property
    def expression_env(self) -> dict[str, Any]:
        return {**self.gpu.expression_env(), **self.env}

    def label(self) -> str:
        return f"{self.name}_{self.dtype}"


@dataclass(frozen=True)
class Objective:
    name: str
    direction: Direction
