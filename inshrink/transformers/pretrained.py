"""Hugging Face transformers models stored as .ink files.

A compressed model directory is what ``inshrink compress model_dir`` (or
:func:`save_pretrained`) writes: every ``.safetensors`` file of the model (shards included)
as an ``.ink`` file at the same relative path, every other file (``config.json``, tokenizer
files, ``model.safetensors.index.json``) copied verbatim.

:func:`from_pretrained` loads such a directory with any ``from_pretrained`` class
(``AutoModelForCausalLM``, a model class, ``AutoTokenizer``...): it decompresses the
directory into a temporary directory, which transformers then loads as usual, and removes it
before returning. Decompression restores the original safetensors files byte for byte, so
everything transformers does with a model directory (shard indexes, tied weights, dtypes,
quantization configs) works unchanged, and a lossless model gives identical logits.

:class:`Callback` is a ``TrainerCallback`` that stores every checkpoint the ``Trainer`` saves
in an :class:`inshrink.Series`, and :func:`restore_checkpoint` writes one back as a checkpoint
directory for ``trainer.train(resume_from_checkpoint=...)``.

This module imports torch and transformers; ``import inshrink`` imports neither.

>>> from transformers import AutoModelForCausalLM                      # doctest: +SKIP
>>> import inshrink.transformers as ink                                 # doctest: +SKIP
>>> reports = ink.save_pretrained(model, "gpt2-ink/", tokenizer=tok)    # doctest: +SKIP
>>> model = ink.from_pretrained(AutoModelForCausalLM, "gpt2-ink/")      # doctest: +SKIP
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import tempfile
import warnings
from typing import Any, Mapping

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file as save_safetensors
from transformers import TrainerCallback

from .. import safetensors as convert
from ..errors import CorruptError, InshrinkError, InvalidArgumentError
from ..encode.policy import Policy
from ..series.series import MANIFEST, Series
from ..torch.convert import to_numpy, to_torch
from ..torch.state import GROUPS, MODEL, OPTIMIZER, STATE, decode_nested, encode_nested

__all__ = ["from_pretrained", "save_pretrained", "lossy_summary", "Callback",
           "checkpoint_to_numpy", "restore_checkpoint", "CHECKPOINT_METADATA"]


def lossy_summary(reports: list[convert.FileReport]) -> str | None:
    """One line on the quantized tensors of a directory conversion's reports (None when
    every tensor is exact): how many, and the worst relative L2 error."""
    infos = [t for r in reports for t in (r.tensors or [])]
    lossy = [t for t in infos if not t.lossless]
    if not lossy:
        return None
    errors = [e for t in lossy if isinstance(e := (t.error or {}).get("rel_l2_error"), float)]
    worst = f"max relative L2 error {max(errors):.3g}" if errors else "error not recorded"
    return f"LOSSY: {len(lossy)} of {len(infos)} tensors quantized ({worst})"


def from_pretrained(model_class: Any, path: str | os.PathLike, *,
                    threads: int | None = None, return_reports: bool = False,
                    tmp_dir: str | os.PathLike | None = None, **kwargs: Any) -> Any:
    """Load a compressed model directory with ``model_class.from_pretrained``.

    Parameters
    ----------
    model_class : type
        Anything with a ``from_pretrained(directory, **kwargs)`` class method
        (``AutoModelForCausalLM``, ``GPT2LMHeadModel``, ``AutoTokenizer``...).
    path : str or os.PathLike
        A local directory of ``.ink`` files and the model's other files. Links pointing
        outside it (a Hugging Face cache snapshot's links into ``blobs/``) are followed.
    threads : int, optional
        Decoder threads (default: every core).
    return_reports : bool
        Also return the per-file reports (each tensor's codec and, when quantized, error).
    tmp_dir : str or os.PathLike, optional
        Where the temporary directory goes (default: the system's, see :mod:`tempfile`);
        it needs room for the uncompressed model for the duration of the call.
    **kwargs
        Passed to ``model_class.from_pretrained`` (``torch_dtype``, ``device_map``...).

    Returns
    -------
    model, or (model, list of FileReport) with ``return_reports``
        A model from quantized tensors also gives a :class:`UserWarning` with the number of
        quantized tensors and the worst relative L2 error.

    Raises
    ------
    InvalidArgumentError
        ``path`` is not a directory or holds no ``.ink`` file.
    CorruptError
        A shard that a ``model.safetensors.index.json`` of ``path`` names is missing (checked
        before anything is decompressed). Errors of ``model_class.from_pretrained`` itself
        are raised as they are, with a note naming ``path`` beside the temporary copy.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise InvalidArgumentError(f"{path}: not a directory (give a compressed model "
                                   f"directory, as `inshrink compress model_dir` writes)")
    _check_shards(path)
    work = tempfile.mkdtemp(prefix="inshrink-model-", dir=tmp_dir)
    try:
        plain = os.path.join(work, os.path.basename(os.path.abspath(path)))
        reports = convert.decompress_directory(path, plain, follow_symlinks=True,
                                               threads=threads)
        try:
            model = model_class.from_pretrained(plain, **kwargs)
        except Exception as exc:
            # its message names the temporary copy, gone once this returns
            if hasattr(exc, "add_note"):  # Python 3.11+
                exc.add_note(f"inshrink: {plain} was the decompressed copy of {path}")
            raise
    finally:
        # a loaded model holds no reference to these files that removing them breaks
        shutil.rmtree(work, ignore_errors=True)
    summary = lossy_summary(reports)
    if summary:
        warnings.warn(f"{path}: {summary}", UserWarning, stacklevel=2)
    return (model, reports) if return_reports else model


def _check_shards(path: str) -> None:
    """Every shard a ``*.safetensors.index.json`` under ``path`` names is there (as an .ink
    file, or kept as safetensors): otherwise transformers would fail on a file of the
    temporary copy, named by a path that is gone when the user reads it."""
    for root, _, names in os.walk(path, followlinks=True):
        for index in (n for n in names if n.endswith(convert.SHARD_INDEX_SUFFIX)):
            try:
                with open(os.path.join(root, index), encoding="utf-8") as f:
                    shards = set(json.load(f)["weight_map"].values())
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # not an index transformers reads: left to it
            for shard in sorted(s for s in shards if isinstance(s, str)):
                stem = shard[:-len(".safetensors")] if shard.endswith(".safetensors") else shard
                if not any(os.path.isfile(os.path.join(root, n)) for n in (stem + ".ink", shard)):
                    raise CorruptError(
                        f"{os.path.join(root, stem + '.ink')}: missing, but "
                        f"{os.path.join(root, index)} names its shard {shard!r}")


def save_pretrained(model: Any, save_directory: str | os.PathLike,
                    policy: Policy | str | None = None, *, tokenizer: Any = None,
                    overwrite: bool = False, threads: int | None = None,
                    level: int | None = None, **kwargs: Any) -> list[convert.FileReport]:
    """``model.save_pretrained`` into a compressed model directory.

    The model (and ``tokenizer``, if given) is saved by transformers into a temporary
    directory beside ``save_directory``, which is then compressed into ``save_directory``
    atomically: a failure leaves no partial directory, and the temporary one is removed.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Anything with ``save_pretrained(directory, **kwargs)`` writing safetensors files.
    save_directory : str or os.PathLike
        The compressed directory to write.
    policy : Policy, str or None
        Lossy compression (a preset name such as ``"balanced"``, or a
        :class:`inshrink.Policy`); ``None``: lossless.
    tokenizer : optional
        Saved alongside (its files are copied verbatim).
    overwrite : bool
        Replace an existing ``save_directory`` (otherwise :class:`InvalidArgumentError`).
    threads, level : int, optional
        Encoder threads and zstd level.
    **kwargs
        Passed to ``model.save_pretrained`` (``max_shard_size``...).

    Returns
    -------
    list of FileReport
        One per file: sizes and, per tensor, codec and measured error
        (:func:`lossy_summary` makes one line of them).

    Raises
    ------
    InvalidArgumentError
        ``save_directory`` exists (without ``overwrite``), ``model`` has no
        ``save_pretrained`` or it wrote no ``.safetensors`` file (a tokenizer, a config).
    """
    if not callable(getattr(model, "save_pretrained", None)):
        raise InvalidArgumentError(f"model must have a save_pretrained method (a transformers "
                                   f"model), got {type(model).__name__}")
    save_directory = os.fspath(save_directory)
    target = os.path.abspath(save_directory)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    if os.path.exists(target) and not overwrite:
        raise InvalidArgumentError(f"{save_directory} exists (pass overwrite=True to "
                                   f"replace it)")
    work = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=parent)
    try:
        model.save_pretrained(work, **kwargs)
        if not any(n.endswith(".safetensors") for _, _, names in os.walk(work) for n in names):
            # else the error would name the temporary directory
            raise InvalidArgumentError(f"{type(model).__name__}.save_pretrained wrote no "
                                       f".safetensors file: nothing to compress (a tokenizer "
                                       f"goes in tokenizer=)")
        if tokenizer is not None:
            tokenizer.save_pretrained(work)
        return convert.compress_directory(work, save_directory, overwrite=overwrite,
                                          policy=policy, threads=threads, level=level)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- Trainer checkpoints in a series ---------------------------------------------------------

CHECKPOINT_METADATA = "inshrink.transformers.pretrained.checkpoint"
"""Metadata key of a series checkpoint made from a Trainer checkpoint directory: JSON listing
each file of the directory and how it is stored."""

FILE = "file."
"""Tensor-name prefix of a file kept as it is (a uint8 tensor of its bytes)."""

OPTIMIZER_FILE = "optimizer.pt"
_FORMAT = 1


def _optimizer_arrays(state_dict: Any, arrays: dict[str, np.ndarray]) -> dict:
    """An optimizer state dict's tensors into ``arrays`` (named as :mod:`inshrink.torch` names
    them, so that policies see their roles); the rest as JSON-able data."""
    if not isinstance(state_dict, dict) or not all(isinstance(k, str) for k in state_dict):
        raise InvalidArgumentError("not an optimizer state dict")
    doc = {}
    for key, value in state_dict.items():
        if key == "state" and isinstance(value, dict):
            # [index, values] pairs: JSON object keys would turn integer indices into strings
            doc[key] = [[k, encode_nested(v, f"{STATE}{k}", arrays)] for k, v in value.items()]
        elif key == "param_groups" and isinstance(value, list):
            doc[key] = [encode_nested(g, f"{GROUPS}{i}", arrays) for i, g in enumerate(value)]
        else:
            doc[key] = encode_nested(value, f"{OPTIMIZER}{key}", arrays)
    return doc


def _optimizer_state(doc: dict, tensors: Mapping[str, np.ndarray]) -> dict:
    """The inverse of :func:`_optimizer_arrays`."""
    used: set[str] = set()
    state = {}
    for key, value in doc.items():
        if key == "state":
            state[key] = {k: decode_nested(v, f"{STATE}{k}", tensors, used) for k, v in value}
        elif key == "param_groups":
            state[key] = [decode_nested(g, f"{GROUPS}{i}", tensors, used) for i, g in enumerate(value)]
        else:
            state[key] = decode_nested(value, f"{OPTIMIZER}{key}", tensors, used)
    return state


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
            doc = _optimizer_arrays(state, found)
        except (pickle.UnpicklingError, InvalidArgumentError, RuntimeError):
            pass  # something else than tensors and plain data: kept as it is, below
        else:
            arrays.update(found)
            return {"path": rel, "kind": "optimizer", "state": doc}
    arrays[FILE + rel] = _read_bytes(full)
    return {"path": rel, "kind": "file"}


def _checkpoint_doc(metadata: Mapping[str, str]) -> list[dict]:
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
    files = _checkpoint_doc(series.metadata(step))
    tensors = series.load(step)
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
        raise CorruptError(f"step {step} of {series.directory}: {CHECKPOINT_METADATA!r} "
                           f"names {exc}, which the checkpoint lacks") from None
    except (TypeError, ValueError, AttributeError) as exc:  # metadata of another shape
        raise CorruptError(f"step {step} of {series.directory}: {CHECKPOINT_METADATA!r} "
                           f"is malformed ({type(exc).__name__}: {exc})") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return directory


def _write_file(path: str, entry: dict, tensors: Mapping[str, np.ndarray]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    kind = entry.get("kind")
    if kind == "safetensors":
        save_safetensors({n: to_torch(tensors[MODEL + n]) for n in entry["tensors"]}, path,
                         metadata=entry.get("metadata"))
    elif kind == "optimizer":
        buffer = io.BytesIO()
        torch.save(_optimizer_state(entry["state"], tensors), buffer)
        with open(path, "wb") as f:
            f.write(buffer.getvalue())
    elif kind == "file":
        with open(path, "wb") as f:
            f.write(np.ascontiguousarray(tensors[FILE + entry["path"]]).tobytes())
    else:
        raise CorruptError(f"{entry['path']}: unknown storage kind {kind!r}")


class Callback(TrainerCallback):
    """Store every checkpoint the ``Trainer`` saves in an :class:`inshrink.Series`.

    After each save (``on_save``, on the main process) the checkpoint directory
    ``output_dir/checkpoint-<step>`` goes into the series as step ``<step>`` (see
    :func:`checkpoint_to_numpy`), and the stored step is read back and compared with what was
    stored (:meth:`verify_step`: every lossless tensor bit for bit, every quantized one within
    the error its report gives). The next save rewrites that step as a delta against the new
    one; it is then decoded again and must give the same values. The Trainer's own directory
    is left as it is (with ``save_total_limit`` the Trainer rotates it as usual), or, with
    ``remove_checkpoint=True``, removed only once both checks passed (the newest step's at
    the end of training): a step that fails one keeps its directory, gets a
    :class:`UserWarning` and is listed in :attr:`unverified`.
    :meth:`restore` writes a step back. A series takes only steps after its latest: training
    that starts before it (a rerun from scratch, a resume from an older step) is refused
    with :class:`InvalidArgumentError` when it begins (``on_train_begin``).

    Parameters
    ----------
    series_dir : str or os.PathLike
        The series' directory.
    policy : Policy, str or None
        Compression of weights and optimizer moments (``"balanced"``...); ``None``:
        lossless, and training resumes exactly as from the Trainer's own checkpoint.
    remove_checkpoint : bool
        Remove the Trainer's checkpoint directory once stored and verified.
    keep_last : int, optional
        Keep only the newest this many steps in the series (as ``save_total_limit`` does for
        the Trainer's directories), deleting older ones after each save
        (:meth:`inshrink.Series.retain`); None: keep every step.
    **series_kwargs
        ``keyframe_every``, ``threads``, ``search``: see :class:`inshrink.Series`.

    Attributes
    ----------
    reports : dict
        Step -> the tensor report of its save.
    unverified : dict
        Step -> why its stored copy failed the check (its Trainer directory was kept).

    Examples
    --------
    >>> cb = Callback("ckpts-ink/", remove_checkpoint=True, keep_last=3)  # doctest: +SKIP
    >>> Trainer(model, args, train_dataset=data, callbacks=[cb]).train()  # doctest: +SKIP
    >>> trainer.train(resume_from_checkpoint=cb.restore("out/resume"))    # doctest: +SKIP
    """

    def __init__(self, series_dir: str | os.PathLike, policy: Policy | str | None = None, *,
                 remove_checkpoint: bool = False, keep_last: int | None = None,
                 **series_kwargs: Any) -> None:
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise InvalidArgumentError("keep_last must be a positive integer or None")
        self.series = Series(series_dir, policy, **series_kwargs)
        self.remove_checkpoint = remove_checkpoint
        self.keep_last = keep_last
        self.reports: dict[int, list] = {}
        self.unverified: dict[int, str] = {}
        # the newest checked step: (step, its Trainer directory, digests of its tensors)
        self._pending: tuple[int, str, dict[str, bytes]] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # a series takes only steps after its latest: refuse before training, not at a save
        latest = self.series.latest()
        if state.is_world_process_zero and latest is not None and latest > state.global_step:
            later = [s for s in self.series.steps() if s > state.global_step]
            raise InvalidArgumentError(
                f"{self.series.directory} already holds step(s) {later} after step "
                f"{state.global_step}, where this training starts, and a series only takes "
                f"steps after its latest: resume from step {latest} "
                f"(callback.restore(dir)), or give the Callback a new directory")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
        step = int(state.global_step)
        directory = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if not os.path.isdir(directory):
            raise InvalidArgumentError(f"{directory}: the Trainer's checkpoint is missing")
        arrays, metadata = checkpoint_to_numpy(directory)
        self.reports[step] = report = self.series.save(step, arrays, metadata)
        problem, digests = self._verify(step, arrays, report)
        del arrays  # one checkpoint in memory at a time
        self._settle_previous()  # rewritten as a delta against this step by the save
        if problem is not None:
            self._failed(step, problem, directory)
        else:
            self._pending = (step, directory, digests)
        if self.keep_last is not None:
            self.series.retain(self.keep_last)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # the newest step stays a whole file, checked when it was saved: done with it
        if self._pending is not None and self.remove_checkpoint:
            shutil.rmtree(self._pending[1], ignore_errors=True)
        self._pending = None

    def _settle_previous(self) -> None:
        """The step saved before the newest one: once the save rewrote it as a delta, decode
        it again and compare with what it decoded to when it was checked; then (or at once,
        if it stayed whole) its Trainer directory may go."""
        if self._pending is None:
            return
        step, directory, digests = self._pending
        self._pending = None
        entry = next((e for e in self.series.checkpoints() if e.step == step), None)
        problem = None
        if entry is not None and not entry.keyframe:
            try:
                decoded = self.series.load(step)
                if {n: _digest(a) for n, a in decoded.items()} != digests:
                    problem = "as a delta it decodes to other values than it was saved with"
            except (InshrinkError, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
        if problem is not None:
            self._failed(step, f"{problem} (after its rewrite as a delta)", directory)
        elif self.remove_checkpoint and os.path.isdir(directory):
            shutil.rmtree(directory)

    def _failed(self, step: int, problem: str, directory: str) -> None:
        self.unverified[step] = problem
        warnings.warn(f"step {step}: the compressed copy in {self.series.directory} failed "
                      f"its check ({problem}); {directory} is kept", UserWarning, stacklevel=3)

    def verify_step(self, step: int, arrays: Mapping[str, np.ndarray],
                    report: list) -> str | None:
        """Decode ``step`` from the series (checking the file's hash, every chunk's checksum
        and any delta's base) and compare it with ``arrays``, what was saved: lossless
        tensors bit for bit, quantized ones within the relative L2 error of ``report``.
        Returns None if it matches, else what is wrong."""
        return self._verify(step, arrays, report)[0]

    def _verify(self, step: int, arrays: Mapping[str, np.ndarray],
                report: list) -> tuple[str | None, dict[str, bytes]]:
        """:meth:`verify_step`, and a digest of each decoded tensor (for the check after the
        step is rewritten as a delta)."""
        try:
            decoded = self.series.load(step)
        except (InshrinkError, OSError) as exc:
            return f"{type(exc).__name__}: {exc}", {}
        if decoded.keys() != arrays.keys():
            return "the stored tensors are not the saved ones", {}
        infos = {info.name: info for info in report}
        for name, original in arrays.items():
            got, info = decoded[name], infos.get(name)
            if got.shape != original.shape or got.dtype != original.dtype:
                return f"tensor {name!r}: shape or dtype differs", {}
            if info is None or info.lossless:
                if not np.array_equal(_bytes_of(got), _bytes_of(original)):
                    return f"tensor {name!r}: not bit-exact", {}
                continue
            bound = (info.error or {}).get("rel_l2_error")
            if isinstance(bound, (int, float)) and np.isfinite(bound):
                reference = original.astype(np.float64)
                norm = float(np.linalg.norm(reference))
                error = float(np.linalg.norm(got.astype(np.float64) - reference))
                if error > (bound * (1 + 1e-3) + 1e-6) * norm:
                    return (f"tensor {name!r}: relative L2 error "
                            f"{error / norm if norm else error:.4g} above the reported "
                            f"{bound:.4g}"), {}
        return None, {name: _digest(a) for name, a in decoded.items()}

    def restore(self, directory: str | os.PathLike, step: int | None = None, *,
                overwrite: bool = False) -> str:
        """Write checkpoint ``step`` (default: the latest) as a Trainer checkpoint directory;
        see :func:`restore_checkpoint`. Returns ``directory``."""
        return restore_checkpoint(self.series, directory, step, overwrite=overwrite)


def _digest(array: np.ndarray) -> bytes:
    """A digest of the array's dtype, shape and bytes."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{array.dtype.str}{array.shape}".encode())
    h.update(_bytes_of(array))
    return h.digest()


def _bytes_of(array: np.ndarray) -> np.ndarray:
    """The array's bytes as a flat uint8 view (a copy only if it is not contiguous)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)
