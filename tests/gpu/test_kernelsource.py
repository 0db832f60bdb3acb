"""The GPU worker's own kernels as CUDA C (`tuner.gpu.kernelsource`): they compile with NVRTC here, in two parts
that cover every (output, reference) dtype pair, and every dtype a declared kernel may store has a one-pass check
against every reference dtype."""

from __future__ import annotations

import numpy as np

from tuner.build.compile import compile_source
from tuner.gpu import kernelsource


def test_the_worker_kernels_compile_for_sm_90_without_spills(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    compiled = compile_source(kernelsource.source(), "sm_90")
    assert compiled.ok, compiled
    names = set(compiled.functions)
    assert {"fill_normal_f32", "fill_normal_bf16", "fill_uniform_f32", "fill_uniform_f64", "fill_integers_i64"} <= names
    assert {f"check_{o}_{r}" for o, r in kernelsource.CHECK_PAIRS} <= names
    assert {o for o, _ in kernelsource.CHECK_PAIRS} == set(kernelsource.CHECK_DTYPES)
    assert {r for _, r in kernelsource.CHECK_PAIRS} == {"float32", "float64"}
    assert all(f.spill_store_bytes == 0 for f in compiled.functions.values())
    assert compile_source(kernelsource.source(), "sm_90").cached  # the second worker start compiles nothing


def test_the_worker_builds_the_checks_in_two_parts_that_cover_every_pair(tmp_path, monkeypatch):
    """The first part (on the worker's critical path) holds the random-input kernels and the checks of
    FIRST_CHECKS only; `Built` compiles the rest on a thread, checks alone; together they hold every pair of
    CHECK_PAIRS."""
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path))
    rest = kernelsource.LATER_CHECKS
    assert len(kernelsource.CHECK_PAIRS) == len(kernelsource.FIRST_CHECKS) + len(rest) == 26
    later = kernelsource.Built(rest, "sm_90", fills=False)
    first = compile_source(kernelsource.source(kernelsource.FIRST_CHECKS), "sm_90")
    fills = {"fill_normal_f32", "fill_normal_bf16", "fill_uniform_f32", "fill_uniform_f64", "fill_integers_i64"}
    assert first.ok and set(first.functions) == fills | {f"check_{o}_{r}" for o, r in kernelsource.FIRST_CHECKS}
    built = later.result()
    assert built.ok and {f"check_{o}_{r}" for o, r in rest} == set(built.functions)  # checks alone
    assert not ({f"check_{o}_{r}" for o, r in kernelsource.FIRST_CHECKS} & set(built.functions))
    assert all(f.spill_store_bytes == 0 for f in [*first.functions.values(), *built.functions.values()])


#: Every dtype a reference may return (after torch's bf16 becomes float32): what `normalize_reference` turns it into
#: is a reference dtype of the check.
RETURNED = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def test_every_declared_dtype_has_a_one_pass_check_against_every_reference_dtype():
    """Each array dtype a ``kernel:`` block may declare, stored as the GPU worker stores it, against each reference
    dtype `normalize_reference` hands over (whatever the reference returned): a pair of the module, never CuPy's
    multi-pass comparison."""
    from tuner.gpu.verify import reference_dtype
    from tuner.kernels import declared

    assert set(kernelsource.CHECK_DTYPES) == set(declared.ARRAY_DTYPES)
    for dtype in declared.ARRAY_DTYPES:
        out = np.zeros((3, 5), dtype=declared.storage(dtype))
        for returned in (*RETURNED, "bool"):
            ref = np.zeros((3, 5), dtype=reference_dtype(returned, dtype))
            assert kernelsource.check_pair(out, ref, dtype) in kernelsource.CHECK_PAIRS, (dtype, returned)
    # what the pair refuses: another shape, a strided view, an array that does not store the dtype named
    out, ref = np.zeros((4, 6), dtype=np.float16), np.zeros((4, 6), dtype=np.float32)
    assert kernelsource.check_pair(out, ref) == ("float16", "float32")
    assert kernelsource.check_pair(out, ref[:2]) is None and kernelsource.check_pair(out[:, ::2], ref[:, ::2]) is None
    assert kernelsource.check_pair(out, ref, "bfloat16") is None
    assert kernelsource.check_pair(out.view(np.uint16), ref, "bfloat16") == ("bfloat16", "float32")
    assert kernelsource.check_pair(out, ref.astype(np.float16)) is None  # normalize_reference widens it first


def test_a_declared_kernel_has_every_output_and_inout_compared_as_stored(tmp_path):
    """The check reads every output and in-place argument of a declared kernel as it is stored (bf16 bits as
    bfloat16, the problem's dtype resolved), so none goes through a decoded copy; a family with a
    `checked_value` of its own is compared through it."""
    from tuner.kernels.base import Family
    from tuner.kernels.declared import ARRAY_DTYPES, storage
    from tuner.space import space as space_mod

    outputs = "".join(f"    - {{name: o_{d}, role: output, dtype: {d}, shape: [n]}}\n" for d in ARRAY_DTYPES)
    (tmp_path / "all.yaml").write_text(
        "kernel:\n  name: all_dtypes\n  dtypes: [bfloat16]\n  arguments:\n"
        + outputs
        + "    - {name: acc, role: inout, shape: [n]}\n"
        + "    - {name: n, role: scalar, dtype: int64}\n"
        + "  launch: {grid: [1], block: [block]}\n"
        + "template: all.cu.j2\nproblem: {name: p, n: 64, dtype: bfloat16}\nparams: {block: [64]}\n"
    )
    (tmp_path / "all.cu.j2").write_text('extern "C" __global__ void {{ entry }}() {}\n')
    space = space_mod.load(tmp_path / "all.yaml")
    family, env = space.family, space.problem().env
    declared = family.outputs(env, space.default)
    for name in family.checked():
        dtype = declared[name][1] if name in declared else None
        array = np.zeros(64, dtype=storage(dtype or "bfloat16"))
        stored = family.checked_stored(name, array, dtype)
        assert stored == (dtype or "bfloat16"), name
        ref = np.zeros(64, dtype=np.float32)
        assert kernelsource.check_pair(array, ref, stored) in kernelsource.CHECK_PAIRS, name

    class Codes(Family):
        def checked_value(self, xp, name, array, dtype):
            return array.astype(xp.float64) / 256

    class Plain(Family):
        pass

    assert Codes().checked_stored("q", np.zeros(4, dtype=np.uint8), "uint8") is None
    assert Plain().checked_stored("y", np.zeros(4, dtype=np.uint16), "bfloat16") == "bfloat16"
    assert Plain().checked_stored("y", np.zeros(4, dtype=np.int16), "int16") == "int16"
