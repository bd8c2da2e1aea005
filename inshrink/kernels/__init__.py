"""Numba kernels: loops only, over arrays the Python layer has already validated.

Numba does no bounds checking, so callers must check every length, shape and width first.
The kernels are in :mod:`.bytegroup`, :mod:`.delta` and :mod:`.quant`; the ``kernel``
decorator that compiles them on first call is in :mod:`.jit`.
"""
from .jit import Kernel, cache_directory, kernel

__all__ = ["Kernel", "cache_directory", "kernel"]
