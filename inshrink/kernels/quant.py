"""Quantisation kernels: magnitude sketches, 1-D k-means, code assignment, table decoding and
bit packing of codes.

Callers guarantee, for each kernel:

``sketch_words(x, words, abs_mask, inf_bits, shift, counts, totals, span)``
    ``x`` is 1-D float32 or float64 and ``words`` the same array viewed as uint32 / uint64;
    ``abs_mask`` (all bits but the sign) and ``inf_bits`` (the pattern of +inf) are uint64 for
    that float width; ``0 <= shift`` < mantissa bits; ``counts`` is int64 of shape ``(2, m)``,
    ``m >= 1`` (``inf_bits >> shift`` entries hold every index; larger indices are clamped);
    ``totals`` is float64 of length 3; ``span`` is int64 of length 2 (``[m, -1]`` before the
    first chunk). Counts accumulate, so adding the counts of several chunks sketches their
    concatenation.

``error_stats(x, codes, table, escape, prune_below, out)``
    ``x`` is 1-D float32 or float64; ``codes`` uint16 of ``len(x)``, each ``< len(table)`` or
    ``== escape``; ``table`` float64; ``out`` float64 of length 7, accumulated.

``rank_chunk(x, boundaries, codes)``
    ``x`` is 1-D float32 or float64; ``boundaries`` float64, sorted ascending, its last entry
    +inf, at most 65536 entries; ``codes`` uint16 of ``len(x)``.

``quantize_chunk(x, words, boundaries, lut, probes, table, protect_lo, protect_hi, prune_below,
zero_code, escape, force, codes, positions, others, out)``
    As ``assign_codes`` (``prune_below >= 0``) for ``boundaries`` as in ``rank_chunk``;
    ``table`` is float64, sorted ascending, with an entry for every code other than ``escape``
    that the assignment can produce (``len(boundaries)`` entries, or none when
    ``escape == 0`` and there are no boundaries: all escaped); either ``lut`` is uint16 of
    length ``2^(32 - RANK_SHIFT)`` with entries ``<= len(boundaries) - 1``, ``probes >= 0``,
    ``x`` float32 and ``words`` its uint32 view, or ``lut`` is empty and ``codes`` holds what
    ``rank_chunk`` writes; ``positions`` and ``others`` (scratch) are int64 of ``len(x)``;
    ``out`` float64 of length 7, accumulated.

``kmeans_1d(points, weights, uniforms, centroids, max_iter, tol, scratch)``
    ``points`` is float64, sorted ascending and finite; ``weights`` is float64 of the same
    length, finite and ``>= 0``; ``max_iter >= 0``; either ``uniforms`` is float64 of length
    ``k >= 1`` with values in ``[0, 1)``, ``len(points) >= 1`` and ``centroids`` float64 of
    length ``>= k``, or ``uniforms`` is empty and ``centroids`` is float64 of length ``>= 1``,
    sorted ascending and distinct; ``scratch`` is float64 of length
    ``>= 2 * len(points) + 2 * len(centroids)`` (its contents are overwritten).

``fit_points(counts, first, stop, zeros, prune, protect, linear, table, points, weights)``
    ``counts`` is int64 of shape ``(2, m)``; ``0 <= first <= stop <= m``, every non-zero count
    in columns ``[first, stop)``; ``table`` is float64 of length ``m`` (each bucket's center
    in the linear domain, its logarithm otherwise); ``linear`` is a bool; ``points`` and
    ``weights`` are float64 of length ``>= 2 * (stop - first)``.

``assign_codes(x, boundaries, protect_lo, protect_hi, prune_lo, prune_hi, zero_code, escape,
force, codes)``
    ``x`` is 1-D float32 or float64; ``boundaries`` is float64 sorted ascending (possibly
    empty); ``codes`` is uint16 of ``len(x)``; ``force`` is int8 of ``len(x)`` or of length 0
    (no forcing); ``zero_code`` and ``escape`` fit in uint16.

``lookup_levels(codes, levels, out)``
    ``codes`` is uint16; ``levels`` (at least one) and ``out`` share one unsigned word type;
    ``len(out) == len(codes)``.

``pack_bits(codes, bits, out)`` and ``unpack_bits(packed, bits, n, out)``
    ``1 <= bits <= 16``; ``codes`` and ``out`` of ``unpack_bits`` are uint16 of length ``n``;
    ``out`` of ``pack_bits`` and ``packed`` are uint8 of length ``ceil(n * bits / 8)``. Code
    ``i`` occupies bits ``[i * bits, (i + 1) * bits)`` of a little-endian bit stream (bit ``j``
    is bit ``j % 8`` of byte ``j // 8``), least significant bit first; codes are masked to
    ``bits`` bits and the padding bits of the last byte are zero.
"""
from __future__ import annotations

import math

import numpy as np
from .jit import kernel

_ZERO = np.uint64(0)
_ONE = np.uint64(1)
_EIGHT = np.uint64(8)
_BYTE = np.uint64(0xFF)
_LINEAR_RANK_MAX = 256  # longest boundary table ranked by counting, not binary search


@kernel
def sketch_words(x, words, abs_mask, inf_bits, shift, counts, totals, span):
    """Add one chunk to a log-linear magnitude histogram, per sign.

    The bucket of a finite non-zero element is its magnitude's bit pattern shifted right by
    ``shift`` (exponent plus the top mantissa bits: a log-bucket grid with relative width
    2^-(mantissa bits - shift)); row 0 of ``counts`` counts the positive elements, row 1 the
    negative ones. ``totals`` accumulates [zeros, non-finite, sum of squares of the finite
    elements]; ``span`` [lowest, highest] bucket index counted (either sign), so that the fit
    scans only the occupied part of the table.
    """
    last = counts.shape[1] - 1
    # the extremes of the finite non-zero magnitudes first, in a loop that vectorises (the
    # same span as tracking each element's bucket, at a quarter of the histogram's cost).
    # (Conditional expressions, not min() and max(): each of those compiles its own overload,
    # a few hundredths of a second on a first call.)
    lowest_bits = inf_bits
    highest_bits = _ZERO
    for i in range(x.shape[0]):
        a = np.uint64(words[i]) & abs_mask
        counted = (a != _ZERO) & (a < inf_bits)
        low = a if counted else inf_bits
        high = a if counted else _ZERO
        lowest_bits = low if low < lowest_bits else lowest_bits
        highest_bits = high if high > highest_bits else highest_bits
    zeros = 0.0
    nonfinite = 0.0
    sumsq = 0.0
    for i in range(x.shape[0]):
        w = np.uint64(words[i])
        a = w & abs_mask
        if a == _ZERO or a >= inf_bits:  # rare: one predictable branch for both
            if a == _ZERO:
                zeros += 1.0
            else:
                nonfinite += 1.0
            continue
        v = np.float64(x[i])  # float() of a float32 stays float32 in numba
        sumsq += v * v
        index = np.int64(a >> shift)  # int64: uint64 mixed with int64 is float64
        index = index if index < last else last
        counts[np.int64(a != w), index] += 1  # the sign picks the row: no branch on it
    if highest_bits != _ZERO:
        lowest = np.int64(lowest_bits >> shift)
        highest = np.int64(highest_bits >> shift)
        lowest = lowest if lowest < last else last
        highest = highest if highest < last else last
        span[0] = lowest if lowest < span[0] else span[0]
        span[1] = highest if highest > span[1] else span[1]
    totals[0] += zeros
    totals[1] += nonfinite
    totals[2] += sumsq


@kernel
def error_stats(x, codes, table, escape, prune_below, out):
    """Accumulate the error of decoding ``x`` as ``table[codes]`` (escapes are exact) into
    ``out`` = [sum of squared errors, max |error|, escaped, pruned, zeroed, sign flipped,
    finite non-zero elements]."""
    sse = 0.0
    worst = out[1]
    escaped = 0.0
    pruned = 0.0
    zeroed = 0.0
    flipped = 0.0
    nonzero = 0.0
    for i in range(x.shape[0]):
        v = np.float64(x[i])  # float() of a float32 stays float32 in numba
        c = codes[i]
        finite_nonzero = v != 0.0 and math.isfinite(v)
        if finite_nonzero:
            nonzero += 1.0
        if c == escape:
            escaped += 1.0
            continue
        d = table[c]
        e = abs(v - d)
        sse += e * e
        if e > worst:
            worst = e
        if finite_nonzero:
            if abs(v) < prune_below:
                pruned += 1.0
            if d == 0.0:
                zeroed += 1.0
            elif (v < 0.0) != (d < 0.0):
                flipped += 1.0
    out[0] += sse
    out[1] = worst
    out[2] += escaped
    out[3] += pruned
    out[4] += zeroed
    out[5] += flipped
    out[6] += nonzero


@kernel(signatures=["UniTuple(int64, 2)(Array(float64, 1, 'C', readonly=True), "
                     "Array(float64, 1, 'C', readonly=True), "
                     "Array(float64, 1, 'C', readonly=True), "
                     "float64[::1], int64, float64, float64[::1])"])
def kmeans_1d(points, weights, uniforms, centroids, max_iter, tol, scratch):
    """Weighted k-means in one dimension: k-means++ seeding (when ``uniforms`` is not empty),
    then Lloyd iterations on sorted points, in ``centroids`` (one kernel, not two: a first
    save in a fresh environment compiles each kernel it calls, a tenth of a second at least).

    Seeding (``k = len(uniforms)``): the first centroid is drawn with probability
    proportional to weight, each later one with probability proportional to weight times
    squared distance to the nearest chosen centroid; draw ``i`` uses ``uniforms[i]`` by
    inverse CDF (the first point whose running sum of that mass exceeds ``uniforms[i]`` times
    the total, else the last point with mass). All weights count as 1 when they sum to 0.
    The draws, all distinct, go to ``centroids`` sorted: fewer than ``k`` when every point
    that carries weight already coincides with a centroid. With ``uniforms`` empty, the
    iterations start from ``centroids`` as given.

    Lloyd: a point goes to the nearest centroid (one exactly at a midpoint goes to the lower
    one); a centroid moves to the weighted mean of its points (their weights and weighted
    values summed in point order), or keeps its value when they weigh nothing; centroids are
    re-sorted after each iteration. Iteration stops once no centroid moved by more than
    ``tol * (max(points) - min(points))``.

    Returns
    -------
    (int, int)
        The number of centroids (the leading entries of ``centroids``) and of iterations run.
    """
    n = points.shape[0]
    k = uniforms.shape[0]
    m = centroids.shape[0]
    if k > 0:  # k-means++ seeding
        # The mass of point j is its weight for the first draw, then its weight times its
        # squared distance to the nearest centroid drawn. running[j] is the sum of the masses
        # of points 0..j in order, made in the pass that updates them (not decreasing: a
        # draw is then a binary search instead of a second pass).
        positive = True
        nearest = scratch[:n]
        running = scratch[n:2 * n]
        last = -1  # the last point with mass
        total = 0.0
        for j in range(n):
            total += weights[j]
            running[j] = total
            last = j if weights[j] > 0.0 else last
        if not total > 0.0:  # every point weighs 1
            positive = False
            total = 0.0
            for j in range(n):
                total += 1.0
                running[j] = total
            last = n - 1
        m = 0
        while m < k and total > 0.0:
            target = uniforms[m] * total
            # the first point whose running sum exceeds target (its mass is positive)
            base = 0
            size = n
            while size > 0:
                half = size >> 1
                if running[base + half] > target:
                    size = half
                else:
                    base += half + 1
                    size -= half + 1
            drawn = points[base if base < n else last]
            centroids[m] = drawn
            m += 1
            if m == k:
                break
            total = 0.0
            last = -1
            for j in range(n):
                gap = points[j] - drawn
                gap = gap * gap
                if m == 1 or gap < nearest[j]:
                    nearest[j] = gap
                mass = nearest[j] * (weights[j] if positive else 1.0)
                total += mass
                running[j] = total
                last = j if mass > 0.0 else last
    # Lloyd
    span = points[n - 1] - points[0] if n > 0 else 0.0
    threshold = tol * span
    sum_w = scratch[2 * n:2 * n + m]
    sum_wp = scratch[2 * n + m:2 * n + 2 * m]
    iterations = 0
    largest_move = math.inf
    while True:
        for c in range(1, m):  # insertion sort: a few values, nearly sorted
            v = centroids[c]
            d = c - 1
            while d >= 0 and centroids[d] > v:
                centroids[d + 1] = centroids[d]
                d -= 1
            centroids[d + 1] = v
        if iterations >= max_iter or largest_move <= threshold:  # (one sort in the code,
            break  # after the seeding and after each iteration: each loop compiles apart)
        iterations += 1
        for c in range(m):
            sum_w[c] = 0.0
            sum_wp[c] = 0.0
        c = 0
        w_total = 0.0
        wp_total = 0.0
        mid = 0.5 * (centroids[0] + centroids[1]) if m > 1 else math.inf
        for j in range(n):
            p = points[j]
            while c < m - 1 and p > mid:
                sum_w[c] = w_total
                sum_wp[c] = wp_total
                w_total = 0.0
                wp_total = 0.0
                c += 1
                mid = 0.5 * (centroids[c] + centroids[c + 1]) if c < m - 1 else math.inf
            w_total += weights[j]
            wp_total += weights[j] * p
        sum_w[c] = w_total
        sum_wp[c] = wp_total
        largest_move = 0.0
        for c in range(m):
            if sum_w[c] > 0.0:
                updated = sum_wp[c] / sum_w[c]
                move = updated - centroids[c]  # (not abs(): it compiles on its own)
                move = move if move >= 0.0 else -move
                if move > largest_move:
                    largest_move = move
                centroids[c] = updated
    return m, iterations


@kernel
def fit_points(counts, first, stop, zeros, prune, protect, linear, table, points, weights):
    """What a fit needs of a sketch's counts, in one call (a dozen numpy calls per tensor
    otherwise, each holding the GIL): the prune and protect buckets and the k-means input of
    the buckets strictly between them.

    Thresholds (``finite`` = every count plus ``zeros``): ``lo`` is the first occupied bucket
    at which the running count reaches ``prune * finite - zeros`` (``m`` when none does; -1
    when that target is not positive or ``prune`` is 0); ``hi`` is the last occupied bucket
    whose count and those above it reach ``protect * finite`` (0 when none does; ``m - 1``
    when that target is not positive or ``protect`` is 0).

    Points, with ``h = stop - first``: each positive bucket's ``table`` entry ascending from
    ``points[h]``; each negative one's, when ``linear`` is 0 (log domains), ascending from
    ``points[0]``, else its negation going down from ``points[h - 1]`` (so that
    ``points[h - n_neg:h + n_pos]`` is every point ascending). ``weights`` at the same places:
    the counts.

    Returns
    -------
    (int, int, int, int, int, int)
        ``lo``, ``hi``, the number of negative and of positive points, and the elements
        counted in the negative and in the positive buckets between ``lo`` and ``hi``.
    """
    size = counts.shape[1]
    total = 0
    for i in range(first, stop):
        total += counts[0, i] + counts[1, i]
    finite = total + zeros
    lo = -1
    target = prune * finite - zeros
    if prune > 0 and target > 0:
        lo = size
        running = 0
        for i in range(first, stop):
            running += counts[0, i] + counts[1, i]
            if running >= target:  # first reached at an occupied bucket
                lo = i
                break
    hi = size - 1
    target = protect * finite
    if protect > 0 and target > 0:
        hi = 0
        above = 0  # the elements in bucket i and above
        for i in range(stop - 1, first - 1, -1):
            above += counts[0, i] + counts[1, i]
            if above >= target:  # first reached at an occupied bucket
                hi = i
                break
    half = stop - first
    n_neg = 0
    n_pos = 0
    elements_neg = 0
    elements_pos = 0
    for i in range(lo + 1 if lo + 1 > first else first, hi if hi < stop else stop):
        c = counts[0, i]
        if c != 0:
            points[half + n_pos] = table[i]
            weights[half + n_pos] = c
            n_pos += 1
            elements_pos += c
        c = counts[1, i]
        if c != 0:
            at = half - 1 - n_neg if linear else n_neg
            points[at] = -table[i] if linear else table[i]
            weights[at] = c
            n_neg += 1
            elements_neg += c
    return lo, hi, n_neg, n_pos, elements_neg, elements_pos


@kernel
def _count_below(boundaries, v):
    """Number of ``boundaries`` strictly below ``v`` (0 for NaN), by a branch-free count."""
    count = 0
    for k in range(boundaries.shape[0]):
        if boundaries[k] < v:
            count += 1
    return count


@kernel
def _search_below(boundaries, v):
    """Number of ``boundaries`` strictly below ``v`` (0 for NaN), by binary search."""
    nb = boundaries.shape[0]
    if nb == 0:
        return 0
    base = 0  # the answer lies in [base, base + size]
    size = nb
    while size > 1:
        half = size >> 1
        if boundaries[base + half] < v:
            base += half
        size -= half
    if boundaries[base] < v:
        base += 1
    return base


@kernel
def assign_codes(x, boundaries, protect_lo, protect_hi, prune_lo, prune_hi, zero_code, escape,
                 force, codes):
    """Map each element to a level code, ``zero_code`` or ``escape``.

    ``escape`` when forced (``force[i] == 1``), non-finite, ``<= protect_lo`` or
    ``>= protect_hi``; else ``zero_code`` when forced (``force[i] == 2``) or strictly between
    ``prune_lo`` and ``prune_hi``; else the number of boundaries strictly below the element.

    Returns
    -------
    int
        The number of escapes written.
    """
    forced = force.shape[0] > 0
    escapes = 0
    # the level code is computed for every element, then overridden; the two loops differ only
    # in how it is computed, which keeps the count over a short table vectorised
    if boundaries.shape[0] <= _LINEAR_RANK_MAX:
        for i in range(x.shape[0]):
            v = float(x[i])
            code = _count_below(boundaries, v)
            f = force[i] if forced else 0
            if f == 2 or (prune_lo < v and v < prune_hi):
                code = zero_code
            if f == 1 or not math.isfinite(v) or v <= protect_lo or v >= protect_hi:
                code = escape
                escapes += 1
            codes[i] = code
    else:
        for i in range(x.shape[0]):
            v = float(x[i])
            code = _search_below(boundaries, v)
            f = force[i] if forced else 0
            if f == 2 or (prune_lo < v and v < prune_hi):
                code = zero_code
            if f == 1 or not math.isfinite(v) or v <= protect_lo or v >= protect_hi:
                code = escape
                escapes += 1
            codes[i] = code
    return escapes


_BLOCK = 512  # elements ranked together: the count over a short table runs across a block
RANK_SHIFT = 18  # float32 bit patterns >> 18: 2^14 rank-table buckets, 32 per octave per sign


@kernel
def rank_chunk(x, boundaries, codes):
    """Write each element's rank, the number of ``boundaries[:-1]`` strictly below it (0 for
    NaN), into ``codes`` (``x`` 1-D float32 or float64; ``boundaries`` sorted, then +inf;
    ``codes`` uint16 of ``len(x)``; at most 65535 boundaries)."""
    n = x.shape[0]
    nb = boundaries.shape[0] - 1
    searched = boundaries[:nb]
    values = np.empty(_BLOCK)
    ranks = np.empty(_BLOCK, np.int64)
    for start in range(0, n, _BLOCK):
        m = min(_BLOCK, n - start)
        for j in range(m):
            values[j] = x[start + j]
        if nb <= _LINEAR_RANK_MAX:  # boundary by boundary over the block: vectorised compares
            for j in range(m):
                ranks[j] = 0
            for k in range(nb):
                b = boundaries[k]
                for j in range(m):
                    ranks[j] += np.int64(b < values[j])
        else:
            for j in range(m):
                ranks[j] = _search_below(searched, values[j])
        for j in range(m):
            codes[start + j] = ranks[j]


@kernel
def quantize_chunk(x, words, boundaries, lut, probes, table, protect_lo, protect_hi, prune_below,
                   zero_code, escape, force, codes, positions, others, out):
    """Assign codes, list the escapes and measure the error in one pass over ``x``.

    Codes as :func:`assign_codes` with ``prune_lo = -prune_below`` and
    ``prune_hi = prune_below``, except that an escaped element keeps its nearest level's code
    (the number of boundaries strictly below it; 0 if non-finite) instead of ``escape``; the
    position of each escaped element goes to ``positions``, in order; ``out`` accumulates what
    :func:`error_stats` would of the codes :func:`assign_codes` gives (the squared errors are
    summed in element order, so the result is the same to the bit).

    ``boundaries`` ends with an extra +inf; ``table`` is sorted. With a rank table (``lut``
    not empty, ``x`` float32, ``words`` its uint32 view), an element's rank starts at
    ``lut[bits >> RANK_SHIFT]`` (``bits``: its bit pattern) and rises by up to ``probes``
    comparisons; otherwise ``codes`` holds the ranks on entry (:func:`rank_chunk`).

    Returns
    -------
    int
        The number of escaped elements (the leading entries of ``positions`` written).
    """
    forced = force.shape[0] > 0
    n = x.shape[0]
    nb = boundaries.shape[0] - 1
    looked_up = lut.shape[0] > 0
    prune_lo = -prune_below
    # the counters of every element as if coded by its rank, in a loop that vectorises; the
    # elements coded otherwise are corrected at the end. An element v coded by its rank (the
    # number of boundaries[:nb] below it) is coded by a zero level iff zero_lo < v < zero_hi,
    # by a level of the other sign iff flip_lo < v < 0 or 0 < v < flip_hi: rank r is at least
    # k iff boundaries[k - 1] < v, below k iff v < nextafter(boundaries[k - 1], inf). (Written
    # out here, not in helper kernels, and without min(): each compiles on its own, about a
    # fifth of a second for this kernel's first call.)
    n_levels = table.shape[0] if table.shape[0] < nb + 1 else nb + 1
    negative = 0  # the number of levels below zero, then of levels at or below zero
    while negative < n_levels and table[negative] < 0.0:
        negative += 1
    nonpositive = negative
    while nonpositive < n_levels and table[nonpositive] <= 0.0:
        nonpositive += 1
    # a zero level: negative <= rank < nonpositive
    zero_lo = boundaries[negative - 1] if negative > 0 else -math.inf
    zero_hi = np.nextafter(boundaries[nonpositive - 1], math.inf) if 0 < nonpositive <= nb \
        else (math.inf if nonpositive > nb else -math.inf)
    # a positive level: rank >= nonpositive; a negative level: rank < negative
    flip_lo = boundaries[nonpositive - 1] if 0 < nonpositive <= nb else (
        -math.inf if nonpositive == 0 else 0.0)
    flip_hi = (np.nextafter(boundaries[negative - 1], math.inf) if negative <= nb else math.inf) \
        if negative > 0 else 0.0
    nonzero = 0
    zeroed = 0
    flipped = 0
    for i in range(n):
        v = np.float64(x[i])
        nz = np.int64(v != 0.0)
        nonzero += nz
        zeroed += nz * np.int64(zero_lo < v) * np.int64(v < zero_hi)
        flipped += np.int64(flip_lo < v) * np.int64(v < 0.0) + np.int64(0.0 < v) * np.int64(
            v < flip_hi)
    escapes = 0
    sse = 0.0
    worst = out[1]
    # others: the elements not coded by their rank, in order
    n_others = 0
    if looked_up and not forced and escape > nb:
        # the usual chunk, in a loop of its own (a fifth faster than the general one below):
        # no overrides, and every rank (at most nb) differs from escape
        for i in range(n):
            v = np.float64(x[i])
            rank = np.int64(lut[np.int64(words[i]) >> RANK_SHIFT])
            rank += np.int64(boundaries[rank] < v)  # (safe when probes == 0: the +inf)
            for _ in range(1, probes):
                rank += np.int64(boundaries[rank] < v)
            code = rank
            if not ((prune_below <= v or v <= prune_lo) and (protect_lo < v and v < protect_hi)):
                others[n_others] = i
                n_others += 1
                if prune_lo < v and v < prune_below:
                    code = zero_code
                if not (protect_lo < v and v < protect_hi):  # also NaN
                    code = escape
                if code == escape:
                    positions[escapes] = i
                    escapes += 1
                    codes[i] = rank if math.isfinite(v) else 0
                    continue
            d = table[code]
            codes[i] = code
            e = abs(v - d)
            sse += e * e
            worst = max(worst, e)
    else:
        for i in range(n):
            v = np.float64(x[i])
            if looked_up:  # O(1): a table entry, then a comparison or two
                rank = np.int64(lut[np.int64(words[i]) >> RANK_SHIFT])
                rank += np.int64(boundaries[rank] < v)  # (safe when probes == 0: the +inf)
                for _ in range(1, probes):
                    rank += np.int64(boundaries[rank] < v)
            else:
                rank = np.int64(codes[i])
            f = force[i] if forced else 0
            code = rank
            # (not a chained comparison: Numba compiles `a < v < b` here into slower code);
            # the rare case stays short, which keeps the common one fast
            if not (f == 0 and rank != escape and not (prune_lo < v and v < prune_below) and (
                    protect_lo < v and v < protect_hi)):
                others[n_others] = i
                n_others += 1
                if f == 2 or (prune_lo < v and v < prune_below):
                    code = zero_code
                if f == 1 or not (protect_lo < v and v < protect_hi):  # also NaN
                    code = escape
                if code == escape:
                    positions[escapes] = i
                    escapes += 1
                    codes[i] = rank if math.isfinite(v) else 0
                    continue
            d = table[code]
            codes[i] = code
            e = abs(v - d)
            sse += e * e
            worst = max(worst, e)  # (an if here is 3% slower per chunk)
    pruned = 0
    escaped = 0
    for k in range(n_others):  # their counters, as error_stats counts them
        i = others[k]
        v = np.float64(x[i])
        nz = np.int64(v != 0.0)  # what the first loop counted
        nonzero -= nz
        zeroed -= nz * np.int64(zero_lo < v) * np.int64(v < zero_hi)
        flipped -= np.int64(flip_lo < v) * np.int64(v < 0.0) + np.int64(0.0 < v) * np.int64(
            v < flip_hi)
        finite = math.isfinite(v)
        if finite and v != 0.0:
            nonzero += 1
        if escaped < escapes and positions[escaped] == i:
            escaped += 1
            continue
        d = table[codes[i]]
        if finite and v != 0.0:
            if abs(v) < prune_below:
                pruned += 1
            if d == 0.0:
                zeroed += 1
            elif (v < 0.0) != (d < 0.0):
                flipped += 1
    out[0] += sse
    out[1] = worst
    out[2] += escapes
    out[3] += pruned
    out[4] += zeroed
    out[5] += flipped
    out[6] += nonzero
    return escapes


@kernel
def lookup_levels(codes, levels, out):
    """Replace each code by its level word; a code past the table reads the last level.

    Returns
    -------
    int
        The largest code: ``len(levels)`` or more when a code is not a level (the caller
        rejects the chunk). One branch-free pass: the check is a running maximum, not a test
        per element.
    """
    last = levels.shape[0] - 1
    largest = 0
    for i in range(codes.shape[0]):
        c = np.int64(codes[i])
        largest = max(largest, c)
        out[i] = levels[min(c, last)]
    return largest


@kernel
def pack_bits(codes, bits, out):
    """Pack ``bits``-wide codes into a little-endian bit stream."""
    if bits == 4:  # two codes a byte, the usual width: a loop that vectorises
        half = codes.shape[0] >> 1
        for o in range(half):
            out[o] = (codes[2 * o] & 15) | ((codes[2 * o + 1] & 15) << 4)
        if codes.shape[0] & 1:
            out[half] = codes[2 * half] & 15
        return
    width = np.uint64(bits)
    mask = (_ONE << width) - _ONE
    buffer = _ZERO
    filled = 0
    o = 0
    for i in range(codes.shape[0]):
        buffer |= (np.uint64(codes[i]) & mask) << np.uint64(filled)
        filled += bits
        while filled >= 8:
            out[o] = buffer & _BYTE
            buffer >>= _EIGHT
            filled -= 8
            o += 1
    if filled > 0:
        out[o] = buffer & _BYTE


@kernel
def unpack_bits(packed, bits, n, out):
    """Read ``n`` codes of ``bits`` bits from a little-endian bit stream."""
    if bits == 4:
        half = n >> 1
        for o in range(half):
            b = packed[o]
            out[2 * o] = b & 15
            out[2 * o + 1] = b >> 4
        if n & 1:
            out[2 * half] = packed[half] & 15
        return
    width = np.uint64(bits)
    mask = (_ONE << width) - _ONE
    buffer = _ZERO
    filled = 0
    p = 0
    for i in range(n):
        while filled < bits:
            buffer |= np.uint64(packed[p]) << np.uint64(filled)
            p += 1
            filled += 8
        out[i] = buffer & mask
        buffer >>= width
        filled -= bits
