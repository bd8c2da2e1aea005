"""A torch optimizer's parameters described for the search's moment choice
(:class:`inshrink.search.Moments`): which checkpoint tensors hold each parameter's moments and
the hyperparameters that turn them into updates."""
from __future__ import annotations

import math
from typing import Any

import torch

from ..search.moments import Moments
from ..torch.state import MODEL, STATE

__all__ = ["optimizer_moments"]


def _number(value: Any) -> float | None:
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value < 0:
        return None
    return float(value)


def optimizer_moments(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      steps_left: int | None = None) -> list[Moments]:
    """The parameters of ``optimizer`` whose moments the search can judge: Adam-like ones
    (``exp_avg`` and ``exp_avg_sq``, ``betas``, ``eps``) and SGD with momentum
    (``momentum_buffer``). Others (Adafactor's factored moments, Lion, ...) are left out and
    keep the search space's fixed configurations.

    Names are those of :func:`inshrink.torch.state_to_numpy` (``optimizer.state.<index>.<key>``
    and ``model.<name>``).
    """
    names = {id(p): MODEL + n for n, p in model.named_parameters()}
    groups: list[Moments] = []
    index = 0
    for group in optimizer.param_groups:
        lr = _number(group.get("lr"))
        for param in group["params"]:
            key, index = index, index + 1
            state = optimizer.state.get(param, {})
            weight = names.get(id(param))
            if weight is None or lr is None:
                continue
            prefix = f"{STATE}{key}."
            betas = group.get("betas")
            if "exp_avg" in state and "exp_avg_sq" in state and isinstance(betas, (tuple, list)):
                beta1, beta2 = (_number(b) for b in betas[:2])
                eps, step = _number(group.get("eps")), _number(state.get("step", 0))
                if None in (beta1, beta2, eps, step) or beta1 >= 1 or beta2 >= 1:
                    continue
                groups.append(Moments(weight, "adam", prefix + "exp_avg", prefix + "exp_avg_sq",
                                      lr=lr, beta1=beta1, beta2=beta2, eps=eps, step=step,
                                      steps_left=steps_left))
            elif isinstance(state.get("momentum_buffer"), torch.Tensor):
                momentum = _number(group.get("momentum"))
                if momentum is None or not 0 < momentum < 1:
                    continue
                groups.append(Moments(weight, "momentum", prefix + "momentum_buffer",
                                      lr=lr, beta1=momentum, steps_left=steps_left))
    return groups
