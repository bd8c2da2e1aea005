"""A committed sharded checkpoint rewritten in place as a subset of its items (the model's,
for ``keep_weights`` of the sharded :class:`inshrink.torch.Checkpointer`).

The rewrite is a save into a directory that holds a checkpoint (spec section 25.1.2): every
rank file is written again, holding only the kept items' chunks, under a new save id; then the
coordinator writes the chunk map and ``.metadata`` of what is kept, the commit marker last, and
removes the old rank files. Until that ``.metadata`` is in place the directory reads as the
whole checkpoint it was (the new files are debris of a save that did not commit); after it, as
an ordinary checkpoint of the kept items. Any number of processes can share the rank files'
rewriting (:func:`rewrite_file`, one call per file); one commits (:func:`commit`).

>>> plan = plan_subset("ckpt/step_100", lambda fqn: fqn.startswith("model."))  # doctest: +SKIP
>>> for name in plan.files: rewrite_file(plan, name)                           # doctest: +SKIP
>>> commit(plan)                                                                # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import os
import pickle
from dataclasses import dataclass
from typing import Callable, Collection, Mapping

import numpy as np

from torch.distributed.checkpoint.metadata import StorageMeta

from ..atomic import AtomicFile
from ..encode.policy import Policy
from ..encode.policy import resolve as resolve_policy
from ..errors import CorruptError, InvalidArgumentError
from ..io.file import File
from ..io.rebase import write_standalone
from ..io.writer import Writer
from .chunkmap import ChunkMap, TensorItem, find_chunk_map, write_chunk_map
from .metadata import chunk_map_of, read_metadata, read_metadata_file
from .names import BYTES_PREFIX, METADATA, rank_file_name, rank_of
from .writer import _new_save_id, _remove_stale

__all__ = ["SubsetPlan", "plan_subset", "rewrite_file", "write_kept", "commit", "kept_items",
           "is_model_item"]


def is_model_item(fqn: str) -> bool:
    """Whether an item of a saved state is the model's: under ``model.``, as the
    ``{"model": ..., "optim": ...}`` states of DCP name them (what a weights-only step keeps
    by default)."""
    return fqn.startswith("model.")


@dataclass(frozen=True)
class SubsetPlan:
    """What a rewrite keeps: the checkpoint ``path``, the kept items' FQNs, the new save id,
    and per rank file of the committed checkpoint the tensors of it that stay."""

    path: str
    fqns: frozenset[str]
    save_id: str
    old_save_id: str
    files: dict[str, tuple[tuple[str, str], ...]]
    """Per rank file, its kept tensors: (stored name, the item's FQN) each."""

    def new_name(self, old: str) -> str:
        """The name of rank file ``old`` once rewritten."""
        return rank_file_name(rank_of(old), self.save_id)


def plan_subset(path: str | os.PathLike, keep: Callable[[str], bool]) -> SubsetPlan:
    """Plan the rewrite of the committed checkpoint ``path`` keeping the items whose FQN
    ``keep`` accepts.

    Raises
    ------
    InvalidArgumentError
        No item of the checkpoint is kept.
    CorruptError, IncompleteCheckpointError
        ``path`` is not a committed checkpoint (:func:`inshrink.dcp.read_metadata`).
    """
    path = os.fspath(path)
    metadata = read_metadata(path)
    fqns = frozenset(fqn for fqn in metadata.state_dict_metadata if keep(fqn))
    if not fqns:
        raise InvalidArgumentError(f"{path}: none of its items is one to keep (items: "
                                   f"{sorted(metadata.state_dict_metadata)[:5]} ...)")
    files: dict[str, list[tuple[str, str]]] = {}
    for index, entry in metadata.storage_data.items():
        if index.fqn in fqns:
            files.setdefault(entry["file"], []).append((entry["tensor"], index.fqn))
    old_ids = {name[10:22] for name in files}
    if len(old_ids) > 1:
        raise CorruptError(f"{path}/{METADATA}: rank files of several saves {sorted(old_ids)}")
    old = old_ids.pop() if old_ids else str(getattr(metadata.storage_meta, "save_id", ""))
    return SubsetPlan(path, fqns, _new_save_id(), old,
                      {name: tuple(sorted(tensors)) for name, tensors in sorted(files.items())})


def rewrite_file(plan: SubsetPlan, name: str, policy: Policy | str | None = None,
                 threads: int | None = None) -> None:
    """Write rank file ``name``'s kept tensors as the file :meth:`SubsetPlan.new_name` names
    (atomically, :func:`write_kept`); its index metadata names the new save id."""
    source = os.path.join(plan.path, name)
    with File(source, threads=threads, mmap=False) as f:
        metadata = {**f.metadata, "dcp.save_id": plan.save_id}
    write_kept(source, os.path.join(plan.path, plan.new_name(name)), plan.files[name],
               metadata, policy, threads)


def write_kept(source: str, target: str, kept: tuple[tuple[str, str], ...],
               metadata: dict[str, str], policy: Policy | str | None = None,
               threads: int | None = None, decoded: Mapping[str, np.ndarray] | None = None,
               codes: Mapping[str, np.ndarray] | None = None) -> None:
    """Write ``target`` (atomically): the tensors ``kept`` ((stored name, item FQN) each) of
    the rank file ``source``, with index ``metadata``. Bit for bit as stored, or encoded
    again with ``policy``, each configured by its item's FQN as
    :class:`inshrink.dcp.InkStorageWriter` configures a chunk. ``decoded``/``codes``: what
    ``source`` decodes to and the codes of its quantized tensors, where it is a delta file
    (:func:`inshrink.io.rebase.write_standalone`)."""
    names = [tensor for tensor, _ in kept]
    if policy is None:
        write_standalone(source, target, names, src_exact=decoded or {},
                         src_codes=codes or {}, metadata=metadata)
        return
    with File(source, threads=threads, mmap=False) as f:
        infos = {info.name: info for info in f.infos()}
        chosen, configs = resolve_policy(policy), {}
        for tensor, fqn in kept:
            info = infos[tensor]
            if not tensor.startswith(BYTES_PREFIX):
                _, config = chosen.config_for(fqn, info.dtype, info.shape)
                if config is not None:
                    configs[tensor] = config
        with Writer(target, metadata, policy=Policy(tensors=configs),
                    threads=threads) as out:
            for tensor in names:
                out.add(tensor, decoded[tensor] if decoded is not None else f.read(tensor))


def commit(plan: SubsetPlan) -> None:
    """Once every rank file is rewritten: write the chunk map and ``.metadata`` of the kept
    items (the commit marker last), then remove the old rank files."""
    metadata = read_metadata(plan.path)
    storage = {index: {"file": plan.new_name(e["file"]), "tensor": e["tensor"]}
               for index, e in metadata.storage_data.items() if index.fqn in plan.fqns}
    missing = sorted({e["file"] for e in storage.values()
                      if not os.path.isfile(os.path.join(plan.path, e["file"]))})
    if missing:
        raise InvalidArgumentError(f"{plan.path}: {missing[0]} is not written: every rank "
                                   f"file must be rewritten before the commit")
    _write_subset(plan.path, metadata, plan.fqns, storage, plan.old_save_id, plan.save_id,
                  plan.new_name)
    _remove_stale(plan.path, set(plan.new_name(name) for name in plan.files))


def kept_items(path: str | os.PathLike, kept: Mapping[str, Collection[str]]) -> bool:
    """Make the chunk map and ``.metadata`` of the checkpoint ``path`` (the marker last)
    describe only the stored tensors ``kept`` (per rank file name, its tensors that stay),
    names and save id unchanged: a DCP series' weights-only step, whose rank files are kept
    under other names (``.w.ink``). Returns False, writing nothing, when they describe
    nothing more."""
    path = os.fspath(path)
    metadata = read_metadata_file(path)
    storage = {index: e for index, e in metadata.storage_data.items()
               if e["tensor"] in kept.get(e["file"], ())}
    if len(storage) == len(metadata.storage_data):
        return False
    named = sorted({e["file"][10:22] for e in metadata.storage_data.values()})
    save_id = named[0] if named else str(getattr(metadata.storage_meta, "save_id", ""))
    _write_subset(path, metadata, frozenset(index.fqn for index in storage), storage, save_id,
                  save_id, lambda name: name)
    return True


def _write_subset(path: str, metadata, fqns: frozenset[str], storage: dict, old_save_id: str,
                  save_id: str, rename: Callable[[str], str]) -> None:
    """The chunk map, then ``.metadata`` (the commit), of ``metadata``'s items ``fqns``, with
    ``storage`` as its storage data, its files renamed by ``rename`` and save id ``save_id``."""
    planner_data = metadata.planner_data
    if isinstance(planner_data, dict):
        planner_data = {k: v for k, v in planner_data.items() if k in fqns}
    meta = metadata.storage_meta
    subset = dataclasses.replace(
        metadata,
        state_dict_metadata={k: v for k, v in metadata.state_dict_metadata.items() if k in fqns},
        storage_data=storage, planner_data=planner_data,
        storage_meta=StorageMeta(checkpoint_id=getattr(meta, "checkpoint_id", None) or path,
                                 save_id=save_id))
    write_chunk_map(path, _chunk_map(path, subset, fqns, old_save_id, save_id, rename))
    with AtomicFile(os.path.join(path, METADATA)) as target:  # the commit, last
        pickle.dump(subset, target.file, protocol=pickle.HIGHEST_PROTOCOL)


def _chunk_map(path: str, subset, fqns: frozenset[str], old_save_id: str, save_id: str,
               rename: Callable[[str], str]) -> ChunkMap:
    """The kept items of the committed chunk map (their typed values kept), under the renamed
    files and ``save_id``; from ``subset``'s metadata where the checkpoint has no map."""
    whole = find_chunk_map(path, check_files=False)
    if whole is None or whole.save_id != old_save_id:
        return chunk_map_of(subset, save_id)
    items = []
    for item in whole.items:
        if item.fqn not in fqns:
            continue
        if isinstance(item, TensorItem):
            items.append(dataclasses.replace(item, chunks=tuple(
                dataclasses.replace(c, file=rename(c.file)) for c in item.chunks)))
        else:
            items.append(dataclasses.replace(item, file=rename(item.file)))
    return ChunkMap(save_id, tuple(items))
