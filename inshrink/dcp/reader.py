"""Loading sharded checkpoints that :class:`~inshrink.dcp.writer.InkStorageWriter` saved:
:class:`InkStorageReader` plugs into ``dcp.load`` and decodes each rank file's wanted tensors
in batches of bounded size.

>>> import torch.distributed.checkpoint as dcp                       # doctest: +SKIP
>>> dcp.load(state, storage_reader=InkStorageReader("ckpt/step_100"))  # doctest: +SKIP
"""
from __future__ import annotations

import io
import os
import uuid
from typing import Any, Iterator

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import (Metadata, MetadataIndex, StorageMeta,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ..errors import CorruptError, IncompleteCheckpointError, InshrinkError, InvalidArgumentError
from ..io.arguments import resolve_threads
from ..io.file import File
from ..torch.convert import to_torch
from .calls import checked_path, done, named
from .inspect import describe
from .metadata import check_metadata, read_metadata
from .names import METADATA, identity_problem

__all__ = ["InkStorageReader", "READ_BATCH_BYTES"]


def _refuse_incomplete(path: str) -> None:
    """Raise IncompleteCheckpointError for a checkpoint that cannot be loaded whole: rank
    files without the ``.metadata`` written last, or a rank file the metadata names missing.

    Checked when the reader is made (and by ``reset(checkpoint_id)``, which ``dcp.load``
    calls before anything else): ``dcp.load`` calls :meth:`InkStorageReader.read_metadata`
    inside its planning step, which catches every exception and raises an AssertionError
    with the message only (wrapped in a CheckpointException with each rank's traceback).
    Any other problem (no checkpoint here yet, damaged metadata) is left to
    :meth:`~InkStorageReader.read_metadata`: a reader may be made before the directory is."""
    if not os.path.isdir(path):
        return
    try:
        read_metadata(path)
    except IncompleteCheckpointError:
        raise
    except InshrinkError:
        pass


class InkStorageReader(StorageReader):
    """A DCP storage reader for checkpoints written by :class:`InkStorageWriter`.

    Any number of ranks can load a checkpoint saved by any number: DCP's planner maps the
    saved chunks onto the loading ranks' shards, and each rank decodes only the stored
    tensors its shards overlap (each once).

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory.
    threads : int, optional
        Decoder threads per rank (default: every core).

    Raises
    ------
    IncompleteCheckpointError
        ``path`` holds rank files but no ``.metadata`` (a save that did not finish), or a
        rank file its metadata names is missing; raised here and by ``reset``, before
        ``dcp.load`` plans (whose planning step would turn it into an AssertionError).

    Examples
    --------
    >>> import torch.distributed.checkpoint as dcp                           # doctest: +SKIP
    >>> dcp.load(state, storage_reader=InkStorageReader("ckpt/step_100"))   # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
        super().__init__()
        self.path = checked_path(path)
        self.threads = resolve_threads(threads)
        self.metadata: Metadata | None = None
        self._refuse_incomplete()

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = checked_path(checkpoint_id)
            self._refuse_incomplete()
        self.metadata = None

    def _refuse_incomplete(self) -> None:
        """:func:`_refuse_incomplete` of the path (a series' reader checks its step against
        the series' manifest instead)."""
        _refuse_incomplete(self.path)

    def read_metadata(self, *args: Any) -> Metadata:
        metadata = read_metadata(self.path)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = uuid.uuid4().hex
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        check_metadata(metadata, os.path.join(self.path, METADATA))
        self.metadata = metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if self.metadata is None:
            raise InvalidArgumentError("read_data before set_up_storage_reader")
        storage = self.metadata.storage_data
        grouped: dict[str, dict[str, list[ReadItem]]] = {}
        for item in plan.items:
            entry = storage.get(item.storage_index)
            if entry is None:
                raise CorruptError(f"{os.path.join(self.path, METADATA)}: no storage "
                                   f"entry for {item.storage_index.fqn!r}")
            grouped.setdefault(entry["file"], {}).setdefault(entry["tensor"], []).append(item)
        for file_name, tensors in grouped.items():
            self._read_file(file_name, tensors, planner)
        return done(None)

    def _read_file(self, file_name: str, tensors: dict[str, list[ReadItem]],
                   planner: LoadPlanner) -> None:
        """Decode the wanted tensors of one rank file and hand them to their read items."""
        path = os.path.join(self.path, file_name)
        with named(path, lambda: File(path, threads=self.threads)) as f:
            problem = identity_problem(file_name, f.metadata)
            if problem is not None:  # spec section 25.1.1: a file of another rank or save
                raise CorruptError(f"{path}: {problem}")
            for batch in _batches(path, f, list(tensors)):
                # the tensors of a batch share the decoder threads
                arrays = named(path, lambda: f.load(names=batch))
                for tensor_name in batch:
                    self._serve(path, tensor_name, arrays.pop(tensor_name),
                                tensors[tensor_name], planner)

    def _serve(self, path: str, tensor_name: str, array: np.ndarray, items: list[ReadItem],
               planner: LoadPlanner) -> None:
        """Hand one decoded stored tensor to every read item that wants part of it."""
        for item in items:
            if item.type == LoadItemType.BYTE_IO:
                if array.dtype != np.uint8 or array.ndim != 1:
                    raise CorruptError(f"{path}: {tensor_name!r} is {array.dtype}"
                                       f"{list(array.shape)}, not the bytes of "
                                       f"{item.storage_index.fqn!r}")
                planner.load_bytes(item, io.BytesIO(array.tobytes()))
                continue
            stored = to_torch(array)
            self._check_chunk(path, tensor_name, stored, item.storage_index)
            source = _narrow(stored, item.storage_offsets, item.lengths)
            target = planner.resolve_tensor(item).detach()
            if target.size() != source.size():
                raise CorruptError(f"{path}: {tensor_name!r} gives {list(source.shape)} for a "
                                   f"destination of {list(target.shape)}")
            target.copy_(source)
            planner.commit_tensor(item, target)

    def _check_chunk(self, path: str, tensor_name: str, stored: torch.Tensor,
                     index: MetadataIndex) -> None:
        """The stored tensor is the chunk the metadata describes: dtype and sizes."""
        item = self.metadata.state_dict_metadata.get(index.fqn)
        if not isinstance(item, TensorStorageMetadata):
            raise CorruptError(f"{path}: {tensor_name!r} is a tensor, the metadata says "
                               f"{index.fqn!r} is not")
        sizes = next((c.sizes for c in item.chunks if c.offsets == index.offset), None)
        if sizes is None or tuple(sizes) != tuple(stored.shape) or (
                item.properties.dtype != stored.dtype):
            raise CorruptError(f"{path}: {tensor_name!r} is {stored.dtype}{list(stored.shape)}, "
                               f"the metadata says {item.properties.dtype}"
                               f"{list(sizes) if sizes is not None else '(no such chunk)'}")

    def report(self) -> list[dict]:
        """Per stored chunk: what :func:`describe` returns."""
        return describe(self.path)

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike)) and os.path.isfile(
            os.path.join(os.fspath(checkpoint_id), METADATA))


READ_BATCH_BYTES = 256 << 20
"""Decoded bytes a reader holds at once beyond the destination tensors (one larger tensor
is read alone)."""


def _batches(path: str, f: File, names: list[str]) -> Iterator[list[str]]:
    """``names`` in runs of at most :data:`READ_BATCH_BYTES` decoded bytes."""
    batch, size = [], 0
    for name in names:
        nbytes = named(path, lambda: f.info(name)).nbytes
        if batch and size + nbytes > READ_BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(name)
        size += nbytes
    if batch:
        yield batch


def _narrow(tensor: torch.Tensor, offsets: torch.Size, lengths: torch.Size) -> torch.Tensor:
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        tensor = tensor.narrow(dim, offset, length)
    return tensor
