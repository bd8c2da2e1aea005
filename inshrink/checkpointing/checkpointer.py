"""A :class:`Checkpointer` for training loops: a series of checkpoints of a model, its
optimizer and the rest of the training state, each searched within a quality bound when
held-out batches are given; saved in the background if asked, sharded models through DCP."""
from __future__ import annotations

import copy
import functools
import logging
import math
import os
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from ..errors import InvalidArgumentError
from ..encode.policy import Policy, resolve
from ..search.choose import Search
from ..search.space import Quality, SearchSpace
from ..search.stored import SEARCH_KEY as SEARCH_METADATA
from ..series.retention import refuse_weights_only
from ..series.series import MAX_STEP, Series
from ..torch.convert import to_torch
from ..torch.gradients import GradientEMA
from ..torch.quality import CRITERIA, quality_from
from ..torch.state import (MODEL, check_versions, load_state, require_module, require_optimizer,
                           state_to_numpy, versions_of)
from ..torch.training import TRAINING, TRAINING_METADATA, capture, check_extra, decode
from .budget import EPSILON_FLOOR, LATE_LR, Budget, run_length
from .moments import optimizer_moments

# EPSILON_FLOOR and LATE_LR, the bound's rules, live in .budget
__all__ = ["Checkpointer", "SEARCH_METADATA", "PEAK_LR_METADATA", "TRAINING_METADATA",
           "EPSILON_FLOOR", "LATE_LR"]

PEAK_LR_METADATA = "inshrink.torch.peak_lr"
MOMENT_MODES = ("measured", "fixed")
_LOG = logging.getLogger("inshrink.torch")


# Checkpointers with a save in the background: held (strongly) until it is waited for, so
# that a script which drops its Checkpointer mid-save still gets the save finished at exit
_PENDING: set["Checkpointer"] = set()
# every async or sharded Checkpointer not closed yet (weakly): closed at exit, so that no
# thread or process group of ours is left to the interpreter's finalization
_OPEN: "weakref.WeakSet[Checkpointer]" = weakref.WeakSet()
_PENDING_LOCK = threading.Lock()
_EXIT_HOOK: list[bool] = []


def _close_at_exit() -> None:
    """Interpreter exit: finish the background saves of Checkpointers their script did not
    close, and release their threads and process groups, in the main thread. Runs before
    concurrent.futures refuses new work at exit (which failed a pending save silently: DCP
    and the writer submit to thread pools), before ``atexit`` and before any process group
    is torn down: once it returns, no thread of ours runs, so none can be in a collective
    while the interpreter finalizes, and the background saves' gloo groups are destroyed
    (their worker threads joined) while the interpreter is still whole."""
    with _PENDING_LOCK:
        pending = list(_PENDING)  # first the saves in flight, then the idle ones
        pending += [ckpt for ckpt in list(_OPEN) if ckpt not in _PENDING]
    for ckpt in pending:
        try:
            ckpt.close()
        except Exception:  # noqa: BLE001 - nothing to raise to at exit: said loudly instead
            _LOG.exception("Checkpointer(%s): the save pending at exit failed",
                           ckpt.directory)


STAGING_MODES = ("copy", "in_place")


def _release(executor: ThreadPoolExecutor | None, *sharded: Any) -> None:
    """A dropped Checkpointer's background thread stopped and its process groups destroyed."""
    if executor is not None:  # joined, unless dropped by that very thread
        executor.shutdown(wait=threading.current_thread() not in
                          getattr(executor, "_threads", ()))
    for shards in sharded:
        if shards is not None:
            shards.close()


def _at_thread_exit(callback: Callable[[], None]) -> None:
    """``callback`` at interpreter exit, before non-daemon threads are joined: where
    concurrent.futures shuts its pools down (``threading._register_atexit``, Python 3.9+;
    callbacks run newest first, so this one before the pools of modules imported earlier).
    Elsewhere ``atexit``, which runs after that."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:
        import atexit
        atexit.register(callback)
        return
    try:
        register(callback)
    except RuntimeError:  # the interpreter is exiting already: nothing to register for
        pass


def _peak_lr(metadata: Mapping[str, str]) -> float | None:
    """The peak learning rate a checkpoint's metadata records, if it is a positive number."""
    try:
        peak = float(metadata[PEAK_LR_METADATA])
    except (KeyError, TypeError, ValueError):
        return None
    return peak if math.isfinite(peak) and peak > 0 else None


def _copy_model(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` for the search's quality passes beside training."""
    try:
        return copy.deepcopy(model)
    except (RuntimeError, TypeError, copy.Error) as exc:
        raise InvalidArgumentError(f"async_ with eval_batches evaluates a copy of the model, "
                                   f"and this model cannot be copied: {exc}") from None


class Checkpointer:
    """Compressed checkpoints of a training run's whole state in a training loop.

    Each :meth:`save` stores the model, the optimizer, the learning-rate ``scheduler``, the
    random generators (``rng``) and every ``extra`` object in one checkpoint, atomically, and
    :meth:`restore` loads them all back: a lossless run interrupted and restored goes on
    exactly as if it had not been (bit for bit, on a deterministic model).

    A plain model's checkpoints are an :class:`inshrink.Series` in ``directory`` (one .ink
    file per step, older steps as deltas, keyframes). A sharded one (FSDP2 ``fully_shard``,
    DTensor, or any model once a process group of several ranks is initialized) takes the
    same calls on every rank and is stored through ``torch.distributed.checkpoint``: see
    Notes. With
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
    scheduler : optional
        A learning-rate scheduler (anything with ``state_dict()`` / ``load_state_dict()``).
    extra : mapping of str to object, optional
        Further state by name (a data loader's position, an EMA of the weights, a step
        counter...): objects with ``state_dict()`` and ``load_state_dict()``, DCP's
        ``Stateful`` protocol. The scheduler's and the extras' states are stored as tensors
        plus JSON (:func:`inshrink.torch.encode_nested`), never pickled: a value that is
        neither a tensor nor JSON-able (a dict with non-string keys included) makes
        :meth:`save` raise InvalidArgumentError naming it, before anything is written.
        Their tensors are stored bit for bit, whatever the policy or search.
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
        ``epsilon_follows_lr``. The optimizer moments act on the updates after a restore, which
        a model-quality callback cannot see: with ``moments="measured"`` they get the
        cheapest configuration whose displacement of the weights stays within the weights'
        own error (see ``moments``). Measured with 10 restores of weights and optimizer
        state in 20 checkpoints, 3 seeds (the fidelity benchmark, benchmarks/RESULTS.md), the
        final loss of two small language models moved by up to about 0.4·ε (+1.86% at the
        default 0.05 on one of them, +0.66% at 0.02): a measurement, not a guarantee.
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
        so a restore restarts momentum, and at 2 signed-log levels late in the run (see
        :mod:`inshrink.checkpointing.budget`); ``exp_avg_sq`` at 4 log levels).
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
        factor (the loss a perturbation adds grows with the square of its size). The rules
        are :class:`inshrink.checkpointing.budget.Budget`'s.
    threads : int, optional
        Encoder/decoder threads.
    rng : bool
        Save the random generators' states (Python's ``random``, numpy's global generator,
        torch's CPU generator and, once CUDA is in use, every CUDA device's) and set them on
        :meth:`restore`. Saving never draws from them.
    async_ : bool
        :meth:`save` returns once it has copied the state to CPU memory (the staging copy);
        the search, quantization and writing run in one background thread while training
        goes on. The next :meth:`save` waits for the previous one; :meth:`wait`,
        :meth:`close` and leaving a ``with`` block finish it. A failure in the background is
        raised by the next call of :meth:`save`, :meth:`wait`, :meth:`close` or
        :meth:`restore` (that step was not saved). With ``eval_batches`` the search
        evaluates a copy of the model (``copy.deepcopy``, made here: the model's memory
        twice), loaded with the staged weights, so that training is never disturbed.
    async_staging : {"copy", "in_place"}
        With ``async_``: what :meth:`save` stages. "copy" (the default): a CPU copy of the
        whole state, so training never waits for the background save (the state's memory
        twice on the host). "in_place": only the model's buffers (which a forward pass
        changes) are copied; the background save reads the parameters and the optimizer's
        state where they are, and the next ``optimizer.step()`` waits until it is done (a
        pre-hook on the optimizer; the wait counts in :attr:`seconds`). The forward and
        backward passes before that step overlap the save, and the host holds no second copy
        of the state. Until the save ends, parameters and optimizer state may change only in
        ``optimizer.step()``: an in-place change elsewhere is detected by the tensors'
        version counters and that step is not saved (the failure is raised by the next
        call, as any background failure); a change through ``.data`` is not detected.
        Needs an optimizer. In the sharded mode every rank checks its own tensors and a
        change on one fails the step on all.
    keep_last : int, optional
        After each save, keep only this many newest steps (and the files they need).
    keep_weights : int, optional
        With ``keep_last``: also keep the model's tensors (no optimizer or training state) of
        this many steps before the ``keep_last`` newest. A step leaving the ``keep_last``
        newest is rewritten in place as its model only (:meth:`inshrink.series.Series.retain`:
        the same values, bit for bit, unless ``weights_policy``). :meth:`restore_model` loads
        such a step; :meth:`restore` refuses it. In the sharded mode each rank rewrites its
        own files of the step, and rank 0 commits it as a DCP checkpoint of the ``model.``
        items (:mod:`inshrink.dcp.weights_only`).
    weights_policy : Policy, str or None
        Encode the weights-only steps again with this policy, from the values the checkpoint
        decodes to (a lossier one saves more). Default: as the checkpoint stored them.
    moments : {"measured", "fixed"}
        With ``eval_batches``: how the optimizer moments are configured. "measured" (the
        default): per checkpoint, the cheapest configuration whose effect on the next updates
        (the weights' displacement they cause, :mod:`inshrink.search.moments`) stays within
        the weights' own error at the searched configuration, for Adam-like optimizers and
        SGD with momentum (others: as "fixed"). "fixed": the search space's configurations
        (``space``), early and late in the run.
    sharded : bool or None
        Use the sharded mode (Notes). None: when a process group of more than one rank is
        initialized or a parameter is a DTensor.
    total_steps : int, optional
        The run's length in optimizer steps (default: what ``scheduler`` says, for torch's
        ``OneCycleLR``, ``CosineAnnealingLR``, ``PolynomialLR`` and ``SequentialLR`` of them;
        see :func:`inshrink.checkpointing.budget.run_length`). Known, the bound also shrinks
        with the share of the run left (to the power ``epsilon_follows_lr``, at least
        linearly) and the last half of the run counts as late, whatever the learning rate
        does: a schedule that keeps the learning rate up says nothing about how little time a
        late checkpoint has to recover. On the fault benchmark's lm (a cosine schedule, whose
        learning rate already says as much; one seed) it changed nothing measurable.

    Attributes
    ----------
    series : inshrink.Series or None
        None in the sharded mode.
    search : inshrink.search.Search or None
        None without ``eval_batches``.
    ema : GradientEMA or None
        None in the sharded mode.
    seconds : float
        Time spent in :meth:`save` so far (the checkpointing overhead; with ``async_``, the
        time training was blocked, waits for the previous save included).
    last_report : dict or None
        What the latest finished save reported (see :meth:`save`).

    Notes
    -----
    **Sharded mode.** Every rank calls every method, in the same order. Each step is one
    DCP checkpoint, ``directory/step_<12 digits>/``, written by
    ``dcp.save(..., storage_writer=inshrink.dcp.InkStorageWriter(...))`` from
    ``get_state_dict(model, optimizer)`` (every rank writes its own shards, the coordinator
    commits) and read by ``dcp.load`` with :class:`inshrink.dcp.InkStorageReader` and
    ``set_state_dict``; a checkpoint saved by N ranks restores into any number. Each rank
    stores its own scheduler, generator and extra states as tensors of that rank only
    (``training_rank<r>.*``); a rank that did not save (more ranks than saved) restores rank
    0's scheduler and extras and keeps its generators. The optimizer's hyperparameters,
    which DCP stores pickled, are read with torch's ``weights_only`` unpickler. A failure of
    one rank (a mismatch, a bad step) is raised on every rank. ``keep_last`` is applied by
    rank 0 after each commit, which also removes older saves that never committed. Async
    saves run ``dcp.save`` in the background thread on a gloo process group of their own,
    created by the constructor.

    **Exit.** A script should end with :meth:`close` (or leave a ``with`` block) on every
    rank, then ``torch.distributed.destroy_process_group()``. One that does not still gets
    its last save: at interpreter exit, in the main thread, before ``atexit`` and before any
    process group is torn down, every Checkpointer left open is closed (the save in flight
    finished, its thread joined, the background saves' group destroyed, with its gloo
    threads); no thread of ours runs after that, so none is in a collective while the
    interpreter finalizes. The default process group stays the script's: a gloo group left
    undestroyed is torn down in the interpreter's finalization with its threads running,
    which torch may end with "terminate called without an active exception" (an abort, exit
    status 134), whatever the Checkpointer did. See docs/torch.md.

    The sharded mode runs **no configuration search**: the ``policy`` applies per shard
    (lossless by default) and ``eval_batches`` is refused. A collective search would need
    every rank to quantize its shards with each candidate, every rank to take part in the
    quality forward passes of the sharded model, and rank 0 to decide and broadcast each
    step of the walk; it is not implemented. The gradient average (``grad_ema``) is off.
    """

    def __init__(self, directory: str | os.PathLike, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer | None = None, scheduler: Any = None,
                 extra: Mapping[str, Any] | None = None, *,
                 eval_batches: Sequence[tuple[Any, Any]] | None = None,
                 loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
                 metric: Callable[[Any, Any], float] | None = None, criterion: str = "loss",
                 epsilon: float = 0.05, restores: int = 5,
                 policy: Policy | str | None = None,
                 space: SearchSpace | None = None,
                 max_evals: int = 24, keyframe_every: int = 10, grad_ema: bool = True,
                 ema_beta: float = 0.9, ema_window: int | None = 50,
                 max_rel_l2: float | None = None, epsilon_follows_lr: bool | float = 2,
                 threads: int | None = None, rng: bool = True, async_: bool = False,
                 keep_last: int | None = None, sharded: bool | None = None,
                 total_steps: int | None = None, keep_weights: int | None = None,
                 weights_policy: Policy | str | None = None,
                 moments: str = "measured", async_staging: str = "copy") -> None:
        require_module(model)
        sharded = self._check_training_args(model, optimizer, scheduler, extra, rng, async_,
                                            keep_last, sharded, eval_batches)
        if async_staging not in STAGING_MODES:
            raise InvalidArgumentError(f"async_staging must be one of {STAGING_MODES}, got "
                                       f"{async_staging!r}")
        if async_staging == "in_place" and (not async_ or optimizer is None):
            raise InvalidArgumentError(
                "async_staging='in_place' needs async_=True and an optimizer (whose step waits "
                "for the save)")
        self.async_staging = async_staging
        self.scheduler = scheduler
        self.extra = check_extra(extra)
        self.rng = rng
        self.keep_last = keep_last
        self.policy = policy
        if not (isinstance(epsilon_follows_lr, (bool, int, float))
                and 0 <= epsilon_follows_lr < math.inf):
            raise InvalidArgumentError("epsilon_follows_lr must be a bool or a non-negative "
                                       "number")
        if criterion not in CRITERIA:
            raise InvalidArgumentError(f"criterion must be one of {CRITERIA}, got "
                                       f"{criterion!r}")
        if type(restores) is not int or restores < 1:
            raise InvalidArgumentError("restores must be a positive integer")
        if moments not in MOMENT_MODES:
            raise InvalidArgumentError(f"moments must be one of {MOMENT_MODES}, got "
                                       f"{moments!r}")
        self.moments = moments
        if max_rel_l2 is not None and eval_batches is None:
            raise InvalidArgumentError("max_rel_l2 bounds the configuration search, which "
                                       "needs eval_batches")
        # the search's quality passes run beside training in async mode: on a copy
        self._evaluated = _copy_model(model) if async_ and eval_batches is not None \
            else model
        self.model = model
        self.optimizer = optimizer
        self.search = None
        self.quality: Quality | None = None
        if eval_batches is not None:
            self.quality = quality_from(self._evaluated, eval_batches, loss_fn, metric,
                                        criterion)
            self.search = Search(epsilon / restores, higher_is_better=metric is not None,
                                 space=space, max_evals=max_evals, max_rel_l2=max_rel_l2,
                                 two_sided=True, threads=threads)
        self.series: Series | None = None
        self._sharded = None
        if keep_weights is not None and (type(keep_weights) is not int or keep_weights < 1
                                         or keep_last is None):
            raise InvalidArgumentError("keep_weights must be a positive integer, with "
                                       "keep_last")
        resolve(weights_policy)  # a bad policy fails here, not at a save
        if sharded:
            from ..dcp.sharded import ShardedCheckpoints
            self._sharded = ShardedCheckpoints(directory, model, optimizer, scheduler,
                                               self.extra, rng, policy, keep_last, threads,
                                               background=async_, keep_weights=keep_weights,
                                               weights_policy=weights_policy)
        else:
            self.series = Series(directory, policy, keyframe_every=keyframe_every,
                                 threads=threads)
        self.keep_weights = keep_weights
        self.weights_policy = weights_policy
        if self.series is not None:
            latest = self.series.latest()
            if self.search is not None and latest is not None:  # a resumed run
                self.search.resume(self.series.metadata(latest),
                                   f"{self.series.directory}, step {latest}")
        squares = self.search is not None and self.search.space.per_tensor_bins
        self._space = self.search.space if self.search is not None else None
        self.ema = GradientEMA(model, ema_beta, window=ema_window, squares=squares) \
            if grad_ema and not sharded else None
        self.epsilon = epsilon
        self.restores = restores
        self.max_rel_l2 = max_rel_l2
        # the power of the learning-rate ratio (0: a constant bound)
        self.lr_power = float(epsilon_follows_lr) if optimizer is not None else 0.0
        self.budget = Budget(epsilon, restores, self.lr_power,
                             total_steps if total_steps is not None else run_length(scheduler))
        self.peak_lr: float | None = None
        self._last_step: int | None = None
        self._announced = False
        self.seconds = 0.0
        self.last_report: dict[str, Any] | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="inshrink-checkpointer") \
            if async_ else None
        self._pending: tuple[int, Future] | None = None
        self._closed = False
        self._step_hook = optimizer.register_step_pre_hook(self._before_step) \
            if async_staging == "in_place" else None
        if self._executor is not None or self._sharded is not None:
            # dropped unclosed (nothing pending: a pending save holds it): its thread and
            # groups end then, not at the interpreter's finalization
            weakref.finalize(self, _release, self._executor, self._sharded)
        if async_ or self._sharded is not None:
            with _PENDING_LOCK:
                _OPEN.add(self)
            if not _EXIT_HOOK:
                _at_thread_exit(_close_at_exit)
                _EXIT_HOOK.append(True)

    @staticmethod
    def _check_training_args(model: torch.nn.Module, optimizer: Any, scheduler: Any,
                             extra: Any, rng: Any, async_: Any, keep_last: Any, sharded: Any,
                             eval_batches: Any) -> bool:
        """Check the arguments of the training state, async and sharded modes; return
        whether the sharded mode applies."""
        if optimizer is not None:
            require_optimizer(optimizer)
        if scheduler is not None and not (callable(getattr(scheduler, "state_dict", None))
                                          and callable(getattr(scheduler, "load_state_dict",
                                                               None))):
            raise InvalidArgumentError("scheduler must have state_dict() and "
                                       "load_state_dict()")
        check_extra(extra)
        for name, value in (("rng", rng), ("async_", async_)):
            if type(value) is not bool:
                raise InvalidArgumentError(f"{name} must be True or False")
        if keep_last is not None and (type(keep_last) is not int or keep_last < 1):
            raise InvalidArgumentError("keep_last must be a positive integer or None")
        if sharded is None:
            sharded = False
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                from ..dcp.sharded import is_sharded
                sharded = is_sharded(model)
        elif type(sharded) is not bool:
            raise InvalidArgumentError("sharded must be True, False or None (automatic)")
        if sharded and eval_batches is not None:
            raise InvalidArgumentError(
                "the sharded mode stores what the policy says and runs no configuration "
                "search: eval_batches is not supported with a sharded model")
        return sharded

    def mode(self) -> str:
        """What the checkpoints hold, in words (logged once at the first save)."""
        if self.search is not None:
            return (f"lossy: configuration search, final quality within epsilon="
                    f"{self.epsilon:g} after up to {self.restores} restores")
        policy = self.policy
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

    @property
    def directory(self) -> str:
        """Where the checkpoints are."""
        return self.series.directory if self.series is not None else self._sharded.directory

    def steps(self) -> list[int]:
        """The saved (committed) steps with their whole training state, ascending."""
        if self.series is None:
            return self._sharded.steps()
        models = set(self.series.weights_only_steps())
        return [s for s in self.series.steps() if s not in models]

    def weights_steps(self) -> list[int]:
        """The steps whose model :meth:`restore_model` can load, ascending: every saved step,
        and with ``keep_weights`` the weights-only ones before them."""
        if self.series is not None:
            return self.series.steps()
        return self._sharded.committed()

    def save(self, step: int) -> dict[str, Any]:
        """Checkpoint the training state as ``step`` (after every saved step): the model, the
        optimizer, the scheduler, the random generators and the extras, in one checkpoint.

        Waits for the previous save first; a failure of that one (in async mode) is raised
        here, and this step is not saved. With ``async_``, returns once the state is staged
        (``async_staging``).

        Returns
        -------
        dict
            ``step``, ``bytes`` (of the new file; in sharded mode, of the step's directory),
            ``search`` (the search's report, or None) and ``seconds`` (this call, the wait
            for the previous save included: in async mode, the time training was blocked;
            ``bytes`` and ``search`` are then None and :meth:`wait` returns them).
        """
        # the wait for the previous save is time training is blocked: counted from here
        started = time.perf_counter()
        try:
            self.wait()
        except BaseException:
            self.seconds += time.perf_counter() - started
            raise
        if self._closed:
            raise InvalidArgumentError("save after close(): this Checkpointer is closed")
        if not self._announced:
            _LOG.info("Checkpointer(%s): %s", self.directory, self.mode())
            self._announced = True
        if self._sharded is not None:
            job = self._sharded.stage(step, copy=self._executor is not None,
                                      in_place=self.async_staging == "in_place")
            self._last_step = step
            return self._run(step, job, started)
        if type(step) is not int or not 0 <= step <= MAX_STEP:  # here, not in the background
            raise InvalidArgumentError(f"step must be an integer in [0, {MAX_STEP}]")
        latest = self.series.latest()
        if latest is not None and step <= latest:
            raise InvalidArgumentError(f"step {step} is not after the latest step {latest} "
                                       f"of {self.series.directory}")
        state, metadata = state_to_numpy(self.model, self.optimizer)
        training, metadata[TRAINING_METADATA] = capture(self.scheduler, self.extra, self.rng)
        state.update(training)
        if self.search is not None and self.optimizer is not None:
            # the bound and the moments' configurations for this point of the run
            self.budget.apply(self.search, self._space, self._lr_ratio(), step,
                              self.max_rel_l2)
            metadata[PEAK_LR_METADATA] = repr(self.peak_lr)
        importance, curvature = self._importance(state), self._curvature(state)
        moments = None
        if self.search is not None and self.optimizer is not None and \
                self.moments == "measured":  # the hyperparameters of this step, now
            left = self.budget.total_steps - step if self.budget.total_steps else None
            moments = optimizer_moments(self.model, self.optimizer,
                                        None if left is None else max(1, left))
        versions = None
        if self.async_staging == "in_place":  # the buffers only: a forward pass changes them
            buffers = {MODEL + name for name, _ in
                       self.model.named_buffers(remove_duplicate=False)}
            state = {name: np.array(array, copy=True) if name in buffers else array
                     for name, array in state.items()}
            versions = versions_of(self.model, self.optimizer)
        elif self._executor is not None:  # the staging copy: training goes on meanwhile
            state = {name: np.array(array, copy=True) for name, array in state.items()}
        if self.ema is not None:  # the next checkpoint is expected as far ahead as this one
            gap = None if self._last_step is None else step - self._last_step
            self.ema.start_interval(gap)
        self._last_step = step
        return self._run(step, lambda: self._write(step, state, metadata, importance,
                                                   curvature, moments, versions), started)

    def _write(self, step: int, state: dict[str, np.ndarray], metadata: dict[str, str],
               importance: dict | None, curvature: dict | None,
               moments: list | None = None,
               versions: list | None = None) -> dict[str, Any]:
        """Search, quantize and write one staged checkpoint (in the background if async);
        ``versions``: of the tensors read in place, which must not change before the
        checkpoint is committed."""
        started = time.perf_counter()
        if self._evaluated is not self.model:  # the copy the search evaluates: as staged
            self._evaluated.load_state_dict({name[len(MODEL):]: to_torch(array)
                                             for name, array in state.items()
                                             if name.startswith(MODEL)})
        if hasattr(self.quality, "reset"):
            self.quality.reset()  # the model trained since the last save
        policy, report = None, None
        if self.search is not None:
            self.series.check_step(step)  # before a long search
            result = self.search.choose(state, self.quality, importance, curvature, moments)
            policy, report = result.policy, result.report
            metadata = {**metadata, **result.metadata()}
        unchanged = None if versions is None else functools.partial(check_versions, versions,
                                                                    step)
        self.series.save(step, state, metadata=metadata, importance=importance, policy=policy,
                         before_commit=unchanged)
        size = self.series.checkpoints()[-1].bytes
        if self.keep_weights is not None:
            self.series.retain(self.keep_last, self.keep_weights, model=_is_model,
                               policy=self.weights_policy)
        elif self.keep_last is not None:
            self.series.retain(self.keep_last)
        return {"step": step, "bytes": size, "search": report,
                "seconds": time.perf_counter() - started}

    def _run(self, step: int, job: Callable[[], dict[str, Any]],
             started: float) -> dict[str, Any]:
        """Run a save's job now, or hand it to the background thread."""
        if self._executor is None:
            report = job()
            self.last_report = report
        else:
            self._pending = (step, self._executor.submit(job))
            with _PENDING_LOCK:
                _PENDING.add(self)
            report = {"step": step, "bytes": None, "search": None}
        seconds = time.perf_counter() - started
        self.seconds += seconds
        return {**report, "seconds": seconds}

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """``async_staging="in_place"``: the optimizer's step waits for the save reading the
        state in place (a failure of that save is raised by the next call, not here)."""
        if self._pending is None:
            return
        started = time.perf_counter()
        self._pending[1].exception()  # waits; the outcome is :meth:`wait`'s to report
        self.seconds += time.perf_counter() - started

    def wait(self) -> dict[str, Any] | None:
        """Wait for the save in the background, if any; return its report (as :meth:`save`
        returns in sync mode, ``seconds`` being the background time), None if none was
        pending. Raises what that save raised: the step was then not saved."""
        if self._pending is None:
            return None
        step, future = self._pending
        error = future.exception()  # an interrupt while waiting leaves the save pending
        self._pending = None
        with _PENDING_LOCK:
            _PENDING.discard(self)
        if error is not None:
            if hasattr(error, "add_note"):
                error.add_note(f"raised by the background save of step {step}, which was not "
                               f"saved")
            raise error
        self.last_report = future.result()
        return self.last_report

    def close(self) -> None:
        """Finish the save in the background (raising its failure), stop the thread and, in
        the sharded mode, destroy the background saves' process group. Saving afterwards is
        an error; restoring is not.

        Call it, or use the Checkpointer in a ``with`` block, before the process group is
        destroyed. A Checkpointer left open is closed at interpreter exit, in the main
        thread, before thread pools stop taking work and before ``atexit`` (its pending save
        still finishes; a failure is logged, as there is nobody to raise it to): see Notes,
        **Exit**."""
        try:
            self.wait()
        finally:
            self._closed = True
            if self._step_hook is not None:
                self._step_hook.remove()
                self._step_hook = None
            with _PENDING_LOCK:
                _OPEN.discard(self)
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            if self._sharded is not None:
                self._sharded.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        if exc_type is None:
            self.close()
            return
        try:  # the body's exception goes on; a failed save must still be seen
            self.close()
        except Exception:
            _LOG.exception("Checkpointer(%s): the last save failed", self.directory)

    def restore_model(self, step: int | None = None) -> int:
        """Load the model's tensors of ``step`` (default: the latest) into the model only, from
        a whole checkpoint or a weights-only step (``keep_weights``); return the step.

        Raises
        ------
        InvalidArgumentError
            No such step, or its tensors do not match the model (names, shapes).
        """
        self.wait()
        if self._sharded is not None:
            return self._sharded.restore_model(step)
        known = self.weights_steps()
        if step is None:
            if not known:
                raise InvalidArgumentError(f"no checkpoint in {self.series.directory}")
            step = known[-1]
        if step not in known:
            raise InvalidArgumentError(f"no step {step} in {self.series.directory} "
                                       f"(steps: {known})")
        tensors = {n: a for n, a in self.series.load(step).items() if _is_model(n)}
        load_state(tensors, self.series.metadata(step), self.model, None)
        return step

    def restore(self, step: int | None = None) -> int:
        """Load ``step`` (default: the latest) into the model, the optimizer, the scheduler,
        the extras and (``rng``) the random generators; return the step.

        Waits for a save in the background first (raising its failure). Everything is read
        and checked before anything is modified. The search continues from the restored
        checkpoint's choice, and the gradient average starts afresh (captured again in the
        last ``ema_window`` steps before the next save).

        Raises
        ------
        InvalidArgumentError
            No checkpoint; or the checkpoint does not match: names or shapes, a scheduler or
            an extra it lacks, an extra it holds that was not given (a checkpoint saved
            before the training state was stored restores the model and optimizer only).
        """
        self.wait()
        if self._sharded is not None:
            if self.keep_weights is not None:
                refuse_weights_only(step, self._sharded.steps(), self._sharded.committed(),
                                    self._sharded.directory, f"restore_model({step})")
            step = self._sharded.restore(step)
            self._last_step = step
            return step
        if step is None:
            step = self.series.latest()
            if step is None:
                raise InvalidArgumentError(f"no checkpoint in {self.series.directory}")
        refuse_weights_only(step, self.steps(), self.series.weights_only_steps(),
                            self.series.directory, f"restore_model({step})")
        tensors = self.series.load(step)
        metadata = self.series.metadata(step)
        training = decode(metadata.get(TRAINING_METADATA),
                          {n: a for n, a in tensors.items() if n.startswith(TRAINING)},
                          scheduler=self.scheduler is not None, extra=self.extra, rng=self.rng,
                          where=f"{self.series.directory}, step {step}")
        tensors = {n: a for n, a in tensors.items() if not n.startswith(TRAINING)}
        load_state(tensors, metadata, self.model, self.optimizer)
        training.apply(self.scheduler, self.extra, self.rng)
        if self.search is not None:
            self.search.resume(metadata, f"{self.series.directory}, step {step}")
        self.peak_lr = _peak_lr(metadata) or self.peak_lr
        if self.ema is not None:
            self.ema.start_interval(self.ema.interval)
        self._last_step = step
        return step


def _is_model(name: str) -> bool:
    """Whether a state tensor is the model's (what a weights-only step keeps)."""
    return name.startswith(MODEL)
