"""Quality callbacks for the configuration search: a model's loss, KL or metric on held-out
batches with candidate weights substituted."""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch.func import functional_call

from ..errors import InvalidArgumentError
from ..search.space import Quality
from .convert import to_torch
from .state import MODEL, names_list, require_module

__all__ = ["CRITERIA", "quality_from"]


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
        raise InvalidArgumentError(f"tensors not in the model: {names_list(unknown)}")
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


SLACK = 1e-5
"""How far below zero one batch's divergence may come out in float32 arithmetic: an
evaluation stops only once the batches so far exceed the limit with this much to spare for
each batch left."""


class _OutputKL:
    """``criterion="kl"`` of :func:`quality_from`: the live model's loss plus the mean KL
    divergence of a candidate's output distribution from the live model's.

    It is a :class:`inshrink.search.BoundedQuality`: every batch's divergence is at least
    zero, so once the batches evaluated so far put the quality above the search's limit the
    rest cannot bring it back, and the evaluation stops. The batches that diverged most on
    the last candidate go first (nearby candidates diverge on the same batches), and a
    complete evaluation sums them in their own order, so its value does not depend on it."""

    def __init__(self, model: torch.nn.Module, batches: list, loss_fn: Callable) -> None:
        self.model, self.batches, self.loss_fn = model, batches, loss_fn
        self.reference: tuple[float, list[torch.Tensor]] | None = None
        self.order = list(range(len(batches)))
        self.passes = 0  # forward passes over one batch so far (the reference's included)

    def reset(self) -> None:
        """Forget the live model's outputs (it has trained since)."""
        self.reference = None

    def _reference(self) -> tuple[float, list[torch.Tensor]]:
        if self.reference is None:
            live = _substitute(self.model, {})
            loss, log_probs = 0.0, []
            for inputs, targets in self.batches:
                outputs = _forward(self.model, live, inputs)
                self.passes += 1
                loss += float(self.loss_fn(outputs, targets))
                log_probs.append(torch.log_softmax(outputs.float(), dim=-1))
            self.reference = loss / len(self.batches), log_probs
        return self.reference

    def __call__(self, state: dict[str, np.ndarray]) -> float:
        return self.bounded(state, math.inf)[0]

    def bounded(self, state: dict[str, np.ndarray], limit: float) -> tuple[float, bool]:
        """``(quality, True)``, or ``(lower bound, False)`` as soon as the batches evaluated
        so far prove the quality above ``limit`` (the bound is then above it too)."""
        with _eval_mode(self.model), torch.no_grad():
            fresh = self.reference is None
            loss, reference = self._reference()
            values = _substitute(self.model, state)
            if fresh:  # the weights the reference was just made from need no second pass
                live = _substitute(self.model, {})
                if all(torch.equal(values[name], live[name]) for name in values):
                    return loss, True
            count = len(self.batches)
            kls: list[float | None] = [None] * count
            done = 0.0
            for k, i in enumerate(self.order):
                ref = reference[i]
                outputs = _forward(self.model, values, self.batches[i][0])
                self.passes += 1
                log_q = torch.log_softmax(outputs.float(), dim=-1)
                kls[i] = float((ref.exp() * (ref - log_q)).sum(-1).mean())
                done += kls[i]
                left = count - k - 1
                bound = loss + (done - SLACK * left) / count
                if left and bound > limit:
                    self._reorder(kls)
                    return bound, False
            self._reorder(kls)
            kl = 0.0
            for value in kls:  # the batches' own order: the value does not depend on `order`
                kl += value
        return loss + kl / count, True

    def _reorder(self, kls: list[float | None]) -> None:
        """Next time, the batches that diverged most on this candidate first."""
        measured = sorted((i for i in self.order if kls[i] is not None), key=lambda i: -kls[i])
        self.order = measured + [i for i in self.order if kls[i] is None]


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
        which the returned callable then has. It also has ``bounded(state, limit)``
        (:class:`inshrink.search.BoundedQuality`): the search stops evaluating a candidate
        as soon as the batches so far prove it infeasible (each batch's divergence is at
        least zero), with the same decisions as complete evaluations. ``"loss"`` and a
        metric have no such bound, since a later batch can move their mean either way.

    Returns
    -------
    callable
        ``quality(state) -> float``; tensors ``state`` lacks keep the live model's values.
    """
    require_module(model)
    if loss_fn is not None and metric is not None:
        raise InvalidArgumentError("give either loss_fn or metric, not both")
    if criterion not in CRITERIA:
        raise InvalidArgumentError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    if criterion == "kl" and metric is not None:
        raise InvalidArgumentError("criterion='kl' adds to a loss, not to a metric")
    try:
        batches = list(batches)
    except TypeError:
        raise InvalidArgumentError("batches must be a sequence of (inputs, targets) "
                                   "pairs") from None
    if not batches:
        raise InvalidArgumentError("batches must hold at least one (inputs, targets) pair")
    if not all(isinstance(b, (tuple, list)) and len(b) == 2 for b in batches):
        raise InvalidArgumentError("batches must be a sequence of (inputs, targets) pairs")
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
