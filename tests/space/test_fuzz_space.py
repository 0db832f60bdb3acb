"""Property-based fuzz of the space loader: whatever the input, the outcome is a loaded space or a `SpaceError`,
within bounded time (the expression compiler's fuzz: tests/expr/test_fuzz_expression.py). Derandomized, so CI sees
the same cases."""

from __future__ import annotations

import time

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.core.errors import SpaceError
from tuner.space import space as space_mod

FUZZ = settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
NAMES = ["tile", "vec", "pad", "n", "rows", "block", "x"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "copy",
            "transpose",
            "float32",
            "bfloat16",
            "tile",
            "pow2",
            "range",
            "values",
            "1 + 1",
            "tile ** 99",
            "a\nb",
            "maximize",
        ]
    ),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(
            st.one_of(
                st.sampled_from([*space_mod.TOP_LEVEL_KEYS, *NAMES, "pow2", "range", "name", "dtype", "values"]),
                st.text(max_size=8),
            ),
            inner,
            max_size=6,
        ),
    ),
    max_leaves=30,
)


def _load_text(tmp_path_factory, data: bytes):
    path = tmp_path_factory.mktemp("fuzz") / "space.yaml"
    path.write_bytes(data)
    started = time.perf_counter()
    try:
        space_mod.load(path)
    except SpaceError as exc:
        assert "\n" not in str(exc).split(": ", 1)[0]
    assert time.perf_counter() - started < 5.0


@FUZZ
@given(data=st.binary(max_size=400))
def test_random_bytes_load_or_space_error(tmp_path_factory, data):
    _load_text(tmp_path_factory, data)


@FUZZ
@given(doc=documents)
def test_random_yaml_documents_load_or_space_error(tmp_path_factory, doc):
    _load_text(tmp_path_factory, yaml.safe_dump(doc).encode())


@FUZZ
@given(
    kernel=st.sampled_from(["copy", "transpose"]),
    params=st.dictionaries(
        st.sampled_from(NAMES),
        st.lists(st.one_of(st.integers(-64, 2**40), st.text(max_size=6)), min_size=1, max_size=4),
        min_size=1,
        max_size=4,
    ),
    constraint=st.text(alphabet="tilevcpadn +-*/%()<>=!~&|^0123456789.'\"f[]{}:,", max_size=30),
)
def test_random_space_files_load_or_space_error(tmp_path_factory, kernel, params, constraint):
    doc = {
        "kernel": kernel,
        "problem": {"name": "p", "n": 1024, "span": 4, "rows": 64, "cols": 64},
        "params": params,
        "constraints": [constraint],
    }
    _load_text(tmp_path_factory, yaml.safe_dump(doc).encode())
