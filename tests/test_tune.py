"""`tuner.tune`, a kernel in one call from a notebook: the space directory it writes (reopened by the CLI and by
fresh processes), a study against a replay recording stored like any other, and one-line errors for bad input.
Real NVRTC (the default config renders and compiles), real Optuna, a synthetic recording (`record`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import optuna
import pytest

import tuner
from tests.kernels.test_custom import record

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "examples" / "scale_add" / "scale_add.cu.j2"
PARAMS = {"vec": [1, 2, 4], "block": [128, 256, 512, 1024], "items": [1, 2, 4, 8]}
PROBLEM = {"n": 1 << 16}
KERNEL = {
    "arguments": ["x: input[n]", "y: input[n]", "out: output[n]", "alpha: float32 = 0.5", "n: int64"],
    "grid": "ceil_div(n, block * items * vec)",
    "block": "block",
}


def notebook_function(source: str, name: str):
    """A function defined as a notebook cell defines it: in ``__main__``, which no other process can import."""
    namespace: dict = {"__name__": "__main__"}
    exec(source, namespace)
    return namespace[name]


def tuner_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True, timeout=600, env=env
    )


def _trials(url: str) -> list[tuple]:
    (summary,) = optuna.get_all_study_summaries(url)
    study = optuna.load_study(study_name=summary.study_name, storage=url)
    return [(t.number, t.state.name, t.params, t.values) for t in study.trials]


def test_tune_runs_a_study_the_cli_reopens(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ref = notebook_function("def scale_add(x, y, alpha, n):\n    return alpha * x + y\n", "scale_add")
    space = tuner.tune_space("scale_add", TEMPLATE.read_text(), PARAMS, PROBLEM, ref, **KERNEL)
    assert space.path == (tmp_path / "studies" / "scale_add" / "scale_add.yaml").resolve()
    assert space.kernel == "scale_add" and space.count_valid() == 48  # no constraints: 3 × 4 × 4
    n = record(space.path, tmp_path / "rec.db")

    result = tuner.tune(
        "scale_add", TEMPLATE, PARAMS, PROBLEM, ref, trials=10, seed=3, replay=tmp_path / "rec.db", **KERNEL
    )
    assert isinstance(result, tuner.StudyResult) and result.summary["trials"] == 10 and n >= 10
    api_url = f"sqlite:///{tmp_path}/studies/scale_add.db"
    assert result.summary["storage"] == "sqlite:///studies/scale_add.db"
    measured = [t for t in result.study.trials if t.state.name == "COMPLETE"]
    assert result.best["tbps"] == max(t.user_attrs["tbps"] for t in measured)
    assert len(result.trials) == len(result.study.trials)

    # the CLI, in another process, loads the written space (and unpickles the notebook's reference) and runs
    # the same study: the same rows
    proc = tuner_cli(
        "study",
        "scale_add",
        "--space",
        "studies/scale_add/scale_add.yaml",
        "--trials",
        "10",
        "--seed",
        "3",
        "--replay",
        "rec.db",
        "--storage",
        "sqlite:///cli.db",
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _trials(f"sqlite:///{tmp_path}/cli.db") == _trials(api_url)
    again = tuner.tune(
        "scale_add", TEMPLATE, PARAMS, PROBLEM, ref, trials=12, seed=3, replay=tmp_path / "rec.db", **KERNEL
    )
    assert again.summary["study"] == result.summary["study"] and again.summary["trials"] == 12  # resumed

    # and finds the study by the kernel's name, as for any study
    proc = tuner_cli("best", "scale_add", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout)["number"] == result.best["number"]
    assert tuner.open_study("scale_add").best == result.best
    proc = tuner_cli("export", "scale_add", "--header", "scale_add_tuned.h", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "scale_add_vec" in (tmp_path / "scale_add_tuned.h").read_text()


def test_the_reference_reaches_a_fresh_process(tmp_path):
    """A lambda and a closure over a notebook variable travel by value (cloudpickle): a process that imports
    nothing of the caller's loads the space and gets the same expected output."""
    scale = 3.0
    ref = lambda x, y, alpha, n: scale * alpha * x + y  # noqa: E731 - a notebook's lambda is the case at hand
    space = tuner.tune_space("sa", TEMPLATE, PARAMS, PROBLEM, ref, directory=tmp_path / "sa", **KERNEL)
    code = (
        "import sys, numpy as np, tuner\n"
        "s = tuner.load_space(sys.argv[1]); env = s.problem().env; fam = s.family\n"
        "inputs = fam.inputs(np, env, np.random.default_rng(0))\n"
        "out = fam.reference(np, inputs, env)['out']\n"
        "x, y = inputs['x'].astype(np.float64), inputs['y'].astype(np.float64)\n"
        "print(float(abs(out - (1.5 * x + y)).max()), out.shape)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(space.path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0.0", f"({1 << 16},)"]


def test_tuning_again_replaces_the_reference_in_this_process(tmp_path):
    import numpy as np

    for factor in (1.0, 2.0):
        space = tuner.tune_space(
            "again",
            TEMPLATE,
            PARAMS,
            PROBLEM,
            lambda x, y, alpha, n, f=factor: f * (alpha * x + y),
            directory=tmp_path / "again",
            **KERNEL,
        )
        env = space.problem().env
        inputs = space.family.inputs(np, env, np.random.default_rng(0))
        out = space.family.reference(np, inputs, env)["out"]
        expected = factor * (0.5 * inputs["x"].astype(np.float64) + inputs["y"])
        assert float(abs(out - expected).max()) == 0.0


def test_without_a_reference_the_space_is_written_and_a_gpu_study_refuses(tmp_path):
    space = tuner.tune_space("noref", TEMPLATE, PARAMS, PROBLEM, directory=tmp_path / "noref", **KERNEL)
    assert not (tmp_path / "noref" / "reference.py").exists()
    with pytest.raises(tuner.InputError, match="declares no reference"):
        tuner.study(space, 4, storage=f"sqlite:///{tmp_path}/x.db")


def test_a_reference_that_raises_stops_the_study_before_anything_is_stored(tmp_path):
    ref = notebook_function("def ref(x, y, alpha, n):\n    return x / 0 + undefined_name\n", "ref")
    space = tuner.tune_space("raises", TEMPLATE, PARAMS, PROBLEM, ref, directory=tmp_path / "r", **KERNEL)
    record(space.path, tmp_path / "rec.db")
    with pytest.raises(tuner.InputError, match="raised NameError: name 'undefined_name'") as exc:
        tuner.tune(
            "raises",
            TEMPLATE,
            PARAMS,
            PROBLEM,
            ref,
            trials=2,
            replay=tmp_path / "rec.db",
            storage=f"sqlite:///{tmp_path}/x.db",
            directory=tmp_path / "r",
            **KERNEL,
        )
    assert len(str(exc.value).splitlines()) == 1
    assert not (tmp_path / "x.db").exists()


def _ref(x, y, alpha, n):
    return alpha * x + y


_LOCK = threading.Lock()  # a lock does not pickle: neither does a reference that holds one


BAD = {
    "unknown name in a constraint": ({"constraints": ["block * vec <= width"]}, "names unknown symbol(s) width"),
    "empty value list": ({"params": {**PARAMS, "vec": []}}, "param 'vec' has no values"),
    "values not a list": ({"params": {**PARAMS, "vec": 4}}, "param 'vec': expected a list of values, got int"),
    "template syntax": ({"template": "{% if vec %}\n{{ vec }"}, "template line 2: unexpected '}'"),
    "template undefined variable": (
        {"template": "extern\n__global__ void {{ entry }}() { {{ nope }} }"},
        "template line 2: undefined variable: 'nope' is undefined",
    ),
    "template file missing": ({"template": "missing.cu.j2"}, "template file 'missing.cu.j2': No such file"),
    "argument form": ({"arguments": ["x: inptu[n]"]}, "argument 'x: inptu[n]': expected"),
    "shape of an unknown size": (
        {"arguments": ["x: input[m]", "out: output[n]"]},
        "shape 'm' names unknown symbol(s) m",
    ),
    "launch of an unknown param": ({"grid": "ceil_div(n, threads)"}, "names unknown symbol(s) threads"),
    "reference not callable": ({"reference": "ref.py:f"}, "reference must be a callable, got str"),
    "reference does not pickle": (
        {"reference": lambda x, y, alpha, n, lock=_LOCK: x},
        "reference cannot be stored with cloudpickle",
    ),
    "unknown dtype": ({"problem": {"n": 1024, "dtype": "float8"}}, "problem dtype 'float8': choose from float32"),
    "problem size not an int": ({"problem": {"n": 1.5}}, "problem size 'n' must be a positive 64-bit integer"),
    "name": ({"name": "scale-add"}, "kernel name 'scale-add' is not a C identifier"),
    "name-not-ascii": ({"name": "größe"}, "kernel name 'größe' is not a C identifier"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, case):
    change, message = BAD[case]
    args = {
        "name": "k",
        "template": TEMPLATE,
        "params": PARAMS,
        "problem": PROBLEM,
        "reference": _ref,
        **KERNEL,
        "directory": tmp_path / "k",
        **change,
    }
    with pytest.raises(tuner.InputError) as exc:
        tuner.tune_space(**args)
    assert message in str(exc.value), str(exc.value)
    assert len(str(exc.value).splitlines()) == 1
    assert not (tmp_path / "k").exists()


def test_the_readme_notebook_form_runs_as_written(tmp_path, monkeypatch):
    """The README's code, run as it stands in a copy of examples/scale_add, answered from a recording (and on
    2^16 elements instead of its 2^26, so the NumPy reference stays light on a CPU)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### From a notebook") : readme.index("### Headers, bf16 and references")].rstrip()
    assert len(section.splitlines()) <= 15
    code = section[section.index("```python\n") + 10 : section.index("```", section.index("```python\n") + 10)]
    shutil.copy(TEMPLATE, tmp_path)
    monkeypatch.chdir(tmp_path)
    real = tuner.tune

    def replayed(name, template, **kw):
        kw["problem"] = {"n": 1 << 16}
        space = tuner.tune_space(name, template, **{k: v for k, v in kw.items() if k != "trials"})
        record(space.path, tmp_path / "rec.db")
        return real(name, template, replay=tmp_path / "rec.db", **kw)

    monkeypatch.setattr(tuner, "tune", replayed)
    namespace = {"__name__": "__main__"}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["result"].summary["trials"] == 48
    assert "scale_add_vec" in (tmp_path / "scale_add_tuned.h").read_text()
    assert (tmp_path / "studies" / "scale_add.db").is_file()


def test_tune_and_tune_space_take_one_kernel_spec():
    """The kernel's arguments are written once, as the fields of `KernelSpec`: `tune_space` takes them, `tune` takes
    them and `trials` and the study's keywords; their signatures show them."""
    import dataclasses
    import inspect

    from tuner.api import KernelSpec

    names = [f.name for f in dataclasses.fields(KernelSpec)]
    assert list(inspect.signature(tuner.tune_space).parameters) == names
    tune_names = list(inspect.signature(tuner.tune).parameters)
    assert tune_names == [*names[: names.index("block") + 1], "trials", *names[names.index("block") + 1 :], "options"]
    spec = KernelSpec("k", TEMPLATE, PARAMS, PROBLEM, _ref, **KERNEL)
    assert (spec.smem, spec.constraints, spec.directory) == (0, (), None)


@pytest.mark.parametrize(
    "keywords, message",
    [
        ({"constraint": ["vec <= 2"]}, "tuner.tune has no keyword 'constraint': did you mean 'constraints'?"),
        ({"gpus": 0}, "gpus 0: a positive integer"),
        ({"trials": 0}, "trials 0: a positive integer"),
    ],
)
def test_a_keyword_tune_cannot_take_is_one_line_and_writes_nothing(tmp_path, keywords, message):
    keywords = {"trials": 3, **keywords}
    with pytest.raises(tuner.InputError) as exc:
        tuner.tune("k", TEMPLATE, PARAMS, PROBLEM, _ref, directory=tmp_path / "k", **KERNEL, **keywords)
    assert str(exc.value) == message or str(exc.value).startswith(message), str(exc.value)
    assert len(str(exc.value).splitlines()) == 1
    assert not (tmp_path / "k").exists()


def test_tune_where_no_gpu_is_visible_refuses_before_anything_is_written(tmp_path):
    """In a process that sees no GPU (CUDA_VISIBLE_DEVICES empty, so on any machine), a study that needs one is
    refused in one line, and neither studies/NAME/ nor a database is made."""
    call = (
        "import sys, tuner\n"
        "from tests.test_tune import KERNEL, PARAMS, PROBLEM, TEMPLATE, _ref\n"
        "try:\n"
        "    tuner.tune('k', TEMPLATE, PARAMS, PROBLEM, _ref, trials=3, **KERNEL)\n"
        "except tuner.InputError as exc:\n"
        "    print(exc)\n"
        "    sys.exit(2)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, "-c", call], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [
        "the local engine runs on this machine's GPUs, and it has none: CUDA_VISIBLE_DEVICES='' hides every GPU "
        "(use --replay PATH to run without one, or --engine ray --ray-address for a cluster's)"
    ]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gpu
def test_tune_on_the_gpu_end_to_end(tmp_path, monkeypatch):
    """The one call verifies and times every config of the README's kernel on a real GPU."""
    from tests.gpu.test_evaluator_gpu import HAVE_GPU

    if not HAVE_GPU:
        pytest.skip("needs a CUDA GPU")
    monkeypatch.chdir(tmp_path)
    ref = notebook_function("def scale_add(x, y, alpha, n):\n    return alpha * x + y\n", "scale_add")
    result = tuner.tune("scale_add", TEMPLATE, PARAMS, {"n": 1 << 26}, ref, trials=48, sampler="grid", gpus=1, **KERNEL)
    measured = [t for t in result.study.trials if t.state.name == "COMPLETE"]
    assert len(measured) == 48, [t.user_attrs.get("reason") for t in result.study.trials]
    assert result.best["fraction_of_ceiling"] >= 0.8, result.best
    assert "scale_add" in result.export_header(tmp_path / "h.h").read_text()
