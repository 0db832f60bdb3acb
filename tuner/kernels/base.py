"""The contract every kernel family implements: the public API for bringing a kernel of your own.

A family is the Python half of a template: it knows the shapes of the arguments, how to launch the rendered
kernels, the reference the output must match, and the minimal bytes and FLOPs that turn a time into a throughput.
Everything here is host-side and GPU-free, so CPU tests exercise it with NumPy; `tuner.gpu.evaluator` passes CuPy as
`xp`.

Most memory-bound kernels need no class at all: a declarative ``kernel:`` block in the space file describes the
same things as data (`tuner.kernels.declarative`). Write a `Family` subclass when the launches, inputs or
reference need code; the space names it with ``family: myfile.py:MyFamily`` (a file next to the space) or
``family: mypkg.mod:MyFamily`` (importable from the space's directory or the environment), and an installed
package can register it under the entry point group ``tuner.build.families``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

Config = dict[str, Any]
Problem = dict[str, Any]
#: What `Family.outputs` returns: output name → (shape, dtype name).
Outputs = dict[str, tuple[tuple[int, ...], str]]
#: The array module a family computes with: numpy on the host (CPU tests), cupy on the GPU (`tuner.gpu.evaluator`).
ArrayModule = ModuleType
#: An array of that module. CuPy ships no type information, so no narrower type covers both.
Array = Any

DTYPES = {
    "float32": ("float", 4),
    "float16": ("__half", 2),
    "bfloat16": ("__nv_bfloat16", 2),
}


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a config: the entry-point name in the rendered source, its geometry, and the names
    of its arguments (keys of the arrays dict, or of the problem for scalars), in call order."""

    entry: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[str, ...]
    smem_dynamic: int = 0


class ReferenceFailed(Exception):
    """A user's reference raised or returned the wrong thing; the evaluator records a failed trial with this
    reason instead of stopping the study."""


class Family:
    """Base class of every kernel family (shipped ones live in tuner/kernels/, one module each).

    Subclasses set `name`, `template` and `dtypes` and implement `launches`, `inputs`, `outputs`, `reference`
    and `bytes_moved` (`tolerance`, `flops` and `checked` have defaults). Methods receive the config (params plus
    derived values) and the problem (sizes plus ``dtype``), both plain dicts; they run on the host and must not
    keep state between calls (workers in other processes load their own instance).

    The arguments a kernel takes are the names in ``Launch.args``: each is a key of `inputs()` or `outputs()`
    (an array), else a problem size or a config value (a scalar: ints go as 64 bits, floats as 32). The
    template's entry point must be ``extern "C" __global__ void {{ entry }}(...)`` with those arguments in order.

    A worked example, ``y = a * x`` over n floats (scale.py next to the space; the space says
    ``family: scale.py:Scale`` and ``template: scale.cu.j2``, with a param ``block``)::

        from tuner.kernels.base import Family, Launch

        class Scale(Family):
            name = "scale"
            template = "scale.cu.j2"          # found next to the space file
            problem_sizes = ("n",)            # every problem must name n

            def launches(self, entry, config, problem):
                n, block = problem["n"], config["block"]
                return [Launch(entry, grid=((n + block - 1) // block, 1, 1), block=(block, 1, 1),
                               args=("x", "y", "n"))]

            def inputs(self, xp, problem, rng):
                return {"x": rng.standard_normal((problem["n"],), dtype=xp.float32)}

            def outputs(self, problem, config):
                return {"y": ((problem["n"],), problem["dtype"])}

            def reference(self, xp, inputs, problem, config=None):
                return {"y": 2.0 * inputs["x"].astype(xp.float64)}

            def bytes_moved(self, problem):
                return 2 * problem["n"] * self.elem_bytes(problem)   # x read once, y written once

    Importing a family module runs its code: the user chose to name it in their space file.
    """

    name: str = ""
    template: str = ""
    #: Directory that holds `template` (a space's directory, an installed package's); None: the shipped ones.
    template_dir: str | None = None
    #: NVRTC options for every config, after the tuner's own (a space's checked ``compile_options:``).
    compile_options: tuple[str, ...] = ()
    #: Folders NVRTC searches for local ``#include``s after the template's own folder (a space's ``-I`` folders
    #: and the space's folder); CUDA's own headers are found without them (`tuner.build.includes`).
    include_dirs: tuple[str, ...] = ()
    #: How any process finds this family again (`tuner.build.families.get`): its name, or ``space:PATH``.
    ref: str = ""
    dtypes: tuple[str, ...] = ("float32",)
    #: Sizes every problem of this family must name (e.g. ("M", "N", "K")).
    problem_sizes: tuple[str, ...] = ()
    #: The unit `throughput` means for this family: "TB/s" for memory-bound families, "TFLOP/s" for GEMM.
    throughput_unit: str = "TB/s"
    #: Short names used in readable uris, e.g. {"tile_m": "tm"}; params not listed use their full name.
    uri_names: dict[str, str] = {}
    #: Knobs added after configs were recorded, with the value that leaves the kernel as it was: a config at that
    #: value keeps the uri (and kernel entry name) it had before the knob existed, e.g. {"order": "row"}.
    uri_defaults: dict[str, object] = {}

    # -- launching ----------------------------------------------------------------------------------------------
    def launches(self, entry: str, config: Config, problem: Problem) -> list[Launch]:
        """The launches that compute one call of this config; `entry` is the rendered source's entry name."""
        raise NotImplementedError

    # -- data ---------------------------------------------------------------------------------------------------
    def inputs(self, xp: ArrayModule, problem: Problem, rng: Any) -> dict[str, Array]:
        """Fresh random inputs on `xp` (numpy or cupy); `rng` is that module's random Generator."""
        raise NotImplementedError

    def outputs(self, problem: Problem, config: Config) -> Outputs:
        """Output names → (shape, dtype); bench poisons them with NaN before each checked launch. Scratch
        buffers that intermediate launches write (e.g. an unfused stage) are outputs too."""
        raise NotImplementedError

    def checked(self) -> tuple[str, ...]:
        """Names of the outputs that must match the reference (default: all that `reference` returns). A name
        may be an input that the kernel updates in place (e.g. an optimizer's weights): it is checked as it is
        after the launch; its reference is computed before the launch."""
        return ()

    def reference(
        self, xp: ArrayModule, inputs: dict[str, Array], problem: Problem, config: Config | None = None
    ) -> dict[str, Array]:
        """Expected outputs (name → array of the output's shape), computed in float64 (or the best the backend
        offers) on `xp`. The evaluator passes the resolved config; most families compute the same function for
        every config and ignore it (copy's expected output depends on its stride and vec). May raise
        `ReferenceFailed`: the config's trial then fails with that reason."""
        raise NotImplementedError

    def reference_on_host(self) -> bool:
        """Whether `reference` computes on the host (NumPy, whatever `xp` it is given): seconds per input set at
        LLM sizes, so the GPU evaluator computes the later sets' references ahead, in the background
        (`tuner.gpu.verify`), calling ``reference(numpy, inputs, ...)`` on a host copy of the inputs. Default False:
        the shipped families compute on `xp`, the GPU."""
        return False

    def reference_imports(self) -> tuple[Any, ...]:
        """The user's functions (`tuner.kernels.usercode.UserFunction`) whose modules `reference` imports where it
        first runs: the GPU worker imports them in the background as soon as it is told the family, while the
        first configs compile, so that the first check does not wait for them (a module that imports torch takes
        seconds). None by default; nothing is imported here."""
        return ()

    def reference_key(self, config: Config) -> tuple:
        """The values of `config` that the reference reads (default: none, the same reference for every config).
        The GPU evaluator computes a reference once per input set and key (`tuner.gpu.verify`), so a family whose
        expected output depends on the config (copy: its stride and vec) must name what it reads here."""
        return ()

    def tolerance(self, problem: Problem) -> float | dict[str, float]:
        """Allowed max |out - ref| / max(|ref|, 1) element-wise; fits the dtype and the reduction length. A dict
        gives one tolerance per checked output name."""
        return {"float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2}[problem["dtype"]]

    def checked_value(self, xp: ArrayModule, name: str, array: Array, dtype: str | None) -> Array:
        """What the check compares with ``reference()[name]``: the stored `array` of output `name` (`dtype` as
        `outputs` declares it; None for an input updated in place), bf16 bits decoded to float32 by default.
        Families that store other encodings (fp8 codes) map them to the scale their reference uses."""
        from tuner.kernels import bf16

        return bf16.decode(xp, array) if dtype == "bfloat16" else array

    def checked_stored(self, name: str, array: Array, dtype: str | None) -> str | None:
        """The dtype of the values the stored `array` of output `name` holds, where the check compares them as
        they are stored (``"bfloat16"`` for bf16 bits, else the array's own dtype): the GPU's one-pass check then
        reads `array` itself, with no decoded copy. None where the check compares what `checked_value` returns
        instead. By default the stored values wherever `checked_value` is `Family`'s own (which only decodes bf16
        bits), None where a subclass has its own `checked_value`, whose mapping only it knows."""
        if type(self).checked_value is not Family.checked_value:
            return None
        return "bfloat16" if dtype == "bfloat16" else np.dtype(array.dtype).name

    def problem_fault(self, problem: Problem) -> str | None:
        """Why this family cannot run `problem` whatever the config (e.g. head counts that do not group), or
        None. The space loader reports it against the problem's line in the space file."""
        return None

    # -- accounting -----------------------------------------------------------------------------------------------
    def bytes_moved(self, problem: Problem) -> int:
        """Minimal device-memory traffic of one call: each input read once, each output written once."""
        raise NotImplementedError

    def flops(self, problem: Problem) -> int:
        """Useful floating-point operations of one call (0 for pure data movement)."""
        return 0

    # -- helpers ----------------------------------------------------------------------------------------------
    @staticmethod
    def elem_bytes(problem: Problem) -> int:
        """Bytes per element of the problem's dtype."""
        return DTYPES[problem["dtype"]][1]

    @staticmethod
    def np_dtype(problem: Problem) -> np.dtype | type[np.generic]:
        """The NumPy dtype of the problem's dtype (ml_dtypes' bfloat16 type for bfloat16)."""
        if problem["dtype"] == "bfloat16":
            import ml_dtypes  # optional: only families that offer bf16 need it

            return ml_dtypes.bfloat16
        return np.dtype(problem["dtype"])
