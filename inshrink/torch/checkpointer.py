"""Deprecated: moved to :mod:`inshrink.checkpointing.checkpointer` (see CHANGELOG.md)."""
from .._moved import moved

__getattr__ = moved("inshrink.torch.checkpointer", "inshrink.checkpointing.checkpointer")
