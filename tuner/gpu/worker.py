"""Fault containment for callers that are not Ray actors (``tuner bench``, tests): a GPU evaluator in a child.

`IsolatedEvaluator` keeps one child process (`tuner.build.child.start_child`: a fresh interpreter that runs this module,
never the caller's ``__main__``) that owns one GPU and a `tuner.gpu.evaluator.GpuEvaluator`, and sends it work over a
pipe. The child pins its GPU (``CUDA_VISIBLE_DEVICES``) before CuPy touches CUDA, sets up once (context, flush
buffer, copy ceiling: about a second) and stays alive across calls. What a kernel can do to a process stays in
the child:

* it hangs → the child's evaluator gives up its wait for the GPU at the config's deadline
  (`tuner.gpu.deadline`: from the config's expected time, the slowest healthy run so far and the runs asked, at
  least a second, at most ``timeout_s``) and answers `TimedOut`; the child is killed at once and replaced. A
  child that does not answer at all within ``timeout_s`` (the ceiling, which also bounds the host's share of
  the evaluation: inputs, the reference) is killed too, and the call returns `TimedOut`;
* it kills the process (or the driver does) → the call returns `LaunchFailed` ("worker died ...", with the
  child's last lines on stderr in ``details["stderr"]``);
* it poisons the CUDA context (a sticky error such as an illegal address) → the child returns that
  `LaunchFailed` and exits by itself.

In every case the next call starts a fresh child, so one caller can go on evaluating. A child that dies or hangs
while starting raises `WorkerError` with its last lines on stderr (its stderr reaches the caller's ``sys.stderr``
as it is written, `tuner.build.child`). The protocol is tuples over the pipe; what crosses is picklable by
construction: the `tuner.gpu.protocol.EvaluateRequest` with the `Compiled` (cubin bytes and resources), the family's
*name* (or, for a family that is not registered, the Family object itself: its class must be importable by name in
the child, so not one defined in the caller's ``__main__``), the resolved config, the problem's env dict, the seed
and the budget.

    parent → child   ("evaluate", EvaluateRequest)
                     ("ceiling",)   ("stop",)   ("reserve", seed)   ("deadline", Deadline)   ("import", functions)
                     — the last three one way
    child → parent   ("ready", info)   ("result", Result, exiting)   ("value", float)
                     ("error", type name, message, traceback)   — a bug in the child; it then exits

``exiting`` is True when the child's evaluator is poisoned (a sticky error): it leaves right after the reply.

A family's reference modules (`tuner.kernels.base.Family.reference_imports`: a declared kernel's reference, which
may import torch) are imported by the child, never by the caller: `IsolatedEvaluator.import_ahead` tells the child
as soon as it is up, and the child imports them in a thread of its own while the first configs compile, so that
its first check finds them imported.
"""

from __future__ import annotations

import dataclasses
import os
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tuner.build.child import Child, start_child
from tuner.core.errors import InputError
from tuner.core.result import Failure, LaunchFailed, Result, TimedOut
from tuner.gpu.deadline import FLOOR_S, Deadline
from tuner.gpu.protocol import Evaluator

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from tuner.gpu.protocol import EvaluateRequest
    from tuner.kernels.base import Family

# Nothing heavier than the standard library, tuner.build.child, tuner.gpu.deadline and tuner.core.result at this
# module's top: the child imports this module (to unpickle `_child_main`) before it can start its CUDA context, and
# ``tuner study`` imports it to launch the workers; NumPy and the kernel families would add ~0.3 s to both.

__all__ = ["IsolatedEvaluator", "WorkerError"]


class WorkerError(RuntimeError):
    """The child could not start, or raised an exception (a bug, not a property of the config); `remote` holds
    the child's traceback, `stderr` its last lines on stderr where it died or hung without a reply (both are in
    the message). The child is gone; the next call starts a fresh one."""

    def __init__(self, message: str, remote: str = "", stderr: str = ""):
        text = message + (f"\n--- in the GPU worker ---\n{remote}" if remote else "")
        text += f"\n--- the GPU worker's last lines on stderr ---\n{stderr}" if stderr else ""
        super().__init__(text)
        self.remote = remote
        self.stderr = stderr


# ------------------------------------------------------------------------------------------------------------
# the child


def _pin_gpu(gpu: int) -> None:
    """Make physical GPU `gpu` (counted within the parent's CUDA_VISIBLE_DEVICES, if set) the only one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[gpu]
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)


def _error(exc: BaseException) -> tuple[str, str, str, str]:
    return ("error", type(exc).__name__, str(exc), traceback.format_exc())


def _warm_cuda_context() -> None:
    """Create the pinned GPU's primary CUDA context in a thread, through the driver API, while this process
    imports CuPy and NumPy: CuPy's runtime adopts the primary context, so its creation (~0.25 s on an H200 host)
    overlaps the imports instead of following them. The context is retained for the process's life. Any failure
    here is silent: CuPy then creates the context itself and reports what went wrong where it always has."""
    import ctypes
    import threading

    def warm() -> None:
        try:
            cuda = ctypes.CDLL("libcuda.so.1")
            device, context = ctypes.c_int(), ctypes.c_void_p()
            if cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), 0) == 0:
                cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
        except OSError:  # no driver library here: nothing to warm
            pass

    threading.Thread(target=warm, name="tuner-cuda-warm", daemon=True).start()


def _import_ahead(functions) -> None:
    """Import the modules of the user's `functions` (`tuner.kernels.usercode.UserFunction`) in a daemon thread, and
    return at once. The import holds `usercode`'s import lock, so a check that needs the function meanwhile waits
    for it rather than importing it again. A module that fails to import is left out of ``sys.modules``: the first
    check imports it again, and its failure is said there, in one line, as it would be without this."""
    import threading

    def run() -> None:
        for function in functions:
            try:
                function.resolve()
            except Exception:  # noqa: BLE001 - said at the first check, which imports the module again
                pass

    threading.Thread(target=run, name="tuner-import-ahead", daemon=True).start()


def _child_main(conn, gpu: int, factory: Callable[..., Any] | None, kwargs: dict[str, Any]) -> None:
    """The child's loop. `factory(**kwargs)` builds the evaluator (default: GpuEvaluator on the pinned GPU);
    it is a `tuner.gpu.protocol.Evaluator` that offers ceiling_tbps too."""
    entered_at = time.perf_counter()
    _pin_gpu(gpu)  # before anything imports CuPy or touches CUDA
    if factory is None:
        _warm_cuda_context()
    try:
        if factory is None:
            from tuner.gpu.evaluator import GpuEvaluator

            evaluator = GpuEvaluator(0, gpu_index=gpu, **kwargs)
        else:
            evaluator = factory(**kwargs)
        info = evaluator.start()
        if isinstance(info.get("startup"), dict):
            info["startup"] = {"entered_at": entered_at, **info["startup"]}
    except Exception as exc:
        conn.send(_error(exc))
        return
    conn.send(("ready", info))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        except Exception as exc:  # a request that does not unpickle here (a family it cannot import)
            conn.send(_error(exc))
            return
        op = message[0]
        if op == "stop":
            return
        if op == "reserve":  # one way: no reply
            evaluator.reserve(message[1])
            continue
        if op == "deadline":  # one way: no reply
            evaluator.set_deadline(message[1])
            continue
        if op == "import":  # one way: no reply
            _import_ahead(message[1])
            continue
        try:
            if op == "evaluate":
                result = evaluator.evaluate(message[1])
                reply: tuple = ("result", result, bool(evaluator.poisoned))
            elif op == "ceiling":
                reply = ("value", evaluator.ceiling_tbps)
            else:
                raise ValueError(f"unknown request {op!r}")
            conn.send(reply)
        except Exception as exc:  # a bug (or an unpicklable result): report it, and leave
            conn.send(_error(exc))
            return
        if evaluator.poisoned:
            # The CUDA context is lost: leave without running CuPy's destructors against it.
            conn.close()
            os._exit(0)


# ------------------------------------------------------------------------------------------------------------
# the parent


class IsolatedEvaluator(Evaluator):
    """A GpuEvaluator in a child process; see the module docstring.

    `timeout_s` bounds one evaluation (the child's start-up, bounded by `start_timeout_s`, is not part of it);
    within it, the GPU's execution of the config is bounded by a `tuner.gpu.deadline.Deadline` told to every child:
    that ceiling, `floor_s`, and `slowest_s`, the slowest healthy run the caller has seen (`note_healthy`;
    every Measurement this evaluator returns counts).
    `evaluator_factory` (a picklable callable, default GpuEvaluator) and `evaluator_kwargs` build the child's
    evaluator: tests inject a fake one to exercise the fault handling without a GPU. Implements
    `tuner.gpu.protocol.Evaluator`.
    """

    measures = True

    def __init__(
        self,
        gpu: int = 0,
        timeout_s: float = 30.0,
        *,
        start_timeout_s: float = 180.0,
        evaluator_factory: Callable[..., Any] | None = None,
        evaluator_kwargs: dict[str, Any] | None = None,
        floor_s: float = FLOOR_S,
    ):
        self.gpu = gpu
        self.timeout_s = timeout_s
        self.floor_s = floor_s
        self.slowest_s = 0.0  # the slowest healthy run seen (`note_healthy`): it lengthens the deadline
        self._deadline: Deadline | None = None  # the last one told to the child
        self.start_timeout_s = start_timeout_s
        self.evaluator_factory = evaluator_factory
        self.evaluator_kwargs = dict(evaluator_kwargs or {})
        self.info: dict[str, Any] = {}
        self.restarts = 0  # children started after the first
        self.poisoned = False  # never: a poisoned child is replaced (the attribute mirrors GpuEvaluator's)
        self._proc: Child | None = None
        self._conn: Connection | None = None
        self._children = 0
        self._dying: list[Child] = []  # retired children still releasing their GPU context
        self._reserved: int | None = None  # the seed told to every child (`reserve`)
        self._imports: tuple = ()  # the reference functions every child imports ahead (`import_ahead`)

    # -- child life -----------------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.alive()

    def keepable(self) -> bool:
        """A child that is up and started is worth keeping for the next study."""
        return self.alive() and bool(self.info)

    def launch(self) -> None:
        """Start the child's process if none is running, without waiting for it to set up (`start` waits): a
        caller that knows early that it will need the GPU starts it before its own imports and set-up."""
        if self.alive():
            return
        self._retire(wait_s=1.0)
        self._bury(wait_s=30.0)  # a retired child's context must be gone before a new one is made
        proc = start_child(
            _child_main, (self.gpu, self.evaluator_factory, self.evaluator_kwargs), name=f"tuner-gpu{self.gpu}"
        )
        self._proc, self._conn = proc, proc.conn
        if self._children:
            self.restarts += 1
        self._children += 1
        self.info = {}

    def start(self) -> dict[str, Any]:
        """Start the child if none is running (or take the one `launch` started); wait until it is set up and
        return its info (GPU name, arch, ceiling, versions, ...)."""
        if self.info and self.alive():
            return self.info
        self.launch()
        parent_conn, proc = self._conn, self._proc
        assert parent_conn is not None and proc is not None
        who = f"GPU worker for GPU {self.gpu}"
        if not parent_conn.poll(self.start_timeout_s):
            self._retire(kill=True)
            stderr = proc.stderr_tail()
            raise WorkerError(f"{who} did not start within {self.start_timeout_s:g} s", stderr=stderr)
        try:
            reply = parent_conn.recv()
        except (EOFError, OSError):
            code = self._retire()
            stderr = proc.stderr_tail()
            last = stderr.splitlines()[-1].strip() if stderr else "it wrote nothing to stderr"
            raise WorkerError(f"{who} died while starting (exit code {code}): {last}", stderr=stderr) from None
        if reply[0] != "ready":
            self._retire()
            raise WorkerError(f"{who} failed to start: {reply[1]}: {reply[2]}", reply[3])
        self.info = reply[1]
        if self._imports:  # first: the child starts importing before it reads anything else
            parent_conn.send(("import", self._imports))
        if self._reserved is not None:  # a replacement child hears what its predecessor was told
            parent_conn.send(("reserve", self._reserved))
        if self._deadline is not None:
            parent_conn.send(("deadline", self._deadline))
        return self.info

    def note_healthy(self, seconds: float) -> None:
        """A healthy run of `seconds` was measured in this study (here or on another GPU): later deadlines allow
        for one as slow."""
        self.slowest_s = max(self.slowest_s, seconds)

    def _tell_deadline(self, ceiling_s: float) -> None:
        """Tell the child the deadline for the next evaluation, if it changed (a new child hears it at start)."""
        deadline = Deadline(ceiling_s=ceiling_s, slowest_s=self.slowest_s, floor_s=self.floor_s)
        if deadline == self._deadline:
            return
        self._deadline = deadline
        self._tell(("deadline", deadline))

    def import_ahead(self, family: Family) -> None:
        """Have the child import `family`'s reference modules (`Family.reference_imports`) now, in a thread of its
        own, so that its first check does not wait for them; a child that is not up yet, and every child that
        replaces it, is told as it starts. Imports nothing here, in the caller."""
        imports = tuple(family.reference_imports())
        if imports:
            self._imports = imports
            self._tell(("import", imports))

    def reserve(self, seed: int) -> None:
        """GpuEvaluator.reserve in the child (and in every child that replaces it)."""
        self._reserved = seed
        self._tell(("reserve", seed))

    def _tell(self, message: tuple) -> None:
        """Send a one-way message to a child that is up; a child not up yet, or gone, hears it from `start`."""
        if self.info and self.alive() and self._conn is not None:
            try:
                self._conn.send(message)
            except OSError:
                pass  # the child is gone; its replacement is told at its start

    def _retire(self, kill: bool = False, wait_s: float = 10.0) -> int | None:
        """Forget the current child (SIGKILL it first if `kill`) and return its exit code. A child that has
        not exited within `wait_s` (the driver is still tearing down its context, e.g. stopping a hung kernel)
        is left to `_bury`, which the next start runs before creating a new context."""
        proc = self._proc
        self._proc = self._conn = None
        if proc is None:
            return None
        proc.close()
        if kill:
            proc.kill()
        code = proc.join(wait_s)
        if code is None:
            self._dying.append(proc)
        return code

    def _bury(self, wait_s: float) -> None:
        """Wait for retired children to exit, killing those that outlive `wait_s`."""
        for proc in self._dying:
            if proc.join(wait_s) is None:
                proc.kill()
                proc.join(wait_s)
        self._dying = [proc for proc in self._dying if proc.exitcode is None]

    def close(self) -> None:
        """Stop the child (politely, then by force)."""
        if self._conn is not None and self.alive():
            try:
                self._conn.send(("stop",))
            except OSError:
                pass  # already gone
        self._retire(wait_s=5.0)
        self._bury(wait_s=5.0)

    def __enter__(self) -> IsolatedEvaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the child is ended at exit anyway (tuner.build.child)
            pass

    # -- requests -------------------------------------------------------------------------------------------
    def _connection(self) -> Connection:
        """The pipe to the child, starting one if none is running."""
        self.start()
        assert self._conn is not None  # start() leaves a running child and its pipe, or raises
        return self._conn

    def _request(self, message: tuple, timeout_s: float) -> tuple | Failure:
        """Send one request; the reply tuple, or the TimedOut / LaunchFailed that replaced a lost child."""
        conn = self._connection()
        try:
            conn.send(message)
        except OSError:  # the child left while idle: nothing of this request ran, so start afresh and resend
            self._retire()
            conn = self._connection()
            conn.send(message)
        if not conn.poll(timeout_s):
            self._retire(kill=True, wait_s=2.0)
            return TimedOut(
                reason=f"no answer from the GPU worker within {timeout_s:g} s (a hung kernel?); "
                "worker killed and replaced",
                details={"timeout_s": timeout_s},
            )
        try:
            reply = conn.recv()
        except (EOFError, OSError):
            proc = self._proc
            code = self._retire()
            stderr = proc.stderr_tail() if proc is not None else ""
            return LaunchFailed(
                reason=f"worker died (exit code {code}) during the request; replaced",
                details={"exitcode": code, "sticky": False, "worker_died": True, "stderr": stderr},
            )
        if reply[0] == "error":
            self._retire()
            raise WorkerError(f"GPU worker raised {reply[1]}: {reply[2]}", reply[3])
        return reply

    def _family_ref(self, family: Family | str) -> Family | str:
        """A family that `tuner.build.families.get` resolves (shipped, registered, or defined by a space file)
        crosses by its reference; any other Family crosses pickled, which needs its class importable by name in the
        child: one defined in the caller's ``__main__`` is an InputError here, not an unpickling error there."""
        if isinstance(family, str):
            return family
        from tuner.build import families

        ref = family.ref or family.name
        try:
            if families.get(ref) is family:
                return ref
        except (KeyError, InputError):
            pass
        if type(family).__module__ == "__main__":
            raise InputError(
                f"family {family.name!r}: its class {type(family).__qualname__} is defined in __main__ (a script or "
                "a notebook cell), which the GPU worker cannot import; define it in a module, or name it in a space "
                "file (family: FILE.py:CLASS)"
            )
        return family

    def evaluate(self, request: EvaluateRequest, timeout_s: float | None = None) -> Result:
        """GpuEvaluator.evaluate in the child, bounded by `timeout_s` (default: the instance's). The request
        crosses with its family as a reference where it has one and its problem as an env dict."""
        problem_env = dict(getattr(request.problem, "env", request.problem))
        family_ref = self._family_ref(request.family)
        sent = dataclasses.replace(request, family=family_ref, config=dict(request.config), problem=problem_env)
        ceiling_s = self.timeout_s if timeout_s is None else timeout_s
        self._tell_deadline(ceiling_s)
        reply = self._request(("evaluate", sent), ceiling_s)
        if not isinstance(reply, tuple):
            return reply
        _, result, exiting = reply
        if isinstance(result, TimedOut):
            # Its kernel still runs and its process cannot end until the driver stops it: killed now, and left
            # to exit while the next call starts (whose start-up, not deadline, waits for it: `launch`).
            self._retire(kill=True, wait_s=0.5)
        elif exiting:  # the child leaves by itself after a sticky error; the next call starts a fresh one
            self._retire(wait_s=2.0)
        elif result.ok:
            self.note_healthy(result.p80_ms / 1e3)
        return result

    def ceiling(self) -> float:
        """The child's device-to-device copy ceiling in TB/s (measured once per child, at start)."""
        reply = self._request(("ceiling",), self.timeout_s)
        if not isinstance(reply, tuple):
            raise WorkerError(f"GPU worker lost while reading the ceiling: {reply.reason}")
        return float(reply[1])

    @property
    def arch(self) -> str:
        """The child's GPU arch (``sm_90``), what to compile for."""
        return self.start()["arch"]
