"""Deprecated: moved to :mod:`inshrink.dcp.series` (see CHANGELOG.md)."""
from ._moved import moved

__getattr__ = moved("inshrink.dcp_series", "inshrink.dcp.series")
