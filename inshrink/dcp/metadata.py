"""A checkpoint directory's committed metadata: DCP's pickled ``.metadata``
read without running code (a restricted unpickler), and checked to be what
:class:`~inshrink.dcp.writer.InkStorageWriter` writes."""
from __future__ import annotations

import dataclasses
import enum
import io
import os
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, Metadata, MetadataIndex,
                                                   TensorStorageMetadata)

from ..errors import CorruptError, IncompleteCheckpointError
from ..torch.convert import dtype_name
from .calls import checked_path
from .chunkmap import Chunk, ChunkMap, TensorItem, ValueItem
from .names import (BYTES_PREFIX, METADATA, delta_name, is_rank_file, is_rank_temporary,
                    weights_delta_name, weights_name)

__all__ = ["METADATA_FILE", "BYTES_PREFIX", "read_metadata", "read_metadata_file",
           "check_metadata", "chunk_map_of"]

METADATA_FILE = METADATA
"""The commit marker, :data:`inshrink.dcp.names.METADATA`, under its public name."""


_DCP_DATA_MODULES = ("torch.distributed.checkpoint.metadata",
                     "torch.distributed.checkpoint.filesystem")
"""Where the classes in DCP's metadata live (FileSystemWriter's storage entries included, so
that its checkpoints are named as such)."""


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's metadata classes and torch's dtypes and sizes, nothing else: a
    checkpoint directory is data, and must not run code when opened."""

    def find_class(self, module: str, name: str) -> Any:
        if module in _DCP_DATA_MODULES:  # data classes only: DCP's functions write files
            value = super().find_class(module, name)
            if isinstance(value, type) and (dataclasses.is_dataclass(value)
                                            or issubclass(value, enum.Enum)):
                return value
        if (module == "builtins" and name in ("set", "frozenset", "slice", "complex")) or (
                module == "collections" and name == "OrderedDict") or (
                module == "torch.serialization" and name == "_get_layout") or (
                module == "pathlib" and name in ("Path", "PosixPath", "WindowsPath",
                                                 "PurePosixPath", "PureWindowsPath")):
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if name == "Size" or isinstance(value, (torch.dtype, torch.layout,
                                                    torch.memory_format)):
                return value
        raise CorruptError(f"refusing to load {module}.{name}: not part of DCP's metadata")


def read_metadata(path: str | os.PathLike) -> Metadata:
    """Read and check the global metadata of a committed inshrink DCP checkpoint.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory.

    Returns
    -------
    Metadata
        DCP's metadata; ``storage_data`` maps each chunk's ``MetadataIndex`` to
        ``{"file", "tensor"}``.

    Raises
    ------
    IncompleteCheckpointError
        The directory holds rank files but no ``.metadata``: a save that did not finish.
    CorruptError
        Not a DCP checkpoint written by :class:`InkStorageWriter` or unreadable metadata; a
        rank file the metadata names is missing: IncompleteCheckpointError (a CorruptError).
    """
    metadata = read_metadata_file(path)
    marker = os.path.join(os.fspath(path), METADATA)
    for name in sorted({entry["file"] for entry in metadata.storage_data.values()}):
        if not os.path.isfile(os.path.join(path, name)):
            for stored, what in ((delta_name(name), "delta"),
                                 (weights_name(name), "model-only file"),
                                 (weights_delta_name(name), "model-only delta")):
                if name.endswith(".ink") and os.path.isfile(os.path.join(path, stored)):
                    # a series' older step
                    raise CorruptError(f"{os.path.join(path, name)}: missing (named by "
                                       f"{marker}); {stored} is its {what} in a series: read "
                                       f"the step through inshrink.dcp.InkSeries")
            raise IncompleteCheckpointError(f"{os.path.join(path, name)}: missing (named by "
                                            f"{marker}): the checkpoint is incomplete")
    return metadata


def read_metadata_file(path: str | os.PathLike) -> Metadata:
    """:func:`read_metadata` without checking that the rank files exist (a series keeps an
    older step's files as deltas under other names).

    Raises
    ------
    IncompleteCheckpointError, CorruptError
        As :func:`read_metadata`, but for the rank files.
    """
    path = checked_path(path)
    marker = os.path.join(path, METADATA)
    if not os.path.isdir(path):
        raise CorruptError(f"{path}: not a DCP checkpoint directory")
    try:
        with open(marker, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        if any(is_rank_file(n) or is_rank_temporary(n) for n in os.listdir(path)):
            raise IncompleteCheckpointError(f"{marker} is missing: the save into {path} did "
                                            f"not finish (the checkpoint was never "
                                            f"committed)") from None
        raise CorruptError(f"{path}: not a DCP checkpoint ({METADATA} is missing)") from None
    except OSError as exc:
        raise CorruptError(f"{marker}: cannot read: {exc.strerror or exc}") from None
    try:
        metadata = _MetadataUnpickler(io.BytesIO(raw)).load()
    except CorruptError as exc:
        raise CorruptError(f"{marker}: {exc}") from None
    except Exception as exc:  # pickle reports bad data with many exception types
        raise CorruptError(f"{marker}: not DCP metadata ({type(exc).__name__}: {exc})") from None
    check_metadata(metadata, marker)
    return metadata


def check_metadata(metadata: Any, marker: str) -> None:
    """The metadata's shape: a DCP Metadata whose storage data every chunk has, in ours.

    Raises
    ------
    CorruptError
        Naming ``marker`` (the ``.metadata`` file the metadata came from).
    """
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise CorruptError(f"{marker}: not DCP metadata")
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise CorruptError(f"{marker}: no storage data (not written by InkStorageWriter)")
    for index, entry in storage.items():
        if not (isinstance(index, MetadataIndex) and isinstance(entry, dict)
                and is_rank_file(entry.get("file"))
                and isinstance(entry.get("tensor"), str)):
            raise CorruptError(f"{marker}: storage data {index!r} is not an inshrink rank "
                               f"file entry (not written by InkStorageWriter)")
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            indices = [MetadataIndex(fqn, chunk.offsets) for chunk in item.chunks]
        elif isinstance(item, BytesStorageMetadata):
            indices = [MetadataIndex(fqn)]
        else:
            raise CorruptError(f"{marker}: {fqn!r} has storage type {type(item).__name__}")
        for index in indices:
            if index not in storage:
                raise CorruptError(f"{marker}: {fqn!r} chunk at {list(index.offset or ())} "
                                   f"has no storage entry")


def chunk_map_of(metadata: Metadata, save_id: str | None = None) -> ChunkMap:
    """The layout that checked DCP metadata describes, as a chunk map (what the writer writes
    beside it, and what consolidation reads either way). A storage entry's ``value``, where
    the writer put one (never in a ``.metadata``), is the typed value of a non-tensor item:
    ``(type, value)`` of :func:`inshrink.dcp.chunkmap.plain_value`, or None for an opaque one.

    ``save_id``: the save's id (default: the id in the rank file names, else in the metadata's
    storage meta).
    """
    storage = metadata.storage_data
    if save_id is None:
        named = sorted({entry["file"][10:22] for entry in storage.values()})
        meta = metadata.storage_meta
        save_id = named[0] if named else str(getattr(meta, "save_id", None) or "")
        if len(save_id) != 12:  # no rank file, and no id of ours: no name needs it
            save_id = "0" * 12
    items = []
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            chunks = []
            for chunk in item.chunks:
                entry = storage[MetadataIndex(fqn, chunk.offsets)]
                chunks.append(Chunk(tuple(int(d) for d in chunk.offsets),
                                    tuple(int(d) for d in chunk.sizes),
                                    entry["file"], entry["tensor"]))
            items.append(TensorItem(fqn, dtype_name(item.properties.dtype, fqn),
                                    tuple(int(d) for d in item.size), tuple(chunks)))
        else:
            entry = storage[MetadataIndex(fqn)]
            typed = entry.get("value")
            if typed is None:
                items.append(ValueItem(fqn, "opaque", None, None, entry["file"],
                                       entry["tensor"]))
            else:
                kind, value = typed
                items.append(ValueItem(fqn, "value", kind, value, entry["file"],
                                       entry["tensor"]))
    return ChunkMap(save_id, tuple(items))
