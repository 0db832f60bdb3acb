"""One set of workers for several studies run one after another in one command (`tuner.study.shapes` with
``--one-at-a-time``: a study per problem of a space; side by side, they share one pool instead).

Given a `Kept` (made by `shared_workers`), a pool that closes keeps what is costly to start for the next pool
instead of stopping it, and the next pool takes it back: the local engine's GPU worker processes and compile
processes, the Ray engine's GPU actors. So a study after the first starts with its GPUs up and its compilers warm.
Each thing is kept under a key (`Kept.keep`) and taken once (`Kept.take`); on exit, whatever no pool took is
stopped. A pool given no `Kept` stops its workers as it closes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from typing import Any

__all__ = ["Kept", "shared_workers"]


class Kept:
    """Workers a closing pool keeps for the next pool of the same command, each under a key and taken once. The
    runner of studies one after another makes one (`shared_workers`) and hands it down with the study's
    `tuner.study.ahead.Ahead` to each pool; a pool given none stops its workers as it closes."""

    def __init__(self) -> None:
        self._kept: dict[Hashable, tuple[Any, Callable[[], None]]] = {}

    def keep(self, key: Hashable, value: Any, stop: Callable[[], None]) -> bool:
        """Keep `value` for the next pool that takes `key`; `stop` ends it if none does. False, keeping nothing,
        when something is kept under `key` already: the caller stops it itself."""
        if key in self._kept:
            return False
        self._kept[key] = (value, stop)
        return True

    def take(self, key: Hashable) -> Any | None:
        """What is kept under `key`, once (None if nothing is)."""
        kept = self._kept.pop(key, None)
        return None if kept is None else kept[0]

    def stop(self) -> None:
        """Stop whatever no pool took."""
        kept, self._kept = self._kept, {}
        for _, stop in kept.values():
            stop()


@contextlib.contextmanager
def shared_workers() -> Iterator[Kept]:
    """A `Kept` for the pools made within it (module docstring); on exit, what no pool took is stopped."""
    kept = Kept()
    try:
        yield kept
    finally:
        kept.stop()
