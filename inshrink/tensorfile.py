"""Deprecated: moved to :mod:`inshrink.io.writer`, :mod:`inshrink.io.file` and beside them."""
from ._moved import moved

__getattr__ = moved("inshrink.tensorfile", "inshrink.io.writer", "inshrink.io.file",
                    "inshrink.io.info", "inshrink.io.arguments", "inshrink.io.threads",
                    "inshrink.codecs.chain")
