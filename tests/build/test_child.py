"""The driver's children (`tuner.build.child`: the GPU workers, the study's writer) start from wherever a user calls
tuner — a plain script without a main guard, ``python -`` on standard input, IPython, pytest — and never run the
caller's ``__main__``; one that dies says why with its last lines on stderr, which also reach the caller's
stderr as they are written. Real child processes on CPU: a replay study (its writer process) and a GPU worker
whose evaluator answers from the H200 recording."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
from multiprocessing.connection import Connection
from pathlib import Path

import optuna
import pytest

from tests.child_helpers import DiesAtStart, HangsAtStart, slow_reader, writer_that_dies
from tuner.build import child as child_mod
from tuner.core.errors import InputError
from tuner.gpu.worker import IsolatedEvaluator, WorkerError
from tuner.store.writer import Mirror

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"
TRIALS = 8

#: What a user writes: no main guard, a study (its writer is a child), then a GPU worker of its own, so both kinds of
#: child start from the form under test. The worker's evaluator is made of built-ins (its child imports nothing
#: more than a GPU worker's does before CuPy). Children that ran this again would print the marker twice (their
#: stdout is the caller's).
SCRIPT = f"""\
import functools, os, types
import tuner
from tuner.gpu.worker import IsolatedEvaluator

print("the script ran", flush=True)
stand_in = functools.partial(types.SimpleNamespace, start=functools.partial(dict, gpu="stand-in"), ceiling_tbps=4.0)
worker = IsolatedEvaluator(evaluator_factory=stand_in)
worker.launch()  # its start overlaps the study's
result = tuner.study("transpose", trials={TRIALS}, seed=1, replay={str(RECORDING)!r}, storage="sqlite:///study.db")
info = worker.start()
assert worker.pid != os.getpid() and worker.ceiling() == 4.0
worker.close()
print("done", result.summary["trials"], info["gpu"], flush=True)
"""


@pytest.fixture(scope="module")
def forms_cache(tmp_path_factory) -> Path:
    """One tuner cache for the four forms (never ~/.cache): the first lists the transpose space's valid set
    (seconds of CPU), the others find the listing, as a user's second run would."""
    return tmp_path_factory.mktemp("forms-cache")


def _run(
    argv: list[str], cwd: Path, stdin: str | None = None, env: dict[str, str] | None = None, cache: Path | None = None
) -> subprocess.CompletedProcess:
    """`argv` in `cwd`, with this tuner on its path and nothing written under the home directory."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TUNER_CACHE_DIR": str(cache or cwd / "cache"),
        "IPYTHONDIR": str(cwd / "ipython"),
        **(env or {}),
    }
    return subprocess.run(argv, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=120, env=env)


def _check(proc: subprocess.CompletedProcess, db: Path) -> None:
    """Exit 0, the script's body ran once, the study's trials are stored, no leaked resources reported."""
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("the script ran") == 1, proc.stdout
    assert f"done {TRIALS} stand-in" in proc.stdout, proc.stdout
    (summary,) = optuna.get_all_study_summaries(f"sqlite:///{db}")
    trials = optuna.load_study(study_name=summary.study_name, storage=f"sqlite:///{db}").trials
    assert len(trials) == TRIALS and all(t.state.is_finished() for t in trials)
    assert "leaked" not in proc.stderr and "bootstrapping phase" not in proc.stderr, proc.stderr[-3000:]


def test_a_plain_script_without_a_main_guard(tmp_path, forms_cache):
    (tmp_path / "tune_it.py").write_text(SCRIPT)
    _check(_run([sys.executable, "tune_it.py"], tmp_path, cache=forms_cache), tmp_path / "study.db")


def test_a_script_on_standard_input(tmp_path, forms_cache):
    _check(_run([sys.executable, "-"], tmp_path, stdin=SCRIPT, cache=forms_cache), tmp_path / "study.db")


@pytest.mark.skipif(importlib.util.find_spec("IPython") is None, reason="IPython is not installed")
def test_ipython(tmp_path, forms_cache):
    # A notebook's kernel runs the same IPython shell: its __main__ is the shell's namespace, with no file.
    argv = [sys.executable, "-m", "IPython", "--no-banner", "--colors=nocolor", "--quick", "-c", SCRIPT]
    _check(_run(argv, tmp_path, cache=forms_cache), tmp_path / "study.db")


def test_pytest(tmp_path, forms_cache):
    body = textwrap.indent(SCRIPT, "    ")
    (tmp_path / "test_generated.py").write_text(f"def test_study():\n{body}")
    # -s: the marker printed by the test reaches this process's stdout, as a script's does
    argv = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "test_generated.py"]
    proc = _run(argv, tmp_path, env={"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}, cache=forms_cache)
    _check(proc, tmp_path / "study.db")


# ------------------------------------------------------------------------------------------------------------
# a child that dies says why


def test_a_gpu_worker_that_dies_while_starting_raises_with_its_stderr(capsys):
    evaluator = IsolatedEvaluator(evaluator_factory=DiesAtStart, evaluator_kwargs={"code": 3}, start_timeout_s=60.0)
    with pytest.raises(WorkerError) as info:
        evaluator.start()
    error = info.value
    first = str(error).splitlines()[0]
    assert (
        first == "GPU worker for GPU 0 died while starting (exit code 3): cannot reach the GPU: no driver in this test"
    )
    lines = error.stderr.splitlines()
    assert lines[-1] == "cannot reach the GPU: no driver in this test" and lines[-2] == "noise line 29"
    assert len(lines) <= child_mod.TAIL_LINES and len(error.stderr) <= child_mod.TAIL_BYTES
    assert error.stderr in str(error)
    # ... and the whole of it reached this process's stderr as the child wrote it
    relayed = capsys.readouterr().err
    assert "noise line 0\n" in relayed and "cannot reach the GPU" in relayed
    assert not evaluator.alive()
    evaluator.close()


def test_a_gpu_worker_that_hangs_while_starting_is_killed_and_says_where_it_was():
    evaluator = IsolatedEvaluator(evaluator_factory=HangsAtStart, start_timeout_s=4.0)
    with pytest.raises(WorkerError, match=r"did not start within 4 s") as info:
        evaluator.start()
    assert info.value.stderr == "waiting for a GPU that never frees up"
    assert not evaluator.alive()


def test_a_worker_whose_factory_cannot_be_imported_names_the_import_error(tmp_path, monkeypatch):
    # A module that imports here and refuses to in any other process: the child dies unpickling the factory.
    (tmp_path / "here_only.py").write_text(
        f"import os\nif os.getpid() != {os.getpid()}:\n    raise ImportError('here_only loads in its parent alone')\n"
        "class Factory:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from here_only import Factory  # type: ignore[import-not-found]

    with pytest.raises(WorkerError) as info:
        IsolatedEvaluator(evaluator_factory=Factory, start_timeout_s=60.0).start()
    assert str(info.value).splitlines()[0].endswith("(exit code 1): ImportError: here_only loads in its parent alone")


def test_a_factory_on_a_path_added_at_run_time_reaches_the_child(tmp_path, monkeypatch):
    (tmp_path / "runtime_factory.py").write_text(
        "import os\nclass Factory:\n    def start(self):\n        return {'arch': 'sm_90', 'pid': os.getpid()}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from runtime_factory import Factory  # type: ignore[import-not-found]

    with IsolatedEvaluator(evaluator_factory=Factory, start_timeout_s=60.0) as evaluator:
        assert evaluator.start()["pid"] == evaluator.pid != os.getpid()


def test_a_writer_that_dies_says_why(tmp_path):
    mirror = Mirror(f"sqlite:///{tmp_path}/w.db", target=writer_that_dies)
    assert mirror.proc.join(60) == 4
    with pytest.raises(RuntimeError, match="exited with code 4; nothing more can be recorded") as info:
        mirror.check()
    assert str(info.value).endswith("last lines on stderr ---\nthe storage's driver is missing")
    with pytest.raises(RuntimeError, match="(?s)study writer exited with code 4\n.*driver is missing"):
        mirror.close(timeout=10)


def test_a_family_defined_in_main_is_refused_before_it_reaches_the_worker():
    """Its class cannot be imported by name in the child (which never runs the caller's __main__): bad input,
    said in the caller, rather than an unpickling error from the worker."""
    from tuner.kernels.base import Family

    local = type("Local", (Family,), {"name": "local", "template": "local.cu.j2", "__module__": "__main__"})
    with pytest.raises(InputError, match=r"family 'local': its class Local is defined in __main__"):
        IsolatedEvaluator()._family_ref(local())


# ------------------------------------------------------------------------------------------------------------
# the mechanism


def test_a_connection_wraps_an_inherited_file_descriptor():
    """The child rebuilds its end of the pipe as ``Connection(fd)``: the constructor `multiprocessing.Pipe` uses
    on POSIX, not described by the documentation. This fails if it stops taking a descriptor."""
    import multiprocessing

    parent, child = multiprocessing.Pipe(duplex=True)
    rebuilt = Connection(os.dup(child.fileno()))
    child.close()
    parent.send(("hello", [1, 2]))
    assert rebuilt.recv() == ("hello", [1, 2])
    rebuilt.send("back")
    assert parent.recv() == "back"
    rebuilt.close()
    assert parent.poll(5)
    with pytest.raises(EOFError):
        parent.recv()


def test_arguments_that_do_not_pickle_raise_before_a_process_starts(monkeypatch):
    import threading

    started = []
    monkeypatch.setattr(child_mod.subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(TypeError, match="pickle"):
        child_mod.start_child(slow_reader, (threading.Lock(),))
    assert started == []


def test_an_outbox_never_blocks_on_a_child_that_is_slow_to_read():
    """What the writer's driver relies on: megabytes sent while the child reads nothing arrive later, in order."""
    proc = child_mod.start_child(slow_reader, (1.5,), name="tuner-test-reader")
    outbox = child_mod.Outbox(proc.conn)
    started = time.perf_counter()
    for number in range(400):
        outbox.put((number, b"x" * 16384))  # 6.5 MB: far past what the socket buffers
    outbox.put(("stop",))
    assert time.perf_counter() - started < 1.0
    assert proc.conn.poll(60) and proc.conn.recv() == list(range(400))
    outbox.close(10)
    assert proc.join(10) == 0
    proc.close()


def test_children_end_with_the_parent(tmp_path):
    """A GPU worker and a writer left running when their parent exits are ended with it."""
    code = textwrap.dedent(
        f"""
        from tuner.study.replay import ReplayEvaluator
        from tuner.gpu.worker import IsolatedEvaluator
        from tuner.study.ahead import Ahead
        w = IsolatedEvaluator(evaluator_factory=ReplayEvaluator, evaluator_kwargs={{"path": {str(RECORDING)!r}}})
        w.launch()
        ahead = Ahead()
        ahead.launch_writer()
        print(w.pid, ahead.writer.proc.pid, flush=True)
        """
    )
    proc = _run([sys.executable, "-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pids = [int(p) for p in proc.stdout.split()]
    deadline = time.monotonic() + 10
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(p) for p in pids)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie waiting for a reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
