"""One config, end to end: validate → render → compile → check and time on a GPU. Returns a `Result`.

This is the convenience path for a single config (``tuner bench``, tests, notebooks). The study's pipeline
does the same steps spread over Ray (`tuner.study.cluster`); both end in `tuner.gpu.evaluator.GpuEvaluator.evaluate`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from tuner.build.compile import compile_source, default_arch
from tuner.build.render import render
from tuner.core.result import Invalid, Result
from tuner.gpu.protocol import EvaluateRequest, Evaluator
from tuner.kernels.base import Family
from tuner.space.problem import Problem
from tuner.space.space import SearchSpace, load

__all__ = ["evaluate_config"]


def evaluate_config(
    space: SearchSpace | str | Path,
    config: dict[str, Any],
    problem: Problem | str | None = None,
    arch: str | None = None,
    timeout_s: float = 30.0,
    evaluator: Evaluator | None = None,
    *,
    budget_ms: float = 25.0,
    min_reps: int = 10,
    cutoff_ms: float | None = None,
    seed: int | None = None,
    family: Family | None = None,
    env: jinja2.Environment | None = None,
) -> Result:
    """Evaluate the params `config` of `space` (a SearchSpace, a YAML path or a shipped space's name) on
    `problem` (a Problem, a problem name, or the space's first).

    Invalid when the config breaks the space (no work done); CompileFailed when NVRTC refuses it; otherwise
    what the evaluator returns. `evaluator` is any `tuner.gpu.protocol.Evaluator`: a
    `tuner.gpu.worker.IsolatedEvaluator` (kept by the caller across calls: it owns the GPU's child process) or an
    in-process `tuner.gpu.evaluator.GpuEvaluator`; None starts an IsolatedEvaluator on GPU 0 with `timeout_s` for
    this call alone (about a second of start-up). `arch` defaults to the evaluator's GPU. `family` and `env`
    override the space's family and the template environment (ad-hoc families in tests). A TemplateError (a
    broken template) propagates: it is a fault of the template, not of the config.
    """
    if not isinstance(space, SearchSpace):
        space = load(space)
    if not isinstance(problem, Problem):
        problem = space.problem(problem)
    reason = space.validate(config, problem)
    if reason is not None:
        return Invalid(reason=reason, details={"config": dict(config)})
    family = family or space.family
    params = {name: config[name] for name in space.params}
    resolved = space.resolve(params, problem)
    source = render(family, params, resolved, problem.env, env=env)

    owned = evaluator is None
    if evaluator is None:
        from tuner.gpu.worker import IsolatedEvaluator

        evaluator = IsolatedEvaluator(gpu=0, timeout_s=timeout_s)
    try:
        if arch is None:
            arch = evaluator.arch or default_arch()
        compiled = compile_source(source, arch)
        if not compiled.ok:
            return compiled
        request = EvaluateRequest(
            compiled,
            family,
            resolved,
            problem.env,
            seed=seed,
            budget_ms=budget_ms,
            min_reps=min_reps,
            cutoff_ms=cutoff_ms,
        )
        return evaluator.evaluate(request)
    finally:
        if owned:
            evaluator.close()
