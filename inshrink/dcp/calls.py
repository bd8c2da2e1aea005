"""What the DCP storage layer's modules share where they meet their callers: checkpoint paths
checked as arguments, inshrink errors that name the file they are about, and results handed
to DCP as completed futures. Imports torch only to make a future: the torch-free chunk map
reader (:mod:`.chunkmap`) uses the rest."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from ..errors import InshrinkError, InvalidArgumentError

if TYPE_CHECKING:
    from torch.futures import Future

__all__ = ["checked_path", "make_directory", "named", "done"]

E = TypeVar("E")


def checked_path(path: Any) -> str:
    """A checkpoint path argument as a ``str``.

    Raises
    ------
    InvalidArgumentError
        ``path`` is neither a ``str`` nor an ``os.PathLike``.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"checkpoint path must be a str or os.PathLike, got "
                                   f"{type(path).__name__}")
    return os.fspath(path)


def make_directory(path: str, what: str) -> None:
    """Create the directory ``path`` (``what`` it is, for the error) if it is missing.

    Raises
    ------
    InvalidArgumentError
        It cannot be created (a file in the way, no permission...).
    """
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(f"{path}: cannot create the {what}: "
                                   f"{exc.strerror or exc}") from None


def named(path: str, call: Callable[[], E]) -> E:
    """``call()``, with an inshrink error that does not name ``path`` re-raised naming it (a
    reader's error says what is wrong; which file of the checkpoint is wrong is ours to say)."""
    try:
        return call()
    except InshrinkError as exc:
        if path in str(exc):
            raise
        raise type(exc)(f"{path}: {exc}") from exc


def done(value: E) -> Future[E]:
    """A future that holds ``value`` already: storage layer calls finish before returning."""
    from torch.futures import Future  # the rest of this module is torch-free
    future: Future[E] = Future()
    future.set_result(value)
    return future
