"""A kernel of the caller's as a space directory: `KernelSpec` (what `tuner.tune` and `tune_space` take) and
`tune_space`, which writes it (a declarative space file, the template, the reference) and loads it.

Bad input is an InputError of one line and writes nothing: the files are checked in a scratch directory first
(loaded, and the default config rendered). The face (`tuner.api`) re-exports both; `tuner.tune` is this plus a
study.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any

from tuner.core.errors import InputError, TemplateError
from tuner.expr import parse_tree
from tuner.space.space import SearchSpace
from tuner.space.space import load as load_space

__all__ = ["KernelSpec", "tune_space", "write_space"]

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
    return write_space(KernelSpec(*args, **kwargs))


def write_space(kernel: KernelSpec) -> SearchSpace:
    """`tune_space` of `kernel`: its files, checked in a scratch directory, then written where it says."""
    name = kernel.name
    from tuner.kernels.plain import C_IDENTIFIER, C_IDENTIFIER_RULE

    if not isinstance(name, str) or not C_IDENTIFIER.fullmatch(name):
        raise InputError(f"tune: kernel name {name!r} is not a C identifier ({C_IDENTIFIER_RULE})")

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


tune_space.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    list(inspect.signature(KernelSpec).parameters.values()), return_annotation="SearchSpace"
)
