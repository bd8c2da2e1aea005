"""Quantisation kernels against plain-numpy oracles, plus their algebraic properties."""
import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from inshrink.encode import quantizer
from inshrink.encode.quantizer import rank_table
from inshrink.kernels import quant

FLOAT_TYPES = [np.float32, np.float64]
WORD_TYPES = [np.uint8, np.uint16, np.uint32, np.uint64]
NO_FORCE = np.empty(0, np.int8)
INF = math.inf


def float_arrays(float_type, max_size=200, finite=False):
    width = 32 if float_type == np.float32 else 64
    elements = st.floats(allow_nan=not finite, allow_infinity=not finite, width=width)
    return st.lists(elements, max_size=max_size).map(lambda v: np.array(v, float_type))


# ---------------------------------------------------------------------------------------------
# sketch_words

BITS = {np.float32: (np.uint32, 23), np.float64: (np.uint64, 52)}


def sketch_args(float_type, shift):
    word, _ = BITS[float_type]
    abs_mask = np.uint64((1 << (8 * np.dtype(float_type).itemsize - 1)) - 1)
    inf_bits = np.uint64(np.array(np.inf, float_type).view(word))
    size = int(inf_bits >> np.uint64(shift)) + 1
    return word, abs_mask, inf_bits, size


def run_sketch(x, shift, counts=None, span=None):
    word, abs_mask, inf_bits, size = sketch_args(x.dtype.type, shift)
    pos, neg, totals = counts or (np.zeros(size, np.int64), np.zeros(size, np.int64),
                                  np.zeros(3))
    both = np.stack([pos, neg])
    span = np.array([size, -1], np.int64) if span is None else span
    quant.sketch_words(x, x.view(word), abs_mask, inf_bits, np.uint64(shift), both, totals, span)
    pos[:], neg[:] = both
    return pos, neg, totals


def oracle_sketch(x, shift):
    word, abs_mask, inf_bits, size = sketch_args(x.dtype.type, shift)
    a = x.view(word).astype(np.uint64) & abs_mask
    valid = (a != 0) & (a < inf_bits)
    index = (a[valid] >> np.uint64(shift)).astype(np.int64)
    negative = np.signbit(x[valid])
    pos = np.bincount(index[~negative], minlength=size).astype(np.int64)
    neg = np.bincount(index[negative], minlength=size).astype(np.int64)
    finite = x[valid].astype(np.float64)
    with np.errstate(over="ignore"):
        sumsq = float(np.dot(finite, finite))
    return pos, neg, [np.count_nonzero(a == 0), np.count_nonzero(a >= inf_bits), sumsq]


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
@pytest.mark.parametrize("kept_bits", [1, 7, 10])
@given(data=st.data())
def test_sketch_matches_oracle(float_type, kept_bits, data):
    x = data.draw(float_arrays(float_type))
    shift = BITS[float_type][1] - kept_bits
    pos, neg, totals = run_sketch(x, shift)
    want_pos, want_neg, want_totals = oracle_sketch(x, shift)
    np.testing.assert_array_equal(pos, want_pos)
    np.testing.assert_array_equal(neg, want_neg)
    assert totals[:2].tolist() == want_totals[:2]
    assert math.isclose(totals[2], want_totals[2], rel_tol=1e-9) or totals[2] == want_totals[2]


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
@given(data=st.data())
def test_sketch_span_covers_exactly_the_counted_buckets(float_type, data):
    x = data.draw(float_arrays(float_type))
    cut = data.draw(st.integers(0, x.size))
    shift = BITS[float_type][1] - 7
    size = sketch_args(float_type, shift)[3]
    span = np.array([size, -1], np.int64)
    counts = run_sketch(x[:cut], shift, span=span)
    pos, neg, _ = run_sketch(x[cut:], shift, counts, span)
    used = np.flatnonzero(pos + neg)
    if used.size:
        assert span.tolist() == [used[0], used[-1]]
    else:
        assert span.tolist() == [size, -1]


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
@given(data=st.data())
def test_sketches_of_chunks_merge_by_adding_counts(float_type, data):
    x = data.draw(float_arrays(float_type, finite=True))
    cut = data.draw(st.integers(0, x.size))
    shift = BITS[float_type][1] - 7
    whole = run_sketch(x, shift)
    merged = run_sketch(x[cut:], shift, run_sketch(x[:cut], shift))
    np.testing.assert_array_equal(merged[0], whole[0])
    np.testing.assert_array_equal(merged[1], whole[1])
    np.testing.assert_allclose(merged[2], whole[2], rtol=1e-9)


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
def test_sketch_skips_zeros_and_non_finite(float_type):
    x = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1.0, -1.0, 3.0], float_type)
    pos, neg, totals = run_sketch(x, BITS[float_type][1] - 7)
    assert totals.tolist() == [2, 3, 11.0]
    assert pos.sum() == 2 and neg.sum() == 1


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
def test_sketch_of_nothing_leaves_counts(float_type):
    shift = BITS[float_type][1] - 7
    before = run_sketch(np.array([1.0, -2.0], float_type), shift)
    after = run_sketch(np.empty(0, float_type), shift, tuple(a.copy() for a in before))
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def test_sketch_buckets_bound_the_relative_error():
    x = np.random.default_rng(1).lognormal(0.0, 4.0, 20_000)
    shift = 52 - 7
    pos, _, _ = run_sketch(x, shift)
    assert pos.sum() == x.size
    # a bucket spans [lower, upper) with upper / lower <= 1 + 2^-7: log-spaced buckets
    index = (x.view(np.uint64) >> np.uint64(shift)).astype(np.uint64)
    lower = (index << np.uint64(shift)).view(np.float64)
    upper = ((index + np.uint64(1)) << np.uint64(shift)).view(np.float64)
    assert np.all((lower <= x) & (x < upper))
    assert np.all(upper / lower <= 1 + 2.0 ** -7 + 1e-12)


# ---------------------------------------------------------------------------------------------
# fit_points: thresholds and k-means input of a sketch's counts

def fit_points_oracle(counts, first, stop, zeros, prune, protect, linear, table):
    """(lo, hi, points, weights, elements_neg, elements_pos) in numpy, over every bucket:
    the linear points ascending, or the log points as (negative group, positive group)."""
    size = counts.shape[1]
    both = counts[0] + counts[1]
    finite = int(both.sum()) + zeros
    cumulative = np.cumsum(both)
    lo = -1
    target = prune * finite - zeros
    if prune > 0 and target > 0:
        lo = int(np.searchsorted(cumulative, target, side="left"))
    hi = size - 1
    target = protect * finite
    if protect > 0 and target > 0:
        from_top = cumulative[-1] - cumulative + both
        hi = int(np.flatnonzero((from_top >= target) & (both > 0))[-1:].sum())
    inside = np.arange(size)
    inside = (inside > lo) & (inside < hi)
    pos = np.flatnonzero(inside & (counts[0] > 0))
    neg = np.flatnonzero(inside & (counts[1] > 0))
    elements = (int(counts[1][neg].sum()), int(counts[0][pos].sum()))
    if linear:
        points = np.concatenate([-table[neg][::-1], table[pos]])
        weights = np.concatenate([counts[1][neg][::-1], counts[0][pos]]).astype(np.float64)
        return (lo, hi, points, weights) + elements
    return (lo, hi, (table[neg], table[pos]),
            (counts[1][neg].astype(np.float64), counts[0][pos].astype(np.float64))) + elements


@st.composite
def bucket_counts(draw):
    size = draw(st.integers(2, 40))
    counts = np.zeros((2, size), np.int64)
    for row in range(2):
        for i in draw(st.lists(st.integers(0, size - 2), max_size=12)):
            counts[row, i] += draw(st.integers(1, 50))
    occupied = np.flatnonzero(counts.any(axis=0))
    first, stop = (int(occupied[0]), int(occupied[-1]) + 1) if occupied.size else (0, 0)
    return counts, first, stop, draw(st.integers(0, 30))


@given(bc=bucket_counts(), prune=st.sampled_from([0.0, 0.05, 0.3, 0.9, 1.0]),
       protect=st.sampled_from([0.0, 0.0005, 0.1, 0.6, 1.0]), linear=st.booleans())
def test_fit_points_matches_oracle(bc, prune, protect, linear):
    counts, first, stop, zeros = bc
    size = counts.shape[1]
    table = np.arange(size, dtype=np.float64) * 0.5 + 0.25
    half = stop - first
    points = np.full(2 * half, np.nan)  # garbage outside what the kernel writes
    weights = np.full(2 * half, np.nan)
    lo, hi, n_neg, n_pos, e_neg, e_pos = quant.fit_points(counts, first, stop, zeros, prune,
                                                          protect, linear, table, points,
                                                          weights)
    want = fit_points_oracle(counts, first, stop, zeros, prune, protect, linear, table)
    assert (lo, hi, e_neg, e_pos) == (want[0], want[1], want[4], want[5])
    if linear:
        np.testing.assert_array_equal(points[half - n_neg:half + n_pos], want[2])
        np.testing.assert_array_equal(weights[half - n_neg:half + n_pos], want[3])
    else:
        np.testing.assert_array_equal(points[:n_neg], want[2][0])
        np.testing.assert_array_equal(points[half:half + n_pos], want[2][1])
        np.testing.assert_array_equal(weights[:n_neg], want[3][0])
        np.testing.assert_array_equal(weights[half:half + n_pos], want[3][1])


def test_fit_points_thresholds_at_the_edges():
    counts = np.zeros((2, 8), np.int64)
    counts[0, 2], counts[1, 4], counts[0, 5] = 10, 5, 5
    table = np.arange(8, dtype=np.float64) + 1.0
    points, weights = np.empty(8), np.empty(8)
    # nothing pruned or protected: every bucket, the negative one negated before the others
    assert quant.fit_points(counts, 2, 6, 0, 0.0, 0.0, True, table, points,
                            weights) == (-1, 7, 1, 2, 5, 15)
    np.testing.assert_array_equal(points[3:6], [-5.0, 3.0, 6.0])
    # half the elements pruned: the first bucket; a quarter protected: the top bucket
    assert quant.fit_points(counts, 2, 6, 0, 0.5, 0.25, False, table, points,
                            weights)[:2] == (2, 5)
    # zeros count towards the prune target and are taken off it
    assert quant.fit_points(counts, 2, 6, 20, 0.5, 0.0, False, table, points,
                            weights)[0] == -1
    # pruned up to the last bucket; a protect target above every count: hi at 0
    assert quant.fit_points(counts, 2, 6, 100, 0.99, 1.0, False, table, points,
                            weights)[:2] == (5, 0)
    # an empty sketch
    assert quant.fit_points(np.zeros((2, 8), np.int64), 0, 0, 3, 0.5, 0.5, True, table,
                            points, weights) == (-1, 0, 0, 0, 0, 0)


# ---------------------------------------------------------------------------------------------
# kmeans_1d: seeding (uniforms given, no iteration)

def oracle_seed(points, weights, k, uniforms):
    mass = weights.copy() if weights.sum() > 0 else np.ones_like(weights)

    def pick(u, m):
        cumulative = np.cumsum(m)
        j = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
        return j if j < m.size else int(np.flatnonzero(m > 0)[-1])

    chosen = [points[pick(uniforms[0], mass)]]
    while len(chosen) < k:
        nearest = np.min((points[:, None] - np.array(chosen)[None, :]) ** 2, axis=1)
        d = nearest * mass
        if not d.sum() > 0:
            break
        chosen.append(points[pick(uniforms[len(chosen)], d)])
    return np.array(chosen)


@st.composite
def weighted_points(draw, min_size=1, max_size=60):
    n = draw(st.integers(min_size, max_size))
    values = draw(st.lists(st.integers(-20, 20), min_size=n, max_size=n))
    scale = draw(st.sampled_from([1.0, 0.1, 1e-3, 37.5]))
    points = np.sort(np.array(values, np.float64) * scale)
    weights = np.array(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 7.0, 1e3]),
                                     min_size=n, max_size=n)), np.float64)
    return points, weights


def kmeans_1d(points, weights, uniforms, centroids, max_iter, tol):
    """The kernel with scratch of the least length it allows, full of garbage it must not
    read."""
    scratch = np.full(2 * (points.size + centroids.size), np.nan)
    return quant.kmeans_1d(points, weights, uniforms, centroids, max_iter, tol, scratch)


def run_seed(points, weights, k, uniforms):
    """The seeds, sorted (the kernel sorts its draws)."""
    out = np.full(k, np.nan)
    chosen, iterations = kmeans_1d(points, weights, uniforms[:k], out, 0, 0.0)
    assert 1 <= chosen <= k and iterations == 0
    assert np.isnan(out[chosen:]).all()
    return out[:chosen]


@given(pw=weighted_points(), k=st.integers(1, 12), seed=st.integers(0, 2**32 - 1))
def test_seed_matches_oracle(pw, k, seed):
    points, weights = pw
    uniforms = np.random.default_rng(seed).random(k)
    centroids = run_seed(points, weights, k, uniforms)
    np.testing.assert_array_equal(centroids, np.sort(oracle_seed(points, weights, k, uniforms)))
    np.testing.assert_array_equal(run_seed(points, weights, k, uniforms), centroids)


@given(pw=weighted_points(), k=st.integers(1, 12), seed=st.integers(0, 2**32 - 1))
def test_seed_picks_distinct_existing_points(pw, k, seed):
    points, weights = pw
    centroids = run_seed(points, weights, k, np.random.default_rng(seed).random(k))
    eligible = points[weights > 0] if weights.sum() > 0 else points
    assert np.isin(centroids, eligible).all()
    assert np.unique(centroids).size == centroids.size
    # fewer centroids only when fewer distinct eligible points
    assert centroids.size == min(k, np.unique(eligible).size)


@pytest.mark.parametrize("seed", range(4))
def test_seed_of_many_points_and_levels_matches_oracle(seed):
    """A save's fits draw 64 levels among thousands of buckets (ties and weightless points
    among them): the kernel's running sums must draw what the oracle's cumulative sums do."""
    rng = np.random.default_rng(seed)
    n = 3000 + 500 * seed
    points = np.sort(np.round(rng.standard_normal(n) * 40) / 8)  # ties among them
    weights = rng.choice([0.0, 0.25, 1.0, 3.0, 1e4], size=n, p=[0.2, 0.2, 0.3, 0.29, 0.01])
    uniforms = rng.random(64)
    centroids = run_seed(points, weights, 64, uniforms)
    np.testing.assert_array_equal(centroids, np.sort(oracle_seed(points, weights, 64, uniforms)))


def test_seed_inverse_cdf_edges():
    points = np.array([1.0, 2.0, 3.0])
    weights = np.array([0.0, 1.0, 1.0])
    # uniforms at the ends of [0, 1): the first and the last point of positive weight
    assert run_seed(points, weights, 1, np.array([0.0])).tolist() == [2.0]
    assert run_seed(points, weights, 1, np.array([np.nextafter(1.0, 0.0)])).tolist() == [3.0]
    # all weights zero: all points count once
    zero = np.zeros(3)
    assert run_seed(points, zero, 1, np.array([0.0])).tolist() == [1.0]
    assert run_seed(points, zero, 3, np.array([0.5, 0.0, 0.0])).tolist() == [1.0, 2.0, 3.0]
    # one point, or one distinct value: one centroid
    assert run_seed(np.array([5.0]), np.array([3.0]), 4, np.zeros(4)).tolist() == [5.0]
    assert run_seed(np.full(9, -2.5), np.ones(9), 3, np.full(3, 0.7)).tolist() == [-2.5]


def test_seed_prefers_far_heavy_points():
    points = np.array([0.0, 0.1, 100.0])
    weights = np.array([1.0, 1.0, 1.0])
    # after 0.0, nearly all the mass is at 100.0
    assert run_seed(points, weights, 2, np.array([0.0, 0.01])).tolist() == [0.0, 100.0]


# ---------------------------------------------------------------------------------------------
# kmeans_1d: Lloyd iterations

def oracle_lloyd(points, weights, centroids, max_iter, tol):
    c = [float(v) for v in centroids]
    threshold = tol * (points[-1] - points[0]) if points.size else 0.0
    iterations = 0
    while iterations < max_iter:
        iterations += 1
        mids = np.array([0.5 * (c[i] + c[i + 1]) for i in range(len(c) - 1)])
        sum_w = [0.0] * len(c)
        sum_wp = [0.0] * len(c)
        for p, w in zip(points.tolist(), weights.tolist()):
            j = int(np.searchsorted(mids, p, side="left"))  # a tie goes to the lower centroid
            sum_w[j] += w
            sum_wp[j] += w * p
        move = 0.0
        for j in range(len(c)):
            if sum_w[j] > 0:
                updated = sum_wp[j] / sum_w[j]
                move = max(move, abs(updated - c[j]))
                c[j] = updated
        c.sort()
        if move <= threshold:
            break
    return np.array(c), iterations


def weighted_sse(points, weights, centroids):
    return float(np.sum(weights * np.min((points[:, None] - centroids[None, :]) ** 2, axis=1)))


def seeded_centroids(points, weights, k, seed):
    return run_seed(points, weights, k, np.random.default_rng(seed).random(k))


def lloyd(points, weights, centroids, max_iter, tol):
    """Lloyd iterations from ``centroids`` (no seeding); the number run."""
    count, iterations = kmeans_1d(points, weights, np.empty(0), centroids, max_iter, tol)
    assert count == centroids.size
    return iterations


@given(pw=weighted_points(), k=st.integers(1, 10), seed=st.integers(0, 2**32 - 1),
       max_iter=st.integers(0, 30), tol=st.sampled_from([0.0, 1e-6, 1e-2]))
def test_lloyd_matches_oracle(pw, k, seed, max_iter, tol):
    points, weights = pw
    start = seeded_centroids(points, weights, k, seed)
    centroids = start.copy()
    iterations = lloyd(points, weights, centroids, max_iter, tol)
    expected, expected_iterations = oracle_lloyd(points, weights, start, max_iter, tol)
    assert iterations == expected_iterations <= max_iter
    np.testing.assert_array_equal(centroids, expected)
    again = start.copy()
    assert lloyd(points, weights, again, max_iter, tol) == iterations
    np.testing.assert_array_equal(again, centroids)


@given(pw=weighted_points(), k=st.integers(1, 10), seed=st.integers(0, 2**32 - 1))
def test_lloyd_never_increases_the_weighted_error(pw, k, seed):
    points, weights = pw
    start = seeded_centroids(points, weights, k, seed)
    # weighted means are rounded: allow for that at the scale of the points
    slack = 1e-20 * weights.sum() * np.max(points ** 2)
    before = weighted_sse(points, weights, start)
    centroids = start.copy()
    lloyd(points, weights, centroids, 50, 0.0)
    assert (np.diff(centroids) >= 0).all()
    after = weighted_sse(points, weights, centroids)
    assert after <= before * (1 + 1e-9) + slack
    # more iterations never hurt either
    one = start.copy()
    lloyd(points, weights, one, 1, 0.0)
    assert after <= weighted_sse(points, weights, one) * (1 + 1e-9) + slack


def test_lloyd_ties_and_empty_clusters():
    points = np.array([0.0, 1.0, 2.0])
    centroids = np.array([0.0, 2.0])
    # 1.0 sits on the midpoint and joins the lower centroid
    assert lloyd(points, np.ones(3), centroids, 10, 0.0) == 2
    assert centroids.tolist() == [0.5, 2.0]
    # a centroid with no points, or only weightless ones, keeps its value
    centroids = np.array([-1.0, 50.0, 100.0])
    lloyd(np.array([-3.0, -1.0, 49.0, 99.0]), np.array([1.0, 1.0, 0.0, 2.0]),
                    centroids, 10, 0.0)
    assert centroids.tolist() == [-2.0, 50.0, 99.0]


def test_lloyd_iteration_limits_and_empty_points():
    centroids = np.array([1.0, 2.0])
    assert lloyd(np.array([0.0, 3.0]), np.ones(2), centroids, 0, 0.0) == 0
    assert centroids.tolist() == [1.0, 2.0]
    assert lloyd(np.empty(0), np.empty(0), centroids, 5, 0.0) == 1
    assert centroids.tolist() == [1.0, 2.0]
    # a loose tolerance stops after one iteration
    points = np.linspace(0.0, 1.0, 101)
    loose = np.array([0.0, 0.01])
    assert lloyd(points, np.ones(101), loose, 100, 1.0) == 1


def test_seed_and_lloyd_recover_separated_clusters():
    rng = np.random.default_rng(7)
    centres = np.array([-40.0, -3.0, 0.5, 8.0, 90.0])
    points = np.sort(np.concatenate([c + rng.normal(0, 0.05, 400) for c in centres]))
    weights = rng.uniform(0.5, 2.0, points.size)
    best = None
    for seed in range(4):
        centroids = seeded_centroids(points, weights, 5, seed)
        lloyd(points, weights, centroids, 100, 1e-9)
        sse = weighted_sse(points, weights, centroids)
        if best is None or sse < best[0]:
            best = (sse, centroids)
    np.testing.assert_allclose(best[1], centres, atol=0.05)


def test_lloyd_matches_oracle_on_many_points():
    # hundreds of points, tens of clusters, iterations until nothing moves
    rng = np.random.default_rng(3)
    points = np.sort(rng.standard_t(3, 600))
    weights = rng.choice([0.0, 1.0, 3.0, 50.0], points.size)
    for k, seed in ((16, 0), (5, 1), (40, 2)):
        start = seeded_centroids(points, weights, k, seed)
        centroids = start.copy()
        iterations = lloyd(points, weights, centroids, 100, 0.0)
        expected, expected_iterations = oracle_lloyd(points, weights, start, 100, 0.0)
        assert iterations == expected_iterations > 5
        np.testing.assert_array_equal(centroids, expected)


@given(pw=weighted_points(), k=st.integers(1, 10), seed=st.integers(0, 2**32 - 1),
       max_iter=st.integers(0, 30))
def test_seeding_then_lloyd_in_one_call(pw, k, seed, max_iter):
    points, weights = pw
    uniforms = np.random.default_rng(seed).random(k)
    start = run_seed(points, weights, k, uniforms)
    expected = start.copy()
    expected_iterations = lloyd(points, weights, expected, max_iter, 1e-6)
    out = np.full(k, np.nan)
    count, iterations = kmeans_1d(points, weights, uniforms, out, max_iter, 1e-6)
    assert (count, iterations) == (start.size, expected_iterations)
    np.testing.assert_array_equal(out[:count], expected)


# ---------------------------------------------------------------------------------------------
# assign_codes

def oracle_assign(x, boundaries, protect_lo, protect_hi, prune_lo, prune_hi, zero_code, escape,
                  force):
    v = x.astype(np.float64)
    force = force if force.size else np.zeros(x.size, np.int8)
    with np.errstate(invalid="ignore"):
        codes = np.searchsorted(boundaries, v, side="left").astype(np.uint16)
        zero = (force == 2) | ((prune_lo < v) & (v < prune_hi))
        escaped = (force == 1) | ~np.isfinite(v) | (v <= protect_lo) | (v >= protect_hi)
    codes[zero] = zero_code
    codes[escaped] = escape
    return codes, int(escaped.sum())


@st.composite
def assign_case(draw, float_type, max_boundaries=40):
    x = draw(float_arrays(float_type))
    finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
    boundaries = np.sort(np.array(draw(st.lists(finite, max_size=max_boundaries)), np.float64))
    if draw(st.booleans()):  # some elements equal to a boundary
        x = np.concatenate([x, boundaries[: draw(st.integers(0, 5))].astype(float_type)])
    protect = sorted(draw(st.lists(finite, min_size=2, max_size=2))) if draw(st.booleans()) \
        else [-INF, INF]
    prune = sorted(draw(st.lists(finite, min_size=2, max_size=2))) if draw(st.booleans()) \
        else [0.0, 0.0]
    force = np.array(draw(st.lists(st.integers(0, 2), min_size=x.size, max_size=x.size)),
                     np.int8) if draw(st.booleans()) else NO_FORCE
    levels = boundaries.size + 1
    return x, boundaries, protect, prune, force, levels


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
@given(data=st.data())
def test_assign_matches_oracle(float_type, data):
    x, boundaries, (protect_lo, protect_hi), (prune_lo, prune_hi), force, levels = \
        data.draw(assign_case(float_type))
    zero_code, escape = levels // 2, levels
    args = (boundaries, protect_lo, protect_hi, prune_lo, prune_hi, zero_code, escape, force)
    codes = np.full(x.size, 0xBEEF, np.uint16)
    escapes = quant.assign_codes(x, *args, codes)
    expected, expected_escapes = oracle_assign(x, *args)
    np.testing.assert_array_equal(codes, expected)
    assert escapes == expected_escapes == int(np.count_nonzero(codes == escape))


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
@pytest.mark.parametrize("n_boundaries", [255, 256, 257, 1000, 4095])
def test_assign_long_tables(float_type, n_boundaries):
    rng = np.random.default_rng(n_boundaries)
    boundaries = np.sort(rng.standard_normal(n_boundaries))
    boundaries[10:13] = boundaries[10]  # repeated boundaries
    x = np.concatenate([rng.standard_normal(3000) * 1.5, boundaries, [np.nan, np.inf, -np.inf,
                                                                      -1e30, 1e30]])
    x = x.astype(float_type)
    args = (boundaries, -INF, INF, -0.01, 0.01, 0, 65535, NO_FORCE)
    codes = np.empty(x.size, np.uint16)
    escapes = quant.assign_codes(x, *args, codes)
    expected, expected_escapes = oracle_assign(x, *args)
    np.testing.assert_array_equal(codes, expected)
    assert escapes == expected_escapes == 3


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
def test_assign_precedence_and_single_level(float_type):
    x = np.array([0.5, 0.5, 0.5, 0.001, 5.0, -5.0, np.nan, 0.0], float_type)
    force = np.array([0, 1, 2, 1, 2, 0, 2, 0], np.int8)
    codes = np.empty(x.size, np.uint16)
    # one level: no boundaries; protection wins over pruning and forcing to zero
    escapes = quant.assign_codes(x, np.empty(0), -5.0, 5.0, -0.01, 0.01, 7, 9, force, codes)
    assert codes.tolist() == [0, 9, 7, 9, 9, 9, 9, 7]
    assert escapes == 5
    empty = np.empty(0, np.uint16)
    assert quant.assign_codes(np.empty(0, float_type), np.array([0.0]), -INF, INF, 0.0, 0.0, 0,
                              2, NO_FORCE, empty) == 0


# ---------------------------------------------------------------------------------------------
# quantize_chunk: assign_codes, the escapes' nearest codes and error_stats in one pass

def oracle_quantize(x, boundaries, table, protect_lo, protect_hi, prune_below, zero_code, escape,
                    force):
    codes, _ = oracle_assign(x, boundaries, protect_lo, protect_hi, -prune_below, prune_below,
                             zero_code, escape, force)
    stats = oracle_error_stats(x, codes, table, escape, prune_below)
    positions = np.flatnonzero(codes == escape)
    v = x[positions].astype(np.float64)
    with np.errstate(invalid="ignore"):
        nearest = np.searchsorted(boundaries, v, side="left")
    codes[positions] = np.where(np.isfinite(v), nearest, 0)
    return codes, positions, stats


def run_quantize(x, boundaries, table, protect, prune_below, zero_code, escape, force):
    """The kernel's result, the same whether ranks come from the rank table (float32 only)
    or are counted or searched."""
    padded = np.append(boundaries, np.inf)
    lut, probes = rank_table(boundaries)
    results = []
    for words, lut in ((np.empty(0, np.uint32), lut[:0]), (x.view(np.uint32), lut)):
        if lut.size and x.dtype != np.float32:
            continue
        codes = np.full(x.size, 0xBEEF, np.uint16)
        if not lut.size:
            quant.rank_chunk(x, padded, codes)
        positions = np.full(x.size, -7, np.int64)
        others = np.full(x.size, -9, np.int64)  # scratch
        out = np.zeros(7)
        n = quant.quantize_chunk(x, words, padded, lut, probes, table, protect[0], protect[1],
                                 prune_below, zero_code, escape, force, codes, positions, others,
                                 out)
        results.append((codes, positions[:n], out))
    for codes, positions, out in results[1:]:
        np.testing.assert_array_equal(codes, results[0][0])
        np.testing.assert_array_equal(positions, results[0][1])
        np.testing.assert_array_equal(out, results[0][2])
    return results[0]


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
@given(data=st.data())
def test_quantize_chunk_matches_oracle(float_type, data):
    x, boundaries, protect, prune, force, levels = data.draw(assign_case(float_type))
    prune_below = abs(prune[1])
    table = np.sort(np.array(data.draw(st.lists(
        st.floats(-1e3, 1e3, width=32), min_size=levels, max_size=levels)), np.float64))
    zero_code = data.draw(st.sampled_from([levels // 2, levels]))
    args = (x, boundaries, table, protect, prune_below, zero_code, levels, force)
    codes, positions, out = run_quantize(*args)
    with np.errstate(over="ignore"):
        want_codes, want_positions, want = oracle_quantize(x, boundaries, table, *protect,
                                                           prune_below, zero_code, levels, force)
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(positions, want_positions)
    np.testing.assert_allclose(out[0], want[0], rtol=1e-9)  # the oracle sums pairwise
    np.testing.assert_array_equal(out[1:], want[1:])


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
@pytest.mark.parametrize("n_boundaries", [0, 1, 15, 256, 257, 1000])
def test_quantize_chunk_is_assign_then_error_stats(float_type, n_boundaries):
    rng = np.random.default_rng(n_boundaries)
    table = np.sort(rng.standard_normal(n_boundaries + 1))
    boundaries = (table[1:] + table[:-1]) / 2
    x = np.concatenate([rng.standard_normal(1500) * 1.5, boundaries, [np.nan, np.inf, -np.inf,
                                                                      0.0, -0.0, 1e30]])
    x = x.astype(float_type)
    args = (boundaries, -2.5, 2.5, -0.01, 0.01, 0, n_boundaries + 1, NO_FORCE)
    codes, positions, out = run_quantize(x, boundaries, table, (-2.5, 2.5), 0.01, 0,
                                         n_boundaries + 1, NO_FORCE)
    assigned = np.empty(x.size, np.uint16)
    escapes = quant.assign_codes(x, *args, assigned)
    stats = np.zeros(7)
    quant.error_stats(x, assigned, table, n_boundaries + 1, 0.01, stats)
    assert positions.size == escapes
    np.testing.assert_array_equal(positions, np.flatnonzero(assigned == n_boundaries + 1))
    kept = np.ones(x.size, bool)
    kept[positions] = False
    np.testing.assert_array_equal(codes[kept], assigned[kept])
    np.testing.assert_array_equal(out, stats)


@given(bits=st.lists(st.integers(0, 2**32 - 1), max_size=200),
       boundaries=st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=20))
def test_rank_table_gives_the_rank_of_every_float32(bits, boundaries):
    """Any bit pattern (NaN, infinities, subnormals, both zeros) starts at or below its rank
    and reaches it within the table's comparisons."""
    boundaries = np.sort(np.array(boundaries + [0.0, -0.0, 1e-40, -1e-45], np.float64))
    lut, probes = rank_table(boundaries)
    assume(lut.size)  # crowded boundaries have no table
    assert lut.size == 1 << (32 - quant.RANK_SHIFT) and probes <= 4
    words = np.array(bits + [0, 1 << 31, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF],
                     np.uint32)
    x = words.view(np.float32).astype(np.float64)
    start = lut[words >> quant.RANK_SHIFT].astype(np.int64)  # by bit pattern
    finite = np.isfinite(x) | np.isinf(x)
    want = np.searchsorted(boundaries, x[finite], side="left")
    assert (start[finite] <= want).all() and (want - start[finite] <= probes).all()


@given(boundaries=st.lists(st.floats(allow_infinity=True, width=32), max_size=64),
       unsorted=st.booleans())
def test_rank_table_of_few_boundaries_is_the_numpy_one(boundaries, unsorted):
    """Up to 64 boundaries (every preset's bin counts) the table is made in Python: the same
    table and comparisons as the numpy one, and the same refusals (NaN, unsorted, crowded)."""
    b = np.array(boundaries, np.float64)
    if not unsorted:
        b = np.sort(b)
    small, probes = quantizer._small_rank_table(b)
    want, want_probes = quantizer._numpy_rank_table(b)
    assert small.dtype == want.dtype == np.uint16 and probes == want_probes
    np.testing.assert_array_equal(small, want)


def test_rank_table_refuses_crowded_or_unsorted_boundaries():
    assert rank_table(np.linspace(1.0, 1.001, 50))[0].size == 0  # 50 in one bucket
    assert rank_table(np.array([2.0, 1.0]))[0].size == 0
    assert rank_table(np.array([1.0, 2.0]))[1] == 1


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
def test_quantize_chunk_without_levels_escapes_everything(float_type):
    x = np.array([1.5, -2.0, 0.0, np.nan], float_type)
    codes, positions, out = run_quantize(x, np.empty(0), np.empty(0), (-INF, INF), 0.0, 0, 0,
                                         NO_FORCE)
    assert codes.tolist() == [0, 0, 0, 0] and positions.tolist() == [0, 1, 2, 3]
    assert out.tolist() == [0.0, 0.0, 4, 0, 0, 0, 2]


# ---------------------------------------------------------------------------------------------
# lookup_levels

@pytest.mark.parametrize("word_type", WORD_TYPES)
@given(data=st.data())
def test_lookup_matches_oracle(word_type, data):
    n_levels = data.draw(st.integers(1, 300))
    n = data.draw(st.integers(0, 300))
    seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    info = np.iinfo(word_type)
    levels = rng.integers(0, info.max, n_levels, dtype=word_type, endpoint=True)
    codes = rng.integers(0, n_levels, n).astype(np.uint16)
    bad = data.draw(st.sampled_from([0.0, 0.1, 1.0]))
    codes[rng.random(n) < bad] = data.draw(st.sampled_from([n_levels, 65535]))
    out = np.zeros(n, word_type)
    largest = quant.lookup_levels(codes, levels, out)
    assert largest == (int(codes.max()) if n else 0)
    # a code past the table reads the last level: never outside the table
    np.testing.assert_array_equal(out, levels[np.minimum(codes, n_levels - 1)])


@pytest.mark.parametrize("word_type", WORD_TYPES)
def test_lookup_reports_codes_past_the_table(word_type):
    levels = np.array([10, 20, 30], word_type)
    out = np.zeros(6, word_type)
    codes = np.array([0, 2, 1, 3, 65535, 2], np.uint16)
    assert quant.lookup_levels(codes, levels, out) == 65535
    assert out.tolist() == [10, 30, 20, 30, 30, 30]
    assert quant.lookup_levels(codes[:3], levels, out[:3]) == 2  # all levels: below 3
    empty = np.empty(0, np.uint16)
    assert quant.lookup_levels(empty, levels, np.empty(0, word_type)) == 0


def test_lookup_decodes_floats_bit_exactly():
    x = np.array([1.5, -0.0, np.nan, 1.5, 2.0**-140, np.inf], np.float32)
    levels = x.view(np.uint32)[[0, 1, 2, 4, 5]]
    codes = np.array([0, 1, 2, 0, 3, 4], np.uint16)
    out = np.empty(x.size, np.uint32)
    assert quant.lookup_levels(codes, levels, out) == 4
    assert out.tobytes() == x.tobytes()


# ---------------------------------------------------------------------------------------------
# pack_bits and unpack_bits

def oracle_pack(codes, bits):
    planes = (codes.astype(np.uint32)[:, None] >> np.arange(bits, dtype=np.uint32)) & 1
    return np.packbits(planes.astype(np.uint8).ravel(), bitorder="little")


def packed_size(n, bits):
    return (n * bits + 7) // 8


@given(bits=st.integers(1, 16), n=st.integers(0, 1000), seed=st.integers(0, 2**32 - 1))
def test_pack_round_trip_matches_oracle(bits, n, seed):
    codes = np.random.default_rng(seed).integers(0, 1 << bits, n).astype(np.uint16)
    packed = np.full(packed_size(n, bits), 0xA5, np.uint8)
    quant.pack_bits(codes, bits, packed)
    np.testing.assert_array_equal(packed, oracle_pack(codes, bits))
    back = np.full(n, 0xFFFF, np.uint16)
    quant.unpack_bits(packed, bits, n, back)
    np.testing.assert_array_equal(back, codes)
    # unpacking a prefix reads only what it needs
    m = n // 2
    quant.unpack_bits(packed[: packed_size(m, bits)], bits, m, back[:m])
    np.testing.assert_array_equal(back[:m], codes[:m])


@pytest.mark.parametrize("bits", range(1, 17))
def test_pack_padding_is_zero_and_high_bits_are_masked(bits):
    for n in range(1, 17):
        codes = np.full(n, 0xFFFF, np.uint16)
        packed = np.full(packed_size(n, bits), 0x5A, np.uint8)
        quant.pack_bits(codes, bits, packed)
        used = n * bits
        stream = np.unpackbits(packed, bitorder="little")
        assert stream[:used].all() and not stream[used:].any()
        back = np.empty(n, np.uint16)
        quant.unpack_bits(packed, bits, n, back)
        assert (back == (1 << bits) - 1).all()


def test_pack_layout_and_empty():
    codes = np.array([1, 2, 3, 4], np.uint16)
    packed = np.empty(2, np.uint8)
    quant.pack_bits(codes, 3, packed)  # 001 010 011 100, least significant bit first
    assert packed.tolist() == [0b11010001, 0b1000]
    packed = np.empty(3, np.uint8)
    quant.pack_bits(np.array([0x1234, 0xABCD, 0x0F0F], np.uint16)[:1], 16, packed[:2])
    assert packed[:2].tolist() == [0x34, 0x12]
    quant.pack_bits(np.empty(0, np.uint16), 5, np.empty(0, np.uint8))
    quant.unpack_bits(np.empty(0, np.uint8), 5, 0, np.empty(0, np.uint16))


# ---------------------------------------------------------------------------------------------
# the kernels together

@pytest.mark.parametrize("float_type", FLOAT_TYPES)
def test_quantise_pack_and_decode_pipeline(float_type):
    rng = np.random.default_rng(3)
    x = (rng.standard_t(3, 20_000) * 0.02).astype(float_type)
    x[::997] = 0.0
    x[5] = np.nan
    # levels from a weighted k-means on a sample, boundaries at the midpoints
    sample = np.sort(x[np.isfinite(x)].astype(np.float64)[::10])
    weights = np.ones(sample.size)
    centroids = seeded_centroids(sample, weights, 15, 0)
    lloyd(sample, weights, centroids, 50, 1e-6)
    levels = centroids.astype(float_type)
    boundaries = 0.5 * (centroids[1:] + centroids[:-1])
    zero_code, escape, bits = 15, 16, 5
    lo, hi = np.quantile(sample, [0.001, 0.999])
    codes = np.empty(x.size, np.uint16)
    escapes = quant.assign_codes(x, boundaries, lo, hi, -1e-4, 1e-4, zero_code, escape, NO_FORCE,
                                 codes)
    assert 0 < escapes < x.size // 100
    packed = np.empty(packed_size(x.size, bits), np.uint8)
    quant.pack_bits(codes, bits, packed)
    unpacked = np.empty(x.size, np.uint16)
    quant.unpack_bits(packed, bits, x.size, unpacked)
    np.testing.assert_array_equal(unpacked, codes)
    word = {np.float32: np.uint32, np.float64: np.uint64}[float_type]
    table = np.append(levels, float_type(0)).view(word)
    escaped = codes == escape
    out = np.empty(x.size, word)
    # as the quant stage decodes: escaped elements carry a level's code, then their values
    unpacked[escaped] = 0
    assert quant.lookup_levels(unpacked, table, out) < table.size
    out[escaped] = x[escaped].view(word)
    decoded = out.view(float_type)
    assert decoded[escaped].tobytes() == x[escaped].tobytes()
    # every other element went to its nearest level, or to zero inside the pruning band
    rest = ~escaped
    nearest = np.abs(x[rest, None].astype(np.float64) - centroids[None, :]).min(1)
    error = np.abs(decoded[rest].astype(np.float64) - x[rest])
    assert np.all(error <= np.maximum(nearest, 1e-4) + 1e-6)


# ---------------------------------------------------------------------------------------------
# error_stats

def oracle_error_stats(x, codes, table, escape, prune_below):
    v = x.astype(np.float64)
    escaped = codes == escape
    decoded = np.append(table, np.nan)[np.minimum(codes, len(table))]
    finite_nonzero = np.isfinite(v) & (v != 0)
    kept = ~escaped
    err = np.abs(v[kept] - decoded[kept])
    nz = finite_nonzero & kept
    d = decoded[nz]
    return [float(np.sum(err * err)), float(err.max()) if err.size else 0.0,
            int(escaped.sum()), int((np.abs(v[nz]) < prune_below).sum()),
            int((d == 0).sum()), int(((d != 0) & ((v[nz] < 0) != (d < 0))).sum()),
            int(finite_nonzero.sum())]


@pytest.mark.parametrize("float_type", FLOAT_TYPES)
@given(data=st.data())
def test_error_stats_match_oracle(float_type, data):
    x = data.draw(st.lists(st.floats(-2.0 ** 100, 2.0 ** 100, width=32), max_size=200)
                  .map(lambda v: np.array(v, float_type)))
    table = np.array(sorted(set(data.draw(st.lists(
        st.floats(-10, 10, allow_nan=False), min_size=1, max_size=8)))), np.float64)
    escape = len(table)
    codes = np.array(data.draw(st.lists(st.integers(0, escape), min_size=x.size,
                                        max_size=x.size)), np.uint16)
    out = np.zeros(7)
    quant.error_stats(x, codes, table, escape, 0.5, out)
    want = oracle_error_stats(x, codes, table, escape, 0.5)
    assert math.isclose(out[0], want[0], rel_tol=1e-9, abs_tol=1e-300) or out[0] == want[0]
    assert out[1] == want[1] or math.isclose(out[1], want[1], rel_tol=1e-12)
    assert out[2:].tolist() == want[2:]


def test_error_stats_accumulate_and_skip_escaped_non_finite():
    x = np.array([np.nan, np.inf, 1.0, -2.0], np.float32)
    codes = np.array([2, 2, 0, 1], np.uint16)
    out = np.zeros(7)
    quant.error_stats(x, codes, np.array([0.5, 0.0]), 2, 0.0, out)
    quant.error_stats(x, codes, np.array([0.5, 0.0]), 2, 0.0, out)
    assert out.tolist() == [2 * (0.25 + 4.0), 2.0, 4, 0, 2, 0, 4]
