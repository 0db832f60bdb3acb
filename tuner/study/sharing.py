"""One set of workers for several studies run one after another in one command (`tuner.study.shapes` with
``--one-at-a-time``: a study per problem of a space; side by side, they share one pool instead).

Within `shared_workers`, a pool that closes keeps what is costly to start for the next pool instead of stopping
it, and the next pool takes it back: the local engine's GPU worker processes and compile processes, the Ray
engine's GPU actors. So a study after the first starts with its GPUs up and its compilers warm. Each thing is kept
under a key (`keep`) and taken once (`take`); on exit, whatever no pool took is stopped. Outside
`shared_workers`, nothing is kept and pools stop their workers as they close.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["keep", "shared_workers", "take"]

#: key → (what is kept, how to stop it), while `shared_workers` is in force; None outside it. Module state scoped
#: by the ``with`` block of the runner of several studies one after another (`tuner.study.shapes`): the pools of
#: the studies inside it (local and Ray) keep and take through `keep` and `take`
_KEPT: dict[Hashable, tuple[Any, Callable[[], None]]] | None = None


def keep(key: Hashable, value: Any, stop: Callable[[], None]) -> bool:
    """Keep `value` for the next pool that takes `key`; `stop` ends it if none does. False, keeping nothing,
    outside `shared_workers` or when something is kept under `key` already: the caller stops it itself."""
    if _KEPT is None or key in _KEPT:
        return False
    _KEPT[key] = (value, stop)
    return True


def take(key: Hashable) -> Any | None:
    """What is kept under `key`, once (None if nothing is)."""
    if _KEPT is None or key not in _KEPT:
        return None
    return _KEPT.pop(key)[0]


@contextlib.contextmanager
def shared_workers():
    """Keep workers between the pools made within it (module docstring); on exit stop what no pool took."""
    global _KEPT
    outer, _KEPT = _KEPT, {}
    try:
        yield
    finally:
        kept, _KEPT = _KEPT, outer
        for _, stop in kept.values():
            stop()
