"""Kernel families: one small module per family (see `base.Family` for the contract)."""

from __future__ import annotations

from tuner.kernels.base import Family, Launch

_REGISTRY: dict[str, str] = {
    "copy": "tuner.kernels.copy",
    "transpose": "tuner.kernels.transpose",
    "gemm": "tuner.kernels.gemm",
    "elementwise": "tuner.kernels.elementwise",
    "reduce": "tuner.kernels.reduce",
    "softmax": "tuner.kernels.softmax",
    "rmsnorm": "tuner.kernels.rmsnorm",
    "layernorm": "tuner.kernels.layernorm",
    "gemv": "tuner.kernels.gemv",
    "fp8_quant": "tuner.kernels.fp8_quant",
    "rope": "tuner.kernels.rope",
    "decode_attention": "tuner.kernels.decode_attention",
    "adamw": "tuner.kernels.adamw",
    "kt": "tuner.kernels.kt",
}
_LOADED: dict[str, Family] = {}


def names() -> list[str]:
    return sorted(_REGISTRY)


def get(name: str) -> Family:
    """The family instance registered under `name` (KeyError if unknown)."""
    if name not in _LOADED:
        import importlib

        module = importlib.import_module(_REGISTRY[name])
        _LOADED[name] = module.FAMILY
    return _LOADED[name]


__all__ = ["Family", "Launch", "get", "names"]
