"""Streaming, atomic writer of .ink files.

Records go to a temporary file in the destination directory as soon as they are encoded; the
index and tail are written on close, then the file is fsynced and renamed over the
destination. An exception (or a kill) before that leaves any previous file intact.
"""
from __future__ import annotations

import os
import tempfile
from typing import BinaryIO

from . import layout
from .index import Chunk, Index, TensorEntry


class ContainerWriter:
    """Low-level writer: appends records and an index; knows nothing about codecs.

    Parameters
    ----------
    path : str or os.PathLike
        Destination. Nothing appears there until :meth:`commit` succeeds.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, self._tmp = tempfile.mkstemp(prefix=f".{os.path.basename(self.path)}.",
                                         suffix=".tmp", dir=directory)
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; give what open() would
        self._file: BinaryIO = os.fdopen(fd, "wb")
        self._offset = 0
        self.tensors: list[TensorEntry] = []
        self._write(layout.pack_header())

    def _write(self, data) -> None:
        self._file.write(data)
        self._offset += len(memoryview(data))

    def _record(self, kind: int, payload) -> int:
        """Write one record (aligned) and return its offset."""
        self._write(bytes(layout.padding(self._offset)))
        offset = self._offset
        self._write(layout.pack_record_header(kind, payload))
        self._write(payload)
        return offset

    def write_chunk(self, coding: str, payload: bytes, size: int) -> Chunk:
        """Append one chunk record and return its index entry."""
        offset = self._record(layout.KIND_CHUNK, payload)
        return Chunk(offset, len(payload), layout.crc32(payload), size, coding)

    @property
    def bytes_written(self) -> int:
        return self._offset

    def commit(self, metadata: dict[str, str], safetensors_header: str | None = None) -> None:
        """Write index and tail, fsync, and atomically move the file into place."""
        payload = Index(self.tensors, metadata, safetensors_header).to_bytes()
        offset = self._record(layout.KIND_INDEX, payload)
        self._write(layout.pack_tail(offset, payload))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._tmp, self.path)
        _fsync_directory(os.path.dirname(os.path.abspath(self.path)))

    def abort(self) -> None:
        """Discard everything written; the destination is untouched."""
        if not self._file.closed:
            self._file.close()
        try:
            os.unlink(self._tmp)
        except FileNotFoundError:
            pass


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
