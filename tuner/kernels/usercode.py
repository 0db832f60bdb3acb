"""Running the user's code, by the user's choice: importing a family's or a reference's module from a space's folder
(or the environment), and calling it so that a fault in it is an InputError naming the user's file and line.

A space file's family (`tuner.kernels.custom`) and a declarative block's reference (`tuner.kernels.declarative`)
both go through here.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import traceback
from pathlib import Path

from tuner import kernels
from tuner.errors import InputError
from tuner.kernels.base import ReferenceFailed


def import_user(target: str, directory: Path, fail, key: str):
    """Import FILE.py (relative to `directory`) or a dotted module (from `directory` first, then the
    environment). Runs the user's code; a failure is a one-line InputError naming their file and line."""
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
