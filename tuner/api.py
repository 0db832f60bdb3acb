"""The Python API: what the `tuner` command does, returning objects instead of printing.

    import tuner

    space = tuner.load_space("examples/scale_add/scale_add.yaml")
    result = tuner.study(space, trials=48, sampler="grid")        # stored in SQLite like any study
    result.best                  # dict: params, uri, TB/s, fraction of the copy ceiling, resources
    result.pareto, result.trials # pandas DataFrames
    result.export_header("scale_add_tuned.h")

A study run here is the same study the CLI runs (`tuner.study.run_study`): the dashboard, ``tuner export`` and
``tuner best`` work on it. Bad input raises `tuner.InputError` (the CLI prints it as one line).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.result import Result
from tuner.space import Problem, SearchSpace
from tuner.space import load as load_space

__all__ = ["StudyResult", "bench", "callable_module", "load_space", "study"]


class _CallableModule(types.ModuleType):
    """A stage module that is also the API call of the same name: ``tuner.study(space, trials=...)`` runs
    `tuner.api.study`, while ``from tuner.study import run_study`` and ``from tuner import bench`` still reach the
    modules (renaming the modules would break their importers; shadowing them with functions would break
    ``from tuner import bench``)."""

    def __call__(self, *args, **kwargs):
        return globals()[self.__name__.rpartition(".")[2]](*args, **kwargs)


def callable_module(name: str) -> types.ModuleType:
    """Make the loaded module `name` (tuner.study or tuner.bench) callable as its API function; returns it."""
    module = sys.modules[name]
    module.__class__ = _CallableModule
    return module


@dataclass
class StudyResult:
    """A finished (or resumed) study: the Optuna study and the driver's summary (trials, wall time, GPUs, best)."""

    study: Any  # optuna.Study
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def best(self) -> dict[str, Any]:
        """The fastest verified config (re-timed where the study re-timed its finalists), as `tuner best` shows."""
        from tuner import export

        return export.best_summary(self.study)

    @property
    def pareto(self):
        """The Pareto front (throughput against registers and shared memory) as a DataFrame."""
        from tuner import export

        return export.pareto_frame(self.study)

    @property
    def trials(self):
        """Every trial, one row each, with params and measured figures flattened into columns."""
        from tuner import export

        return export.trials_frame(self.study)

    def export_header(
        self, path: str | Path, pick: str = "fastest", namespace: str = "tuned", with_source: bool = False
    ) -> Path:
        """Write the tuned config(s) as a C++17 header, as `tuner export` does; returns the path."""
        from tuner import export

        return export.write_header(self.study, path, pick=pick, namespace=namespace, with_source=with_source)


def study(
    space: SearchSpace | str | Path,
    trials: int,
    *,
    sampler: str = "tpe",
    storage: str | None = None,
    study_name: str | None = None,
    seed: int | None = None,
    gpus: int | None = None,
    ray_address: str | None = None,
    replay: str | Path | None = None,
    problem: str | None = None,
    timeout: float = 60.0,
    progress: bool = False,
) -> StudyResult:
    """Run (or resume) a study of `space` (a SearchSpace, a space file or a shipped space's name) until it holds
    `trials` trials, exactly as ``tuner study`` does with the same arguments; `replay` answers from a recorded
    study instead of a GPU. Storage defaults to ``sqlite:///studies/KERNEL.db`` (relative to the working
    directory)."""
    from tuner.study import StudyOptions, run_study

    if isinstance(space, SearchSpace):
        kernel, where = space.kernel, str(space.path)
    else:
        kernel, where = load_space(space).kernel, str(space)
    import ray

    started_ray = not ray.is_initialized()
    try:
        summary = run_study(
            StudyOptions(
                kernel=kernel,
                space=where,
                trials=trials,
                storage=storage,
                study_name=study_name,
                sampler=sampler,
                seed=seed,
                gpus=gpus,
                ray_address=ray_address,
                timeout=timeout,
                replay=None if replay is None else str(replay),
                problem=problem,
                progress=progress,
            )
        )
    finally:
        if started_ray and ray.is_initialized():
            ray.shutdown()  # a Ray this call started goes with it: a later call may join another cluster

    import optuna

    return StudyResult(
        study=optuna.load_study(study_name=summary["study"], storage=summary["storage"]), summary=summary
    )


def bench(
    space: SearchSpace | str | Path,
    config: dict[str, Any] | None = None,
    problem: Problem | str | None = None,
    *,
    gpu: int = 0,
    timeout_s: float = 60.0,
    budget_ms: float = 100.0,
) -> Result:
    """Verify and time one config (default: the space's default) on GPU `gpu`, in a worker process so a faulting
    kernel cannot take the caller down: a Measurement or a typed failure, as ``tuner bench`` reports."""
    from tuner.evaluate import evaluate_config
    from tuner.worker import IsolatedEvaluator

    if not isinstance(space, SearchSpace):
        space = load_space(space)
    with IsolatedEvaluator(gpu=gpu, timeout_s=timeout_s) as evaluator:
        return evaluate_config(space, dict(config or space.default), problem, evaluator=evaluator, budget_ms=budget_ms)
