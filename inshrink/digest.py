"""The decode digest of a checkpoint (spec/FORMAT.md section 23.1): what a delta file's
``base.sha256`` names.

It covers exactly what deltas decode against: the bytes of the checkpoint's lossless tensors
and the codes of its quantized ones. It does not change when the checkpoint's own file is
rewritten as a delta, unlike the file's bytes.

Two definitions exist; the ``base`` object of a delta file says which one it uses (member
``digest``, absent = 1):

* **1** (format 1.2 - 1.4): defined in Python terms (numpy dtype strings, ``repr`` of the
  shape, where the reference writer hashed a 0-d tensor as ``(1,)``). Only read.
* **2** (since format 1.5): a fixed binary layout in the format's own terms (dtype names of
  section 9, dimensions as u64), every byte specified. Written by this library.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Iterator, Mapping

import numpy as np

from . import dtypes
from .errors import BaseMismatchError, InvalidArgumentError

LATEST = 2
"""The definition new delta files are written with."""
VERSIONS = (1, 2)

_U64 = struct.Struct("<Q")
_EXACT = b"X"
_CODES = b"C"


def _u64(value: int) -> bytes:
    return _U64.pack(value)


def _codes_bytes(codes: np.ndarray) -> bytes:
    return np.ascontiguousarray(codes, "<u2").reshape(-1).tobytes()


def digest_input(exact: Mapping[str, np.ndarray], codes: Mapping[str, np.ndarray],
                 version: int = LATEST) -> Iterator[bytes]:
    """The bytes fed to SHA-256, piece by piece (for the spec's worked example and tests).

    Parameters
    ----------
    exact : mapping of str to numpy.ndarray
        The checkpoint's lossless tensors, as decoded.
    codes : mapping of str to numpy.ndarray
        The codes (uint16, one per element) of its quantized tensors. A name in both is
        taken from ``codes``.
    version : int
        The digest definition, 1 or 2.
    """
    if version not in VERSIONS:
        raise InvalidArgumentError(f"decode digest version {version!r} is not one of "
                                   f"{VERSIONS}")
    # sorting str by code point equals sorting their UTF-8 bytes
    for name in sorted(set(exact) | set(codes)):
        encoded = name.encode("utf-8")
        if version == 1:
            yield encoded + b"\0"
            if name in codes:
                yield _CODES + _codes_bytes(codes[name])
            else:
                # the reference writer hashed np.ascontiguousarray(x), which is never 0-d
                arr = np.ascontiguousarray(exact[name])
                yield _EXACT + arr.dtype.str.encode() + repr(arr.shape).encode()
                yield arr.reshape(-1).view(np.uint8).tobytes()
            continue
        yield _u64(len(encoded)) + encoded
        if name in codes:
            data = _codes_bytes(codes[name])
            yield _CODES + _u64(len(data) // 2)
            yield data
        else:
            # np.asarray keeps a 0-d array 0-d (np.ascontiguousarray makes it shape (1,))
            arr = np.asarray(exact[name])
            dtype = dtypes.of_numpy(arr.dtype)
            dtype_name = dtype.name.encode("ascii")
            yield (_EXACT + _u64(len(dtype_name)) + dtype_name + _u64(arr.ndim)
                   + b"".join(_u64(d) for d in arr.shape))
            yield arr.astype(dtype.numpy, copy=False).tobytes(order="C")


def decode_digest(exact: Mapping[str, np.ndarray], codes: Mapping[str, np.ndarray],
                  version: int = LATEST) -> str:
    """SHA-256 (64 lowercase hex digits) of what a delta decodes against: the exact bytes of a
    checkpoint's lossless tensors and the codes of its quantized ones (spec section 23.1).

    Parameters
    ----------
    exact, codes, version
        As for :func:`digest_input`.
    """
    digest = hashlib.sha256()
    for piece in digest_input(exact, codes, version):
        digest.update(piece)
    return digest.hexdigest()


def version_of(base: Mapping | None) -> int:
    """The digest definition a delta file's ``base`` object declares (absent member: 1).

    Raises :class:`~inshrink.errors.BaseMismatchError` for a definition this library does
    not implement: the base cannot be checked, so it must not be trusted.
    """
    if base is None:
        return LATEST
    version = base.get("digest", 1)
    if version not in VERSIONS:
        raise BaseMismatchError(f"[B-3] the base is identified by decode digest definition "
                                f"{version!r}, which this reader does not implement "
                                f"(it knows {', '.join(map(str, VERSIONS))})")
    return version


def base_reference(file: str, exact: Mapping[str, np.ndarray],
                   codes: Mapping[str, np.ndarray]) -> dict:
    """The ``base`` object a new delta file against this checkpoint records."""
    return {"file": file, "sha256": decode_digest(exact, codes, LATEST), "digest": LATEST}
