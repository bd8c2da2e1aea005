"""The search itself: :class:`Search` validates its arguments, runs one walk of the cube per
checkpoint (guided first, neighbourhood after), remembers the previous choice and turns the
choice into a policy and a report (:class:`SearchResult`)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .. import dtypes
from ..errors import InvalidArgumentError
from ..encode.policy import LOSSY_DTYPES, Policy, QuantConfig, role_of
from .allocation import allocation
from .evaluate import Evaluator, Settings, SizeTable
from .moments import DEFAULT_SHARE, Moments, choose_moments
from .predict import DropModel
from .space import Choice, Quality, SearchSpace
from .stored import report_metadata, stored_choice
from .walk import guided, neighbourhood

SEARCHED_ROLES = ("weight", "embedding")


@dataclass
class SearchResult:
    """What :meth:`Search.choose` decided.

    Attributes
    ----------
    policy : Policy
        What to save the checkpoint with.
    choice : Choice or None
        The configuration of the weights; None when they stay lossless (nothing feasible) or
        in proxy mode.
    report : dict
        JSON-serialisable: the mode, the baseline quality, every evaluation (configuration,
        quality, relative drop, feasibility, stored bytes, phase), why the choice was made,
        and where the time went: ``quality_seconds`` (the callback, baseline included),
        ``encode_seconds`` (candidate encodings), ``size_table_seconds`` (the expected sizes,
        measured at a guided search) and ``tensor_encodings`` (tensors encoded; a tensor whose
        configuration a previous candidate had is not encoded again).
    """

    policy: Policy
    choice: Choice | None
    report: dict = field(default_factory=dict)

    def metadata(self) -> dict[str, str]:
        """The checkpoint metadata that stores :attr:`report` (under
        :data:`~inshrink.search.stored.SEARCH_KEY`): save it with the checkpoint, e.g.
        ``series.save(step, state, policy=result.policy, metadata=result.metadata())``, and
        :meth:`Search.resume` continues from it after a restart."""
        return report_metadata(self.report)



class Search:
    """Chooses a configuration per checkpoint; remembers the previous choice and the quality
    drops measured so far (see ``predict``); a choice is always one measured within the bound
    on its own checkpoint.

    Parameters
    ----------
    epsilon : float
        Allowed relative quality drop (0.05: within 5% of the uncompressed state's quality).
    higher_is_better : bool
        False for a loss (the default), True for an accuracy-like metric.
    space : SearchSpace, optional
        The configurations to choose from.
    max_evals : int
        Hard cap on evaluations (encodings of a candidate) per checkpoint; the baseline's
        quality is not counted.
    max_rel_l2 : float, optional
        A second bound next to ``epsilon``: a configuration is feasible only if the relative
        L2 error ``||x - x̂|| / ||x||`` of every searched tensor is at most this, a guarantee
        on the stored weights themselves. A candidate above the bound is rejected without
        calling the quality callback. It is dominated by the largest entries, which
        protection keeps exact, so it says little about the bulk of small weights (it did not
        improve resumed training in the fault benchmark: docs/decisions.md). None: no such
        bound (the paper's criterion alone).
    two_sided : bool
        Feasible only if the quality moves by at most ``epsilon`` in *either* direction. A
        loss on a few batches moves either way by chance, and a coarse candidate that lowered
        it by 1.4% was a lucky draw that resumed training paid for (docs/decisions.md);
        :class:`inshrink.torch.Checkpointer` sets it.
    threads : int, optional
        Encoder/decoder threads for the candidate encodings.
    predict : bool
        After the first checkpoint, evaluate first the neighbours whose quality drop,
        predicted from the drops measured on earlier checkpoints, is within epsilon, and take
        the first one measured feasible: about 1.4 evaluations per later checkpoint instead
        of 2.1–2.9 on the fault benchmark, but larger files there (ratio -7% to -9%: a cheaper
        neighbour predicted infeasible is not tried, and the search never gets more
        aggressive again). False (the default): the cheapest feasible neighbour, in order of
        expected size; the predictions only skip the probe of the neighbourhood's most
        precise point when they say it is feasible. Either way a choice is a candidate
        measured within the bounds on its own checkpoint.

    Examples
    --------
    >>> search = Search(epsilon=0.05)                                   # doctest: +SKIP
    >>> result = search.choose(state, quality=eval_loss)                # doctest: +SKIP
    >>> inshrink.save("step_100.ink", state, policy=result.policy)      # doctest: +SKIP
    """

    def __init__(self, epsilon: float = 0.05, *, higher_is_better: bool = False,
                 space: SearchSpace | None = None, max_evals: int = 24,
                 max_rel_l2: float | None = None, two_sided: bool = False,
                 threads: int | None = None, predict: bool = False) -> None:
        if not (isinstance(epsilon, (int, float)) and 0 <= epsilon < math.inf):
            raise InvalidArgumentError("epsilon must be a non-negative number")
        if max_rel_l2 is not None and not (isinstance(max_rel_l2, (int, float))
                                           and 0 < max_rel_l2 < math.inf):
            raise InvalidArgumentError("max_rel_l2 must be a positive number or None")
        if type(max_evals) is not int or max_evals < 1:
            raise InvalidArgumentError("max_evals must be a positive integer")
        if space is not None and not isinstance(space, SearchSpace):
            raise InvalidArgumentError("space must be a SearchSpace")
        self.epsilon = float(epsilon)
        self.higher_is_better = bool(higher_is_better)
        self.space = space or SearchSpace()
        self.max_evals = max_evals
        self.max_rel_l2 = None if max_rel_l2 is None else float(max_rel_l2)
        self.two_sided = bool(two_sided)
        self.threads = threads
        self.predict = bool(predict)
        self.previous: Choice | None = None
        self._size_table: SizeTable | None = None  # the last checkpoint's expected sizes
        self._drops: DropModel | None = None  # what earlier checkpoints measured

    def resume(self, metadata: Mapping[str, str], where: str = "checkpoint") -> None:
        """Continue from the choice stored in a checkpoint's metadata
        (:meth:`SearchResult.metadata`): the next :meth:`choose` searches the neighbourhood of
        that choice, as if this object had made it. A checkpoint saved without a search, or
        whose search kept the weights lossless, starts the next search afresh.

        Raises
        ------
        CorruptError
            The stored report is not one a search wrote (``where`` names the checkpoint).
        """
        self.previous = stored_choice(metadata, where)

    def settings(self) -> Settings:
        """What the evaluations of the next checkpoint obey (the attributes as they are now)."""
        return Settings(space=self.space, epsilon=self.epsilon,
                        higher_is_better=self.higher_is_better, max_evals=self.max_evals,
                        max_rel_l2=self.max_rel_l2, two_sided=self.two_sided,
                        threads=self.threads)

    def proxy_policy(self) -> Policy:
        """Without a callback: per tensor, the fewest bins meeting the error bound."""
        space = self.space
        weight = QuantConfig(bins=space.bins[-1], protect=space.protect[0],
                             max_rel_l2=space.proxy_rel_l2)
        embedding = QuantConfig(bins=space.embedding_bins[-1], protect=space.protect[0],
                                max_rel_l2=space.proxy_rel_l2)
        return Policy({"weight": weight, "embedding": embedding, **space.moments()})

    def choose(self, tensors: Mapping[str, Any], quality: Quality | None,
               importance: Mapping[str, Any] | None = None,
               curvature: Mapping[str, Any] | None = None,
               moments: Sequence[Moments] | None = None,
               moment_share: float = DEFAULT_SHARE) -> SearchResult:
        """Choose the configuration for one checkpoint.

        Parameters
        ----------
        tensors : mapping of str to array-like
            The checkpoint's state (weights, optimizer state...).
        quality : callable or None
            ``quality(state) -> float`` on a dict like ``tensors`` with some tensors replaced
            by their decoded versions. None: proxy mode (per-tensor error bounds). One that
            also has ``bounded(state, limit)`` (:class:`~inshrink.search.BoundedQuality`,
            e.g. ``quality_from(..., criterion="kl")``) is given the largest feasible quality
            and may stop evaluating a candidate once it exceeds it: the same decisions, fewer
            batches (such a candidate is marked ``stopped`` in the report, its ``quality``
            and ``drop`` None).
        importance : mapping of str to array-like, optional
            Sensitivity scores (|g·w|) per tensor; enables the "sensitivity" prune metric.
        curvature : mapping of str to array-like, optional
            Per tensor, an average of squared gradients (e.g. over the last steps, or Adam's
            ``exp_avg_sq`` of that parameter), each of its tensor's shape: with
            ``space.per_tensor_bins``, sensitive tensors get more bins than the
            configuration's and insensitive ones fewer (:func:`allocation`). Tensors left out
            keep the configuration's bins.
        moments : sequence of Moments, optional
            The optimizer's parameters as :mod:`inshrink.search.moments` describes them: the
            moments' configurations are then chosen per checkpoint by the displacement of
            the weights they would cause, within ``moment_share`` of the weights' own error
            at the chosen configuration (:func:`~inshrink.search.moments.choose_moments`;
            no quality evaluation). None: the search space's fixed configurations.
        moment_share : float
            See :func:`~inshrink.search.moments.choose_moments`.

        Returns
        -------
        SearchResult

        Notes
        -----
        Each evaluation encodes the weights and embedding tables in memory, exactly as a
        save with the candidate's policy would, and decodes them (no file is written). The
        last encodings of each tensor are kept, so a candidate that changes only the
        embedding bins re-encodes only the embeddings: besides ``tensors`` itself the search
        holds two decoded copies of those tensors while they are below 256 MiB, one above.
        """
        started = time.perf_counter()
        if quality is None:
            return SearchResult(self.proxy_policy(), None, {
                "mode": "proxy", "max_rel_l2": self.space.proxy_rel_l2, "chosen": None})
        if not callable(quality):
            raise InvalidArgumentError("quality must be a callable or None")
        if not isinstance(tensors, Mapping):
            raise InvalidArgumentError("tensors must be a mapping of names to arrays")
        if importance is not None and not isinstance(importance, Mapping):
            raise InvalidArgumentError("importance must be a mapping of tensor names to scores")
        if moments is not None and (isinstance(moments, (str, bytes, Mapping)) or
                                    not all(isinstance(g, Moments) for g in moments)):
            raise InvalidArgumentError("moments must be a sequence of Moments")
        arrays = {name: dtypes.as_numpy(v) for name, v in tensors.items()}
        roles = {name: role_of(name, dtypes.of_numpy(a.dtype).name, a.shape)
                 for name, a in arrays.items()}
        searched = {name: a for name, a in arrays.items() if roles[name] in SEARCHED_ROLES}
        importance = {name: v for name, v in (importance or {}).items() if name in searched}
        shifts = self._shifts(searched, roles, curvature)
        metrics = [m for m in self.space.prune_metrics
                   if m == "magnitude" or importance]
        report: dict[str, Any] = {"epsilon": self.epsilon, "max_rel_l2": self.max_rel_l2,
                                  "two_sided": self.two_sided,
                                  "higher_is_better": self.higher_is_better,
                                  "max_evals": self.max_evals, "predict": self.predict,
                                  "searched_tensors": len(searched)}
        if not searched:
            report.update(mode="none", chosen=None, reason="no tensor to quantize")
            choice = None
        else:
            # a fresh search measures sizes afresh; a later one reuses the table
            ev = Evaluator(self.settings(), arrays, searched, quality, importance, shifts,
                           roles, sizes=None if self.previous is None else self._size_table)
            try:
                if not metrics:
                    report.update(mode="none", reason="no usable prune metric")
                    choice = None
                elif self.previous is None:
                    choice, why = guided(ev, (0,) * 4, self.space.top(), metrics, "guided")
                    report.update(mode="guided", reason=why)
                else:
                    model = self._drops if self._drops is not None and \
                        self._drops.axes == self.space.axes() else None
                    choice, why, mode = neighbourhood(ev, self.previous, metrics, model,
                                                      self.predict)
                    report.update(mode=mode, reason=why)
            finally:  # a table built before a failing callback is still valid
                if ev.sizes is not None:
                    self._size_table = ev.sizes
            if self._drops is None or self._drops.axes != self.space.axes():
                self._drops = DropModel(self.space.axes())
            self._drops.observe(ev.results, self.two_sided)
            report.update(baseline=ev.baseline, evaluations=ev.log,
                          evaluations_used=len(ev.log),
                          cap_reached=len(ev.log) >= self.max_evals,
                          raw_bytes=ev.raw_bytes, tensor_encodings=ev.encode.encodings,
                          **{f"{part}_seconds": t for part, t in ev.seconds.items()})
            report["chosen_result"] = None if choice is None else \
                ev.results[(self.space.point(choice), choice.prune_metric)]
        report["chosen"] = choice.to_dict() if choice else None
        policy = choice.policy(self.space, shifts) if choice else \
            Policy(dict(self.space.moments()))  # weights lossless, moments as configured
        if moments is not None:
            error = 0.0
            if choice is not None:  # the kept encodings: normally nothing is encoded again
                decoded = ev.roundtrip(choice)[0]
                error = math.sqrt(sum(float(np.linalg.norm(
                    decoded[n].astype(np.float64) - searched[n])) ** 2 for n in searched))
            policy, report["moments"] = choose_moments(arrays, list(moments), error, policy,
                                                       moment_share)
        report["shift_bits"] = {name: round(bits, 3) for name, (_, bits) in shifts.items()}
        report["allocation"] = {name: c.bins for name, c in policy.tensors.items()}
        report["seconds"] = time.perf_counter() - started
        if choice is not None:
            self.previous = choice
        return SearchResult(policy, choice, report)

    def _shifts(self, searched: dict[str, np.ndarray], roles: Mapping[str, str],
                curvature: Mapping[str, Any] | None) -> dict[str, tuple[str, float]]:
        """The per-tensor allocation (empty without curvature or when switched off)."""
        if curvature is None or not self.space.per_tensor_bins:
            return {}
        if not isinstance(curvature, Mapping):
            raise InvalidArgumentError("curvature must be a mapping of names to arrays")
        arrays = {}
        for name, value in curvature.items():
            if name not in searched:
                continue
            array = dtypes.as_numpy(value)
            if array.shape != searched[name].shape or \
                    dtypes.of_numpy(array.dtype).name not in LOSSY_DTYPES:
                raise InvalidArgumentError(
                    f"curvature of {name!r}: expected a float array of shape "
                    f"{searched[name].shape}, got {array.dtype} {array.shape}")
            arrays[name] = array
        return allocation(searched, roles, arrays)

