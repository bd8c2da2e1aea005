"""The public one-call API: save, load, open."""
from __future__ import annotations

import os
import warnings
from typing import Any, Mapping

import numpy as np

from .errors import InvalidArgumentError
from .encode.policy import Policy
from .io.arguments import Progress
from .io.file import File
from .io.info import TensorInfo
from .io.writer import Writer


def save(path: str | os.PathLike, tensors: Mapping[str, Any],
         metadata: Mapping[str, str] | None = None, *, policy: Policy | str | None = None,
         importance: Mapping[str, Any] | None = None, level: int | None = None,
         threads: int | None = None, progress: Progress | None = None) -> list[TensorInfo]:
    """Compress a mapping of named tensors into one .ink file (lossless unless a policy says).

    Parameters
    ----------
    path : str or os.PathLike
        Destination; written atomically (a previous file is kept if anything fails).
    tensors : mapping of str to array-like
        numpy arrays, or anything with ``__array__``/``__dlpack__`` (torch, JAX, CuPy after
        moving to host). Any dtype of :mod:`inshrink.dtypes`, any shape, 0-d and empty too.
    metadata : mapping of str to str, optional
        User metadata, kept verbatim (compatible with safetensors' ``__metadata__``).
    policy : Policy, str or None
        Lossy compression: a :class:`inshrink.Policy`, or a preset name (``"balanced"``,
        ``"aggressive"``, ``"compact"``; ``"lossless"``). ``None``: everything lossless.
    importance : mapping of str to array-like, optional
        Per-element sensitivity scores (e.g. |gradient × weight|) for some tensors, used to
        protect (and prune, with ``prune_metric="sensitivity"``) quantized tensors.
    level : int, optional
        zstd level; ``None`` uses inshrink's fast settings.
    threads : int, optional
        Encoder threads (default: every core).
    progress : callable, optional
        Called with the number of tensor bytes processed as the work advances.

    Returns
    -------
    list of TensorInfo
        Per tensor: dtype, shape, codec, original and stored bytes, ratio, and for lossy
        tensors the error actually achieved (``info.error``).

    Examples
    --------
    >>> import numpy as np, inshrink
    >>> report = inshrink.save("ckpt.ink", {"w": np.ones((2, 3), np.float32)})
    """
    if not isinstance(tensors, Mapping):
        raise InvalidArgumentError("tensors must be a mapping of names to arrays")
    if importance is not None and not isinstance(importance, Mapping):
        raise InvalidArgumentError("importance must be a mapping of tensor names to scores")
    importance = dict(importance or {})
    unknown = set(importance) - set(tensors)
    if unknown:
        raise InvalidArgumentError(f"importance given for unknown tensors {sorted(unknown)}")
    with Writer(path, metadata, level=level, threads=threads,
                progress=progress, policy=policy) as writer:
        for name, value in tensors.items():
            # the mapping is ours until save returns: encoding may overlap the next tensors
            writer.add(name, value, importance=importance.get(name), wait=False)
        return writer.close()


def _deprecated_base(function: str, kwargs: dict) -> dict:
    """``base``/``base_codes`` given to :func:`load` or :func:`open`: still honoured, with a
    DeprecationWarning (they are what a series passes between its files, and
    :class:`inshrink.File` takes them); any other keyword is the usual TypeError."""
    unknown = set(kwargs) - {"base", "base_codes"}
    if unknown:
        raise TypeError(f"{function}() got an unexpected keyword argument "
                        f"{sorted(unknown)[0]!r}")
    if any(value is not None for value in kwargs.values()):
        warnings.warn(f"inshrink.{function}(base=..., base_codes=...) is deprecated: open a "
                      f"delta file with inshrink.File(path, base=..., base_codes=...), or "
                      f"read a series with inshrink.Series", DeprecationWarning, stacklevel=3)
    return kwargs


def load(path: str | os.PathLike, *, threads: int | None = None,
         progress: Progress | None = None, mmap: bool = True,
         **deprecated: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """Read every tensor of an .ink file into a dict of numpy arrays (bf16/fp8 as ml_dtypes).

    See :class:`File` for ``threads`` and ``mmap``. A delta file of a series decodes against
    its base: read it with :class:`inshrink.Series`, or with :class:`File`'s ``base`` and
    ``base_codes`` (passing those here still works but is deprecated).
    """
    with File(path, threads=threads, mmap=mmap, **_deprecated_base("load", deprecated)) as f:
        return f.load(progress)


def open(path: str | os.PathLike, *, threads: int | None = None,  # noqa: A001
         mmap: bool = True, **deprecated: Mapping[str, np.ndarray] | None) -> File:
    """Open an .ink file for random access: ``f[name]``, ``f.keys()``, ``f.metadata``.

    See :class:`File` for ``threads`` and ``mmap``; ``base``/``base_codes`` here are
    deprecated, pass them to :class:`File`.
    """
    return File(path, threads=threads, mmap=mmap, **_deprecated_base("open", deprecated))
