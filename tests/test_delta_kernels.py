"""Delta kernels against plain-numpy oracles, plus their round trips."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inshrink.kernels import delta

EMPTY = np.empty(0, np.uint16)


@st.composite
def code_pairs(draw, max_size=200):
    """A modulus and two code arrays below it, of one length."""
    modulus = draw(st.sampled_from([1, 2, 3, 16, 17, 255, 256, 4097, 65535, 65536])
                   | st.integers(1, 65536))
    n = draw(st.integers(0, max_size))
    codes = st.lists(st.integers(0, modulus - 1), min_size=n, max_size=n)
    return modulus, np.array(draw(codes), np.uint16), np.array(draw(codes), np.uint16)


@st.composite
def grouped_codes(draw, max_size=200):
    """A level count, codes below it and values to regroup, of one length."""
    nlevels = draw(st.integers(1, 40))
    n = draw(st.integers(0, max_size))
    prev = np.array(draw(st.lists(st.integers(0, nlevels - 1), min_size=n, max_size=n)),
                    np.uint16)
    values = np.array(draw(st.lists(st.integers(0, 0xFFFF), min_size=n, max_size=n)), np.uint16)
    return nlevels, prev, values


def counts_of(prev, nlevels):
    counts = np.full(nlevels, -7, np.int64)
    delta.group_counts(prev, nlevels, counts)
    return counts


def run_delta(prev, cur, modulus):
    out = np.empty(prev.size, np.uint16)
    assert delta.cyclic_delta(prev, cur, modulus, out) is None
    return out


def run_undelta(prev, d, modulus):
    out = np.empty(prev.size, np.uint16)
    assert delta.cyclic_undelta(prev, d, modulus, out) is None
    return out


# ---------------------------------------------------------------------------------------------
# cyclic_delta, cyclic_undelta

@given(pair=code_pairs())
def test_cyclic_delta_matches_oracle_and_round_trips(pair):
    modulus, prev, cur = pair
    d = run_delta(prev, cur, modulus)
    want = np.mod(prev.astype(np.int64) - cur.astype(np.int64), modulus)
    np.testing.assert_array_equal(d, want)
    assert (d.astype(np.int64) < modulus).all()
    np.testing.assert_array_equal(run_undelta(prev, d, modulus), cur)
    # the undelta of arbitrary codes below the modulus is the same formula
    np.testing.assert_array_equal(run_undelta(prev, cur, modulus), want)


def test_cyclic_delta_edge_moduli():
    zeros = np.zeros(5, np.uint16)
    assert run_delta(zeros, zeros, 1).tolist() == [0] * 5
    assert run_undelta(zeros, zeros, 1).tolist() == [0] * 5
    prev = np.array([0, 0, 65535, 65535, 1, 40000], np.uint16)
    cur = np.array([65535, 0, 0, 65535, 2, 39999], np.uint16)
    d = run_delta(prev, cur, 65536)
    assert d.tolist() == [1, 0, 65535, 0, 65535, 1]
    np.testing.assert_array_equal(run_undelta(prev, d, 65536), cur)
    assert run_delta(np.array([0, 15], np.uint16), np.array([15, 0], np.uint16), 16).tolist() \
        == [1, 15]
    for modulus in (1, 16, 65536):
        assert run_delta(EMPTY, EMPTY, modulus).size == 0
        assert run_undelta(EMPTY, EMPTY, modulus).size == 0


def test_cyclic_delta_accepts_numpy_integer_moduli():
    prev = np.array([0, 3, 9], np.uint16)
    cur = np.array([9, 3, 0], np.uint16)
    for modulus in (np.int64(10), np.uint64(10), np.int32(10), np.uint32(10)):
        assert run_delta(prev, cur, modulus).tolist() == [1, 0, 9]
        assert run_undelta(prev, cur, modulus).tolist() == [1, 0, 9]


# ---------------------------------------------------------------------------------------------
# group_counts, regroup, ungroup

@given(case=grouped_codes())
def test_group_counts_match_bincount(case):
    nlevels, prev, _ = case
    counts = counts_of(prev, nlevels)
    np.testing.assert_array_equal(counts, np.bincount(prev, minlength=nlevels))
    # only the first nlevels entries are written
    longer = np.full(nlevels + 3, 5, np.int64)
    delta.group_counts(prev, nlevels, longer)
    np.testing.assert_array_equal(longer[:nlevels], counts)
    assert longer[nlevels:].tolist() == [5, 5, 5]


@given(case=grouped_codes())
def test_regroup_is_a_stable_partition_and_ungroup_inverts_it(case):
    nlevels, prev, values = case
    counts = counts_of(prev, nlevels)
    grouped = np.empty(values.size, np.uint16)
    delta.regroup(prev, values, counts, grouped)
    np.testing.assert_array_equal(grouped, values[np.argsort(prev, kind="stable")])
    back = np.empty(values.size, np.uint16)
    delta.ungroup(prev, grouped, counts, back)
    np.testing.assert_array_equal(back, values)


@given(case=grouped_codes())
def test_ungroup_matches_fancy_indexing(case):
    nlevels, prev, values = case
    counts = counts_of(prev, nlevels)
    out = np.empty(values.size, np.uint16)
    delta.ungroup(prev, values, counts, out)
    want = np.empty_like(values)
    want[np.argsort(prev, kind="stable")] = values
    np.testing.assert_array_equal(out, want)
    # ungroup then regroup is the identity too
    again = np.empty(values.size, np.uint16)
    delta.regroup(prev, out, counts, again)
    np.testing.assert_array_equal(again, values)


def test_regroup_layout_and_other_dtypes():
    prev = np.array([2, 0, 2, 1, 0, 2], np.uint16)
    counts = counts_of(prev, 4)  # level 3 is empty
    assert counts.tolist() == [2, 1, 3, 0]
    values = np.array([10, 11, 12, 13, 14, 15], np.uint16)
    out = np.empty(6, np.uint16)
    delta.regroup(prev, values, counts, out)
    assert out.tolist() == [11, 14, 13, 10, 12, 15]
    for dtype in (np.uint8, np.int32, np.float64):
        v = values.astype(dtype)
        g = np.empty(6, dtype)
        delta.regroup(prev, v, counts, g)
        assert g.tolist() == out.tolist()
        back = np.empty(6, dtype)
        delta.ungroup(prev, g, counts, back)
        np.testing.assert_array_equal(back, v)


def test_group_kernels_on_nothing():
    counts = counts_of(EMPTY, 3)
    assert counts.tolist() == [0, 0, 0]
    delta.group_counts(EMPTY, 0, np.empty(0, np.int64))
    out = np.empty(0, np.uint16)
    delta.regroup(EMPTY, EMPTY, counts, out)
    delta.ungroup(EMPTY, EMPTY, counts, out)
    delta.regroup(EMPTY, EMPTY, np.empty(0, np.int64), out)


# ---------------------------------------------------------------------------------------------
# the kernels together

@pytest.mark.parametrize("modulus", [16, 65536])
def test_delta_regroup_runs_pipeline(modulus):
    rng = np.random.default_rng(7)
    n, nlevels = 50_000, min(modulus, 16)
    prev = rng.integers(0, nlevels, n).astype(np.uint16)
    cur = prev.copy()
    moved = rng.random(n) < 0.05
    cur[moved] = rng.integers(0, nlevels, moved.sum())
    # encoder: delta, regroup by the previous codes: long runs of zeros for zstd
    d = run_delta(prev, cur, modulus)
    counts = counts_of(prev, nlevels)
    grouped = np.empty(n, np.uint16)
    delta.regroup(prev, d, counts, grouped)
    assert np.count_nonzero(np.diff(grouped)) + 1 < n // 5
    # decoder: only prev, the grouped deltas and the modulus
    back = np.empty(n, np.uint16)
    delta.ungroup(prev, grouped, counts_of(prev, nlevels), back)
    np.testing.assert_array_equal(run_undelta(prev, back, modulus), cur)
