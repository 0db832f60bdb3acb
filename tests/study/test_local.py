"""The local engine (`tuner.study.local.LocalPool`) on CPUs: real NVRTC compiles in compile processes, real GPU-worker
child processes (`IsolatedEvaluator`) whose evaluator answers from the H200 recording, and the faults a GPU worker can
suffer (killed, hung), handled as the Ray pool handles them."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import signal
import time
from pathlib import Path

import pytest

from tuner.cli import main as cli
from tuner.gpu import discovery
from tuner.gpu import worker as worker_mod
from tuner.gpu.protocol import Evaluator
from tuner.gpu.worker import IsolatedEvaluator
from tuner.space import space as space_mod
from tuner.study import local
from tuner.study.ahead import Ahead
from tuner.study.local import LocalPool, host_cores
from tuner.study.replay import ReplayEvaluator

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"
SPACE = ROOT / "search_spaces" / "transpose.yaml"


class _ReplayChild(Evaluator):
    """What the child builds: a replay evaluator with GpuEvaluator's extra attributes (picklable by name)."""

    def __init__(self, delay_s: float = 0.0):
        self.inner = ReplayEvaluator(RECORDING, None, delay_s)
        self.ceiling_tbps = None
        self.poisoned = False

    def start(self):
        return self.inner.start()

    def evaluate(self, request):
        return self.inner.evaluate(request)


def _child_factory(delay_s: float, timeout_s: float = 30.0):
    def factory(gpu_index: int):
        return IsolatedEvaluator(
            gpu=gpu_index,
            timeout_s=timeout_s,
            start_timeout_s=120.0,
            evaluator_factory=_ReplayChild,
            evaluator_kwargs={"delay_s": delay_s},
        )

    return factory


def _drain(pool: LocalPool, want: int, limit_s: float = 120.0) -> dict[int, object]:
    results: dict[int, object] = {}
    deadline = time.time() + limit_s
    while len(results) < want and time.time() < deadline:
        results.update(pool.poll(0.2))
    assert len(results) == want, results
    return results


@contextlib.contextmanager
def _pool(space, factory, gpus: int):
    """A LocalPool compiling for sm_90 over `factory`'s workers, closed however the test ends."""
    pool = LocalPool(space, space.problem(), factory, gpus=gpus, arch="sm_90")
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module")
def space():
    return space_mod.load(SPACE)


def test_configs_compile_in_threads_and_run_in_worker_children(space, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    configs = list(space.enumerate())[:6]
    with _pool(space, _child_factory(0.0), gpus=2) as pool:
        assert pool.compile_slots == host_cores() and pool.capacity == host_cores() + 2 * 3
        pool.prefetch(configs[0], "sm_90")  # before the workers are up
        for number, params in enumerate(configs):
            pool.submit(number, params)
        results = _drain(pool, len(configs))
        assert all(r.ok for r in results.values()), results
        assert set(pool.built) == set(range(len(configs)))  # each trial's source and cubin, for its artifacts
        assert {g["gpu_index"] for g in pool.gpus} == {0, 1}
        pids = {g["pid"] for g in pool.gpus}
        assert os.getpid() not in pids and len(pids) == 2  # one child process per GPU
        assert {w["pid"] for w in pool.ran_by.values()} <= {g.pid for g in (w.evaluator for w in pool._workers)}
        assert pool.startup["engine"] == "local" and pool.startup["gpu_workers_s"] > 0


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="process priorities are a POSIX feature")
def test_compiles_run_in_processes_below_the_rest_of_the_study(space, tmp_path, monkeypatch):
    """A measuring pool compiles in child processes, one per compile slot, niced by `COMPILE_NICENESS`, so the
    driver, the writer and the GPU workers keep their share of the cores; the driver itself is left as it was."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    from tuner.build.compilers import COMPILE_NICENESS

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    with _pool(space, _child_factory(0.0), gpus=1) as pool:
        pool.submit(0, list(space.enumerate())[0])
        assert _drain(pool, 1)[0].ok
        children = pool._compilers._all
        assert len(children) == pool.compile_slots and os.getpid() not in {c.pid for c in children}
        want, deadline = {min(19, mine + COMPILE_NICENESS)}, time.time() + 30
        while {os.getpriority(os.PRIO_PROCESS, c.pid) for c in children} != want and time.time() < deadline:
            time.sleep(0.05)  # a child nices itself first thing, but may still be starting
        assert {os.getpriority(os.PRIO_PROCESS, c.pid) for c in children} == want
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine


def test_killed_worker_fails_its_trial_and_the_next_config_runs(space, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    configs = list(space.enumerate())[:2]
    with _pool(space, _child_factory(3.0), gpus=1) as pool:
        child = pool._workers[0].evaluator
        pool.wait_ready()
        victim = child.pid
        pool.submit(0, configs[0])
        deadline = time.time() + 60
        while not (0 in pool.built and pool.ready.empty()) and time.time() < deadline:
            time.sleep(0.05)  # compiled, and taken by the GPU thread: it is in the child now (3 s per answer)
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        result = _drain(pool, 1)[0]
        assert result.kind == "launch_failed" and "died" in result.reason
        pool.submit(1, configs[1])
        assert _drain(pool, 1)[1].ok
        assert child.pid != victim and child.restarts == 1


def test_hung_worker_times_out_and_is_replaced(space, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    configs = list(space.enumerate())[:2]
    with _pool(space, _child_factory(30.0, timeout_s=2.0), gpus=1) as pool:
        pool.wait_ready()
        pool.submit(0, configs[0])
        result = _drain(pool, 1)[0]
        assert result.kind == "timed_out" and result.details["timeout_s"] == 2.0
        # cut at the worker's 2 s bound (the answer would take 30 s), the one hang of the pool's summary
        assert [(h["trial"], h["deadline_s"]) for h in pool.hangs] == [(0, 2.0)]
        assert pool._workers[0].evaluator.alive() is False  # killed; the next config starts a fresh child


def _settled(pool: LocalPool, n: int, limit_s: float = 60.0) -> None:
    """Wait until `n` speculative evaluations have finished (measured or dropped)."""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        done = [s for s in pool._speculations.values() if s.result is not None or s.dropped]
        if len(done) >= n:
            return
        time.sleep(0.05)
    raise AssertionError("speculative evaluations did not finish")


def test_prefetched_configs_are_measured_before_they_are_asked_for_and_only_once(space, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    configs = list(space.enumerate())[:3]
    with _pool(space, _child_factory(0.6), gpus=1) as pool:
        for params in configs[:2]:
            pool.prefetch(params, "sm_90", evaluate=True)  # the GPU measures them while the driver sets up
        pool.prefetch(configs[2], "sm_80", evaluate=True)  # compiled for another GPU: never measured here
        _settled(pool, 3)
        assert pool.poll(0.1) == []  # nothing reaches the driver until it asks
        busy = pool.spent()
        assert busy.evaluated == 2  # the two prefetched for this GPU's arch, not the third
        pool.submit(0, configs[0])
        pool.submit(1, configs[1])
        results = _drain(pool, 2)
        # answered from what was measured, not measured again
        assert all(r.ok for r in results.values()) and pool.spent() == busy
        assert set(pool.built) == {0, 1} and set(pool.ran_on) == {0, 1}
        # a finalist (another budget) and the config prefetched for another arch are measured afresh
        pool.submit(2, configs[2])
        pool.submit(3, configs[0], budget_ms=300.0, screening=False)
        results = _drain(pool, 2)
        assert all(r.ok for r in results.values()) and pool.spent().evaluated == 4


def test_a_config_resolved_otherwise_by_the_time_it_is_asked_for_is_measured_afresh(space, tmp_path, monkeypatch):
    # The study may learn GPU facts after the prefetch that change a config's launch geometry, not its source.
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    params = list(space.enumerate())[0]
    with _pool(space, _child_factory(0.6), gpus=1) as pool:
        pool.prefetch(params, "sm_90", evaluate=True)
        _settled(pool, 1)
        busy = pool.spent().occupied_s
        resolve = space.resolve
        monkeypatch.setattr(space, "resolve", lambda p, problem: {**resolve(p, problem), "grid_hint": 7})
        pool.submit(0, params)
        assert _drain(pool, 1)[0].ok
        assert pool.spent().occupied_s > busy + 0.5  # measured again, as resolved now


def test_a_config_asked_for_while_it_is_measured_ahead_is_delivered_once(space, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    params = list(space.enumerate())[0]
    with _pool(space, _child_factory(1.0), gpus=1) as pool:
        pool.wait_ready()
        pool.prefetch(params, "sm_90", evaluate=True)
        deadline = time.time() + 30
        while pool.busy_since is None and time.time() < deadline:
            time.sleep(0.02)  # the GPU has taken it
        pool.submit(0, params)
        assert _drain(pool, 1)[0].ok
        time.sleep(1.2)
        assert pool.poll(0.1) == [] and pool.in_flight == 0  # once, not twice
        assert 0.9 < pool.spent().occupied_s < 1.9


def test_a_worker_that_cannot_start_is_reported_by_wait_ready(space):
    def broken(gpu_index: int):
        return _Broken()

    pool = LocalPool(space, space.problem(), broken, gpus=2)
    with pytest.raises(RuntimeError, match="no such GPU"):
        pool.wait_ready()


class _Broken(Evaluator):
    measures = True

    def start(self):
        raise RuntimeError("no such GPU")

    def close(self):
        pass


@pytest.fixture
def replay_children(monkeypatch, tmp_path):
    """GPU workers whose child answers from the recording (as `isolated_gpu_evaluator` would build them)."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        worker_mod,
        "IsolatedEvaluator",
        functools.partial(
            IsolatedEvaluator, start_timeout_s=120.0, evaluator_factory=_ReplayChild, evaluator_kwargs={"delay_s": 0.0}
        ),
    )


def test_a_worker_launched_first_thing_is_the_one_the_pool_takes(space, replay_children):
    ahead = Ahead()
    ahead.launch_gpu_workers(1, timeout_s=30.0)
    early = ahead.workers[0]
    assert early.alive() and not early.info  # its process runs before anyone waits for it
    with _pool(space, functools.partial(local.isolated_gpu_evaluator, ahead=ahead), gpus=1) as pool:
        assert pool._workers[0].evaluator is early and not ahead.workers
        pool.submit(0, list(space.enumerate())[0])
        assert _drain(pool, 1)[0].ok
        assert pool.ran_by[0]["pid"] == early.pid  # the same child measured it


@pytest.mark.parametrize(
    ("argv", "launched"),
    [
        (["--trials", "1"], 1),
        (["--trials", "1", "--gpus", "3"], 1),  # no more than the machine has: the study refuses the rest
        (["--trials", "1", "--replay", "tests/data/transpose_h200.db"], 0),
        (["--trials", "1", "--engine", "ray"], 0),
    ],
)
def test_tuner_study_launches_the_local_gpu_workers_before_anything_else(monkeypatch, argv, launched):
    calls = []
    monkeypatch.setattr(discovery, "local_gpus", lambda: 1)
    monkeypatch.setattr(Ahead, "launch_gpu_workers", lambda self, count, timeout_s: calls.append(count))
    # Stop right after the launch: the study itself is tested elsewhere.
    monkeypatch.setattr("tuner.api.study_ahead", lambda *a, **k: (_ for _ in ()).throw(SystemExit(0)))
    with pytest.raises(SystemExit):
        cli.main(["study", "transpose", *argv])
    assert calls == ([launched] if launched else [])


def test_what_tuner_study_starts_ahead_is_handed_to_the_study(monkeypatch):
    """The writer and the GPU workers ``tuner study`` starts first thing reach the study as one object."""
    launched, handed = [], []
    monkeypatch.setattr(discovery, "local_gpus", lambda: 1)
    monkeypatch.setattr(Ahead, "launch_gpu_workers", lambda self, count, timeout_s: launched.append(self))
    driver = importlib.import_module("tuner.study.driver")  # `tuner.study` is the API call, not this package
    monkeypatch.setattr(
        driver, "run_study", lambda opts, prelude=None, space=None, ahead=None: handed.append(ahead) or {"trials": 0}
    )
    assert cli.main(["study", "transpose", "--trials", "1", "--storage", ":memory:"]) == 0
    (ahead,) = handed
    assert launched == [ahead] and ahead.writer is not None and ahead.writer.proc.alive()
    ahead.writer.abort()


def test_launching_gpu_workers_imports_neither_numpy_nor_the_kernel_families():
    # ``tuner study`` imports tuner.gpu.worker to launch its GPU workers, and each child imports it again before it can
    # start its CUDA context: NumPy and the families there would delay every GPU worker by ~0.3 s.
    import subprocess
    import sys

    probe = (
        "import sys, tuner.gpu.worker; print(sorted(m for m in ('numpy', 'tuner.kernels', 'cupy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _seeded_replay(tmp_path: Path, cores: int, monkeypatch) -> tuple[list[tuple], object]:
    """A seeded replay study of 24 trials on the local engine, in this process, on a machine of `cores` cores. TPE:
    it is made for the configs in flight (`tuner.study.search.make_sampler`), so a width that changed would show."""
    import optuna

    import tuner

    with monkeypatch.context() as patched:
        patched.setattr(os, "cpu_count", lambda: cores)
        patched.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
        assert host_cores() == cores
        url = f"sqlite:///{tmp_path}/cores{cores}.db"
        result = tuner.study("transpose", 24, storage=url, seed=1, sampler="tpe", engine="local", replay=str(RECORDING))
    (summary,) = optuna.get_all_study_summaries(url)
    trials = optuna.load_study(study_name=summary.study_name, storage=url).trials
    return [(t.number, t.params, t.values) for t in trials], result


def test_a_seeded_replay_proposes_the_same_trials_whatever_the_cpu_count(tmp_path, monkeypatch):
    """A replay's width (configs in flight) is the engine's fixed one, not the machine's cores: what a seeded
    sampler proposes depends on it, so the trials would differ from one machine to the next."""
    from tuner.study.engines import REPLAY_COMPILE_SLOTS

    few, few_result = _seeded_replay(tmp_path, 2, monkeypatch)
    many, many_result = _seeded_replay(tmp_path, 64, monkeypatch)
    assert len(few) == 24 and few == many
    assert few_result.summary["compile_threads"] == many_result.summary["compile_threads"] == REPLAY_COMPILE_SLOTS
