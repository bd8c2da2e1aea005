"""Deprecated: moved to :mod:`inshrink.encode.quantize` (see CHANGELOG.md)."""
from .._moved import moved

__getattr__ = moved("inshrink.codecs.quantize", "inshrink.encode.quantize")
