"""The package's imports run one way: the layers contract (pyproject.toml [tool.importlinter], checked by
``lint-imports`` in CI) keeps each stage from importing a stage above it; this test keeps modules of one stage from
importing each other in a circle. Imports inside functions and under TYPE_CHECKING count."""

from __future__ import annotations

from pathlib import Path

import pytest

import tuner


def test_no_module_of_the_package_is_part_of_an_import_cycle():
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("tuner")
    cycles = sorted(
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if graph.find_shortest_chain(importer=imported, imported=module)
    )
    assert cycles == []


def test_the_api_calls_stay_functions_whatever_is_imported():
    from tuner.gpu import evaluator  # noqa: F401
    from tuner.study import driver  # noqa: F401

    assert callable(tuner.study) and tuner.study.__module__ == "tuner.api"
    assert callable(tuner.bench) and tuner.bench.__module__ == "tuner.api"


def test_the_package_module_imports_what_it_names_where_the_linter_sees_it():
    """`tuner/__init__.py` reaches the API and the stage package by import statements (the contracts in
    pyproject.toml see them), not through importlib."""
    assert "importlib" not in Path(tuner.__file__).read_text()
    assert "tuner" not in vars(tuner) and "_stage" not in vars(tuner)  # no stray bindings of its own imports


def test_cuda_is_reached_through_one_module():
    """tuner.core.cudalib gives CuPy's runtime, driver and NVRTC bindings; no other module of the package imports
    cupy_backends, so a CuPy that moves them is mended in one place."""
    import cupy_backends.cuda.api.driver
    import cupy_backends.cuda.api.runtime
    import cupy_backends.cuda.libs.nvrtc

    from tuner.core import cudalib

    assert cudalib.runtime is cupy_backends.cuda.api.runtime
    assert cudalib.driver is cupy_backends.cuda.api.driver
    assert cudalib.nvrtc is cupy_backends.cuda.libs.nvrtc
    with pytest.raises(AttributeError):
        cudalib.cublas  # noqa: B018 - not one of the three
    package = Path(cudalib.__file__).parents[1]
    others = [p for p in package.rglob("*.py") if p.name != "cudalib.py" and "cupy_backends" in p.read_text()]
    assert others == []


def test_every_module_sits_in_a_stage_folder():
    """The package's top level holds only its own module, the `python -m tuner` entry and one folder a stage (and
    `core`, what the stages share), each with a docstring saying what it takes and gives."""
    package = Path(tuner.__file__).parent
    assert sorted(p.name for p in package.glob("*.py")) == ["__init__.py", "__main__.py"]
    folders = sorted(p.parent.name for p in package.glob("*/__init__.py"))
    stages = ["api", "build", "cli", "core", "expr", "gpu", "insight", "kernels", "results", "space", "store", "study"]
    assert folders == stages
    for folder in folders:
        doc = (package / folder / "__init__.py").read_text().lstrip()
        assert doc.startswith('"""') and len(doc.split('"""')[1].split()) >= 15, folder
