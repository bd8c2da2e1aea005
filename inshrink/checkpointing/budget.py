"""How a :class:`~inshrink.torch.Checkpointer` spends its run's quality bound: the search
bound of each checkpoint and the optimizer moments' configuration, from where in the run the
checkpoint falls.

``epsilon`` bounds the change of the run's *final* quality after up to ``restores`` restores.
A restore's damage is not undone by the training after it, least of all late in the run, and
the damage of several restores adds up, so each checkpoint gets ``epsilon / restores`` of
immediate change, scaled down by how little training is left to recover from it: the
learning rate's ratio to its peak (to the power ``lr_power``) and, when the run's length is
known, the share of the run still to come. Late in the run the optimizer moments are also
kept more precisely (``SearchSpace.late_exp_avg``): a restarted first moment there left
damage that the few small steps left did not undo (docs/decisions.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ..errors import InvalidArgumentError
from ..search.choose import Search
from ..search.space import SearchSpace

__all__ = ["EPSILON_FLOOR", "LATE_LR", "Budget", "run_length"]

EPSILON_FLOOR = 0.1
"""The bound never falls below this share of ``epsilon / restores`` (a schedule that decays to
zero would otherwise demand lossless weights at its end)."""
LATE_LR = 0.5
"""A checkpoint is *late* once the learning rate is below this share of its peak, or once
this share of the run (when its length is known) is left: its first moment is stored as the
search space's ``late_exp_avg``."""


@dataclass(frozen=True)
class Budget:
    """The share of a run's quality bound each checkpoint gets.

    Parameters
    ----------
    epsilon : float
        Allowed relative change of the run's final quality after ``restores`` restores.
    restores : int
        Restores the bound is shared by.
    lr_power : float
        The bound follows the learning rate's ratio to its peak to this power (0: not at
        all).
    total_steps : int, optional
        The run's length in optimizer steps: the bound then also follows the share of the run
        still to come (to the same power, at least 1), whatever the schedule, and a
        checkpoint in the last ``LATE_LR`` of the run is late. None: the learning rate alone.
    """

    epsilon: float
    restores: int = 5
    lr_power: float = 2.0
    total_steps: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.epsilon, (int, float)) and 0 <= self.epsilon < math.inf):
            raise InvalidArgumentError("epsilon must be a non-negative number")
        if type(self.restores) is not int or self.restores < 1:
            raise InvalidArgumentError("restores must be a positive integer")
        if not (isinstance(self.lr_power, (bool, int, float))
                and 0 <= self.lr_power < math.inf):
            raise InvalidArgumentError("epsilon_follows_lr must be a bool or a non-negative "
                                       "number")
        if self.total_steps is not None and (type(self.total_steps) is not int
                                             or self.total_steps < 1):
            raise InvalidArgumentError("total_steps must be a positive integer or None")

    def left(self, step: int) -> float:
        """The share of the run still to come after ``step`` (1 when the length is unknown)."""
        if self.total_steps is None:
            return 1.0
        return min(1.0, max(0.0, (self.total_steps - step) / self.total_steps))

    def scale(self, lr_ratio: float, step: int) -> float:
        """What the checkpoint at ``step`` gets of ``epsilon / restores`` (in
        [EPSILON_FLOOR, 1]; 1 when neither the learning rate nor the run's length counts)."""
        factor = 1.0
        if self.lr_power > 0:
            factor = min(1.0, max(0.0, lr_ratio)) ** self.lr_power
        if self.total_steps is not None:
            factor = min(factor, self.left(step) ** max(1.0, float(self.lr_power)))
        return max(factor, EPSILON_FLOOR) if factor < 1 else 1.0

    def bound(self, lr_ratio: float, step: int) -> float:
        """The search bound of the checkpoint at ``step``."""
        return self.epsilon / self.restores * self.scale(lr_ratio, step)

    def late(self, lr_ratio: float, step: int) -> bool:
        """Whether the checkpoint at ``step`` keeps the late moment configurations."""
        return lr_ratio < LATE_LR or self.left(step) < LATE_LR

    def space(self, space: SearchSpace, lr_ratio: float, step: int) -> SearchSpace:
        """The search space of the checkpoint at ``step``: late, the moments' late
        configurations."""
        return replace(space, exp_avg=space.late_exp_avg) if self.late(lr_ratio, step) \
            else space

    def apply(self, search: Search, space: SearchSpace, lr_ratio: float, step: int,
              max_rel_l2: float | None = None) -> None:
        """Set ``search`` up for the checkpoint at ``step``: its space, its bound and (when
        given) its relative-error bound, scaled by the square root of the same factor (the
        loss a perturbation adds grows with the square of its size)."""
        search.space = self.space(space, lr_ratio, step)
        scale = self.scale(lr_ratio, step)
        search.epsilon = self.epsilon / self.restores * scale
        if max_rel_l2 is not None:
            search.max_rel_l2 = max_rel_l2 * math.sqrt(scale)


def run_length(scheduler: Any) -> int | None:
    """The number of steps a torch learning-rate scheduler is built for, when it says.

    Knows ``OneCycleLR`` (``total_steps``), ``CosineAnnealingLR`` (``T_max``),
    ``PolynomialLR`` (``total_iters``) and ``SequentialLR`` (its last milestone plus its last
    scheduler's length); None for any other (``LambdaLR``, a restart schedule...), whose
    length the Checkpointer cannot tell.
    """
    if scheduler is None:
        return None
    name = type(scheduler).__name__
    value = None
    if name == "OneCycleLR":
        value = getattr(scheduler, "total_steps", None)
    elif name == "CosineAnnealingLR":
        value = getattr(scheduler, "T_max", None)
    elif name == "PolynomialLR":
        value = getattr(scheduler, "total_iters", None)
    elif name == "SequentialLR":
        milestones = list(getattr(scheduler, "_milestones", []) or [])
        schedulers = list(getattr(scheduler, "_schedulers", []) or [])
        last = run_length(schedulers[-1]) if schedulers else None
        if milestones and last is not None:
            value = milestones[-1] + last
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value
