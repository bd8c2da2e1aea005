"""Deprecated: moved to :mod:`inshrink.io.rebase` (see CHANGELOG.md)."""
from ._moved import moved

__getattr__ = moved("inshrink.rebase", "inshrink.io.rebase")
