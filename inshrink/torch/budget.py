"""Deprecated: moved to :mod:`inshrink.checkpointing.budget` (see CHANGELOG.md)."""
from .._moved import moved

__getattr__ = moved("inshrink.torch.budget", "inshrink.checkpointing.budget")
