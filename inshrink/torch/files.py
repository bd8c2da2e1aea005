"""``safetensors.torch``'s calls for .ink files: torch tensors in, torch tensors out.

:func:`save_file` / :func:`load_file`, :func:`save` / :func:`load` (bytes) and
:func:`save_model` / :func:`load_model` take and give what their ``safetensors.torch``
namesakes do, with the same rule for tensors that share memory: :func:`save_file` refuses
them, naming them; :func:`save_model` keeps one name per shared storage and records the others
in the metadata, and :func:`load_model` ties them again. Differences: errors are
:class:`inshrink.errors.InvalidArgumentError` (a ``ValueError``) instead of ``RuntimeError``;
a non-contiguous tensor that shares memory with no other is stored (as its values, contiguous)
instead of refused; ``policy`` compresses lossily.

This module imports torch; ``import inshrink`` does not.

>>> from inshrink.torch import load_file, save_file                   # doctest: +SKIP
>>> save_file(model.state_dict(), "model.ink")                        # doctest: +SKIP
>>> model.load_state_dict(load_file("model.ink"))                     # doctest: +SKIP
"""
from __future__ import annotations

import os
import tempfile
from typing import Mapping

import torch

from .. import api
from ..errors import InvalidArgumentError
from ..encode.policy import Policy
from ..io.info import TensorInfo
from .convert import to_numpy, to_torch
from .state import _META, require_module

__all__ = ["save_file", "load_file", "save", "load", "save_model", "load_model"]


# -- shared memory, as safetensors.torch finds it ------------------------------------------------

def _storage(tensor: torch.Tensor) -> tuple:
    storage = tensor.untyped_storage()
    return tensor.device, storage.data_ptr(), storage.nbytes()


def _end(tensor: torch.Tensor) -> int:
    if tensor.numel() == 0:
        return tensor.data_ptr()
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
    return tensor.data_ptr() + (last + 1) * tensor.element_size()


def _shared_groups(tensors: Mapping[str, torch.Tensor]) -> list[set[str]]:
    """Groups of names whose tensors overlap in memory (one storage, overlapping bytes), as
    ``safetensors.torch._find_shared_tensors`` groups them. Empty storages and meta tensors
    share nothing."""
    by_storage: dict[tuple, set[str]] = {}
    for name, tensor in tensors.items():
        if tensor.device.type == "meta":
            continue
        key = _storage(tensor)
        if key[1] != 0 and key[2] != 0:
            by_storage.setdefault(key, set()).add(name)
    groups = []
    for names in sorted(by_storage.values(), key=sorted):
        areas = sorted((tensors[n].data_ptr(), _end(tensors[n]), n) for n in names)
        group, stop = {areas[0][2]}, areas[0][1]
        for start, end, name in areas[1:]:
            if start >= stop:  # the same storage, disjoint bytes: not shared
                groups.append(group)
                group = set()
            group.add(name)
            stop = max(stop, end)
        groups.append(group)
    return [g for g in groups if len(g) > 1]


def _checked(tensors: Mapping[str, torch.Tensor]) -> None:
    if not isinstance(tensors, Mapping):
        raise InvalidArgumentError(f"expected a dict of str to torch.Tensor, got "
                                   f"{type(tensors).__name__}")
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise InvalidArgumentError(f"tensor names must be str, got {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise InvalidArgumentError(f"{name!r}: expected a torch.Tensor, got "
                                       f"{type(tensor).__name__}")
        if tensor.layout != torch.strided:
            raise InvalidArgumentError(f"{name!r}: {tensor.layout} tensors are not supported; "
                                       f"convert with .to_dense() first")
        if tensor.device.type == "meta":
            raise InvalidArgumentError(f"{name!r}: a meta tensor has no data to save")
    shared = _shared_groups(tensors)
    if shared:
        listed = "; ".join(", ".join(sorted(g)) for g in shared)
        raise InvalidArgumentError(
            f"some tensors share memory: {listed}. Saving them would store the memory twice "
            f"and load them as separate tensors: save one name per storage, or use "
            f"save_model(model, ...), which keeps one and ties the others on load_model")


# -- files -----------------------------------------------------------------------------------

def save_file(tensors: Mapping[str, torch.Tensor], filename: str | os.PathLike,
              metadata: Mapping[str, str] | None = None, *,
              policy: Policy | str | None = None,
              threads: int | None = None) -> list[TensorInfo]:
    """Save torch tensors into an .ink file, as ``safetensors.torch.save_file`` does.

    Parameters
    ----------
    tensors : dict of str to torch.Tensor
        Any dtype inshrink stores (float64/32/16, bfloat16, float8_e4m3fn/e5m2, complex,
        signed and unsigned integers, bool), any shape (0-d and empty too), on any device
        (copied to the host). Tensors sharing memory are refused (see the module's docstring).
    filename : str or os.PathLike
        Destination, written atomically.
    metadata : dict of str to str, optional
        Kept verbatim.
    policy : Policy, str or None
        Lossy compression (a preset name or a :class:`inshrink.Policy`); ``None``: lossless.
    threads : int, optional
        Encoder threads (default: every core).

    Returns
    -------
    list of TensorInfo
        Per tensor: codec, sizes, and the measured error of a lossy one.

    Raises
    ------
    InvalidArgumentError
        Not a dict of tensors, a sparse or meta tensor, tensors sharing memory, a dtype
        inshrink cannot store.
    """
    _checked(tensors)
    arrays = {name: to_numpy(tensor, name) for name, tensor in tensors.items()}
    return api.save(filename, arrays, metadata, policy=policy, threads=threads)


def load_file(filename: str | os.PathLike, device: str | int | torch.device = "cpu", *,
              threads: int | None = None) -> dict[str, torch.Tensor]:
    """Load an .ink file as a dict of torch tensors, as ``safetensors.torch.load_file`` does.

    Parameters
    ----------
    filename : str or os.PathLike
        An .ink file (not a delta file of a series: read that with :class:`inshrink.Series`).
    device : str, int or torch.device
        Where the tensors go (an int is a CUDA device index, as in safetensors). One this
        machine lacks raises :class:`InvalidArgumentError` before the file is read.
    threads : int, optional
        Decoder threads (default: every core).

    Returns
    -------
    dict of str to torch.Tensor
        Each with its stored dtype and shape, writable, ready for ``load_state_dict``.
    """
    try:  # before the file is read: a device this machine lacks fails only on use
        device = (torch.device("cuda", device) if isinstance(device, int)
                  else torch.device(device))
        torch.empty(0, device=device)
    except (RuntimeError, TypeError, AssertionError) as exc:
        raise InvalidArgumentError(f"device {device!r}: {exc}") from None
    arrays = api.load(filename, threads=threads, mmap=False)
    return {name: to_torch(array).to(device) for name, array in arrays.items()}


# -- bytes -----------------------------------------------------------------------------------

def save(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str] | None = None, *,
         policy: Policy | str | None = None, threads: int | None = None) -> bytes:
    """The bytes of the .ink file :func:`save_file` would write."""
    with tempfile.TemporaryDirectory(prefix="inshrink-") as tmp:
        path = os.path.join(tmp, "tensors.ink")
        save_file(tensors, path, metadata, policy=policy, threads=threads)
        with open(path, "rb") as f:
            return f.read()


def load(data: bytes, device: str | int | torch.device = "cpu", *,
         threads: int | None = None) -> dict[str, torch.Tensor]:
    """Tensors from the bytes of an .ink file (what :func:`save` returns)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"expected bytes, got {type(data).__name__}")
    with tempfile.TemporaryDirectory(prefix="inshrink-") as tmp:
        path = os.path.join(tmp, "tensors.ink")
        with open(path, "wb") as f:
            f.write(data)
        return load_file(path, device, threads=threads)


# -- modules ---------------------------------------------------------------------------------

def _is_complete(tensor: torch.Tensor) -> bool:
    """The tensor covers its whole storage (so that it can stand for every alias of it)."""
    return (tensor.data_ptr() == tensor.untyped_storage().data_ptr()
            and tensor.numel() * tensor.element_size() == tensor.untyped_storage().nbytes())


def save_model(model: torch.nn.Module, filename: str | os.PathLike,
               metadata: dict[str, str] | None = None, force_contiguous: bool = True, *,
               policy: Policy | str | None = None,
               threads: int | None = None) -> list[TensorInfo]:
    """Save a module's state dict, shared parameters (tied embeddings) once, as
    ``safetensors.torch.save_model`` does: each dropped name is recorded in the metadata as
    ``{dropped: kept}`` (unless the metadata already has that key).

    ``force_contiguous`` is accepted for compatibility: inshrink always stores values
    contiguously. Other parameters as :func:`save_file`.
    """
    require_module(model)
    state = model.state_dict()
    metadata = dict(metadata or {})
    for group in _shared_groups(state):
        complete = sorted(n for n in group if _is_complete(state[n]))
        if not complete:
            raise InvalidArgumentError(
                f"tensors {', '.join(sorted(group))} share memory and none covers it whole: "
                f"refusing to save them (the file would hold more than the model)")
        for name in sorted(group - {complete[0]}):
            metadata.setdefault(name, complete[0])
            del state[name]
    return save_file(state, filename, metadata, policy=policy, threads=threads)


def load_model(model: torch.nn.Module, filename: str | os.PathLike, strict: bool = True,
               device: str | int | torch.device = "cpu", *,
               threads: int | None = None) -> tuple[list[str], list[str]]:
    """Load a file written by :func:`save_model` (or :func:`save_file`) into ``model``, as
    ``safetensors.torch.load_model`` does: names dropped because they shared memory are
    expected missing (the module ties them itself).

    Returns
    -------
    (missing, unexpected) : tuple of list of str
        Names the module has that the file lacks (shared names excluded), and names the file
        has that the module lacks. With ``strict``, either being non-empty raises
        :class:`InvalidArgumentError` before anything is loaded; so does a tensor whose
        shape differs from the module's, or a module on the meta device, strict or not.
    """
    require_module(model)
    state = load_file(filename, device, threads=threads)
    own = model.state_dict()
    for name in sorted(set(state) & set(own)):
        if isinstance(own[name], torch.Tensor) and own[name].is_meta:
            raise InvalidArgumentError(_META.format(repr(name)))
        # load_state_dict would copy the tensors that fit, then raise RuntimeError
        if isinstance(own[name], torch.Tensor) and state[name].shape != own[name].shape:
            raise InvalidArgumentError(
                f"{os.fspath(filename)} does not match the model: {name!r} has shape "
                f"{tuple(state[name].shape)}, the model expects {tuple(own[name].shape)}")
    shared = {n for g in _shared_groups(own) for n in g}
    missing = sorted(set(own) - set(state) - shared)
    unexpected = sorted(set(state) - set(own))
    if strict and (missing or unexpected):
        raise InvalidArgumentError(f"{os.fspath(filename)} does not match the model: missing "
                                   f"{missing}, unexpected {unexpected}")
    model.load_state_dict(state, strict=False)
    return missing, unexpected
