"""One array to bytes and back, in memory: the codec chain without a container file.

:func:`encode` runs an array through the same pipelines an .ink file uses (lossless byte
grouping, or quantization) and returns one self-describing byte string; :func:`decode` turns
it back into the array. This is the base for codecs of other storage systems (numcodecs,
zarr), which store one such string per chunk of theirs.

Layout (little-endian), provisional until a storage codec is built on it and it joins
spec/FORMAT.md:

* 5 bytes ``b"INKA\\x01"`` (magic, layout version 1);
* uint32 ``H``, then ``H`` bytes of UTF-8 JSON: ``{"dtype", "shape", "chunk_elements",
  "codec", "chunks"}``, where ``dtype``, ``shape``, ``chunk_elements`` and ``codec`` mean
  what they mean in an .ink index (spec sections 9-10) and ``chunks`` lists, per chunk, per
  stream, ``[coding, stored length, decoded size]``;
* the payloads, chunk after chunk, stream after stream, nothing between them.

Bad bytes given to :func:`decode` raise a :class:`~inshrink.errors.CorruptError` (or a
subclass), never anything else, and nothing larger than ``max_nbytes`` is allocated.
"""
from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from .. import dtypes
from ..errors import CorruptError, InvalidArgumentError, LimitExceededError
from .chain import Pipeline, for_new_tensor
from .entropy import CODINGS, Entropy
from .quant import DTYPES as QUANT_DTYPES
from .quantize import Sketch, fit, work_dtype

MAGIC = b"INKA\x01"
_LENGTH = struct.Struct("<I")
MAX_HEADER_BYTES = 16 << 20
MAX_CHUNK_BYTES = 64 << 20  # as in the .ink format: a chunk decodes to at most this
MAX_NDIM = 32
DEFAULT_CHUNK_BYTES = 4 << 20
DEFAULT_MAX_NBYTES = 1 << 32


def encode(array: Any, *, level: int | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
           bins: int | None = None, domain: str = "linear", protect: float = 0.0,
           prune: float = 0.0, seed: int = 0) -> bytes:
    """Encode one array into a self-describing byte string.

    Parameters
    ----------
    array : array-like
        Any dtype of :mod:`inshrink.dtypes`, any shape (see :func:`inshrink.dtypes.as_numpy`).
    level : int, optional
        zstd level; ``None`` uses inshrink's fast settings.
    chunk_bytes : int
        Uncompressed bytes per chunk (at most 64 MiB).
    bins : int, optional
        Quantize to this many levels (F64, F32, F16 and BF16 only); ``None``: lossless.
    domain, protect, prune, seed
        How levels are fitted, as in :class:`inshrink.QuantConfig` (``protect`` and
        ``prune`` are fractions of the elements, stored exactly and set to zero).

    Returns
    -------
    bytes
        What :func:`decode` turns back into the array (bit for bit when lossless).
    """
    arr = dtypes.as_numpy(array)
    dtype = dtypes.of_numpy(arr.dtype)
    if type(chunk_bytes) is not int or not dtype.itemsize <= chunk_bytes <= MAX_CHUNK_BYTES:
        raise InvalidArgumentError(f"chunk_bytes must be an integer in [{dtype.itemsize}, "
                                   f"{MAX_CHUNK_BYTES}]")
    if arr.ndim > MAX_NDIM:
        raise InvalidArgumentError(f"arrays have at most {MAX_NDIM} dimensions")
    raw = arr.reshape(-1).view(np.uint8)
    per_chunk = chunk_bytes // dtype.itemsize
    ranges = [(start, min(start + per_chunk, arr.size))
              for start in range(0, arr.size, per_chunk)]
    entropy = Entropy(level)
    if bins is None:
        pipeline = for_new_tensor(dtype, entropy)
        chunks = [pipeline.encode(raw[a * dtype.itemsize:b * dtype.itemsize])
                  for a, b in ranges]
    else:
        encoder = _fit(arr, dtype, ranges, bins, domain, protect, prune, seed)
        pipeline = Pipeline(encoder.stage, entropy=entropy)
        chunks = [pipeline.encode(encoder.quantize(raw[a * dtype.itemsize:
                                                       b * dtype.itemsize])[0])
                  for a, b in ranges]
    header = {"dtype": dtype.name, "shape": list(arr.shape), "chunk_elements": per_chunk,
              "codec": pipeline.chain(),
              "chunks": [[[coding, len(memoryview(payload)), size]
                          for coding, payload, size in chunk] for chunk in chunks]}
    text = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([MAGIC, _LENGTH.pack(len(text)), text,
                     *(bytes(payload) for chunk in chunks for _, payload, _ in chunk)])


def _fit(arr: np.ndarray, dtype: dtypes.DType, ranges: list, bins: int, domain: str,
         protect: float, prune: float, seed: int):
    if dtype.name not in QUANT_DTYPES:
        raise InvalidArgumentError(f"only {', '.join(QUANT_DTYPES)} arrays can be quantized, "
                                   f"not {dtype.name}")
    if type(bins) is not int or not 0 <= bins <= 65_000:
        raise InvalidArgumentError("bins must be an integer in [0, 65000]")
    if domain not in ("linear", "log", "signed_log"):
        raise InvalidArgumentError("domain must be 'linear', 'log' or 'signed_log'")
    if not (0 <= protect < 1 and 0 <= prune < 1 and protect + prune < 1):
        raise InvalidArgumentError("protect and prune must be fractions summing below 1")
    sketch = Sketch.for_dtype(dtype, 0.005, bins)
    flat = arr.reshape(-1)
    for a, b in ranges:
        sketch.add(np.ascontiguousarray(flat[a:b].astype(work_dtype(dtype))))
    return fit(sketch, dtype, bins=bins, domain=domain, prune=prune, protect=protect,
               seed=seed)


def _fail(msg: str):
    raise CorruptError(f"encoded array: {msg}")


def _is_int(x, lo: int = 0, hi: int = 1 << 62) -> bool:
    return type(x) is int and lo <= x <= hi


def decode(data: Any, *, max_nbytes: int = DEFAULT_MAX_NBYTES) -> np.ndarray:
    """Decode a byte string from :func:`encode` into a new array.

    ``max_nbytes``: the largest array accepted (a header may declare any shape; the default
    is 4 GiB); larger raises :class:`~inshrink.errors.LimitExceededError`.
    """
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise InvalidArgumentError("data must be a contiguous bytes-like object") from None
    if len(view) < len(MAGIC) + 4 or bytes(view[:len(MAGIC)]) != MAGIC:
        _fail("does not start with the INKA magic and version 1")
    (length,) = _LENGTH.unpack_from(view, len(MAGIC))
    start = len(MAGIC) + 4
    if length > min(len(view) - start, MAX_HEADER_BYTES):
        _fail(f"header of {length} bytes does not fit")
    try:
        header = json.loads(bytes(view[start:start + length]).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        _fail(f"header is not UTF-8 JSON ({exc})")
    dtype, shape, pipeline, per_chunk, chunks = _parse(header, max_nbytes)
    if sum(s[1] for chunk in chunks for s in chunk) != len(view) - start - length:
        _fail("payload lengths do not add up to the bytes after the header")
    numel = math.prod(shape)
    out = np.empty(numel * dtype.itemsize, np.uint8)
    offset = start + length
    for c, chunk in enumerate(chunks):
        first, last = c * per_chunk, min((c + 1) * per_chunk, numel)
        encoded = []
        for coding, stored, size in chunk:
            encoded.append((coding, view[offset:offset + stored], size))
            offset += stored
        pipeline.decode(encoded, out[first * dtype.itemsize:last * dtype.itemsize])
    return out.view(dtype.numpy).reshape(shape)


def _parse(header, max_nbytes: int) -> tuple:
    """The validated fields of a header (every number bounded before anything uses it)."""
    if not isinstance(header, dict) or set(header) != {"dtype", "shape", "chunk_elements",
                                                       "codec", "chunks"}:
        _fail("header must be an object with dtype, shape, chunk_elements, codec, chunks")
    dtype = dtypes.BY_NAME.get(header["dtype"]) if isinstance(header["dtype"], str) else None
    if dtype is None:
        _fail(f"unknown dtype {header['dtype']!r}")
    shape = header["shape"]
    if (not isinstance(shape, list) or len(shape) > MAX_NDIM
            or not all(_is_int(d) for d in shape)):
        _fail("shape must be a list of at most 32 non-negative integers")
    if math.prod(shape) * dtype.itemsize > max_nbytes:
        raise LimitExceededError(f"encoded array: {math.prod(shape) * dtype.itemsize} bytes, "
                                 f"over max_nbytes={max_nbytes}")
    per_chunk = header["chunk_elements"]
    if not _is_int(per_chunk, 1) or per_chunk * dtype.itemsize > MAX_CHUNK_BYTES:
        _fail(f"chunk_elements {per_chunk!r} is not a positive integer within 64 MiB")
    codec = header["codec"]
    if not isinstance(codec, list) or not codec or not all(
            isinstance(s, dict) and isinstance(s.get("id"), str) for s in codec):
        _fail("codec must be a non-empty list of objects with a string 'id'")
    pipeline = Pipeline.from_chain(codec, dtype, has_base=False)
    numel = math.prod(shape)
    chunks = header["chunks"]
    if not isinstance(chunks, list) or len(chunks) != -(-numel // per_chunk):
        _fail(f"chunks must list the {-(-numel // per_chunk)} chunks")
    for c, chunk in enumerate(chunks):
        if (not isinstance(chunk, list) or len(chunk) != pipeline.streams
                or not all(isinstance(s, list) and len(s) == 3 and s[0] in CODINGS
                           and _is_int(s[1]) and _is_int(s[2], 0, MAX_CHUNK_BYTES)
                           for s in chunk)):
            _fail(f"chunk {c} must list {pipeline.streams} [coding, length, size] streams")
        n = min(per_chunk, numel - c * per_chunk)
        if not pipeline.sizes_ok(n, [s[2] for s in chunk], dtype.itemsize):
            _fail(f"chunk {c}: stream sizes do not match its {n} elements")
    return dtype, tuple(shape), pipeline, per_chunk, chunks

