"""Deprecated: moved to :mod:`inshrink.dcp.sharded` (see CHANGELOG.md)."""
from .._moved import moved

__getattr__ = moved("inshrink.torch.sharded", "inshrink.dcp.sharded")
