"""safetensors <-> .ink conversion, for single files and checkpoint directories.

Tensors stream through in chunks (``os.pread``/``os.pwrite``), so memory stays near a few
chunks whatever the file size. The original safetensors header is kept in the .ink index, so
converting back reproduces the original file byte for byte. Directories are converted with
their whole tree (sharded Hugging Face checkpoints, diffusers' ``unet/``, ``vae/``... folders).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass

from . import dtypes
from .atomic import AtomicFile, current_umask, fsync_directory, hidden_prefix, named_error
from .container import layout
from .errors import (CorruptError, InshrinkError, InvalidArgumentError, LimitExceededError,
                     with_path)
from .encode.policy import Policy
from .io.arguments import Progress
from .io.file import File
from .io.info import TensorInfo
from .io.writer import Writer

MAX_SAFETENSORS_HEADER = 100 << 20
SAFETENSORS_DTYPES = frozenset(dtypes.BY_NAME) - {"C128"}
"""The dtypes of inshrink that safetensors readers know (they have C64, no C128)."""
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


_SIGNATURES = (  # leading bytes of formats people mistake for safetensors, and a hint
    (layout.MAGIC, "an .ink file, already compressed",
     "decompress it, or read it with inshrink.load"),
    (b"PK\x03\x04", "a zip archive, e.g. a PyTorch torch.save checkpoint", "_torch"),
    (b"GGUF", "a GGUF file", None),
    (b"\x93NUMPY", "a NumPy .npy file", None),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file (Keras/TensorFlow)", None),
    (b"\x28\xb5\x2f\xfd", "a zstd-compressed file", None),
    (b"\x1f\x8b", "a gzip-compressed file", None),
)
_TORCH_HINT = ("torch pickles are not read: load it with torch and save it with "
               "safetensors.torch.save_file or inshrink.save")


def sniff(head: bytes) -> tuple[str, str | None] | None:
    """What a file whose first bytes are ``head`` looks like, when that is a format inshrink
    does not convert: (description, hint or None); None when it is not recognised."""
    for magic, what, hint in _SIGNATURES:
        if head.startswith(magic):
            return what, _TORCH_HINT if hint == "_torch" else hint
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "a Python pickle, e.g. a PyTorch torch.save checkpoint", _TORCH_HINT
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:  # a multi-byte character cut off at the end is text
        text = head[:exc.start].decode("utf-8") if exc.start >= len(head) - 3 else None
    if text and all(c.isprintable() or c in "\t\r\n" for c in text):
        return "a text file", None
    return None


def _not_safetensors(path: str, head: bytes, reason: str) -> InshrinkError:
    """The error for a file that is not safetensors: what it looks like, else why not."""
    known = sniff(head)
    if known is None:
        return CorruptError(f"{path} is not a safetensors file ({reason})")
    what, hint = known
    if what.startswith("an .ink file"):
        return InvalidArgumentError(f"{path} is already compressed (an .ink file): {hint}")
    return InvalidArgumentError(f"{path} is not a safetensors file (it looks like {what}"
                                + (f"; {hint})" if hint else ")"))


def read_safetensors_header(fd: int, file_size: int,
                            path: str | os.PathLike | None = None) -> SafetensorsHeader:
    """Read and validate the header of the safetensors file open as ``fd``.

    Errors name ``path`` and, for a file in another format (an .ink file, a torch pickle or
    zip, text...), say what it looks like.
    """
    where = "the input" if path is None else os.fspath(path)
    head = os.pread(fd, 64, 0)
    if len(head) < 8:
        raise _not_safetensors(where, head, f"{file_size} bytes is too short")
    n = int.from_bytes(head[:8], "little")
    if 8 + n > file_size:
        raise _not_safetensors(where, head, f"its first 8 bytes declare a header of {n:,} "
                                            f"bytes, the file has {file_size:,}")
    if n and head[8:9] != b"{":  # the safetensors format requires this
        raise _not_safetensors(where, head, "the header is not a JSON object")
    if n > MAX_SAFETENSORS_HEADER:
        raise LimitExceededError(f"{where}: safetensors header of {n:,} bytes exceeds the "
                                 f"100 MiB limit")
    try:
        text = os.pread(fd, n, 8).decode("utf-8")
    except UnicodeDecodeError:
        raise CorruptError(f"{where}: safetensors header is not UTF-8") from None
    try:
        return parse_safetensors_header(text, file_size)
    except InshrinkError as exc:
        raise type(exc)(f"{where}: {exc}") from None


def compress_safetensors(src: str | os.PathLike, dst: str | os.PathLike, *,
                         level: int | None = None, threads: int | None = None,
                         progress: Progress | None = None,
                         policy: Policy | str | None = None) -> list[TensorInfo]:
    """Convert a safetensors file into an .ink file (tensors and ``__metadata__``).

    Lossless unless ``policy`` (a :class:`~inshrink.Policy` or preset name) quantizes some
    tensors; see :func:`inshrink.save`. Returns a report per tensor (with the error achieved
    by each lossy one).
    """
    if os.path.isdir(src):
        raise InvalidArgumentError(f"{os.fspath(src)} is a directory: use compress_directory")
    _check_not_source(src, dst)
    fd = os.open(src, os.O_RDONLY)
    try:
        header = read_safetensors_header(fd, os.fstat(fd).st_size, src)
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


def _check_not_source(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """The output of a conversion must not be its input (also through a link): it would
    replace the source, with lossy values if a policy quantized it."""
    try:
        same = os.path.samefile(src, dst)
    except (OSError, ValueError, TypeError):  # no such output yet, or not a path: checked later
        return
    if same:
        raise InvalidArgumentError(f"the output {os.fspath(dst)} is the input "
                                   f"{os.fspath(src)}")


def _pread(fd: int, n: int, offset: int) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) != n:
        raise CorruptError("safetensors file changed or was truncated while being read")
    return data


def _pwrite(fd: int, data, offset: int, path: str) -> None:
    """Write all of ``data`` at ``offset`` (os.pwrite may write less than asked); an error
    (a full disk) names ``path``, the destination the user knows."""
    view = memoryview(data).cast("B")
    try:
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
    except OSError as exc:
        raise named_error(exc, path) from exc


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
    for i in infos.values():  # the safetensors format has no complex128 dtype
        if i.dtype not in SAFETENSORS_DTYPES:
            raise InvalidArgumentError(f"tensor {i.name!r} is {i.dtype}, which safetensors "
                                       f"cannot store: read the file with inshrink.load")
        if i.name == "__metadata__":
            raise InvalidArgumentError("a tensor named '__metadata__' cannot be stored in "
                                       "safetensors (its header's metadata has that name): "
                                       "read the file with inshrink.load")
    doc: dict = {"__metadata__": f.metadata} if f.metadata else {}
    position = 0
    for i in infos.values():
        doc[i.name] = {"dtype": i.dtype, "shape": list(i.shape),
                       "data_offsets": [position, position + i.nbytes]}
        position += i.nbytes
    text = json.dumps(doc, separators=(",", ":"))
    text += " " * (-(8 + len(text.encode("utf-8"))) % 8)  # data starts 8-byte aligned
    return parse_safetensors_header(text)


def check_ink(path: str | os.PathLike) -> None:
    """Raise a typed error naming ``path`` unless it is a file that starts like an .ink file
    (saying what it looks like instead, e.g. a safetensors file)."""
    where = os.fspath(path)
    if os.path.isdir(where):
        raise InvalidArgumentError(f"{where} is a directory, not an .ink file")
    with open(where, "rb") as f:
        head = f.read(64)
    if head.startswith(layout.MAGIC):
        return
    known = sniff(head)
    if known is None and len(head) >= 9 and head[8:9] == b"{":
        known = ("a safetensors file", "compress it first")
    if known is None:
        raise CorruptError(f"{where} is not an .ink file (bad magic)")
    what, hint = known
    raise InvalidArgumentError(f"{where} is not an .ink file (it looks like {what}"
                               + (f"; {hint})" if hint else ")"))


def decompress_to_safetensors(src: str | os.PathLike, dst: str | os.PathLike, *,
                              threads: int | None = None,
                              progress: Progress | None = None) -> list[TensorInfo]:
    """Convert an .ink file into a safetensors file (atomically); return what its index
    says about each tensor (lossy tensors decode to their quantized values).

    The result is byte-identical to the original when the .ink file was made from one
    losslessly.
    """
    check_ink(src)
    _check_not_source(src, dst)
    with File(src, threads=threads, mmap=False) as f:  # streamed: keep the RSS bounded
        header = _header_for(f)
        with AtomicFile(dst) as out:
            raw = header.text.encode("utf-8")
            out.file.write(len(raw).to_bytes(8, "little") + raw)
            out.file.flush()
            fd = out.file.fileno()
            for e in header.entries:
                base = header.data_start + e.begin
                f.read_into(e.name, lambda start, chunk, base=base: _pwrite(
                    fd, chunk, base + start, os.fspath(dst)), progress, in_order=False)
        return f.infos()


@dataclass(frozen=True)
class FileReport:
    """What a directory conversion did with one file of the source directory.

    Attributes
    ----------
    source : str
        The file's path relative to the source directory.
    output : str
        The path written, relative to the destination directory.
    bytes_in, bytes_out : int
        Sizes of the source file and of the file written.
    tensors : list of TensorInfo or None
        The file's tensors (with the error of each lossy one); None for a file copied
        verbatim (configs, tokenizers, shard indexes...).
    link_target : str or None
        Where the source file, a symbolic link out of the source directory, pointed
        (only with ``follow_symlinks=True``; its content was converted or copied).
    """

    source: str
    output: str
    bytes_in: int
    bytes_out: int
    tensors: list[TensorInfo] | None
    link_target: str | None = None

    @property
    def copied(self) -> bool:
        return self.tensors is None


def _raise(exc: OSError) -> None:
    raise exc


def tensor_files(directory: str | os.PathLike, suffix: str) -> list[str]:
    """Paths of the files under ``directory`` (recursively, sorted) whose names end with
    ``suffix``; a directory that cannot be read raises."""
    found = []
    for top, dirnames, filenames in os.walk(directory, onerror=_raise):
        dirnames.sort()
        found += [os.path.join(top, n) for n in sorted(filenames) if n.endswith(suffix)]
    return found


def _walk(src: str, follow_symlinks: bool) -> tuple[list[str], list[tuple[str, str, str | None]]]:
    """The subdirectories (relative paths) and files ``(relative path, path, link target
    outside src or None)`` of ``src``; raises for what cannot be converted faithfully."""
    root = os.path.realpath(src)
    directories, files = [], []
    for top, dirnames, filenames in os.walk(src, onerror=_raise):
        dirnames.sort()
        for name in dirnames:
            path = os.path.join(top, name)
            if os.path.islink(path):
                raise InvalidArgumentError(
                    f"{path} is a symbolic link to a directory; such links are not followed "
                    f"(copy the directory in, or convert it separately)")
            directories.append(os.path.relpath(path, src))
        for name in sorted(filenames):
            path = os.path.join(top, name)
            outside = None
            if os.path.islink(path):
                target = os.path.realpath(path)
                if not os.path.exists(target):
                    raise InvalidArgumentError(f"{path} is a broken symbolic link")
                if os.path.commonpath([root, target]) != root:
                    if not follow_symlinks:
                        raise InvalidArgumentError(
                            f"{path} is a symbolic link to {target}, outside {src}; pass "
                            f"follow_symlinks=True (--follow-symlinks) to store its content")
                    outside = target
            if not os.path.isfile(path):
                raise InvalidArgumentError(f"{path} is not a regular file")
            files.append((os.path.relpath(path, src), path, outside))
    return directories, files


def _check_destination(src: str, dst: str, overwrite: bool) -> None:
    real_src, real_dst = os.path.realpath(src), os.path.realpath(dst)
    if os.path.commonpath([real_src, real_dst]) == real_dst:
        raise InvalidArgumentError(f"{dst} would replace the source directory {src}")
    if os.path.commonpath([real_src, real_dst]) == real_src:
        raise InvalidArgumentError(f"{dst} is inside the source directory {src}")
    if os.path.lexists(dst) and not overwrite:
        raise InvalidArgumentError(f"{dst} exists (pass overwrite=True to replace it)")


def _convert_directory(src: str | os.PathLike, dst: str | os.PathLike, convert,
                       suffix_in: str, suffix_out: str, overwrite: bool,
                       follow_symlinks: bool) -> list[FileReport]:
    """Convert every ``suffix_in`` file under ``src``, copy every other file verbatim, keeping
    relative paths. The new tree is built beside ``dst`` and renamed into place at the end, so
    a failure leaves no partial destination (and any previous one intact)."""
    src, dst = os.fspath(src), os.path.normpath(os.fspath(dst))
    if not os.path.isdir(src):
        raise InvalidArgumentError(f"{src} is not a directory")
    _check_destination(src, dst, overwrite)
    directories, files = _walk(src, follow_symlinks)
    if not any(rel.endswith(suffix_in) for rel, _, _ in files):
        raise InvalidArgumentError(f"{src} holds no {suffix_in} files (subdirectories "
                                   f"included): nothing to convert")
    parent = os.path.dirname(os.path.abspath(dst))
    staging = tempfile.mkdtemp(prefix=hidden_prefix(dst, room=8), dir=parent)
    try:
        for rel in directories:
            os.makedirs(os.path.join(staging, rel), exist_ok=True)
        reports = []
        for rel, path, outside in files:
            out_rel = rel[:-len(suffix_in)] + suffix_out if rel.endswith(suffix_in) else rel
            out = os.path.join(staging, out_rel)
            if rel.endswith(suffix_in):
                try:
                    tensors = convert(path, out)
                except InshrinkError as exc:
                    raise with_path(exc, path) from None
            else:
                shutil.copy2(path, out)  # follows a link: its content is what is stored
                tensors = None
            reports.append(FileReport(rel, out_rel, os.path.getsize(path),
                                      os.path.getsize(out), tensors, outside))
        os.chmod(staging, 0o777 & ~current_umask())
        if os.path.lexists(dst):
            old = tempfile.mkdtemp(prefix=hidden_prefix(dst, room=12) + "old.", dir=parent)
            os.replace(dst, os.path.join(old, "x"))
            try:
                os.replace(staging, dst)
            except BaseException:
                os.replace(os.path.join(old, "x"), dst)
                os.rmdir(old)
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, dst)
        fsync_directory(parent)
        return reports
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise _user_paths(exc, staging, dst) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _user_paths(exc: OSError, staging: str, dst: str) -> OSError:
    """``exc`` with paths inside the hidden staging directory shown under ``dst``."""
    def shown(path):
        if isinstance(path, str) and (path == staging or path.startswith(staging + os.sep)):
            return os.path.join(dst, os.path.relpath(path, staging))
        return path
    if shown(exc.filename) == exc.filename and shown(exc.filename2) == exc.filename2:
        return exc
    return type(exc)(exc.errno, exc.strerror, shown(exc.filename), None, shown(exc.filename2))


def compress_directory(src: str | os.PathLike, dst: str | os.PathLike, *,
                       overwrite: bool = False, follow_symlinks: bool = False,
                       **kwargs) -> list[FileReport]:
    """Compress a checkpoint directory (with its subdirectories) into a directory of .ink
    files; every other file is copied verbatim.

    Parameters
    ----------
    src, dst : str or os.PathLike
        The safetensors tree and the destination directory, created atomically (a failure
        leaves no partial destination).
    overwrite : bool
        Replace an existing ``dst`` (otherwise :class:`InvalidArgumentError`).
    follow_symlinks : bool
        Store the content of symbolic links that point outside ``src`` (such as the
        Hugging Face cache's links into its ``blobs/``); by default they are refused.
        Links inside ``src`` are always stored as the content they point to.
    **kwargs
        ``level``, ``threads``, ``progress``, ``policy``: see :func:`compress_safetensors`.

    Returns
    -------
    list of FileReport
        One per file of ``src``, in path order.

    Raises
    ------
    InvalidArgumentError
        ``src`` holds no .safetensors file, ``dst`` exists (without ``overwrite``), is or
        contains ``src``, or ``src`` holds a link or special file that cannot be stored.
    """
    return _convert_directory(src, dst, lambda a, b: compress_safetensors(a, b, **kwargs),
                              ".safetensors", ".ink", overwrite, follow_symlinks)


def decompress_directory(src: str | os.PathLike, dst: str | os.PathLike, *,
                         overwrite: bool = False, follow_symlinks: bool = False,
                         **kwargs) -> list[FileReport]:
    """Turn a directory of .ink files (subdirectories included) back into safetensors; the
    other files are copied verbatim. Parameters and result as :func:`compress_directory`
    (``**kwargs``: ``threads``, ``progress``)."""
    return _convert_directory(src, dst,
                              lambda a, b: decompress_to_safetensors(a, b, **kwargs),
                              ".ink", ".safetensors", overwrite, follow_symlinks)
