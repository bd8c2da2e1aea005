"""Deprecated: moved to :mod:`inshrink.encode.policy` (see CHANGELOG.md)."""
from ._moved import moved

__getattr__ = moved("inshrink.policy", "inshrink.encode.policy")
