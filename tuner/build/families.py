"""Finding a family by its reference in any process: a shipped or registered name, or ``space:PATH``.

The kernels package answers names (shipped families, entry points) and the families of spaces this process has
loaded; a space's family is defined by its space file, so resolving ``space:PATH`` in a fresh process (a GPU
worker, a Ray actor, a study reopened from its attrs) loads that space again. This module does both, and sits
above the space stage and the kernels, which therefore need not know each other's loaders.
"""

from __future__ import annotations

from tuner import kernels
from tuner.kernels.base import Family
from tuner.space import space as space_mod

__all__ = ["get", "names"]


def get(ref: str) -> Family:
    """The family `ref` names (see `tuner.kernels`): KeyError for an unknown name; InputError (one line naming the
    file) when a registered family or a space file's cannot be loaded."""
    if ref.startswith(kernels.SPACE_PREFIX):
        try:
            return kernels.get(ref)
        except KeyError:
            space_mod.load(ref.removeprefix(kernels.SPACE_PREFIX))  # registers the family under `ref`
    return kernels.get(ref)


def names() -> list[str]:
    """The names a space's ``kernel:`` line may use: shipped families and registered entry points."""
    return kernels.names()
