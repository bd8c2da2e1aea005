"""Model and optimizer state as named numpy arrays plus JSON metadata, and back.

Tensor names follow the conventions :func:`inshrink.encode.roles.role_of` recognises:
``model.<state_dict name>`` for parameters and buffers, ``optimizer.state.<index>.<key>`` for
optimizer state; everything else of the optimizer (parameter groups, scalars) is JSON in the
metadata under :data:`OPTIMIZER_METADATA`.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..errors import InvalidArgumentError
from .convert import to_numpy, to_torch

__all__ = ["MODEL", "OPTIMIZER", "STATE", "GROUPS", "OPTIMIZER_METADATA", "encode_nested",
           "decode_nested", "encode_optimizer", "decode_optimizer", "names_list",
           "state_to_numpy", "load_state"]

MODEL = "model."
OPTIMIZER = "optimizer."
STATE = "optimizer.state."
GROUPS = "optimizer.param_groups."
OPTIMIZER_METADATA = "inshrink.torch.optimizer"
_FORMAT = 1

# JSON cannot tell a tuple from a list, nor hold a tensor: such values become tagged objects
_TUPLE = "__tuple__"
_TENSOR = "__tensor__"

# optimizer state that has its parameter's shape, checked on load
_PER_ELEMENT = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer",
                          "square_avg", "acc_delta", "sum"})


def names_list(names: Sequence[str], limit: int = 10) -> str:
    """A bounded, readable list of names for an error message."""
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


# -- nested values as JSON plus named arrays -------------------------------------------------

def encode_nested(value: Any, name: str, arrays: dict[str, np.ndarray]) -> Any:
    """``value`` as JSON-able data; its tensors go to ``arrays`` under names from their path."""
    if isinstance(value, torch.Tensor):
        if name in arrays:
            raise InvalidArgumentError(f"two optimizer values map to the tensor name {name!r}")
        arrays[name] = to_numpy(value, name)
        return {_TENSOR: None}
    if isinstance(value, tuple):
        return {_TUPLE: [encode_nested(v, f"{name}.{i}", arrays) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode_nested(v, f"{name}.{i}", arrays) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise InvalidArgumentError(f"{name}: dictionaries need string keys to be stored")
        return {k: encode_nested(v, f"{name}.{k}", arrays) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise InvalidArgumentError(f"{name}: cannot store a {type(value).__name__} value")


def decode_nested(data: Any, name: str, tensors: Mapping[str, np.ndarray], used: set[str]) -> Any:
    """The inverse of :func:`encode_nested`."""
    if isinstance(data, dict):
        if set(data) == {_TENSOR}:
            if name not in tensors:
                raise InvalidArgumentError(f"the checkpoint lacks the optimizer tensor {name!r}")
            used.add(name)
            return to_torch(tensors[name])
        if set(data) == {_TUPLE}:
            return tuple(decode_nested(v, f"{name}.{i}", tensors, used)
                         for i, v in enumerate(data[_TUPLE]))
        return {k: decode_nested(v, f"{name}.{k}", tensors, used) for k, v in data.items()}
    if isinstance(data, list):
        return [decode_nested(v, f"{name}.{i}", tensors, used) for i, v in enumerate(data)]
    return data


def encode_optimizer(state_dict: Any, arrays: dict[str, np.ndarray],
                     prefix: str = OPTIMIZER) -> dict:
    """An optimizer's ``state_dict()`` as JSON-able data, its tensors into ``arrays``.

    Tensors are named ``<prefix>state.<index>.<key>`` and ``<prefix>param_groups.<group>.<key>``
    (with the default prefix, as :func:`state_to_numpy` names them, so that policies see their
    roles); the integer keys of ``state`` are kept as ``[index, values]`` pairs (JSON object
    keys would turn them into strings). Undone by :func:`decode_optimizer`.
    """
    if not isinstance(state_dict, dict) or not all(isinstance(k, str) for k in state_dict):
        raise InvalidArgumentError(f"{prefix.rstrip('.')}: not an optimizer state dict")
    doc = {}
    for key, value in state_dict.items():
        if key == "state" and isinstance(value, dict):
            doc[key] = [[k, encode_nested(v, f"{prefix}state.{k}", arrays)]
                        for k, v in value.items()]
        elif key == "param_groups" and isinstance(value, list):
            doc[key] = [encode_nested(g, f"{prefix}param_groups.{i}", arrays)
                        for i, g in enumerate(value)]
        else:
            doc[key] = encode_nested(value, f"{prefix}{key}", arrays)
    return doc


def decode_optimizer(doc: Mapping[str, Any], tensors: Mapping[str, np.ndarray],
                     used: set[str], prefix: str = OPTIMIZER) -> dict:
    """The optimizer state dict :func:`encode_optimizer` stored; the tensor names it takes go
    into ``used``. A document of another shape raises ``TypeError`` or ``ValueError``, a
    missing tensor :class:`InvalidArgumentError`: the caller names the file."""
    state = {}
    for key, value in doc.items():
        if key == "state":
            state[key] = {k: decode_nested(v, f"{prefix}state.{k}", tensors, used)
                          for k, v in value}
        elif key == "param_groups":
            state[key] = [decode_nested(g, f"{prefix}param_groups.{i}", tensors, used)
                          for i, g in enumerate(value)]
        else:
            state[key] = decode_nested(value, f"{prefix}{key}", tensors, used)
    return state


def _optimizer_to_numpy(optimizer: torch.optim.Optimizer,
                        arrays: dict[str, np.ndarray]) -> str:
    """Put the optimizer's tensors into ``arrays``; return the rest as JSON."""
    state_dict = optimizer.state_dict()
    # [key, values] pairs: JSON object keys would turn the integer indices into strings
    state = [[key, {k: encode_nested(v, f"{STATE}{key}.{k}", arrays) for k, v in values.items()}]
             for key, values in state_dict["state"].items()]
    groups = [encode_nested(group, f"{GROUPS}{g}", arrays)
              for g, group in enumerate(state_dict["param_groups"])]
    return json.dumps({"format": _FORMAT, "state": state, "param_groups": groups})


def _optimizer_from_numpy(optimizer: torch.optim.Optimizer, tensors: Mapping[str, np.ndarray],
                          metadata: Mapping[str, str], used: set[str]) -> dict:
    """The optimizer state_dict that ``tensors`` and ``metadata`` describe, checked against
    ``optimizer``'s parameters."""
    try:
        doc = json.loads(metadata[OPTIMIZER_METADATA])
        state, groups = doc["state"], doc["param_groups"]
        if doc.get("format") != _FORMAT:
            raise ValueError(f"unknown format {doc.get('format')!r}")
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"the metadata holds no optimizer state "
                                   f"({OPTIMIZER_METADATA!r}: {exc})") from None
    state_dict = {
        "state": {key: {k: decode_nested(v, f"{STATE}{key}.{k}", tensors, used)
                        for k, v in values.items()} for key, values in state},
        "param_groups": [decode_nested(group, f"{GROUPS}{g}", tensors, used)
                         for g, group in enumerate(groups)],
    }
    _check_optimizer(optimizer, state_dict)
    return state_dict


def _check_optimizer(optimizer: torch.optim.Optimizer, state_dict: dict) -> None:
    """Raise unless ``state_dict`` fits the optimizer's groups and parameter shapes."""
    groups = state_dict["param_groups"]
    sizes = [len(g["params"]) for g in groups]
    expected = [len(g["params"]) for g in optimizer.param_groups]
    if sizes != expected:
        raise InvalidArgumentError(f"the checkpoint's optimizer has parameter groups of sizes "
                                   f"{sizes}, this optimizer {expected}")
    params = {index: p for saved, live in zip(groups, optimizer.param_groups)
              for index, p in zip(saved["params"], live["params"])}
    for index, values in state_dict["state"].items():
        param = params.get(index)
        if param is None:
            raise InvalidArgumentError(f"optimizer state for unknown parameter {index!r}")
        for key, value in values.items():
            if key in _PER_ELEMENT and isinstance(value, torch.Tensor) \
                    and value.shape != param.shape:
                raise InvalidArgumentError(
                    f"{STATE}{index}.{key} has shape {tuple(value.shape)}, its parameter "
                    f"{tuple(param.shape)}")


# -- model and optimizer state -------------------------------------------------------------

def require_module(model: Any) -> None:
    """InvalidArgumentError unless ``model`` is a ``torch.nn.Module``."""
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(f"model must be a torch.nn.Module, got "
                                   f"{type(model).__name__}")


def require_optimizer(optimizer: Any) -> None:
    """InvalidArgumentError unless ``optimizer`` reads and writes its state as a
    ``torch.optim.Optimizer`` does."""
    if not (callable(getattr(optimizer, "state_dict", None))
            and callable(getattr(optimizer, "load_state_dict", None))
            and hasattr(optimizer, "param_groups")):
        raise InvalidArgumentError(f"optimizer must be a torch.optim.Optimizer (with "
                                   f"state_dict(), load_state_dict() and param_groups), got "
                                   f"{type(optimizer).__name__}")


def _check_objects(model: Any, optimizer: Any) -> None:
    """A model and an optimizer of the types the state functions read (or None)."""
    if model is not None:
        require_module(model)
    if optimizer is not None:
        require_optimizer(optimizer)


def state_to_numpy(model: torch.nn.Module | None = None,
                   optimizer: torch.optim.Optimizer | None = None,
                   ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A model's and an optimizer's state as named numpy arrays plus string metadata.

    Parameters
    ----------
    model : torch.nn.Module, optional
        Its ``state_dict()`` (parameters and persistent buffers) becomes ``model.<name>``.
    optimizer : torch.optim.Optimizer, optional
        Its tensors become ``optimizer.state.<index>.<key>`` (and
        ``optimizer.param_groups.<group>.<key>`` for tensor hyperparameters); everything else
        (hyperparameters, non-tensor state) is JSON under the metadata key
        ``"inshrink.torch.optimizer"``.

    Returns
    -------
    tensors : dict of str to numpy.ndarray
        CPU tensors' arrays share their memory (nothing is copied), so save them before the
        next optimizer step. bf16/fp8 are :mod:`ml_dtypes` arrays; 0-d tensors (Adam's
        ``step``) 0-d arrays.
    metadata : dict of str to str
        What :func:`load_state` needs besides the tensors.
    """
    _check_objects(model, optimizer)
    arrays: dict[str, np.ndarray] = {}
    metadata: dict[str, str] = {}
    if model is not None:
        for name, value in model.state_dict().items():
            if not isinstance(value, torch.Tensor):
                raise InvalidArgumentError(f"{MODEL}{name}: model state that is not a tensor "
                                           f"({type(value).__name__}) cannot be stored")
            arrays[MODEL + name] = to_numpy(value, MODEL + name)
    if optimizer is not None:
        metadata[OPTIMIZER_METADATA] = _optimizer_to_numpy(optimizer, arrays)
    return arrays, metadata


def versions_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list:
    """The model's parameters and the optimizer's state tensors with their version counters
    now (an in-place operation on a tensor raises its counter; ``.data`` bypasses it)."""
    tensors = list(model.parameters()) + [
        value for state in optimizer.state.values() for value in state.values()
        if isinstance(value, torch.Tensor)]
    return [(t, t._version) for t in tensors]


def check_versions(versions: list, step: int) -> None:
    """Raise :class:`InvalidArgumentError` if a tensor of :func:`versions_of` changed since."""
    changed = sum(t._version != v for t, v in versions)
    if changed:
        raise InvalidArgumentError(
            f"{changed} parameter or optimizer tensors changed while the in-place save of "
            f"step {step} read them (with async_staging='in_place' they may change only in "
            f"optimizer.step(), which waits for the save): step {step} was not saved")


_META = ("{} is on the meta device: load_state_dict would copy nothing into it (and the "
         "optimizer's state would follow it there); give the model memory first, e.g. "
         "model.to_empty(device='cpu')")


def _model_state(model: torch.nn.Module, tensors: Mapping[str, np.ndarray], strict: bool,
                 used: set[str]) -> dict[str, torch.Tensor]:
    """The model state_dict held by ``tensors``, checked against the model's."""
    live = model.state_dict()
    missing = [MODEL + n for n in live if MODEL + n not in tensors]
    extra = [n for n in tensors if n.startswith(MODEL) and n[len(MODEL):] not in live]
    if strict and (missing or extra):
        raise InvalidArgumentError(
            "the checkpoint does not match the model: "
            + "; ".join(f"{what} {names_list(names)}" for what, names in
                        (("missing", missing), ("unexpected", extra)) if names))
    state = {}
    for name, current in live.items():
        if MODEL + name not in tensors:
            continue
        value = to_torch(tensors[MODEL + name])
        if isinstance(current, torch.Tensor) and current.is_meta:
            raise InvalidArgumentError(_META.format(f"{MODEL}{name}"))
        if isinstance(current, torch.Tensor) and value.shape != current.shape:
            raise InvalidArgumentError(f"{MODEL}{name} has shape {tuple(value.shape)}, the "
                                       f"model expects {tuple(current.shape)}")
        state[name] = value
        used.add(MODEL + name)
    return state


def load_state(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None,
               model: torch.nn.Module | None = None,
               optimizer: torch.optim.Optimizer | None = None, strict: bool = True) -> None:
    """Load what :func:`state_to_numpy` produced into a model and/or an optimizer.

    Everything is checked before either is modified.

    Parameters
    ----------
    tensors : mapping of str to numpy.ndarray
        E.g. from :func:`inshrink.load` or :meth:`inshrink.Series.load`. The optimizer takes
        over arrays of its own dtype without a copy (as ``torch.load`` does), so do not reuse
        them afterwards.
    metadata : mapping of str to str
        Needed with an optimizer (its hyperparameters and non-tensor state).
    model, optimizer : optional
        What to load into; tensors of the other one are ignored.
    strict : bool
        Raise for model tensors missing from ``tensors`` and for names that neither the model
        nor the optimizer use.

    Raises
    ------
    InvalidArgumentError
        Names missing or unexpected (named in the message), wrong shapes, a model on the
        meta device, optimizer groups that differ, no optimizer metadata.
    """
    if not isinstance(tensors, Mapping):
        raise InvalidArgumentError("tensors must be a mapping of names to arrays")
    _check_objects(model, optimizer)
    used: set[str] = set()
    model_state = None if model is None else _model_state(model, tensors, strict, used)
    optimizer_state = None
    if optimizer is not None:
        optimizer_state = _optimizer_from_numpy(optimizer, tensors, metadata or {}, used)
    unused = [n for n in tensors if n not in used
              and not (model is None and n.startswith(MODEL))
              and not (optimizer is None and n.startswith(OPTIMIZER))]
    if strict and unused:
        raise InvalidArgumentError(f"unexpected tensors in the checkpoint: {names_list(unused)}")
    try:
        if model_state is not None:
            model.load_state_dict(model_state, strict=strict)
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise InvalidArgumentError(f"torch refused the checkpoint: {exc}") from None
