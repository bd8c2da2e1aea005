"""Validating reader of .ink files: header, tail and index are checked on open; each chunk
record is checked against its header and the index before its payload is handed out."""
from __future__ import annotations

import mmap
import os
import threading

import numpy as np

from ..errors import ChecksumError, CorruptError, LimitExceededError, TruncatedError
from . import layout
from .index import Chunk, Index, parse, unpack_index


class ContainerReader:
    """Random access to the records of one .ink file.

    Parameters
    ----------
    path : str or os.PathLike
        The file to open. Raises a typed :class:`~inshrink.errors.InshrinkError` if the file is
        not a valid .ink file; ``OSError`` if it cannot be read at all.
    use_mmap : bool
        Read chunk payloads through a read-only memory map (no copy; the default) instead of
        ``pread`` into a buffer. A mapped file must not be truncated by another program while
        it is open (inshrink itself never modifies a file in place: it writes a new one and
        renames it), or the process receives SIGBUS.
    """

    def __init__(self, path: str | os.PathLike, use_mmap: bool = True) -> None:
        self.path = os.fspath(path)
        self._local = threading.local()
        self._map: mmap.mmap | None = None
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            self.size = os.fstat(self._fd).st_size
            self.index = self._read_index()
            if use_mmap:
                self._map = mmap.mmap(self._fd, self.size, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(self._fd)
            raise

    def _pread(self, length: int, offset: int) -> bytes:
        data = os.pread(self._fd, length, offset)
        if len(data) != length:
            raise TruncatedError(f"[R-0] {self.path}: file ends inside a structure at offset "
                                 f"{offset}")
        return data

    def _read_index(self) -> Index:
        minimum = layout.HEADER_SIZE + layout.RECORD_HEADER_SIZE + layout.TAIL_SIZE
        if self.size < minimum:
            head = os.pread(self._fd, layout.HEADER_SIZE, 0)
            if not layout.MAGIC.startswith(head[:len(layout.MAGIC)]):
                raise CorruptError(f"[H-1] {self.path}: not an .ink file (bad magic)")
            raise TruncatedError(f"[H-1] {self.path}: {self.size} bytes is too short for an "
                                 f".ink file")
        self.version, required = layout.read_header(self._pread(layout.HEADER_SIZE, 0))
        index_offset, length, index_crc = layout.parse_tail(
            self._pread(layout.TAIL_SIZE, self.size - layout.TAIL_SIZE))
        if length > layout.MAX_INDEX_BYTES:
            raise LimitExceededError(f"[T-3] index of {length} bytes exceeds the "
                                     f"{layout.MAX_INDEX_BYTES}-byte limit")
        if (index_offset % layout.ALIGNMENT or index_offset < layout.HEADER_SIZE
                or layout.file_size(index_offset, length) != self.size):
            raise CorruptError("[T-4] tail does not point at an index record ending before it")
        payload = self.read_record(index_offset, length, index_crc, layout.KIND_INDEX)
        if required & layout.FEATURE_ZINDEX:
            payload = unpack_index(payload, self.size)
        index = parse(payload, index_offset, self.size)
        if bool(required & layout.FEATURE_DELTA) != (index.base is not None):
            raise CorruptError("[I-16] the delta feature bit and the index's base reference "
                               "disagree")
        return index

    def _check_record(self, head, offset: int, kind: int, length: int, crc: int) -> None:
        layout.check_record_header(head, offset, kind, length, crc)

    def _check_payload(self, payload, offset: int, crc: int) -> None:
        if layout.crc32(payload) != crc:
            raise ChecksumError(f"[R-5] {self.path}: checksum mismatch in record at offset "
                                f"{offset}")

    def read_record(self, offset: int, length: int, crc: int, kind: int) -> bytes:
        """Read a record's payload after checking its header, length and checksums."""
        self._check_record(self._pread(layout.RECORD_HEADER_SIZE, offset), offset, kind,
                           length, crc)
        payload = self._pread(length, offset + layout.RECORD_HEADER_SIZE)
        self._check_payload(payload, offset, crc)
        return payload

    def read_chunk(self, chunk: Chunk) -> bytes:
        return self.read_record(chunk.offset, chunk.length, chunk.crc, layout.KIND_CHUNK)

    def read_chunks(self, chunks: list[Chunk]) -> list:
        """Read and check several chunk records; return views of their payloads.

        Memory-mapped: the views are slices of the map. Otherwise back-to-back records (the
        writer's layout for the planes of one chunk) are read at once into a buffer owned by the
        calling thread, and the views are valid until that thread's next call.
        """
        if self._map is not None:
            return [self._mapped_payload(c) for c in chunks]
        first, last = chunks[0], chunks[-1]
        start, end = first.offset, last.offset + layout.RECORD_HEADER_SIZE + last.length
        for a, b in zip(chunks, chunks[1:]):
            a_end = a.offset + layout.RECORD_HEADER_SIZE + a.length
            if b.offset != a_end + layout.padding(a_end):
                return [self.read_chunk(c) for c in chunks]
        view = self._buffer(end - start)
        if os.preadv(self._fd, [view], start) != end - start:
            raise TruncatedError(f"[R-0] {self.path}: file ends inside a record at offset "
                                 f"{start}")
        payloads = []
        for c in chunks:
            at = c.offset - start
            self._check_record(view[at:at + layout.RECORD_HEADER_SIZE], c.offset,
                               layout.KIND_CHUNK, c.length, c.crc)
            payload = view[at + layout.RECORD_HEADER_SIZE:at + layout.RECORD_HEADER_SIZE
                           + c.length]
            self._check_payload(payload, c.offset, c.crc)
            payloads.append(payload)
        return payloads

    def _mapped_payload(self, c: Chunk) -> memoryview:
        end = c.offset + layout.RECORD_HEADER_SIZE + c.length
        if end > len(self._map):  # the index parser already guarantees this
            raise TruncatedError(f"[R-0] {self.path}: record at offset {c.offset} passes the "
                                 f"end")
        view = memoryview(self._map)[c.offset:end]
        self._check_record(view[:layout.RECORD_HEADER_SIZE], c.offset, layout.KIND_CHUNK,
                           c.length, c.crc)
        payload = view[layout.RECORD_HEADER_SIZE:]
        self._check_payload(payload, c.offset, c.crc)
        return payload

    # headers compared per batch: the gather's index array takes 256 bytes per record
    _HEADER_BATCH = 1 << 16

    def headers_match(self, chunks: list[Chunk]) -> bool:
        """Whether every one of these chunk records has exactly the header its index entry
        implies (so rules R-0 ... R-4 pass for them), checked for all at once in the memory map.

        After True, :meth:`payload` hands out their payloads. False when a header differs or
        the file is not mapped: :meth:`read_chunks` then checks record by record, in the
        order of the spec, and names the first rule broken.
        """
        if self._map is None:
            return False
        if not chunks:
            return True
        offsets, lengths, crcs = (np.array(column, np.uint64)
                                  for column in list(zip(*chunks))[:3])
        data = np.frombuffer(self._map, np.uint8)
        try:
            span = np.arange(layout.RECORD_HEADER_SIZE, dtype=np.uint64)
            for at in range(0, len(chunks), self._HEADER_BATCH):
                part = slice(at, at + self._HEADER_BATCH)
                # in bounds: the index parser checked that every record lies in the file
                stored = data[offsets[part, None] + span]
                if not np.array_equal(stored, layout.record_headers(
                        layout.KIND_CHUNK, lengths[part], crcs[part])):
                    return False
            return True
        finally:
            del data  # the map must not stay exported, or it cannot be closed

    def payload(self, c: Chunk) -> memoryview | None:
        """The payload of a chunk record whose header :meth:`headers_match` accepted, or None
        when it does not match its CRC (rule R-5: :meth:`read_chunks` names the error)."""
        start = c.offset + layout.RECORD_HEADER_SIZE
        payload = memoryview(self._map)[start:start + c.length]
        return payload if layout.crc32(payload) == c.crc else None

    def _buffer(self, size: int) -> memoryview:
        """This thread's read buffer, grown to at least ``size`` bytes (sizes are bounded by
        records already proven to lie inside the file)."""
        buffer = getattr(self._local, "buffer", None)
        if buffer is None or len(buffer) < size:
            buffer = self._local.buffer = bytearray(size)
        return memoryview(buffer)[:size]

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive (e.g. in a traceback): unmap on GC
                pass
            self._map = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
