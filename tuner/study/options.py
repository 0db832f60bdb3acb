"""What a study is asked to do: `StudyOptions` (the flags of ``tuner study``, the keywords of `tuner.study`), and the
defaults that follow from them (storage, engine, study name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tuner.results.dbfiles import default_storage_url
from tuner.space import limits
from tuner.space import space as space_mod

if TYPE_CHECKING:
    pass


SAMPLERS = limits.SAMPLERS


ENGINES = limits.ENGINES


@dataclass
class StudyOptions:
    kernel: str
    space: str
    trials: int
    storage: str | None = None
    study_name: str | None = None
    sampler: str = "tpe"
    seed: int | None = None
    gpus: int | None = None
    ray_address: str | None = None
    timeout: float = 60.0
    replay: str | None = None
    replay_study: str | None = None
    replay_delay_s: float = 0.0
    problem: str | None = None
    progress: bool = True
    #: after a proposal that cannot be measured (breaks a constraint, already measured or failed, in flight),
    #: measure the nearest unexplored valid config next (see `Repair`); False: a uniform draw among them
    repair: bool = True
    #: numeric params as ordered (index) distributions for the sampler (see `tuner.study.search.Codec`)
    ordered: bool = True
    #: once the valid set is listed (and small enough to list), the sampler proposes only valid configs not yet
    #: measured, failed or in flight (`tuner.study.search.ValidSetSampler`); False: every proposal is screened and
    #: repaired by the driver instead
    inside_valid_set: bool = True
    #: answer replayed configs in this process (no Ray, no writer process): `replay_in_flight` configs in flight
    in_process: bool = False
    replay_in_flight: int = 1
    #: search only the configs the replay recording holds (`tuner.study.replay.recorded_subspace`): for a recording
    #: that covers part of the space, where a config it lacks has no answer
    replay_recorded_only: bool = False
    #: how many of the fastest configs to re-time with `final_budget_ms` at the end (not in replay)
    finalists: int = 5
    final_budget_ms: float = 300.0
    #: ... but no more than this many repetitions' worth of it (at the screening median): a median of 200
    #: flushed launches is steady, and 300 ms of a 0.15 ms kernel would be ~2,000 of them, ~0.5 s each finalist
    final_reps: int = 200
    #: multi-fidelity screening: a config whose 3-repetition estimate is over this many times the best median
    #: so far is reported from those 3 repetitions and not timed further (`tuner.gpu.timing.benchmark`); its figure
    #: steers the search, and the finalists are re-timed in full anyway. None: every config gets the budget
    screen_cutoff: float | None = 1.05
    #: timed work per config while screening (at least 10 repetitions; `tuner.gpu.timing.benchmark`); the finalists
    #: get `final_budget_ms`. Measured on an H200 (benchmarks/results/screen_fidelity-*-5ms-*): 5 ms against 25
    #: ms of transpose, softmax and GEMV configs agreed within 1.1% per config (median 0.1-0.4%, as 10 ms did), and
    #: the config picked by the 5 ms figure was the fastest by the 25 ms one, or within 0.1% of it (four or five of
    #: the fastest five held their place) — the finalists' re-timing decides among them. A GEMM-sized kernel
    #: (~3 ms) is held by the 10 repetitions, not by the budget
    screen_budget_ms: float = 5.0
    #: take the study over from a driver that holds its lease (see tuner.study.lease)
    takeover: bool = False
    #: what the sampler optimises: "first" = the space's first objective alone (throughput; the Pareto front of
    #: registers and SMEM is computed from all measured trials afterwards), "all" = every objective of the space
    objectives: str = "first"
    #: "local" (threads and GPU worker processes on this machine, no Ray) or "ray"; None: ray when
    #: `ray_address` is given, else local
    engine: str | None = None


def default_storage(kernel: str) -> str:
    """``sqlite:///studies/KERNEL.db``, relative to the working directory."""
    return default_storage_url(kernel)


def engine_of(opts: StudyOptions) -> str:
    """The engine a study runs on: `opts.engine`, else ray with a `ray_address`, else local."""
    return opts.engine or ("ray" if opts.ray_address else "local")


def default_study_name(space: space_mod.SearchSpace, problem: space_mod.Problem, gpu: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{space.kernel}-{problem.label()}-{gpu}")
