"""The rest of a training run's state, beside the model and the optimizer: the learning-rate
scheduler, the random number generators and any object with ``state_dict()`` /
``load_state_dict()`` (DCP's ``Stateful`` protocol), as named arrays plus one JSON document.

Tensors are named ``training.<path>`` and stored as their raw bits (floats viewed as unsigned
integers of the same width), so that no policy or search ever quantizes them; everything else
is JSON, through :func:`encode_nested`. Nothing is pickled: a value JSON cannot hold is refused
when saving, naming it, and loading a file never runs code.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch

from .. import dtypes
from ..errors import InvalidArgumentError
from ..encode.roles import LOSSY_DTYPES
from .state import decode_nested, encode_nested, names_list

__all__ = ["TRAINING", "TRAINING_METADATA", "capture", "decode", "TrainingState",
           "raw_bits", "from_raw_bits"]

TRAINING = "training."
"""Name prefix of the training state's arrays."""
TRAINING_METADATA = "inshrink.torch.training"
"""Metadata key of the training state's JSON document."""
_FORMAT = 1
_BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_MT19937_WORDS = 624


def check_extra(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    """``extra`` as a dict, every value a Stateful (``state_dict`` and ``load_state_dict``)."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise InvalidArgumentError("extra must be a mapping of names to objects with "
                                   "state_dict() and load_state_dict()")
    for name, value in extra.items():
        if not isinstance(name, str) or not name or "." in name:
            raise InvalidArgumentError(f"extra: names must be non-empty strings without '.', "
                                       f"got {name!r}")
        if not (callable(getattr(value, "state_dict", None))
                and callable(getattr(value, "load_state_dict", None))):
            raise InvalidArgumentError(f"extra[{name!r}] ({type(value).__name__}) has no "
                                       f"state_dict() and load_state_dict()")
    return dict(extra)


def _rng(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """Python's, numpy's global, torch's CPU and (once CUDA is in use) every CUDA device's
    generator state; saving does not initialize CUDA."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    arrays[TRAINING + "rng.numpy"] = np.array(keys, np.uint32)
    doc = {"python": encode_nested(random.getstate(), TRAINING + "rng.python", arrays),
           "numpy": {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss),
                     "cached_gaussian": float(cached)},
           "cuda": 0}
    arrays[TRAINING + "rng.torch"] = torch.get_rng_state().numpy().copy()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # else never drawn from
        states = torch.cuda.get_rng_state_all()
        for i, state in enumerate(states):
            arrays[f"{TRAINING}rng.cuda.{i}"] = state.cpu().numpy().copy()
        doc["cuda"] = len(states)
    return doc


def capture(scheduler: Any = None, extra: Mapping[str, Any] | None = None,
            rng: bool = True) -> tuple[dict[str, np.ndarray], str]:
    """The training state as arrays (``training.*``) plus a JSON document.

    Parameters
    ----------
    scheduler : optional
        A learning-rate scheduler (anything with ``state_dict()``).
    extra : mapping of str to Stateful, optional
        Further objects, by name.
    rng : bool
        Include the random number generators' states.

    Returns
    -------
    arrays : dict of str to numpy.ndarray
        Copies, never views of live state; floats as raw bits.
    document : str
        JSON, for the metadata key :data:`TRAINING_METADATA`.

    Raises
    ------
    InvalidArgumentError
        A value that is neither a tensor nor JSON-able (named by its path, e.g.
        ``training.extra.loader.sampler``), or a dictionary with keys that are not strings.
    """
    arrays: dict[str, np.ndarray] = {}
    doc: dict[str, Any] = {"format": _FORMAT}
    if scheduler is not None:
        doc["scheduler"] = encode_nested(scheduler.state_dict(), TRAINING + "scheduler", arrays)
    doc["extra"] = {name: encode_nested(obj.state_dict(), f"{TRAINING}extra.{name}", arrays)
                    for name, obj in check_extra(extra).items()}
    if rng:
        doc["rng"] = _rng(arrays)
    doc["bits"] = raw_bits(arrays)
    try:
        return arrays, json.dumps(doc)
    except (TypeError, ValueError) as exc:  # e.g. a dict key encode_nested let through
        raise InvalidArgumentError(f"the training state cannot be stored as JSON: "
                                   f"{exc}") from None


def raw_bits(arrays: dict[str, np.ndarray]) -> dict[str, str]:
    """Replace every array of ``arrays`` by a copy (never a view of state that training
    changes), floats by their raw bits as unsigned integers of the same width, so that no
    policy or search quantizes them; return ``{name: dtype name}`` of the floats, for
    :func:`from_raw_bits`."""
    bits = {}
    for name, array in arrays.items():
        array = np.array(array, copy=True)
        kind = dtypes.of_numpy(array.dtype).name
        if kind in LOSSY_DTYPES:
            array = array.view(_BITS[array.dtype.itemsize])
            bits[name] = kind
        arrays[name] = array
    return bits


def from_raw_bits(name: str, array: np.ndarray, kind: Any, where: str) -> np.ndarray:
    """The float array of dtype name ``kind`` whose bits :func:`raw_bits` stored as
    ``array``; InvalidArgumentError (naming ``where`` and ``name``) when they do not fit."""
    if kind not in LOSSY_DTYPES or array.dtype.kind != "u" or \
            array.dtype.itemsize != dtypes.by_name(kind).itemsize:
        raise InvalidArgumentError(f"{where}: {name} is {array.dtype}, not the bits of {kind!r}")
    return array.view(dtypes.by_name(kind).numpy)


@dataclass
class TrainingState:
    """A decoded training state, checked, not yet applied (see :func:`decode`)."""

    scheduler: dict | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    python_rng: tuple | None = None
    numpy_rng: tuple | None = None
    torch_rng: torch.Tensor | None = None
    cuda_rng: list[torch.Tensor] = field(default_factory=list)

    def apply(self, scheduler: Any = None, extra: Mapping[str, Any] | None = None,
              rng: bool = True) -> None:
        """Load the state into ``scheduler`` and ``extra`` and, with ``rng``, the random
        number generators. An object that refuses its state raises InvalidArgumentError."""
        targets = [("scheduler", scheduler, self.scheduler)] if scheduler is not None else []
        targets += [(f"extra[{n!r}]", obj, self.extra[n]) for n, obj in (extra or {}).items()]
        for what, obj, state in targets:
            try:
                obj.load_state_dict(state)
            except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise InvalidArgumentError(f"{what} refused its checkpointed state: "
                                           f"{exc}") from None
        if rng and self.torch_rng is not None:
            random.setstate(self.python_rng)
            np.random.set_state(self.numpy_rng)
            torch.set_rng_state(self.torch_rng)
            if self.cuda_rng and torch.cuda.is_available():
                for i, state in enumerate(self.cuda_rng[:torch.cuda.device_count()]):
                    torch.cuda.set_rng_state(state, i)


def _python_rng(value: Any) -> tuple:
    """``random.setstate``'s argument, checked (it accepts nothing else)."""
    ok = (isinstance(value, tuple) and len(value) == 3 and value[0] == 3
          and isinstance(value[1], tuple) and len(value[1]) == _MT19937_WORDS + 1
          and all(type(v) is int and 0 <= v < 2 ** 32 for v in value[1][:-1])
          and type(value[1][-1]) is int and 0 <= value[1][-1] <= _MT19937_WORDS
          and (value[2] is None or type(value[2]) is float))
    if not ok:
        raise InvalidArgumentError("the checkpoint's Python random state is malformed")
    return value


def decode(document: str | None, arrays: Mapping[str, np.ndarray], *,
           scheduler: bool, extra: Mapping[str, Any] | None, rng: bool,
           where: str) -> TrainingState:
    """Check and decode what :func:`capture` stored, against what will take it.

    Parameters
    ----------
    document : str or None
        The JSON document (None: the checkpoint holds no training state).
    arrays : mapping of str to numpy.ndarray
        The checkpoint's ``training.*`` arrays (others are ignored).
    scheduler : bool
        Whether a scheduler will take its state (the checkpoint must then hold one).
    extra : mapping of str to Stateful, optional
        The objects that will take theirs: the checkpoint must hold exactly these names.
    rng : bool
        Whether the generators' states will be restored.
    where : str
        Names the checkpoint in error messages.

    Raises
    ------
    InvalidArgumentError
        No training state while some is asked for, missing or unexpected extras or arrays,
        a malformed document or generator state; each message names ``where``.
    """
    extra = extra or {}
    if document is None:
        if scheduler or extra:
            raise InvalidArgumentError(f"{where}: the checkpoint holds no training state "
                                       f"(saved without a scheduler or extras)")
        return TrainingState()
    try:
        doc = json.loads(document)
        if type(doc) is not dict or doc.get("format") != _FORMAT:
            raise ValueError(f"unknown format {doc.get('format') if type(doc) is dict else doc!r}")
        bits = doc.get("bits", {})
        stored_extra = doc.get("extra", {})
        if type(bits) is not dict or type(stored_extra) is not dict:
            raise ValueError("'bits' and 'extra' must be objects")
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgumentError(f"{where}: unreadable training state "
                                   f"({TRAINING_METADATA!r}: {exc})") from None
    tensors: dict[str, np.ndarray] = {}
    for name, array in arrays.items():
        if not name.startswith(TRAINING):
            continue
        tensors[name] = from_raw_bits(name, array, bits[name], where) if name in bits else array
    used: set[str] = set()
    state = TrainingState()
    missing = []
    if scheduler:
        if "scheduler" not in doc:
            missing.append("scheduler")
        else:
            state.scheduler = decode_nested(doc["scheduler"], TRAINING + "scheduler", tensors,
                                            used)
    missing += [f"extra[{n!r}]" for n in extra if n not in stored_extra]
    unexpected = [f"extra[{n!r}]" for n in stored_extra if n not in extra]
    if missing or unexpected:
        raise InvalidArgumentError(
            f"{where}: the checkpoint's training state does not match: "
            + "; ".join(f"{what} {names_list(names)}" for what, names in
                        (("missing", missing), ("unexpected", unexpected)) if names))
    state.extra = {n: decode_nested(stored_extra[n], f"{TRAINING}extra.{n}", tensors, used)
                   for n in extra}
    if rng and "rng" in doc:
        _decode_rng(doc["rng"], tensors, used, state, where)
    elif "rng" in doc:
        used.update(n for n in tensors if n.startswith(TRAINING + "rng."))
    if not scheduler and "scheduler" in doc:  # saved with one, restored without: ignored
        used.update(n for n in tensors if n.startswith(TRAINING + "scheduler"))
    unused = [n for n in tensors if n not in used]
    if unused:
        raise InvalidArgumentError(f"{where}: unexpected training-state arrays: "
                                   f"{names_list(unused)}")
    return state


def _decode_rng(doc: Any, tensors: Mapping[str, np.ndarray], used: set[str],
                state: TrainingState, where: str) -> None:
    try:
        keys = tensors[TRAINING + "rng.numpy"]
        torch_state = tensors[TRAINING + "rng.torch"]
        numpy_doc = doc["numpy"]
        cuda = doc["cuda"]
        if keys.dtype != np.uint32 or keys.shape != (_MT19937_WORDS,):
            raise ValueError("numpy's key is not 624 uint32 words")
        if torch_state.dtype != np.uint8 or torch_state.shape != tuple(
                torch.get_rng_state().shape):
            raise ValueError("torch's state is not a uint8 vector of its generator's size")
        if type(cuda) is not int or not 0 <= cuda <= 4096:
            raise ValueError("bad CUDA device count")
        cuda_states = [tensors[f"{TRAINING}rng.cuda.{i}"] for i in range(cuda)]
        if any(s.dtype != np.uint8 or s.ndim != 1 for s in cuda_states):
            raise ValueError("a CUDA state is not a uint8 vector")
        numpy_state = (str(numpy_doc["kind"]), keys.copy(), int(numpy_doc["pos"]),
                       int(numpy_doc["has_gauss"]), float(numpy_doc["cached_gaussian"]))
        if numpy_state[0] != "MT19937" or not 0 <= numpy_state[2] <= _MT19937_WORDS:
            raise ValueError("numpy's state is not an MT19937 state")
        python = _python_rng(decode_nested(doc["python"], TRAINING + "rng.python", tensors,
                                           used))
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{where}: malformed random generator state "
                                   f"({exc})") from None
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{where}: {exc}") from None
    used.update([TRAINING + "rng.numpy", TRAINING + "rng.torch"]
                + [f"{TRAINING}rng.cuda.{i}" for i in range(cuda)])
    state.python_rng, state.numpy_rng = python, numpy_state
    state.torch_rng = torch.from_numpy(torch_state.copy())
    state.cuda_rng = [torch.from_numpy(s.copy()) for s in cuda_states]
