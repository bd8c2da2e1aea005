"""Trainer checkpoint directories as series checkpoints and back.

:func:`checkpoint_to_numpy` turns a ``Trainer``'s ``checkpoint-<step>`` directory into named
arrays plus metadata for an :class:`inshrink.Series` (the model's safetensors tensors, the
optimizer's state, every other file's bytes), and :func:`restore_checkpoint` writes a stored
step back as such a directory, for ``trainer.train(resume_from_checkpoint=...)``. Imports
torch and safetensors.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import tempfile
from typing import Mapping

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file as save_safetensors

from ..errors import CorruptError, InvalidArgumentError
from ..series.series import MANIFEST, Series
from ..torch.convert import to_numpy, to_torch
from ..torch.state import MODEL, decode_optimizer, encode_optimizer

__all__ = ["checkpoint_to_numpy", "restore_checkpoint", "CHECKPOINT_METADATA"]

CHECKPOINT_METADATA = "inshrink.transformers.checkpoint"
"""Metadata key of a series checkpoint made from a Trainer checkpoint directory: JSON listing
each file of the directory and how it is stored."""

FILE = "file."
"""Tensor-name prefix of a file kept as it is (a uint8 tensor of its bytes)."""

OPTIMIZER_FILE = "optimizer.pt"
_FORMAT = 1


def _read_bytes(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8)


def checkpoint_to_numpy(directory: str | os.PathLike) -> tuple[dict[str, np.ndarray],
                                                                dict[str, str]]:
    """A Trainer checkpoint directory as named arrays plus metadata, for a series.

    Every ``.safetensors`` file's tensors become ``model.<name>``; ``optimizer.pt``, read with
    ``torch.load(weights_only=True)`` (nothing but tensors and plain data is unpickled),
    becomes ``optimizer.state.<index>.<key>`` tensors plus JSON; every other file
    (scheduler, RNG state, trainer state, training arguments, configs, tokenizer), and an
    ``optimizer.pt`` holding anything else, is kept as it is: a uint8 tensor
    ``file.<relative path>``. The metadata key :data:`CHECKPOINT_METADATA` says which file
    is stored how.
    """
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise InvalidArgumentError(f"{directory}: not a checkpoint directory")
    arrays: dict[str, np.ndarray] = {}
    files = []
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, directory).replace(os.sep, "/")
            files.append(_store_file(full, rel, arrays))
    doc = {"format": _FORMAT, "files": files}
    return arrays, {CHECKPOINT_METADATA: json.dumps(doc)}


def _store_file(full: str, rel: str, arrays: dict[str, np.ndarray]) -> dict:
    if rel.endswith(".safetensors"):
        with safe_open(full, framework="pt") as f:
            names = list(f.keys())
            for name in names:
                if MODEL + name in arrays:
                    raise InvalidArgumentError(f"{full}: tensor {name!r} is also in another "
                                               f"safetensors file of the checkpoint")
                arrays[MODEL + name] = to_numpy(f.get_tensor(name), name)
            return {"path": rel, "kind": "safetensors", "tensors": names,
                    "metadata": f.metadata()}
    if rel == OPTIMIZER_FILE:
        try:
            state = torch.load(full, map_location="cpu", weights_only=True)
            found: dict[str, np.ndarray] = {}
            doc = encode_optimizer(state, found)
        except (pickle.UnpicklingError, InvalidArgumentError, RuntimeError):
            pass  # something else than tensors and plain data: kept as it is, below
        else:
            arrays.update(found)
            return {"path": rel, "kind": "optimizer", "state": doc}
    arrays[FILE + rel] = _read_bytes(full)
    return {"path": rel, "kind": "file"}


def checkpoint_files(metadata: Mapping[str, str]) -> list[dict]:
    if CHECKPOINT_METADATA not in metadata:  # a step of another kind of series
        raise CorruptError(f"not a Trainer checkpoint saved by inshrink.transformers (no "
                           f"{CHECKPOINT_METADATA!r} metadata)")
    try:
        doc = json.loads(metadata[CHECKPOINT_METADATA])
        if doc.get("format") != _FORMAT or not isinstance(doc.get("files"), list):
            raise ValueError("unknown format")
        files = doc["files"]
        for entry in files:
            path = entry["path"]
            if (not isinstance(path, str) or path.startswith("/") or "\\" in path
                    or any(p in ("", ".", "..") for p in path.split("/"))):
                raise ValueError(f"bad file path {path!r}")
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        raise CorruptError(f"not a Trainer checkpoint saved by inshrink.transformers "
                           f"({CHECKPOINT_METADATA!r}: {exc})") from None
    return files


def restore_checkpoint(series: Series | str | os.PathLike, directory: str | os.PathLike,
                       step: int | None = None, *, overwrite: bool = False) -> str:
    """Write checkpoint ``step`` (default: the latest) of a series made by :class:`Callback`
    back as a Trainer checkpoint directory, for ``trainer.train(resume_from_checkpoint=...)``.

    The directory is built beside ``directory`` and renamed into place: a failure leaves no
    partial directory. Lossless checkpoints give back every file's content exactly
    (safetensors files as the same tensors and header metadata, ``optimizer.pt`` as the same
    state dict, other files byte for byte).

    Returns
    -------
    str
        ``directory``.

    Raises
    ------
    InvalidArgumentError
        ``series`` is a path without a series manifest (nothing is created there), ``directory``
        exists and not ``overwrite``, the series is empty or lacks ``step``.
    CorruptError
        The step was not saved by :class:`Callback` (a :class:`inshrink.torch.Checkpointer`'s
        series, say).
    """
    if not isinstance(series, Series):
        # reading: opening a Series on a wrong path would create it (and its lock file)
        if not os.path.isfile(os.path.join(os.fspath(series), MANIFEST)):
            raise InvalidArgumentError(f"{os.fspath(series)}: not a series (no {MANIFEST}); "
                                       f"give the directory of the Callback's series")
        series = Series(series)
    directory = os.fspath(directory)
    if os.path.lexists(directory) and not overwrite:
        raise InvalidArgumentError(f"{directory} exists (pass overwrite=True to replace it)")
    step = series.latest() if step is None else step
    if step is None:
        raise InvalidArgumentError(f"the series {series.directory} is empty")
    files = checkpoint_files(series.metadata(step))
    return write_checkpoint(files, series.load(step), directory,
                            f"step {step} of {series.directory}")


def write_checkpoint(files: list[dict], tensors: Mapping[str, np.ndarray],
                     directory: str | os.PathLike, where: str) -> str:
    """Write the files a checkpoint's :data:`CHECKPOINT_METADATA` lists from its tensors,
    into a directory built beside ``directory`` and renamed into place (the caller checked
    whether it may be replaced). ``where`` names the step in errors."""
    directory = os.fspath(directory)
    target = os.path.abspath(directory)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp",
                            dir=os.path.dirname(target))
    try:
        for entry in files:
            _write_file(os.path.join(work, *entry["path"].split("/")), entry, tensors)
        if os.path.lexists(target):
            shutil.rmtree(target)
        os.replace(work, target)
    except KeyError as exc:
        raise CorruptError(f"{where}: {CHECKPOINT_METADATA!r} "
                           f"names {exc}, which the checkpoint lacks") from None
    except (TypeError, ValueError, AttributeError) as exc:  # metadata of another shape
        raise CorruptError(f"{where}: {CHECKPOINT_METADATA!r} "
                           f"is malformed ({type(exc).__name__}: {exc})") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return directory


TRAINING_FILES = ("optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json",
                  "training_args.bin")
"""A Trainer checkpoint's files that hold training state, not the model (with the RNG states,
``rng_state*.pth``)."""


def is_training_file(path: str) -> bool:
    """Whether a checkpoint's file (its path inside the directory) is training state."""
    name = path.rsplit("/", 1)[-1]
    return name in TRAINING_FILES or (name.startswith("rng_state") and name.endswith(".pth"))


def is_model_tensor(name: str) -> bool:
    """Whether a stored tensor (:func:`checkpoint_to_numpy`'s names) belongs to the model
    directory: a safetensors file's tensor, or a file that is not training state."""
    return name.startswith(MODEL) or (name.startswith(FILE)
                                      and not is_training_file(name[len(FILE):]))


def model_files(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str]
                ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The part of a checkpoint (:func:`checkpoint_to_numpy`'s output) that makes a model
    directory: its safetensors files and every file that is not training state (config,
    generation config, tokenizer); :func:`restore_checkpoint` writes it back as such."""
    files = [e for e in checkpoint_files(metadata)
             if e.get("kind") != "optimizer" and not is_training_file(e["path"])]
    names = {MODEL + n for e in files if e.get("kind") == "safetensors" for n in e["tensors"]}
    names |= {FILE + e["path"] for e in files if e.get("kind") == "file"}
    doc = {"format": _FORMAT, "files": files}
    return ({n: a for n, a in arrays.items() if n in names},
            {CHECKPOINT_METADATA: json.dumps(doc)})


def _write_file(path: str, entry: dict, tensors: Mapping[str, np.ndarray]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    kind = entry.get("kind")
    if kind == "safetensors":
        save_safetensors({n: to_torch(tensors[MODEL + n]) for n in entry["tensors"]}, path,
                         metadata=entry.get("metadata"))
    elif kind == "optimizer":
        buffer = io.BytesIO()
        torch.save(decode_optimizer(entry["state"], tensors, set()), buffer)
        with open(path, "wb") as f:
            f.write(buffer.getvalue())
    elif kind == "file":
        with open(path, "wb") as f:
            f.write(np.ascontiguousarray(tensors[FILE + entry["path"]]).tobytes())
    else:
        raise CorruptError(f"{entry['path']}: unknown storage kind {kind!r}")
