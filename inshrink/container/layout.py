"""Byte layouts, constants and limits of the .ink container, format version 1.x.

Everything here mirrors a table in spec/FORMAT.md; change both together.
"""
from __future__ import annotations

import functools
import struct
import zlib

import numpy as np

try:  # ISA-L's CRC-32: the same values as zlib's, 5-10x faster (docs/decisions.md)
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # an interpreter or platform without a wheel of isal
    _crc32 = zlib.crc32

from ..errors import (ChecksumError, CorruptError, TruncatedError, UnsupportedFeatureError,
                      UnsupportedVersionError)
from ..zstd_frame import (MAX_ZSTD_WINDOW, ZSTD_MAGIC,  # noqa: F401 (the index reads frames)
                          zstd, zstd_decompress_frame, zstd_frame_parameters)

MAGIC = b"\x89INK\r\n\x1a\n"
VERSION_MAJOR = 1
VERSION_MINOR = 5           # the newest minor this code writes and reads
ALIGNMENT = 64

HEADER_SIZE = 64
RECORD_HEADER_SIZE = 32
TAIL_SIZE = 32
RECORD_TAG = b"INKR"
KIND_CHUNK = 1
KIND_INDEX = 2

# Feature bits; a reader must reject unknown required bits.
FEATURE_DELTA = 1 << 0      # required, since 1.2: some tensors decode against a base file
FEATURE_ZINDEX = 1 << 1     # required, since 1.3: the index payload is a zstd frame
KNOWN_REQUIRED_FEATURES = FEATURE_DELTA | FEATURE_ZINDEX

# Normative limits (spec/FORMAT.md, "Limits").
MAX_INDEX_BYTES = 64 << 20
MAX_TENSORS = 1_000_000
MAX_NAME_BYTES = 1024
MAX_NDIM = 32
MAX_TENSOR_BYTES = 1 << 48
MAX_CHUNK_BYTES = 64 << 20
MAX_METADATA_ENTRIES = 65_536
# What the index may cost to parse grows with the file, not with what a small file declares
# (spec section 15): a compressed index may expand to at most INDEX_EXPANSION times the file
# size (at least FREE_INDEX_BYTES), and every tensor beyond FREE_TENSORS needs RECORD_SPAN
# bytes of file, what one chunk record of a non-empty tensor takes at the least.
INDEX_EXPANSION = 4
FREE_INDEX_BYTES = 1 << 20
FREE_TENSORS = 1024
RECORD_SPAN = ALIGNMENT


def file_size(index_offset: int, index_length: int) -> int:
    """The size of a file whose index record is at ``index_offset`` with this payload."""
    return index_offset + RECORD_HEADER_SIZE + index_length + TAIL_SIZE


def max_index_text(size: int) -> int:
    """The longest index text (decompressed) a file of ``size`` bytes may have."""
    return min(MAX_INDEX_BYTES, max(FREE_INDEX_BYTES, INDEX_EXPANSION * size))


def max_tensors(size: int) -> int:
    """The most tensors a file of ``size`` bytes may hold."""
    return min(MAX_TENSORS, FREE_TENSORS + size // RECORD_SPAN)

_HEADER = struct.Struct("<8sHHIQQ28sI")        # magic, major, minor, size, req, opt, zero, crc
_RECORD = struct.Struct("<4sB3sQI8sI")         # tag, kind, zero, length, payload crc, zero, crc
_TAIL = struct.Struct("<QQII8s")               # index offset, length, crc, tail crc, magic


# CRC-32 (ISO-HDLC, the zlib polynomial) of a buffer, as an unsigned int: both functions
# return it so in Python 3; the alias saves a Python call per record.
crc32 = _crc32


def padding(offset: int) -> int:
    """Zero bytes needed after ``offset`` to reach the next aligned offset."""
    return -offset % ALIGNMENT


def pack_header(minor: int = 0, optional_features: int = 0, required_features: int = 0) -> bytes:
    body = _HEADER.pack(MAGIC, VERSION_MAJOR, minor, HEADER_SIZE, required_features,
                        optional_features, bytes(28), 0)[:-4]
    return body + struct.pack("<I", crc32(body))


def read_header(data: bytes) -> tuple[tuple[int, int], int]:
    """Validate the fixed header (raising the typed error that names the first problem);
    return ((major, minor), required feature bits)."""
    if len(data) < HEADER_SIZE:
        raise TruncatedError(f"[H-1] file is {len(data)} bytes, shorter than the "
                             f"{HEADER_SIZE}-byte header")
    magic, major, minor, size, required, _optional, reserved, crc = _HEADER.unpack(data[:HEADER_SIZE])
    if magic != MAGIC:
        raise CorruptError("[H-2] not an .ink file (bad magic)")
    if major != VERSION_MAJOR:  # before the CRC: another major may lay the header out anew
        raise UnsupportedVersionError(
            f"[H-3] format version {major}.{minor} is not supported (this reader implements "
            f"{VERSION_MAJOR}.x)")
    if crc32(data[:HEADER_SIZE - 4]) != crc:
        raise ChecksumError("[H-4] header checksum mismatch")
    if size != HEADER_SIZE or reserved != bytes(28):
        raise CorruptError("[H-5] header reserved fields are not zero")
    unknown = required & ~KNOWN_REQUIRED_FEATURES
    if unknown:
        raise UnsupportedFeatureError(f"[H-6] file requires unknown feature bits {unknown:#x}")
    return (major, minor), required


_RECORD_BODY = struct.Struct("<4sB3xQI8x")    # the record header less its own CRC
_CRC = struct.Struct("<I")


def pack_record_header(kind: int, payload, payload_crc: int | None = None) -> bytes:
    """The 32-byte header of a record holding ``payload`` (pass its CRC if already known)."""
    if payload_crc is None:
        payload_crc = crc32(payload)
    return record_header(kind, len(memoryview(payload)), payload_crc)


def record_header(kind: int, length: int, payload_crc: int) -> bytes:
    """The 32-byte header of a record whose payload has ``length`` bytes and CRC
    ``payload_crc``."""
    body = _RECORD_BODY.pack(RECORD_TAG, kind, length, payload_crc)
    return body + _CRC.pack(_crc32(body) & 0xFFFFFFFF)


def check_record_header(data, offset: int, kind: int, length: int, payload_crc: int) -> None:
    """Check that the record header at ``offset`` (``data``: its 32 bytes) is exactly the one
    a record of this kind, length and payload CRC has; raise the typed error of the first
    rule it breaks (:func:`parse_record_header`'s, then R-4) if not."""
    if data == record_header(kind, length, payload_crc):  # one comparison in the common case
        return
    parse_record_header(data, offset)  # a header that passes it differs in kind, length or CRC
    raise CorruptError(f"[R-4] record at offset {offset} does not match the index")


# The bytes of a record header body that differ between records: kind, payload length, CRC.
_VARIABLE = np.r_[4, 8:20]


@functools.cache
def _header_crc_tables() -> tuple[int, np.ndarray]:
    """CRC-32 of a record header body with zeros in its variable bytes, and for each variable
    byte the 256 values it XORs into that CRC: over messages of one length, CRC-32 is affine,
    so crc(body) = crc(zeroed body) ^ XOR of table[j][byte j] (computed from one CRC per bit)."""
    zeroed = bytearray(_RECORD_BODY.pack(RECORD_TAG, 0, 0, 0))
    base = crc32(zeroed)
    bits = np.empty((len(_VARIABLE), 8), np.uint32)
    for j, at in enumerate(_VARIABLE):
        for b in range(8):
            zeroed[at] = 1 << b
            bits[j, b] = crc32(zeroed) ^ base
        zeroed[at] = 0
    has_bit = (np.arange(256)[:, None] >> np.arange(8)) & 1 == 1            # (256, 8)
    tables = np.bitwise_xor.reduce(np.where(has_bit[None], bits[:, None, :], 0), axis=2)
    return base, tables.astype(np.uint32)                                   # (13, 256)


def record_headers(kind: int, lengths: np.ndarray, payload_crcs: np.ndarray) -> np.ndarray:
    """The 32-byte headers (``(n, 32)`` uint8) of ``n`` records of one kind: row ``i`` is
    ``record_header(kind, lengths[i], payload_crcs[i])``, computed for all rows at once."""
    n = len(lengths)
    headers = np.zeros((n, RECORD_HEADER_SIZE), np.uint8)
    headers[:, :4] = np.frombuffer(RECORD_TAG, np.uint8)
    headers[:, 4] = kind
    headers[:, 8:16] = np.asarray(lengths, "<u8").view(np.uint8).reshape(n, 8)
    headers[:, 16:20] = np.asarray(payload_crcs, "<u4").view(np.uint8).reshape(n, 4)
    base, tables = _header_crc_tables()
    crcs = np.bitwise_xor.reduce(tables[np.arange(len(_VARIABLE)), headers[:, _VARIABLE]],
                                 axis=1, initial=np.uint32(base))
    headers[:, 28:] = crcs.astype("<u4").view(np.uint8).reshape(n, 4)
    return headers


def parse_record_header(data: bytes, offset: int) -> tuple[int, int, int]:
    """Return (kind, payload length, payload crc) of the record header at ``offset``."""
    if len(data) < RECORD_HEADER_SIZE:
        raise TruncatedError(f"[R-0] record header at offset {offset} is truncated")
    tag, kind, zero3, length, payload_crc, zero8, crc = _RECORD.unpack(data[:RECORD_HEADER_SIZE])
    if tag != RECORD_TAG:
        raise CorruptError(f"[R-1] no record at offset {offset} (bad tag)")
    if crc32(data[:RECORD_HEADER_SIZE - 4]) != crc:
        raise ChecksumError(f"[R-2] record header checksum mismatch at offset {offset}")
    if zero3 != bytes(3) or zero8 != bytes(8) or kind not in (KIND_CHUNK, KIND_INDEX):
        raise CorruptError(f"[R-3] record header at offset {offset} has bad kind or reserved "
                           f"bytes")
    return kind, length, payload_crc


def pack_tail(index_offset: int, index_payload) -> bytes:
    body = struct.pack("<QQI", index_offset, len(memoryview(index_payload)), crc32(index_payload))
    return body + struct.pack("<I", crc32(body)) + MAGIC


def parse_tail(data: bytes) -> tuple[int, int, int]:
    """Return (index record offset, index payload length, index crc) from the last 32 bytes."""
    index_offset, length, index_crc, crc, magic = _TAIL.unpack(data)
    if magic != MAGIC:
        raise TruncatedError("[T-1] file does not end with the .ink magic (truncated or not "
                             ".ink)")
    if crc32(data[:20]) != crc:
        raise ChecksumError("[T-2] tail checksum mismatch")
    return index_offset, length, index_crc
