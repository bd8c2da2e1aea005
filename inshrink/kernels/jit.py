"""The ``kernel`` decorator: a function compiled with Numba on its first call, cached per user.

Numba is imported, and a kernel compiled (or loaded from the cache), on the kernel's first
call, not when a kernel module is imported: importing Numba costs about 0.15 s and starting its
CPU target a few tenths more (it imports scipy), which ``import inshrink`` and
``inshrink --help`` should not pay.

Compiled kernels are cached in a per-user directory (``$XDG_CACHE_HOME/inshrink/numba``,
default ``~/.cache/inshrink/numba``; ``NUMBA_CACHE_DIR`` overrides it), never beside the
sources: cache files left in an installed package's directory survive ``pip uninstall``, and
the leftover ``inshrink/`` folder then shadows a later editable install of the package.
"""
from __future__ import annotations

import functools
import operator
import os
from typing import Any, Callable, Sequence


def cache_directory() -> str:
    """Where compiled kernels are cached."""
    from numba.core import config
    if config.CACHE_DIR:
        return config.CACHE_DIR
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "inshrink", "numba")


class Kernel:
    """A function that :func:`kernel` compiles with Numba on its first call.

    Calling it calls the compiled function (the plain Python function when
    ``NUMBA_DISABLE_JIT=1``). Another kernel may call it: Numba types it through
    ``_numba_type_`` as the compiled dispatcher.
    """

    def __init__(self, func: Callable, signatures: Sequence[str] | None) -> None:
        functools.update_wrapper(self, func)
        self.py_func = func
        self._signatures = None if signatures is None else list(signatures)
        self._compiled: Any = None
        self._call: Callable = self._first_call
        self._stood_in = 0  # the work callers did with a numpy stand-in instead (see due)

    def compiled(self) -> Any:
        """The Numba dispatcher (created on the first call; thread-safe)."""
        if self._compiled is None:
            # Numba's own compiler lock, re-entrant: compiling a kernel that calls this one
            # already holds it, so a second lock could deadlock against it.
            from numba.core.compiler_lock import global_compiler_lock
            with global_compiler_lock:
                if self._compiled is None:
                    self._compiled = _jit(self.py_func, self._signatures)
        return self._compiled

    def _first_call(self, *args: Any) -> Any:
        """What a call runs until the kernel is compiled: compile it, then call it."""
        dispatcher = self.compiled()
        self._call = dispatcher
        return dispatcher(*args)

    # Calling the kernel calls what ``_call`` holds: this method until the kernel is
    # compiled, then the dispatcher itself. A property, not a method, so that a call of a
    # compiled kernel runs no Python frame of its own (0.28 -> 0.20 us a call, against 0.17
    # for the dispatcher; 5-6 kernel calls per small lossy tensor).
    __call__ = property(operator.attrgetter("_call"))

    @property
    def ready(self) -> bool:
        """Whether the kernel is compiled already (a call then starts no compilation)."""
        return self._compiled is not None

    def due(self, work: int, budget: int) -> bool:
        """Whether a caller that has a numpy stand-in of this kernel (the same results)
        should call the kernel now: once it is compiled, or once the stand-in has done more
        than ``budget`` units of ``work`` (this call's included) in this process.

        Starting Numba costs about 0.3 CPU-s and compiling a kernel 0.2-0.8 more (with an
        empty cache); a process that only does a little, such as a first save of a small
        checkpoint, does it with numpy and never pays that.
        """
        if self._compiled is not None:
            return True
        self._stood_in += work  # unlocked: a lost update only delays the switch a little
        return self._stood_in > budget

    @property
    def _numba_type_(self) -> Any:
        from numba.core import types
        return types.Dispatcher(self.compiled())

    def __repr__(self) -> str:
        return f"<inshrink kernel {self.__module__}.{self.__qualname__}>"


def _jit(func: Callable, signatures: list[str] | None) -> Any:
    """``njit(nogil=True, cache=True)`` with the cache in :func:`cache_directory`.

    Numba picks a function's cache location when it is decorated, from ``config.CACHE_DIR``
    (empty unless ``NUMBA_CACHE_DIR`` is set); setting it only around the decoration moves
    this package's caches without changing where other libraries' kernels are cached. An
    unwritable directory makes Numba fall back to its own choice.
    """
    from numba import njit
    from numba.core import config
    saved = config.CACHE_DIR
    config.CACHE_DIR = cache_directory()
    try:
        if signatures is None:
            return njit(nogil=True, cache=True)(func)
        return njit(signatures, nogil=True, cache=True)(func)
    finally:
        config.CACHE_DIR = saved


def kernel(func: Callable | None = None, *,
           signatures: Sequence[str] | None = None) -> Any:
    """Make ``func`` a :class:`Kernel`: ``njit(nogil=True, cache=True)``, compiled on first
    call, with the cache in :func:`cache_directory`.

    Use as ``@kernel`` (Numba compiles one specialisation per distinct argument types it
    sees) or ``@kernel(signatures=[...])``: Numba signature strings, evaluated in the
    namespace of ``numba.types``, e.g. ``"void(uint32[::1], boolean, uint8[:, ::1])"``, or
    ``"Array(uint8, 1, 'C', readonly=True)"`` for a read-only argument. With signatures,
    the first call compiles (or loads from the cache) exactly those, and a call whose
    arguments convert to none of them raises ``TypeError`` instead of compiling another
    specialisation: a writable array converts to a read-only one of the same layout, any
    layout to ``'A'``. Declare inputs that are only read as read-only, so one specialisation
    serves both kinds of array.
    """
    if func is None:
        return lambda f: Kernel(f, signatures)
    return Kernel(func, signatures)
