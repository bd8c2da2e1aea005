"""The fit of one tensor's quantizer from its sketch: thresholds, k-means, levels, and the
bin ladder of an error bound.

:func:`fit` chooses protect and prune thresholds from the sketch's quantiles and ``bins``
levels by weighted k-means on its buckets, in a domain (``linear``, ``log``, ``signed_log``);
the levels are rounded to the dtype. :func:`fewest_bins` walks the bin counts of
:data:`BIN_LADDER`, fewest first, until an error bound is met.

Nothing here reads a policy: callers pass plain values.
"""
from __future__ import annotations

import bisect
import functools
import math
from typing import Callable

import numpy as np

from ..codecs.quant import Quant, packing_bits
from ..dtypes import DType
from ..errors import InvalidArgumentError
from ..kernels import quant as kernels
from .quantizer import ChunkStats, QuantEncoder
from .scratch import scratch_array
from .sketch import CENTER_TABLE_MAX, Sketch, center_table, log_center_table

BIN_LADDER = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
              1536, 2048, 4096, 8192, 16384, 32768, 65000)

# A process's first fits run the numpy reference (same levels): compiling fit_points costs
# about 0.2 s in a fresh environment, and it saves about 12 us per fit, so it is compiled
# once this many fits have shown that the process fits enough tensors to pay for it.
_FITS_BEFORE_KERNEL = 256
_fits_so_far = 0


def _thresholds(sketch: Sketch, prune: float, protect: float) -> tuple[int, int, float, float]:
    """Buckets to fit levels on (indices strictly between lo and hi) and the prune/protect
    magnitudes: the smallest ``prune`` and the largest ``protect`` fraction of the finite
    elements, rounded outward to whole buckets."""
    buckets = sketch.buckets  # cumulative counts only change at occupied buckets
    size = sketch.pos.size
    occupied = buckets.index
    counts = buckets.pos + buckets.neg
    cumulative = np.cumsum(counts)
    finite = int(cumulative[-1]) + sketch.zeros if occupied.size else sketch.zeros
    lo, prune_below = -1, 0.0
    target = prune * finite - sketch.zeros
    if prune > 0 and target > 0:
        at = int(np.searchsorted(cumulative, target, side="left"))
        lo = int(occupied[at]) if at < occupied.size else size
        prune_below = sketch.edge(lo + 1)
    hi, protect_at = size - 1, math.inf  # the last bucket starts at inf: always empty
    target = protect * finite
    if protect > 0 and target > 0:
        total = cumulative[-1] if occupied.size else 0
        from_top = total - cumulative + counts  # elements in this bucket and above
        reached = np.flatnonzero(from_top >= target)
        hi = int(occupied[reached[-1]]) if reached.size else 0
        protect_at = sketch.edge(hi)
    return lo, hi, prune_below, protect_at


@functools.lru_cache(maxsize=64)
def _uniforms(seed: int, k: int) -> np.ndarray:
    """The k-means++ draws of a seed (a new generator costs more than a small tensor's fit);
    read-only, shared by every fit with that seed and bin count."""
    uniforms = np.random.default_rng(seed).random(k)
    uniforms.flags.writeable = False
    return uniforms


# A process's first k-means run in numpy (the same centroids) when centroids times points is
# at most _NUMPY_KMEANS_SIZE (numpy's iteration works on arrays that large), until they add
# up to _NUMPY_KMEANS_WORK: compiling kmeans_1d costs ~0.5 s in a fresh environment, numpy
# ~0.1 us more per centroid, point and iteration (measured 2026-12-02: 80 fits of 64 levels on
# ~4,200 points, 0.46 s), so only a process that fits a few small tensors gains from it.
_NUMPY_KMEANS_SIZE = 1 << 18
_NUMPY_KMEANS_WORK = 1 << 21


def _segment_sums(values: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """For each column of ``values`` (rows: points), the sums of its rows
    ``starts[c]:stops[c]`` for each c, each summed from 0.0 in order, as a loop sums (numpy's
    sum is pairwise): the last row of a cumulative sum down the segments, padded with zeros.
    Shape (columns, segments)."""
    lengths = stops - starts
    width = int(lengths.max()) if lengths.size else 0
    steps = np.arange(width)[:, None]
    inside = steps < lengths
    rows = np.zeros((width + 1, starts.size, values.shape[1]))  # row 0: a loop's first 0.0
    rows[1:][inside] = values[(starts + steps)[inside]]
    return np.cumsum(rows, axis=0)[-1].T


@np.errstate(all="ignore")  # (as the kernel: no warnings of underflow)
def kmeans_numpy(points: np.ndarray, weights: np.ndarray, uniforms: np.ndarray,
                 centroids: np.ndarray, max_iter: int, tol: float) -> tuple[int, int]:
    """:func:`inshrink.kernels.quant.kmeans_1d` in numpy, with the same centroids to the bit
    (every sum in the kernel's order); no scratch array. Returns (centroids, iterations)."""
    n, k = points.size, uniforms.size
    m = centroids.size
    if k > 0:  # k-means++ seeding: each draw by inverse CDF on running sums of the masses
        mass = weights
        running = np.cumsum(mass)  # sequential, as the kernel's running sums
        total = float(running[-1])
        if not total > 0.0:  # every point weighs 1
            mass = np.ones(n)
            running = np.cumsum(mass)
            total = float(running[-1])
        ones = mass is not weights
        nearest = None
        m = 0
        while m < k and total > 0.0:
            base = int(np.searchsorted(running, uniforms[m] * total, side="right"))
            if base >= n:  # the last point with mass
                base = int(np.flatnonzero(mass > 0.0)[-1])
            drawn = points[base]
            centroids[m] = drawn
            m += 1
            if m == k:
                break
            gap = points - drawn
            gap *= gap
            nearest = gap if nearest is None else np.minimum(nearest, gap)
            mass = nearest if ones else nearest * weights
            running = np.cumsum(mass)
            total = float(running[-1])
    threshold = tol * (points[n - 1] - points[0] if n > 0 else 0.0)
    iterations = 0
    largest_move = math.inf
    pairs = np.stack((weights, weights * points), axis=1)  # both sums in one gather
    while True:
        centroids[:m] = np.sort(centroids[:m])
        if iterations >= max_iter or largest_move <= threshold:
            break
        iterations += 1
        cluster = centroids[:m]
        # a point goes to the first centroid whose midpoint with the next is not below it
        mids = 0.5 * (cluster[:-1] + cluster[1:])
        owner = np.searchsorted(mids, points, side="left")
        starts = np.searchsorted(owner, np.arange(m), side="left")
        stops = np.searchsorted(owner, np.arange(m), side="right")
        sum_w, sum_wp = _segment_sums(pairs, starts, stops)
        moved = sum_w > 0.0
        updated = sum_wp[moved] / sum_w[moved]
        largest_move = float(np.abs(updated - cluster[moved]).max()) if updated.size else 0.0
        cluster[moved] = updated
    return m, iterations


def _kmeans(points: np.ndarray, weights: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Weighted k-means++ then Lloyd on sorted 1-D points; at most k sorted centroids."""
    if points.size <= k:
        return points.copy()
    centroids = np.empty(k, np.float64)
    if points.size != weights.size:  # the kernel reads both up to len(points)
        raise InvalidArgumentError(f"{points.size} points and {weights.size} weights")
    if (k * points.size <= _NUMPY_KMEANS_SIZE
            and not kernels.kmeans_1d.due(k * points.size, _NUMPY_KMEANS_WORK)):
        m = kmeans_numpy(points, weights, _uniforms(seed, k), centroids, 100, 1e-7)[0]
    else:
        m, _ = kernels.kmeans_1d(points, weights, _uniforms(seed, k), centroids, 100, 1e-7,
                                 scratch_array("kmeans", np.float64, 2 * (points.size + k)))
    centroids = centroids[:m]  # sorted: only equal neighbours to drop (rarely any)
    values = centroids.tolist()
    if any(after == before for before, after in zip(values, values[1:])):
        distinct = np.empty(m, bool)
        distinct[0] = True
        np.not_equal(centroids[1:], centroids[:-1], out=distinct[1:])
        centroids = centroids[distinct]
    return centroids


def _fit_centroids(sketch: Sketch, lo: int, hi: int, bins: int, domain: str | None,
                   sigma: float, seed: int) -> np.ndarray:
    """Centroids (value domain, float64) of the buckets strictly between lo and hi."""
    buckets = sketch.buckets  # a fine sketch has ~10^5 buckets, few occupied
    a = int(buckets.index.searchsorted(lo, side="right"))
    b = max(int(buckets.index.searchsorted(hi, side="left")), a)
    centers, pos, neg = buckets.centers[a:b], buckets.pos[a:b], buckets.neg[a:b]
    if domain == "linear":
        neg, negative, positive = neg[::-1], neg[::-1] > 0, pos > 0
        points = np.concatenate([-centers[::-1][negative], centers[positive]])
        freq = np.concatenate([neg[negative], pos[positive]]).astype(np.float64)
        if points.size == 0:
            return points
        magnitudes = np.abs(points)
        weights = sigma * freq / freq.max() + (1 - sigma) * magnitudes / magnitudes.max()
        return _kmeans(points, weights, bins, seed)
    # log domains: each sign on its own, log magnitude, weighted by frequency only
    n_pos, n_neg = int(pos.sum()), int(neg.sum())
    k_pos = bins if not n_neg else 0 if not n_pos else min(
        max(1, round(bins * n_pos / (n_pos + n_neg))), max(1, bins - 1))
    fitted = []
    for sign, counts, k in ((1.0, pos, k_pos), (-1.0, neg, bins - k_pos)):
        used = counts > 0
        if k and used.any():
            logs = np.log(centers[used])
            fitted.append(sign * np.exp(_kmeans(logs, counts[used].astype(np.float64), k,
                                                seed)))
    return np.sort(np.concatenate(fitted)) if fitted else np.empty(0)


_SMALLEST_SUBNORMAL = float(np.finfo(np.float64).smallest_subnormal)
_FEW_LEVELS = 64  # up to this many centroids: levels and boundaries made on a list
_NO_LEVELS = np.empty(0, np.float64)
_ZERO_LEVEL = np.zeros(1, np.float64)


def _boundaries(levels: np.ndarray, domain: str | None) -> np.ndarray:
    """Decision thresholds between consecutive levels (sorted, distinct, no -0.0), in the
    value domain (float64)."""
    a, b = levels[:-1], levels[1:]
    if domain == "linear":
        return (a + b) / 2
    # the geometric middle, signed, of levels of one sign; 0 between levels of both signs
    product = a * b
    out = np.sqrt(np.abs(product))
    out = np.where(product > 0, np.copysign(out, a, out=out), 0.0)
    # a negative level next to the zero level: only exact zeros (and -0.0) go to zero
    zero = int(np.searchsorted(levels, 0.0))
    if 0 < zero < levels.size and levels[zero] == 0 and levels[zero - 1] < 0:
        out[zero - 1] = -_SMALLEST_SUBNORMAL
    return out


def _few_levels(rounded: list[float], zero: bool) -> list[float]:
    """:func:`_encoder`'s levels (float64) of a few rounded centroids (ascending), on a list:
    the distinct finite non-zero ones, and the zero level if ``zero``."""
    values = [v for i, v in enumerate(rounded)
              if math.isfinite(v) and v != 0 and (i == 0 or v != rounded[i - 1])]
    if zero:
        values.insert(bisect.bisect_left(values, 0.0), 0.0)  # numpy's searchsorted, left
    return values


def _few_boundaries(levels: list[float], domain: str | None) -> np.ndarray:
    """:func:`_boundaries` of a few levels, on a list (the same values: the same operations,
    each correctly rounded)."""
    pairs = zip(levels, levels[1:])
    if domain == "linear":
        return np.array([(a + b) / 2 for a, b in pairs], np.float64)
    out = [math.copysign(math.sqrt(abs(a * b)), a) if a * b > 0 else 0.0 for a, b in pairs]
    zero = bisect.bisect_left(levels, 0.0)
    if 0 < zero < len(levels) and levels[zero] == 0 and levels[zero - 1] < 0:
        out[zero - 1] = -_SMALLEST_SUBNORMAL
    return np.array(out, np.float64)


def fit(sketch: Sketch, dtype: DType, *, bins: int, domain: str | None, prune: float = 0.0,
        protect: float = 0.0, sigma: float = 0.2, seed: int = 0,
        zero_level: bool = False) -> QuantEncoder:
    """Fit the levels and thresholds of one tensor from its sketch.

    Parameters are those of :class:`inshrink.QuantConfig` (``bins`` levels in ``domain``,
    ``prune`` and ``protect`` fractions, k-means ``sigma`` and ``seed``); ``zero_level``
    forces an exact zero level, for pruning decided outside the sketch.
    """
    global _fits_so_far
    _fits_so_far += 1  # unlocked: a lost update only delays the switch a little
    how = _fit_kernel
    if (sketch.pos.size > CENTER_TABLE_MAX  # no table of centers
            or (_fits_so_far <= _FITS_BEFORE_KERNEL and not kernels.fit_points.ready)):
        how = _fit_reference
    return how(sketch, dtype, bins=bins, domain=domain, prune=prune, protect=protect,
               sigma=sigma, seed=seed, zero_level=zero_level)


def _fit_kernel(sketch: Sketch, dtype: DType, *, bins: int, domain: str | None,
                prune: float, protect: float, sigma: float, seed: int,
                zero_level: bool) -> QuantEncoder:
    """:func:`fit` with the thresholds and k-means input from one ``fit_points`` kernel call
    (a sketch of at most ``CENTER_TABLE_MAX`` buckets per sign)."""
    size = sketch.pos.size
    first, stop = sketch.occupied
    if not (0 <= first <= stop <= size and sketch.counts.shape == (2, size)):
        raise InvalidArgumentError(f"sketch span {first}..{stop} of {size} buckets")
    if domain != "linear" and bins == 1:
        counted = sketch.counts[:, first:stop].any(axis=1)
        if counted.all():  # one log-domain level keeps one sign only: see _fit_reference
            domain = "linear"
    linear = domain == "linear"
    table = (center_table if linear else log_center_table)(sketch.work, sketch.shift, size)
    half = stop - first
    scratch = scratch_array("points", np.float64, 4 * half)  # results never point into it
    points, weights = scratch[:2 * half], scratch[2 * half:]
    lo, hi, n_neg, n_pos, elements_neg, elements_pos = kernels.fit_points(
        sketch.counts, first, stop, sketch.zeros, float(prune), float(protect), linear, table,
        points, weights)
    prune_below = sketch.edge(lo + 1) if lo >= 0 else 0.0
    protect_at = sketch.edge(hi) if hi < size - 1 else math.inf
    if not bins:
        centroids = np.empty(0)
    elif linear:
        points, freq = points[half - n_neg:half + n_pos], weights[half - n_neg:half + n_pos]
        if points.size:
            magnitudes = np.abs(points)
            freq = sigma * freq / freq.max() + (1 - sigma) * magnitudes / magnitudes.max()
            centroids = _kmeans(points, freq, bins, seed)
        else:
            centroids = points.copy()
    else:  # each sign on its own, log magnitudes
        k_pos = bins if not elements_neg else 0 if not elements_pos else min(
            max(1, round(bins * elements_pos / (elements_pos + elements_neg))), max(1, bins - 1))
        negative = positive = _NO_LEVELS  # logarithms of the magnitudes, ascending
        if bins - k_pos and n_neg:
            negative = _kmeans(points[:n_neg], weights[:n_neg], bins - k_pos, seed)
        if k_pos and n_pos:
            positive = _kmeans(points[half:half + n_pos], weights[half:half + n_pos], k_pos,
                               seed)
        # ascending: the negated exponentials of the negative side's logarithms, reversed,
        # then the positive side's (the sort of both but for the order of zeros exp() may
        # underflow to, which are dropped)
        centroids = np.exp(np.concatenate((negative[::-1], positive)))
        np.negative(centroids[:negative.size], out=centroids[:negative.size])
    return _encoder(sketch, dtype, centroids, bins, domain, prune_below, protect_at,
                    zero_level)


def _encoder(sketch: Sketch, dtype: DType, centroids: np.ndarray, bins: int,
             domain: str | None, prune_below: float, protect_at: float,
             zero_level: bool) -> QuantEncoder:
    """The encoder of fitted centroids (ascending): rounded to the dtype, the zero level
    added."""
    rounded = centroids.astype(dtype.numpy).astype(np.float64)  # still ascending
    zero = bool(sketch.zeros or prune_below > 0 or zero_level or not bins)
    if rounded.size <= _FEW_LEVELS:  # a small tensor's: on a list, fewer numpy calls
        values = _few_levels(rounded.tolist(), zero)
        levels = np.array(values, np.float64).astype(dtype.numpy)
        stage = Quant(dtype, levels, packing_bits(len(levels)))
        return QuantEncoder(stage, _few_boundaries(values, domain), protect_at, prune_below)
    # the distinct finite non-zero ones (np.unique of them: equal values are neighbours)
    keep = np.isfinite(rounded)
    keep &= rounded != 0
    if rounded.size > 1:
        keep[1:] &= rounded[1:] != rounded[:-1]
    values = rounded[keep]
    if zero:
        at = int(np.searchsorted(values, 0.0))
        values = np.concatenate((values[:at], _ZERO_LEVEL, values[at:]))
    levels = values.astype(dtype.numpy)
    stage = Quant(dtype, levels, packing_bits(len(levels)))
    return QuantEncoder(stage, _boundaries(values, domain), protect_at, prune_below)


def _fit_reference(sketch: Sketch, dtype: DType, *, bins: int, domain: str | None,
                   prune: float = 0.0, protect: float = 0.0, sigma: float = 0.2,
                   seed: int = 0, zero_level: bool = False) -> QuantEncoder:
    """:func:`fit` in numpy, on the sketch's occupied buckets: the kernel's reference, and
    the fit of sketches too fine for a table of centers."""
    buckets = sketch.buckets
    positive, negative = buckets.pos.any(), buckets.neg.any()
    if domain == "log" and negative:
        domain = "signed_log"
    if domain != "linear" and bins == 1 and positive and negative:
        # one log-domain level keeps one sign only (every value pushed one way); the single
        # linear level, a weighted mean, is the better single value for signed data
        domain = "linear"
    lo, hi, prune_below, protect_at = _thresholds(sketch, prune, protect)
    centroids = (_fit_centroids(sketch, lo, hi, bins, domain, sigma, seed) if bins
                 else np.empty(0))
    return _encoder(sketch, dtype, centroids, bins, domain, prune_below, protect_at,
                    zero_level)


# --- the bin ladder of an error bound -------------------------------------------------------

def bin_candidates(bins: int) -> list[int]:
    """Bin counts tried, fewest first, when an error bound is set."""
    return [b for b in BIN_LADDER if b < bins] + [bins]


# a bin count whose error the histogram predicts above this many times the bound is skipped
# without measuring it exactly
_PREDICTED_SLACK = 1.5


def fewest_bins(sketch: Sketch, bins: int, max_rel_l2: float | None,
                fit_bins: Callable[[int], QuantEncoder],
                exact_error: Callable[[QuantEncoder], ChunkStats]
                ) -> tuple[int, QuantEncoder] | None:
    """The fewest bins, up to ``bins``, whose quantizer meets the error bound ``max_rel_l2``.

    Parameters
    ----------
    sketch : Sketch
        The tensor's sketch (its sum of squares is the error's denominator).
    bins : int
        The most bins to try; without a bound, the only count tried.
    max_rel_l2 : float or None
        The largest relative L2 error accepted; ``None``: no bound.
    fit_bins : callable
        ``fit_bins(b)``: the quantizer of ``b`` bins.
    exact_error : callable
        ``exact_error(encoder)``: the error of ``encoder`` measured over the whole tensor.

    Returns
    -------
    (int, QuantEncoder) or None
        The bin count and its quantizer; ``None`` when no count of :func:`bin_candidates`
        meets the bound (the caller stores the tensor losslessly). A count whose predicted
        error (:meth:`QuantEncoder.estimate_rel_l2`) is clearly too large is skipped; any
        other is accepted only once its exact error meets the bound.
    """
    if max_rel_l2 is None:
        return bins, fit_bins(bins)
    for tried in bin_candidates(bins):
        encoder = fit_bins(tried)
        if encoder.estimate_rel_l2(sketch) > _PREDICTED_SLACK * max_rel_l2:
            continue  # clearly too coarse: skip the exact pass
        if exact_error(encoder).rel_l2(sketch.sumsq) <= max_rel_l2:
            return tried, encoder
    return None
