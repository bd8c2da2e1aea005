"""The entropy stage, bytes->bytes: one zstd frame per stream chunk, or the bytes stored raw.

Every chain ends in it implicitly: the chain does not list it, each chunk records its coding
(``zstd`` or ``raw``). Compressor/decompressor contexts are not thread-safe, so each thread
keeps its own.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..errors import CorruptError, InvalidArgumentError, UnknownCodecError
from ..zstd_frame import MAX_ZSTD_WINDOW, zstd, zstd_decompress_frame, zstd_frame_parameters

if TYPE_CHECKING:
    import zstandard

ZSTD = "zstd"
RAW = "raw"
CODINGS = (ZSTD, RAW)

# Byte planes of weights are near-random bytes with a skewed histogram: almost all of zstd's
# gain comes from Huffman-coded literals. A small hash table and the longest minimum match keep
# the match finder from wasting time (and bits) on short chance matches: measured about 2x
# faster than level 1 with a slightly better ratio on exponent planes (docs/decisions.md).
# (strategy: zstandard.STRATEGY_FAST, set when the first compressor is made)
_FAST_PARAMS = dict(window_log=17, hash_log=6, chain_log=6, search_log=1, min_match=7,
                    target_length=0)

_local = threading.local()


def _compressor(level: int | None) -> zstandard.ZstdCompressor:
    try:  # every stream of a save asks: the common case is one dict lookup
        return _local.compressors[level]
    except AttributeError:
        _local.compressors = {}
    except KeyError:
        pass
    zstandard = zstd()
    if level is None:
        params = zstandard.ZstdCompressionParameters(
            **_FAST_PARAMS, strategy=zstandard.STRATEGY_FAST, write_content_size=True)
        compressor = zstandard.ZstdCompressor(compression_params=params)
    else:
        compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
    _local.compressors[level] = compressor
    return compressor


def _decompressor() -> zstandard.ZstdDecompressor:
    if not hasattr(_local, "decompressor"):
        _local.decompressor = zstd().ZstdDecompressor()
    return _local.decompressor


def check_level(level: int | None) -> None:
    """Raise :class:`InvalidArgumentError` unless ``level`` is None or a zstd level."""
    if level is None:  # (the default: no zstandard needed to check it)
        return
    lo, hi = -(1 << 17), zstd().MAX_COMPRESSION_LEVEL
    if not isinstance(level, int) or isinstance(level, bool) or not lo <= level <= hi:
        raise InvalidArgumentError(f"level must be None or an integer in [{lo}, {hi}], "
                                   f"got {level!r}")


# With the fast plane settings, a stream of at least PROBE_MIN_BYTES is first tried on its
# first PROBE_BYTES: if zstd cannot shrink those at all, the stream is stored raw without
# compressing the rest. Mantissa planes are like that, and zstd spends as long failing on them
# as compressing an exponent plane (docs/decisions.md: on the benchmark checkpoints every
# plane skipped this way was stored raw before too, and the probe costs ~6% of a plane that
# does compress).
PROBE_BYTES = 64 << 10
PROBE_MIN_BYTES = 4 * PROBE_BYTES


def encode(data, level: int | None = None):
    """Compress ``data`` (a contiguous buffer); keep it raw when zstd does not shrink it.

    Returns ``(coding, payload)``; a raw payload is ``data`` itself, not a copy.
    """
    return _encode(data, level)[:2]


def _encode(data, level: int | None) -> tuple[str, Any, int]:
    """:func:`encode`'s result and ``data``'s size in bytes (one call per stream of a save,
    so the size comes from the array itself when it is one: no memoryview made for it)."""
    nbytes = data.nbytes if type(data) is np.ndarray else memoryview(data).nbytes
    compressor = _compressor(level)
    if (level is None and nbytes >= PROBE_MIN_BYTES
            and len(compressor.compress(memoryview(data).cast("B")[:PROBE_BYTES]))
            >= PROBE_BYTES):
        return RAW, data, nbytes
    packed = compressor.compress(data)
    if len(packed) < nbytes:
        return ZSTD, packed, nbytes
    return RAW, data, nbytes


@dataclass(frozen=True)
class Entropy:
    """The entropy stage with its encoder setting: ``level`` is a zstd level, ``None`` for
    inshrink's fast plane settings. The setting is not stored; any level decodes alike."""

    id: ClassVar[str] = ZSTD
    minor: ClassVar[int] = 0
    level: int | None = None

    def __post_init__(self) -> None:
        check_level(self.level)

    def encode(self, data) -> tuple[str, Any, int]:
        """``(coding, payload, decoded size)`` of one stream chunk (see :func:`encode`)."""
        return _encode(data, self.level)

    @staticmethod
    def decode(coding: str, payload, size: int) -> bytes:
        """See :func:`decode`."""
        return decode(coding, payload, size)


def decode(coding: str, payload: bytes, size: int) -> bytes:
    """Decode one chunk payload into exactly ``size`` bytes, or raise :class:`CorruptError`
    (spec rules D-1 ... D-4)."""
    if coding == RAW:
        if len(payload) != size:
            raise CorruptError(f"[D-1] raw chunk holds {len(payload)} bytes, index says {size}")
        return payload
    if coding != ZSTD:  # the index validator rejects other values; kept as a guard
        raise UnknownCodecError(f"[I-13] unknown chunk coding {coding!r}")
    try:
        params = zstd_frame_parameters(payload)
    except zstd().ZstdError as exc:  # (evaluated only when an exception is raised)
        raise CorruptError(f"[D-2] bad zstd frame header: {exc}") from None
    if params.dict_id or params.window_size > MAX_ZSTD_WINDOW:
        raise CorruptError(f"[D-2a] zstd frame needs a dictionary ({params.dict_id}) or a "
                           f"window over {MAX_ZSTD_WINDOW} bytes ({params.window_size})")
    if params.content_size != size:
        raise CorruptError(f"[D-3] zstd frame declares {params.content_size} bytes, index "
                           f"says {size}")
    try:
        out = zstd_decompress_frame(_decompressor(), payload, size)
    except zstd().ZstdError as exc:
        raise CorruptError(f"[D-4] corrupt zstd frame: {exc}") from None
    if len(out) != size:
        raise CorruptError(f"[D-4] zstd frame decoded to {len(out)} bytes, index says {size}")
    return out
