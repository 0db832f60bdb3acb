"""A user's own kernel, from a directory of theirs: declarative blocks, Python families (a file, a module, an
entry point), templates next to the space; real NVRTC (sm_90), real Optuna, real Ray (logical GPUs) against a
replay recording, and the one-line errors of bad input.

The recordings here are synthetic (`record` writes one trial per valid config with made-up times): they stand in
for a GPU so that the driver, the actors and export run for real on a machine without one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.fakes import recorded_study
from tuner import kernels
from tuner.build import families
from tuner.core.errors import InputError
from tuner.gpu.protocol import EvaluateRequest, Evaluator
from tuner.kernels.base import ReferenceFailed
from tuner.space import space as space_mod

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "scale_add"


def tuner(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


def record(space_file: Path, db: Path) -> int:
    """A synthetic recording of every valid config of `space_file`: COMPLETE trials whose user attrs hold a
    Measurement (time falls with vec, so the best config is known). Returns the number of trials."""
    space = space_mod.load(space_file)
    dists = {name: optuna.distributions.CategoricalDistribution(values) for name, values in space.params.items()}
    configs = space.valid_configs()
    trials = []
    for i, config in enumerate(configs):
        ms = 1.0 / config.get("vec", 1) + 0.001 * i
        attrs = {
            "median_ms": ms,
            "p20_ms": ms,
            "p80_ms": ms,
            "repetitions": 10,
            "bytes_moved": 3 << 28,
            "flops": 0,
            "tbps": (3 << 28) / ms / 1e9,
            "tflops": 0.0,
            "ceiling_tbps": 4.0,
            "fraction_of_ceiling": (3 << 28) / ms / 1e9 / 4.0,
            "registers": 16,
            "smem_static_bytes": 0,
            "smem_dynamic_bytes": 0,
            "spill_bytes": 0,
            "gpu": "synthetic",
        }
        trials.append(
            optuna.trial.create_trial(params=config, distributions=dists, values=[attrs["tbps"]], user_attrs=attrs)
        )
    recorded_study(f"sqlite:///{db}", trials)
    return len(configs)


# ---------------------------------------------------------------------------------------------------------------
# the README's example (examples/scale_add): declarative block, template and reference next to the space


def test_example_compiles_for_sm90_from_another_directory(tmp_path):
    proc = tuner("check", str(EXAMPLE / "scale_add.yaml"), "--sample", "6", "--arch", "sm_90", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["compiled"] == 6 and summary["failed"] == 0
    assert all(r["uri"].startswith("scale_add_vec") and r["registers"] > 0 for r in summary["configs"])
    assert list(tmp_path.iterdir()) == []  # check writes nothing


def test_example_family_is_what_the_block_says():
    space = space_mod.load(EXAMPLE / "scale_add.yaml")
    family = space.family
    problem = space.problem().env
    assert space.kernel == family.name == "scale_add" and space.family_ref.startswith("space:")
    assert kernels.get(space.family_ref) is family  # what a worker process resolves
    assert family.bytes_moved(problem) == 3 * 4 * problem["n"]  # default: inputs read once, output written once
    config = space.resolve({"vec": 4, "block": 256, "items": 2})
    (launch,) = family.launches("e", config, problem)
    assert launch.grid == (problem["n"] // (4 * 256 * 2), 1, 1) and launch.block == (256, 1, 1)
    assert launch.args == ("x", "y", "out", "alpha", "n")


def test_example_study_against_a_replay_then_export(tmp_path):
    work = tmp_path / "mine"
    shutil.copytree(EXAMPLE, work)
    n = record(work / "scale_add.yaml", tmp_path / "rec.db")
    proc = tuner(
        "study",
        "scale_add",
        "--space",
        "scale_add.yaml",
        "--trials",
        "15",
        "--replay",
        str(tmp_path / "rec.db"),
        "--gpus",
        "2",
        "--seed",
        "3",
        "--json",
        cwd=work,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["trials"] == 15 and n >= 15
    url = f"sqlite:///{work}/studies/scale_add.db"
    study = optuna.load_study(study_name=optuna.get_all_study_summaries(url)[0].study_name, storage=url)
    assert study.user_attrs["kernel"] == "scale_add"
    assert study.user_attrs["family"] == f"space:{work / 'scale_add.yaml'}"
    assert sum(t.state.name == "COMPLETE" for t in study.trials) > 0

    proc = tuner("export", "scale_add", "--header", "scale_add_tuned.h", cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = (work / "scale_add_tuned.h").read_text()
    assert "scale_add_vec" in header


# ---------------------------------------------------------------------------------------------------------------
# a Python family: a file next to the space, a module importable from its directory

FAMILY_PY = """
from tuner.kernels.base import Family, Launch


class Twice(Family):
    name = "twice"
    template = "twice.cu.j2"
    problem_sizes = ("n",)

    def launches(self, entry, config, problem):
        n, block = problem["n"], config["block"]
        return [Launch(entry, ((n + block - 1) // block, 1, 1), (block, 1, 1), ("x", "y", "n"))]

    def inputs(self, xp, problem, rng):
        return {"x": rng.standard_normal((problem["n"],), dtype=xp.float32)}

    def outputs(self, problem, config):
        return {"y": ((problem["n"],), problem["dtype"])}

    def reference(self, xp, inputs, problem, config=None):
        return {"y": 2.0 * inputs["x"].astype(xp.float64)}

    def bytes_moved(self, problem):
        return 2 * problem["n"] * self.elem_bytes(problem)
"""
TWICE_TEMPLATE = """\
extern "C" __global__ void __launch_bounds__({{ block }}) {{ entry }}(const float* x, float* y, long long n)
{
    long long i = (long long)blockIdx.x * {{ block }} + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""
TWICE_SPACE = """\
family: {spec}
problem: {{name: n1M, n: 1048576, dtype: float32}}
params:
  block: [64, 128, 256, 512]
"""


def _python_kernel(directory: Path, spec: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    if spec.startswith("twice.py"):
        (directory / "twice.py").write_text(FAMILY_PY)
    else:
        (directory / "mykernels").mkdir()
        (directory / "mykernels" / "__init__.py").write_text("")
        (directory / "mykernels" / "twice_family.py").write_text(FAMILY_PY)
    (directory / "twice.cu.j2").write_text(TWICE_TEMPLATE)
    (directory / "twice.yaml").write_text(TWICE_SPACE.format(spec=spec))
    return directory / "twice.yaml"


@pytest.mark.parametrize("spec", ["twice.py:Twice", "mykernels.twice_family:Twice"])
def test_python_family_compiles_and_runs_a_replay_study(tmp_path, spec):
    space_file = _python_kernel(tmp_path / "k", spec)
    proc = tuner("check", "twice.yaml", "--arch", "sm_90", "--json", cwd=space_file.parent)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["compiled"] == 4 and {r["uri"] for r in summary["configs"]} == {
        f"twice_block{b}" for b in (64, 128, 256, 512)
    }

    record(space_file, tmp_path / "rec.db")
    url = f"sqlite:///{tmp_path}/s.db"
    # Two logical GPUs: each Ray actor resolves the family from its reference (space:PATH) on its own.
    proc = tuner(
        "study",
        "twice",
        "--space",
        str(space_file),
        "--trials",
        "6",
        "--replay",
        str(tmp_path / "rec.db"),
        "--gpus",
        "2",
        "--storage",
        url,
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = optuna.load_study(study_name=optuna.get_all_study_summaries(url)[0].study_name, storage=url)
    assert sum(t.state.name == "COMPLETE" for t in study.trials) >= 4  # 4 configs; the rest are duplicates


def test_python_family_reference_that_raises_is_a_reference_failure(tmp_path):
    space_file = _python_kernel(tmp_path, "twice.py:Twice")
    (tmp_path / "twice.py").write_text(FAMILY_PY.replace('return {"y": 2.0', 'return {"y": 1 / 0'))
    family = space_mod.load(space_file).family
    import numpy as np

    inputs = family.inputs(np, {"n": 8, "dtype": "float32"}, np.random.default_rng(0))
    with pytest.raises(ReferenceFailed, match=r"ZeroDivisionError.*twice.py:\d+"):
        family.reference(np, inputs, {"n": 8, "dtype": "float32"})


# ---------------------------------------------------------------------------------------------------------------
# entry points: an installed package registers a family under tuner.build.families


def test_entry_point_family(tmp_path):
    site = tmp_path / "site"
    pkg = site / "epkernels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        FAMILY_PY.replace('name = "twice"', 'name = "twice_ep"').replace(
            'template = "twice.cu.j2"',
            'template = "twice.cu.j2"\n    template_dir = __import__("os").path.dirname(__file__)',
        )
    )
    (pkg / "twice.cu.j2").write_text(TWICE_TEMPLATE)
    dist = site / "epkernels-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: epkernels\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[tuner.build.families]\ntwice_ep = epkernels:Twice\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "ep.yaml").write_text("kernel: twice_ep\nproblem: {name: small, n: 4096}\nparams:\n  block: [128, 256]\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    proc = subprocess.run(
        [sys.executable, "-m", "tuner", "check", "ep.yaml", "--arch", "sm_90", "--json"],
        cwd=work,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert {r["uri"] for r in json.loads(proc.stdout)["configs"]} == {"twice_ep_block128", "twice_ep_block256"}

    sys.path.insert(0, str(site))
    try:
        assert "twice_ep" in kernels.names()
        family = kernels.get("twice_ep")
        assert family.name == "twice_ep" and family.ref == "twice_ep"
    finally:
        sys.path.remove(str(site))
        kernels._LOADED.pop("twice_ep", None)


# ---------------------------------------------------------------------------------------------------------------
# bad input: one line naming the file (and line), exit 2, no traceback, nothing written

DECL = """\
kernel:
  name: k
  arguments:
    - {name: x, role: input, shape: [n]}
    - {name: y, role: output, shape: [n]}
    - {name: n, role: scalar}
  launch: {grid: ["ceil_div(n, block)"], block: [block]}
  reference: ref.py:ref
template: k.cu.j2
problem: {name: p, n: 4096}
params:
  block: [128, 256]
"""
K_TEMPLATE = """\
extern "C" __global__ void {{ entry }}(const float* x, float* y, long long n)
{
    long long i = (long long)blockIdx.x * {{ block }} + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""
REF = "def ref(x, n):\n    return x\n"

BAD = {
    "family does not import": (
        {
            "k.yaml": "family: fam.py:F\nproblem: {n: 8}\nparams: {block: [1]}\n",
            "fam.py": "import numpy\nraise RuntimeError('broken on purpose')\n",
        },
        r"fam\.py:2: fam\.py does not import: RuntimeError: broken on purpose",
    ),
    "family file missing": (
        {"k.yaml": "family: nofile.py:F\nproblem: {n: 8}\nparams: {block: [1]}\n"},
        r"k\.yaml:1: nofile\.py not found next to the space",
    ),
    "family module missing": (
        {"k.yaml": "family: nomod.fam:F\nproblem: {n: 8}\nparams: {block: [1]}\n"},
        r"k\.yaml:1: no module 'nomod\.fam'",
    ),
    "not a Family": (
        {"k.yaml": "problem: {n: 8}\nparams: {block: [1]}\nfamily: fam.py:F\n", "fam.py": "class F:\n    pass\n"},
        r"k\.yaml:3: family 'fam\.py:F': F is not a subclass of tuner\.kernels\.base\.Family",
    ),
    "missing field": (
        {"k.yaml": DECL.replace("  launch: {grid", "  lunch: {grid")},
        r"k\.yaml:7: kernel: unknown field 'lunch'",
    ),
    "missing required field": (
        {"k.yaml": DECL.replace('  launch: {grid: ["ceil_div(n, block)"], block: [block]}\n', "")},
        r"k\.yaml:1: kernel: missing field 'launch'",
    ),
    "unknown argument field": (
        {"k.yaml": DECL.replace("{name: x, role: input,", "{name: x, rol: input,")},
        r"k\.yaml:4: kernel: argument: unknown field 'rol'",
    ),
    "unknown name in shape": (
        {"k.yaml": DECL.replace("{name: y, role: output, shape: [n]}", "{name: y, role: output, shape: [m]}")},
        r"k\.yaml:5: kernel: shape 'm' names unknown symbol\(s\) m",
    ),
    "template missing": (
        {"k.yaml": DECL.replace("template: k.cu.j2", "template: gone.cu.j2")},
        r"k\.yaml:9: template 'gone\.cu\.j2' not found in ",
    ),
    "reference raises": (
        {"ref.py": "def ref(x, n):\n    return x[n + 10 ** 9]\n"},
        r"k\.yaml: reference ref\.py:ref raised IndexError: .*ref\.py:2\)",
    ),
    "reference wrong shape": (
        {"ref.py": "def ref(x, n):\n    return x[:5]\n"},
        r"k\.yaml: reference ref\.py:ref returned 'y' with shape \(5,\), but the kernel "
        r"writes \(4096,\)",
    ),
    "reference does not import": (
        {"ref.py": "def ref(x, n)\n    return x\n"},
        r"ref\.py:1: ref\.py does not import: SyntaxError",
    ),
    "reference takes other arguments": (
        {"ref.py": "def ref(x):\n    return x\n"},
        r"k\.yaml:8: kernel: reference 'ref\.py:ref' cannot be called with its arguments \(x, n\): "
        r"got an unexpected keyword argument 'n'",
    ),
}
#: faults only running the reference finds: a study runs it (its GPU worker, or the host for a replay), `tuner
#: check` does not
RUN_FAULTS = ("reference raises", "reference wrong shape")


def _write_bad(directory: Path, files: dict[str, str]) -> None:
    base = {"k.yaml": DECL, "k.cu.j2": K_TEMPLATE, "ref.py": REF}
    for name, text in {**base, **files}.items():
        (directory / name).write_text(text)


@pytest.mark.parametrize(
    "command, case",
    [("check", case) for case in sorted(BAD) if case not in RUN_FAULTS] + [("study", case) for case in sorted(BAD)],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, case, command):
    import re

    files, pattern = BAD[case]
    if command == "study" and case in RUN_FAULTS:
        # A study runs the reference in its GPU worker (once per input set), so with no GPU here it stops at "no
        # GPU"; test_verify.py's GPU test and test_tune.py's replay study cover the reference's fault.
        pattern = "the local engine runs on this machine.s GPUs, and it has none"
    _write_bad(tmp_path, files)
    before = sorted(p.name for p in tmp_path.iterdir())
    args = (
        ["check", "k.yaml", "--arch", "sm_90"]
        if command == "check"
        else ["study", "k", "--space", "k.yaml", "--trials", "2"]
    )
    proc = tuner(*args, cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == before


def test_a_good_declarative_kernel_passes_the_same_checks(tmp_path):
    _write_bad(tmp_path, {})
    proc = tuner("check", "k.yaml", "--arch", "sm_90", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["compiled"] == 2


@pytest.mark.parametrize("case", RUN_FAULTS)
def test_check_never_runs_the_reference(tmp_path, case):
    """`tuner check` compiles: a reference that would fail (or that leaves a mark when called) is imported and its
    signature read, never called, so its problem's arrays are never allocated."""
    files, _ = BAD[case]
    body = files["ref.py"].replace("def ref(x, n):\n", "def ref(x, n):\n    open('called', 'w').close()\n")
    _write_bad(tmp_path, {"ref.py": body})
    proc = tuner("check", "k.yaml", "--arch", "sm_90", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["compiled"] == 2
    assert not (tmp_path / "called").exists()


def test_check_says_a_template_fault_before_it_asks_cupy_anything(tmp_path):
    """The sources are rendered before the GPU's arch is looked up (CuPy's import alone takes about a second), so
    a typo in the template is one line as quickly as `tuner render` says it."""
    _write_bad(tmp_path, {"k.cu.j2": K_TEMPLATE.replace("{{ block }}", "{{ blok }}")})
    code = (
        "import sys\nfrom tuner.cli.main import main\nrc = main(['check', 'k.yaml'])\n"
        "print(rc, 'cupy' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout.split() == ["2", "False"], proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "k.cu.j2:3: undefined variable: 'blok' is undefined" in line


def test_without_a_reference_check_works_and_a_gpu_study_refuses(tmp_path):
    _write_bad(tmp_path, {"k.yaml": DECL.replace("  reference: ref.py:ref\n", "")})
    assert tuner("check", "k.yaml", "--arch", "sm_90", cwd=tmp_path).returncode == 0
    proc = tuner("study", "k", "--space", "k.yaml", "--trials", "2", cwd=tmp_path)
    assert proc.returncode == 2 and "declares no reference" in proc.stderr
    assert not (tmp_path / "studies").exists()


def test_a_reference_that_raises_in_a_study_is_a_reference_failure(tmp_path):
    """The evaluator turns ReferenceFailed into a WrongResult trial (tuner/gpu/evaluator.py); here: the family raises
    it, never anything else, whatever the user's function does."""
    _write_bad(tmp_path, {"ref.py": "def ref(x, n):\n    raise ValueError('no')\n"})
    # load without running the reference: a space file alone never runs it
    family = space_mod.load(tmp_path / "k.yaml").family
    import numpy as np

    inputs = family.inputs(np, {"n": 16, "dtype": "float32"}, np.random.default_rng(0))
    with pytest.raises(ReferenceFailed, match="raised ValueError: no"):
        family.reference(np, inputs, {"n": 16, "dtype": "float32"})


def test_space_file_alone_runs_no_code(tmp_path):
    """A YAML + template space (no family:, no reference:) loads without importing anything of the user's."""
    _write_bad(
        tmp_path,
        {"k.yaml": DECL.replace("  reference: ref.py:ref\n", ""), "ref.py": "raise SystemExit('must not run')\n"},
    )
    space = space_mod.load(tmp_path / "k.yaml")
    assert space.family.has_reference is False


def test_expressions_outside_the_whitelist_are_refused(tmp_path):
    _write_bad(tmp_path, {"k.yaml": DECL.replace('"ceil_div(n, block)"', "\"__import__('os').getpid()\"")})
    with pytest.raises(InputError, match=r"k\.yaml:7: .*not allowed"):
        space_mod.load(tmp_path / "k.yaml")


def _have_gpu() -> bool:
    from tests.gpu.test_evaluator_gpu import HAVE_GPU

    return HAVE_GPU


@pytest.mark.gpu
def test_a_reference_that_raises_is_a_failed_trial_on_the_gpu(tmp_path):
    if not _have_gpu():
        pytest.skip("needs a CUDA GPU")
    from tuner.gpu.evaluate import evaluate_config

    _write_bad(tmp_path, {"ref.py": "def ref(x, n):\n    raise ValueError('no')\n"})
    result = evaluate_config(tmp_path / "k.yaml", {"block": 128})
    assert result.kind == "wrong_result" and "raised ValueError: no" in result.reason
    assert evaluate_config(tmp_path / "k.yaml", {"block": 256}).ok is False


@pytest.mark.gpu
def test_the_example_verifies_on_the_gpu():
    if not _have_gpu():
        pytest.skip("needs a CUDA GPU")
    from tuner.gpu.evaluate import evaluate_config

    result = evaluate_config(EXAMPLE / "scale_add.yaml", {"vec": 4, "block": 256, "items": 2})
    assert result.ok, result
    assert result.bytes_moved == 12 * 67108864


# ---------------------------------------------------------------------------------------------------------------
# the README shows the example's files as they are; `tuner new` writes a starter that compiles


def test_readme_section_is_the_example_verbatim_and_short():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Tune your own kernel") : readme.index("### From a notebook")].rstrip()
    assert len(section.splitlines()) < 40
    assert "```cuda\n" + (EXAMPLE / "scale_add.cu.j2").read_text() + "```" in section
    assert "```yaml\n" + (EXAMPLE / "scale_add.yaml").read_text() + "```" in section
    assert "`" + (EXAMPLE / "ref.py").read_text().strip() + "`" in section


def test_tuner_new_writes_a_starter_that_compiles(tmp_path):
    proc = tuner("new", "mykernel", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mykernel.cu.j2", "mykernel.yaml", "mykernel_ref.py"]
    template = (tmp_path / "mykernel.cu.j2").read_text()
    for knob in ("vector width", "__launch_bounds__", "tile", "pad"):
        assert knob in template
    proc = tuner("check", "mykernel.yaml", "--arch", "sm_90", "--json", "--jobs", "1", cwd=tmp_path)  # tests/README.md
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["failed"] == 0 and summary["compiled"] == space_mod.load(tmp_path / "mykernel.yaml").count_valid()

    before = {p.name: p.read_text() for p in tmp_path.iterdir()}
    proc = tuner("new", "mykernel", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "mykernel.cu.j2: exists" in proc.stderr
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before
    assert tuner("new", "9lives", cwd=tmp_path).returncode == 2


# ---------------------------------------------------------------------------------------------------------------
# the GPU worker (another process) resolves a user's family from its reference


class ResolvingEvaluator(Evaluator):
    """Stands in for GpuEvaluator in the worker's child: answers with what the family it was sent resolves to."""

    ceiling_tbps = 1.0
    poisoned = False

    def start(self):
        return {"gpu": "fake", "ceiling_tbps": 1.0}

    def evaluate(self, request):
        from tuner.core.result import Invalid

        family = request.family
        resolved = families.get(family) if isinstance(family, str) else family
        return Invalid(reason=f"{type(family).__name__}:{resolved.name}:{resolved.template_dir}")


def test_the_worker_process_loads_a_user_family_by_reference():
    from tuner.gpu.worker import IsolatedEvaluator

    space = space_mod.load(EXAMPLE / "scale_add.yaml")
    with IsolatedEvaluator(evaluator_factory=ResolvingEvaluator, start_timeout_s=60.0) as evaluator:
        result = evaluator.evaluate(EvaluateRequest(None, space.family, space.default, space.problem()))
    assert result.reason == f"str:scale_add:{EXAMPLE.resolve()}"
