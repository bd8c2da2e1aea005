"""Deprecated: moved to :mod:`inshrink.safetensors` (see CHANGELOG.md)."""
from ._moved import moved

__getattr__ = moved("inshrink.convert", "inshrink.safetensors")
