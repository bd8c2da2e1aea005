"""A :class:`Checkpointer` for training loops: a series of checkpoints of a model and its
optimizer, each searched within a quality bound when held-out batches are given."""
from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from ..errors import InvalidArgumentError
from ..policy import Policy, resolve
from ..search import Quality, Search, SearchSpace
from ..series import SEARCH_KEY as SEARCH_METADATA, Series
from .gradients import GradientEMA
from .quality import CRITERIA, quality_from
from .state import load_state, state_to_numpy

__all__ = ["Checkpointer", "SEARCH_METADATA", "PEAK_LR_METADATA"]

PEAK_LR_METADATA = "inshrink.torch.peak_lr"
EPSILON_FLOOR = 0.1
"""With ``epsilon_follows_lr``, the bound never falls below this share of ``epsilon`` (a
schedule that decays to zero would otherwise demand lossless weights at its end)."""
LATE_LR = 0.5
"""Checkpoints saved while the learning rate is below this share of its peak store the first
moment as the search space's ``late_exp_avg`` (see :class:`inshrink.search.SearchSpace`)."""
_LOG = logging.getLogger("inshrink.torch")


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
