"""safetensors <-> .ink conversion, for single files and sharded checkpoint directories.

Tensors stream through in chunks (``os.pread``/``os.pwrite``), so memory stays near a few
chunks whatever the file size. The original safetensors header is kept in the .ink index, so
converting back reproduces the original file byte for byte.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass

from . import dtypes
from .atomic import AtomicFile, current_umask, fsync_directory
from .errors import CorruptError, InshrinkError, InvalidArgumentError, LimitExceededError
from .policy import Policy
from .tensorfile import File, Progress, TensorInfo, Writer

MAX_SAFETENSORS_HEADER = 100 << 20
SHARD_INDEX_SUFFIX = ".safetensors.index.json"


@dataclass(frozen=True)
class SafetensorsEntry:
    name: str
    dtype: dtypes.DType
    shape: tuple[int, ...]
    begin: int  # offsets relative to the data section
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    text: str
    metadata: dict[str, str]
    entries: list[SafetensorsEntry]  # in data order

    @property
    def data_start(self) -> int:
        return 8 + len(self.text.encode("utf-8"))

    @property
    def data_size(self) -> int:
        return self.entries[-1].end if self.entries else 0


def parse_safetensors_header(text: str, file_size: int | None = None) -> SafetensorsHeader:
    """Validate a safetensors header (the JSON text) and return its entries in data order."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CorruptError(f"safetensors header is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise CorruptError("safetensors header is not a JSON object")
    metadata = doc.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise CorruptError("safetensors __metadata__ must map strings to strings")
    entries = []
    for name, spec in doc.items():
        if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
            raise CorruptError(f"safetensors entry {name!r} is malformed")
        dtype = dtypes.BY_NAME.get(spec["dtype"]) if isinstance(spec["dtype"], str) else None
        if dtype is None:
            raise InvalidArgumentError(f"tensor {name!r}: unsupported dtype {spec['dtype']!r}")
        shape, offsets = spec["shape"], spec["data_offsets"]
        if (not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(type(o) is int and o >= 0 for o in offsets)):
            raise CorruptError(f"safetensors entry {name!r} has a bad shape or offsets")
        if offsets[1] - offsets[0] != math.prod(shape) * dtype.itemsize:
            raise CorruptError(f"safetensors entry {name!r}: offsets do not match its shape")
        entries.append(SafetensorsEntry(name, dtype, tuple(shape), offsets[0], offsets[1]))
    entries.sort(key=lambda e: (e.begin, e.end))
    position = 0
    for e in entries:  # the data section must be covered exactly, without holes or overlap
        if e.begin != position:
            raise CorruptError(f"safetensors data of {e.name!r} does not start where the "
                               f"previous tensor ends")
        position = e.end
    header = SafetensorsHeader(text, metadata, entries)
    if file_size is not None and header.data_start + header.data_size != file_size:
        raise CorruptError("safetensors header does not describe the file's size exactly")
    return header


def read_safetensors_header(fd: int, file_size: int) -> SafetensorsHeader:
    head = os.pread(fd, 8, 0)
    if len(head) < 8:
        raise CorruptError("file is too short for safetensors")
    n = int.from_bytes(head, "little")
    if n > MAX_SAFETENSORS_HEADER:
        raise LimitExceededError(f"safetensors header of {n} bytes exceeds the 100 MiB limit")
    if 8 + n > file_size:
        raise CorruptError("safetensors header is longer than the file")
    try:
        text = os.pread(fd, n, 8).decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptError("safetensors header is not UTF-8") from None
    return parse_safetensors_header(text, file_size)


def compress_safetensors(src: str | os.PathLike, dst: str | os.PathLike, *,
                         level: int | None = None, threads: int | None = None,
                         progress: Progress | None = None,
                         policy: Policy | str | None = None) -> list[TensorInfo]:
    """Convert a safetensors file into an .ink file (tensors and ``__metadata__``).

    Lossless unless ``policy`` (a :class:`~inshrink.Policy` or preset name) quantizes some
    tensors; see :func:`inshrink.save`.
    """
    fd = os.open(src, os.O_RDONLY)
    try:
        header = read_safetensors_header(fd, os.fstat(fd).st_size)
        with Writer(dst, header.metadata, level=level, threads=threads,
                    progress=progress, policy=policy) as writer:
            writer.safetensors_header = header.text
            for e in header.entries:
                base = header.data_start + e.begin
                writer.add_source(e.name, e.dtype, e.shape,
                                  lambda start, stop, base=base: _pread(fd, stop - start,
                                                                        base + start))
            return writer.close()
    finally:
        os.close(fd)


def _pread(fd: int, n: int, offset: int) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) != n:
        raise CorruptError("safetensors file changed or was truncated while being read")
    return data


def _pwrite(fd: int, data, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (os.pwrite may write less than asked)."""
    view = memoryview(data).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _header_for(f: File) -> SafetensorsHeader:
    """The stored original header if it still describes the file's tensors, else a new one."""
    infos = {i.name: i for i in f.infos()}
    if f.safetensors_header is not None:
        try:
            original = parse_safetensors_header(f.safetensors_header)
        except InshrinkError:
            original = None
        if original is not None and original.metadata == f.metadata and {
                e.name: (e.dtype.name, e.shape) for e in original.entries} == {
                n: (i.dtype, i.shape) for n, i in infos.items()}:
            return original
    doc: dict = {"__metadata__": f.metadata} if f.metadata else {}
    position = 0
    for i in infos.values():
        doc[i.name] = {"dtype": i.dtype, "shape": list(i.shape),
                       "data_offsets": [position, position + i.nbytes]}
        position += i.nbytes
    text = json.dumps(doc, separators=(",", ":"))
    text += " " * (-(8 + len(text.encode("utf-8"))) % 8)  # data starts 8-byte aligned
    return parse_safetensors_header(text)


def decompress_to_safetensors(src: str | os.PathLike, dst: str | os.PathLike, *,
                              threads: int | None = None,
                              progress: Progress | None = None) -> None:
    """Convert an .ink file into a safetensors file (atomically).

    The result is byte-identical to the original when the .ink file was made from one.
    """
    with File(src, threads=threads, mmap=False) as f:  # streamed: keep the RSS bounded
        header = _header_for(f)
        out = AtomicFile(dst)
        try:
            raw = header.text.encode("utf-8")
            out.file.write(len(raw).to_bytes(8, "little") + raw)
            out.file.flush()
            fd = out.file.fileno()
            for e in header.entries:
                base = header.data_start + e.begin
                f.read_into(e.name, lambda start, chunk, base=base: _pwrite(
                    fd, chunk, base + start), progress, in_order=False)
            out.commit()
        except BaseException:
            out.abort()
            raise


def _convert_directory(src: str, dst: str, convert, suffix_in: str, suffix_out: str) -> None:
    """Convert every shard of a checkpoint directory; copy every other file verbatim.

    The new directory is built beside ``dst`` and renamed into place at the end.
    """
    if not os.path.isdir(src):
        raise InvalidArgumentError(f"{src} is not a directory")
    parent = os.path.dirname(os.path.abspath(dst))
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.", dir=parent)
    try:
        for name in sorted(os.listdir(src)):
            path = os.path.join(src, name)
            if not os.path.isfile(path):
                continue
            if name.endswith(suffix_in):
                convert(path, os.path.join(staging, name[:-len(suffix_in)] + suffix_out))
            else:
                shutil.copy2(path, os.path.join(staging, name))
        os.chmod(staging, 0o777 & ~current_umask())
        if os.path.exists(dst):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(dst)}.old.", dir=parent)
            os.replace(dst, os.path.join(old, "x"))
            os.replace(staging, dst)
            shutil.rmtree(old)
        else:
            os.replace(staging, dst)
        fsync_directory(parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def compress_directory(src: str, dst: str, **kwargs) -> None:
    """Compress a sharded safetensors checkpoint directory into a directory of .ink shards."""
    _convert_directory(src, dst, lambda a, b: compress_safetensors(a, b, **kwargs),
                       ".safetensors", ".ink")


def decompress_directory(src: str, dst: str, **kwargs) -> None:
    """Turn a directory of .ink shards back into a sharded safetensors directory."""
    _convert_directory(src, dst, lambda a, b: decompress_to_safetensors(a, b, **kwargs),
                       ".ink", ".safetensors")
