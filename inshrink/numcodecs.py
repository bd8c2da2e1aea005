"""numcodecs codecs that store each buffer as an inshrink array frame (spec section 24).

* ``Inshrink`` (codec id ``inshrink``): lossless. Floating-point arrays are byte-grouped
  (sign rotated to the low bit, one plane per byte) and each plane compressed with zstd.
* ``InshrinkQuant`` (codec id ``inshrink-quant``): dynamic quantization of F64, F32, F16 and
  BF16 arrays to at most ``bins`` levels fitted on the buffer's own values; every other dtype
  is stored losslessly. Each frame records the error it measured
  (:func:`inshrink.io.frame.report`).

Both are registered through the ``numcodecs.codecs`` entry point, so
``numcodecs.get_codec({"id": "inshrink"})`` finds them once inshrink is installed; zarr v2
arrays take them as ``compressor=``.

As every numcodecs compressor, ``encode`` stores the buffer's elements in memory order and
``decode`` returns them flat (shape is the caller's business). A buffer whose dtype inshrink
does not know, or a big-endian one, is stored as its bytes, exactly.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray, ndarray_copy

from inshrink import dtypes
from inshrink.io import frame as array
from inshrink.codecs.entropy import check_level
from inshrink.errors import InvalidArgumentError, LimitExceededError, LossyFallbackWarning

__all__ = ["Inshrink", "InshrinkQuant"]


def _contiguous(buf: Any, what: str) -> np.ndarray:
    """``ensure_contiguous_ndarray(buf)`` (flat, memory order), its refusals (not a buffer,
    not contiguous, an object array) as typed errors."""
    try:
        return ensure_contiguous_ndarray(buf)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what}: {exc}") from None


def _as_elements(buf: Any) -> np.ndarray:
    """The buffer as a flat array of a dtype inshrink stores, or as its bytes."""
    arr = _contiguous(buf, "buf")
    if arr.dtype.byteorder == ">" and arr.dtype.itemsize > 1:
        return arr.view(np.uint8)  # exact bytes: a decoded little-endian copy would differ
    try:
        dtypes.of_numpy(arr.dtype)
    except InvalidArgumentError:
        return arr.view(np.uint8)
    return arr


def _decode(buf: Any, out: Any) -> Any:
    """Decode a frame, into ``out`` when given (then no larger than ``out``)."""
    data = _contiguous(buf, "buf")
    if out is None:
        return array.decode(data).reshape(-1)
    target = _contiguous(out, "out")
    if not target.flags.writeable:
        raise InvalidArgumentError("out is read-only")
    decoded = array.decode(data, max_nbytes=target.nbytes)
    if decoded.nbytes != target.nbytes:
        raise LimitExceededError(f"the frame holds {decoded.nbytes} bytes, out has "
                                 f"{target.nbytes}")
    return ndarray_copy(decoded, out)


class Inshrink(Codec):
    """Lossless inshrink codec for numcodecs (codec id ``inshrink``).

    Parameters
    ----------
    level : int, optional
        zstd level of every plane; ``None`` (default) uses inshrink's fast settings.
    chunk_bytes : int
        Bytes per inshrink chunk inside one buffer (default 4 MiB, at most 64 MiB).
    """

    codec_id = "inshrink"

    def __init__(self, level: int | None = None,
                 chunk_bytes: int = array.DEFAULT_CHUNK_BYTES) -> None:
        check_level(level)
        if type(chunk_bytes) is not int or not 8 <= chunk_bytes <= array.MAX_CHUNK_BYTES:
            raise InvalidArgumentError(f"chunk_bytes must be an integer in "
                                       f"[8, {array.MAX_CHUNK_BYTES}]")
        self.level = level
        self.chunk_bytes = chunk_bytes

    @classmethod
    def from_config(cls, config: dict) -> "Inshrink":
        """The codec of a configuration (``numcodecs.get_codec``): an unknown key is an
        InvalidArgumentError, not the TypeError of the constructor call."""
        config = {k: v for k, v in config.items() if k != "id"}
        try:
            return cls(**config)
        except TypeError as exc:
            if isinstance(exc, InvalidArgumentError):
                raise
            raise InvalidArgumentError(f"codec {cls.codec_id!r}: {exc}") from None

    def _chunk_bytes(self, arr: np.ndarray) -> int:
        return max(self.chunk_bytes // arr.itemsize, 1) * arr.itemsize

    def encode(self, buf: Any) -> bytes:
        arr = _as_elements(buf)
        return array.encode(arr, level=self.level, chunk_bytes=self._chunk_bytes(arr))

    def decode(self, buf: Any, out: Any = None) -> Any:
        return _decode(buf, out)


class InshrinkQuant(Inshrink):
    """Lossy inshrink codec for numcodecs (codec id ``inshrink-quant``): dynamic
    quantization of floating-point buffers, lossless for every other dtype.

    Parameters
    ----------
    bins : int
        Levels per buffer (at most; 0 keeps only zeros and escaped values).
    domain : str
        ``"linear"``, ``"log"`` or ``"signed_log"``: where the levels are fitted.
    protect, prune : float
        Fractions of the elements kept exactly (the largest) and set to zero (the smallest).
    max_rel_l2 : float, optional
        Largest relative L2 error per buffer: bin counts are tried fewest first up to
        ``bins``; a buffer no count fits is stored losslessly, and the first such buffer
        of a codec gives a :class:`~inshrink.errors.LossyFallbackWarning`.
    seed : int
        Seed of the level fit (results are deterministic).
    level, chunk_bytes
        As for :class:`Inshrink`.
    """

    codec_id = "inshrink-quant"

    def __init__(self, bins: int = 16, domain: str = "linear", protect: float = 0.0,
                 prune: float = 0.0, max_rel_l2: float | None = None, seed: int = 0,
                 level: int | None = None,
                 chunk_bytes: int = array.DEFAULT_CHUNK_BYTES) -> None:
        super().__init__(level, chunk_bytes)
        # numpy scalars as Python numbers: checked alike, and get_config stays JSON
        self.bins = dtypes.python_number(bins)
        self.domain = domain
        self.protect = dtypes.python_number(protect)
        self.prune = dtypes.python_number(prune)
        self.max_rel_l2 = dtypes.python_number(max_rel_l2)
        self.seed = dtypes.python_number(seed)
        # validated once, here, by QuantConfig; private: not part of get_config()
        self._config = array.quant_config(self.bins, self.domain, self.protect, self.prune,
                                          self.max_rel_l2, self.seed)
        self._warned = False  # private: not part of get_config()

    def encode(self, buf: Any) -> bytes:
        arr = _as_elements(buf)
        if dtypes.of_numpy(arr.dtype).name not in array.QUANT_DTYPES:
            return super().encode(arr)
        blob = array.encode_config(arr, self._config, level=self.level,
                                   chunk_bytes=self._chunk_bytes(arr))
        # a float buffer stored exactly compresses ~1.2x where the user asked for a lossy
        # ratio: say so, once per codec (a zarr array has many chunks); after the warning
        # the header is not read again
        if not self._warned and arr.size and array.report(blob) is None:
            self._warned = True
            warnings.warn(f"{self.codec_id}: no bin count up to bins={self.bins} meets "
                          f"max_rel_l2={self.max_rel_l2} on a {arr.dtype} buffer of "
                          f"{arr.size} elements: stored losslessly (raise bins or "
                          f"max_rel_l2; warned once per codec)", LossyFallbackWarning,
                          stacklevel=2)
        return blob
