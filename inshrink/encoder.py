"""Deprecated: moved to :mod:`inshrink.encode.tensor` (see CHANGELOG.md)."""
from ._moved import moved

__getattr__ = moved("inshrink.encoder", "inshrink.encode.tensor")
