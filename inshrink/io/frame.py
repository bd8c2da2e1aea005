"""One array to bytes and back, in memory: the codec chain without a container file.

:func:`encode` runs an array through the same pipelines an .ink file uses (lossless byte
grouping, or quantization) and returns one self-describing byte string, an *array frame*;
:func:`decode` turns it back into the array. Codecs of other storage systems store one frame
per chunk of theirs (:mod:`inshrink.numcodecs`, :mod:`inshrink.zarr`).

The layout is specified in spec/FORMAT.md section 24 (little-endian):

* 5 bytes ``b"INKA\\x01"`` (magic ``INKA``, frame version 1);
* uint32 ``H``, then ``H`` bytes of UTF-8 JSON: ``{"dtype", "shape", "chunk_elements",
  "codec", "chunks"}`` and optionally ``"report"``, where ``dtype``, ``shape``,
  ``chunk_elements``, ``codec`` and ``report`` mean what they mean in an .ink index (spec
  sections 8-10) and ``chunks`` lists, per chunk, per stream, ``[coding, stored length,
  decoded size]``;
* the payloads, chunk after chunk, stream after stream, nothing between them.

There is no checksum in the frame (docs/decisions.md): storage systems chain their own.
Bad bytes given to :func:`decode` raise a :class:`~inshrink.errors.CorruptError` (or a
subclass) or a :class:`~inshrink.errors.LimitExceededError` naming the rule of section 24
that failed, never anything else, and nothing larger than ``max_nbytes`` is allocated.
"""
from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from .. import dtypes, strict_json
from ..codecs.chain import Pipeline, for_new_tensor
from ..codecs.entropy import CODINGS, Entropy
from ..codecs.quant import DTYPES as QUANT_DTYPES
from ..encode.fit import fewest_bins, fit
from ..encode.policy import FITTED_DOMAINS, QuantConfig
from ..encode.quantizer import ChunkStats, QuantEncoder
from ..encode.sketch import Sketch, work_dtype
from ..errors import (CorruptError, InvalidArgumentError, LimitExceededError, UnknownCodecError,
                      UnsupportedVersionError)

MAGIC = b"INKA\x01"
VERSION = 1
_LENGTH = struct.Struct("<I")
PREFIX = len(MAGIC) + _LENGTH.size  # 9: magic, version, header length
MAX_HEADER_BYTES = 16 << 20
MAX_CHUNK_BYTES = 64 << 20  # as in the .ink format: a chunk decodes to at most this
MAX_NDIM = 32
MAX_INT = 1 << 63
MAX_ARRAY_BYTES = 1 << 48  # as a tensor of an .ink file
DEFAULT_CHUNK_BYTES = 4 << 20
DEFAULT_MAX_NBYTES = 1 << 32
MEMBERS = {"dtype", "shape", "chunk_elements", "codec", "chunks"}


def encode(array: Any, *, level: int | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
           bins: int | None = None, domain: str = "linear", protect: float = 0.0,
           prune: float = 0.0, max_rel_l2: float | None = None, seed: int = 0) -> bytes:
    """Encode one array into an array frame.

    Parameters
    ----------
    array : array-like
        Any dtype of :mod:`inshrink.dtypes`, any shape (see :func:`inshrink.dtypes.as_numpy`).
    level : int, optional
        zstd level; ``None`` uses inshrink's fast settings.
    chunk_bytes : int
        Uncompressed bytes per chunk (at most 64 MiB).
    bins : int, optional
        Quantize to at most this many levels (F64, F32, F16 and BF16 only); ``None``:
        lossless.
    domain, protect, prune, seed
        How levels are fitted, as in :class:`inshrink.QuantConfig` (``protect`` and
        ``prune`` are fractions of the elements, stored exactly and set to zero); ``domain``
        is ``"linear"``, ``"log"`` or ``"signed_log"``.
    max_rel_l2 : float, optional
        With ``bins``: the largest relative L2 error accepted, a positive number. Bin counts
        are tried fewest first up to ``bins``; when none meets the bound the array is stored
        losslessly.

    Returns
    -------
    bytes
        What :func:`decode` turns back into the array (bit for bit when lossless). A
        quantized frame carries its measured error (:func:`report`).

    Raises
    ------
    InvalidArgumentError
        Settings :func:`quant_config` refuses (those :class:`inshrink.QuantConfig` refuses
        among them), a bad ``chunk_bytes``, or ``bins`` for an array of another dtype.
    """
    return encode_config(array, quant_config(bins, domain, protect, prune, max_rel_l2, seed),
                         level=level, chunk_bytes=chunk_bytes)


def quant_config(bins: int | None, domain: str = "linear", protect: float = 0.0,
                 prune: float = 0.0, max_rel_l2: float | None = None,
                 seed: int = 0) -> QuantConfig | None:
    """The quantization settings of :func:`encode` as a :class:`~inshrink.QuantConfig`,
    validated by it; ``None`` without ``bins`` (lossless).

    Raises
    ------
    InvalidArgumentError
        A setting :class:`~inshrink.QuantConfig` refuses, ``max_rel_l2`` without ``bins``,
        or a domain that fits no levels (``None``, ``"factored"``).
    """
    if bins is None:
        if max_rel_l2 is not None:
            raise InvalidArgumentError("max_rel_l2 needs bins")
        return None
    _check_fitted(domain)
    return QuantConfig(bins=bins, domain=domain, protect=protect, prune=prune,
                       max_rel_l2=max_rel_l2, seed=seed)


def _check_fitted(domain: Any) -> None:
    """A frame's levels are fitted in a domain given: no role resolves ``None``, and the
    factored stage belongs to files."""
    if domain not in FITTED_DOMAINS:
        raise InvalidArgumentError("domain must be 'linear', 'log' or 'signed_log'")


def encode_config(array: Any, config: QuantConfig | None, *, level: int | None = None,
                  chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> bytes:
    """:func:`encode` with its quantization settings made once (:func:`quant_config`):
    ``config`` quantizes the array (its ``bins``, ``domain``, ``protect``, ``prune``,
    ``max_rel_l2``, ``seed``, ``sigma`` and ``alpha``), ``None`` stores it losslessly."""
    if config is not None:
        _check_fitted(config.domain)
    arr = dtypes.as_numpy(array)
    dtype = dtypes.of_numpy(arr.dtype)
    if type(chunk_bytes) is not int or not dtype.itemsize <= chunk_bytes <= MAX_CHUNK_BYTES:
        raise InvalidArgumentError(f"chunk_bytes must be an integer in [{dtype.itemsize}, "
                                   f"{MAX_CHUNK_BYTES}]")
    if arr.ndim > MAX_NDIM:
        raise InvalidArgumentError(f"arrays have at most {MAX_NDIM} dimensions")
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    per_chunk = chunk_bytes // dtype.itemsize
    ranges = [(start, min(start + per_chunk, arr.size))
              for start in range(0, arr.size, per_chunk)]
    entropy = Entropy(level)
    report = None
    fitted = None if config is None else _quantizer(arr, dtype, ranges, config)
    if fitted is None:
        pipeline = for_new_tensor(dtype, entropy)
        chunks = [pipeline.encode(raw[a * dtype.itemsize:b * dtype.itemsize])
                  for a, b in ranges]
    else:
        encoder, sumsq, used = fitted
        pipeline = Pipeline(encoder.stage, entropy=entropy)
        stats = ChunkStats()
        chunks = []
        for a, b in ranges:
            chunk, chunk_stats = encoder.quantize(raw[a * dtype.itemsize:b * dtype.itemsize])
            stats.merge(chunk_stats)
            chunks.append(pipeline.encode(chunk))
        report = {"domain": config.domain, "bins": used, "levels": len(encoder.stage.levels),
                  **stats.report(sumsq)}
    header = {"dtype": dtype.name, "shape": list(arr.shape), "chunk_elements": per_chunk,
              "codec": pipeline.chain(),
              "chunks": [[[coding, len(memoryview(payload)), size]
                          for coding, payload, size in chunk] for chunk in chunks]}
    if report is not None:
        header["report"] = report
    text = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    return b"".join([MAGIC, _LENGTH.pack(len(text)), text,
                     *(bytes(payload) for chunk in chunks for _, payload, _ in chunk)])


def _quantizer(arr: np.ndarray, dtype: dtypes.DType, ranges: list, config: QuantConfig
               ) -> tuple[QuantEncoder, float, int] | None:
    """(fitted encoder, sum of squares, bins used), or None: nothing meets
    ``config.max_rel_l2`` (or the array is empty)."""
    if dtype.name not in QUANT_DTYPES:
        raise InvalidArgumentError(f"only {', '.join(QUANT_DTYPES)} arrays can be quantized, "
                                   f"not {dtype.name}")
    if arr.size == 0:
        return None
    sketch = Sketch.for_dtype(dtype, config.alpha, config.bins)
    flat = arr.reshape(-1)
    work = [np.ascontiguousarray(flat[a:b].astype(work_dtype(dtype))) for a, b in ranges]
    for x in work:
        sketch.add(x)

    def fit_bins(bins: int) -> QuantEncoder:
        return fit(sketch, dtype, bins=bins, domain=config.domain, prune=config.prune,
                   protect=config.protect, sigma=config.sigma, seed=config.seed)

    def exact_error(encoder: QuantEncoder) -> ChunkStats:
        total = ChunkStats()
        for x in work:
            total.merge(encoder.measure(x))
        return total

    found = fewest_bins(sketch, config.bins, config.max_rel_l2, fit_bins, exact_error)
    if found is None:
        return None
    bins, encoder = found
    return encoder, sketch.sumsq, bins


def _fail(rule: str, msg: str, error: type = CorruptError):
    raise error(f"[{rule}] array frame: {msg}")


def _is_int(x, lo: int = 0, hi: int = MAX_INT) -> bool:
    return type(x) is int and lo <= x <= hi


def _header(view: memoryview) -> tuple[dict, int]:
    """The parsed JSON header (rules A-1 ... A-4) and the offset of the first payload."""
    if len(view) < PREFIX or bytes(view[:4]) != MAGIC[:4]:
        _fail("A-1", "does not start with the magic INKA (and is at least 9 bytes)")
    if view[4] != VERSION:
        _fail("A-2", f"frame version {view[4]}, this reader knows {VERSION}",
              UnsupportedVersionError)
    (length,) = _LENGTH.unpack_from(view, len(MAGIC))
    if length > MAX_HEADER_BYTES:
        _fail("A-3", f"header of {length} bytes, over {MAX_HEADER_BYTES}", LimitExceededError)
    if length > len(view) - PREFIX:
        _fail("A-3", f"header of {length} bytes does not fit in {len(view)} bytes")
    try:
        header = strict_json.loads(bytes(view[PREFIX:PREFIX + length]).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        _fail("A-4", f"header is not UTF-8 JSON without duplicate keys ({exc})")
    return header, PREFIX + length


def decode(data: Any, *, max_nbytes: int = DEFAULT_MAX_NBYTES) -> np.ndarray:
    """Decode an array frame from :func:`encode` into a new array.

    ``max_nbytes``: the largest array accepted (a header may declare any shape; the default
    is 4 GiB); larger raises :class:`~inshrink.errors.LimitExceededError` (rule A-7a: a
    valid frame this reader refuses, not an invalid one).
    """
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise InvalidArgumentError("data must be a contiguous bytes-like object") from None
    header, offset = _header(view)
    dtype, shape, pipeline, per_chunk, chunks = _parse(header, max_nbytes)
    if sum(s[1] for chunk in chunks for s in chunk) != len(view) - offset:
        _fail("A-13", f"payload lengths do not add up to the {len(view) - offset} bytes "
                      f"after the header")
    numel = math.prod(shape)
    out = np.empty(numel * dtype.itemsize, np.uint8)
    for c, chunk in enumerate(chunks):
        first, last = c * per_chunk, min((c + 1) * per_chunk, numel)
        encoded = []
        for coding, stored, size in chunk:
            encoded.append((coding, view[offset:offset + stored], size))
            offset += stored
        pipeline.decode(encoded, out[first * dtype.itemsize:last * dtype.itemsize])
    return out.view(dtype.numpy).reshape(shape)


def report(data: Any) -> dict | None:
    """The measured error a quantized frame carries (``rel_l2_error``, ``max_abs_error`` …),
    ``None`` for a lossless one. Validates the header, not the payloads."""
    try:
        view = memoryview(data).cast("B")
    except TypeError:
        raise InvalidArgumentError("data must be a contiguous bytes-like object") from None
    header, _ = _header(view)
    _parse(header, math.inf)
    return header.get("report")


def _parse(header, max_nbytes: float) -> tuple:
    """The validated fields of a header, rules A-5 ... A-12 in order (every number bounded
    before anything uses it)."""
    if (not isinstance(header, dict) or not MEMBERS <= set(header)
            or not set(header) <= MEMBERS | {"report"}):
        _fail("A-5", "header must be an object with exactly dtype, shape, chunk_elements, "
                     "codec, chunks and optionally report")
    name = header["dtype"]
    dtype = dtypes.BY_NAME.get(name) if isinstance(name, str) else None
    if dtype is None:
        _fail("A-6", f"unknown dtype {name!r}", UnknownCodecError)
    shape = header["shape"]
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        _fail("A-7", "shape must be a list of integers in [0, 2^63]")
    if len(shape) > MAX_NDIM:
        _fail("A-7", f"{len(shape)} dimensions, over {MAX_NDIM}", LimitExceededError)
    # the non-zero dimensions, as rule I-9: an empty array's shape must be one a reader
    # can represent too
    if math.prod(filter(None, shape)) * dtype.itemsize > MAX_ARRAY_BYTES:
        _fail("A-7", f"shape {shape}: the non-zero dimensions make "
                     f"{math.prod(filter(None, shape)) * dtype.itemsize} bytes, over 2^48",
              LimitExceededError)
    if math.prod(shape) * dtype.itemsize > max_nbytes:  # this reader's own bound
        _fail("A-7a", f"{math.prod(shape) * dtype.itemsize} bytes, over this reader's "
                      f"max_nbytes={max_nbytes}", LimitExceededError)
    per_chunk = header["chunk_elements"]
    if not _is_int(per_chunk, 1):
        _fail("A-8", f"chunk_elements {per_chunk!r} is not an integer >= 1")
    if per_chunk * dtype.itemsize > MAX_CHUNK_BYTES:
        _fail("A-8", f"chunks of {per_chunk} elements are over 64 MiB", LimitExceededError)
    codec = header["codec"]
    if not isinstance(codec, list) or not codec or not all(
            isinstance(s, dict) and isinstance(s.get("id"), str) for s in codec):
        _fail("A-9", "codec must be a non-empty list of objects with a string 'id'")
    pipeline = Pipeline.from_chain(codec, dtype, has_base=False)  # C-1 ... C-4
    extra = header.get("report")
    if extra is None:  # absent, or null: the same (spec section 24.4, A-10)
        extra = {}
    if not isinstance(extra, dict) or not all(
            v is None or isinstance(v, (str, int, float)) for v in extra.values()):
        _fail("A-10", "report must be an object of strings, numbers, booleans or null")
    numel = math.prod(shape)
    chunks = header["chunks"]
    count = -(-numel // per_chunk)
    if not isinstance(chunks, list) or len(chunks) != count:
        _fail("A-11", f"chunks must be a list of the {count} chunks")
    for c, chunk in enumerate(chunks):
        if (not isinstance(chunk, list) or len(chunk) != pipeline.streams
                or not all(isinstance(s, list) and len(s) == 3 and isinstance(s[0], str)
                           and _is_int(s[1]) and _is_int(s[2]) for s in chunk)):
            _fail("A-12", f"chunk {c} must list {pipeline.streams} [coding, length, size] "
                          f"streams")
        unknown = [s[0] for s in chunk if s[0] not in CODINGS]
        if unknown:
            _fail("A-12", f"chunk {c}: unknown coding {unknown[0]!r}", UnknownCodecError)
        if max(s[2] for s in chunk) > MAX_CHUNK_BYTES:
            _fail("A-12", f"chunk {c}: a stream of {max(s[2] for s in chunk)} bytes, over "
                          f"64 MiB", LimitExceededError)
        n = min(per_chunk, numel - c * per_chunk)
        if not pipeline.sizes_ok(n, [s[2] for s in chunk], dtype.itemsize):
            _fail("A-12", f"chunk {c}: stream sizes do not match its {n} elements")
    return dtype, tuple(shape), pipeline, per_chunk, chunks
