"""What the children of tests/build/test_child.py run: kept apart from the test module, whose imports (Optuna, pytest)
each child would otherwise pay for when it unpickles its target."""

from __future__ import annotations

import os
import sys

from tuner.gpu.protocol import Evaluator


class DiesAtStart(Evaluator):
    """A GPU worker's evaluator that writes lines to stderr and exits with `code` before it is ready."""

    def __init__(self, code: int = 3, lines: int = 30):
        for i in range(lines):
            print(f"noise line {i}", file=sys.stderr)
        print("cannot reach the GPU: no driver in this test", file=sys.stderr, flush=True)
        os._exit(code)


def writer_that_dies(conn, url, parent) -> None:
    """A writer entry that fails at once, as a writer that cannot import its storage's driver would."""
    print("the storage's driver is missing", file=sys.stderr, flush=True)
    raise SystemExit(4)


def slow_reader(conn, delay_s: float) -> None:
    """Reads nothing for `delay_s`, then every message up to ("stop",); answers with their numbers, in order."""
    import time

    time.sleep(delay_s)
    numbers = []
    while (message := conn.recv())[0] != "stop":
        numbers.append(message[0])
    conn.send(numbers)


class HangsAtStart(Evaluator):
    """A GPU worker's evaluator that says where it is stuck, then never gets ready."""

    def __init__(self):
        import time

        print("waiting for a GPU that never frees up", file=sys.stderr, flush=True)
        time.sleep(3600)


def spy_retire(monkeypatch) -> list[bool]:
    """The `kill` flag of each child the isolated worker retires from here on (True: SIGKILLed, not waited for)."""
    kills: list[bool] = []
    from tuner.gpu.worker import IsolatedEvaluator

    retire = IsolatedEvaluator._retire

    def spy(self, kill: bool = False, wait_s: float = 10.0):
        kills.append(kill)
        return retire(self, kill, wait_s)

    monkeypatch.setattr(IsolatedEvaluator, "_retire", spy)
    return kills


class FirstCheck(Evaluator):
    """A GPU worker's evaluator that runs on the host what a first check runs of the family it is sent: its inputs
    and its reference. Answers an Invalid whose reason is ``ok:`` and the names the reference returned, or the
    ReferenceFailed's line."""

    ceiling_tbps = 1.0
    poisoned = False

    def start(self):
        return {"gpu": "fake", "ceiling_tbps": 1.0}

    def evaluate(self, request):
        import numpy as np

        from tuner.build import families
        from tuner.core.result import Invalid
        from tuner.kernels.base import ReferenceFailed

        family = families.get(request.family) if isinstance(request.family, str) else request.family
        env = request.problem
        try:
            expected = family.reference(np, family.inputs(np, env, np.random.default_rng(0)), env)
        except ReferenceFailed as exc:
            return Invalid(reason=str(exc))
        return Invalid(reason="ok: " + ",".join(sorted(expected)))
