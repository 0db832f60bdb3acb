"""What ``tuner study`` starts before it knows its study, handed to the study as one object (`Ahead`).

The command line makes an `Ahead` first thing and starts through it the study's writer process (before it even
builds its parser) and, once its flags allow, the local engine's GPU worker processes, so that their imports, CUDA
contexts and ceilings overlap the study's own imports and set-up. The object goes down with the study
(`tuner.api.study_ahead` → `tuner.study.driver.Driver` → its engine's pool), and each of them takes what it started
(`writer_for`, `take_worker`). A study made without one (the API, tests) gets an empty `Ahead` and starts its
children itself. What no study takes ends with this process (`tuner.build.child`).

This module imports only the writer's module (the standard library and the child's start) at the top: the
command line imports it before anything heavy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tuner.store.writer import Mirror

if TYPE_CHECKING:
    from tuner.gpu.worker import IsolatedEvaluator
    from tuner.study.sharing import Kept

__all__ = ["Ahead"]


@dataclass
class Ahead:
    """Children started ahead of a study: a writer process, not yet told its storage, and GPU workers by GPU
    index, each taken once; and, while studies run one after another (`tuner.study.sharing.shared_workers`), where
    each study's pool keeps its workers for the next (`kept`)."""

    writer: Mirror | None = None
    workers: dict[int, IsolatedEvaluator] = field(default_factory=dict)
    kept: Kept | None = None

    def launch_writer(self) -> None:
        """Start a study writer's process now, before the storage is known, so that its imports (Optuna,
        SQLAlchemy, Alembic: a second or two on a busy host) overlap the driver's own start-up instead of ending
        after it; one is started at most (it exits by itself once its parent is gone)."""
        if self.writer is None:
            self.writer = Mirror(None)

    def writer_for(self, url: str) -> Mirror:
        """A writer for the storage at `url`: the one `launch_writer` started, if it is still running in this
        directory, else a new one (a writer started in another directory would open a relative storage path
        there)."""
        launched, self.writer = self.writer, None
        if launched is not None and launched.proc.alive():
            if launched.cwd == os.getcwd():
                launched.url = url
                return launched
            launched.close(timeout=30.0)
        return Mirror(url)

    def launch_gpu_workers(self, count: int, timeout_s: float = 60.0) -> None:
        """Start the processes of `count` GPU workers now, without waiting for them, so that their interpreter,
        CuPy import, CUDA context and ceiling overlap the driver's own imports and set-up (`take_worker` hands
        them out)."""
        from tuner.gpu.worker import IsolatedEvaluator

        for gpu in range(count):
            if gpu not in self.workers:
                evaluator = IsolatedEvaluator(gpu=gpu, timeout_s=timeout_s)
                evaluator.launch()
                self.workers[gpu] = evaluator

    def take_worker(self, gpu: int) -> IsolatedEvaluator | None:
        """The worker `launch_gpu_workers` started for GPU `gpu`, once (None if there is none)."""
        return self.workers.pop(gpu, None)
