"""Validating reader of .ink files: header, tail and index are checked on open; each chunk
record is checked against its header and the index before its payload is handed out."""
from __future__ import annotations

import errno
import os
import stat
import threading

import numpy as np

from ..atomic import check_path
from ..errors import (ChecksumError, CorruptError, InvalidArgumentError, LimitExceededError,
                      TruncatedError)
from . import layout
from .index import Index, parse, unpack_index


class _BufferPool:
    """Read buffers that outlive the readers which used them.

    A fresh buffer for every load costs page faults: glibc hands freed blocks of a few MiB
    back to the kernel, which zeroes the pages again on the next use (1,000-4,000 faults per
    load of a 256 MB tensor, about a tenth of its CPU time). Free buffers of at least
    ``min_bytes`` are kept up to ``keep_bytes`` together, the largest first; smaller ones go
    back to the allocator, whose heap serves them again without faults (measured: loads of a
    12 MB model whose buffers are all under 1 MiB fault nothing either way), and which can
    give their memory to whatever the process does next.
    """

    def __init__(self, keep_bytes: int, min_bytes: int = 1 << 20) -> None:
        self._keep_bytes = keep_bytes
        self._min_bytes = min_bytes
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, size: int) -> np.ndarray:
        """A buffer of at least ``size`` bytes (uninitialised)."""
        with self._lock:
            for i, buffer in enumerate(self._free):
                if size <= buffer.size <= 2 * size:
                    return self._free.pop(i)
        return np.empty(size, np.uint8)

    def give(self, buffers: list) -> None:
        """Return buffers from :meth:`take` that nobody reads any more."""
        buffers = [b for b in buffers if b.size >= self._min_bytes]
        with self._lock:
            self._free = sorted(self._free + buffers, key=lambda b: -b.size)
            total = 0
            for i, buffer in enumerate(self._free):
                total += buffer.size
                if total > self._keep_bytes:
                    del self._free[i:]
                    break


_BUFFERS = _BufferPool(keep_bytes=64 << 20)
# a child forked while another thread held the pool's lock would wait for it forever
os.register_at_fork(after_in_child=lambda: _BUFFERS.__init__(64 << 20))


def _check_regular(path: str) -> None:
    """A directory is the OS's error, named (reading it failed later without the path); a
    FIFO, device or socket is refused before it is opened (opening a FIFO waits for a writer
    forever)."""
    mode = os.stat(path).st_mode  # a missing file: FileNotFoundError naming it
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if not stat.S_ISREG(mode):
        raise InvalidArgumentError(f"{path} is not a regular file (a device, FIFO or socket)")


class ContainerReader:
    """Random access to the records of one .ink file, read with ``pread`` (docs/decisions.md,
    "Reading"): a file truncated by another program while open is a typed error.

    Parameters
    ----------
    path : str or os.PathLike
        The file to open. Raises a typed :class:`~inshrink.errors.InshrinkError` if the file is
        not a valid .ink file; ``OSError`` if it cannot be read at all.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = check_path(path)
        self._local = threading.local()
        # each thread's read buffer, by thread: given back to _BUFFERS on close
        self._taken: dict[int, np.ndarray] = {}
        _check_regular(self.path)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        try:
            self.size = os.fstat(self._fd).st_size
            self.index = self._read_index()
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

    def read_chunk(self, chunk: tuple) -> bytes:
        """Read and check one chunk record, ``(offset, length, crc, size, coding)``."""
        offset, length, crc = chunk[:3]
        return self.read_record(offset, length, crc, layout.KIND_CHUNK)

    def read_chunks(self, chunks: list, headers: list[bytes] | None = None) -> list:
        """Read and check several chunk records (``(offset, length, crc, size, coding)``
        tuples, read by position: see :class:`~inshrink.container.index.Chunk`); return
        views of their payloads.

        Back-to-back records (the writer's layout for the planes of one chunk) are read at
        once into a buffer owned by the calling thread; the views are valid until that
        thread's next call.
        ``headers``: the header each record must have (:meth:`expected_headers`), computed
        beforehand for many records at once.
        """
        if headers is None:
            headers = [None] * len(chunks)
        start = at = chunks[0][0]
        for c in chunks:
            if c[0] != at:  # not back to back: one read each
                return [self.read_chunk(c) for c in chunks]
            end = c[0] + layout.RECORD_HEADER_SIZE + c[1]
            at = end + layout.padding(end)
        view = self._buffer(end - start)
        if os.preadv(self._fd, [view], start) != end - start:
            raise TruncatedError(f"[R-0] {self.path}: file ends inside a record at offset "
                                 f"{start}")
        payloads = []
        for c, header in zip(chunks, headers):
            offset, length, crc = c[:3]
            at = offset - start
            head = view[at:at + layout.RECORD_HEADER_SIZE]
            if header is None or head != header:
                self._check_record(head, offset, layout.KIND_CHUNK, length, crc)
            at += layout.RECORD_HEADER_SIZE
            payload = view[at:at + length]
            if layout.crc32(payload) != crc:
                self._check_payload(payload, offset, crc)
            payloads.append(payload)
        return payloads

    @staticmethod
    def expected_headers(chunks: list) -> list[bytes]:
        """The header each of these chunk records must have: exactly when its stored header
        equals it, rules R-1 ... R-4 pass for it. Computed for all records at once."""
        if not chunks:
            return []
        lengths, crcs = (np.array(column, np.uint64) for column in list(zip(*chunks))[1:3])
        headers = layout.record_headers(layout.KIND_CHUNK, lengths, crcs)
        return [row.tobytes() for row in headers]

    def _buffer(self, size: int) -> memoryview:
        """This thread's read buffer, grown to at least ``size`` bytes (sizes are bounded by
        records already proven to lie inside the file)."""
        buffer = getattr(self._local, "buffer", None)
        if buffer is None or len(buffer) < size:
            # uninitialised: pread fills what is used (a bytearray would be zeroed first)
            # the smaller one it replaces is dead (its views last until this call): freed,
            # not held until close (dict assignment is atomic: no lock needed)
            buffer = self._local.buffer = _BUFFERS.take(size)
            self._taken[threading.get_ident()] = buffer
        return memoryview(buffer)[:size]

    def close(self) -> None:
        # the views handed out are dead by now: File decodes them before its next read
        taken, self._taken = self._taken, {}
        _BUFFERS.give(list(taken.values()))
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
