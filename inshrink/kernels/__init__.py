"""Numba kernels: loops only, over arrays the Python layer has already validated.

Numba does no bounds checking, so callers must check every length, shape and width first.

Compiled kernels are cached in a per-user directory (``$XDG_CACHE_HOME/inshrink/numba``,
default ``~/.cache/inshrink/numba``; ``NUMBA_CACHE_DIR`` overrides it), never beside the
sources: cache files left in an installed package's directory survive ``pip uninstall``, and
the leftover ``inshrink/`` folder then shadows a later editable install of the package.
"""
from __future__ import annotations

import os
from typing import Callable

from numba import njit
from numba.core import config


def cache_directory() -> str:
    """Where compiled kernels are cached."""
    if config.CACHE_DIR:
        return config.CACHE_DIR
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "inshrink", "numba")


def kernel(func: Callable) -> Callable:
    """``njit(nogil=True, cache=True)``, with the cache in :func:`cache_directory`.

    Numba picks a function's cache location when it is decorated, from ``config.CACHE_DIR``
    (empty unless ``NUMBA_CACHE_DIR`` is set); setting it only around the decoration moves
    this package's caches without changing where other libraries' kernels are cached. An
    unwritable directory makes Numba fall back to its own choice.
    """
    saved = config.CACHE_DIR
    config.CACHE_DIR = cache_directory()
    try:
        return njit(nogil=True, cache=True)(func)
    finally:
        config.CACHE_DIR = saved
