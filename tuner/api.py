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

import ast
import dataclasses
import inspect
import re
import sys
import tempfile
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from tuner.errors import InputError, TemplateError
from tuner.expr import parse_tree
from tuner.result import Result
from tuner.space.problem import Problem
from tuner.space.space import SearchSpace
from tuner.space.space import load as load_space

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
    return StudyResult(summary={"study": found.study_name, "storage": export.storage_url(found)}, _study=found)


# ---------------------------------------------------------------------------------------------------------------
# study / bench: what `tuner study` and `tuner bench` run


def study(space: SearchSpace | str | Path, trials: int, **keywords: Any) -> StudyResult | ProblemsResult:
    """Run (or resume) a study of `space` (a SearchSpace, a space file or a shipped space's name) until it holds
    `trials` counted trials; ``tuner study KERNEL --space SPACE`` is this call with the same arguments. `kernel`
    defaults to the space's kernel; given, the space must be for it. Storage defaults to
    ``sqlite:///studies/KERNEL.db`` (relative to the working directory). A Ray runtime this call starts is shut
    down before it returns. An unknown keyword, or a value its option cannot take, is an InputError (one line).

    `problems` ("all", or names) runs a study per problem with transfer between them (`tuner.study.shapes`) and
    returns a `ProblemsResult` instead of a StudyResult; `replay` is then a list, one recording per problem.
    `warm_start` starts the study, or each problem's, from the best configs of the studies of the same space it
    names (a study, kernel or .db, as ``tuner best`` finds it).
    """
    from tuner.build.cachedirs import ensure_writable
    from tuner.study.driver import run_study
    from tuner.study.options import check_call, from_keywords
    from tuner.study.shapes import warm_prelude

    given = check_call(trials, keywords)
    ensure_writable()  # before the study's workers and writer start: they inherit the cache folders chosen here
    where, given["kernel"] = _space_and_kernel(space, given["kernel"], given["replay"], given["problem"])
    opts = _one_replay(from_keywords(where, trials, given))
    # Ray is imported only where the study uses it (the local engine does not): a Ray that was not imported was
    # not started.
    started_ray = "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    try:
        if opts.problems is not None:
            return _study_problems(opts)
        summary = run_study(opts, warm_prelude(opts) if opts.warm_start else None)
    finally:
        ray = sys.modules.get("ray")
        if started_ray and ray is not None and ray.is_initialized():
            ray.shutdown()  # a Ray this call started goes with it: a later call may join another cluster
    return StudyResult(summary=summary)


def _one_replay(opts):
    """`opts` with a one-element list of recordings as that recording; several need ``problems`` (InputError)."""
    import dataclasses

    if isinstance(opts.replay, list) and opts.problems is None:
        if len(opts.replay) > 1:
            raise InputError("--replay is given once, or once per problem with --problems")
        return dataclasses.replace(opts, replay=opts.replay[0] if opts.replay else None)
    return opts


def _study_problems(opts) -> ProblemsResult:
    """`study` over several problems (`tuner.study.shapes.run_problems`), a StudyResult per problem."""
    from tuner.study.shapes import run_problems

    out = run_problems(opts)
    results = {name: StudyResult(summary=summary) for name, summary in out["studies"].items()}
    return ProblemsResult(summary=out, results=results)


def _space_and_kernel(
    space: SearchSpace | str | Path, kernel: str | None, replay: str | Path | None, problem: str | None
) -> tuple[str, str]:
    """Where `space` is (a path, or a shipped space's name) and the kernel it is studied for (`kernel`, else the
    space's); a space loaded here (not for a replay) has its includes checked first (`_check_includes`)."""
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
    return where, kernel


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
    from tuner.gpu.evaluate import evaluate_config
    from tuner.gpu.worker import IsolatedEvaluator, WorkerError
    from tuner.space import limits

    ensure_writable()  # the worker inherits the cache folders chosen here
    if not isinstance(space, SearchSpace):
        space = load_space(space)
    limits.require_gpu(gpu)  # no driver, no GPU: said in words, before a worker starts only to fail
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
# tune: a kernel in one call, from a notebook

#: the files `tune_space` writes into its directory (a template file, the space, the reference)
REFERENCE_MODULE = "reference.py"
REFERENCE_PICKLE = "reference.pkl"
_REFERENCE_SOURCE = '''"""The reference of kernel {name!r} as tuner.tune received it: the caller's function, stored with
cloudpickle in reference.pkl beside this file. Loading it runs the caller's code, as any
reference does."""

import pickle
from pathlib import Path

reference = pickle.loads(Path(__file__).with_name("reference.pkl").read_bytes())
'''
_ARRAY = re.compile(r"(input|output)\s*([A-Za-z_]\w*)?\s*\[(.*)\]", re.S)
_SCALAR = re.compile(r"([A-Za-z_]\w*)\s*(?:=\s*(.+))?", re.S)


@dataclass(frozen=True)
class KernelSpec:
    """A kernel of the caller's, as `tune_space` writes it into a space directory and `tune` tunes it: the fields
    are the arguments both take, in their order (`tune_space` says what each is)."""

    name: str
    template: str | Path
    params: dict[str, Sequence[Any]]
    problem: dict[str, Any]
    reference: Callable[..., Any] | None = None
    _: KW_ONLY
    arguments: Sequence[str | dict[str, Any]]
    grid: str | int | Sequence[str | int]
    block: str | int | Sequence[str | int]
    smem: str | int = 0
    constraints: Sequence[str] = ()
    derived: dict[str, str] | None = None
    default: dict[str, Any] | None = None
    bytes_moved: str | int | None = None
    flops: str | int | None = None
    tolerance: float | None = None
    directory: str | Path | None = None


def tune_space(*args: Any, **kwargs: Any) -> SearchSpace:
    """Write kernel `name` as a space directory (default ``studies/NAME/``, relative to the working directory) and
    load it: ``NAME.yaml`` (a declarative ``kernel:`` block, see `tuner.kernels.declarative`), ``NAME.cu.j2`` and,
    with a `reference`, ``reference.py`` + ``reference.pkl``. Any process (the GPU workers, a later ``tuner
    study --space studies/NAME/NAME.yaml``, ``tuner export``) finds the kernel again from those files. The
    arguments are the fields of `KernelSpec`:

    * `template`: Jinja2 CUDA source, or the path of a template file (copied).
    * `params`: name → the list of values to try; `constraints`, `derived`: expressions over params, derived
      values and the problem's sizes, in the AST-checked language of space files.
    * `problem`: sizes (positive ints), optional ``dtype`` (default float32) and ``name``.
    * `arguments`: the entry point's, in order: ``"x: input[n]"``, ``"out: output float16[rows, cols]"`` (dtype
      defaults to the problem's), ``"n: int64"``, ``"alpha: float32 = 0.5"`` (a scalar's value is an expression
      of problem sizes, default its name); or the mappings of a ``kernel:`` block's ``arguments``.
    * `grid`, `block`, `smem`: the launch, expressions of params, derived values and sizes.
    * `reference`: called with every input and scalar by name; returns the expected output (or a dict output
      name → array). It runs once per input set of the study's pool, and receives float64 NumPy arrays (float32
      when every output is 16 bits wide), unless it has a parameter ``xp`` (then float32 arrays of the module
      passed as ``xp``: CuPy on the GPU) or a parameter annotated ``torch.Tensor`` (then torch tensors of the
      declared dtypes on the GPU, bf16 as ``torch.bfloat16``); see `tuner.kernels.declarative`. It is stored
      with cloudpickle: a function defined in the notebook (or a lambda) is stored by value; a function of an
      importable module is stored by name, so the workers must be able to import that module.
    * `bytes_moved`, `flops`, `tolerance`: see the ``kernel:`` block (defaults: inputs read and outputs written
      once, 0 FLOPs, by dtype).

    Bad input is an InputError (one line) and leaves the directory as it was."""
    return _write_space(KernelSpec(*args, **kwargs))


def _write_space(kernel: KernelSpec) -> SearchSpace:
    """`tune_space` of `kernel`: its files, checked in a scratch directory, then written where it says."""
    name = kernel.name
    if not isinstance(name, str) or not name.isidentifier():
        raise InputError(f"tune: kernel name {name!r} is not an identifier")

    def bad(message: str) -> InputError:
        return InputError(f"tune {name!r}: {message}")

    files = _space_files(kernel, bad)
    # Checked in a scratch directory first (load, and render the default config), so bad input writes nothing.
    _check_in_scratch(name, files, bad)
    target = Path(kernel.directory) if kernel.directory is not None else Path("studies") / name
    _write(target, files, bad)
    return load_space((target / f"{name}.yaml").resolve())


def _space_files(kernel: KernelSpec, bad: Callable[[str], InputError]) -> dict[str, str | bytes]:
    """The files of `kernel`'s space directory, by name: the space file, the template and, with a reference, its
    module and its pickle."""
    import yaml

    name, reference = kernel.name, kernel.reference
    template_text = _template_text(kernel.template, bad)
    plain_params = _plain_params(kernel.params, bad)
    problem = _plain_problem(kernel.problem, bad)
    constraints = [kernel.constraints] if isinstance(kernel.constraints, str) else list(kernel.constraints)
    block_data: dict[str, Any] = {
        "name": name,
        "dtypes": [problem.get("dtype", "float32")],
        "arguments": [_argument(a, bad) for a in kernel.arguments],
        "launch": {"grid": _dims(kernel.grid), "block": _dims(kernel.block), "smem": kernel.smem},
    }
    for key, value in (("bytes", kernel.bytes_moved), ("flops", kernel.flops), ("tolerance", kernel.tolerance)):
        if value is not None:
            block_data[key] = value
    if reference is not None:
        if not callable(reference):
            raise bad(f"reference must be a callable, got {type(reference).__name__}")
        block_data["reference"] = f"{REFERENCE_MODULE}:reference"
    data: dict[str, Any] = {
        "description": f"written by tuner.tune for kernel {name}",
        "kernel": block_data,
        "template": f"{name}.cu.j2",
        "problem": problem,
        "params": plain_params,
    }
    if constraints:
        data["constraints"] = constraints
    if kernel.derived:
        data["derived"] = dict(kernel.derived)
    if kernel.default:
        data["default"] = dict(kernel.default)
    try:
        space_text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=None)
    except yaml.YAMLError as exc:
        raise bad(f"a value cannot be written to a space file: {str(exc).splitlines()[0]}") from None
    files: dict[str, str | bytes] = {f"{name}.yaml": space_text, f"{name}.cu.j2": template_text}
    if reference is not None:
        files[REFERENCE_MODULE] = _REFERENCE_SOURCE.format(name=name)
        files[REFERENCE_PICKLE] = _pickle_reference(reference, bad)
    return files


def _plain_params(params: dict[str, Sequence[Any]], bad) -> dict[str, list[Any]]:
    """`tune_space`'s params as a space file holds them: a list of plain values per name."""
    if not isinstance(params, dict) or not params:
        raise bad("params must be a non-empty dict of name → list of values")
    plain: dict[str, list[Any]] = {}
    for key, values in params.items():
        if isinstance(values, str | bytes) or not isinstance(values, Sequence | range):
            raise bad(f"param {key!r}: expected a list of values, got {type(values).__name__}")
        if not values:
            raise bad(f"param {key!r} has no values")
        plain[key] = [v.item() if hasattr(v, "item") else v for v in values]  # NumPy scalars → YAML
    return plain


def _plain_problem(problem: dict[str, Any], bad) -> dict[str, Any]:
    """`tune_space`'s problem with its dtype checked and a name (from its sizes unless given)."""
    from tuner.kernels.base import DTYPES

    if not isinstance(problem, dict) or not problem:
        raise bad("problem must be a dict of sizes (and dtype, name)")
    problem = dict(problem)
    if problem.get("dtype", "float32") not in DTYPES:
        raise bad(f"problem dtype {problem['dtype']!r}: choose from {', '.join(DTYPES)}")
    sizes = {k: v for k, v in problem.items() if k not in ("name", "dtype")}
    problem.setdefault("name", "_".join(f"{k}{v}" for k, v in sizes.items()) or "problem")
    return problem


def _check_in_scratch(name: str, files: dict[str, str | bytes], bad) -> None:
    """Write `files` into a scratch directory, load the space and render its default config: bad input is an
    InputError in the caller's terms before anything is written where the caller asked."""
    from tuner.build.render import render

    with tempfile.TemporaryDirectory(prefix=f"tuner-tune-{name}-") as scratch:
        for file, content in files.items():
            (Path(scratch) / file).write_bytes(content if isinstance(content, bytes) else content.encode())
        try:
            checked = load_space(Path(scratch) / f"{name}.yaml")
            problem0 = checked.problems[0]
            render(checked.family, checked.default, checked.resolve(checked.default, problem0), problem0.env)
        except TemplateError as exc:
            raise bad(f"template line {exc.line}: {exc.message}" if exc.line else f"template: {exc.message}") from None
        except InputError as exc:  # the line of the scratch space file would mean nothing to the caller
            raise bad(exc.message) from None
        finally:
            _forget_reference(Path(scratch))


def _write(target: Path, files: dict[str, str | bytes], bad) -> None:
    """Put the checked `files` into `target`, each atomically; a reference an earlier call left there goes."""
    from tuner.build.files import atomic_write

    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise bad(f"cannot create {target}: {exc.strerror}") from None
    if REFERENCE_PICKLE not in files and (target / REFERENCE_PICKLE).exists():
        (target / REFERENCE_PICKLE).unlink()  # a reference of an earlier call must not outlive it
    for file, content in files.items():
        atomic_write(target / file, content)
    _forget_reference(target)  # this process loads the reference written now, not one an earlier call imported


def tune(*args: Any, trials: int, **keywords: Any) -> StudyResult | ProblemsResult:
    """Tune kernel `name` in one call, in the spirit of Kernel Tuner's ``tune_kernel``: write its space
    directory (`tune_space`, which documents every argument of `KernelSpec`), then run `study` on it with `trials`
    and the other keywords (sampler, storage, seed, gpus, replay, engine, ...: every keyword of `study`). The study
    is stored like any other (default ``sqlite:///studies/NAME.db``): ``tuner best NAME``, ``tuner export NAME``
    and the dashboard work on it, and calling `tune` again with the same arguments resumes it. A keyword `study`
    does not take is an InputError before anything is written."""
    from tuner.study.options import check_call

    kernel_fields = [f.name for f in dataclasses.fields(KernelSpec)]
    options = {key: value for key, value in keywords.items() if key not in kernel_fields}
    check_call(trials, options, caller="tuner.tune", others=kernel_fields)
    kernel = KernelSpec(*args, **{key: value for key, value in keywords.items() if key in kernel_fields})
    return study(_write_space(kernel), trials, **options)


def _kernel_signatures() -> None:
    """`tune_space`'s and `tune`'s signatures as `inspect` shows them: `KernelSpec`'s fields (and `tune`'s
    `trials` and study keywords)."""
    fields = list(inspect.signature(KernelSpec).parameters.values())
    tune_space.__signature__ = inspect.Signature(fields, return_annotation="SearchSpace")  # type: ignore[attr-defined]
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


def _template_text(template: str | Path, bad) -> str:
    """The template's text: a Path, or a one-line string naming an existing file, is read; any other string is
    the template itself. A Jinja2 syntax error is bad input."""
    import jinja2

    looks_like_path = isinstance(template, Path) or (
        isinstance(template, str) and "\n" not in template and template.endswith((".j2", ".cu", ".cuh", ".jinja"))
    )
    if looks_like_path:
        try:
            text = Path(template).read_text()
        except OSError as exc:
            raise bad(f"template file {str(template)!r}: {exc.strerror}") from None
    elif isinstance(template, str):
        text = template
    else:
        raise bad(f"template must be a string or a path, got {type(template).__name__}")
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise bad(f"template line {exc.lineno}: {exc.message}") from None
    return text


def _dims(spec: str | int | Sequence[str | int]) -> list[str | int]:
    return [spec] if isinstance(spec, str | int) else list(spec)


def _argument(spec: str | dict[str, Any], bad) -> dict[str, Any]:
    """One argument of the ``kernel:`` block from its short form (see `tune_space`); a mapping passes as it is."""
    if isinstance(spec, dict):
        return dict(spec)
    usage = "expected 'NAME: input[SHAPE]', 'NAME: output DTYPE[SHAPE]' or 'NAME: DTYPE [= VALUE]'"
    if not isinstance(spec, str) or ":" not in spec:
        raise bad(f"argument {spec!r}: {usage}")
    arg_name, _, rest = (part.strip() for part in spec.partition(":"))
    array = _ARRAY.fullmatch(rest)
    if array:
        role, dtype, inside = array.groups()
        try:
            text = f"[{inside}]"
            shape = [ast.get_source_segment(text, e) for e in parse_tree(text).body.elts]  # type: ignore[attr-defined]
        except SyntaxError:
            raise bad(f"argument {spec!r}: shape [{inside}] is not a list of expressions") from None
        out: dict[str, Any] = {"name": arg_name, "role": role, "shape": shape}
        if dtype:
            out["dtype"] = dtype
        return out
    scalar = _SCALAR.fullmatch(rest)
    if scalar is None:
        raise bad(f"argument {spec!r}: {usage}")
    dtype, value = scalar.groups()
    out = {"name": arg_name, "role": "scalar", "dtype": dtype}
    if value is not None:
        out["value"] = value.strip()
    return out


def _pickle_reference(reference: Callable[..., Any], bad) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps(reference)
    except Exception as exc:  # whatever the function holds on to may refuse to pickle
        raise bad(f"reference cannot be stored with cloudpickle: {type(exc).__name__}: {exc}".splitlines()[0]) from None


def _forget_reference(directory: Path) -> None:
    """Drop this process's import of the reference module in `directory`, so it is read again when loaded."""
    from tuner.kernels.usercode import user_module_name

    sys.modules.pop(user_module_name((directory / REFERENCE_MODULE).resolve()), None)
