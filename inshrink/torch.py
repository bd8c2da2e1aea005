"""PyTorch integration: model and optimizer state as named arrays, gradient capture, and a
:class:`Checkpointer` for training loops.

Only this module imports torch; ``import inshrink`` never does. Tensor names follow the
conventions :func:`inshrink.policy.role_of` recognises: ``model.<state_dict name>`` for
parameters and buffers, ``optimizer.state.<index>.<key>`` for optimizer state (``exp_avg``,
``exp_avg_sq``, ``momentum_buffer``, ``step``...).

>>> ckpt = Checkpointer("ckpts/", model, optimizer, eval_batches=batches)  # doctest: +SKIP
>>> ckpt.save(step)                                                        # doctest: +SKIP
>>> step = ckpt.restore()                                                  # doctest: +SKIP
"""
from __future__ import annotations

__all__ = ["Checkpointer", "GradientEMA", "quality_from", "state_to_numpy", "load_state",
           "to_numpy", "to_torch", "OPTIMIZER_METADATA", "SEARCH_METADATA",
           "save_file", "load_file", "save_model", "load_model", "save", "load"]

import contextlib
import functools
import json
import logging
import math
import os
import time
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import ml_dtypes
import numpy as np
import torch
from torch.func import functional_call

from .dtypes import as_numpy
from .errors import InvalidArgumentError
from .policy import Policy, resolve
from .search import Quality, Search, SearchSpace
from .series import SEARCH_KEY as SEARCH_METADATA, Series
from .torch_files import load, load_file, load_model, save, save_file, save_model

MODEL = "model."
OPTIMIZER = "optimizer."
STATE = "optimizer.state."
GROUPS = "optimizer.param_groups."
OPTIMIZER_METADATA = "inshrink.torch.optimizer"
PEAK_LR_METADATA = "inshrink.torch.peak_lr"
EPSILON_FLOOR = 0.1
"""With ``epsilon_follows_lr``, the bound never falls below this share of ``epsilon`` (a
schedule that decays to zero would otherwise demand lossless weights at its end)."""
LATE_LR = 0.5
"""Checkpoints saved while the learning rate is below this share of its peak store the first
moment as the search space's ``late_exp_avg`` (see :class:`inshrink.search.SearchSpace`)."""
_FORMAT = 1
_LOG = logging.getLogger(__name__)

# JSON cannot tell a tuple from a list, nor hold a tensor: such values become tagged objects
_TUPLE = "__tuple__"
_TENSOR = "__tensor__"

# numpy dtypes torch cannot wrap directly, viewed through a same-width integer
_VIA_INT = {
    np.dtype(ml_dtypes.bfloat16): (np.int16, torch.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3fn): (np.int8, torch.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e5m2): (np.int8, torch.float8_e5m2),
}

# optimizer state that has its parameter's shape, checked on load
_PER_ELEMENT = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer",
                          "square_avg", "acc_delta", "sum"})


# -- conversions ---------------------------------------------------------------------------

def to_numpy(tensor: torch.Tensor, name: str = "tensor") -> np.ndarray:
    """A CPU tensor's data as a numpy array, sharing its memory where possible.

    bf16 and fp8 come back as :mod:`ml_dtypes` arrays (viewed, not converted);
    non-contiguous tensors and tensors on other devices are copied.
    """
    if tensor.layout != torch.strided:
        raise InvalidArgumentError(f"{name}: {tensor.layout} tensors are not supported")
    tensor = tensor.detach().cpu().resolve_conj().resolve_neg()
    try:
        return as_numpy(tensor.contiguous())
    except (TypeError, RuntimeError) as exc:  # e.g. complex32, quantized tensors
        raise InvalidArgumentError(f"{name}: cannot convert {tensor.dtype}: {exc}") from None


def to_torch(array: np.ndarray) -> torch.Tensor:
    """A numpy array (ml_dtypes bf16/fp8 included) as a CPU tensor sharing its memory.

    Read-only arrays (memory maps) are copied: torch tensors are always writable.
    """
    array = as_numpy(array)
    if not array.flags.writeable:
        array = array.copy()
    via = _VIA_INT.get(array.dtype)
    if via is not None:
        return torch.from_numpy(array.view(via[0])).view(via[1])
    return torch.from_numpy(array)


def _names(names: Sequence[str], limit: int = 10) -> str:
    """A bounded, readable list of names for an error message."""
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


# -- optimizer state as JSON plus named arrays ---------------------------------------------

def _encode(value: Any, name: str, arrays: dict[str, np.ndarray]) -> Any:
    """``value`` as JSON-able data; its tensors go to ``arrays`` under names from their path."""
    if isinstance(value, torch.Tensor):
        if name in arrays:
            raise InvalidArgumentError(f"two optimizer values map to the tensor name {name!r}")
        arrays[name] = to_numpy(value, name)
        return {_TENSOR: None}
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v, f"{name}.{i}", arrays) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{name}.{i}", arrays) for i, v in enumerate(value)]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise InvalidArgumentError(f"{name}: dictionaries need string keys to be stored")
        return {k: _encode(v, f"{name}.{k}", arrays) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise InvalidArgumentError(f"{name}: cannot store a {type(value).__name__} value")


def _decode(data: Any, name: str, tensors: Mapping[str, np.ndarray], used: set[str]) -> Any:
    """The inverse of :func:`_encode`."""
    if isinstance(data, dict):
        if set(data) == {_TENSOR}:
            if name not in tensors:
                raise InvalidArgumentError(f"the checkpoint lacks the optimizer tensor {name!r}")
            used.add(name)
            return to_torch(tensors[name])
        if set(data) == {_TUPLE}:
            return tuple(_decode(v, f"{name}.{i}", tensors, used)
                         for i, v in enumerate(data[_TUPLE]))
        return {k: _decode(v, f"{name}.{k}", tensors, used) for k, v in data.items()}
    if isinstance(data, list):
        return [_decode(v, f"{name}.{i}", tensors, used) for i, v in enumerate(data)]
    return data


def _optimizer_to_numpy(optimizer: torch.optim.Optimizer,
                        arrays: dict[str, np.ndarray]) -> str:
    """Put the optimizer's tensors into ``arrays``; return the rest as JSON."""
    state_dict = optimizer.state_dict()
    # [key, values] pairs: JSON object keys would turn the integer indices into strings
    state = [[key, {k: _encode(v, f"{STATE}{key}.{k}", arrays) for k, v in values.items()}]
             for key, values in state_dict["state"].items()]
    groups = [_encode(group, f"{GROUPS}{g}", arrays)
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
        "state": {key: {k: _decode(v, f"{STATE}{key}.{k}", tensors, used)
                        for k, v in values.items()} for key, values in state},
        "param_groups": [_decode(group, f"{GROUPS}{g}", tensors, used)
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


def _model_state(model: torch.nn.Module, tensors: Mapping[str, np.ndarray], strict: bool,
                 used: set[str]) -> dict[str, torch.Tensor]:
    """The model state_dict held by ``tensors``, checked against the model's."""
    live = model.state_dict()
    missing = [MODEL + n for n in live if MODEL + n not in tensors]
    extra = [n for n in tensors if n.startswith(MODEL) and n[len(MODEL):] not in live]
    if strict and (missing or extra):
        raise InvalidArgumentError(
            "the checkpoint does not match the model: "
            + "; ".join(f"{what} {_names(names)}" for what, names in
                        (("missing", missing), ("unexpected", extra)) if names))
    state = {}
    for name, current in live.items():
        if MODEL + name not in tensors:
            continue
        value = to_torch(tensors[MODEL + name])
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
        Names missing or unexpected (named in the message), wrong shapes, optimizer groups
        that differ, no optimizer metadata.
    """
    if not isinstance(tensors, Mapping):
        raise InvalidArgumentError("tensors must be a mapping of names to arrays")
    used: set[str] = set()
    model_state = None if model is None else _model_state(model, tensors, strict, used)
    optimizer_state = None
    if optimizer is not None:
        optimizer_state = _optimizer_from_numpy(optimizer, tensors, metadata or {}, used)
    unused = [n for n in tensors if n not in used
              and not (model is None and n.startswith(MODEL))
              and not (optimizer is None and n.startswith(OPTIMIZER))]
    if strict and unused:
        raise InvalidArgumentError(f"unexpected tensors in the checkpoint: {_names(unused)}")
    try:
        if model_state is not None:
            model.load_state_dict(model_state, strict=strict)
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise InvalidArgumentError(f"torch refused the checkpoint: {exc}") from None


# -- gradient capture ----------------------------------------------------------------------

class GradientEMA:
    """An exponential moving average of each parameter's gradient, for importance scores
    (|g·w|), and optionally of its square, for curvature (the search's per-tensor bins).

    ``EMA_t = beta * g_t + (1 - beta) * EMA_{t-1}`` (``EMA_0 = 0``; ``beta`` weights the
    newest gradient), the same for ``g_t**2`` with ``squares``, kept on the CPU in float32:
    one extra fp32 copy of the parameters (two with ``squares``).

    Parameters
    ----------
    model : torch.nn.Module
        Its parameters that require gradients are tracked.
    beta : float
        Weight of the newest gradient, in (0, 1].
    auto : bool
        Update after every backward pass through ``register_post_accumulate_grad_hook``. With
        gradient accumulation over micro-batches, pass False and call :meth:`update` once per
        optimizer step instead (a hook sees each partial sum).
    active : bool
        Whether updates are captured; switch it on some steps before a checkpoint to skip the
        copies the rest of the time.
    window : int, optional
        With ``auto``: capture only the last ``window`` backward passes before the next
        checkpoint, expected ``interval`` passes after :meth:`start_interval` (the paper
        records ~50 batches before each checkpoint). None: every pass.
    squares : bool
        Also average the squared gradients (:meth:`curvature`).
    """

    def __init__(self, model: torch.nn.Module, beta: float = 0.9, *, auto: bool = True,
                 active: bool = True, window: int | None = None,
                 squares: bool = False) -> None:
        if not (isinstance(beta, (int, float)) and 0 < beta <= 1):
            raise InvalidArgumentError("beta must be in (0, 1]")
        if window is not None and (type(window) is not int or window < 1):
            raise InvalidArgumentError("window must be a positive integer or None")
        self.beta = float(beta)
        self.active = active
        self.window = window
        self.squares = bool(squares)
        self.interval: int | None = None  # passes between checkpoints, once known
        self.passes = 0  # backward passes since start_interval, captured or not
        self._params: dict[str, torch.nn.Parameter] = {}
        self._aliases: dict[str, list[str]] = {}  # tied weights: every state_dict name
        first: dict[int, str] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            if not param.requires_grad:
                continue
            key = first.setdefault(id(param), name)
            self._aliases.setdefault(key, []).append(name)
            self._params[key] = param
        self._ema: dict[str, torch.Tensor] = {}
        self._ema_sq: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}
        self._counter = next(iter(self._params), None)
        self._handles = [param.register_post_accumulate_grad_hook(
            functools.partial(self._hook, name)) for name, param in self._params.items()] \
            if auto else []

    @property
    def steps(self) -> int:
        """Updates seen (of the most updated parameter)."""
        return max(self._counts.values(), default=0)

    def _hook(self, name: str, param: torch.Tensor) -> None:
        if name == self._counter:  # one parameter counts the passes
            self.passes += 1
        if self.capturing and param.grad is not None:
            self._accumulate(name, param.grad)

    @property
    def capturing(self) -> bool:
        """Whether the current backward pass is folded into the average."""
        if not self.active:
            return False
        if self.window is None or self.interval is None:
            return True
        return self.passes > self.interval - self.window

    def start_interval(self, interval: int | None) -> None:
        """A checkpoint was just taken and the next is expected ``interval`` backward passes
        later (None: unknown, capture every pass): forget the average and count afresh."""
        if interval is not None and (type(interval) is not int or interval < 1):
            raise InvalidArgumentError("interval must be a positive integer or None")
        self.interval, self.passes = interval, 0
        self.reset()

    @torch.no_grad()
    def _accumulate(self, name: str, grad: torch.Tensor) -> None:
        grad = grad.detach().to("cpu", torch.float32)
        ema = self._ema.get(name)
        if ema is None:
            ema = self._ema[name] = torch.zeros(grad.shape, dtype=torch.float32)
        ema.mul_(1 - self.beta).add_(grad, alpha=self.beta)
        if self.squares:
            ema_sq = self._ema_sq.get(name)
            if ema_sq is None:
                ema_sq = self._ema_sq[name] = torch.zeros(grad.shape, dtype=torch.float32)
            ema_sq.mul_(1 - self.beta).addcmul_(grad, grad, value=self.beta)
        self._counts[name] = self._counts.get(name, 0) + 1

    def update(self) -> None:
        """Fold every parameter's current ``.grad`` into the average (if :attr:`active`)."""
        if not self.active:
            return
        for name, param in self._params.items():
            if param.grad is not None:
                self._accumulate(name, param.grad)

    @torch.no_grad()
    def importance(self) -> dict[str, np.ndarray]:
        """``|EMA * w|`` per parameter seen, under ``model.<name>`` (fp32 arrays)."""
        scores = {}
        for name, ema in self._ema.items():
            weight = self._params[name].detach().to("cpu", torch.float32)
            score = (ema * weight).abs_().numpy()
            for alias in self._aliases[name]:
                scores[MODEL + alias] = score
        return scores

    def curvature(self) -> dict[str, np.ndarray]:
        """The average of squared gradients (a diagonal Fisher estimate) per parameter seen,
        under ``model.<name>`` (fp32 copies); empty without ``squares``."""
        return {MODEL + alias: ema_sq.numpy().copy()
                for name, ema_sq in self._ema_sq.items() for alias in self._aliases[name]}

    def reset(self) -> None:
        """Forget every gradient seen."""
        self._ema.clear()
        self._ema_sq.clear()
        self._counts.clear()

    def remove(self) -> None:
        """Remove the hooks (updates then only come from :meth:`update`)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


# -- quality callback ----------------------------------------------------------------------

@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """``model.eval()`` for the block, then every submodule's own mode back."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _substitute(model: torch.nn.Module,
                state: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """The model's state_dict with the ``model.*`` tensors of ``state`` in place of its own,
    in the live tensors' dtypes and devices."""
    live = model.state_dict()
    unknown = [n for n in state if n.startswith(MODEL) and n[len(MODEL):] not in live]
    if unknown:
        raise InvalidArgumentError(f"tensors not in the model: {_names(unknown)}")
    values = {}
    for name, current in live.items():
        if MODEL + name not in state:
            values[name] = current
            continue
        value = to_torch(state[MODEL + name])
        if value.shape != current.shape:
            raise InvalidArgumentError(f"{MODEL}{name} has shape {tuple(value.shape)}, the "
                                       f"model expects {tuple(current.shape)}")
        values[name] = value.to(device=current.device, dtype=current.dtype)
    return values


def _forward(model: torch.nn.Module, values: dict[str, torch.Tensor], inputs: Any) -> Any:
    """The model's output on ``inputs`` (a tuple: arguments, a dict: keyword arguments)."""
    if isinstance(inputs, dict):
        return functional_call(model, values, (), inputs)
    args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    return functional_call(model, values, args)


CRITERIA = ("loss", "kl")


class _OutputKL:
    """``criterion="kl"`` of :func:`quality_from`: the live model's loss plus the mean KL
    divergence of a candidate's output distribution from the live model's."""

    def __init__(self, model: torch.nn.Module, batches: list, loss_fn: Callable) -> None:
        self.model, self.batches, self.loss_fn = model, batches, loss_fn
        self.reference: tuple[float, list[torch.Tensor]] | None = None

    def reset(self) -> None:
        """Forget the live model's outputs (it has trained since)."""
        self.reference = None

    def _reference(self) -> tuple[float, list[torch.Tensor]]:
        if self.reference is None:
            live = _substitute(self.model, {})
            loss, log_probs = 0.0, []
            for inputs, targets in self.batches:
                outputs = _forward(self.model, live, inputs)
                loss += float(self.loss_fn(outputs, targets))
                log_probs.append(torch.log_softmax(outputs.float(), dim=-1))
            self.reference = loss / len(self.batches), log_probs
        return self.reference

    def __call__(self, state: dict[str, np.ndarray]) -> float:
        with _eval_mode(self.model), torch.no_grad():
            fresh = self.reference is None
            loss, reference = self._reference()
            values = _substitute(self.model, state)
            if fresh:  # the weights the reference was just made from need no second pass
                live = _substitute(self.model, {})
                if all(torch.equal(values[name], live[name]) for name in values):
                    return loss
            kl = 0.0
            for (inputs, _), ref in zip(self.batches, reference):
                log_q = torch.log_softmax(_forward(self.model, values, inputs).float(), dim=-1)
                kl += float((ref.exp() * (ref - log_q)).sum(-1).mean())
        return loss + kl / len(self.batches)


def quality_from(model: torch.nn.Module, batches: Sequence[tuple[Any, Any]],
                 loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 metric: Callable[[Any, Any], float] | None = None,
                 criterion: str = "loss") -> Quality:
    """A quality callback for :class:`inshrink.search.Search`: the model evaluated with
    substituted weights.

    Parameters
    ----------
    model : torch.nn.Module
        Never modified: the weights are substituted with ``torch.func.functional_call``, in
        eval mode and without gradients (each submodule's mode is restored afterwards).
    batches : sequence of (inputs, targets)
        Held-out batches on the model's device; ``inputs`` a tensor, a tuple of positional
        arguments or a dict of keyword arguments.
    loss_fn : callable, optional
        ``loss_fn(outputs, targets) -> scalar tensor`` (default: cross-entropy); the quality
        is its mean over the batches, lower is better.
    metric : callable, optional
        Instead of a loss: ``metric(outputs, targets) -> float``, higher is better
        (``Search(higher_is_better=True)``).
    criterion : {"loss", "kl"}
        ``"loss"``: the loss (or metric) of the substituted weights. ``"kl"``, for models
        whose outputs are logits over their last dimension: the live model's loss plus the
        mean KL divergence of the substituted model's output distribution from the live
        model's, a low-noise estimate of the loss a perturbation adds (it measures the change
        at every position over every class, where the loss difference on targets averages
        changes of either sign; docs/decisions.md). The live model's log-probabilities are
        kept between calls (batches × positions × classes × 4 bytes) until ``reset()``,
        which the returned callable then has.

    Returns
    -------
    callable
        ``quality(state) -> float``; tensors ``state`` lacks keep the live model's values.
    """
    if loss_fn is not None and metric is not None:
        raise InvalidArgumentError("give either loss_fn or metric, not both")
    if criterion not in CRITERIA:
        raise InvalidArgumentError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    if criterion == "kl" and metric is not None:
        raise InvalidArgumentError("criterion='kl' adds to a loss, not to a metric")
    batches = list(batches)
    if not batches:
        raise InvalidArgumentError("batches must hold at least one (inputs, targets) pair")
    if criterion == "kl":
        return _OutputKL(model, batches, loss_fn or torch.nn.functional.cross_entropy)
    score = metric or loss_fn or torch.nn.functional.cross_entropy

    def quality(state: dict[str, np.ndarray]) -> float:
        values = _substitute(model, state)
        with _eval_mode(model), torch.no_grad():
            total = sum(float(score(_forward(model, values, inputs), targets))
                        for inputs, targets in batches)
        return total / len(batches)

    return quality


# -- checkpointer --------------------------------------------------------------------------

def _peak_lr(metadata: Mapping[str, str]) -> float | None:
    """The peak learning rate a checkpoint's metadata records, if it is a positive number."""
    try:
        peak = float(metadata[PEAK_LR_METADATA])
    except (KeyError, TypeError, ValueError):
        return None
    return peak if math.isfinite(peak) and peak > 0 else None


class Checkpointer:
    """Compressed checkpoints of a model and its optimizer in a training loop.

    Each :meth:`save` adds a step to an :class:`inshrink.Series` in ``directory``. With
    ``eval_batches``, an :class:`inshrink.search.Search` chooses per checkpoint the most
    compressive weight configuration whose quality on those batches stays within
    ``epsilon / restores`` of the uncompressed model's (less late in a decaying schedule, see
    ``epsilon_follows_lr``); without, the series' ``policy`` applies, and without a policy
    the checkpoints are lossless.

    Parameters
    ----------
    directory : str or os.PathLike
        The series' directory (an existing series is resumed).
    model : torch.nn.Module
    optimizer : torch.optim.Optimizer, optional
    eval_batches : sequence of (inputs, targets), optional
        Held-out batches for the quality callback (see :func:`quality_from`).
    loss_fn, metric, criterion : optional
        See :func:`quality_from`.
    epsilon : float
        Allowed relative change of the run's *final* quality (loss, or ``metric``) after up to
        ``restores`` restores from these checkpoints, against a run without any. A restore's
        damage is not undone by the training that follows (least of all late in a decaying
        schedule), and the damage of several restores adds up, so each checkpoint gets
        ``epsilon / restores`` of immediate quality change on ``eval_batches`` (in either
        direction: an improvement on a few batches is luck), scaled by
        ``epsilon_follows_lr``. Measured with 10 restores of weights and optimizer state (the
        last 5% before the end), ``epsilon=0.05`` and the default ``restores`` ended within
        0.9% of the uninterrupted run on four small tasks (benchmarks/RESULTS.md): the damage
        measured is a fraction of ``epsilon``, not a guarantee.
    restores : int
        The share of ``epsilon`` each checkpoint gets is ``1 / restores`` (default 5: on the
        measured tasks, 10 restores at ε / 5 each ended as well as at ε / 10 and compressed
        more). Fewer expected restores allow coarser checkpoints.
    policy : Policy, str or None
        The series' policy, for saves without ``eval_batches``. ``None`` (the default):
        lossless, so that a checkpoint is lossy only when asked for (a preset name or
        ``eval_batches``). What was chosen is logged once, at the first save (logger
        ``inshrink.torch``, level INFO).
    space : inshrink.search.SearchSpace, optional
        Configurations the search may choose, and the optimizer moments' fixed
        configurations (default: the first moment as zeros plus its 0.05% largest entries,
        so a restore restarts momentum; ``exp_avg_sq`` of a matrix as row × column factors,
        of a vector at 2 levels).
    max_evals : int
        Quality evaluations per checkpoint at most.
    keyframe_every : int
        See :class:`inshrink.Series`.
    grad_ema : bool
        Capture a gradient EMA (:class:`GradientEMA`, attribute ``ema``) for importance
        scores that protect the most sensitive weights; with ``space.per_tensor_bins``, also
        of squared gradients, the curvature by which the search gives sensitive tensors more
        bins than insensitive ones.
    ema_beta : float
        Weight of the newest gradient in that average.
    ema_window : int or None
        Capture gradients only in the last this many steps before each checkpoint (the
        interval is learned from the steps of the last two saves); None: every step.
    max_rel_l2 : float, optional
        Bound on every searched tensor's relative L2 error, next to ``epsilon`` (see
        :class:`inshrink.search.Search`). None: no such bound.
    epsilon_follows_lr : bool or float
        Scale ``epsilon`` at each save by the optimizer's learning rate against the largest
        one seen (kept in the checkpoints' metadata across restarts), never below
        ``EPSILON_FLOOR`` of it: checkpoints late in a decaying schedule, from which training
        has few and small steps left to recover, are kept more precise. A number p: by the
        ratio to the power p (the default 2 keeps the second half of a cosine schedule much
        more precise than its first; docs/decisions.md); True (= 1): by the ratio; False
        (= 0): ``epsilon`` as given. ``max_rel_l2`` is scaled by the square root of the same
        factor (the loss a perturbation adds grows with the square of its size).
    threads : int, optional
        Encoder/decoder threads.

    Attributes
    ----------
    series : inshrink.Series
    search : inshrink.search.Search or None
        None without ``eval_batches``.
    ema : GradientEMA or None
    seconds : float
        Time spent in :meth:`save` so far (the checkpointing overhead).
    """

    def __init__(self, directory: str | os.PathLike, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer | None = None, *,
                 eval_batches: Sequence[tuple[Any, Any]] | None = None,
                 loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 metric: Callable[[Any, Any], float] | None = None, criterion: str = "loss",
                 epsilon: float = 0.05, restores: int = 5,
                 policy: Policy | str | None = None,
                 space: SearchSpace | None = None,
                 max_evals: int = 24, keyframe_every: int = 10, grad_ema: bool = True,
                 ema_beta: float = 0.9, ema_window: int | None = 50,
                 max_rel_l2: float | None = None, epsilon_follows_lr: bool | float = 2,
                 threads: int | None = None) -> None:
        if not isinstance(model, torch.nn.Module):
            raise InvalidArgumentError("model must be a torch.nn.Module")
        if not (isinstance(epsilon_follows_lr, (bool, int, float))
                and 0 <= epsilon_follows_lr < math.inf):
            raise InvalidArgumentError("epsilon_follows_lr must be a bool or a non-negative "
                                       "number")
        if criterion not in CRITERIA:
            raise InvalidArgumentError(f"criterion must be one of {CRITERIA}, got "
                                       f"{criterion!r}")
        if type(restores) is not int or restores < 1:
            raise InvalidArgumentError("restores must be a positive integer")
        if max_rel_l2 is not None and eval_batches is None:
            raise InvalidArgumentError("max_rel_l2 bounds the configuration search, which "
                                       "needs eval_batches")
        self.model = model
        self.optimizer = optimizer
        self.search = None
        self.quality: Quality | None = None
        if eval_batches is not None:
            self.quality = quality_from(model, eval_batches, loss_fn, metric, criterion)
            self.search = Search(epsilon / restores, higher_is_better=metric is not None,
                                 space=space, max_evals=max_evals, max_rel_l2=max_rel_l2,
                                 two_sided=True, threads=threads)
        self.series = Series(directory, policy, keyframe_every=keyframe_every, threads=threads,
                             search=self.search)
        squares = self.search is not None and self.search.space.per_tensor_bins
        self._space = self.search.space if self.search is not None else None
        self.ema = GradientEMA(model, ema_beta, window=ema_window, squares=squares) \
            if grad_ema else None
        self.epsilon = epsilon
        self.restores = restores
        self.max_rel_l2 = max_rel_l2
        # the power of the learning-rate ratio (0: a constant bound)
        self.lr_power = float(epsilon_follows_lr) if optimizer is not None else 0.0
        self.peak_lr: float | None = None
        self._last_step: int | None = None
        self._announced = False
        self.seconds = 0.0

    def mode(self) -> str:
        """What the checkpoints hold, in words (logged once at the first save)."""
        if self.search is not None:
            return (f"lossy: configuration search, final quality within epsilon="
                    f"{self.epsilon:g} after up to {self.restores} restores")
        policy = self.series.policy
        if isinstance(policy, str):
            return "lossless" if policy == "lossless" else f"lossy: the {policy!r} preset"
        if policy is None or not any(c is not None for c in resolve(policy).roles.values()) \
                and not policy.overrides and not policy.tensors:
            return "lossless"
        return "lossy: a custom policy"

    def _importance(self, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        if self.ema is None or self.ema.steps == 0:
            return None
        return {n: v for n, v in self.ema.importance().items() if n in state}

    def _curvature(self, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        if self.ema is None or self.ema.steps == 0 or not self.ema.squares:
            return None
        return {n: v for n, v in self.ema.curvature().items() if n in state}

    def _lr_ratio(self) -> float:
        """The learning rate against the largest one seen (1 when it is not a number)."""
        lr = max(float(group["lr"]) for group in self.optimizer.param_groups)
        if not math.isfinite(lr) or lr < 0:
            return 1.0
        self.peak_lr = max(self.peak_lr or 0.0, lr)
        return lr / self.peak_lr if self.peak_lr > 0 else 1.0

    def save(self, step: int) -> dict[str, Any]:
        """Checkpoint the model and optimizer as ``step`` (after every saved step).

        Returns
        -------
        dict
            ``step``, ``bytes`` (of the new file), ``search`` (the search's report, or None)
            and ``seconds`` (this save).
        """
        started = time.perf_counter()
        if not self._announced:
            _LOG.info("Checkpointer(%s): %s", self.series.directory, self.mode())
            self._announced = True
        state, metadata = state_to_numpy(self.model, self.optimizer)
        if self.search is not None and self.optimizer is not None:
            ratio = self._lr_ratio()
            # late in the schedule a restarted first moment is not recovered from
            space = self._space
            self.search.space = space if ratio >= LATE_LR else \
                replace(space, exp_avg=space.late_exp_avg)
            if self.lr_power > 0:
                scale = max(ratio ** self.lr_power, EPSILON_FLOOR)
                self.search.epsilon = self.epsilon / self.restores * scale
                if self.max_rel_l2 is not None:
                    self.search.max_rel_l2 = self.max_rel_l2 * math.sqrt(scale)
            metadata[PEAK_LR_METADATA] = repr(self.peak_lr)
        if hasattr(self.quality, "reset"):
            self.quality.reset()  # the model trained since the last save
        self.series.save(step, state, metadata=metadata, importance=self._importance(state),
                         quality=self.quality, curvature=self._curvature(state))
        report = self.series.last_search.report if self.quality is not None else None
        if self.ema is not None:  # the next checkpoint is expected as far ahead as this one
            gap = None if self._last_step is None else step - self._last_step
            self.ema.start_interval(gap)
        self._last_step = step
        seconds = time.perf_counter() - started
        self.seconds += seconds
        return {"step": step, "bytes": self.series.checkpoints()[-1].bytes, "search": report,
                "seconds": seconds}

    def restore(self, step: int | None = None) -> int:
        """Load ``step`` (default: the latest) into the model and optimizer; return the step.

        The search continues from the restored checkpoint's choice, and the gradient average
        starts afresh (captured again in the last ``ema_window`` steps before the next save).
        """
        if step is None:
            step = self.series.latest()
            if step is None:
                raise InvalidArgumentError(f"no checkpoint in {self.series.directory}")
        tensors = self.series.load(step)
        metadata = self.series.metadata(step)
        load_state(tensors, metadata, self.model, self.optimizer)
        if self.search is not None:
            self.search.previous = self.series.search_choice(step)
        self.peak_lr = _peak_lr(metadata) or self.peak_lr
        if self.ema is not None:
            self.ema.start_interval(self.ema.interval)
        self._last_step = step
        return step
