"""Sharded checkpoints for ``torch.distributed.checkpoint`` (DCP), stored as .ink files.

:class:`InkStorageWriter` and :class:`InkStorageReader` plug into ``dcp.save``,
``dcp.async_save`` and ``dcp.load``. Every rank encodes the chunks it owns into its own .ink
file; the coordinator then commits the checkpoint by writing DCP's global metadata to
``.metadata``, atomically and last. A directory without that file is an unfinished save and
is refused with :class:`inshrink.errors.IncompleteCheckpointError`.

Layout of a checkpoint directory::

    .metadata                        DCP's Metadata (pickled, as DCP's FileSystemWriter does);
                                     its storage_data maps every chunk to {"file", "tensor"}
    rank00000-<save id>.ink          rank 0's chunks, one tensor each, named by their
    rank00001-<save id>.ink          fully-qualified name; non-tensor items (step counters,
    ...                              RNG and scheduler state) as uint8 tensors named
                                     ``__dcp_bytes__.<fqn>``

File names carry an id unique to each save, so saving again into the same directory keeps the
previous checkpoint readable until the new ``.metadata`` replaces it; the files the new
checkpoint no longer uses are then removed.

This module imports torch; ``import inshrink`` does not import it.

>>> import torch.distributed.checkpoint as dcp                       # doctest: +SKIP
>>> dcp.save(state, storage_writer=InkStorageWriter("ckpt/step_100"))  # doctest: +SKIP
>>> dcp.load(state, storage_reader=InkStorageReader("ckpt/step_100"))  # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import enum
import io
import os
import pickle
import re
import uuid
from typing import Any, Callable, Iterator, Mapping, TypeVar

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, Metadata, MetadataIndex,
                                                   StorageMeta, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, ReadItem,
                                                  SavePlan, SavePlanner, WriteItem,
                                                  WriteItemType)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from .. import dtypes
from ..atomic import AtomicFile
from ..errors import CorruptError, IncompleteCheckpointError, InshrinkError, InvalidArgumentError
from ..encode.policy import Policy
from ..encode.policy import resolve as resolve_policy
from ..io.tensorfile import File, TensorInfo, Writer, resolve_threads
from ..torch.convert import to_numpy, to_torch

__all__ = ["InkStorageWriter", "InkStorageReader", "read_metadata", "describe", "verify",
           "consolidate", "METADATA_FILE", "BYTES_PREFIX"]

METADATA_FILE = ".metadata"
"""The commit marker: written by the coordinator once every rank's file is in place."""

BYTES_PREFIX = "__dcp_bytes__."
"""Tensor-name prefix of non-tensor items (DCP's BYTE_IO write items) in a rank's file."""

_RANK_FILE = re.compile(r"rank\d{5}-[0-9a-f]{12}\.ink")
_RANK_TEMP = re.compile(r"\.rank\d{5}-[0-9a-f]{12}\.ink\..*\.tmp")

E = TypeVar("E")


def _named(path: str, call: Callable[[], E]) -> E:
    """``call()``, with an inshrink error that does not name ``path`` re-raised naming it."""
    try:
        return call()
    except InshrinkError as exc:
        if path in str(exc):
            raise
        raise type(exc)(f"{path}: {exc}") from exc


# -- saving --------------------------------------------------------------------------------

class InkStorageWriter(StorageWriter):
    """A DCP storage writer that stores each rank's shards in one .ink file.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory (created if missing). ``dcp.save(..., checkpoint_id=...)``
        replaces it for one save.
    policy : Policy, str or None
        Lossy compression per shard (:class:`inshrink.Policy` or a preset name); roles come
        from the fully-qualified names, e.g. ``optim.state.<param>.exp_avg``. ``None``:
        lossless, bit-exact.
    threads : int, optional
        Encoder threads per rank (default: every core).

    Notes
    -----
    Needs DCP's collectives (``use_collectives=True``, the default): the coordinator commits
    the checkpoint for all ranks. Saving into a directory that holds a checkpoint replaces it
    atomically. Two saves into the same directory at the same time are not supported.

    Examples
    --------
    >>> import torch.distributed.checkpoint as dcp                           # doctest: +SKIP
    >>> dcp.save({"model": model.state_dict()},                              # doctest: +SKIP
    ...          storage_writer=InkStorageWriter("ckpt/step_100", policy="balanced"))
    """

    def __init__(self, path: str | os.PathLike, policy: Policy | str | None = None,
                 threads: int | None = None) -> None:
        super().__init__()
        self.path = _checked_path(path)
        self.policy = resolve_policy(policy)
        self.threads = resolve_threads(threads)
        self.rank = 0
        self.is_coordinator = True
        self.save_id = _new_save_id()

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = _checked_path(checkpoint_id)
        self.save_id = _new_save_id()

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise InvalidArgumentError("InkStorageWriter needs use_collectives=True: the "
                                       "coordinator commits the checkpoint for every rank")
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank") or 0

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        for item in plan.items:
            if item.index.fqn.startswith(BYTES_PREFIX):
                raise InvalidArgumentError(f"state dict key {item.index.fqn!r}: the prefix "
                                           f"{BYTES_PREFIX!r} is reserved")
        try:
            os.makedirs(self.path, exist_ok=True)
        except OSError as exc:
            raise InvalidArgumentError(f"{self.path}: cannot create the checkpoint "
                                       f"directory: {exc.strerror or exc}") from None
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # the coordinator's save id names every rank's file, so all files of a save match
        return [dataclasses.replace(plan, storage_data=f"rank{i:05d}-{self.save_id}.ink")
                for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        file_name = plan.storage_data
        if not isinstance(file_name, str) or not _RANK_FILE.fullmatch(file_name):
            raise InvalidArgumentError("the save plan was not prepared by InkStorageWriter")
        results, _, _ = self._write_rank_file(plan.items, planner, file_name)
        return _done(results)

    def _write_rank_file(self, items: list[WriteItem], planner: SavePlanner, file_name: str,
                         keep_codes: bool = False
                         ) -> tuple[list[WriteResult], dict | None, dict | None]:
        """Write this rank's items into ``file_name``; return their write results and, with
        ``keep_codes``, what a delta against the file needs: its lossless tensors (as
        stored, by tensor name) and the codes of its quantized ones."""
        names = _stored_names(items)
        policy = self._rank_policy(items, names)
        path = os.path.join(self.path, file_name)
        metadata = {"dcp.rank": str(self.rank), "dcp.save_id": file_name[10:22]}
        arrays = {}
        with Writer(path, metadata, threads=self.threads, policy=policy,
                    keep_codes=keep_codes) as writer:
            for item, name in zip(items, names):
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    value = np.frombuffer(data.getvalue(), np.uint8)
                else:
                    value = to_numpy(data, item.index.fqn)
                if keep_codes:
                    arrays[name] = value
                # encoding overlaps the next items; each array stays referenced until close
                writer.add(name, value, wait=False)
            report = writer.close()
            codes = writer.codes
        infos = {info.name: info for info in report}
        results = [WriteResult(index=item.index, size_in_bytes=infos[name].stored_bytes,
                               storage_data={"file": file_name, "tensor": name})
                   for item, name in zip(items, names)]
        exact = {i.name: arrays[i.name] for i in report if i.lossless} if keep_codes else None
        return results, exact, codes

    def _rank_policy(self, items: list[WriteItem], names: list[str]) -> Policy:
        """The user's policy resolved per shard from its fully-qualified name, as the exact
        configs of this rank's stored tensor names (which may carry a suffix)."""
        configs = {}
        for item, name in zip(items, names):
            if item.type == WriteItemType.BYTE_IO:
                continue
            dtype = _dtype_name(item.tensor_data.properties.dtype, item.index.fqn)
            shape = tuple(int(d) for d in item.tensor_data.chunk.sizes)
            _, config = self.policy.config_for(item.index.fqn, dtype, shape)
            if config is not None:
                configs[name] = config
        return Policy(tensors=configs)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        storage = {}
        for rank_results in results:
            for result in rank_results:
                storage[result.index] = result.storage_data
        files = {entry["file"] for entry in storage.values()}
        for name in sorted(files):  # every rank's file is in place before the commit
            if not os.path.isfile(os.path.join(self.path, name)):
                raise IncompleteCheckpointError(f"{os.path.join(self.path, name)}: a rank's "
                                                f"file is missing; the checkpoint is not "
                                                f"committed")
        metadata.storage_data = storage
        metadata.storage_meta = self.storage_meta()
        metadata.version = "1.0.0"
        with AtomicFile(os.path.join(self.path, METADATA_FILE)) as target:
            pickle.dump(metadata, target.file, protocol=pickle.HIGHEST_PROTOCOL)
        _remove_stale(self.path, files)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


def _done(value: E) -> Future[E]:
    future: Future[E] = Future()
    future.set_result(value)
    return future


def _new_save_id() -> str:
    return uuid.uuid4().hex[:12]


def _checked_path(path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"checkpoint path must be a str or os.PathLike, got "
                                   f"{type(path).__name__}")
    return os.fspath(path)


def _stored_names(items: list[WriteItem]) -> list[str]:
    """Per write item, its tensor name in the rank's file: the fully-qualified name (so the
    policy sees the role), ``#<k>`` appended for a further chunk of the same name, and
    :data:`BYTES_PREFIX` before non-tensor items."""
    names, seen = [], set()
    for item in items:
        base = item.index.fqn
        if item.type == WriteItemType.BYTE_IO:
            base = BYTES_PREFIX + base
        name, k = base, 1
        while name in seen:
            name, k = f"{base}#{k}", k + 1
        seen.add(name)
        names.append(name)
    return names


def _dtype_name(dtype: torch.dtype, fqn: str) -> str:
    """inshrink's name of a torch dtype (a typed error for one it cannot store)."""
    return dtypes.of_numpy(to_numpy(torch.empty(0, dtype=dtype), fqn).dtype).name


def _remove_stale(directory: str, keep: set[str]) -> None:
    """Remove rank files of earlier saves into this directory, and temporary files that a
    crashed save left (best effort: the new checkpoint is committed already)."""
    for name in os.listdir(directory):
        if (_RANK_FILE.fullmatch(name) and name not in keep) or _RANK_TEMP.fullmatch(name):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


# -- loading -------------------------------------------------------------------------------

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
        Not a DCP checkpoint written by :class:`InkStorageWriter`, unreadable metadata, or a
        rank file the metadata names is missing.
    """
    metadata = _read_metadata(path)
    marker = os.path.join(os.fspath(path), METADATA_FILE)
    for name in sorted({entry["file"] for entry in metadata.storage_data.values()}):
        if not os.path.isfile(os.path.join(path, name)):
            raise CorruptError(f"{os.path.join(path, name)}: missing (named by {marker})")
    return metadata


def _read_metadata(path: str | os.PathLike) -> Metadata:
    """:func:`read_metadata` without checking that the rank files exist (a series keeps an
    older step's files as deltas under other names)."""
    path = _checked_path(path)
    marker = os.path.join(path, METADATA_FILE)
    if not os.path.isdir(path):
        raise CorruptError(f"{path}: not a DCP checkpoint directory")
    try:
        with open(marker, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        if any(_RANK_FILE.fullmatch(n) or _RANK_TEMP.fullmatch(n) for n in os.listdir(path)):
            raise IncompleteCheckpointError(f"{marker} is missing: the save into {path} did "
                                            f"not finish (the checkpoint was never "
                                            f"committed)") from None
        raise CorruptError(f"{path}: not a DCP checkpoint ({METADATA_FILE} is missing)") from None
    except OSError as exc:
        raise CorruptError(f"{marker}: cannot read: {exc.strerror or exc}") from None
    try:
        metadata = _MetadataUnpickler(io.BytesIO(raw)).load()
    except CorruptError as exc:
        raise CorruptError(f"{marker}: {exc}") from None
    except Exception as exc:  # pickle reports bad data with many exception types
        raise CorruptError(f"{marker}: not DCP metadata ({type(exc).__name__}: {exc})") from None
    _check_metadata(metadata, marker)
    return metadata


def _check_metadata(metadata: Any, marker: str) -> None:
    """The metadata's shape: a DCP Metadata whose storage data every chunk has, in ours."""
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise CorruptError(f"{marker}: not DCP metadata")
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise CorruptError(f"{marker}: no storage data (not written by InkStorageWriter)")
    for index, entry in storage.items():
        if not (isinstance(index, MetadataIndex) and isinstance(entry, dict)
                and isinstance(entry.get("file"), str) and _RANK_FILE.fullmatch(entry["file"])
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

    Examples
    --------
    >>> import torch.distributed.checkpoint as dcp                           # doctest: +SKIP
    >>> dcp.load(state, storage_reader=InkStorageReader("ckpt/step_100"))   # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike, threads: int | None = None) -> None:
        super().__init__()
        self.path = _checked_path(path)
        self.threads = resolve_threads(threads)
        self.metadata: Metadata | None = None

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = _checked_path(checkpoint_id)
        self.metadata = None

    def read_metadata(self, *args: Any) -> Metadata:
        metadata = read_metadata(self.path)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = uuid.uuid4().hex
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        _check_metadata(metadata, os.path.join(self.path, METADATA_FILE))
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
                raise CorruptError(f"{os.path.join(self.path, METADATA_FILE)}: no storage "
                                   f"entry for {item.storage_index.fqn!r}")
            grouped.setdefault(entry["file"], {}).setdefault(entry["tensor"], []).append(item)
        for file_name, tensors in grouped.items():
            self._read_file(file_name, tensors, planner)
        return _done(None)

    def _read_file(self, file_name: str, tensors: dict[str, list[ReadItem]],
                   planner: LoadPlanner) -> None:
        """Decode the wanted tensors of one rank file and hand them to their read items."""
        path = os.path.join(self.path, file_name)
        with _named(path, lambda: File(path, threads=self.threads)) as f:
            for batch in _batches(path, f, list(tensors)):
                # the tensors of a batch share the decoder threads
                arrays = _named(path, lambda: f.load(names=batch))
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
            os.path.join(os.fspath(checkpoint_id), METADATA_FILE))


READ_BATCH_BYTES = 256 << 20
"""Decoded bytes a reader holds at once beyond the destination tensors (one larger tensor
is read alone)."""


def _batches(path: str, f: File, names: list[str]) -> Iterator[list[str]]:
    """``names`` in runs of at most :data:`READ_BATCH_BYTES` decoded bytes."""
    batch, size = [], 0
    for name in names:
        nbytes = _named(path, lambda: f.info(name)).nbytes
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


# -- inspection ----------------------------------------------------------------------------

def _chunks(metadata: Metadata) -> Iterator[tuple[MetadataIndex, tuple[int, ...] | None]]:
    """Every stored chunk's index and sizes (None for a non-tensor item)."""
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            for chunk in item.chunks:
                yield MetadataIndex(fqn, chunk.offsets), tuple(int(d) for d in chunk.sizes)
        else:
            yield MetadataIndex(fqn), None


def describe(path: str | os.PathLike) -> list[dict]:
    """What a committed checkpoint holds, chunk by chunk, without decoding any data.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory.

    Returns
    -------
    list of dict
        One per stored chunk: ``fqn``, ``offsets`` and ``sizes`` (None for a non-tensor item),
        ``file``, ``tensor`` (its name in the file), ``dtype``, ``codec``, ``nbytes``,
        ``stored_bytes``, ``role`` and ``error`` (the error the encoder measured for a lossy
        shard: ``max_abs_error``, ``rel_l2_error``...; None for a lossless one).
    """
    return _describe(read_metadata(path), os.fspath(path))


def _describe(metadata: Metadata, path: str, stored: Mapping[str, str] | None = None
              ) -> list[dict]:
    """:func:`describe` of a checkpoint's metadata; ``stored`` maps a rank file the metadata
    names to the file that holds it now, if another (a series' delta file)."""
    stored = stored or {}
    infos: dict[str, dict[str, TensorInfo]] = {}
    for name in sorted({e["file"] for e in metadata.storage_data.values()}):
        file_path = os.path.join(path, stored.get(name, name))
        with _named(file_path, lambda: File(file_path, threads=1)) as f:
            infos[name] = {info.name: info for info in f.infos()}
    rows = []
    for index, sizes in _chunks(metadata):
        entry = metadata.storage_data[index]
        info = infos[entry["file"]].get(entry["tensor"])
        file_name = stored.get(entry["file"], entry["file"])
        if info is None:
            raise CorruptError(f"{os.path.join(path, file_name)}: no tensor named "
                               f"{entry['tensor']!r}, which {METADATA_FILE} names")
        _check_info(os.path.join(path, file_name), info, metadata, index.fqn, sizes)
        rows.append({"fqn": index.fqn,
                     "offsets": None if sizes is None else tuple(int(d) for d in index.offset),
                     "sizes": sizes, "file": file_name, "tensor": entry["tensor"],
                     "dtype": info.dtype, "codec": info.codec, "nbytes": info.nbytes,
                     "stored_bytes": info.stored_bytes, "role": info.role,
                     "error": info.error})
    return rows


def _check_info(path: str, info: TensorInfo, metadata: Metadata, fqn: str,
                sizes: tuple[int, ...] | None) -> None:
    """A stored tensor is what the metadata says its chunk is (from the file's index)."""
    if sizes is None:
        expected = "U8", (info.shape[0] if len(info.shape) == 1 else -1,)
    else:
        expected = (_dtype_name(metadata.state_dict_metadata[fqn].properties.dtype, fqn), sizes)
    if (info.dtype, tuple(info.shape)) != expected:
        raise CorruptError(f"{path}: {info.name!r} is {info.dtype}{list(info.shape)}, the "
                           f"metadata says {expected[0]}{list(expected[1])}")


def verify(path: str | os.PathLike, threads: int | None = None) -> list[dict]:
    """Check a committed checkpoint completely: every file named by the metadata exists and
    decodes with every checksum right, and every chunk is stored with its dtype and sizes.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint directory.
    threads : int, optional
        Decoder threads (default: every core).

    Returns
    -------
    list of dict
        What :func:`describe` returns.

    Raises
    ------
    InshrinkError
        The first problem found (:class:`IncompleteCheckpointError`, :class:`CorruptError`
        and its subclasses), naming the file.
    """
    rows = describe(path)
    for name in sorted({row["file"] for row in rows}):
        file_path = os.path.join(os.fspath(path), name)
        with _named(file_path, lambda: File(file_path, threads=threads)) as f:
            _named(file_path, f.verify)
    return rows


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
    out = _checked_output(out, policy)
    metadata = read_metadata(path)
    return _consolidate_to(out, os.fspath(path), metadata,
                           _RankFiles(os.fspath(path), metadata, threads), policy, threads)


def _checked_output(out: Any, policy: Policy | str | None) -> str:
    out = _checked_path(out)
    if out.endswith(".safetensors"):
        if policy is not None:
            raise InvalidArgumentError("a .safetensors file is lossless: no policy")
    elif not out.endswith(".ink"):
        raise InvalidArgumentError(f"{out}: the output must be an .ink or .safetensors file")
    return out


def _consolidate_to(out: str, path: str, metadata: Metadata, source: "_RankFiles",
                    policy: Policy | str | None, threads: int | None) -> list[TensorInfo]:
    """:func:`consolidate` of a checkpoint's metadata into a checked ``out``, its chunks
    read from ``source``."""
    try:
        if out.endswith(".safetensors"):
            return _consolidate_safetensors(path, out, metadata, source, threads)
        return _consolidate(path, out, metadata, source, policy, threads, keep_bytes=True)
    finally:
        source.close()


class _RankFiles:
    """The chunks of a committed checkpoint, read from its rank files (each opened once)."""

    def __init__(self, path: str, metadata: Metadata, threads: int | None) -> None:
        self.path, self.metadata, self.threads = path, metadata, threads
        self.files: dict[str, File] = {}

    def file_of(self, index: MetadataIndex) -> str:
        """The path of the file holding a chunk (for messages)."""
        return os.path.join(self.path, self.metadata.storage_data[index]["file"])

    def read(self, index: MetadataIndex) -> np.ndarray:
        entry = self.metadata.storage_data[index]
        file_path = os.path.join(self.path, entry["file"])
        if entry["file"] not in self.files:
            self.files[entry["file"]] = _named(file_path,
                                               lambda: File(file_path, threads=self.threads))
        return _named(file_path, lambda: self.files[entry["file"]].read(entry["tensor"]))

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()


def _consolidate(path: str, out: str, metadata: Metadata, source: _RankFiles,
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


def _joined(source: _RankFiles, metadata: Metadata, fqn: str,
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
        raise CorruptError(f"{os.path.join(source.path, METADATA_FILE)}: the chunks of {fqn!r} do "
                           f"not cover its {list(size)} elements")
    return whole


def _consolidate_safetensors(path: str, out: str, metadata: Metadata, source: _RankFiles,
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
