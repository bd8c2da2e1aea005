"""Hugging Face transformers models stored as .ink files.

A compressed model directory is what ``inshrink compress model_dir`` (or
:func:`save_pretrained`) writes: every ``.safetensors`` file of the model (shards included)
as an ``.ink`` file at the same relative path, every other file (``config.json``, tokenizer
files, ``model.safetensors.index.json``) copied verbatim.

:func:`from_pretrained` loads such a directory with any ``from_pretrained`` class, in one of
three ways:

* **Models** (a ``PreTrainedModel`` class such as ``GPT2LMHeadModel``, or an auto class such
  as ``AutoModelForCausalLM``): the weight files transformers would read (``model.ink``, or
  the shards a ``model.safetensors.index.json`` names) are decoded in memory and given to
  transformers' own ``from_pretrained`` as its ``state_dict``, the compressed directory being
  the ``config`` (and the source of ``generation_config.json``); the files are decoded
  first, on the calling thread and the decoder's pool. Nothing is written to disk.
  Transformers assigns the decoded tensors to the parameters as they are (a copy only where a
  ``dtype`` or a ``device_map`` asks for another dtype or device), ties the tied weights and
  resolves ``dtype="auto"`` from the config as it does for a safetensors directory, so a
  lossless model gives bit-identical parameters and logits. The decoded tensors being the
  parameters, a load holds the weights once, plus a chunk being decoded per thread.
* **Classes that read only the files stored verbatim** (tokenizers, configs, processors,
  feature extractors, image and video processors, ``GenerationConfig`` and their auto
  classes) load the compressed directory itself.
* **Everything else** goes through a temporary directory: the compressed directory is
  decompressed into it (byte for byte the original safetensors files), the class loads that,
  and it is removed before returning. That is the case for classes of other libraries,
  remote code (the auto class named in the config's ``auto_map``), quantized checkpoints
  (a ``quantization_config``), ``gguf_file``, ``use_safetensors=False``, a config's
  ``transformers_weights`` and weights stored under other names (an adapter, a ``.bin``).

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
from ..encode.policy import Policy
from ..errors import CorruptError, InshrinkError, InvalidArgumentError, with_path
from ..io.file import File
from ..io.info import TensorInfo

__all__ = ["from_pretrained", "save_pretrained", "lossy_summary"]

WEIGHTS = "model.safetensors"
"""The weight file transformers reads from a model directory, unsharded."""

# classes whose from_pretrained reads only configs, tokenizer and processor files: the
# compressed directory holds those verbatim (looked up in transformers by name)
_VERBATIM_CLASSES = ("PreTrainedTokenizerBase", "PretrainedConfig", "GenerationConfig",
                     "ProcessorMixin", "FeatureExtractionMixin", "ImageProcessingMixin",
                     "BaseVideoProcessor", "AutoTokenizer", "AutoConfig", "AutoProcessor",
                     "AutoFeatureExtractor", "AutoImageProcessor", "AutoVideoProcessor")


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

    A model class gets the decoded weights as its ``state_dict``, without a temporary
    directory; a tokenizer, config or processor class loads the compressed directory
    directly; anything else loads a temporary decompressed copy (see the module's
    documentation for which case applies when).

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
        Also return the per-file reports (each tensor's codec and, when quantized, error),
        one per file of ``path`` as :func:`inshrink.safetensors.decompress_directory`
        gives them, whether or not a file was written.
    tmp_dir : str or os.PathLike, optional
        Where the temporary directory goes when one is used (default: the system's, see
        :mod:`tempfile`); it needs room for the uncompressed model for the duration of the
        call.
    **kwargs
        Passed to ``model_class.from_pretrained`` (``dtype``, ``device_map``,
        ``output_loading_info``, config attributes...).

    Returns
    -------
    model, or (model, list of FileReport) with ``return_reports``
        What ``model_class.from_pretrained`` returns. Weights from quantized tensors also
        give a :class:`UserWarning` with the number of quantized tensors and the worst
        relative L2 error.

    Raises
    ------
    InvalidArgumentError
        ``path`` is not a directory or holds no ``.ink`` file.
    CorruptError
        A shard that a ``model.safetensors.index.json`` of ``path`` names is missing
        (checked before anything is decoded); a weight file is not a valid .ink file or its
        records are damaged (the error names the file). Errors of ``model_class.from_pretrained``
        itself are raised as they are (with a note naming ``path`` when they name a
        temporary copy).
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise InvalidArgumentError(f"{path}: not a directory (give a compressed model "
                                   f"directory, as `inshrink compress model_dir` writes)")
    _, files = convert._walk(path, follow_symlinks=True)  # (what decompression would refuse)
    if not any(rel.endswith(".ink") for rel, _, _ in files):
        raise InvalidArgumentError(f"{path} holds no .ink files (subdirectories included): "
                                   f"nothing to load")
    _check_shards(path)
    if _reads_verbatim_files(model_class):
        loaded, decoded = model_class.from_pretrained(path, **kwargs), {}
    else:
        plan = _direct_plan(model_class, path, kwargs)
        if plan is None:
            return _through_temporary(model_class, path, threads, return_reports, tmp_dir,
                                      kwargs)
        loaded, decoded = _load_model(*plan, path, threads, kwargs, return_reports)
    summary = lossy_summary(list(decoded.values()))
    if summary:
        warnings.warn(f"{path}: {summary}", UserWarning, stacklevel=2)
    if not return_reports:
        return loaded
    return loaded, [decoded.get(rel) or _report(rel, source, outside)
                    for rel, source, outside in files]


def _reads_verbatim_files(model_class: Any) -> bool:
    import transformers
    bases = tuple(getattr(transformers, name) for name in _VERBATIM_CLASSES
                  if hasattr(transformers, name))
    return isinstance(model_class, type) and issubclass(model_class, bases)


def _direct_plan(model_class: Any, path: str,
                 kwargs: dict) -> tuple[type, list[str]] | None:
    """The ``PreTrainedModel`` class that ``model_class.from_pretrained(path, **kwargs)``
    builds and the .ink weight files it would read, or None where the weights cannot be
    given as a state dict (see the module's documentation)."""
    from transformers import AutoConfig, PretrainedConfig, PreTrainedModel
    from transformers.models.auto.auto_factory import _BaseAutoModelClass, _get_model_class
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    if not isinstance(model_class, type):
        return None
    if any(kwargs.get(k) is not None for k in ("gguf_file", "quantization_config")) \
            or kwargs.get("use_safetensors") is False:
        return None
    base = os.path.join(path, kwargs.get("subfolder") or "")
    config = kwargs.get("config")
    if isinstance(config, PretrainedConfig):
        settings = config.to_dict()
    else:
        where = os.fspath(config) if config is not None else base
        try:
            with open(os.path.join(where, "config.json"), encoding="utf-8") as f:
                settings = json.load(f)
        except (OSError, ValueError):
            return None  # transformers' own error, from the temporary copy
        if not isinstance(settings, dict):
            return None
    if settings.get("quantization_config") or settings.get("transformers_weights"):
        return None
    if issubclass(model_class, PreTrainedModel):
        cls = model_class
    elif issubclass(model_class, _BaseAutoModelClass):
        if model_class.__name__ in (settings.get("auto_map") or {}):
            return None  # remote code: transformers fetches it from the directory
        # the config class from the model type, as AutoConfig finds it, without building
        # a config that the model class then reads again
        mapping = model_class._model_mapping
        model_type = settings.get("model_type")
        config_class = (type(config) if isinstance(config, PretrainedConfig)
                        else CONFIG_MAPPING[model_type]
                        if isinstance(model_type, str) and model_type in CONFIG_MAPPING
                        else None)
        if config_class is None or config_class not in mapping:
            return None  # transformers' own error (or inference) from the temporary copy
        cls = mapping[config_class]
        if isinstance(cls, (list, tuple)):  # several: the config's architectures choose
            if not isinstance(config, PretrainedConfig):
                config = AutoConfig.from_pretrained(
                    config if config is not None else path,
                    subfolder=kwargs.get("subfolder") or "",
                    trust_remote_code=kwargs.get("trust_remote_code"))
            cls = _get_model_class(config, mapping)
    else:
        return None
    weights = _weight_files(base, kwargs.get("variant"))
    return None if weights is None else (cls, weights)


def _variant(name: str, variant: str | None) -> str:
    """``name`` with transformers' ``variant`` before its last suffix
    (``model.safetensors`` -> ``model.fp16.safetensors``)."""
    if not variant:
        return name
    stem, _, suffix = name.rpartition(".")
    return f"{stem}.{variant}.{suffix}"


def _ink_name(safetensors_name: str) -> str:
    return safetensors_name[:-len(".safetensors")] + ".ink"


def _weight_files(base: str, variant: str | None) -> list[str] | None:
    """The .ink files of the weights transformers would read in ``base`` (its single file
    first, then a shard index, as transformers looks for them); None if they are not all
    .ink files."""
    single = os.path.join(base, _ink_name(_variant(WEIGHTS, variant)))
    if os.path.isfile(single):
        return [single]
    index = os.path.join(base, _variant(WEIGHTS + ".index.json", variant))
    if not os.path.isfile(index):
        return None
    shards = _index_shards(index)
    if shards is None or not all(s.endswith(".safetensors") for s in shards):
        return None
    files = [os.path.join(base, _ink_name(s)) for s in sorted(shards)]
    return files if all(os.path.isfile(f) for f in files) else None


def _index_shards(index: str) -> set | None:
    """The shard names of a shard index (those that are strings); None if it is not an
    index transformers reads."""
    try:
        with open(index, encoding="utf-8") as f:
            shards = set(json.load(f)["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return {s for s in shards if isinstance(s, str)}


def _load_model(cls: type, weights: list[str], path: str, threads: int | None,
                kwargs: dict, reports: bool = True) -> tuple[Any, dict[str, convert.FileReport]]:
    """``cls.from_pretrained`` with the decoded ``weights`` as its state dict; the reports
    of the files decoded, by their path relative to ``path`` (``reports``: with the sizes of
    the safetensors files they would decompress to, else with their tensors' bytes).

    The files are opened (their headers and indexes checked) and decoded before
    transformers builds the model.
    """
    from transformers import GenerationConfig
    files, decoded = [], {}
    try:
        for weight in weights:
            try:
                convert.check_ink(weight)
                files.append(File(weight, threads=threads, mmap=False))
            except InshrinkError as exc:
                raise with_path(exc, weight) from None
            report = _file_report(os.path.relpath(weight, path), weight, None, files[-1],
                                  sized=reports)
            decoded[report.source] = report
        kwargs = dict(kwargs)
        kwargs.setdefault("config", path)  # read as transformers reads it: kwargs update it
        base = os.path.join(path, kwargs.get("subfolder") or "")
        if kwargs.get("generation_config") is None and os.path.isfile(
                os.path.join(base, "generation_config.json")):
            # with a state dict transformers has no directory to read it from
            kwargs["generation_config"] = GenerationConfig.from_pretrained(base)
        # decoded first, then handed over: decoding beside transformers' model construction
        # (mostly Python) made both wait for the GIL, 1.8x slower on an idle machine
        state_dict = _decode(files)
        for f in files:  # the decoded tensors do not need them
            f.close()
        loaded = cls.from_pretrained(None, state_dict=state_dict, **kwargs)
        del state_dict  # the model holds the tensors it took
    finally:
        for f in files:
            f.close()
    model = loaded[0] if kwargs.get("output_loading_info") else loaded
    model.config.name_or_path = path  # as loading the directory sets it
    model.name_or_path = path
    return loaded, decoded


def _decode(files: list[File]) -> dict:
    """Every tensor of ``files`` as a torch tensor (errors name the file); later files'
    tensors replace earlier ones of the same name, as transformers merges shards."""
    from ..torch.convert import to_torch
    state_dict: dict = {}
    for f in files:
        try:
            arrays = f.load()
        except InshrinkError as exc:
            raise with_path(exc, f.path) from None
        # name order within a file, as transformers reads a safetensors file's keys: the
        # first floating tensor is what dtype="auto" uses when the config says no dtype
        for name in sorted(arrays):
            state_dict[name] = to_torch(arrays[name])
    return state_dict


def _file_report(rel: str, source: str, outside: str | None, f: File,
                 sized: bool = True) -> convert.FileReport:
    """The report of an .ink file as decompressing it would give it (``sized``: with the
    size of the safetensors file it would decompress to; else its tensors' bytes)."""
    infos: list[TensorInfo] = f.infos()
    size = sum(i.nbytes for i in infos)
    try:
        if sized:
            header = convert._header_for(f)
            size = header.data_start + header.data_size
    except InshrinkError:  # a dtype safetensors lacks: what its tensors hold
        pass
    return convert.FileReport(rel, _safetensors_name(rel), os.path.getsize(source), size,
                              infos, outside)


def _safetensors_name(rel: str) -> str:
    return rel[:-len(".ink")] + ".safetensors"


def _report(rel: str, source: str, outside: str | None) -> convert.FileReport:
    """The report of a file not decoded: a verbatim one, or an .ink file's from its index."""
    if not rel.endswith(".ink"):
        size = os.path.getsize(source)
        return convert.FileReport(rel, rel, size, size, None, outside)
    try:
        with File(source, threads=1) as f:
            return _file_report(rel, source, outside, f)
    except InshrinkError as exc:
        raise with_path(exc, source) from None


def _through_temporary(model_class: Any, path: str, threads: int | None,
                       return_reports: bool, tmp_dir: str | os.PathLike | None,
                       kwargs: dict) -> Any:
    """``model_class.from_pretrained`` of a decompressed copy of ``path`` in a temporary
    directory, removed before returning."""
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
        warnings.warn(f"{path}: {summary}", UserWarning, stacklevel=3)
    return (model, reports) if return_reports else model


def _check_shards(path: str) -> None:
    """Every shard a ``*.safetensors.index.json`` under ``path`` names is there (as an .ink
    file, or kept as safetensors), before anything is decoded: otherwise transformers would
    fail later, on a state dict lacking tensors or on a file of a temporary copy named by a
    path that is gone when the user reads it."""
    for root, _, names in os.walk(path, followlinks=True):
        for index in (n for n in names if n.endswith(convert.SHARD_INDEX_SUFFIX)):
            shards = _index_shards(os.path.join(root, index))
            for shard in sorted(shards or ()):  # not an index transformers reads: left to it
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
