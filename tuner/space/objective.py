"""What "best" means: a study's first objective, its direction and unit, and each config's figure for it.

A space names its objectives (``objectives: [{throughput: maximize}]``, `tuner.space.space.METRICS`); a study
stores them as Optuna metric names and directions, and in its "objectives" user attr. Every place that picks or
prints the best config (the driver's running best and finalists, ``tuner best``, ``pareto``, ``export``,
``studies``, ``explain``, the dashboard) asks a `Goal` which of two figures is better, so a time-only study (one
imported from a Kernel Tuner cache) is ranked by its time, shortest first, and a throughput study by its throughput.

A figure a config does not have is None, never 0: a Kernel Tuner cache records times only, so an imported trial's
bytes, FLOPs and throughput are 0 (nothing known), and its registers and SMEM are 0 unless the cache was written by
`tuner export --kt-cache`; a compiled kernel always uses registers, so 0 registers is "not recorded".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: objective metric → the Measurement field (trial user attr) that holds its figure; "throughput" reads the
#: family's own unit (`Goal.throughput_key`)
METRIC_FIELDS = {
    "tbps": "tbps",
    "tflops": "tflops",
    "time_ms": "median_ms",
    "fraction_of_ceiling": "fraction_of_ceiling",
    "registers": "registers",
    "smem_bytes": "smem_bytes",
    "spill_bytes": "spill_bytes",
}
#: figures that exist only where the config's bytes (or FLOPs) are known: 0 means not recorded
_THROUGHPUTS = ("tbps", "tflops", "fraction_of_ceiling", "ceiling_tbps", "bytes_moved")
#: figures that exist only where the config was compiled by us: 0 registers means not recorded
_RESOURCES = (
    "registers",
    "smem_bytes",
    "smem_static_bytes",
    "smem_dynamic_bytes",
    "spill_bytes",
    "blocks_per_sm",
    "warps_per_sm",
)
#: every figure that may be "not recorded" (`figure`)
RECORDED_FIGURES = _THROUGHPUTS + _RESOURCES
_LABELS = {"throughput": "throughput", "time_ms": "time", "fraction_of_ceiling": "of ceiling"}


def has_throughput(throughput_unit: str) -> bool:
    """Whether a family with this unit has a throughput at all (a replay-only family's unit is "ms")."""
    return throughput_unit in ("TB/s", "TFLOP/s")


def figure(attrs: Mapping[str, Any], key: str) -> float | None:
    """A trial's (or a finalist's, or a Measurement dict's) figure `key`, None where it was not recorded."""
    value = attrs.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    if key in _THROUGHPUTS and value == 0:
        return None
    if key in _RESOURCES and not attrs.get("registers"):
        return None
    return float(value)


@dataclass(frozen=True)
class Goal:
    """A study's first objective: `metric` (a space objective metric), `direction` and the family's
    `throughput_unit` ("TB/s", "TFLOP/s", or "ms" for a family with none)."""

    metric: str = "throughput"
    direction: str = "maximize"
    throughput_unit: str = "TB/s"

    @property
    def throughput_key(self) -> str:
        return "tflops" if self.throughput_unit == "TFLOP/s" else "tbps"

    @property
    def key(self) -> str:
        """The Measurement field that holds this objective's figure."""
        if self.metric == "throughput":
            return self.throughput_key if has_throughput(self.throughput_unit) else "median_ms"
        return METRIC_FIELDS.get(self.metric, self.metric)

    @property
    def label(self) -> str:
        return "time" if self.key == "median_ms" else _LABELS.get(self.metric, self.metric)

    @property
    def unit(self) -> str:
        return {
            "tbps": "TB/s",
            "tflops": "TFLOP/s",
            "median_ms": "ms",
            "registers": "registers",
            "smem_bytes": "B",
            "spill_bytes": "B",
            "fraction_of_ceiling": "× ceiling",
        }.get(self.key, "")

    @property
    def minimize(self) -> bool:
        # A throughput objective of a family without one is answered by its time: shorter is better.
        if self.metric == "throughput" and self.key == "median_ms":
            return True
        return self.direction == "minimize"

    def value(self, attrs: Mapping[str, Any]) -> float | None:
        """The objective's figure in `attrs` (trial user attrs, a finalist entry, a Measurement dict)."""
        return figure(attrs, self.key)

    def rank(self, value: float | None) -> float:
        """Sort key: the best value first; a missing figure last."""
        if value is None:
            return math.inf
        return value if self.minimize else -value

    def better(self, value: float | None, than: float | None) -> bool:
        return self.rank(value) < self.rank(than)

    def format(self, value: float | None) -> str:
        """``10.13 ms``, ``4.213 TB/s``; "" for a missing figure."""
        return format_figure(value, self.unit)


def format_figure(value: float | None, unit: str) -> str:
    """A figure with its unit: ms to 4 significant digits, counts and bytes whole, the rest to 3 decimals; "" for
    a missing figure."""
    if value is None:
        return ""
    if unit == "ms":
        return f"{value:.4g} ms"
    if unit in ("registers", "B"):
        return f"{value:.0f} {unit}"
    return f"{value:.3f} {unit}"


def goal_of(objectives: Sequence[Any] | None, throughput_unit: str) -> Goal:
    """The Goal of the first of `objectives`: `Objective`s, (name, direction) pairs, or None (the default:
    throughput, maximized)."""
    if not objectives:
        return Goal(throughput_unit=throughput_unit)
    first = objectives[0]
    name, direction = (first.name, first.direction) if hasattr(first, "name") else (first[0], first[1])
    return Goal(str(name), str(direction), throughput_unit)
