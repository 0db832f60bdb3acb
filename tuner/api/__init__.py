"""The Python API: what the `tuner` command does, returning objects instead of printing.

    import tuner

    space = tuner.load_space("examples/scale_add/scale_add.yaml")
    result = tuner.study(space, trials=48, sampler="grid")        # stored in SQLite like any study
    result.best                  # dict: params, uri, TB/s, fraction of the copy ceiling, resources
    result.pareto, result.trials # pandas DataFrames
    result.export_header("scale_add_tuned.h")

    # or, from a notebook, a kernel in one call (see `tune`): template, params, problem, reference → the study
    result = tuner.tune("scale_add", "scale_add.cu.j2", params, {"n": 1 << 26}, scale_add,
                        arguments=["x: input[n]", "y: input[n]", "out: output[n]", "alpha: float32 = 0.5",
                                   "n: int64"], grid="ceil_div(n, block * items * vec)", block="block",
                        trials=48)

A study run here is the same study the CLI runs (`tuner.study.driver.run_study`): the dashboard, ``tuner export`` and
``tuner best`` work on it; the ``tuner study`` and ``tuner bench`` commands are thin layers over `study` and
`run_bench`. Bad input raises `tuner.InputError` (the CLI prints it as one line).
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.api.kernelspec import KernelSpec, tune_space, write_space
from tuner.core.errors import InputError
from tuner.core.result import Result
from tuner.space.problem import Problem
from tuner.space.space import SearchSpace
from tuner.space.space import load as load_space

if TYPE_CHECKING:
    from tuner.study.ahead import Ahead

__all__ = [
    "KernelSpec",
    "ProblemsResult",
    "StudyResult",
    "bench",
    "load_space",
    "open_study",
    "run_bench",
    "study",
    "tune",
    "tune_space",
]


@dataclass
class StudyResult:
    """A finished (or resumed) study: the driver's summary (trials, wall time, GPUs, best, storage) and the
    Optuna study itself, loaded from its storage on first use."""

    summary: dict[str, Any] = field(default_factory=dict)
    _study: Any = field(default=None, repr=False)

    @property
    def study(self):
        """The `optuna.Study`, as stored (``summary["storage"]``, ``summary["study"]``)."""
        if self._study is None:
            import optuna

            self._study = optuna.load_study(study_name=self.summary["study"], storage=self.summary["storage"])
        return self._study

    @property
    def best(self) -> dict[str, Any]:
        """The fastest verified config (re-timed where the study re-timed its finalists): what ``tuner best
        --json`` prints, its source's path included where the study attached sources."""
        from tuner.results import export

        return export.best_summary(self.study, export.artifact_dir_for(self.summary["storage"]))

    @property
    def pareto(self):
        """The Pareto front (throughput against registers and shared memory) as a DataFrame."""
        from tuner.results import export

        return export.pareto_frame(self.study)

    @property
    def trials(self):
        """Every trial, one row each, with params and measured figures flattened into columns."""
        from tuner.results import export

        return export.trials_frame(self.study)

    def export_header(
        self, path: str | Path, pick: str = "fastest", namespace: str = "tuned", with_source: bool = False
    ) -> Path:
        """Write the tuned config(s) as a C++17 header, as `tuner export` does; returns the path."""
        from tuner.results import export

        return export.write_header(self.study, path, pick=pick, namespace=namespace, with_source=with_source)


@dataclass
class ProblemsResult:
    """A study per problem (`study` with ``problems=``): `results` by problem name, in the order they ran, and
    `summary` (``summary["problems"]``: a row per problem with its best, its share of the copy ceiling, trials,
    wall and how many first configs came from the other problems' studies; ``summary["studies"]``: each study's
    own summary)."""

    summary: dict[str, Any] = field(default_factory=dict)
    results: dict[str, StudyResult] = field(default_factory=dict)

    def __getitem__(self, problem: str) -> StudyResult:
        return self.results[problem]

    def __iter__(self):
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)


def open_study(name: str | None = None, storage: str | None = None) -> StudyResult:
    """A stored study, as ``tuner best NAME`` finds it: `name` is a study's name, its kernel's, or a .db path
    (None: the only one); `storage` a URL or .db path to look in (default: every studies/*.db here)."""
    from tuner.results import export

    found = export.open_study(name, storage)
    return StudyResult(summary={"study": found.study_name, "storage": export.study_url(found)}, _study=found)


# ---------------------------------------------------------------------------------------------------------------
# study / bench: what `tuner study` and `tuner bench` run


def study(space: SearchSpace | str | Path, trials: int, **keywords: Any) -> StudyResult | ProblemsResult:
    """Run (or resume) a study of `space` (a SearchSpace, a space file or a shipped space's name) until it holds
    `trials` counted trials; ``tuner study KERNEL --space SPACE`` is this call with the same arguments. `kernel`
    defaults to the space's kernel; given, the space must be for it. Storage defaults to
    ``sqlite:///studies/KERNEL.db`` (relative to the working directory). A Ray runtime this call starts is shut
    down before it returns. An unknown keyword, or a value its option cannot take, is an InputError (one line).

    `problems` ("all", or names) runs a study per problem with transfer between them (`tuner.study.shapes`), side
    by side over one pool (``one_at_a_time=True``: one after another), and returns a `ProblemsResult` instead of a
    StudyResult; `replay` is then a list, one recording per problem.
    `warm_start` starts the study, or each problem's, from the best configs of the studies of the same space it
    names (a study, kernel or .db, as ``tuner best`` finds it).
    """
    return study_ahead(None, space, trials, **keywords)


def study_ahead(
    ahead: Ahead | None, space: SearchSpace | str | Path, trials: int, **keywords: Any
) -> StudyResult | ProblemsResult:
    """`study`, taking the writer and GPU workers that ``tuner study`` started `ahead` of it (`tuner.study.ahead`;
    None: the study starts its own)."""
    from tuner.build.cachedirs import ensure_writable
    from tuner.study.driver import run_study
    from tuner.study.options import check_call, from_keywords
    from tuner.study.shapes import warm_prelude

    given = check_call(trials, keywords)
    ensure_writable()  # before the study's workers and writer start: they inherit the cache folders chosen here
    where, given["kernel"], loaded = _space_and_kernel(space, given["kernel"], given["replay"], given["problem"])
    opts = from_keywords(where, trials, given)
    # Ray is imported only where the study uses it (the local engine does not): a Ray that was not imported was
    # not started.
    started_ray = "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    try:
        if opts.problems is not None:
            return _study_problems(opts, loaded, ahead)
        summary = run_study(opts, warm_prelude(opts, loaded) if opts.warm_start else None, loaded, ahead)
    finally:
        ray = sys.modules.get("ray")
        if started_ray and ray is not None and ray.is_initialized():
            ray.shutdown()  # a Ray this call started goes with it: a later call may join another cluster
    return StudyResult(summary=summary)


def _study_problems(opts, space: SearchSpace | None, ahead: Ahead | None) -> ProblemsResult:
    """`study` over several problems (`tuner.study.shapes.run_problems`) of `space` (None: not loaded yet), with
    what was started `ahead`, a StudyResult per problem."""
    from tuner.results.tables import stored_best
    from tuner.study.shapes import run_problems

    out = run_problems(opts, stored_best, space, ahead)
    results = {name: StudyResult(summary=summary) for name, summary in out["studies"].items()}
    return ProblemsResult(summary=out, results=results)


def _space_and_kernel(
    space: SearchSpace | str | Path, kernel: str | None, replay: str | Path | None, problem: str | None
) -> tuple[str, str, SearchSpace | None]:
    """Where `space` is (a path, or a shipped space's name), the kernel it is studied for (`kernel`, else the
    space's) and the space loaded (given, or loaded here: the study takes it as it is, its file is not read again;
    None where the driver loads it, after its own checks); a space loaded here (not for a replay) has its includes
    checked first (`_check_includes`)."""
    if isinstance(space, SearchSpace):
        loaded: SearchSpace | None = space
        where = str(space.path)
    else:
        where = str(space)
        # A shipped space's name (`where == kernel`) needs no include check: the driver finds it, or refuses an
        # unknown kernel in its own words.
        loaded = load_space(where) if kernel is None or (replay is None and where != kernel) else None
    if loaded is not None:
        kernel = kernel or loaded.kernel
        if replay is None:
            _check_includes(loaded, problem)
    assert kernel is not None  # given, or the loaded space's
    return where, kernel, loaded


def _study_signature() -> inspect.Signature:
    """`study`'s signature as `inspect` (``help``, IPython's ``?``, editors) shows it: `space`, `trials` and a
    keyword for each option `tuner.study.options.StudyOptions` declares as one."""
    from tuner.study.options import keywords

    param = inspect.Parameter
    return inspect.Signature(
        [
            param("space", param.POSITIONAL_OR_KEYWORD, annotation="SearchSpace | str | Path"),
            param("trials", param.POSITIONAL_OR_KEYWORD, annotation="int"),
            *(
                param(name, param.KEYWORD_ONLY, default=o.keyword_default, annotation=o.annotation)
                for name, o in keywords().items()
            ),
        ],
        return_annotation="StudyResult | ProblemsResult",
    )


def _study_keywords_doc() -> str:
    """The keywords of `study`, one item each: its default, the argument of ``tuner study`` it is, its help."""
    from tuner.study.options import keywords

    lines = ["Keywords (each one an argument of ``tuner study``):", ""]
    for name, o in keywords().items():
        assert o.flag is not None
        if o.positional:
            flag, about = f"``{o.flag.upper()}``", None  # its help is the command line's (a family or a file)
        elif o.negated:
            flag, about = f"``{o.flag}`` is ``{name}=False``", o.help
        elif o.choices is not None:
            flag, about = f"``{o.flag} {'|'.join(o.choices)}``", o.help
        else:
            flag, about = f"``{o.flag} {o.metavar}``" if o.metavar else f"``{o.flag}``", o.help
        item = f"* ``{name}={o.keyword_default!r}``: {flag}" + (f": {about}" if about else "")
        lines.append(textwrap.fill(item, 112, subsequent_indent="  "))
    return "\n".join(lines)


study.__signature__ = _study_signature()  # type: ignore[attr-defined]
if study.__doc__ is not None:  # None under python -OO
    study.__doc__ += "\n" + textwrap.indent(_study_keywords_doc(), "    ") + "\n"


def _check_includes(space: SearchSpace, problem: str | None) -> None:
    """Before a study on a GPU: compile the default config of `space` on `problem` (None: its first) once
    (`tuner.build.compile.check_includes`), so an include NVRTC cannot open is one InputError naming the template, the
    include and the folders searched, not one failed trial per config. An unknown problem is a SpaceError."""
    from tuner.build import compile as compile_mod

    compile_mod.check_includes(space, space.problem(problem))


def run_bench(
    space: SearchSpace | str | Path,
    config: dict[str, Any] | None = None,
    problem: Problem | str | None = None,
    *,
    gpu: int = 0,
    timeout_s: float = 60.0,
    budget_ms: float = 100.0,
) -> tuple[Result, dict[str, Any]]:
    """`bench`, and what GPU `gpu`'s worker reported when it started (``gpu``: its name, ``ceiling_tbps``, ...).
    A GPU that cannot be used is an InputError (one line), not a traceback."""
    from tuner.build.cachedirs import ensure_writable
    from tuner.gpu import discovery
    from tuner.gpu.evaluate import evaluate_config
    from tuner.gpu.worker import IsolatedEvaluator, WorkerError

    ensure_writable()  # the worker inherits the cache folders chosen here
    if not isinstance(space, SearchSpace):
        space = load_space(space)
    discovery.require_gpu(gpu)  # no driver, no GPU: said in words, before a worker starts only to fail
    with IsolatedEvaluator(gpu=gpu, timeout_s=timeout_s) as evaluator:
        try:
            info = evaluator.start()
        except WorkerError as exc:
            reason = str(exc).splitlines()[0].split(": ", 1)[-1]
            raise InputError(f"GPU {gpu} is not usable: {reason}") from None
        result = evaluate_config(
            space, dict(config or space.default), problem, evaluator=evaluator, budget_ms=budget_ms
        )
    return result, info


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
    return run_bench(space, config, problem, gpu=gpu, timeout_s=timeout_s, budget_ms=budget_ms)[0]


# ---------------------------------------------------------------------------------------------------------------
# tune: a kernel in one call, from a notebook (its space directory: `tuner.api.kernelspec`)


def tune(*args: Any, trials: int, **keywords: Any) -> StudyResult | ProblemsResult:
    """Tune kernel `name` in one call, in the spirit of Kernel Tuner's ``tune_kernel``: write its space
    directory (`tune_space`, which documents every argument of `KernelSpec`), then run `study` on it with `trials`
    and the other keywords (sampler, storage, seed, gpus, replay, engine, ...: every keyword of `study`). The study
    is stored like any other (default ``sqlite:///studies/NAME.db``): ``tuner best NAME``, ``tuner export NAME``
    and the dashboard work on it, and calling `tune` again with the same arguments resumes it. A keyword `study`
    does not take, or GPUs this machine cannot give (none, with neither `replay` nor a Ray address), is an
    InputError before anything is written."""
    from tuner.gpu import discovery
    from tuner.study.options import check_call, engine_for

    kernel_fields = [f.name for f in dataclasses.fields(KernelSpec)]
    options = {key: value for key, value in keywords.items() if key not in kernel_fields}
    given = check_call(trials, options, caller="tuner.tune", others=kernel_fields)
    kernel = KernelSpec(*args, **{key: value for key, value in keywords.items() if key in kernel_fields})
    engine = engine_for(given["engine"], given["ray_address"])
    discovery.gpus(given["gpus"], given["replay"] is not None, given["ray_address"], engine)
    return study(write_space(kernel), trials, **options)


def _kernel_signatures() -> None:
    """`tune`'s signature as `inspect` shows it: `KernelSpec`'s fields, `trials` and the study's keywords."""
    fields = list(inspect.signature(KernelSpec).parameters.values())
    param = inspect.Parameter
    at = [p.name for p in fields].index("block") + 1
    tune.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            *fields[:at],
            param("trials", param.KEYWORD_ONLY, annotation="int"),
            *fields[at:],
            param("options", param.VAR_KEYWORD, annotation="Any"),
        ],
        return_annotation="StudyResult | ProblemsResult",
    )


_kernel_signatures()
