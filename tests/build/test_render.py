"""Rendering: strict templates, readable uris, template faults reported with file and line."""

from __future__ import annotations

import pytest

from tuner import kernels
from tuner.build.render import environment, render, uri
from tuner.core.errors import TemplateError
from tuner.kernels.base import Family
from tuner.space import space as space_mod


class Toy(Family):
    name = "toy"
    template = "toy.cu.j2"
    uri_names = {"block": "b"}


def test_uri_is_readable_and_a_c_identifier():
    name = uri(Toy(), {"block": 128, "pad": 1, "scale": 0.5})
    assert name == "toy_b128_pad1_scale0p5"
    assert name.isidentifier()


def test_render_sees_params_problem_and_entry(tmp_path):
    (tmp_path / "toy.cu.j2").write_text(
        'extern "C" __global__ void {{ entry }}({{ ctype }}* x) { x[0] = {{ block }} * {{ n }}; }\n'
    )
    src = render(Toy(), {"block": 64}, {"block": 64}, {"n": 3, "dtype": "float32"}, env=environment(tmp_path))
    assert src.entry == src.uri == "toy_b64"
    assert "void toy_b64(float* x)" in src.text and "64 * 3" in src.text


def test_undefined_variable_names_template_and_line(tmp_path):
    (tmp_path / "toy.cu.j2").write_text("// line 1\n// line 2\nint x = {{ missing_knob }};\n")
    with pytest.raises(TemplateError) as info:
        render(Toy(), {}, {}, {"dtype": "float32"}, env=environment(tmp_path))
    message = str(info.value)
    assert "toy.cu.j2:3:" in message and "missing_knob" in message and "\n" not in message


def test_syntax_error_names_template_and_line(tmp_path):
    (tmp_path / "toy.cu.j2").write_text("ok\n{% for x in %}\n{% endfor %}\n")
    with pytest.raises(TemplateError) as info:
        render(Toy(), {}, {}, {"dtype": "float32"}, env=environment(tmp_path))
    assert "toy.cu.j2:2:" in str(info.value) and "syntax error" in str(info.value)


@pytest.mark.parametrize("path", space_mod.shipped_spaces(), ids=lambda p: p.stem)
def test_every_valid_config_of_shipped_spaces_renders_with_a_unique_uri(path):
    s = space_mod.load(path)
    family, problem = kernels.get(s.kernel), s.problem()
    uris = set()
    for params in s.sample(300, seed=0):
        src = render(family, params, s.resolve(params, problem), problem.env)
        assert f"{src.entry}(" in src.text
        uris.add(src.uri)
    assert len(uris) == min(300, s.count_valid())
