"""Joining a committed checkpoint's shards into one unsharded .ink or .safetensors file
(:func:`consolidate`), its layout read from the chunk map (without torch) or, for a checkpoint
saved before chunk maps, from ``.metadata`` (with torch); its chunks read from the rank files
(:class:`~inshrink.dcp.chunkmap.MapFiles`) or, for a series' step, from whatever holds them
now. Imports torch only for a checkpoint without a chunk map."""
from __future__ import annotations

import os
import uuid
from typing import Any

from ..errors import InvalidArgumentError
from ..encode.policy import Policy
from ..io.info import TensorInfo
from ..io.writer import Writer
from .calls import checked_path
from .chunkmap import (ChunkMap, MapFiles, TensorItem, checked, find_chunk_map, joined,
                       stored_bytes)
from .names import BYTES_PREFIX, METADATA

__all__ = ["consolidate", "checked_output", "consolidate_to", "layout_of"]

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
    chunk_map = layout_of(path)
    return consolidate_to(out, os.fspath(path), chunk_map, MapFiles(os.fspath(path), threads),
                          policy, threads)


def layout_of(path: str | os.PathLike) -> ChunkMap:
    """A committed checkpoint's layout: its chunk map, read without torch; for a checkpoint
    without one (saved before chunk maps), its ``.metadata``, read with torch.

    Raises
    ------
    InvalidArgumentError
        No chunk map, and torch cannot be imported to read ``.metadata``.
    IncompleteCheckpointError, CorruptError
        As :func:`inshrink.dcp.chunkmap.read_chunk_map` or
        :func:`inshrink.dcp.read_metadata`.
    """
    chunk_map = find_chunk_map(path)
    if chunk_map is not None:
        return chunk_map
    try:
        from .metadata import chunk_map_of, read_metadata
    except ImportError as exc:
        raise InvalidArgumentError(
            f"{os.fspath(path)}: no chunk map (chunks.json) of the committed checkpoint; "
            f"reading its {METADATA} needs torch, which cannot be imported ({exc})") from None
    return checked(chunk_map_of(read_metadata(path)), os.path.join(os.fspath(path), METADATA))


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


def consolidate_to(out: str, path: str, chunk_map: ChunkMap, source: MapFiles,
                   policy: Policy | str | None, threads: int | None) -> list[TensorInfo]:
    """:func:`consolidate` of a checkpoint's layout into a checked ``out``, its chunks read
    from ``source`` (closed afterwards)."""
    try:
        if out.endswith(".safetensors"):
            return _consolidate_safetensors(path, out, chunk_map, source, threads)
        return _consolidate(path, out, chunk_map, source, policy, threads, keep_bytes=True)
    finally:
        source.close()


def _consolidate(path: str, out: str, chunk_map: ChunkMap, source: MapFiles,
                 policy: Policy | str | None, threads: int | None,
                 keep_bytes: bool) -> list[TensorInfo]:
    with Writer(out, {"dcp.consolidated_from": os.path.basename(os.path.abspath(path))},
                threads=threads, policy=policy) as writer:
        for item in chunk_map.items:
            if isinstance(item, TensorItem):
                writer.add(item.fqn, joined(source, item))
            elif keep_bytes:
                writer.add(BYTES_PREFIX + item.fqn, stored_bytes(source, item))
        return writer.close()


def _consolidate_safetensors(path: str, out: str, chunk_map: ChunkMap, source: MapFiles,
                             threads: int | None) -> list[TensorInfo]:
    from ..safetensors import decompress_to_safetensors
    directory = os.path.dirname(os.path.abspath(out))
    staging = os.path.join(directory, f".{os.path.basename(out)}.{uuid.uuid4().hex[:8]}.ink")
    try:
        _consolidate(path, staging, chunk_map, source, None, threads, keep_bytes=False)
        return decompress_to_safetensors(staging, out, threads=threads)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
