"""Per-checkpoint configuration search (the paper's section 5).

Given the state to compress and a quality callback (the caller's loss or accuracy on a few
held-out batches), :class:`Search` picks the most compressive configuration of the weights
whose quality stays within a relative ``epsilon`` of the uncompressed state:

* the first checkpoint gets the *guided search* over the configuration cube (bins, embedding
  bins, prune fraction, protect fraction), once per prune metric: quality is monotone along
  every axis, so a binary search along the cube's diagonal finds a feasible point, and only
  the sub-cubes that can hold a smaller feasible point are searched next, most promising
  first (branch and bound on an expected size);
* later checkpoints get the *neighbourhood search*: the previous choice and its neighbours one
  step towards more precision (never more aggressive), smallest expected size first, the first
  feasible one wins; when none is feasible, the guided search over the cube above the previous
  choice.

Every evaluation compresses the searched tensors with the candidate configuration, decodes
them and calls the callback, so a chosen configuration is one whose *actual* encoding was
measured within ``epsilon``; a hard cap bounds the evaluations, and when nothing feasible is
found the weights are stored losslessly. Optimizer moments are not seen by a model-quality
callback: they get the fixed configurations of the search space. All weight tensors share a
configuration's bins unless ``SearchSpace.per_tensor_bins`` spreads them by curvature
(:func:`allocation`). The decisions behind the rules are recorded in ``docs/decisions.md``.
"""
from __future__ import annotations

import heapq
import itertools
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np

from . import dtypes
from .errors import InvalidArgumentError
from .policy import LOSSY_DTYPES, MAX_BINS, PRUNE_METRICS, Policy, QuantConfig, role_of

Quality = Callable[[dict[str, np.ndarray]], float]
Point = tuple[int, ...]  # indices on the axes, higher = more precise

SEARCHED_ROLES = ("weight", "embedding")
NEIGHBOURHOOD = 1
"""Radius of the neighbourhood search, in steps along each axis."""
SAMPLE = 4096
"""Elements per tensor encoded to estimate the size of a configuration (64 blocks of 64,
spread evenly over the tensor)."""
SIGNIFICANT = 0.25
"""The other prune metric is adopted when it lowers the quality drop by this share of ε."""
MAX_SHIFT_BITS = 3.0
"""Per-tensor allocation moves a tensor at most this many bits away from the base bins."""


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
        costs almost nothing (docs/decisions.md). ``exp_avg_sq`` of a matrix is stored as the
        outer product of row and column factors (``domain="factored"``, Adafactor's
        approximation: one restore from it did less lasting damage than 2 levels); other
        tensors get 2 log-domain levels.
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

    bins: tuple[int, ...] = (4, 6, 8, 12, 16, 32, 64, 128, 256)
    embedding_bins: tuple[int, ...] = (16, 32, 64, 128, 256)
    prune: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
    protect: tuple[float, ...] = (0.0005, 0.005, 0.01)
    prune_metrics: tuple[str, ...] = PRUNE_METRICS
    exp_avg: QuantConfig | None = QuantConfig(bins=0)
    exp_avg_sq: QuantConfig | None = QuantConfig(bins=2, domain="factored")
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


Shifts = Mapping[str, tuple[str, float]]
"""Per searched tensor: (its role, bits above the configuration's bins; negative = below)."""

ALLOCATION_SAMPLE = 1 << 20
"""Elements per tensor (evenly strided) from which allocation estimates a tensor's spread."""


def allocation(searched: Mapping[str, np.ndarray], roles: Mapping[str, str],
               curvature: Mapping[str, np.ndarray]) -> dict[str, tuple[str, float]]:
    """How many bits each tensor should get above or below a configuration's bins.

    Quantizing tensor t with levels about ``sigma_t / bins_t`` apart raises the loss by about
    ``1/2 * sum_i F_i * delta_i**2 ~ n_t * mean(F_t) * sigma_t**2 / bins_t**2``, with F the
    curvature (an average of squared gradients: a diagonal Fisher estimate). For a given
    number of bits the sum over tensors is smallest with ``bins_t`` proportional to
    ``sqrt(mean(F_t)) * sigma_t``: each tensor gets log2 of that against the element-weighted
    geometric mean of its role (weights and embeddings separately), within
    ``MAX_SHIFT_BITS``. Tensors without curvature, or whose estimate is not finite, get 0;
    a tensor with zero curvature (no gradient seen) gets the least.
    """
    groups: dict[str, list[tuple[str, int, float]]] = {}
    for name, array in searched.items():
        if name not in curvature or array.size == 0:
            continue
        flat = array.reshape(-1)
        sample = flat[::max(1, flat.size // ALLOCATION_SAMPLE)].astype(np.float64)
        with np.errstate(all="ignore"):
            score = float(np.mean(curvature[name], dtype=np.float64)) * float(np.var(sample))
        if math.isfinite(score) and score >= 0:
            groups.setdefault(roles[name], []).append((name, array.size, score))
    shifts = {}
    for role, members in groups.items():
        positive = [(size, score) for _, size, score in members if score > 0]
        if not positive:
            continue
        reference = sum(size * math.log2(score) for size, score in positive) / \
            sum(size for size, _ in positive)
        for name, _, score in members:
            bits = 0.5 * (math.log2(score) - reference) if score > 0 else -MAX_SHIFT_BITS
            shifts[name] = (role, max(-MAX_SHIFT_BITS, min(MAX_SHIFT_BITS, bits)))
    return shifts


def _shifted(axis: tuple[int, ...], bins: int, bits: float) -> int:
    """The value of ``axis`` nearest (in log2) to ``bins * 2**bits``; ties go up."""
    target = math.log2(bins) + bits
    return min(reversed(axis), key=lambda v: abs(math.log2(v) - target))


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
            bins = _shifted(axis, base.bins, bits)
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
        quality, relative drop, feasibility, stored bytes, phase) and why the choice was made.
    """

    policy: Policy
    choice: Choice | None
    report: dict = field(default_factory=dict)


class _Evaluator:
    """Evaluates configurations on the searched tensors, with a cache, the monotonicity
    shortcuts and the evaluation cap."""

    def __init__(self, search: "Search", tensors: dict[str, np.ndarray],
                 searched: dict[str, np.ndarray], quality: Quality,
                 importance: dict[str, Any], shifts: Shifts, roles: Mapping[str, str],
                 workdir: str) -> None:
        self.search, self.space = search, search.space
        self.tensors, self.searched, self.quality = tensors, searched, quality
        self.importance, self.shifts, self.workdir = importance, shifts, workdir
        self.results: dict[tuple[Point, str], dict] = {}
        self.log: list[dict] = []
        self.budget = search.max_evals  # a phase may lower it to share the cap
        self.baseline = self._call(tensors)
        if not math.isfinite(self.baseline):
            raise InvalidArgumentError(f"the quality of the uncompressed state is "
                                       f"{self.baseline}; the search needs a finite value")
        self.raw_bytes = sum(a.nbytes for a in searched.values())
        self.roles = roles
        # the expected size of every point, built when first needed; a neighbourhood search
        # reuses the previous checkpoint's (it only orders a few candidates)
        self.shapes = tuple(sorted((n, a.shape, a.dtype.str) for n, a in searched.items()))
        cached = search._size_table
        self._bits = cached[1] if cached and cached[0] == self.shapes else None

    def _call(self, state: dict[str, np.ndarray]) -> float:
        value = self.quality(state)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"the quality callback returned {value!r}, "
                                       f"not a number") from None

    @property
    def left(self) -> int:
        return min(self.search.max_evals, self.budget) - len(self.log)

    def drop(self, value: float) -> float:
        """Relative quality drop from the baseline (positive = worse)."""
        scale = abs(self.baseline) or 1.0
        change = (self.baseline - value) if self.search.higher_is_better else \
            (value - self.baseline)
        return change / scale if math.isfinite(value) else math.inf

    def expected_bits(self, point: Point) -> float:
        """Expected stored bits of the searched tensors at a configuration, to order and bound
        candidates (the choice itself goes by measured bytes)."""
        if self._bits is None:
            self._bits = self._size_table()
            self.search._size_table = (self.shapes, self._bits)
        return float(self._bits[point])

    def _size_table(self) -> np.ndarray:
        """Expected bits at every point of the cube: per (bins, prune) the bits per element
        measured by encoding a sample of every searched tensor (pruned zeros are not free:
        they add a code), plus value and position bits per protected element."""
        space = self.space
        bins_axis, emb_axis, prune_axis, protect_axis = space.axes()
        weights = {n: a for n, a in self.searched.items() if self.roles[n] != "embedding"}
        embeddings = {n: a for n, a in self.searched.items() if self.roles[n] == "embedding"}
        weight_bits = np.array([[self._sample_bits(weights, QuantConfig(
            bins=b, prune=p, protect=0.0)) for p in prune_axis] for b in bins_axis])
        emb_bits = np.array([self._sample_bits(embeddings, QuantConfig(bins=b, protect=0.0))
                             for b in emb_axis])
        protect_bits = sum(a.size * (a.dtype.itemsize * 8 + 32)
                           for a in self.searched.values()) * np.array(protect_axis)
        return (weight_bits[:, None, :, None] + emb_bits[None, :, None, None]
                + protect_bits[None, None, None, :])

    def _sample_bits(self, tensors: dict[str, np.ndarray], config: QuantConfig) -> float:
        """Stored bits of ``tensors`` estimated from SAMPLE elements of each."""
        if not tensors:
            return 0.0
        from .api import save
        sample, scale = {}, {}
        for name, a in tensors.items():
            flat = a.reshape(-1)
            blocks = flat.size // 64  # searched tensors have >= 4096 elements
            rows = np.unique(np.linspace(0, blocks - 1, min(blocks, SAMPLE // 64)).round()
                             .astype(np.int64))
            sample[name] = flat[:blocks * 64].reshape(blocks, 64)[rows]  # keeps the role
            scale[name] = flat.size / sample[name].size
        path = os.path.join(self.workdir, "sample.ink")
        infos = save(path, sample, policy=Policy.uniform(config), threads=self.search.threads)
        os.unlink(path)
        return sum(8 * i.stored_bytes * scale[i.name] for i in infos)

    def region_min(self, lo: Point, hi: Point) -> tuple[float, Point]:
        """The smallest expected size in the cube [lo, hi] and the point that has it."""
        self.expected_bits(lo)  # builds the table
        region = self._bits[tuple(slice(l, h + 1) for l, h in zip(lo, hi))]
        at = np.unravel_index(int(np.argmin(region)), region.shape)
        return float(region[at]), tuple(int(l + i) for l, i in zip(lo, at))

    def known(self, point: Point, metric: str) -> bool | None:
        """Feasibility implied by monotonicity from what was evaluated, or None."""
        for (p, m), r in self.results.items():
            if m != metric:
                continue
            if r["feasible"] and all(a >= b for a, b in zip(point, p)):
                return True
            if not r["feasible"] and all(a <= b for a, b in zip(point, p)):
                return False
        return None

    def evaluate(self, point: Point, metric: str, phase: str) -> dict | None:
        """Evaluate (cached); None when the cap is reached."""
        if (point, metric) in self.results:
            return self.results[(point, metric)]
        if self.space.choice(point, metric).prune == 0:
            for (p, _), result in list(self.results.items()):
                if p == point:  # without pruning, the metric changes nothing
                    self.results[(point, metric)] = result
                    return result
        if self.left <= 0:
            return None
        choice = self.space.choice(point, metric)
        decoded, stored, rel_l2 = self._roundtrip(choice)
        bound = self.search.max_rel_l2
        if bound is not None and not rel_l2 <= bound:
            # too coarse whatever the quality says: the callback is not called
            value = drop = None
            feasible = False
        else:
            value = self._call({**self.tensors, **decoded})
            drop = self.drop(value)
            # two-sided: a quality that improves by more than epsilon on a few batches is a
            # large perturbation that happened to help there, not a safe one
            feasible = (abs(drop) if self.search.two_sided else drop) <= self.search.epsilon
        result = {"choice": choice.to_dict(), "phase": phase, "quality": value,
                  "drop": drop if drop is not None and math.isfinite(drop) else None,
                  "rel_l2": rel_l2 if math.isfinite(rel_l2) else None,
                  "feasible": feasible, "stored_bytes": stored,
                  "ratio": self.raw_bytes / stored if stored else None}
        self.results[(point, metric)] = result
        self.log.append(result)
        return result

    def _roundtrip(self, choice: Choice) -> tuple[dict[str, np.ndarray], int, float]:
        """The searched tensors encoded at ``choice`` and decoded, their stored bytes and the
        largest relative L2 error among them (inf where the encoder could not measure it)."""
        from .api import load, save  # the search sits above the codec
        path = os.path.join(self.workdir, "candidate.ink")
        infos = save(path, self.searched, policy=choice.policy(self.space, self.shifts),
                     importance=self.importance, threads=self.search.threads)
        decoded = load(path, threads=self.search.threads)
        os.unlink(path)
        errors = [(i.error or {}).get("rel_l2_error") for i in infos]
        worst = max((math.inf if e is None else e for e in errors), default=0.0)
        return decoded, sum(i.stored_bytes for i in infos), worst


def _diagonal(lo: Point, hi: Point) -> list[Point]:
    steps = max(h - l for l, h in zip(lo, hi))
    if steps == 0:
        return [lo]
    return [tuple(l + round(t * (h - l) / steps) for l, h in zip(lo, hi))
            for t in range(steps + 1)]


def _first_feasible(ev: _Evaluator, points: list[Point], metric: str,
                    phase: str) -> Point | None:
    """Binary search for the least precise feasible point of a monotone chain of points."""
    def feasible(p: Point) -> bool | None:
        known = ev.known(p, metric)
        if known is not None:
            return known
        result = ev.evaluate(p, metric, phase)
        return None if result is None else result["feasible"]

    top = feasible(points[-1])
    if not top:
        return None
    lo, hi = 0, len(points) - 1  # points[hi] is feasible
    while lo < hi:
        mid = (lo + hi) // 2
        ok = feasible(points[mid])
        if ok is None:
            break  # cap reached: keep the feasible point we have
        if ok:
            hi = mid
        else:
            lo = mid + 1
    return points[hi]


class Search:
    """Chooses a configuration per checkpoint; remembers the previous choice.

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

    Examples
    --------
    >>> search = Search(epsilon=0.05)                                   # doctest: +SKIP
    >>> result = search.choose(state, quality=eval_loss)                # doctest: +SKIP
    >>> inshrink.save("step_100.ink", state, policy=result.policy)      # doctest: +SKIP
    """

    def __init__(self, epsilon: float = 0.05, *, higher_is_better: bool = False,
                 space: SearchSpace | None = None, max_evals: int = 24,
                 max_rel_l2: float | None = None, two_sided: bool = False,
                 threads: int | None = None) -> None:
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
        self.previous: Choice | None = None
        self._size_table: tuple[tuple, np.ndarray] | None = None

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
               curvature: Mapping[str, Any] | None = None) -> SearchResult:
        """Choose the configuration for one checkpoint.

        Parameters
        ----------
        tensors : mapping of str to array-like
            The checkpoint's state (weights, optimizer state...).
        quality : callable or None
            ``quality(state) -> float`` on a dict like ``tensors`` with some tensors replaced
            by their decoded versions. None: proxy mode (per-tensor error bounds).
        importance : mapping of str to array-like, optional
            Sensitivity scores (|g·w|) per tensor; enables the "sensitivity" prune metric.
        curvature : mapping of str to array-like, optional
            Per tensor, an average of squared gradients (e.g. over the last steps, or Adam's
            ``exp_avg_sq`` of that parameter), each of its tensor's shape: with
            ``space.per_tensor_bins``, sensitive tensors get more bins than the
            configuration's and insensitive ones fewer (:func:`allocation`). Tensors left out
            keep the configuration's bins.

        Returns
        -------
        SearchResult

        Notes
        -----
        Each evaluation encodes the weights and embedding tables to a temporary file (in the
        system's temporary directory) and decodes them, so the search needs the memory of one
        decoded copy of those tensors besides ``tensors`` itself, and the disk of one
        compressed copy.
        """
        started = time.perf_counter()
        if quality is None:
            return SearchResult(self.proxy_policy(), None, {
                "mode": "proxy", "max_rel_l2": self.space.proxy_rel_l2, "chosen": None})
        if not callable(quality):
            raise InvalidArgumentError("quality must be a callable or None")
        if not isinstance(tensors, Mapping):
            raise InvalidArgumentError("tensors must be a mapping of names to arrays")
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
                                  "max_evals": self.max_evals,
                                  "searched_tensors": len(searched)}
        if not searched:
            report.update(mode="none", chosen=None, reason="no tensor to quantize")
            choice = None
        else:
            with tempfile.TemporaryDirectory(prefix="inshrink-search-") as workdir:
                ev = _Evaluator(self, arrays, searched, quality, importance, shifts, roles,
                                workdir)
                if not metrics:
                    report.update(mode="none", reason="no usable prune metric")
                    choice = None
                elif self.previous is None:
                    ev._bits = None  # a fresh search measures sizes afresh
                    choice, why = self._guided(ev, (0,) * 4, self.space.top(), metrics,
                                               "guided")
                    report.update(mode="guided", reason=why)
                else:
                    choice, why, mode = self._neighbourhood(ev, self.previous, metrics)
                    report.update(mode=mode, reason=why)
                report.update(baseline=ev.baseline, evaluations=ev.log,
                              evaluations_used=len(ev.log),
                              cap_reached=len(ev.log) >= self.max_evals,
                              raw_bytes=ev.raw_bytes)
                report["chosen_result"] = None if choice is None else \
                    ev.results[(self.space.point(choice), choice.prune_metric)]
        report["chosen"] = choice.to_dict() if choice else None
        policy = choice.policy(self.space, shifts) if choice else \
            Policy(dict(self.space.moments()))  # weights lossless, moments as configured
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

    # -- the two searches ------------------------------------------------------------------

    def _best(self, ev: _Evaluator, metrics: list[str]) -> Choice | None:
        """The smallest feasible evaluated configuration of the given metrics."""
        feasible = [(r["stored_bytes"], i, p, m) for i, ((p, m), r) in
                    enumerate(ev.results.items()) if r["feasible"] and m in metrics]
        if not feasible:
            return None
        _, _, point, metric = min(feasible)
        return self.space.choice(point, metric)

    def _guided(self, ev: _Evaluator, lo: Point, hi: Point, metrics: list[str],
                phase: str) -> tuple[Choice | None, str]:
        """Guided search of the cube [lo, hi] once per prune metric."""
        for k, metric in enumerate(metrics):
            ev.budget = self.max_evals
            ev.budget = len(ev.log) + ev.left // (len(metrics) - k)  # share the cap
            self._guided_one(ev, lo, hi, metric, phase)
        ev.budget = self.max_evals
        best = self._best(ev, metrics)
        if best is None:
            return None, "no feasible configuration: weights stored losslessly"
        return best, "smallest feasible configuration found by the guided search"

    def _guided_one(self, ev: _Evaluator, lo: Point, hi: Point, metric: str,
                    phase: str) -> None:
        """Diagonal binary search, then best-first branch and bound over the sub-cubes it
        leaves: a cube is searched only if its smallest expected size can beat the best
        feasible point found, and not at all when its most precise corner is infeasible."""
        best_bits = math.inf
        tie = itertools.count()
        cubes = [(ev.region_min(lo, hi)[0], next(tie), lo, hi)]
        while cubes and ev.left > 0:
            bound, _, c_lo, c_hi = heapq.heappop(cubes)
            if bound >= best_bits or ev.known(c_hi, metric) is False:
                continue
            if ev.known(c_lo, metric):  # all of it is feasible: try its smallest point
                result = ev.evaluate(ev.region_min(c_lo, c_hi)[1], metric, phase)
                if result is not None and result["feasible"]:
                    best_bits = min(best_bits, bound)
                continue
            found = _first_feasible(ev, _diagonal(c_lo, c_hi), metric, phase)
            if found is None:
                continue
            # implied feasible is not enough: a choice is one whose encoding was measured
            result = ev.evaluate(found, metric, phase)
            if result is not None and result["feasible"]:
                best_bits = min(best_bits, ev.expected_bits(found))
            # per axis: below the point found, or at/above it (2^4 regions, none empty);
            # sizes need not grow with precision, so the region above it is searched too
            for axes in itertools.product((False, True), repeat=len(found)):
                if any(below and f == l for below, f, l in zip(axes, found, c_lo)):
                    continue
                sub_lo = tuple(l if below else f for below, f, l in zip(axes, found, c_lo))
                sub_hi = tuple(f - 1 if below else h
                               for below, f, h in zip(axes, found, c_hi))
                if sub_lo != sub_hi or sub_lo != found:
                    heapq.heappush(cubes, (ev.region_min(sub_lo, sub_hi)[0], next(tie),
                                           sub_lo, sub_hi))

    def _neighbourhood(self, ev: _Evaluator, previous: Choice,
                       metrics: list[str]) -> tuple[Choice | None, str, str]:
        """Around the previous choice, never more aggressive; the guided search above it
        when nothing there is feasible."""
        space = self.space
        start = space.point(previous)
        metric = previous.prune_metric if previous.prune_metric in metrics else metrics[0]
        current = ev.evaluate(start, metric, "neighbourhood")
        why = []
        for other in (m for m in metrics if m != metric):
            alt = ev.evaluate(start, other, "metric check")
            if current is not None and alt is not None and alt["drop"] is not None and (
                    current["drop"] is None or
                    alt["drop"] < current["drop"] - SIGNIFICANT * self.epsilon):
                metric, current = other, alt
                why.append(f"switched prune metric to {other}")
        top = space.top()
        ranges = [range(s, min(s + NEIGHBOURHOOD, t) + 1) for s, t in zip(start, top)]
        corner = tuple(r[-1] for r in ranges)
        if current is not None and not current["feasible"] and corner != start:
            # the neighbourhood's most precise point first: if it fails, so does every other
            # neighbour (monotonicity), and one evaluation sends us to the fallback
            ev.evaluate(corner, metric, "neighbourhood")
        candidates = sorted(itertools.product(*ranges), key=ev.expected_bits)
        for point in candidates:
            if ev.known(point, metric) is False:
                continue
            result = ev.evaluate(point, metric, "neighbourhood")
            if result is None:
                break
            if result["feasible"]:
                why.append("least precise feasible neighbour of the previous choice")
                return space.choice(point, metric), "; ".join(why), "neighbourhood"
        choice, reason = self._guided(ev, start, top, metrics, "fallback")
        return choice, "; ".join(why + ["no feasible neighbour: " + reason]), "fallback"
