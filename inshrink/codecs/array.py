"""Deprecated: moved to :mod:`inshrink.io.frame` (see CHANGELOG.md)."""
from .._moved import moved

__getattr__ = moved("inshrink.codecs.array", "inshrink.io.frame")
