"""Checks of the arguments the Writer and the File share: thread counts, progress sinks, and
the byte sources a Writer reads tensors from."""
from __future__ import annotations

import os
from typing import Any, Callable

from ..errors import InvalidArgumentError

Progress = Callable[[int], None]
"""Called with the number of tensor bytes just processed."""


def resolve_threads(threads: int | None) -> int:
    """``None`` means one thread per core; anything else must be a positive int."""
    if threads is None:
        return max(1, os.cpu_count() or 1)
    if type(threads) is not int or threads < 1:
        raise InvalidArgumentError(f"threads must be a positive integer, got {threads!r}")
    return threads


def check_progress(progress: Progress | None) -> None:
    """A progress sink is None or callable: one that is not would fail only once the first
    chunk is done, part way through a save or a read."""
    if progress is not None and not callable(progress):
        raise InvalidArgumentError(f"progress must be callable as progress(nbytes), got "
                                   f"{type(progress).__name__}")


def checked_source(name: str, read: Callable[[int, int], Any]) -> Callable[[int, int], Any]:
    """``read`` wrapped so that a result that is not a contiguous buffer is a typed error."""
    if not callable(read):
        raise InvalidArgumentError(f"tensor {name!r}: the source must be callable as "
                                   f"read(start, stop)")

    def checked(start: int, stop: int) -> Any:
        data = read(start, stop)
        try:
            contiguous = memoryview(data).c_contiguous
        except TypeError:
            contiguous = False
        if not contiguous:
            raise InvalidArgumentError(f"tensor {name!r}: source returned a "
                                       f"{type(data).__name__}, not a contiguous bytes-like "
                                       f"buffer")
        return data
    return checked

