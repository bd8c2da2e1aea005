"""Gradient capture during training: importance and curvature for the configuration search."""
from __future__ import annotations

import functools

import numpy as np
import torch

from ..errors import InvalidArgumentError
from .state import MODEL, require_module

__all__ = ["GradientEMA"]


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
        require_module(model)
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
