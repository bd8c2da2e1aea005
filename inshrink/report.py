"""Deprecated: moved to :mod:`inshrink.series.report` (see CHANGELOG.md)."""
from ._moved import moved

__getattr__ = moved("inshrink.report", "inshrink.series.report")
