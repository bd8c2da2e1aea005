"""Deprecated: moved to :mod:`inshrink.encode.sketch`, :mod:`inshrink.encode.fit` and
:mod:`inshrink.encode.quantizer` (see CHANGELOG.md)."""
from .._moved import moved

__getattr__ = moved("inshrink.codecs.quantize", "inshrink.encode.quantizer",
                    "inshrink.encode.fit", "inshrink.encode.sketch")
