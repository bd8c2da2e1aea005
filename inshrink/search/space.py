"""The configuration cube: :class:`SearchSpace` (its axes and fixed moment configurations),
:class:`Choice` (one point of it, and the policy that applies it) and cube points."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Mapping, Protocol, runtime_checkable

import numpy as np

from ..errors import InvalidArgumentError
from ..encode.policy import MAX_BINS, PRUNE_METRICS, Policy, QuantConfig
from .allocation import Shifts, shifted

Quality = Callable[[dict[str, np.ndarray]], float]


@runtime_checkable
class BoundedQuality(Protocol):
    """A quality callback (lower is better) that may stop an evaluation early.

    Besides ``quality(state) -> float`` it has ``bounded(state, limit) -> (value, complete)``:
    with ``complete`` True, ``value`` is exactly what ``quality(state)`` returns; with
    ``complete`` False, the batches evaluated so far prove that quality above ``limit``, and
    ``value`` is a lower bound of it, itself above ``limit``. The search passes the largest
    feasible quality as ``limit``, so a stopped candidate is infeasible whatever the remaining
    batches say, and every decision is the one a complete evaluation would have made. Only a
    quality that can only grow with each batch can stop: a mean of a loss over batches
    cannot (a later batch may bring it back down), a loss plus a mean of divergences, each
    at least zero, can (``quality_from(..., criterion="kl")``). It is not used with
    ``Search(higher_is_better=True)``.
    """

    def __call__(self, state: dict[str, np.ndarray]) -> float: ...

    def bounded(self, state: dict[str, np.ndarray],
                limit: float) -> tuple[float, bool]: ...
Point = tuple[int, ...]  # indices on the axes, higher = more precise



def _ascending(name: str, values: Any, check: Callable[[Any], bool]) -> tuple:
    values = tuple(values)
    if not values or any(not check(v) for v in values) or list(values) != sorted(set(values)):
        raise InvalidArgumentError(f"search space: {name} must be a non-empty, strictly "
                                   f"increasing sequence of valid values, got {values!r}")
    return values


@dataclass(frozen=True)
class SearchSpace:
    """The configurations the search may choose from.

    Parameters
    ----------
    bins, embedding_bins : tuple of int
        Quantization levels for weights and for embedding tables (more levels = more precise).
        Both end at 1024 and 4096 levels: where a falling bound rules out 256, the weights get
        10- or 12-bit codes, which a series stores as deltas of mostly unchanged codes,
        rather than lossless weights (docs/decisions.md).
    prune : tuple of float
        Fractions of each weight tensor set to zero (embeddings are never pruned).
    protect : tuple of float
        Fractions stored exactly (the largest by magnitude, and by sensitivity if given).
    prune_metrics : tuple of str
        "magnitude" and/or "sensitivity" (the latter only when importance is given).
    exp_avg, exp_avg_sq : QuantConfig or None
        Fixed configurations of the optimizer moments (None: lossless). By default the first
        moment (Adam's ``exp_avg``, SGD's momentum) is stored as zeros except its 0.05%
        largest entries, kept exactly (``bins=0``): a restore restarts momentum, which the
        optimizer rebuilds within ~1/(1 - beta1) steps, and a third of an Adam checkpoint
        costs almost nothing (docs/decisions.md). ``exp_avg_sq`` is stored at 4 log-domain
        levels: as row × column factors (``QuantConfig(bins=2, domain="factored")``,
        Adafactor's approximation, a sixth of the bytes) it left, with the restarted first
        moment, +1.37% on the final loss of the fault benchmark's lm (seed 1) where 4 levels
        left +0.77%; keeping the first moment at 2 levels instead (+0.60%) made the weights
        harder to quantize afterwards (benchmarks/RESULTS.md).
    late_exp_avg : QuantConfig or None
        The first moment's configuration late in a decaying schedule, where
        :class:`inshrink.torch.Checkpointer` uses it (learning rate below
        ``inshrink.torch.LATE_LR`` of its peak): a restart of momentum there left lasting
        damage that the few small steps left did not undo (docs/decisions.md). Default: 2
        levels in the signed-log domain (sign and magnitude class). None: lossless.
    proxy_rel_l2 : float
        Without a quality callback: the per-tensor relative L2 error bound of the weights.
    sigma : float
        Bucket weighting of the weights' and embeddings' level fitting (``QuantConfig.sigma``:
        sigma·frequency + (1 - sigma)·magnitude; the paper's 0.2 by default).
    per_tensor_bins : bool
        With curvature given to :meth:`Search.choose`: spread the bins of a configuration
        over the tensors by sensitivity (see :func:`allocation`); False: every weight tensor
        gets the configuration's bins, as in the paper.
    """

    bins: tuple[int, ...] = (4, 6, 8, 12, 16, 32, 64, 128, 256, 1024, 4096)
    embedding_bins: tuple[int, ...] = (16, 32, 64, 128, 256, 1024, 4096)
    prune: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
    protect: tuple[float, ...] = (0.0005, 0.005, 0.01)
    prune_metrics: tuple[str, ...] = PRUNE_METRICS
    exp_avg: QuantConfig | None = QuantConfig(bins=0)
    exp_avg_sq: QuantConfig | None = QuantConfig(bins=4)
    late_exp_avg: QuantConfig | None = QuantConfig(bins=2)
    proxy_rel_l2: float = 0.01
    sigma: float = 0.2
    per_tensor_bins: bool = False

    def __post_init__(self) -> None:
        is_bins = lambda b: type(b) is int and 2 <= b <= MAX_BINS  # noqa: E731
        is_fraction = lambda f: isinstance(f, (int, float)) and 0 <= f < 1  # noqa: E731
        object.__setattr__(self, "bins", _ascending("bins", self.bins, is_bins))
        object.__setattr__(self, "embedding_bins",
                           _ascending("embedding_bins", self.embedding_bins, is_bins))
        object.__setattr__(self, "prune", _ascending("prune", self.prune, is_fraction))
        object.__setattr__(self, "protect", _ascending("protect", self.protect, is_fraction))
        if self.prune[-1] + self.protect[-1] >= 1:
            raise InvalidArgumentError("search space: largest prune + protect must be below 1")
        metrics = tuple(self.prune_metrics)
        if not metrics or any(m not in PRUNE_METRICS for m in metrics) or \
                len(set(metrics)) != len(metrics):
            raise InvalidArgumentError(f"search space: prune_metrics must be distinct values "
                                       f"of {PRUNE_METRICS}")
        object.__setattr__(self, "prune_metrics", metrics)
        for name in ("exp_avg", "exp_avg_sq", "late_exp_avg"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name),
                                                                  QuantConfig):
                raise InvalidArgumentError(f"search space: {name} must be a QuantConfig or None")
        if not (isinstance(self.proxy_rel_l2, (int, float)) and 0 < self.proxy_rel_l2 < 1):
            raise InvalidArgumentError("search space: proxy_rel_l2 must be in (0, 1)")
        if not (isinstance(self.sigma, (int, float)) and 0 <= self.sigma <= 1):
            raise InvalidArgumentError("search space: sigma must be in [0, 1]")

    def axes(self) -> tuple[tuple, ...]:
        """The cube's axes, each ordered from least to most precise."""
        return (self.bins, self.embedding_bins, tuple(reversed(self.prune)), self.protect)

    def top(self) -> Point:
        return tuple(len(a) - 1 for a in self.axes())

    def choice(self, point: Point, metric: str) -> "Choice":
        bins, embedding_bins, prune, protect = (a[i] for a, i in zip(self.axes(), point))
        return Choice(bins, embedding_bins, prune, protect, metric)

    def point(self, choice: "Choice") -> Point:
        """The cube point of a choice; a value not on an axis maps to the next more precise
        one (the search never gets more aggressive than a previous choice)."""
        values = (choice.bins, choice.embedding_bins, choice.prune, choice.protect)
        point = []
        for axis, value, up in zip(self.axes(), values, (1, 1, -1, 1)):
            at = [i for i, v in enumerate(axis) if (v - value) * up >= 0]
            point.append(at[0] if at else len(axis) - 1)
        return tuple(point)

    def moments(self) -> dict[str, QuantConfig | None]:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq}


@dataclass(frozen=True)
class Choice:
    """One configuration of the cube: what the search returns and stores."""

    bins: int
    embedding_bins: int
    prune: float
    protect: float
    prune_metric: str = "magnitude"

    def policy(self, space: SearchSpace, shifts: Shifts | None = None) -> Policy:
        """The policy that applies this choice (moments from the search space), with each
        tensor of ``shifts`` (see :func:`allocation`) moved along its role's bins axis."""
        weight = QuantConfig(bins=self.bins, prune=self.prune, protect=self.protect,
                             prune_metric=self.prune_metric, sigma=space.sigma)
        embedding = QuantConfig(bins=self.embedding_bins, protect=self.protect,
                                sigma=space.sigma)
        tensors = {}
        for name, (role, bits) in (shifts or {}).items():
            base, axis = (weight, space.bins) if role == "weight" else \
                (embedding, space.embedding_bins)
            bins = shifted(axis, base.bins, bits)
            if bins != base.bins:
                tensors[name] = replace(base, bins=bins)
        return Policy({"weight": weight, "embedding": embedding, **space.moments()},
                      tensors=tensors)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Choice":
        """The inverse of :meth:`to_dict` (e.g. read back from a checkpoint's metadata)."""
        try:
            choice = cls(int(data["bins"]), int(data["embedding_bins"]), float(data["prune"]),
                         float(data["protect"]), str(data["prune_metric"]))
            choice.policy(SearchSpace())  # validates every value
            if min(choice.bins, choice.embedding_bins) < 2:
                raise ValueError("a searched tensor has at least 2 levels")
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"not a search choice: {data!r}") from exc
        return choice
