"""The chunk map of a sharded checkpoint, ``chunks.json``: where every chunk lies in its tensor
and which rank file holds it, readable without torch.

DCP's ``.metadata`` holds the same layout as a torch pickle. :class:`InkStorageWriter` writes
this JSON document beside it, in the same commit, just before ``.metadata`` (which stays the
commit marker, written last). :func:`read_chunk_map` reads and checks it (rules K-1 ... K-13
of spec/FORMAT.md section 25.1.3, each error naming its rule); :func:`assemble` and
:func:`iter_assembled` join whole tensors from the rank files with :class:`inshrink.File`;
:func:`values` gives the plain non-tensor values.

Standard library, numpy and inshrink's file reader only: this module never imports torch.

>>> tensors = assemble("ckpt/step_100")        # doctest: +SKIP
>>> tensors["model.layers.0.weight"].shape     # doctest: +SKIP
(4096, 4096)
"""
from __future__ import annotations

import base64
import binascii
import bisect
import json
import math
import os
import re
import reprlib
from dataclasses import dataclass
from typing import Any, Iterator, NoReturn, Union

import numpy as np

from .. import strict_json
from ..atomic import write_file
from ..dtypes import BY_NAME
from ..errors import (CorruptError, IncompleteCheckpointError, InshrinkError,
                      LimitExceededError, UnsupportedVersionError)
from ..io.file import File
from .calls import checked_path, named
from .names import BYTES_PREFIX, CHUNK_MAP, METADATA, identity_problem, is_rank_file

__all__ = ["CHUNK_MAP", "FORMAT", "VERSION", "MAX_CHUNK_MAP_BYTES", "MAX_VALUE_BYTES",
           "MAX_GRID_CELLS", "Chunk", "TensorItem", "ValueItem", "ChunkMap", "plain_value",
           "encode", "decode", "checked", "write_chunk_map", "read_chunk_map", "find_chunk_map",
           "MapFiles", "assemble", "iter_assembled", "values"]

FORMAT = "inshrink-dcp-chunks"
VERSION = 1
MAX_CHUNK_MAP_BYTES = 64 << 20
"""The largest chunk map (K-1), as the index of an .ink file."""
MAX_NAME_BYTES = 1024
"""The longest FQN and stored tensor name, in UTF-8 bytes (the .ink name limit)."""
MAX_NDIM = 32
MAX_TENSOR_BYTES = 1 << 48
MAX_VALUE_BYTES = 65_536
"""The longest string (UTF-8 bytes) or bytes value kept typed; the writer marks a longer one
opaque (K-10)."""
MAX_GRID_CELLS = 1 << 22
"""The cost bound of the coverage check of one tensor (K-9): the cells of the grid its chunks'
edges cut it into, at most this or 64 x its chunk count."""
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1
_SAVE_ID = re.compile(r"[0-9a-f]{12}")
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
VALUE_TYPES = ("int", "float", "str", "bool", "none", "bytes")
_MEMBERS = {"tensor": {"fqn", "kind", "dtype", "shape", "chunks"},
            "value": {"fqn", "kind", "type", "value", "file", "tensor"},
            "opaque": {"fqn", "kind", "file", "tensor"}}


@dataclass(frozen=True)
class Chunk:
    """One stored chunk of a tensor: where it lies, and the rank file and name holding it."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    tensor: str


@dataclass(frozen=True)
class TensorItem:
    """A tensor of the saved state: its whole dtype (a name of the format's dtype registry)
    and shape, and its chunks."""

    fqn: str
    dtype: str
    shape: tuple[int, ...]
    chunks: tuple[Chunk, ...]


@dataclass(frozen=True)
class ValueItem:
    """A saved value that is not a tensor, stored as its ``torch.save`` bytes in ``file``
    under ``tensor``; ``kind`` "value": plain, ``type`` and ``value`` say what it is (bytes
    decoded from base64); "opaque": only the bytes (``type`` and ``value`` None)."""

    fqn: str
    kind: str
    type: str | None
    value: Any
    file: str
    tensor: str


Item = Union[TensorItem, ValueItem]


@dataclass(frozen=True)
class ChunkMap:
    """A checkpoint's layout: its save id and its items in saved order."""

    save_id: str
    items: tuple[Item, ...]

    @property
    def files(self) -> list[str]:
        """The rank files it names, sorted."""
        return sorted({c.file for i in self.items for c in _stored(i)})

    @property
    def chunk_count(self) -> int:
        """Stored chunks: a tensor's chunks, one per non-tensor value."""
        return sum(len(_stored(i)) for i in self.items)


def _stored(item: Item) -> tuple:
    return item.chunks if isinstance(item, TensorItem) else (item,)


# -- writing -------------------------------------------------------------------------------

def plain_value(value: Any) -> tuple[str, Any] | None:
    """(type, JSON value) of a non-tensor value that the map can hold typed, else None (it is
    then opaque): a bool, a 64-bit int, a finite float, None, or a string or bytes of at most
    :data:`MAX_VALUE_BYTES`."""
    kind = type(value)
    if kind is bool:
        return "bool", value
    if kind is int:
        return ("int", value) if _INT_MIN <= value <= _INT_MAX else None
    if kind is float:
        return ("float", value) if math.isfinite(value) else None
    if value is None:
        return "none", None
    if kind is str:
        size = _utf8_size(value)
        return ("str", value) if size is not None and size <= MAX_VALUE_BYTES else None
    if kind is bytes:  # base64 in the document
        return ("bytes", value) if len(value) <= MAX_VALUE_BYTES else None
    return None


def _item_doc(item: Item) -> dict:
    if isinstance(item, TensorItem):
        return {"fqn": item.fqn, "kind": "tensor", "dtype": item.dtype,
                "shape": list(item.shape),
                "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes),
                            "file": c.file, "tensor": c.tensor} for c in item.chunks]}
    if item.kind == "opaque":
        return {"fqn": item.fqn, "kind": "opaque", "file": item.file, "tensor": item.tensor}
    value = base64.b64encode(item.value).decode("ascii") if item.type == "bytes" \
        else item.value
    return {"fqn": item.fqn, "kind": "value", "type": item.type, "value": value,
            "file": item.file, "tensor": item.tensor}


def encode(chunk_map: ChunkMap) -> bytes:
    """The bytes of ``chunks.json`` (compact ASCII JSON, items in saved order), checked as a
    reader checks them.

    Raises
    ------
    LimitExceededError, CorruptError
        The map breaks a rule of the chunk map (a writer must not write it).
    """
    raw = _raw(chunk_map)
    decode(raw)  # the writer obeys every rule the reader enforces
    return raw


def _raw(chunk_map: ChunkMap) -> bytes:
    doc = {"format": FORMAT, "version": VERSION, "save_id": chunk_map.save_id,
           "items": [_item_doc(item) for item in chunk_map.items]}
    return json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("ascii") + b"\n"


def checked(chunk_map: ChunkMap, where: str) -> ChunkMap:
    """``chunk_map`` checked by the rules of the document (K-1 ... K-10), as if read from
    ``where`` (a layout read from ``.metadata``: its errors name that file)."""
    return decode(_raw(chunk_map), where)


def write_chunk_map(directory: str, chunk_map: ChunkMap) -> None:
    """Write ``directory/chunks.json`` atomically (:func:`encode` raises first if it breaks
    a rule)."""
    write_file(os.path.join(directory, CHUNK_MAP), encode(chunk_map))


# -- reading -------------------------------------------------------------------------------

def _fail(rule: str, path: str, why: str, error: type[InshrinkError] = CorruptError
          ) -> NoReturn:
    """Raise the error of a chunk map rule of spec/FORMAT.md section 25.1.3."""
    raise error(f"[{rule}] {path}: {why}")


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _INT_MAX


def _utf8_size(text: str) -> int | None:
    """The UTF-8 size of ``text``; None if it is not Unicode text (a lone surrogate, which a
    JSON escape can give)."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def _name_problem(name: Any) -> str | None:
    if type(name) is not str or not name:
        return "must be a non-empty string"
    size = _utf8_size(name)
    if size is None or size > MAX_NAME_BYTES:
        return f"must be Unicode text of at most {MAX_NAME_BYTES} bytes of UTF-8"
    return None


def decode(raw: bytes, path: str = CHUNK_MAP) -> ChunkMap:
    """The chunk map of the bytes of a ``chunks.json``, every rule of the document checked
    (K-1 ... K-10), each failure naming its rule and ``path``.

    Raises
    ------
    LimitExceededError
        Larger than :data:`MAX_CHUNK_MAP_BYTES`, more dimensions than 32, a tensor beyond
        2^48 bytes, or a coverage check beyond its bound.
    UnsupportedVersionError
        Another version of the chunk map.
    CorruptError
        Anything else that is not a valid chunk map.
    """
    if len(raw) > MAX_CHUNK_MAP_BYTES:
        _fail("K-1", path, f"larger than {MAX_CHUNK_MAP_BYTES} bytes", LimitExceededError)
    try:
        doc = strict_json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        _fail("K-1", path, f"not a JSON chunk map ({reprlib.repr(str(exc))})")
    if type(doc) is not dict or doc.get("format") != FORMAT:
        _fail("K-2", path, f"not an object with format {FORMAT!r}")
    if type(doc.get("version")) is not int:
        _fail("K-3", path, "version must be an integer")
    if doc["version"] != VERSION:
        _fail("K-3", path, f"chunk map version {doc['version']}; this reader reads version "
                           f"{VERSION}", UnsupportedVersionError)
    if set(doc) != {"format", "version", "save_id", "items"} or type(
            doc["save_id"]) is not str or not _SAVE_ID.fullmatch(doc["save_id"]) or type(
            doc["items"]) is not list:
        _fail("K-4", path, "must have exactly the members format, version, save_id (12 "
                           "lowercase hexadecimal digits) and items (an array)")
    save_id = doc["save_id"]
    items: list[Item] = []
    fqns: set[str] = set()
    stored: set[tuple[str, str]] = set()
    for i, e in enumerate(doc["items"]):
        fqn = e.get("fqn") if type(e) is dict else None
        if (why := _name_problem(fqn)) is not None:
            _fail("K-5", path, f"item {i}: fqn {why}")
        if fqn.startswith(BYTES_PREFIX) or fqn in fqns:
            _fail("K-5", path, f"item {i}: fqn {reprlib.repr(fqn)} is reserved or not distinct")
        fqns.add(fqn)
        kind = e.get("kind")
        if kind not in _MEMBERS or set(e) != _MEMBERS[kind]:
            _fail("K-5", path, f"{fqn!r}: kind must be tensor, value or opaque, with exactly "
                               f"the members of its kind")
        where = f"{fqn!r}"
        if kind == "tensor":
            item = _tensor_item(e, path, where, save_id, stored)
        else:
            file, tensor = _place(e, path, where, save_id, stored)
            type_, value = (None, None) if kind == "opaque" else _value(e, path, where)
            item = ValueItem(fqn, kind, type_, value, file, tensor)
        items.append(item)
    return ChunkMap(save_id, tuple(items))


def _tensor_item(e: dict, path: str, where: str, save_id: str,
                 stored: set[tuple[str, str]]) -> TensorItem:
    dtype, shape = e["dtype"], e["shape"]
    if type(dtype) is not str or dtype not in BY_NAME:
        _fail("K-6", path, f"{where}: dtype {reprlib.repr(dtype)} is not a dtype of the format")
    if type(shape) is not list or not all(_is_count(d) for d in shape):
        _fail("K-6", path, f"{where}: shape must be an array of non-negative integers")
    if len(shape) > MAX_NDIM:
        _fail("K-6", path, f"{where}: more than {MAX_NDIM} dimensions", LimitExceededError)
    elements = math.prod(shape)
    if elements * BY_NAME[dtype].itemsize > MAX_TENSOR_BYTES:
        _fail("K-6", path, f"{where}: larger than 2^48 bytes", LimitExceededError)
    if type(e["chunks"]) is not list:
        _fail("K-7", path, f"{where}: chunks must be an array")
    chunks = []
    for c in e["chunks"]:
        if type(c) is not dict or set(c) != {"offsets", "sizes", "file", "tensor"}:
            _fail("K-7", path, f"{where}: a chunk must have exactly the members offsets, "
                               f"sizes, file, tensor")
        offsets, sizes = c["offsets"], c["sizes"]
        if not (type(offsets) is list and type(sizes) is list
                and len(offsets) == len(sizes) == len(shape)
                and all(_is_count(o) and _is_count(n) and o + n <= d
                        for o, n, d in zip(offsets, sizes, shape))):
            _fail("K-7", path, f"{where}: chunk at {reprlib.repr(offsets)}: offsets and sizes "
                               f"must be {len(shape)} non-negative integers within the shape "
                               f"{shape}")
        file, tensor = _place(c, path, f"{where} chunk at {offsets}", save_id, stored)
        chunks.append(Chunk(tuple(offsets), tuple(sizes), file, tensor))
    _check_cover(tuple(shape), chunks, path, where)
    return TensorItem(e["fqn"], dtype, tuple(shape), tuple(chunks))


def _place(e: dict, path: str, where: str, save_id: str,
           stored: set[tuple[str, str]]) -> tuple[str, str]:
    """A chunk's or value's ``file`` and ``tensor`` (K-8)."""
    file, tensor = e["file"], e["tensor"]
    if not is_rank_file(file) or file[10:22] != save_id:
        _fail("K-8", path, f"{where}: file {reprlib.repr(file)} is not a rank file name of "
                           f"save {save_id}")
    if (why := _name_problem(tensor)) is not None:
        _fail("K-8", path, f"{where}: tensor {why}")
    if (file, tensor) in stored:
        _fail("K-8", path, f"{where}: {file} {tensor!r} holds another chunk too")
    stored.add((file, tensor))
    return file, tensor


def _check_cover(shape: tuple[int, ...], chunks: list[Chunk], path: str, where: str) -> None:
    """The chunks are disjoint and cover the tensor (K-9): the edges of the chunks cut the
    tensor into a grid of cells, and each cell must lie in exactly one chunk."""
    if math.prod(shape) == 0:
        return  # nothing to cover; the chunks lie within the shape (K-7)
    solid = [c for c in chunks if math.prod(c.sizes) > 0]
    if sum(math.prod(c.sizes) for c in solid) != math.prod(shape):
        _fail("K-9", path, f"{where}: its chunks hold {sum(math.prod(c.sizes) for c in solid)} "
                           f"elements, not the {math.prod(shape)} of its shape {list(shape)} "
                           f"(they overlap or leave a gap)")
    edges = [sorted({0, d} | {c.offsets[k] for c in solid}
                    | {c.offsets[k] + c.sizes[k] for c in solid})
             for k, d in enumerate(shape)]
    cells = math.prod(len(e) - 1 for e in edges)
    if cells > max(MAX_GRID_CELLS, 64 * len(solid)):
        _fail("K-9", path, f"{where}: {len(solid)} chunks cut it into {cells} cells, more than "
                           f"a reader checks", LimitExceededError)
    grid = np.zeros([len(e) - 1 for e in edges], np.uint8)
    for c in solid:
        box = tuple(slice(bisect.bisect_left(e, o), bisect.bisect_left(e, o + n))
                    for e, o, n in zip(edges, c.offsets, c.sizes))
        if grid[box].any():
            _fail("K-9", path, f"{where}: the chunk at {list(c.offsets)} overlaps another")
        grid[box] = 1
    # the chunks' elements add up to the tensor's and none overlaps: they cover it


def _value(e: dict, path: str, where: str) -> tuple[str, Any]:
    """A plain value's type and value (K-10); bytes decoded."""
    type_, value = e["type"], e["value"]
    ok = False
    if type_ == "int":
        ok = type(value) is int and _INT_MIN <= value <= _INT_MAX
    elif type_ == "float":
        ok = type(value) is float and math.isfinite(value)
    elif type_ == "bool":
        ok = type(value) is bool
    elif type_ == "none":
        ok = value is None
    elif type_ == "str":
        ok = type(value) is str and (_utf8_size(value) or 0) <= MAX_VALUE_BYTES and (
            _utf8_size(value) is not None)
    elif type_ == "bytes" and type(value) is str and _BASE64.fullmatch(value) and len(
            value) % 4 == 0 and len(value) <= 4 * (MAX_VALUE_BYTES // 3 + 1):
        try:
            data = base64.b64decode(value, validate=True)
        except binascii.Error:
            data = None
        if data is not None and len(data) <= MAX_VALUE_BYTES and base64.b64encode(
                data).decode("ascii") == value:
            return type_, data
    if not ok:
        _fail("K-10", path, f"{where}: type must be one of {', '.join(VALUE_TYPES)} and value "
                            f"a JSON value of that type within its limits")
    return type_, value


def read_chunk_map(path: str | os.PathLike, *, check_files: bool = True) -> ChunkMap:
    """Read and check the chunk map of a committed checkpoint directory.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory.
    check_files : bool
        Also check that every rank file it names is there and is of its save and rank (K-12;
        a series' older step holds them as deltas under other names: False).

    Returns
    -------
    ChunkMap

    Raises
    ------
    CorruptError
        No chunk map, or one that breaks a rule (see :func:`decode`); a rank file missing or
        of another save.
    IncompleteCheckpointError
        No ``.metadata``, or one of another save: the save that wrote the map did not commit
        (K-11).
    """
    path = _checked_directory(path)
    map_path = os.path.join(path, CHUNK_MAP)
    try:
        with open(map_path, "rb") as f:
            raw = f.read(MAX_CHUNK_MAP_BYTES + 1)
    except FileNotFoundError:
        raise CorruptError(f"[K-1] {map_path}: no chunk map (a checkpoint saved before chunk "
                           f"maps, or not by InkStorageWriter: read its {METADATA})") from None
    except OSError as exc:
        raise CorruptError(f"[K-1] {map_path}: cannot read: {exc.strerror or exc}") from None
    chunk_map = decode(raw, map_path)
    _check_committed(path, chunk_map)
    if check_files:
        for name in chunk_map.files:
            _check_rank_file(path, name, chunk_map)
    return chunk_map


def find_chunk_map(path: str | os.PathLike, *, check_files: bool = True) -> ChunkMap | None:
    """:func:`read_chunk_map`, or None where the committed checkpoint has no chunk map: no
    ``chunks.json``, or one of a save that did not commit beside the ``.metadata`` of an
    earlier one (the caller then reads ``.metadata``).

    Raises
    ------
    IncompleteCheckpointError
        No ``.metadata`` at all: no save committed.
    CorruptError
        A chunk map that breaks a rule (K-1 ... K-10), or a rank file it names missing.
    """
    path = _checked_directory(path)
    if not os.path.isfile(os.path.join(path, CHUNK_MAP)):
        return None
    try:
        return read_chunk_map(path, check_files=check_files)
    except IncompleteCheckpointError:
        if os.path.isfile(os.path.join(path, METADATA)):
            return None  # the map of a later save that never committed
        raise


def _checked_directory(path: Any) -> str:
    path = checked_path(path)
    if not os.path.isdir(path):
        raise CorruptError(f"[K-1] {path}: not a DCP checkpoint directory")
    return path


def _check_committed(path: str, chunk_map: ChunkMap) -> None:
    """The map is of the committed save (K-11): ``.metadata`` is there and holds its save id
    (the writer writes the map, then ``.metadata``: a crash between leaves a new map beside
    the commit marker of the previous save)."""
    marker = os.path.join(path, METADATA)
    try:
        with open(marker, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise IncompleteCheckpointError(
            f"[K-11] {marker} is missing: the save {chunk_map.save_id} into {path} did not "
            f"finish (the checkpoint was never committed)") from None
    except OSError as exc:
        raise CorruptError(f"[K-11] {marker}: cannot read: {exc.strerror or exc}") from None
    if chunk_map.save_id.encode("ascii") not in raw:
        _fail("K-11", os.path.join(path, CHUNK_MAP), f"the map of save {chunk_map.save_id}, "
                                                     f"which {METADATA} does not name: that "
                                                     f"save did not commit",
              IncompleteCheckpointError)


def _check_rank_file(path: str, name: str, chunk_map: ChunkMap) -> dict[str, str]:
    """A rank file the map names is there and of its save and rank (K-12); its metadata."""
    full = os.path.join(path, name)
    if not os.path.isfile(full):
        _fail("K-12", full, f"missing (named by {os.path.join(path, CHUNK_MAP)})")
    with File(full, threads=1) as f:
        metadata = f.metadata
    # the name's save id is the map's (K-8): the file must say what
    # its name says
    problem = identity_problem(name, metadata)
    if problem is not None:
        _fail("K-12", full, problem)
    return metadata


# -- assembling ----------------------------------------------------------------------------

class MapFiles:
    """The stored tensors of a checkpoint, read from its rank files (each opened once; a
    series reads a step's through a subclass that knows where they are now)."""

    def __init__(self, path: str, threads: int | None = None) -> None:
        self.path, self.threads = path, threads
        self.files: dict[str, File] = {}

    def file_of(self, file: str) -> str:
        """The path of the file holding the rank file ``file`` (for messages)."""
        return os.path.join(self.path, file)

    def read(self, file: str, tensor: str) -> np.ndarray:
        """The stored tensor ``tensor`` of the rank file ``file`` (K-12, K-13: both are
        there)."""
        full = self.file_of(file)
        if file not in self.files:
            if not os.path.isfile(full):
                _fail("K-12", full, f"missing (named by {os.path.join(self.path, CHUNK_MAP)})")
            self.files[file] = named(full, lambda: File(full, threads=self.threads))
        f = self.files[file]
        if tensor not in f:
            _fail("K-13", full, f"no tensor named {tensor!r}, which the checkpoint names")
        return named(full, lambda: f.read(tensor))

    def close(self) -> None:
        """Close the files read so far."""
        for f in self.files.values():
            f.close()
        self.files.clear()

    def __enter__(self) -> "MapFiles":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def stored_bytes(source: MapFiles, item: ValueItem) -> np.ndarray:
    """The ``torch.save`` bytes of a non-tensor item, as the uint8 tensor stored (K-13)."""
    array = source.read(item.file, item.tensor)
    if array.dtype != np.uint8 or array.ndim != 1:
        _fail("K-13", source.file_of(item.file), f"{item.tensor!r} is {array.dtype}"
                                                 f"{list(array.shape)}, not the bytes of "
                                                 f"{item.fqn!r}")
    return array


def joined(source: MapFiles, item: TensorItem) -> np.ndarray:
    """One whole tensor from its chunks, each checked to be stored with the map's dtype and
    its sizes (K-13)."""
    whole = np.empty(item.shape, BY_NAME[item.dtype].numpy)
    for chunk in item.chunks:
        part = source.read(chunk.file, chunk.tensor)
        if part.dtype != whole.dtype or part.shape != chunk.sizes:
            _fail("K-13", source.file_of(chunk.file), f"{chunk.tensor!r} is {part.dtype}"
                                                      f"{list(part.shape)}, the chunk map says "
                                                      f"{item.dtype}{list(chunk.sizes)}")
        whole[tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.sizes))] = part
    return whole


def iter_assembled(path: str | os.PathLike, *, threads: int | None = None
                   ) -> Iterator[tuple[str, np.ndarray]]:
    """Each whole tensor of a committed checkpoint, one at a time, in saved order: (FQN,
    array), joined from its chunks in the rank files (without torch).

    Raises
    ------
    CorruptError, IncompleteCheckpointError
        As :func:`read_chunk_map`; a chunk that is not what the map says (K-13).
    """
    chunk_map = read_chunk_map(path)
    with MapFiles(os.fspath(path), threads) as source:
        for item in chunk_map.items:
            if isinstance(item, TensorItem):
                yield item.fqn, joined(source, item)


def assemble(path: str | os.PathLike, *, threads: int | None = None) -> dict[str, np.ndarray]:
    """Every whole tensor of a committed checkpoint, by FQN (see :func:`iter_assembled`)."""
    return dict(iter_assembled(path, threads=threads))


def values(path: str | os.PathLike) -> dict[str, Any]:
    """The plain non-tensor values of a committed checkpoint, by FQN (opaque ones left out:
    their ``torch.save`` bytes are in the rank files)."""
    return {i.fqn: i.value for i in read_chunk_map(path).items
            if isinstance(i, ValueItem) and i.kind == "value"}
