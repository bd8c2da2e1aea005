"""Checksum repair for mutated .ink files (standard library and zstandard only).

Almost every byte of an .ink file is covered by a CRC-32, so a randomly mutated file is nearly
always rejected at the first checksum and the code behind it (index validation, codec chain,
decoders, kernels) is never reached. These helpers recompute the checksums of a mutated file so
that the mutation itself reaches the reader. The fuzzer and tests/test_corruption.py use them.

They are written from the byte layout, independently of ``inshrink.container.layout``, so a
mistake in the code under test is not copied here::

    header  64 B  magic, version, ..., CRC-32 of bytes [0, 60) at [60, 64)
    record  32 B  tag[0:4] kind[4] zero[5:8] length[8:16] payload_crc[16:20] zero[20:28]
                  header_crc[28:32] = CRC-32 of [0, 28); then ``length`` payload bytes
    tail    32 B  index_offset[0:8] index_length[8:16] index_crc[16:20]
                  tail_crc[20:24] = CRC-32 of [0, 20); magic[24:32]

The index payload is JSON, or one zstd frame of it when header bit 1 of required_features
(bytes [16, 24)) is set.

Every function accepts arbitrary bytes and never raises.
"""
from __future__ import annotations

import json
import struct
import zlib

import zstandard

HEADER, RECORD, TAIL = 64, 32, 32
MAGIC = b"\x89INK\r\n\x1a\n"
ZINDEX = 1 << 1
MAX_INDEX = 64 << 20


def crc(data) -> bytes:
    """CRC-32 (zlib polynomial) as 4 little-endian bytes."""
    return struct.pack("<I", zlib.crc32(data) & 0xFFFFFFFF)


def _fix_record(buf: bytearray, offset: int, payload_crc: bytes) -> None:
    buf[offset + 16:offset + 20] = payload_crc
    buf[offset + 28:offset + 32] = crc(buf[offset:offset + 28])


def index_location(data) -> tuple[int, int] | None:
    """(index record offset, index payload length) from the tail, if they lie inside the file."""
    if len(data) < HEADER + RECORD + TAIL:
        return None
    tail = len(data) - TAIL
    offset, length = struct.unpack_from("<QQ", data, tail)
    if offset < HEADER or offset + RECORD + length > tail:
        return None
    return offset, length


def index_compressed(data) -> bool:
    """Whether the header marks the index payload as a zstd frame."""
    return len(data) >= 24 and bool(struct.unpack_from("<Q", data, 16)[0] & ZINDEX)


def read_index(data) -> tuple[int, object] | None:
    """(index record offset, parsed index JSON), or None when there is no parseable index."""
    where = index_location(data)
    if where is None:
        return None
    offset, length = where
    payload = bytes(data[offset + RECORD:offset + RECORD + length])
    try:
        if index_compressed(data):
            payload = zstandard.ZstdDecompressor().decompress(payload, max_output_size=MAX_INDEX)
        return offset, json.loads(payload)
    except Exception:  # bad frame, bad UTF-8 or JSON, deep nesting, huge integers
        return None


def replace_index(data, offset: int, payload: bytes) -> bytes:
    """``data[:offset]``, then a fresh index record holding ``payload`` and a matching tail."""
    payload_crc = crc(payload)
    record = bytearray(b"INKR\x02" + bytes(3) + struct.pack("<Q", len(payload)) + payload_crc
                       + bytes(12))
    record[28:32] = crc(record[:28])
    tail = bytearray(struct.pack("<QQ", offset, len(payload)) + payload_crc)
    tail += crc(tail) + MAGIC
    return bytes(data[:offset]) + bytes(record) + payload + bytes(tail)


def fix_container(data) -> bytes:
    """Repair the header, index-record and tail checksums; leave every other byte alone."""
    buf = bytearray(data)
    if len(buf) >= HEADER:
        buf[60:64] = crc(buf[:60])
    where = index_location(buf)
    if where is not None:
        offset, length = where
        payload_crc = crc(buf[offset + RECORD:offset + RECORD + length])
        _fix_record(buf, offset, payload_crc)
        buf[len(buf) - TAIL + 16:len(buf) - TAIL + 20] = payload_crc
    if len(buf) >= HEADER + RECORD + TAIL:
        tail = len(buf) - TAIL
        buf[tail + 20:tail + 24] = crc(buf[tail:tail + 20])
    return bytes(buf)


def fix_chunks(data) -> bytes | None:
    """:func:`fix_container`, then also repair every chunk record the index names, rewriting
    the index JSON with the new CRCs (JSON oddities such as duplicate keys or spacing are lost
    in the rewrite). None when the index is not parseable JSON."""
    buf = bytearray(fix_container(data))
    found = read_index(buf)
    if found is None:
        return None
    offset, doc = found
    try:
        chunks = [c for t in doc["tensors"] for s in t["streams"] for c in s]
    except Exception:
        return None
    for chunk in chunks:
        if not (isinstance(chunk, list) and len(chunk) == 5
                and type(chunk[0]) is int and type(chunk[1]) is int):
            continue
        start, length = chunk[0], chunk[1]
        if not (HEADER <= start and start + RECORD + length <= offset):
            continue
        payload_crc = crc(buf[start + RECORD:start + RECORD + length])
        _fix_record(buf, start, payload_crc)
        chunk[2] = struct.unpack("<I", payload_crc)[0]
    try:
        payload = json.dumps(doc, separators=(",", ":")).encode("ascii")
    except Exception:
        return None
    if index_compressed(buf):
        payload = zstandard.ZstdCompressor(write_content_size=True).compress(payload)
    return replace_index(buf, offset, payload)


def variants(data) -> list[bytes]:
    """The input as given, with container checksums repaired, and with all checksums repaired
    (duplicates dropped)."""
    data = bytes(data)
    out = [data]
    for fixed in (fix_container(data), fix_chunks(data)):
        if fixed is not None and fixed not in out:
            out.append(fixed)
    return out
