"""Saving sharded checkpoints of ``torch.distributed.checkpoint`` (DCP) as .ink files.

:class:`InkStorageWriter` plugs into ``dcp.save`` and ``dcp.async_save``. Every rank encodes
the chunks it owns into its own .ink file; the coordinator then commits the checkpoint by
writing DCP's global metadata to ``.metadata``, atomically and last. A directory without that
file is an unfinished save and is refused with
:class:`inshrink.errors.IncompleteCheckpointError`.

Layout of a checkpoint directory::

    .metadata                        DCP's Metadata (pickled, as DCP's FileSystemWriter does);
                                     its storage_data maps every chunk to {"file", "tensor"}
    chunks.json                      the same layout as JSON, readable without torch
                                     (:mod:`inshrink.dcp.chunkmap`), written just before
    rank00000-<save id>.ink          rank 0's chunks, one tensor each, named by their
    rank00001-<save id>.ink          fully-qualified name; non-tensor items (step counters,
    ...                              RNG and scheduler state) as uint8 tensors named
                                     ``__dcp_bytes__.<fqn>``

Plain non-tensor values (numbers, strings, bools, None, short bytes) are also typed in
``chunks.json``; others are marked opaque there. File names carry an id unique to each save,
so saving again into the same directory keeps the previous checkpoint readable until the new
``.metadata`` replaces it; the files the new checkpoint no longer uses are then removed
(:mod:`inshrink.dcp.weights_only` rewrites a checkpoint as a subset of its items the same
way).

>>> import torch.distributed.checkpoint as dcp                       # doctest: +SKIP
>>> dcp.save(state, storage_writer=InkStorageWriter("ckpt/step_100"))  # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import io
import logging
import os
import pickle
import uuid
from typing import Any, Callable

import numpy as np
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

import torch

from ..atomic import AtomicFile
from ..errors import IncompleteCheckpointError, InshrinkError, InvalidArgumentError
from ..encode.policy import Policy
from ..encode.policy import resolve as resolve_policy
from ..io.arguments import resolve_threads
from ..io.writer import Writer
from ..torch.convert import dtype_name, to_numpy
from .calls import checked_path, done, make_directory
from .chunkmap import plain_value, write_chunk_map
from .metadata import chunk_map_of
from .names import (BYTES_PREFIX, CHUNK_MAP, METADATA, is_chunk_map_temporary, is_rank_file,
                    is_rank_temporary, rank_file_name)

__all__ = ["InkStorageWriter"]

_LOG = logging.getLogger("inshrink.dcp")

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
    check : callable, optional
        Called on each rank once its file is written; what it raises (e.g. a check that the
        tensors did not change while they were read) removes that file and fails the save
        on every rank, so nothing of it is committed.

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
                 threads: int | None = None, *,
                 check: Callable[[], None] | None = None) -> None:
        super().__init__()
        if check is not None and not callable(check):
            raise InvalidArgumentError("check must be callable or None")
        self.check = check
        self.path = checked_path(path)
        self.policy = resolve_policy(policy)
        self.threads = resolve_threads(threads)
        self.rank = 0
        self.is_coordinator = True
        self.save_id = _new_save_id()

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = checked_path(checkpoint_id)
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
        make_directory(self.path, "checkpoint directory")
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # the coordinator's save id names every rank's file, so all files of a save match
        return [dataclasses.replace(plan, storage_data=rank_file_name(i, self.save_id))
                for i, plan in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        file_name = plan.storage_data
        if not is_rank_file(file_name):
            raise InvalidArgumentError("the save plan was not prepared by InkStorageWriter")
        results, _, _ = self._write_rank_file(plan.items, planner, file_name)
        if self.check is not None:
            try:
                self.check()
            except BaseException:  # the save fails on every rank: nothing of it stays
                try:
                    os.unlink(os.path.join(self.path, file_name))
                except OSError:
                    pass  # (the next commit removes it: not a file of a committed save)
                raise
        return done(results)

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
        typed = {}
        with Writer(path, metadata, threads=self.threads, policy=policy,
                    keep_codes=keep_codes) as writer:
            for item, name in zip(items, names):
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    value = np.frombuffer(data.getvalue(), np.uint8)
                    typed[name] = _typed_value(data.getvalue())
                else:
                    value = to_numpy(data, item.index.fqn)
                if keep_codes:
                    arrays[name] = value
                # encoding overlaps the next items; each array stays referenced until close
                writer.add(name, value, wait=False)
            report = writer.close()
            codes = writer.codes
        infos = {info.name: info for info in report}
        # a non-tensor item's typed value travels to the coordinator for the chunk map
        results = [WriteResult(index=item.index, size_in_bytes=infos[name].stored_bytes,
                               storage_data={"file": file_name, "tensor": name,
                                             **({"value": typed[name]} if name in typed
                                                else {})})
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
            dtype = dtype_name(item.tensor_data.properties.dtype, item.index.fqn)
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
        self._write_chunk_map(metadata)
        # .metadata keeps DCP's own entries: the typed values are the chunk map's
        metadata.storage_data = {index: {"file": e["file"], "tensor": e["tensor"]}
                                 for index, e in storage.items()}
        with AtomicFile(os.path.join(self.path, METADATA)) as target:  # the commit, last
            pickle.dump(metadata, target.file, protocol=pickle.HIGHEST_PROTOCOL)
        _remove_stale(self.path, files)

    def _write_chunk_map(self, metadata: Metadata) -> None:
        """``chunks.json``, before the commit marker: it names this save's id, which the new
        ``.metadata`` holds, so a map beside an older ``.metadata`` (a crash between the two)
        is known for what it is. A layout that breaks a limit of the map (more than 64 MiB
        of it) gets no map: the checkpoint is then read through ``.metadata`` only."""
        try:
            write_chunk_map(self.path, chunk_map_of(metadata, self.save_id))
        except InshrinkError as exc:
            _LOG.warning("%s: no chunk map for this checkpoint (%s); it reads through %s, "
                         "with torch", self.path, exc, METADATA)
            try:
                os.unlink(os.path.join(self.path, CHUNK_MAP))
            except FileNotFoundError:
                pass

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))


def _new_save_id() -> str:
    return uuid.uuid4().hex[:12]


def _typed_value(raw: bytes) -> tuple[str, object] | None:
    """(type, value) of a non-tensor item's ``torch.save`` bytes if it is a plain value
    (:func:`inshrink.dcp.chunkmap.plain_value`), else None. Unpickled by torch's
    ``weights_only`` loader, which builds plain data only and runs no code."""
    try:
        value = torch.load(io.BytesIO(raw), weights_only=True)
    except Exception:  # anything that loader refuses is opaque
        return None
    return plain_value(value)


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


def _remove_stale(directory: str, keep: set[str]) -> None:
    """Remove rank files of earlier saves into this directory, and temporary files that a
    crashed save left (best effort: the new checkpoint is committed already)."""
    for name in os.listdir(directory):
        if (is_rank_file(name) and name not in keep) or is_rank_temporary(name) or (
                is_chunk_map_temporary(name)):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass

