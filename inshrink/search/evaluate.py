"""Evaluation of candidate configurations: each one's searched tensors encoded, decoded and
passed to the quality callback, with a cache, the monotonicity shortcuts, the evaluation cap
and the expected-size table that orders and bounds candidates."""
from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ..errors import InvalidArgumentError
from ..encode.policy import Policy, QuantConfig
from .allocation import Shifts
from .roundtrip import Roundtrip, encode_tensor
from .space import Choice, Point, Quality, SearchSpace

SAMPLE = 4096
"""Elements per tensor encoded to estimate the size of a configuration (64 blocks of 64,
spread evenly over the tensor)."""

SizeTable = tuple[tuple, np.ndarray]
"""The expected bits at every point of the cube, with what they were measured on (the searched
tensors' names, shapes and dtypes, the axes and sigma): reusable while that is unchanged."""


@dataclass(frozen=True)
class Settings:
    """What the evaluations of one checkpoint obey: the bounds and cap of
    :class:`~.choose.Search` (see its parameters) and the cube.

    Attributes
    ----------
    space : SearchSpace
        The configurations to choose from.
    epsilon : float
        Allowed relative quality drop.
    higher_is_better : bool
        True for an accuracy-like quality, False for a loss.
    max_evals : int
        Hard cap on evaluations per checkpoint.
    max_rel_l2 : float or None
        Largest relative L2 error of a searched tensor in a feasible candidate.
    two_sided : bool
        Feasible only if the quality moves by at most ``epsilon`` either way.
    threads : int or None
        Encoder/decoder threads for the candidate encodings.
    """

    space: SearchSpace
    epsilon: float
    higher_is_better: bool
    max_evals: int
    max_rel_l2: float | None
    two_sided: bool
    threads: int | None


class Evaluator:
    """Evaluates configurations on the searched tensors, with a cache, the monotonicity
    shortcuts and the evaluation cap. Candidates are encoded and decoded in memory
    (:class:`~inshrink.search.roundtrip.Roundtrip`).

    ``sizes`` is the expected-size table of an earlier checkpoint (:attr:`sizes`), used while
    it was measured on tensors of the same names, shapes and dtypes and on the same axes."""

    def __init__(self, settings: Settings, tensors: dict[str, np.ndarray],
                 searched: dict[str, np.ndarray], quality: Quality,
                 importance: dict[str, Any], shifts: Shifts,
                 roles: Mapping[str, str], sizes: SizeTable | None = None) -> None:
        self.settings, self.space = settings, settings.space
        self.tensors, self.searched, self.quality = tensors, searched, quality
        self.importance, self.shifts = importance, shifts
        self.results: dict[tuple[Point, str], dict] = {}
        self.log: list[dict] = []
        self.budget = settings.max_evals  # a phase may lower it to share the cap
        # where the time goes, for the report: the callback, candidate encodings, size table
        self.seconds = {"quality": 0.0, "encode": 0.0, "size_table": 0.0}
        self.baseline, _ = self._call(tensors)
        if not math.isfinite(self.baseline):
            raise InvalidArgumentError(f"the quality of the uncompressed state is "
                                       f"{self.baseline}; the search needs a finite value")
        self.raw_bytes = sum(a.nbytes for a in searched.values())
        self.roles = roles
        self.encode = Roundtrip(searched, importance, settings.threads)
        # the expected size of every point, built when first needed; a neighbourhood search
        # reuses the previous checkpoint's (it only orders a few candidates)
        self.key = (tuple(sorted((n, a.shape, a.dtype.str) for n, a in searched.items())),
                    self.space.axes(), self.space.sigma)
        self.bits = sizes[1] if sizes and sizes[0] == self.key else None

    @property
    def sizes(self) -> SizeTable | None:
        """The expected-size table and what it was measured on, for a later checkpoint; None
        until it is built."""
        return None if self.bits is None else (self.key, self.bits)

    def _call(self, state: dict[str, np.ndarray],
              limit: float | None = None) -> tuple[float, bool]:
        """(the quality of ``state``, whether it is complete): with a ``limit`` and a callback
        that has ``bounded`` (:class:`~.space.BoundedQuality`), possibly a lower bound above
        ``limit`` instead (``complete`` False)."""
        started = time.perf_counter()
        bounded = None if limit is None else getattr(self.quality, "bounded", None)
        if callable(bounded):
            out = bounded(state, limit)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise InvalidArgumentError(f"the quality callback's bounded() returned "
                                           f"{out!r}, not a (value, complete) pair")
            value, complete = out
        else:
            value, complete = self.quality(state), True
        self.seconds["quality"] += time.perf_counter() - started
        try:
            return float(value), bool(complete)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"the quality callback returned {value!r}, "
                                       f"not a number") from None

    def limit(self) -> float | None:
        """The largest feasible quality, for a callback that can stop an evaluation once it is
        exceeded; None for a higher-is-better quality (its evaluations run to the end)."""
        if self.settings.higher_is_better:
            return None
        return self.baseline + self.settings.epsilon * (abs(self.baseline) or 1.0)

    @property
    def left(self) -> int:
        return min(self.settings.max_evals, self.budget) - len(self.log)

    def drop(self, value: float) -> float:
        """Relative quality drop from the baseline (positive = worse)."""
        scale = abs(self.baseline) or 1.0
        change = (self.baseline - value) if self.settings.higher_is_better else \
            (value - self.baseline)
        return change / scale if math.isfinite(value) else math.inf

    def expected_bits(self, point: Point) -> float:
        """Expected stored bits of the searched tensors at a configuration, to order and bound
        candidates (the choice itself goes by measured bytes)."""
        if self.bits is None:
            started = time.perf_counter()
            self.bits = self.size_table()
            self.seconds["size_table"] += time.perf_counter() - started
        return float(self.bits[point])

    def size_table(self) -> np.ndarray:
        """Expected bits at every point of the cube: per (bins, prune) the bits per element
        measured by encoding a sample of every searched tensor (pruned zeros are not free:
        they add a code), plus value and position bits per protected element."""
        space = self.space
        bins_axis, emb_axis, prune_axis, protect_axis = space.axes()
        weights = {n: a for n, a in self.searched.items() if self.roles[n] != "embedding"}
        embeddings = {n: a for n, a in self.searched.items() if self.roles[n] == "embedding"}
        jobs = [(weights, QuantConfig(bins=b, prune=p, protect=0.0))
                for b in bins_axis for p in prune_axis]
        jobs += [(embeddings, QuantConfig(bins=b, protect=0.0)) for b in emb_axis]
        if self.encode.threads > 1:  # the kernels release the GIL
            with ThreadPoolExecutor(self.encode.threads) as pool:
                bits = list(pool.map(lambda job: self.sample_bits(*job), jobs))
        else:
            bits = [self.sample_bits(*job) for job in jobs]
        weight_bits = np.array(bits[:len(bins_axis) * len(prune_axis)]).reshape(
            len(bins_axis), len(prune_axis))
        emb_bits = np.array(bits[len(bins_axis) * len(prune_axis):])
        protect_bits = sum(a.size * (a.dtype.itemsize * 8 + 32)
                           for a in self.searched.values()) * np.array(protect_axis)
        return (weight_bits[:, None, :, None] + emb_bits[None, :, None, None]
                + protect_bits[None, None, None, :])

    def sample_bits(self, tensors: dict[str, np.ndarray], config: QuantConfig) -> float:
        """Stored bits of ``tensors`` estimated from SAMPLE elements of each."""
        if not tensors:
            return 0.0
        policy = Policy.uniform(config)
        bits = 0.0
        for name, a in tensors.items():
            flat = a.reshape(-1)
            blocks = flat.size // 64  # searched tensors have >= 4096 elements
            rows = np.unique(np.linspace(0, blocks - 1, min(blocks, SAMPLE // 64)).round()
                             .astype(np.int64))
            sample = flat[:blocks * 64].reshape(blocks, 64)[rows]  # keeps the role
            stored = encode_tensor(name, sample, policy, decode=False).stored_bytes
            bits += 8 * stored * (flat.size / sample.size)
        return bits

    def region_min(self, lo: Point, hi: Point) -> tuple[float, Point]:
        """The smallest expected size in the cube [lo, hi] and the point that has it."""
        self.expected_bits(lo)  # builds the table
        region = self.bits[tuple(slice(l, h + 1) for l, h in zip(lo, hi))]
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

    def evaluate(self, point: Point, metric: str, phase: str,
                 exact: bool = False) -> dict | None:
        """Evaluate (cached); None when the cap is reached. An infeasible candidate's quality
        may have been stopped once proven infeasible unless ``exact``: its result then has
        ``stopped`` True (a key present only then, so a checkpoint's stored report does not
        grow) and no ``quality`` or ``drop``."""
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
        started = time.perf_counter()
        decoded, stored, rel_l2 = self.roundtrip(choice)
        self.seconds["encode"] += time.perf_counter() - started
        bound = self.settings.max_rel_l2
        complete = True
        if bound is not None and not rel_l2 <= bound:
            # too coarse whatever the quality says: the callback is not called
            value = drop = None
            feasible = False
        else:
            state = {**self.tensors, **decoded}
            value, complete = self._call(state, None if exact else self.limit())
            drop = self.drop(value)
            if not complete and not drop > self.settings.epsilon:
                # the callback stopped without proving the candidate infeasible: measure all
                value, complete = self._call(state)
                drop = self.drop(value)
            # two-sided: a quality that improves by more than epsilon on a few batches is a
            # large perturbation that happened to help there, not a safe one
            feasible = (abs(drop) if self.settings.two_sided else drop) <= self.settings.epsilon
            if not complete:  # only a bound is known: not reported as a measurement
                value = drop = None
        result = {"choice": choice.to_dict(), "phase": phase, "quality": value,
                  "drop": drop if drop is not None and math.isfinite(drop) else None,
                  "rel_l2": rel_l2 if math.isfinite(rel_l2) else None,
                  "feasible": feasible, "stored_bytes": stored,
                  "ratio": self.raw_bytes / stored if stored else None}
        if not complete:
            result["stopped"] = True
        self.results[(point, metric)] = result
        self.log.append(result)
        return result

    def roundtrip(self, choice: Choice) -> tuple[dict[str, np.ndarray], int, float]:
        """The searched tensors encoded at ``choice`` and decoded, their stored bytes and the
        largest relative L2 error among them (inf where the encoder could not measure it)."""
        return self.encode(choice.policy(self.space, self.shifts))
