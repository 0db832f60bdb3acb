"""Running the user's code, by the user's choice: importing a family's or a reference's module from a space's folder
(or the environment), and calling it so that a fault in it is an InputError naming the user's file and line.

A space file's family (`tuner.kernels.custom`) and a declarative block's reference (found by
`tuner.kernels.kernelblock`, called by `tuner.kernels.declarative`) both go through here.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from tuner import kernels
from tuner.core.errors import InputError
from tuner.kernels.base import ReferenceFailed

#: One import of a user's module at a time: the GPU worker's threads that compute references ahead call the same
#: reference at once, and a second caller must not take the module from sys.modules before it has run.
_IMPORT_LOCK = threading.RLock()


def import_user(target: str, directory: Path, fail, key: str):
    """Import FILE.py (relative to `directory`) or a dotted module (from `directory` first, then the
    environment). Runs the user's code; a failure is a one-line InputError naming their file and line.
    Thread-safe: concurrent callers get the module once it has run."""
    with _IMPORT_LOCK:
        return _import_user(target, directory, fail, key)


def _import_user(target: str, directory: Path, fail, key: str):
    if target.endswith(".py"):
        file = (directory / target).resolve()
        if not file.is_file():
            raise fail(f"{target} not found next to the space ({directory})", key)
        name = user_module_name(file)
        if name in sys.modules:
            return sys.modules[name]
        _on_path(directory)  # so the file may import its neighbours
        spec = importlib.util.spec_from_file_location(name, file)
        if spec is None or spec.loader is None:
            raise fail(f"{target} cannot be imported as a Python module", key)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # user code: SyntaxError, ImportError, SystemExit ...
            del sys.modules[name]
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise user_error(exc, f"{target} does not import", directory) from None
        return module
    if not all(part.isidentifier() for part in target.split(".")):
        raise fail(f"{target!r} is neither FILE.py nor a dotted module name", key)
    _on_path(directory)
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and target.startswith(exc.name):
            raise fail(f"no module {target!r} in {directory} or the environment", key) from None
        raise user_error(exc, f"{target} does not import", directory) from None
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise user_error(exc, f"{target} does not import", directory) from None


def user_module_name(file: Path) -> str:
    """The name in `sys.modules` under which `import_user` keeps the user's file `file` (an absolute path)."""
    return f"tuner_user_{file.stem}_{hashlib.sha256(str(file).encode()).hexdigest()[:12]}"


def _on_path(directory: Path) -> None:
    if str(directory) not in sys.path:
        sys.path.insert(0, str(directory))


def user_error(exc: BaseException, what: str, directory: Path) -> InputError:
    """One line: the innermost frame of the user's code (file:line) and the exception."""
    where, line = _user_frame(exc, directory)
    return InputError(f"{what}: {type(exc).__name__}: {exc}".splitlines()[0], where, line)


def _user_frame(exc: BaseException, directory: Path | None) -> tuple[str | None, int | None]:
    if isinstance(exc, SyntaxError) and exc.filename:
        return exc.filename, exc.lineno
    where, line = None, None
    for frame in traceback.extract_tb(exc.__traceback__):
        inside_tuner = Path(frame.filename).resolve().is_relative_to(Path(kernels.__file__).resolve().parents[1])
        if not inside_tuner and "importlib" not in frame.filename:
            where, line = frame.filename, frame.lineno
    return where, line


def guarded(fn, what: str, directory: Path | None, *args, **kwargs):
    """Call a user's reference; any exception it raises becomes ReferenceFailed (a failed trial, not a crash)."""
    try:
        return fn(*args, **kwargs)
    except ReferenceFailed:
        raise
    except Exception as exc:  # user code
        where, line = _user_frame(exc, directory)
        at = f" ({where}:{line})" if where else ""
        raise ReferenceFailed(f"{what} raised {type(exc).__name__}: {exc}{at}".splitlines()[0]) from exc


# ---------------------------------------------------------------------------------------------------------------
# a user's function named now, imported where it runs


class UserFunction:
    """A function a space file names (``FILE.py:function`` or ``module:function``), read without importing its
    module: `find` parses the module's source, so loading a space runs none of the user's code (their module may
    import torch, or need a GPU). Its module is imported at the first call, where the function runs (the GPU
    worker); a module that then fails to import raises ReferenceFailed naming their file and line.

    `signature` is a stand-in with the function's parameters (annotations as strings, defaults as None), or None
    where the source does not show a plain ``def`` (an assignment, a re-export): then nothing is checked ahead."""

    def __init__(self, spec: str, target: str, attr: str, directory: Path, signature):
        self.spec, self.target, self.attr, self.directory = spec, target, attr, directory
        self.signature = signature
        self._fn = None

    def resolve(self):
        """The function itself, its module imported on the first call (the user's code runs)."""
        if self._fn is None:

            def fail(message: str, *_keys):
                return ReferenceFailed(f"{self.spec}: {message}")

            try:
                module = import_user(self.target, self.directory, fail, self.spec)
            except InputError as exc:
                raise ReferenceFailed(str(exc)) from None
            fn = getattr(module, self.attr, None)
            if not callable(fn):
                raise ReferenceFailed(f"{self.spec}: {self.target} has no function {self.attr!r}")
            self._fn = fn
        return self._fn

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)

    def __getstate__(self):  # the imported function stays behind: another process imports it where it runs
        return {**self.__dict__, "_fn": None}


def find(spec: Any, directory: Path, fail, what: str, *keys) -> UserFunction:
    """The function `spec` (``FILE.py:function`` or ``module:function``) names, found in its module's source
    without importing it. `fail(message, *keys)` makes the error that names the space file and the line of `keys`;
    a module
    whose source does not parse is an InputError naming its file and line."""
    import ast

    if not isinstance(spec, str) or ":" not in spec:
        raise fail(f"{what} expects FILE.py:function or module:function", *keys)
    target, _, attr = spec.rpartition(":")
    if not target or not attr.isidentifier():
        raise fail(f"{what} {spec!r}: expected FILE.py:function or module:function", *keys)
    file = _source_file(target, directory, fail, *keys)
    if file is None:  # a module with no Python source (compiled, built in): read when it runs
        return UserFunction(spec, target, attr, directory, None)
    try:
        tree = ast.parse(file.read_bytes(), filename=str(file))
    except SyntaxError as exc:
        raise user_error(exc, f"{target} does not import", directory) from None
    except (OSError, ValueError) as exc:
        raise fail(f"{what} {spec!r}: {target} cannot be read: {exc}", *keys) from None
    node, bound = None, False
    for statement in tree.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef) and statement.name == attr:
            node, bound = statement, True
        elif _binds(statement, attr):
            node, bound = None, True
    if not bound:
        raise fail(f"{what} {spec!r}: {target} has no function {attr!r}", *keys)
    return UserFunction(spec, target, attr, directory, None if node is None else _stand_in(node))


def _binds(statement, name: str) -> bool:
    """Whether a module-level `statement` may bind `name` other than by ``def`` (so the source cannot tell)."""
    import ast

    if isinstance(statement, ast.Import | ast.ImportFrom):
        return any(alias.name == "*" or (alias.asname or alias.name).split(".")[0] == name for alias in statement.names)
    if isinstance(statement, ast.ClassDef):
        return statement.name == name
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
        return statement.name == "__getattr__"
    if isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign | ast.If | ast.Try | ast.With):
        return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(statement))
    return False


def _stand_in(node):
    """A function with `node`'s parameters and nothing else (annotations as their source text, defaults None): a
    signature to bind names against without running the user's code."""
    import ast
    import inspect

    arguments = node.args
    none = ast.Constant(None)
    for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg):
        if argument is not None and argument.annotation is not None:
            argument.annotation = ast.Constant(ast.unparse(argument.annotation))
    arguments.defaults = [none for _ in arguments.defaults]
    arguments.kw_defaults = [None if d is None else none for d in arguments.kw_defaults]
    stub = ast.FunctionDef(name="stand_in", args=arguments, body=[ast.Pass()], decorator_list=[], returns=None)
    module = ast.fix_missing_locations(ast.Module(body=[stub], type_ignores=[]))
    namespace: dict[str, Any] = {}
    exec(compile(module, "<signature>", "exec"), namespace)  # our stub only: parameters, no body, no defaults
    return inspect.signature(namespace["stand_in"])


def _source_file(target: str, directory: Path, fail, *keys) -> Path | None:
    """The Python source of FILE.py (beside the space) or of a dotted module (the space's folder first, then
    the environment), found without importing it or its packages; None for a module with no Python source."""
    from importlib.machinery import PathFinder

    if target.endswith(".py"):
        file = (directory / target).resolve()
        if not file.is_file():
            raise fail(f"{target} not found next to the space ({directory})", *keys)
        return file
    parts = target.split(".")
    if not all(part.isidentifier() for part in parts):
        raise fail(f"{target!r} is neither FILE.py nor a dotted module name", *keys)
    if parts[0] in sys.builtin_module_names:
        return None
    path: list[str] | None = [str(directory), *sys.path]
    spec = None
    for i in range(len(parts)):
        spec = PathFinder.find_spec(".".join(parts[: i + 1]), path)
        if spec is None:
            raise fail(f"no module {target!r} in {directory} or the environment", *keys)
        path = list(spec.submodule_search_locations or [])
    origin = spec.origin if spec is not None else None
    return Path(origin) if origin and origin.endswith(".py") else None
