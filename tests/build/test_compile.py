"""Compiling with real NVRTC (no GPU needed): resources, spills, failures, the on-disk cache."""

from __future__ import annotations

import json

import pytest

from tuner import kernels
from tuner.build import compile as compile_mod
from tuner.build import compilers
from tuner.build.render import Source, render
from tuner.space import space as space_mod

PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k_main' for 'sm_90'
ptxas info    : Function properties for k_main
ptxas         .     8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 16640 bytes smem, 400 bytes cmem[0]
ptxas info    : Compiling entry function 'k_main_bias' for 'sm_90'
ptxas info    : Function properties for k_main_bias
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 16 registers, used 0 barriers, 380 bytes cmem[0]
"""


def test_parse_ptxas_report():
    funcs = compile_mod.parse_ptxas(PTXAS)
    assert funcs["k_main"] == compile_mod.FunctionResources(255, 16640, 8, 12, 16)
    assert funcs["k_main_bias"] == compile_mod.FunctionResources(16, 0, 0, 0, 0)


def _source(text: str, name: str = "k") -> Source:
    return Source(kernel="toy", text=text, entry=name, uri=name, template="toy.cu.j2")


def test_compile_reports_resources_and_caches(tmp_path):
    src = _source(
        'extern "C" __global__ void k(float* x) { __shared__ float s[256]; '
        "s[threadIdx.x] = x[threadIdx.x]; __syncthreads(); x[threadIdx.x] = s[255 - threadIdx.x]; }"
    )
    first = compile_mod.compile_source(src)
    assert first.ok and not first.cached and first.cubin[:4] == b"\x7fELF"
    assert first.registers > 0 and first.smem_static_bytes == 1024 and first.spill_bytes == 0
    second = compile_mod.compile_source(src)
    assert second.cached and second.cubin == first.cubin and second.functions == first.functions
    folder = compile_mod.cache_dir() / "sm_90"
    assert sorted(p.suffix for p in folder.iterdir()) == [".cubin", ".json", ".lock", ".ptx"]
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_compile_nvrtc_answers_without_its_ptxas_report_is_compiled_again(monkeypatch):
    """Some NVRTC builds answer a program they compiled before in the process from their own cache, with the
    cubin and no ptxas report. Registers and spills must not silently read 0 then: the same code is compiled
    once more under a name and text NVRTC has not seen. Here the first compile plays NVRTC's cache hit (real
    NVRTC underneath, its report dropped)."""
    real = compile_mod.nvrtc_compile
    names: list[str] = []

    def cached_once(text, name, options):
        status, log, cubin, ptx = real(text, name, options)
        hit = not names
        names.append(name)
        return status, ("" if hit else log), cubin, ptx

    monkeypatch.setattr(compile_mod, "nvrtc_compile", cached_once)
    src = _source('extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }')
    out = compile_mod.compile_source(src, use_cache=False)
    assert out.ok and out.registers > 0 and set(out.functions) == {"k"}
    assert len(names) == 2 and names[0] == "k.cu" and names[1] != names[0]


def test_cache_key_covers_source_options_arch_and_versions():
    src = _source("x")
    v = {"cupy": "1", "nvrtc": "13.0"}
    base = compile_mod.cache_key(src, ["a"], "sm_90", v)
    assert base != compile_mod.cache_key(_source("y"), ["a"], "sm_90", v)
    assert base != compile_mod.cache_key(src, ["b"], "sm_90", v)
    assert base != compile_mod.cache_key(src, ["a"], "sm_80", v)
    assert base != compile_mod.cache_key(src, ["a"], "sm_90", {**v, "nvrtc": "13.1"})


def test_arch_specific_ptx_compiles_for_the_a_target():
    """wgmma exists only on sm_90a: a source that uses it compiles for sm_90a (cached under that arch), the
    same source for plain sm_90 is refused by NVRTC, and a source without it stays on the arch asked for."""
    body = (
        'extern "C" __global__ void k(float* x) { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); '
        "x[threadIdx.x] = 1.0f; }"
    )
    src = _source(body)
    assert compile_mod.target_arch(src.text, "sm_90") == "sm_90a"
    assert compile_mod.target_arch(src.text, "compute_90") == "compute_90a"
    assert compile_mod.target_arch(src.text, "sm_80") == "sm_80"  # no a-variant to fall back on: NVRTC decides
    assert compile_mod.target_arch("x[0] = 1;", "sm_90") == "sm_90"
    built = compile_mod.compile_source(src)
    assert built.ok and built.arch == "sm_90a" and (compile_mod.cache_dir() / "sm_90a").is_dir()
    status, log, _, _ = compile_mod.nvrtc_compile(body, "k.cu", ["--gpu-architecture=sm_90"])
    assert status != 0 and "wgmma" in log


def test_compile_failure_is_typed_and_cached_with_its_log():
    src = _source('extern "C" __global__ void k(float* x) { x[0] = no_such_symbol; }')
    failed = compile_mod.compile_source(src)
    assert failed.kind == "compile_failed" and "no_such_symbol" in failed.reason
    assert "no_such_symbol" in failed.details["log"]
    again = compile_mod.compile_source(src)
    assert again.kind == "compile_failed" and again.details["log"] == failed.details["log"]
    metas = list((compile_mod.cache_dir() / "sm_90").glob("*.json"))
    assert len(metas) == 1 and json.loads(metas[0].read_text())["ok"] is False


def test_tight_launch_bounds_spill():
    # 64 live accumulators per thread under __launch_bounds__(1024, 2): ptxas may use 32 registers only.
    src = _source(
        'extern "C" __global__ void __launch_bounds__(1024, 2) k(const float* a, float* out, int n) {\n'
        "  float acc[96];\n"
        "  #pragma unroll\n"
        "  for (int i = 0; i < 96; ++i) acc[i] = a[i * n + threadIdx.x];\n"
        "  for (int j = 0; j < n; ++j) {\n"
        "    #pragma unroll\n"
        "    for (int i = 0; i < 96; ++i) acc[i] = acc[i] * acc[(i + 1) % 96] + a[j];\n"
        "  }\n"
        "  float s = 0;\n"
        "  #pragma unroll\n"
        "  for (int i = 0; i < 96; ++i) s += acc[i];\n"
        "  out[threadIdx.x] = s;\n"
        "}\n"
    )
    result = compile_mod.compile_source(src)
    assert result.ok and result.registers <= 32 and result.spill_bytes > 0


def test_compile_many_runs_in_parallel_and_keeps_order():
    srcs = [_source(f'extern "C" __global__ void k{i}(float* x) {{ x[0] = {i}.0f; }}', f"k{i}") for i in range(6)]
    results = list(compilers.compile_many(srcs, jobs=2))
    assert [s.entry for s, _ in results] == [f"k{i}" for i in range(6)]
    assert all(r.ok and f"k{i}" in r.functions for i, (_, r) in enumerate(results))


#: The most configs compiled per shipped space: NVRTC takes 0.3-3 s a config on one core, and this test was the
#: suite's largest cost (at 32 a space, a quarter of the suite's CPU). What matters is that every value of every knob
#: reaches the compiler, which the covering sample below gives with 5-10 configs on every shipped space (the GPU
#: suite and the studies compile many more); a space that needs more than this fails here, to be looked at.
COMPILED_PER_SPACE = 16


def covering_sample(space, most: int, seed: int = 7) -> list[dict]:
    """At most `most` valid configs in which every value of every param that a seeded draw of the valid set holds
    appears at least once: greedily, each next config the one of the draw that brings the most unseen (param,
    value) pairs, until none is unseen."""
    drawn = space.sample(400, seed=seed)
    seen: set[tuple[str, object]] = set()
    chosen: list[dict] = []
    rest = list(drawn)
    while rest and len(chosen) < most:
        best = max(rest, key=lambda c: len({(k, repr(v)) for k, v in c.items()} - seen))
        if not {(k, repr(v)) for k, v in best.items()} - seen:
            break
        chosen.append(best)
        seen |= {(k, repr(v)) for k, v in best.items()}
        rest.remove(best)
    return chosen


@pytest.mark.parametrize("path", space_mod.shipped_spaces(), ids=lambda p: p.stem)
def test_seeded_sample_of_each_shipped_space_compiles(path):
    """A covering sample of each shipped space (every value of every knob among at most `COMPILED_PER_SPACE`
    valid configs) compiles for sm_90 with registers > 0."""
    s = space_mod.load(path)
    family, problem = kernels.get(s.kernel), s.problem()
    configs = covering_sample(s, COMPILED_PER_SPACE)
    values = {(k, repr(v)) for c in s.sample(400, seed=7) for k, v in c.items()}
    assert values <= {(k, repr(v)) for c in configs for k, v in c.items()}  # every knob's every value compiles
    sources = [render(family, c, s.resolve(c, problem), problem.env) for c in configs]
    failures = []
    for src, result in compilers.compile_many(sources, jobs=1):  # in this process: see tests/README.md
        if not result.ok:
            failures.append((src.uri, result.reason))
        else:
            assert result.registers > 0, src.uri
            assert src.entry in result.functions, src.uri
    assert not failures
