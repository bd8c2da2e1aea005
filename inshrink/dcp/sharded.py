"""The sharded mode of :class:`inshrink.torch.Checkpointer`: one DCP checkpoint per step
(``torch.distributed.checkpoint`` with :mod:`inshrink.dcp`'s storage layer) in a directory of
step directories, with retention and the whole training state.

Layout of ``directory``::

    step_000000001000/    a committed DCP checkpoint (its ``.metadata`` is the commit marker):
                          one .ink file per rank
    step_000000002000/
    ...

With ``keep_weights``, a step leaving the ``keep_last`` newest is rewritten in place as the
model's items only (:mod:`inshrink.dcp.weights_only`: each rank its own files, rank 0 the
commit): an ordinary DCP checkpoint of the ``model.`` items, without the optimizer's and the
training state's. A step is whole when it holds rank 0's training state.

Each rank's training state (scheduler, random generators, extras: see
:mod:`inshrink.torch.training`) is stored in the same checkpoint as tensors of that rank only,
``training_rank<rank>.document`` (the JSON document as uint8) and
``training_rank<rank>.arrays.<name>``: nothing of it is pickled. The optimizer's
hyperparameters, which DCP stores as pickled bytes items, are unpickled with torch's
``weights_only`` loader, which builds plain values and tensors only.
"""
from __future__ import annotations

import functools
import logging
import os
import pickle
import shutil
import time
from typing import Any, Callable, Mapping

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element  # as DCP's planner does
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)

from .metadata import read_metadata
from .names import METADATA, rank_of, step_dir, step_of
from .reader import InkStorageReader
from .writer import InkStorageWriter
from . import weights_only
from .. import errors
from ..errors import CorruptError, InshrinkError, InvalidArgumentError
from ..encode.policy import Policy
from ..torch.state import check_versions, versions_of
from ..torch.training import capture, decode

__all__ = ["ShardedCheckpoints", "step_directory", "is_sharded"]

_LOG = logging.getLogger("inshrink.torch")
MAX_STEP = 10 ** 12 - 1


step_directory = step_dir
"""The name of ``step``'s checkpoint directory (:func:`inshrink.dcp.names.step_dir`)."""


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` calls for the sharded mode: a process group of more than one rank
    is initialized, or a parameter is a DTensor (FSDP2, tensor parallel)."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    if dist.get_world_size() > 1:
        return True
    from torch.distributed.tensor import DTensor
    return any(isinstance(p, DTensor) for p in model.parameters())


def _training_key(rank: int) -> str:
    return f"training_rank{rank:05d}"


class _SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor items (the optimizer's hyperparameters) are
    unpickled by torch's ``weights_only`` loader: a checkpoint never runs code."""

    def load_bytes(self, read_item: Any, value: Any) -> None:
        fqn = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CorruptError(f"{fqn!r}: refusing a stored value that is not plain data "
                               f"({first})") from None
        # what DefaultLoadPlanner.load_bytes does with the value it unpickled
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


def _first_failure(exc: Exception) -> BaseException:
    """What a DCP CheckpointException carries: the first failing rank's exception (an
    inshrink error as a typed error naming the rank)."""
    failures = getattr(exc, "failures", None)
    if not failures:
        return exc
    rank, failure = min(failures.items(), key=lambda item: item[0])
    if isinstance(failure, tuple) and failure:  # (exception, traceback summary)
        failure = failure[0]
    if isinstance(failure, InshrinkError):
        return type(failure)(f"rank {rank}: {failure}")
    if isinstance(failure, BaseException):
        if hasattr(failure, "add_note"):
            failure.add_note(f"raised on rank {rank}")
        return failure
    return exc


class ShardedCheckpoints:
    """DCP checkpoints of a (sharded) model, its optimizer and the training state, one
    directory per step. Every method is collective: every rank calls it, in the same order.

    Parameters
    ----------
    directory : str or os.PathLike
        Shared by every rank (a shared filesystem on several machines).
    model, optimizer, scheduler, extra, rng
        What :class:`inshrink.torch.Checkpointer` takes.
    policy : Policy, str or None
        Applied per shard by :class:`inshrink.dcp.InkStorageWriter` (None: lossless).
    keep_last : int or None
        After each save, rank 0 removes all but this many newest committed steps (None: keeps
        them all). It always removes the directories of saves older than the newest that
        never committed.
    threads : int, optional
        Encoder/decoder threads per rank.
    background : bool
        Saves will run in a background thread: their collectives then use a process group
        of their own (created here, a collective call), beside training's.
    keep_weights : int, optional
        With ``keep_last``: keep this many steps before the ``keep_last`` newest as the
        model's items only, each rewritten in place when it leaves the ``keep_last``
        newest (each rank rewriting its own files; bit for bit, unless ``weights_policy``).
    weights_policy : Policy, str or None
        Encode the model's items of those steps again with this policy.
    """

    def __init__(self, directory: str | os.PathLike, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer | None, scheduler: Any,
                 extra: Mapping[str, Any], rng: bool, policy: Policy | str | None,
                 keep_last: int | None, threads: int | None, background: bool,
                 keep_weights: int | None = None,
                 weights_policy: Policy | str | None = None) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise InvalidArgumentError("the sharded mode needs an initialized process group "
                                       "(torch.distributed.init_process_group)")
        InkStorageWriter(directory, policy=policy, threads=threads)  # checks both early
        self.directory = os.fspath(directory)
        self.model, self.optimizer = model, optimizer
        self.scheduler, self.extra, self.rng = scheduler, extra, rng
        self.policy, self.keep_last, self.threads = policy, keep_last, threads
        self.keep_weights, self.weights_policy = keep_weights, weights_policy
        self._whole: dict[str, tuple[int, bool]] = {}  # .metadata path -> (mtime, whole)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.group = dist.new_group(backend="gloo") if background else None
        os.makedirs(self.directory, exist_ok=True)

    def close(self) -> None:
        """Destroy the background saves' process group (no collective: each rank its own),
        once no save runs on it; idempotent. Left to interpreter exit, a gloo group is torn
        down with the process's other objects, in no order, its threads still running."""
        group, self.group = self.group, None
        if group is None or not (dist.is_available() and dist.is_initialized()):
            return  # none, or destroyed with the default group already
        try:
            dist.destroy_process_group(group)
        except (RuntimeError, ValueError):  # already destroyed by the caller
            pass

    # -- queries ---------------------------------------------------------------------------

    def _step_dirs(self) -> dict[int, str]:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return {}
        return {step: os.path.join(self.directory, n)
                for n in names if (step := step_of(n)) is not None}

    def committed(self) -> list[int]:
        """Committed steps, whole or weights-only, ascending (as this rank sees the
        directory)."""
        return sorted(s for s, path in self._step_dirs().items()
                      if os.path.isfile(os.path.join(path, METADATA)))

    def steps(self) -> list[int]:
        """Committed steps with the whole training state, ascending."""
        return [s for s in self.committed() if self._is_whole(s)]

    def weights_only_steps(self) -> list[int]:
        """Committed steps kept as the model's items only (``keep_weights``), ascending."""
        return [s for s in self.committed() if not self._is_whole(s)]

    def _is_whole(self, step: int) -> bool:
        """Whether ``step`` holds rank 0's training state (read once per commit of it)."""
        marker = os.path.join(self.path(step), METADATA)
        try:
            mtime = os.stat(marker).st_mtime_ns
        except OSError:
            return False
        known = self._whole.get(marker)
        if known is None or known[0] != mtime:
            try:
                items = read_metadata(self.path(step)).state_dict_metadata
            except InshrinkError:
                return True  # what restoring it reports; never taken for a model's
            known = self._whole[marker] = (mtime, f"{_training_key(0)}.document" in items)
        return known[1]

    def latest(self) -> int | None:
        steps = self.committed()
        return steps[-1] if steps else None

    def path(self, step: int) -> str:
        return os.path.join(self.directory, step_dir(step))

    # -- every rank agrees ----------------------------------------------------------------

    def _agree(self, error: InshrinkError | OSError | None, group: Any = None) -> None:
        """Raise on every rank if any rank has an error (never leave the others waiting in
        a collective that the failed rank will not join): the rank's own error, or the
        first failing rank's, of the same type, naming that rank. ``group``: the process
        group (default: the default one)."""
        gathered: list[tuple[str, str] | None] = [None] * self.world
        dist.all_gather_object(gathered, None if error is None else
                               (type(error).__name__, str(error)), group=group)
        if error is not None:
            raise error
        failed = [(r, e) for r, e in enumerate(gathered) if e is not None]
        if failed:
            rank, (kind, message) = failed[0]
            cls = getattr(errors, kind, None)
            if not (isinstance(cls, type) and issubclass(cls, InshrinkError)):
                cls = InshrinkError
            raise cls(f"rank {rank}: {message}")

    def _state(self) -> dict[str, Any]:
        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    # -- saving ----------------------------------------------------------------------------

    def stage(self, step: int, copy: bool,
              in_place: bool = False) -> Callable[[], dict[str, Any]]:
        """Take the state of ``step`` (a CPU copy if ``copy``; with ``in_place`` a copy of the
        model's buffers only, the job then failing if a parameter or optimizer tensor changes
        before this rank's file is written); return the job that writes it.

        Raises on every rank if ``step`` is not after the newest committed step or some
        rank's training state cannot be stored.
        """
        error = None
        try:
            if type(step) is not int or not 0 <= step <= MAX_STEP:
                raise InvalidArgumentError(f"step must be an integer in [0, {MAX_STEP}]")
            latest = self.latest()
            if latest is not None and step <= latest:
                raise InvalidArgumentError(f"step {step} is not after the latest step "
                                           f"{latest} of {self.directory}")
            arrays, document = capture(self.scheduler, self.extra, self.rng)
        except InshrinkError as exc:
            error = exc
        self._agree(error)
        state = self._state()
        check = None
        if in_place:  # a forward pass changes the buffers: those are copied
            buffers = {name for name, _ in self.model.named_buffers(remove_duplicate=False)}
            state["model"] = {name: value.detach().clone() if name in buffers else value
                              for name, value in state["model"].items()}
            versions = versions_of(self.model, self.optimizer)
            check = functools.partial(check_versions, versions, step)
        elif copy:
            state = BlockingAsyncStager().stage(state)
        state[_training_key(self.rank)] = {
            "document": torch.frombuffer(bytearray(document.encode()), dtype=torch.uint8),
            "arrays": {name: torch.from_numpy(array) for name, array in arrays.items()}}
        return lambda: self._write(step, state, check)

    def _write(self, step: int, state: dict[str, Any],
               check: Callable[[], None] | None = None) -> dict[str, Any]:
        started = time.perf_counter()
        path = self.path(step)
        writer = InkStorageWriter(path, policy=self.policy, threads=self.threads, check=check)
        try:
            dcp.save(state, storage_writer=writer, process_group=self.group)
        except dcp.api.CheckpointException as exc:
            raise _first_failure(exc) from exc
        size = sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
        if self.keep_weights is None:
            if self.rank == 0:
                self._retain(step, self.committed()[-self.keep_last:]
                             if self.keep_last is not None else None)
        else:
            self._retain_weights(step)
        return {"step": step, "bytes": size, "search": None,
                "seconds": time.perf_counter() - started}

    def _retain(self, newest: int, keep: list[int] | None) -> None:
        """Rank 0, after a commit: remove older saves that never committed (a save killed or
        failed part way: no later save of theirs can come, steps only grow) and the
        committed steps not in ``keep`` (None: every committed step stays)."""
        committed = set(self.committed())
        for step, path in self._step_dirs().items():
            if step < newest and (step not in committed
                                  or (keep is not None and step not in keep)):
                shutil.rmtree(path, ignore_errors=True)

    def _retain_weights(self, newest: int) -> None:
        """After the commit of ``newest``, on every rank: the whole steps leaving the
        ``keep_last`` newest become weights-only (each rank rewrites its files of them,
        then rank 0 commits each), as many as ``keep_weights`` allows with the weights-only
        steps before them; every other older step is removed. A failure on any rank is
        raised on every rank; a step not committed as weights-only stays whole."""
        plans, keep, error = [], [], None
        if self.rank == 0:
            try:
                whole = [s for s in self.steps() if s <= newest]
                leaving = whole[:-self.keep_last]
                models = sorted(set(self.weights_only_steps()) | set(leaving))
                models = models[-self.keep_weights:]
                keep = whole[-self.keep_last:] + models
                plans = [weights_only.plan_subset(self.path(s), weights_only.is_model_item)
                         for s in leaving if s in models]
            except (InshrinkError, OSError) as exc:
                error = exc
        self._agree(error, self.group)
        shared = [plans, keep]
        dist.broadcast_object_list(shared, src=0, group=self.group)
        plans, keep = shared
        error = None
        try:  # rank r rewrites the files of ranks r, r + world, ... (an older, larger world)
            for plan in plans:
                for name in plan.files:
                    if rank_of(name) % self.world == self.rank:
                        weights_only.rewrite_file(plan, name, self.weights_policy,
                                                  self.threads)
        except (InshrinkError, OSError) as exc:  # raised on every rank, never a hang
            error = exc
        self._agree(error, self.group)
        error = None
        if self.rank == 0:
            try:
                for plan in plans:
                    weights_only.commit(plan)
                self._retain(newest, keep)
            except (InshrinkError, OSError) as exc:
                error = exc
        self._agree(error, self.group)

    # -- loading ---------------------------------------------------------------------------

    def restore(self, step: int | None) -> int:
        """Load ``step`` (None: the newest committed one, as rank 0 sees it) on every rank."""
        chosen = [step if step is not None else self.latest()]
        dist.broadcast_object_list(chosen, src=0)
        step = chosen[0]
        error, metadata, path = None, None, None
        try:
            if step is None:
                raise InvalidArgumentError(f"no checkpoint in {self.directory}")
            if type(step) is not int or not 0 <= step <= MAX_STEP:
                raise InvalidArgumentError(f"step must be an integer in [0, {MAX_STEP}]")
            path = self.path(step)
            metadata = read_metadata(path)
        except InshrinkError as exc:
            error = exc
        self._agree(error)
        key, rng = _training_key(self.rank), self.rng
        if f"{key}.document" not in metadata.state_dict_metadata:
            # saved by fewer ranks: rank 0's scheduler and extras; the generators as they are
            key, rng = _training_key(0), False
            if self.rng:
                _LOG.warning("%s: saved by fewer ranks than %d; rank %d keeps its random "
                             "generators' states", path, self.world, self.rank)
        # the training state first, checked on every rank before the model is touched
        # (DCP loads the model's and optimizer's state into their tensors in place)
        stored, error = None, None
        try:
            stored = {key: self._training_buffers(metadata, key, path)}
        except InshrinkError as exc:
            error = exc
        self._agree(error)
        self._load(path, stored)
        training, error = None, None
        try:
            document = bytes(stored[key]["document"].numpy()).decode("utf-8", "strict")
            arrays = {n: t.numpy() for n, t in stored[key]["arrays"].items()}
            training = decode(document, arrays, scheduler=self.scheduler is not None,
                              extra=self.extra, rng=rng, where=f"{path} (rank {self.rank})")
        except UnicodeDecodeError:
            error = CorruptError(f"{path}: the training state of {key} is not UTF-8 JSON")
        except InshrinkError as exc:
            error = exc
        self._agree(error)
        state = self._state()
        self._load(path, state)
        if self.optimizer is None:
            set_model_state_dict(self.model, state["model"])
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        training.apply(self.scheduler, self.extra, rng)
        return step

    def restore_model(self, step: int | None) -> int:
        """Load the model's items of ``step`` (None: the newest committed step, as rank 0 sees
        it), whole or weights-only, into the model only, on every rank."""
        chosen = [step if step is not None else self.latest()]
        dist.broadcast_object_list(chosen, src=0)
        step, error, path = chosen[0], None, None
        try:
            if step is None:
                raise InvalidArgumentError(f"no checkpoint in {self.directory}")
            if step not in self.committed():
                raise InvalidArgumentError(f"no step {step} in {self.directory} (steps: "
                                           f"{self.committed()})")
            path = self.path(step)
            read_metadata(path)
        except InshrinkError as exc:
            error = exc
        self._agree(error)
        state = {"model": get_model_state_dict(self.model)}
        self._load(path, state)
        set_model_state_dict(self.model, state["model"])
        return step

    def _load(self, path: str, state: dict[str, Any]) -> None:
        """``dcp.load``, a failure as the typed error of the first failing rank."""
        try:
            dcp.load(state, storage_reader=InkStorageReader(path, threads=self.threads),
                     planner=_SafeLoadPlanner())
        except dcp.api.CheckpointException as exc:
            raise _first_failure(exc) from exc

    def _training_buffers(self, metadata: Any, key: str, path: str) -> dict[str, Any]:
        """Tensors of the stored shapes and dtypes for the training state under ``key``."""
        prefix = f"{key}.arrays."
        arrays = {}
        for fqn, item in metadata.state_dict_metadata.items():
            if fqn.startswith(prefix) and isinstance(item, TensorStorageMetadata):
                arrays[fqn[len(prefix):]] = torch.empty(tuple(item.size),
                                                        dtype=item.properties.dtype)
        document = metadata.state_dict_metadata.get(f"{key}.document")
        if not isinstance(document, TensorStorageMetadata) or len(document.size) != 1:
            raise CorruptError(f"{path}: no training state ({key}.document) in the "
                               f"checkpoint")
        return {"document": torch.empty(tuple(document.size), dtype=torch.uint8),
                "arrays": arrays}
