"""Compile processes (`tuner.build.compilers.CompileProcesses`): real NVRTC compiles in child processes, a child that
dies fails only its config's compile, and the results are those of an in-process compile."""

from __future__ import annotations

import os
import signal

from tuner.build import compile as compile_mod
from tuner.build import compilers
from tuner.build.compilers import CompileProcesses
from tuner.build.render import Source


def _source(text: str, entry: str) -> Source:
    return Source(kernel="toy", text=text, entry=entry, uri=entry, template="toy.cu.j2")


GOOD = 'extern "C" __global__ void k{i}(float* x) {{ x[0] = {i}.0f; }}'


def test_compiles_in_children_match_an_in_process_compile_and_a_dead_child_fails_one_config(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    processes = CompileProcesses(2)
    try:
        assert {c.pid for c in processes._all} - {os.getpid()} == {c.pid for c in processes._all}
        # a child's start-up is a second or more: until one is ready, the caller compiles in its own process
        early = processes.compile(_source(GOOD.format(i=9), "k9"), "sm_90", use_cache=False)
        assert early.ok and "k9" in early.functions and processes.in_process == 1
        assert processes.wait_ready(120)
        here = compile_mod.compile_source(_source(GOOD.format(i=0), "k0"), use_cache=False)
        there = processes.compile(_source(GOOD.format(i=0), "k0"), "sm_90", use_cache=False)
        assert processes.in_process == 1  # this one went to a child
        assert there.ok and there.cubin and there.functions == here.functions and there.arch == here.arch
        bad = processes.compile(_source('extern "C" __global__ void k(float* x) { x[0] = 1 }', "k"), "sm_90")
        assert not bad.ok and bad.kind == "compile_failed" and "expected a" in bad.details["log"]
        # a child that dies (here: killed while idle) fails the compile it was given, and is replaced
        for child in list(processes._all):
            os.kill(child.pid, signal.SIGKILL)
            child.join(10)
        lost = [processes.compile(_source(GOOD.format(i=i), f"k{i}"), "sm_90") for i in (1, 2)]
        assert all(not r.ok and "compiler process died" in r.reason for r in lost), lost
        assert processes.replaced == 2
        again = processes.compile(_source(GOOD.format(i=3), "k3"), "sm_90")
        assert again.ok and "k3" in again.functions
    finally:
        processes.close()
    assert processes._all == []


def test_compile_many_in_processes_keeps_the_order_and_the_results():
    sources = [_source(GOOD.format(i=i), f"k{i}") for i in range(5)]
    results = list(compilers.compile_many(sources, jobs=2, use_cache=False))  # 5 sources > 2 jobs: processes
    assert [s.entry for s, _ in results] == [f"k{i}" for i in range(5)]
    assert all(r.ok and f"k{i}" in r.functions for i, (_, r) in enumerate(results))
