"""Deprecated: moved to :mod:`inshrink.io.tensorfile` (see CHANGELOG.md)."""
from ._moved import moved

__getattr__ = moved("inshrink.tensorfile", "inshrink.io.tensorfile")
