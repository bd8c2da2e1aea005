"""Delta kernels: cyclic differences of level codes between checkpoints, regrouping of the
deltas by the previous code; run lengths and word differences (XOR, wrapping subtraction),
which benchmarks/bench_series.py measures as alternative delta codings.

The delta of a quantised tensor is ``D = (prev - cur) mod B`` over its codes, regrouped by
``prev``: a stable partition that puts every position whose previous code is 0 first (in
position order), then those whose previous code is 1, and so on. A decoder that knows ``prev``
recomputes the group sizes, undoes the partition and takes ``cur = (prev - D) mod B``, with no
other metadata.

Callers guarantee, for each kernel:

``cyclic_delta(prev, cur, modulus, out)`` and ``cyclic_undelta(prev, delta, modulus, out)``
    ``1 <= modulus <= 65536`` (an integer); ``prev``, ``cur``, ``delta`` and ``out`` are uint16
    of one length, and every element of ``prev``, ``cur`` and ``delta`` is ``< modulus``.

``group_counts(prev, nlevels, counts)``
    ``prev`` is uint16 with every element ``< nlevels``; ``counts`` is int64 of length
    ``>= nlevels``. The first ``nlevels`` counts are overwritten.

``regroup(prev, values, counts, out)`` and ``ungroup(prev, grouped, counts, out)``
    ``prev`` is uint16 with every element ``< len(counts)``; ``counts`` is int64 and equal to
    the counts ``group_counts`` gives for ``prev`` (any extra trailing entries are zero);
    ``values``, ``grouped`` and ``out`` share one dtype and have ``len(prev)`` elements.

``run_lengths(values, out_values, out_lengths)``
    ``values`` is a 1-D integer array of fewer than ``2**32`` elements; ``out_values`` has its
    dtype; ``out_values`` and ``out_lengths`` (uint32) have ``len(values)`` elements or at least
    as many as there are runs.

``xor_words(a, b, out)`` and ``sub_words(a, b, out)``
    ``a``, ``b`` and ``out`` share one unsigned word type (uint8, uint16, uint32 or uint64)
    and one length. The difference wraps modulo ``2**bits`` of that word.
"""
from __future__ import annotations

import numpy as np
from . import kernel

_ONE = np.uint64(1)
_EIGHT = np.uint64(8)
_ALL_ONES = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


@kernel
def cyclic_delta(prev, cur, modulus, out):
    """Write ``(prev - cur) mod modulus`` element by element."""
    m = np.int64(modulus)
    for i in range(prev.shape[0]):
        d = np.int64(prev[i]) - np.int64(cur[i])
        if d < 0:
            d += m
        out[i] = d


@kernel
def cyclic_undelta(prev, delta, modulus, out):
    """Write ``(prev - delta) mod modulus`` element by element: the inverse of
    ``cyclic_delta``."""
    m = np.int64(modulus)
    for i in range(prev.shape[0]):
        c = np.int64(prev[i]) - np.int64(delta[i])
        if c < 0:
            c += m
        out[i] = c


@kernel
def group_counts(prev, nlevels, counts):
    """Count the positions holding each code: ``counts[v]`` = number of ``i`` with
    ``prev[i] == v``, for ``v < nlevels``."""
    for v in range(nlevels):
        counts[v] = 0
    for i in range(prev.shape[0]):
        counts[prev[i]] += 1


@kernel
def _group_starts(counts):
    """Exclusive prefix sum of ``counts``: where each group begins."""
    starts = np.empty(counts.shape[0], np.int64)
    total = 0
    for v in range(counts.shape[0]):
        starts[v] = total
        total += counts[v]
    return starts


@kernel
def regroup(prev, values, counts, out):
    """Stable partition of ``values`` by ``prev``: group ``v`` holds, in position order, the
    values at the positions where ``prev`` is ``v``, and the groups follow one another in
    increasing ``v``."""
    starts = _group_starts(counts)
    for i in range(prev.shape[0]):
        v = prev[i]
        j = starts[v]
        out[j] = values[i]
        starts[v] = j + 1


@kernel
def ungroup(prev, grouped, counts, out):
    """Undo ``regroup``: position ``i`` takes the next unread value of group ``prev[i]``."""
    starts = _group_starts(counts)
    for i in range(prev.shape[0]):
        v = prev[i]
        j = starts[v]
        out[i] = grouped[j]
        starts[v] = j + 1


@kernel
def run_lengths(values, out_values, out_lengths):
    """Split ``values`` into maximal runs of equal elements.

    Returns
    -------
    int
        The number of runs; run ``k`` is ``out_lengths[k]`` copies of ``out_values[k]``.
    """
    n = values.shape[0]
    if n == 0:
        return 0
    runs = 0
    current = values[0]
    length = 1
    for i in range(1, n):
        v = values[i]
        if v == current:
            length += 1
        else:
            out_values[runs] = current
            out_lengths[runs] = length
            runs += 1
            current = v
            length = 1
    out_values[runs] = current
    out_lengths[runs] = length
    return runs + 1


@kernel
def _word_mask(itemsize):
    """All ones in the low ``8 * itemsize`` bits, as uint64."""
    if itemsize >= 8:
        return _ALL_ONES
    return (_ONE << (_EIGHT * np.uint64(itemsize))) - _ONE


@kernel
def xor_words(a, b, out):
    """Write ``a ^ b`` element by element."""
    for i in range(a.shape[0]):
        out[i] = a[i] ^ b[i]


@kernel
def sub_words(a, b, out):
    """Write ``a - b`` element by element, wrapping modulo ``2**bits``."""
    # computed without overflow, so numpy scalars (no JIT) wrap exactly as machine words do
    mask = _word_mask(out.itemsize)
    for i in range(a.shape[0]):
        x = np.uint64(a[i])
        y = np.uint64(b[i])
        if x >= y:
            out[i] = x - y
        else:
            out[i] = x + (mask - y) + _ONE
