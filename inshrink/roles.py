"""Deprecated: moved to :mod:`inshrink.encode.roles` (see CHANGELOG.md)."""
from ._moved import moved

__getattr__ = moved("inshrink.roles", "inshrink.encode.roles")
