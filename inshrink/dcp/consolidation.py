"""Joining a committed checkpoint's shards into one unsharded .ink or .safetensors file
(:func:`consolidate`), its chunks read from the rank files (:class:`RankFiles`) or, for a
series' step, from whatever holds them now."""
from __future__ import annotations

import os
import uuid
from typing import Any

import numpy as np
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, Metadata, MetadataIndex,
                                                   TensorStorageMetadata)

from ..errors import CorruptError, InvalidArgumentError
from ..encode.policy import Policy
from ..io.file import File
from ..io.info import TensorInfo
from ..io.writer import Writer
from .calls import checked_path, named
from .metadata import BYTES_PREFIX, read_metadata
from .names import METADATA

__all__ = ["consolidate", "checked_output", "consolidate_to", "RankFiles"]

def consolidate(path: str | os.PathLike, out: str | os.PathLike, *,
                policy: Policy | str | None = None,
                threads: int | None = None) -> list[TensorInfo]:
    """Join a checkpoint's shards into one unsharded file, written atomically.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory.
    out : str or os.PathLike
        An ``.ink`` file, or a ``.safetensors`` file. Each tensor is named by its
        fully-qualified name (``model.layers.0.weight``, ``optim.state.<param>.exp_avg``)
        and has its whole shape. In an ``.ink`` file, non-tensor items are kept as uint8
        tensors named ``__dcp_bytes__.<fqn>`` (``torch.save`` bytes, as DCP stores them);
        a ``.safetensors`` file holds the tensors only.
    policy : Policy, str or None
        Compression of the ``.ink`` file (default lossless). A lossy checkpoint's tensors
        are joined as they decode.
    threads : int, optional
        Encoder and decoder threads (default: every core).

    Returns
    -------
    list of TensorInfo
        What the output's index says about each tensor.
    """
    out = checked_output(out, policy)
    metadata = read_metadata(path)
    return consolidate_to(out, os.fspath(path), metadata,
                          RankFiles(os.fspath(path), metadata, threads), policy, threads)


def checked_output(out: Any, policy: Policy | str | None) -> str:
    """The output path of :func:`consolidate`, checked: an ``.ink`` file, or a
    ``.safetensors`` one without a policy.

    Raises
    ------
    InvalidArgumentError
        Another kind of path, or a policy for a ``.safetensors`` file.
    """
    out = checked_path(out)
    if out.endswith(".safetensors"):
        if policy is not None:
            raise InvalidArgumentError("a .safetensors file is lossless: no policy")
    elif not out.endswith(".ink"):
        raise InvalidArgumentError(f"{out}: the output must be an .ink or .safetensors file")
    return out


def consolidate_to(out: str, path: str, metadata: Metadata, source: RankFiles,
                   policy: Policy | str | None, threads: int | None) -> list[TensorInfo]:
    """:func:`consolidate` of a checkpoint's metadata into a checked ``out``, its chunks
    read from ``source`` (closed afterwards)."""
    try:
        if out.endswith(".safetensors"):
            return _consolidate_safetensors(path, out, metadata, source, threads)
        return _consolidate(path, out, metadata, source, policy, threads, keep_bytes=True)
    finally:
        source.close()


class RankFiles:
    """The chunks of a committed checkpoint, read from its rank files (each opened once; a
    series reads a step's chunks through a subclass that knows where they are now)."""

    def __init__(self, path: str, metadata: Metadata, threads: int | None) -> None:
        self.path, self.metadata, self.threads = path, metadata, threads
        self.files: dict[str, File] = {}

    def file_of(self, index: MetadataIndex) -> str:
        """The path of the file holding a chunk (for messages)."""
        return os.path.join(self.path, self.metadata.storage_data[index]["file"])

    def read(self, index: MetadataIndex) -> np.ndarray:
        """One chunk as stored (a non-tensor item as its uint8 bytes)."""
        entry = self.metadata.storage_data[index]
        file_path = os.path.join(self.path, entry["file"])
        if entry["file"] not in self.files:
            self.files[entry["file"]] = named(file_path,
                                              lambda: File(file_path, threads=self.threads))
        return named(file_path, lambda: self.files[entry["file"]].read(entry["tensor"]))

    def close(self) -> None:
        """Close the files read so far."""
        for f in self.files.values():
            f.close()
        self.files.clear()


def _consolidate(path: str, out: str, metadata: Metadata, source: RankFiles,
                 policy: Policy | str | None, threads: int | None,
                 keep_bytes: bool) -> list[TensorInfo]:
    with Writer(out, {"dcp.consolidated_from": os.path.basename(os.path.abspath(path))},
                threads=threads, policy=policy) as writer:
        for fqn, item in metadata.state_dict_metadata.items():
            if isinstance(item, BytesStorageMetadata):
                if keep_bytes:
                    writer.add(BYTES_PREFIX + fqn, source.read(MetadataIndex(fqn)))
                continue
            writer.add(fqn, _joined(source, metadata, fqn, item))
        return writer.close()


def _joined(source: RankFiles, metadata: Metadata, fqn: str,
            item: TensorStorageMetadata) -> np.ndarray:
    """One whole tensor from its chunks (which DCP never lets overlap)."""
    size = tuple(int(d) for d in item.size)
    whole = None
    covered = 0
    for chunk in item.chunks:
        index = MetadataIndex(fqn, chunk.offsets)
        part = source.read(index)
        where = tuple(slice(int(o), int(o) + int(n)) for o, n in zip(chunk.offsets, chunk.sizes))
        if whole is None:
            whole = np.empty(size, part.dtype)
        if part.dtype != whole.dtype or len(where) != len(size) or any(
                s.stop > d for s, d in zip(where, size)) or part.shape != tuple(
                int(n) for n in chunk.sizes):
            raise CorruptError(f"{source.file_of(index)}: "
                               f"chunk of {fqn!r} at {list(chunk.offsets)} does not fit "
                               f"{whole.dtype}{list(size)}")
        whole[where] = part
        covered += part.size
    if whole is None or covered != whole.size:
        raise CorruptError(f"{os.path.join(source.path, METADATA)}: the chunks of {fqn!r} do "
                           f"not cover its {list(size)} elements")
    return whole


def _consolidate_safetensors(path: str, out: str, metadata: Metadata, source: RankFiles,
                             threads: int | None) -> list[TensorInfo]:
    from ..safetensors import decompress_to_safetensors
    directory = os.path.dirname(os.path.abspath(out))
    staging = os.path.join(directory, f".{os.path.basename(out)}.{uuid.uuid4().hex[:8]}.ink")
    try:
        _consolidate(path, staging, metadata, source, None, threads, keep_bytes=False)
        return decompress_to_safetensors(staging, out, threads=threads)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
