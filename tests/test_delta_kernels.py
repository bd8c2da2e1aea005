"""Delta kernels against plain-numpy oracles, plus their round trips."""
import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inshrink.kernels import delta

WORD_TYPES = [np.uint8, np.uint16, np.uint32, np.uint64]
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
# run_lengths

def oracle_runs(values):
    runs = [(k, len(list(g))) for k, g in itertools.groupby(values.tolist())]
    return [k for k, _ in runs], [n for _, n in runs]


def run_runs(values):
    out_values = np.empty(values.size, values.dtype)
    out_lengths = np.empty(values.size, np.uint32)
    nruns = delta.run_lengths(values, out_values, out_lengths)
    return nruns, out_values[:nruns], out_lengths[:nruns]


runny_arrays = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 9)), max_size=40).map(
    lambda runs: np.array([v for v, n in runs for _ in range(n)], np.uint16))


@given(values=runny_arrays | st.lists(st.integers(0, 0xFFFF), max_size=100).map(
    lambda v: np.array(v, np.uint16)))
def test_run_lengths_match_oracle_and_repeat_back(values):
    nruns, run_values, lengths = run_runs(values)
    want_values, want_lengths = oracle_runs(values)
    assert run_values.tolist() == want_values
    assert lengths.tolist() == want_lengths
    # np.diff view of the same thing: a run starts wherever the value changes
    assert nruns == (np.count_nonzero(np.diff(values)) + 1 if values.size else 0)
    np.testing.assert_array_equal(np.repeat(run_values, lengths), values)


def test_runs_edges():
    assert run_runs(EMPTY)[0] == 0
    nruns, v, n = run_runs(np.array([5], np.uint16))
    assert (nruns, v.tolist(), n.tolist()) == (1, [5], [1])
    nruns, v, n = run_runs(np.full(1000, 65535, np.uint16))
    assert (nruns, v.tolist(), n.tolist()) == (1, [65535], [1000])


def test_runs_of_other_dtypes():
    values = np.array([0, 0, 2**40, 2**40, 2**40, 1], np.uint64)
    nruns, v, n = run_runs(values)
    assert (nruns, v.tolist(), n.tolist()) == (3, [0, 2**40, 1], [2, 3, 1])


# ---------------------------------------------------------------------------------------------
# xor_words, sub_words

def word_arrays(word, min_size=0, max_size=100):
    top = int(np.iinfo(word).max)
    edges = st.sampled_from([0, 1, top, top - 1, top // 2, top // 2 + 1])
    return st.lists(edges | st.integers(0, top), min_size=min_size, max_size=max_size)


@pytest.mark.parametrize("word", WORD_TYPES)
@given(data=st.data())
def test_word_deltas_match_oracle_and_invert(word, data):
    a = np.array(data.draw(word_arrays(word)), word)
    b = np.array(data.draw(word_arrays(word, a.size, a.size)), word)
    bits = 8 * np.dtype(word).itemsize
    out = np.empty(a.size, word)
    delta.xor_words(a, b, out)
    np.testing.assert_array_equal(out, np.bitwise_xor(a, b))
    back = np.empty(a.size, word)
    delta.xor_words(out, b, back)
    np.testing.assert_array_equal(back, a)
    delta.sub_words(a, b, out)
    want = [(int(x) - int(y)) % (1 << bits) for x, y in zip(a, b)]
    assert out.tolist() == want
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, (a - b).astype(word))
    assert [(int(y) + int(d)) % (1 << bits) for y, d in zip(b, out)] == a.tolist()


@pytest.mark.parametrize("word", WORD_TYPES)
def test_word_deltas_wrap_at_the_edges(word):
    top = int(np.iinfo(word).max)
    a = np.array([0, 0, top, top, 1, top], word)
    b = np.array([1, top, 0, top, top, 1], word)
    out = np.empty(6, word)
    delta.sub_words(a, b, out)
    assert out.tolist() == [top, 1, top, 0, 2, top - 1]
    delta.xor_words(a, b, out)
    assert out.tolist() == [1, top, top, 0, top - 1, top - 1]
    for kernel in (delta.xor_words, delta.sub_words):
        kernel(np.empty(0, word), np.empty(0, word), np.empty(0, word))


def test_lossless_word_delta_of_floats():
    rng = np.random.default_rng(5)
    before = rng.standard_normal(1000).astype(np.float32)
    after = (before + rng.standard_normal(1000).astype(np.float32) * 1e-3).astype(np.float32)
    a, b = after.view(np.uint32), before.view(np.uint32)
    d = np.empty(1000, np.uint32)
    back = np.empty(1000, np.uint32)
    delta.sub_words(a, b, d)
    assert (b + d).view(np.float32).tobytes() == after.tobytes()  # uint32 addition wraps
    delta.xor_words(a, b, d)
    delta.xor_words(b, d, back)
    assert back.view(np.float32).tobytes() == after.tobytes()


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
    # encoder: delta, regroup by the previous codes, run lengths
    d = run_delta(prev, cur, modulus)
    counts = counts_of(prev, nlevels)
    grouped = np.empty(n, np.uint16)
    delta.regroup(prev, d, counts, grouped)
    run_values = np.empty(n, np.uint16)
    lengths = np.empty(n, np.uint32)
    nruns = delta.run_lengths(grouped, run_values, lengths)
    assert nruns < n // 5
    # decoder: only prev, the runs and the modulus
    expanded = np.repeat(run_values[:nruns], lengths[:nruns])
    back = np.empty(n, np.uint16)
    delta.ungroup(prev, expanded, counts_of(prev, nlevels), back)
    np.testing.assert_array_equal(run_undelta(prev, back, modulus), cur)
