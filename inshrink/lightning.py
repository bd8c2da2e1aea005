"""PyTorch Lightning: :class:`InkCheckpointIO`, a ``CheckpointIO`` plugin that stores each
Lightning checkpoint as one .ink file.

>>> trainer = Trainer(plugins=[InkCheckpointIO()])                     # doctest: +SKIP
>>> trainer = Trainer(plugins=[InkCheckpointIO(policy="balanced")])    # doctest: +SKIP
>>> trainer.fit(model, ckpt_path="checkpoints/last.ckpt")              # doctest: +SKIP

What a checkpoint becomes (docs/lightning.md):

- ``state_dict``: tensors ``model.<name>``, through the codec (lossless unless a policy says);
- ``optimizer_states``: tensors ``optimizer.state.<index>.<key>`` and
  ``optimizer.param_groups.<group>.<key>`` for the first optimizer, ``optimizer_<i>.`` for
  the i-th after it, the rest of each state dict as JSON (:func:`inshrink.torch.state.
  encode_optimizer`): the names by which policies give Adam's moments their roles;
- everything else (loops, callbacks' state, learning-rate schedulers, hyperparameters,
  epoch, step, versions, a datamodule's state): JSON, its tensors as ``lightning.<path>``
  stored as their raw bits, which no policy quantizes.

The file keeps the path Lightning gives (``epoch=0-step=100.ckpt``, ``last.ckpt``), so that
``ModelCheckpoint``'s bookkeeping of its files works unchanged; it is written atomically.
Loading never unpickles: a value JSON cannot hold is refused when saving, naming its path.
Needs torch and lightning.
"""
from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from typing import Any, Mapping

import numpy as np
import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.fabric.utilities.apply_func import apply_to_collection

from . import api
from .atomic import check_path
from .encode.policy import Policy, resolve
from .errors import CorruptError, InvalidArgumentError, with_path
from .io.file import File
from .io.info import TensorInfo
from .torch.state import (MODEL, OPTIMIZER, decode_nested, decode_optimizer, encode_nested,
                          encode_optimizer, names_list)
from .torch.training import from_raw_bits, raw_bits

__all__ = ["InkCheckpointIO", "CHECKPOINT_METADATA", "LIGHTNING"]

CHECKPOINT_METADATA = "inshrink.lightning.checkpoint"
"""Metadata key of the JSON document that describes the checkpoint's structure."""

LIGHTNING = "lightning."
"""Name prefix of the tensors outside the model and the optimizers (stored as raw bits)."""

_FORMAT = 1
_STATE_DICT = "state_dict"
_OPTIMIZERS = "optimizer_states"
# what torch.save writes: a zip archive (since torch 1.6) or a bare pickle
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")


def _optimizer_prefix(index: int) -> str:
    return OPTIMIZER if index == 0 else f"optimizer_{index}."


def _local(path: Any) -> str:
    """``path`` as a local path; URLs (fsspec's ``s3://``...) are refused, not misread."""
    path = check_path(path)
    if "://" in path:
        raise InvalidArgumentError(f"{path}: InkCheckpointIO writes local files only")
    return path


class InkCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` that stores checkpoints as .ink files.

    Parameters
    ----------
    policy : Policy, str or None
        Lossy compression of the model's tensors and the optimizers' moments (a preset name
        such as ``"balanced"``, or an :class:`inshrink.Policy`); ``None``: lossless, and a
        resumed run is bit for bit the one that was not interrupted.
    threads : int, optional
        Encoder and decoder threads (default: every core).

    Attributes
    ----------
    reports : dict of str to list of TensorInfo
        Per saved path (until it is removed): each tensor's codec, sizes and, when quantized,
        the measured error.

    Notes
    -----
    Composes with ``AsyncCheckpointIO(InkCheckpointIO(...))``. ``LightningModule.
    load_from_checkpoint`` reads with ``torch.load``: load an .ink checkpoint through a
    ``Trainer`` (``ckpt_path=``) or with :meth:`load_checkpoint`.
    """

    def __init__(self, policy: Policy | str | None = None, *, threads: int | None = None) -> None:
        super().__init__()
        resolve(policy)  # an unknown preset fails here, not at the first checkpoint
        if threads is not None and (type(threads) is not int or threads < 1):
            raise InvalidArgumentError(f"threads must be a positive int or None, got {threads!r}")
        self.policy = policy
        self.threads = threads
        self.reports: dict[str, list[TensorInfo]] = {}
        self._start()

    def _start(self) -> None:
        # AsyncCheckpointIO saves from its own thread while Lightning removes from the
        # training thread: paths being written, removals of saves still queued, and whether
        # saves ever ran on another thread than a removal (see remove_checkpoint)
        self._lock = threading.Condition()
        self._writing: dict[str, int] = {}
        self._cancelled: dict[str, int] = {}
        self._save_threads: set[int] = set()

    def __getstate__(self) -> dict:  # spawned processes get a copy: locks do not pickle
        return {"policy": self.policy, "threads": self.threads, "reports": self.reports}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._start()

    @property
    def last_report(self) -> list[TensorInfo] | None:
        """The report of the latest save still on disk (None before the first)."""
        with self._lock:
            return next(reversed(self.reports.values()), None)

    # -- saving ------------------------------------------------------------------------------

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` (atomically; its directory is created).

        Parameters
        ----------
        checkpoint : dict
            What Lightning's ``Trainer`` builds: tensors and JSON-able values, nested in
            dicts (with string keys), lists and tuples.
        path : str or os.PathLike
            A local file; its name is kept as given.
        storage_options : mapping, optional
            ``{"policy": ...}`` overrides the plugin's policy for this checkpoint
            (``trainer.save_checkpoint(path, storage_options=...)``).

        Raises
        ------
        InvalidArgumentError
            A value that is neither a tensor nor JSON-able (named by its path, e.g.
            ``lightning.hyper_parameters.loss_fn``), a dictionary with keys that are not
            strings, unknown storage options, a URL.
        """
        path = _local(path)
        policy = self.policy
        if storage_options is not None:
            if not isinstance(storage_options, Mapping) or set(storage_options) - {"policy"}:
                raise InvalidArgumentError(f"storage_options: InkCheckpointIO takes None or "
                                           f"{{'policy': ...}}, got {storage_options!r}")
            policy = storage_options.get("policy", policy)
        arrays, document = _encode(checkpoint)
        with self._lock:
            self._save_threads.add(threading.get_ident())
            if self._cancelled.get(path):  # removed while it waited in AsyncCheckpointIO
                self._cancelled[path] -= 1
                return
            self._writing[path] = self._writing.get(path, 0) + 1
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            report = api.save(path, arrays, {CHECKPOINT_METADATA: document}, policy=policy,
                              threads=self.threads)
            with self._lock:
                self.reports.pop(path, None)  # re-inserted last: last_report is the newest
                self.reports[path] = report
        finally:
            with self._lock:
                self._writing[path] -= 1
                if not self._writing[path]:
                    del self._writing[path]
                self._lock.notify_all()

    # -- loading -----------------------------------------------------------------------------

    def load_checkpoint(self, path: str | os.PathLike, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """The checkpoint :meth:`save_checkpoint` wrote to ``path``.

        Parameters
        ----------
        path : str or os.PathLike
            An .ink file written by this plugin.
        map_location : str, torch.device, dict or callable, optional
            Where the tensors go: a device, or a dict mapping ``"cpu"`` to one (as
            ``torch.load``'s); ``None`` or a callable (Lightning's default): the CPU.
        weights_only : bool, optional
            Accepted for the interface: nothing is ever unpickled, whatever its value.

        Raises
        ------
        FileNotFoundError
            No file at ``path``.
        InvalidArgumentError
            A ``torch.save`` checkpoint, an .ink file this plugin did not write, a device this
            machine lacks.
        CorruptError
            Not an .ink file, or damaged (checksums, structure).
        """
        path = _local(path)
        device = _device(map_location)
        with open(path, "rb") as f:  # FileNotFoundError, as Lightning expects, when missing
            head = f.read(4)
        if head.startswith(_TORCH_MAGIC):
            raise InvalidArgumentError(
                f"{path}: a torch.save checkpoint, not one written by InkCheckpointIO; load "
                f"it with Lightning's TorchCheckpointIO (which unpickles: trusted files only)")
        with File(path, threads=self.threads, mmap=False) as file:
            metadata = file.metadata
            if CHECKPOINT_METADATA not in metadata:
                raise InvalidArgumentError(f"{path}: an .ink file without a Lightning "
                                           f"checkpoint (no {CHECKPOINT_METADATA!r} metadata)")
            arrays = file.load()
        try:
            checkpoint = _decode(metadata[CHECKPOINT_METADATA], arrays)
        except (InvalidArgumentError, CorruptError) as exc:
            raise with_path(CorruptError(str(exc)), path) from None
        if device is not None:
            checkpoint = apply_to_collection(checkpoint, torch.Tensor, lambda t: t.to(device))
        return checkpoint

    # -- removing ----------------------------------------------------------------------------

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        """Delete the file at ``path`` and its report; a save of ``path`` still to come from
        ``AsyncCheckpointIO``'s thread is skipped.

        Lightning's ``AsyncCheckpointIO`` queues saves but removes at once, so that
        ``ModelCheckpoint(save_top_k=...)`` may remove a checkpoint before it is written
        (Lightning issue #14035), and the file would stay. Here a removal waits for a save
        of the same path in progress, and a removal of a path with no file while saves run
        on another thread cancels the next save of that path: ``ModelCheckpoint`` removes only
        paths it asked to save. Without saves on another thread, a missing file is nothing
        to do.
        """
        path = _local(path)
        if os.path.isdir(path) and not os.path.islink(path):
            raise InvalidArgumentError(f"{path} is a directory: InkCheckpointIO writes single "
                                       f"files and removes nothing else")
        with self._lock:
            while path in self._writing:
                self._lock.wait()
            try:
                os.remove(path)
            except FileNotFoundError:
                if self._writing or self._save_threads - {threading.get_ident()}:
                    self._cancelled[path] = self._cancelled.get(path, 0) + 1
            self.reports.pop(path, None)


def _device(map_location: Any) -> torch.device | None:
    """The device ``map_location`` sends CPU tensors to (None: leave them on the CPU)."""
    if map_location is None or callable(map_location):
        return None
    if isinstance(map_location, Mapping):
        map_location = map_location.get("cpu", "cpu")
    try:
        device = torch.device(map_location)
        torch.empty(0, device=device)  # a device this machine lacks fails here, not on use
    except (RuntimeError, TypeError, AssertionError) as exc:
        raise InvalidArgumentError(f"map_location {map_location!r}: {exc}") from None
    return None if device.type == "cpu" else device


def _encode(checkpoint: Any) -> tuple[dict[str, np.ndarray], str]:
    """The checkpoint's arrays and the JSON document describing the rest."""
    if not isinstance(checkpoint, Mapping) or not all(isinstance(k, str) for k in checkpoint):
        raise InvalidArgumentError("a Lightning checkpoint must be a dict with string keys")
    rest = {k: v for k, v in checkpoint.items() if k not in (_STATE_DICT, _OPTIMIZERS)}
    other: dict[str, np.ndarray] = {}
    try:
        doc: dict[str, Any] = {"format": _FORMAT, "keys": list(checkpoint),
                               "rest": encode_nested(rest, LIGHTNING.rstrip("."), other)}
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{exc} (InkCheckpointIO stores tensors and JSON values; "
                                   f"e.g. leave such hyperparameters out with "
                                   f"save_hyperparameters(ignore=[...]))") from None
    doc["bits"] = raw_bits(other)
    arrays: dict[str, np.ndarray] = {}
    if _STATE_DICT in checkpoint:
        state = checkpoint[_STATE_DICT]
        if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
            raise InvalidArgumentError("the checkpoint's state_dict must map names to tensors")
        doc[_STATE_DICT] = {k: encode_nested(v, MODEL + k, arrays) for k, v in state.items()}
    if _OPTIMIZERS in checkpoint:
        optimizers = checkpoint[_OPTIMIZERS]
        if not isinstance(optimizers, (list, tuple)):
            raise InvalidArgumentError("the checkpoint's optimizer_states must be a list")
        doc[_OPTIMIZERS] = [encode_optimizer(s, arrays, _optimizer_prefix(i))
                            for i, s in enumerate(optimizers)]
    clash = set(arrays) & set(other)
    if clash:
        raise InvalidArgumentError(f"tensor names used twice: {names_list(clash)}")
    arrays.update(other)
    try:
        return arrays, json.dumps(doc)  # NaN and infinities of e.g. hyperparameters kept
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"the checkpoint cannot be stored as JSON: {exc}") from None


def _decode(document: str, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """The inverse of :func:`_encode`; CorruptError for a document of another shape."""
    try:
        doc = json.loads(document)
        if type(doc) is not dict or doc.get("format") != _FORMAT:
            raise ValueError(f"unknown format "
                             f"{doc.get('format') if type(doc) is dict else doc!r}")
        bits, keys = doc["bits"], doc["keys"]
        if type(bits) is not dict or type(keys) is not list:
            raise ValueError("'bits' must be an object, 'keys' a list")
        tensors = {name: from_raw_bits(name, array, bits[name], "lightning")
                   if name in bits else array for name, array in arrays.items()}
        used: set[str] = set()
        rest = decode_nested(doc["rest"], LIGHTNING.rstrip("."), tensors, used)
        if type(rest) is not dict:
            raise ValueError("'rest' must be an object")
        parts = dict(rest)
        if _STATE_DICT in doc:
            parts[_STATE_DICT] = OrderedDict(
                (k, decode_nested(v, MODEL + k, tensors, used))
                for k, v in doc[_STATE_DICT].items())
        if _OPTIMIZERS in doc:
            parts[_OPTIMIZERS] = [decode_optimizer(s, tensors, used, _optimizer_prefix(i))
                                  for i, s in enumerate(doc[_OPTIMIZERS])]
        checkpoint = {k: parts[k] for k in keys}
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise CorruptError(f"malformed {CHECKPOINT_METADATA!r} document "
                           f"({type(exc).__name__}: {exc})") from None
    unused = sorted(set(tensors) - used)
    if unused or len(checkpoint) != len(parts):
        raise CorruptError(f"the {CHECKPOINT_METADATA!r} document does not account for "
                           f"{names_list(unused) or 'every part'}")
    return checkpoint

