"""The decode digest of a checkpoint (spec/FORMAT.md section 23.1): what a delta file's
``base.sha256`` names.

It covers exactly what deltas decode against: the bytes of the checkpoint's lossless tensors
and the codes of its quantized ones. It does not change when the checkpoint's own file is
rewritten as a delta, unlike the file's bytes.

Two definitions exist; the ``base`` object of a delta file says which one it uses (member
``digest``, absent = 1):

* **1** (format 1.2 - 1.4): a type string per dtype (:data:`DEFINITION_1_TYPES`, the strings
  the writers of those versions produced) and the shape as ``(3, 4)``, ``(5,)``, a 0-d
  tensor hashed as ``(1,)``. Only read.
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

DEFINITION_1_TYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<V2", "F8_E4M3": "<V1", "F8_E5M2": "<f1",
    "C64": "<c8", "C128": "<c16", "I8": "|i1", "I16": "<i2", "I32": "<i4", "I64": "<i8",
    "U8": "|u1", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "|b1"}
"""Definition 1's type string of each dtype (spec section 23.1), fixed here: the libraries
that once spelled them may spell them otherwise."""

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
                arr = np.asarray(exact[name])
                dtype = dtypes.of_numpy(arr.dtype)
                yield (_EXACT + DEFINITION_1_TYPES[dtype.name].encode("ascii")
                       + _definition_1_shape(arr.shape))
                yield arr.astype(dtype.numpy, copy=False).tobytes(order="C")
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


def _definition_1_shape(shape: tuple[int, ...]) -> bytes:
    """``(3, 4)``, ``(5,)``; a 0-d tensor as ``(1,)``, as the writers of 1.2 - 1.4 hashed it
    (they passed it through numpy.ascontiguousarray, which never returns a 0-d array)."""
    dims = shape or (1,)
    inner = ", ".join(str(d) for d in dims)
    return f"({inner}{',' if len(dims) == 1 else ''})".encode("ascii")


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


def version_of(base: Mapping | None, where: str = "a delta file") -> int:
    """The digest definition a delta file's ``base`` object declares (absent member: 1).

    Raises :class:`~inshrink.errors.BaseMismatchError` for a definition this library does
    not implement: the base cannot be checked, so it must not be trusted (``where`` names
    the file in the message).
    """
    if base is None:
        return LATEST
    version = base.get("digest", 1)
    if version not in VERSIONS:
        raise BaseMismatchError(f"[B-3] {where}: the base is identified by decode digest "
                                f"definition {version!r}, which this reader does not implement "
                                f"(it knows {', '.join(map(str, VERSIONS))})")
    return version


def base_reference(file: str, exact: Mapping[str, np.ndarray],
                   codes: Mapping[str, np.ndarray]) -> dict:
    """The ``base`` object a new delta file against this checkpoint records."""
    return {"file": file, "sha256": decode_digest(exact, codes, LATEST), "digest": LATEST}
