"""How a declarative family's reference (`tuner.kernels.declarative`) receives its arrays and hands back its results.

`REFERENCE_ARRAYS` names the three ways a reference may take its float arrays (``numpy``, ``xp``, ``torch``: the
docstring of `tuner.kernels.declarative` says what each gives); `reference_arrays_of` reads the way from the
function's signature and `call_fault` says whether that signature takes the arguments it is passed by name, both
without running it. `reference_array` turns one input into what the reference receives; `to_torch` and
`from_torch` carry arrays to torch tensors and a reference's tensors back. Nothing here runs the user's code.
"""

from __future__ import annotations

import inspect

import numpy as np

from tuner.kernels import bf16, declared

#: How a reference receives its arrays (see `tuner.kernels.declarative`).
REFERENCE_ARRAYS = ("numpy", "xp", "torch")


def reference_array(reference_arrays: str, xp, value, dtype: str, host=np.float64):
    """One input as a reference that takes its arrays as `reference_arrays` receives it (a NumPy reference's
    arrays as `host`)."""
    if reference_arrays == "torch":
        return to_torch(xp, value, dtype)
    if dtype == "bfloat16":
        value = bf16.decode(xp, value)
    elif dtype not in declared.FLOATS:  # indices, masks, counts: as they are, never widened to floats
        return value.get() if hasattr(value, "get") and xp is not np and reference_arrays == "numpy" else value
    if reference_arrays == "xp":
        return value if value.dtype.kind == "f" and value.dtype.itemsize >= 4 else value.astype(xp.float32)
    value = value.get() if hasattr(value, "get") and not isinstance(value, np.ndarray) else value
    return np.asarray(value, dtype=np.float64 if value.dtype == np.float64 else host)


def call_fault(fn, names: list[str]) -> str | None:
    """Why `fn` (a function or its `inspect.Signature`) cannot be called with keyword arguments `names` (its
    signature binds them or not), or None; also None where the signature is unknown (a builtin, a function its
    module's source does not show): the first call will say."""
    if fn is None:
        return None
    try:
        signature = fn if isinstance(fn, inspect.Signature) else inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(**dict.fromkeys(names))
    except TypeError as exc:
        return str(exc)
    return None


def reference_arrays_of(fn) -> str:
    """How `fn` (a function or its `inspect.Signature`) wants its arrays, read from its signature: "xp" when it
    has a parameter named ``xp``, "torch" when a parameter is annotated ``torch.Tensor`` (or ``Tensor``), else
    "numpy"."""
    try:
        parameters = (fn if isinstance(fn, inspect.Signature) else inspect.signature(fn)).parameters
    except (TypeError, ValueError):
        return "numpy"
    if "xp" in parameters:
        return "xp"
    for parameter in parameters.values():
        note = parameter.annotation
        text = (
            note.strip("'\"")  # a string annotation (`from __future__ import annotations` makes every one a string)
            if isinstance(note, str)
            else f"{getattr(note, '__module__', '')}.{getattr(note, '__name__', '')}"
        )
        if text in ("Tensor", "torch.Tensor") or text.endswith("torch.Tensor"):
            return "torch"
    return "numpy"


def to_torch(xp, value, dtype: str):
    """An input array as a torch tensor of its declared dtype: through DLPack on the GPU, from NumPy on the host;
    bf16 bits reinterpreted as torch.bfloat16."""
    import torch

    bits = dtype in ("bfloat16",)
    if xp is np:
        array = np.ascontiguousarray(value)
        tensor = torch.from_numpy(array.view(np.int16) if bits else array)
    else:
        tensor = torch.from_dlpack(value.view(xp.int16) if bits else value)
    return tensor.view(torch.bfloat16) if bits else tensor


def from_torch(xp, value):
    """A reference's tensor as an array of `xp` (bf16 widened to float32); anything else as it is."""
    if not type(value).__module__.startswith("torch"):
        return value
    import torch

    value = value.detach()
    if value.dtype == torch.bfloat16:
        value = value.float()
    if xp is np or value.device.type != "cuda":
        return xp.asarray(value.cpu().numpy())
    torch.cuda.current_stream().synchronize()  # torch computed on its stream; ours reads next
    return xp.from_dlpack(value.contiguous())
