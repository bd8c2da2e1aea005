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

Trainer checkpoints are in :mod:`.checkpoints` and :mod:`.callback`.

>>> from transformers import AutoModelForCausalLM                      # doctest: +SKIP
>>> import inshrink.transformers as ink                                 # doctest: +SKIP
>>> reports = ink.save_pretrained(model, "gpt2-ink/", tokenizer=tok)    # doctest: +SKIP
>>> model = ink.from_pretrained(AutoModelForCausalLM, "gpt2-ink/")      # doctest: +SKIP
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from typing import Any

from .. import safetensors as convert
from ..errors import CorruptError, InvalidArgumentError
from ..encode.policy import Policy

__all__ = ["from_pretrained", "save_pretrained", "lossy_summary"]


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
